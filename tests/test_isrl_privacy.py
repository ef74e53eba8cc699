"""ISRL-DP privacy: per-silo events, calibration, ledgers against direct dp-accounting
computations, the paper's closed form as a bound, and bad input failing before any work."""
import dataclasses
import json
import logging

import dp_accounting
import jax
import numpy as np
import pytest

from fedjax_dp.algorithms import api, isrl
from fedjax_dp.algorithms.isrl import calibration, engine, protocol
from fedjax_dp.privacy import accounting
from fedjax_dp.privacy.calibration import worst_members

logging.getLogger("absl").setLevel(logging.ERROR)   # dp-accounting's fractional-order warnings

DELTA = 1e-5


def _direct_epsilon(z, releases, delta, accountant):
    """dp-accounting itself: compose PoissonSampled(p, Gaussian(z)) c times per kind."""
    acc = (dp_accounting.rdp.RdpAccountant(list(accounting.DEFAULT_RDP_ORDERS))
           if accountant == "rdp" else
           dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4))
    for p, c in releases:
        if c:
            inner = dp_accounting.GaussianDpEvent(z)
            if p < 1:
                inner = dp_accounting.PoissonSampledDpEvent(p, inner)
            acc.compose(inner, int(c))
    return acc.get_epsilon(delta)


def _fake_state(algo, rates, counts, z):
    spec = engine.RoundSpec(method=algo.method, num_silos=len(rates), num_available=len(rates))
    ctx = protocol.Context(data=None, model=None, spec=spec, round_fn=None, noise_multiplier=z,
                           rates=np.asarray(rates, np.float64))
    return api.State(step=0, values={"uploads": np.asarray(counts, np.int32)}, context=ctx)


@pytest.mark.parametrize("algo, rates, counts, accountants, z", [
    # SPIDER: refresh (rate K1/n_i) AND difference (rate K2/n_i) uploads, per silo counts
    (isrl.ISRL_SPIDER, [[0.2, 0.1], [0.5, 0.25], [0.25, 0.125]], [[5, 4], [2, 3], [6, 6]],
     ("rdp",), 1.3),
    # Local SGD: K local steps per round available (here K = 3, rounds 2 / 1); a larger z: PLDs
    # of narrower support (quicker to compose)
    (isrl.ISRL_LOCAL_SGD, [[0.5], [1.0]], [[6], [3]], ("rdp", "pld"), 3.0),
    (isrl.ISRL_MB_SGD, [[0.2], [0.2], [0.1]], [[7], [9], [9]], ("rdp",), 1.3),
])
def test_ledger_is_dp_accounting_over_what_each_silo_released(algo, rates, counts, accountants,
                                                               z):
    cfg = algo.Config(clip_norm=1.0)
    rows = algo.ledger(cfg, _fake_state(algo, rates, counts, z)).report(DELTA, accountants)
    worst = {acc: max(_direct_epsilon(z, list(zip(r, c)), DELTA, acc)
                      for r, c in zip(rates, counts)) for acc in accountants}
    assert {r["accountant"] for r in rows} == set(accountants)
    for row in rows:
        assert row["unit"] == "silo_record" and row["relation"] == calibration.RELATION
        assert row["epsilon"] == pytest.approx(worst[row["accountant"]], rel=1e-6)
        assert row["data_dependent"] is False
    # the events name every kind of upload the worst silo sent
    text = json.dumps(rows[0]["events"])
    assert text.count('"GaussianDpEvent"') == len(rates[0])


def test_worst_members_drops_only_dominated_silos():
    rates = np.array([[0.1, 0.1], [0.2, 0.05], [0.1, 0.1], [0.05, 0.05]])
    counts = np.array([[3, 3], [3, 3], [4, 3], [9, 9]])
    assert worst_members(rates, counts).tolist() == [1, 2, 3]   # 0 <= 2 everywhere


def test_calibrated_noise_meets_target_and_is_minimal():
    acc, releases = "rdp", [(0.05, 30), (0.02, 60)]
    z = calibration.calibrate(2.0, DELTA, releases, acc)
    assert _direct_epsilon(z, releases, DELTA, acc) <= 2.0
    assert _direct_epsilon(z * 0.98, releases, DELTA, acc) > 2.0


@pytest.mark.parametrize("n, k, rounds, eps", [(1000, 50, 400, 1.0), (400, 40, 100, 0.75),
                                               (2000, 100, 1000, 1.5)])
def test_calibrated_noise_never_exceeds_the_papers_closed_form(n, k, rounds, eps):
    """sigma^2 = 8 C^2 R log(2/delta) / (n^2 eps^2) (Abadi et al.'s moments bound, the paper's
    noise for the std of a silo's mean gradient over K of n records, R rounds): in its regime
    (Abadi et al.'s condition eps <= q^2 R with q = K / n), dp-accounting's calibration needs no
    more noise."""
    delta, clip = 1.0 / n ** 2, 1.0
    assert eps <= (k / n) ** 2 * rounds
    z = calibration.calibrate(eps, delta, [(k / n, rounds)])
    assert z * clip / k <= calibration.paper_sigma(clip, rounds, n, eps, delta)


GOOD = dict(rounds=3)


@pytest.mark.parametrize("algo, kwargs, name", [
    (isrl.ISRL_MB_SGD, dict(target_epsilon=0.0), "algorithm.target_epsilon"),
    (isrl.ISRL_MB_SGD, dict(target_epsilon=-1.0), "algorithm.target_epsilon"),
    (isrl.ISRL_MB_SGD, dict(delta=0.0), "algorithm.delta"),
    (isrl.ISRL_MB_SGD, dict(delta=1.0), "algorithm.delta"),
    (isrl.ISRL_MB_SGD, dict(num_available=0), "algorithm.num_available"),
    (isrl.ISRL_SPIDER, dict(phase_length=0), "algorithm.phase_length"),
    (isrl.ISRL_MB_SGD, dict(learning_rate=-0.1), "algorithm.learning_rate"),
    (isrl.ISRL_MB_SGD, dict(clip_norm=-1.0), "algorithm.clip_norm"),
    (isrl.ISRL_MB_SGD, dict(prox="lasso"), "algorithm.prox"),
    (isrl.ISRL_LOCAL_SGD, dict(local_steps=0), "algorithm.local_steps"),
    (isrl.ISRL_PROX_PL_SVRG, dict(epoch_length=3, restart_every=4), "algorithm.restart_every"),
    (isrl.MB_SGD, dict(batch_size=0), "algorithm.batch_size"),
])
def test_bad_config_fails_with_one_line_naming_the_parameter(algo, kwargs, name):
    with pytest.raises(ValueError, match=name) as info:
        algo.Config(**{**GOOD, **kwargs})
    assert "\n" not in str(info.value)


def test_more_available_than_silos_fails_before_work(monkeypatch):
    from isrl_fixtures import FED, MODEL
    called = []
    monkeypatch.setattr(engine, "make_round", lambda *a, **k: called.append(1))
    monkeypatch.setattr(calibration, "calibrate", lambda *a, **k: called.append(1))
    cfg = isrl.ISRL_MB_SGD.Config(num_available=FED.num_agents + 1)
    with pytest.raises(ValueError, match="algorithm.num_available"):
        isrl.ISRL_MB_SGD.init(jax.random.key(0), FED, MODEL, cfg)
    assert not called


def test_noise_is_calibrated_per_silo_for_its_own_transcript(monkeypatch):
    """Each silo's z meets the target for its own rates (SPIDER: refresh and difference kinds,
    R = 5, q = 2: 3 refresh + 2 difference uploads); smaller silos (larger rates) need more
    noise; ``calibrate_per_silo = false`` gives every silo the largest z; one calibration per
    distinct row of rates."""
    algo = isrl.ISRL_SPIDER
    rates = np.array([[0.5, 0.25], [0.2, 0.1], [0.5, 0.25]])
    cfg = algo.Config(rounds=5, phase_length=2, target_epsilon=2.0, delta=DELTA)
    calls = []
    real = calibration.calibrate
    monkeypatch.setattr(calibration, "calibrate", lambda *a: calls.append(a) or real(*a))
    z = algo.noise_multiplier(cfg, rates)
    assert z.shape == (3,) and z[0] == z[2] and z[0] > z[1] and len(calls) == 2
    assert rates[0].tolist() == rates[2].tolist()      # silo 2 is silo 0: checked once below
    for zi, row in zip(z[:2], rates[:2]):
        releases = list(zip(row, (3, 2)))
        assert _direct_epsilon(zi, releases, DELTA, "rdp") <= 2.0
        assert _direct_epsilon(zi * 0.98, releases, DELTA, "rdp") > 2.0
    shared = algo.noise_multiplier(dataclasses.replace(cfg, calibrate_per_silo=False), rates)
    np.testing.assert_allclose(shared, z[0])
    # the ledger of a run with these z: every silo at most the target, the worst ~ the target
    state = _fake_state(algo, rates, [[3, 2]] * 3, z)
    row, = algo.ledger(cfg, state).report(DELTA, ("rdp",))
    assert 1.9 < row["epsilon"] <= 2.0
