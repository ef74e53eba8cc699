"""Noise calibration: round trips, monotonicity, an independent closed form, bad inputs."""
import math

import dp_accounting as dpa
import pytest

from fedjax_dp.privacy import accounting as A
from fedjax_dp.privacy import calibration as C

DELTA = 1e-5


def test_calibrate_sampled_gaussian_round_trip_rdp():
    tol = 1e-3
    z = C.calibrate_sampled_gaussian(1.0, DELTA, 0.01, 100, "rdp", tol=tol)
    assert A.sampled_gaussian_epsilon(z, 0.01, 100, DELTA) <= 1.0
    # Minimal to within tol: a little less noise misses the target.
    assert A.sampled_gaussian_epsilon(z - 2 * tol, 0.01, 100, DELTA) > 1.0
    assert A.sampled_gaussian_epsilon(z, 0.01, 100, DELTA) == pytest.approx(1.0, abs=0.01)


def test_calibrate_gaussian_pld_matches_analytic_gaussian():
    # 10 compositions of a Gaussian with multiplier z equal one Gaussian with z / sqrt(10), whose
    # exact calibration is dp_accounting's analytic Gaussian mechanism (Balle & Wang 2018).
    target, tol = 2.0, 1e-3
    z = C.calibrate_noise_multiplier(target, DELTA, lambda s: A.gaussian_event(s, 10), "pld",
                                     tol=tol)
    exact = dpa.get_sigma_gaussian(target, DELTA) * math.sqrt(10)
    assert z == pytest.approx(exact, rel=5e-3)
    assert A.epsilon(A.gaussian_event(z, 10), DELTA, "pld") <= target


def test_calibration_is_monotonic_in_target():
    zs = [C.calibrate_noise_multiplier(eps, DELTA, lambda s: A.gaussian_event(s, 50))
          for eps in (0.5, 1.0, 2.0, 4.0)]
    assert all(a > b for a, b in zip(zs, zs[1:]))
    for eps, z in zip((0.5, 1.0, 2.0, 4.0), zs):
        assert A.epsilon(A.gaussian_event(z, 50), DELTA) <= eps
        assert A.epsilon(A.gaussian_event(z - 2e-3, 50), DELTA) > eps


def test_unreachable_target_raises():
    with pytest.raises(ValueError, match="unreachable"):
        C.calibrate_sampled_gaussian(1e-3, DELTA, 1.0, 1000, bracket=(0.0, 5.0))
    with pytest.raises(ValueError, match="already met"):
        C.calibrate_noise_multiplier(10.0, DELTA, lambda s: A.gaussian_event(s),
                                     bracket=(50.0, 500.0))


@pytest.mark.parametrize("call, name", [
    (lambda: C.calibrate_sampled_gaussian(-1.0, DELTA, 0.1, 10), "target_epsilon"),
    (lambda: C.calibrate_sampled_gaussian(float("inf"), DELTA, 0.1, 10), "target_epsilon"),
    (lambda: C.calibrate_sampled_gaussian(1.0, 0.0, 0.1, 10), "delta"),
    (lambda: C.calibrate_sampled_gaussian(1.0, DELTA, 0.0, 10), "sampling_rate"),
    (lambda: C.calibrate_sampled_gaussian(1.0, DELTA, 0.1, 0), "steps"),
    (lambda: C.calibrate_sampled_gaussian(1.0, DELTA, 0.1, 10, "moments"), "accountant"),
    (lambda: C.calibrate_sampled_gaussian(1.0, DELTA, 0.1, 10, bracket=(5.0, 1.0)), "bracket"),
    (lambda: C.calibrate_sampled_gaussian(1.0, DELTA, 0.1, 10, bracket=(-1.0, 1.0)), "bracket"),
    (lambda: C.calibrate_sampled_gaussian(1.0, DELTA, 0.1, 10, tol=0.0), "tol"),
    (lambda: C.calibrate_noise_multiplier(1.0, DELTA, "not callable"), "make_event"),
])
def test_calibration_bad_inputs(call, name):
    with pytest.raises(ValueError, match=name):
        call()


# ----------------------------------------------------------------------------- the sweep's calibration

#: ``experiments.calibrate`` on shipped configs (target epsilon, unit), pinned as the code gave
#: them before calibration went through the algorithms' ``planned_ledger`` / ``private`` hooks
#: (commit 0eaad72, where the experiment layer special-cased DP-FedSGD and FedKT): the hooks
#: must not move a calibrated value.
PINNED = [("dp_fedsgd/mnist5k", "algorithm.noise_multiplier", None, 4.0, 1.410775397207862),
          ("dp_fedavg/mnist5k", "algorithm.noise_multiplier", None, 4.0, 2.207007308292202),
          ("ae_dpfl/mnist5k", "algorithm.sigma", None, 4.0, 9.040611021648326),
          ("knn_dpfl/mnist5k", "algorithm.sigma", None, 4.0, 12.7851005482089),
          ("knn_dpfl/mnist5k", "algorithm.sigma", "instance", 4.0, 6.0269607276571495),
          ("fedkt/digits", "algorithm.gamma", None, 2.0, 0.008804499258083315),
          ("fedkt/digits", "algorithm.gamma", None, 16.0, 0.05410258871421805),
          ("fedkt/wbcd", "algorithm.gamma", None, 2.0, 0.004457435655261554),
          ("fedkt/wbcd", "algorithm.gamma", None, 16.0, 0.027712105855286013)]


def _shipped(name: str, sets=()):
    from fedjax_dp.experiments import config as config_lib
    rounds = ["algorithm.rounds=3"] if name.startswith("dp_fedsgd") else []
    return config_lib.load(f"configs/{name}.toml", rounds + list(sets))


@pytest.mark.parametrize("name, key, unit, target, value", PINNED,
                         ids=[f"{p[0]}-{p[2] or 'first'}-{p[3]:g}" for p in PINNED])
def test_calibrated_values_of_shipped_configs_are_pinned(name, key, unit, target, value):
    from fedjax_dp.experiments import calibrate
    assert calibrate.calibrate(_shipped(name), key, target, unit=unit) == pytest.approx(
        value, rel=1e-9)


@pytest.mark.parametrize("name, sets, key, message", [
    ("fedavg/mnist5k", (), "train.learning_rate", "'fedavg' gives no privacy guarantee"),
    ("fedkt/digits", ('algorithm.level="L0"',), "algorithm.gamma", "FedKT-L0 adds no noise"),
])
def test_nothing_to_calibrate_is_a_config_error(name, sets, key, message):
    from fedjax_dp.experiments import calibrate
    from fedjax_dp.experiments.config import ConfigError
    with pytest.raises(ConfigError, match=message):
        calibrate.calibrate(_shipped(name, sets), key, 4.0)


def test_memoised_sampled_gaussian_rdp_is_dp_accountings_bit_for_bit():
    """accounting memoises dp-accounting's Poisson-subsampled Gaussian RDP: a repeated call (a
    calibration's probes recurring) returns exactly the unmemoised curve, as a copy, and argument
    types are part of the key."""
    import numpy as np
    from dp_accounting.rdp import rdp_privacy_accountant as R
    assert R._compute_rdp_poisson_subsampled_gaussian is A._memoised_sampled_gaussian_rdp
    orders = list(A.DEFAULT_RDP_ORDERS)
    for q, z in [(0.01, 1.1), (np.float64(0.01), 1.1), (0.3, 0.7), (1.0, 2.0), (0.0, 1.0)]:
        direct = A._SAMPLED_GAUSSIAN_RDP(q, z, orders)
        for _ in range(2):
            got = R._compute_rdp_poisson_subsampled_gaussian(q, z, orders)
            np.testing.assert_array_equal(got, direct)
            got[:] = -1.0                              # the memo keeps its own array
    with pytest.raises(ValueError, match="Sampling rate"):
        R._compute_rdp_poisson_subsampled_gaussian(1.5, 1.0, orders)
    acc = dpa.rdp.RdpAccountant(orders=orders)
    acc.compose(dpa.PoissonSampledDpEvent(0.02, dpa.GaussianDpEvent(0.9)), 300)
    expect = 300 * A._SAMPLED_GAUSSIAN_RDP(0.02, 0.9, orders)
    np.testing.assert_array_equal(acc._rdp, expect)
    assert A.sampled_gaussian_epsilon(0.9, 0.02, 300, DELTA) == acc.get_epsilon(DELTA)
