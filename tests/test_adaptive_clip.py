"""Adaptive clipping (Andrew et al. 2021) in DP-FedAvg: the combined noise multiplier against a
closed form, dp-accounting called directly and a brute-force integration of the subsampled 2-D
mechanism; the server's two noises measured against the ledger; the clip tracking its target
quantile; every execution path (fused, one per call, host passes, secure aggregation, seeds)
giving the same run."""
import dataclasses
import math

import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import chains
from fedjax_dp.algorithms import api, round_parts, seeds
from fedjax_dp.algorithms.averaging import dp_fedavg
from fedjax_dp.core import cohort, from_ragged
from fedjax_dp.models import make_model
from fedjax_dp.privacy import adaptive_clip
from fedjax_dp.stages import Setup, updates
from fedjax_dp.train import LocalTrainConfig

LOCAL = LocalTrainConfig(steps=2, batch_size=4, learning_rate=0.2)


# --------------------------------------------------------------------------- the accounting

def test_update_noise_multiplier_closed_form():
    # z = 1, sigma_b = m / 20 at m = 100 (the paper's default): z_Delta = (1 - 1/100)^-1/2
    assert adaptive_clip.update_noise_multiplier(1.0, 5.0) == pytest.approx(1.0050378, abs=1e-7)
    assert adaptive_clip.AdaptiveClip().count_std(100.0) == 5.0
    assert adaptive_clip.update_noise_multiplier(0.0, 0.0) == 0.0
    with pytest.raises(ValueError, match="count_noise"):
        adaptive_clip.update_noise_multiplier(2.0, 1.0)       # 2 sigma_b = z: unreachable


@pytest.mark.parametrize("z,sigma_b", [(0.8, 1.5), (1.2, 5.0), (3.0, 2.0)])
def test_combined_multiplier_equals_the_two_gaussians_composed(z, sigma_b):
    """Unsampled, the round is the updates' Gaussian (z_Delta) and the count's (sensitivity 1/2,
    std sigma_b: multiplier 2 sigma_b) composed: dp-accounting's RDP and PLD of the composition
    equal those of the one Gaussian of multiplier z the ledger records."""
    z_delta = adaptive_clip.update_noise_multiplier(z, sigma_b)
    two = dp_accounting.ComposedDpEvent([dp_accounting.GaussianDpEvent(z_delta),
                                         dp_accounting.GaussianDpEvent(2 * sigma_b)])
    one = dp_accounting.GaussianDpEvent(z)
    for make in (lambda: dp_accounting.rdp.RdpAccountant(),
                 lambda: dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)):
        a, b = make().compose(two, 10), make().compose(one, 10)
        assert a.get_epsilon(1e-5) == pytest.approx(b.get_epsilon(1e-5), rel=2e-3)


def _hockey_stick_2d(mu, q, eps, grid=1601, span=9.0):
    """delta(eps) of one Poisson-subsampled round on the 2-D vector (update along its clip,
    centred count), written without the rotation argument: both orders of
    P = (1 - q) N(0, I) + q N(mu, I) and Q = N(0, I), integrated on a grid."""
    t = np.linspace(-span, span + max(mu), grid)
    h = t[1] - t[0]
    xx, yy = np.meshgrid(t, t, indexing="ij")
    phi = lambda a, b: np.exp(-0.5 * ((xx - a) ** 2 + (yy - b) ** 2)) / (2 * np.pi)  # noqa
    qd = phi(0.0, 0.0)
    pd = (1 - q) * qd + q * phi(*mu)
    return max(np.sum(np.maximum(pd - math.exp(eps) * qd, 0)) * h * h,
               np.sum(np.maximum(qd - math.exp(eps) * pd, 0)) * h * h)


@pytest.mark.parametrize("z,sigma_b,q", [(1.0, 1.5, 0.3), (0.7, 0.6, 0.1)])
def test_subsampled_round_brute_force_against_the_ledger(z, sigma_b, q):
    """The ledger's ``PoissonSampled(q, Gaussian(z))`` against the subsampled two-release
    mechanism integrated directly in 2-D: the update moves by C / (z_Delta C) noise stds, the
    count by (1/2) / sigma_b."""
    cfg = dp_fedavg.Config(rounds=1, sampling_rate=q, noise_multiplier=z,
                           adaptive_clip={"count_noise": sigma_b}, local=LOCAL)
    event = dp_fedavg.dp_event(cfg)
    z_delta = adaptive_clip.update_noise_multiplier(z, sigma_b)
    mu = (1.0 / z_delta, 0.5 / sigma_b)
    pld = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4).compose(event)
    for eps in (0.5, 1.0, 2.0):
        brute = _hockey_stick_2d(mu, q, eps)
        assert pld.get_delta(eps) == pytest.approx(brute, rel=0.02, abs=1e-7)


# --------------------------------------------------------------------------- the server

def _zero_update(key, params, x, y, mask, count, extras):
    return params, {}


def test_server_noises_are_the_ledgers_and_independent():
    """Measured over 4,000 rounds of zero updates: the sum's noise has std z_Delta C_t, the
    count's sigma_b, uncorrelated; together they give the ledger's z."""
    z, sigma_b, c_t, n, q, eta, gamma = 1.3, 2.0, 0.7, 20, 0.5, 0.3, 0.4
    cfg = dp_fedavg.Config(rounds=1, sampling_rate=q, noise_multiplier=z, server_lr=1.0,
                           adaptive_clip={"count_noise": sigma_b, "learning_rate": eta,
                                          "target_quantile": gamma}, local=LOCAL)
    chain = chains.replace(dp_fedavg.chain(cfg), client_update=updates.LocalSteps(_zero_update))
    _, server, _ = round_parts.make_round_parts(chain, Setup(n, 1))
    params = {"w": jnp.zeros((3,), jnp.float32)}
    sums = ((params, jnp.float32(0.0)), {}, jnp.float32(0.0))
    states = list(chain.init_state(jax.random.key(0), params, n))
    states[2] = {"clip_norm": jnp.float32(c_t)}
    view = {"params": params, "stages": tuple(states)}

    def one(key):
        new, metrics = server(key, view, sums)
        return (new["params"]["w"][0], new["stages"][2]["clip_norm"], metrics["clip_norm"],
                metrics["unclipped_fraction"])

    keys = jax.random.split(jax.random.key(3), 4000)
    w0, clip, used, fraction = map(np.asarray, jax.vmap(one)(keys))
    m = q * n
    assert np.all(used == np.float32(c_t))
    sum_noise = w0 * m                                 # new = lr * (0 + noise) / (q N)
    count_noise = (fraction - 0.5) * m                 # bbar = (0 + noise) / m + 1/2
    # the geometric step, from the released fraction
    np.testing.assert_allclose(clip, c_t * np.exp(-eta * (fraction - gamma)), rtol=1e-5)
    z_delta = np.std(sum_noise) / c_t
    assert z_delta == pytest.approx(adaptive_clip.update_noise_multiplier(z, sigma_b), rel=0.04)
    assert np.std(count_noise) == pytest.approx(sigma_b, rel=0.04)
    assert abs(np.corrcoef(sum_noise, count_noise)[0, 1]) < 0.06
    combined = (z_delta ** -2 + (2 * np.std(count_noise)) ** -2) ** -0.5
    ledger_z = dp_fedavg.dp_event(cfg).event.event.noise_multiplier
    assert combined == pytest.approx(ledger_z, rel=0.04)


def test_clip_tracks_the_target_quantile():
    """Noise-free, agents whose updates have norms 1..20: C_t settles between the norms either
    side of the target quantile, from far below and far above."""
    n = 20
    norms = np.arange(1, n + 1, dtype=np.float32)
    xs = [np.full((2, 1), v, np.float32) for v in norms]
    data = from_ragged(xs, [np.zeros(2, np.int32)] * n)

    def update(key, params, x, y, mask, count, extras):      # Delta = (x, 0): norm x
        return {"w": params["w"] + jnp.stack([x[0, 0], 0.0])}, {}

    for gamma, lo, hi in ((0.5, 9.0, 12.0), (0.8, 15.0, 18.0)):
        for c0 in (0.05, 400.0):
            chain = chains.chain(None, None, sampling=cohort.Sampling("poisson", rate=1.0),
                                 server_lr=0.0, clip_norm=c0, denominator="expected",
                                 adaptive=adaptive_clip.AdaptiveClip(gamma, 0.3, 0.0),
                                 agent_update=update)
            _, _, fused = round_parts.make_round_parts(chain, Setup(n, 1))
            params = {"w": jnp.zeros(2)}
            view = {"params": params, "stages": chain.init_state(jax.random.key(0), params, n)}
            assert float(view["stages"][2]["clip_norm"]) == pytest.approx(c0)
            ids = jnp.arange(n, dtype=jnp.int32)
            valid = jnp.ones(n, bool)
            for t in range(120):
                view, metrics = fused(jax.random.key(t), jax.random.key(t), view, data, None,
                                      ids, valid, {})
            clip = float(view["stages"][2]["clip_norm"])
            assert lo <= clip <= hi, (gamma, c0, clip)


# --------------------------------------------------------------------------- the run

@pytest.fixture(scope="module")
def setup():
    r = np.random.default_rng(4)
    sizes = [4, 6, 3, 5, 6, 2, 5, 4, 3, 6]
    ys = [r.integers(0, 3, size=k) for k in sizes]
    xs = [r.normal(size=(len(y), 5)).astype(np.float32) + y[:, None] for y in ys]
    model = make_model("mlp", (5,), 3, hidden=(6,))
    return api.FederatedData(agents=from_ragged(xs, ys), num_classes=3), model


def _config(**kw):
    base = dict(rounds=6, sampling_rate=0.5, clip_norm=0.05, noise_multiplier=0.8, local=LOCAL,
                adaptive_clip={"target_quantile": 0.5, "learning_rate": 0.5,
                               "count_noise": 0.5, "max_clip_norm": 4.0})
    base.update(kw)
    return dp_fedavg.Config(**base)


def _run(setup, config, rpc, data=None, key=jax.random.key(7)):
    fed, model = setup
    if data is not None:
        fed = dataclasses.replace(fed, agents=data)
    return api.run(dp_fedavg, key, fed, model, config,
                   runtime=api.Runtime(rounds_per_call=rpc))


def _close(a, b, tol=1e-5):
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=tol, atol=tol), a, b)


@pytest.fixture(scope="module")
def fused_run(setup):
    """The adaptive run fused 3 rounds per call (key 7), shared by the path and seed tests."""
    return _run(setup, _config(), 3)


def test_every_path_runs_the_same_adaptive_rounds(setup, fused_run):
    """Fused K rounds per call == host passes (one compiled call per pass); the clip moves and
    is carried; secure aggregation (fixed point, masks) equals the plain sum up to its rounding."""
    config = _config()
    fused = fused_run
    host = _run(setup, config, 1, data=setup[0].agents.on_host())
    clips = [h["clip_norm"] for h in fused.history]
    assert clips[0] == pytest.approx(0.05) and clips[-1] > 2 * clips[0]   # tracking upwards
    for other in (host,):
        _close(fused.state.values, other.state.values)
        for a, b in zip(fused.history, other.history):
            assert a["clip_norm"] == pytest.approx(b["clip_norm"], rel=1e-5)
    sec = _run(setup, _config(aggregation="secagg", secagg_frac_bits=20), 3)
    _close(fused.state.values, sec.state.values, tol=1e-3)
    # the ledger: the fixed-clip event of the combined z, with the note of both releases
    entry = dp_fedavg.ledger(config).entries[0]
    assert entry.event == dp_fedavg.dp_event(dataclasses.replace(config, adaptive_clip=None))
    assert "unclipped count" in entry.note


def test_adaptive_seeds_equal_separate_runs(setup, fused_run):
    """Two seeds run together (one call per round) equal each seed run alone (the separate runs
    fused 3 rounds per call, which equal one call per round: the test above)."""
    fed, model = setup
    config = _config()
    keys = [jax.random.key(s) for s in (7, 2)]
    together = seeds.run_seeds(dp_fedavg, keys, [fed] * 2, model, config,
                               runtime=api.Runtime(rounds_per_call=1))
    assert together is not None
    alone = [fused_run, _run(setup, config, 3, key=keys[1])]
    for single, joint in zip(alone, together):
        _close(joint.state.values, single.state.values)


def test_refusals_name_the_parameter(setup):
    with pytest.raises(ValueError, match="count_noise"):
        _config(noise_multiplier=3.0, adaptive_clip={"count_noise": 1.0})
    with pytest.raises(ValueError, match="target_quantile"):
        _config(adaptive_clip={"target_quantile": 1.0})
    with pytest.raises(ValueError, match=r"algorithm.adaptive_clip.quantile"):
        _config(adaptive_clip={"quantile": 0.5})
    with pytest.raises(ValueError, match="max_clip_norm"):   # secure aggregation's range
        _run(setup, _config(aggregation="secagg", adaptive_clip={"count_noise": 1.0}), 1)
    # the paper's default sigma_b = m / 20 (m = q N = 5 here) cannot reach z = 0.8
    with pytest.raises(ValueError, match="count_noise"):
        _run(setup, _config(adaptive_clip=True), 1)
