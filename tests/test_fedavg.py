"""FedAvg / DP-FedAvg rounds against a per-agent reference loop, clipping, noise and sampling."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dp.algorithms import dp_fedavg, fedavg
from fedjax_dp.core import from_ragged
from fedjax_dp.models import make_model
from fedjax_dp.privacy import accounting
from fedjax_dp.train import LocalTrainConfig, make_local_update

LOCAL = LocalTrainConfig(steps=3, batch_size=4, learning_rate=0.2)


@pytest.fixture(scope="module")
def setup():
    r = np.random.default_rng(0)
    sizes = [4, 6, 3, 5, 6, 2]
    ys = [r.integers(0, 3, size=n) for n in sizes]
    xs = [r.normal(size=(len(y), 5)).astype(np.float32) + y[:, None] for y in ys]
    model = make_model("mlp", (5,), 3, hidden=(6,))
    return from_ragged(xs, ys), model, model.init(jax.random.key(0))


def _reference_round(key, params, data, model, spec):
    """The round written the slow way: a Python loop over agents (test oracle)."""
    n = data.num_agents
    k_sample, k_train, k_noise = jax.random.split(key, 3)
    sampled = np.asarray(jax.random.bernoulli(k_sample, spec.sampling_rate, (n,)))
    update = jax.jit(make_local_update(model, LOCAL))
    keys = jax.random.split(k_train, n)
    total = jax.tree.map(jnp.zeros_like, params)
    for i in range(n):
        if not sampled[i]:
            continue
        local, _ = update(keys[i], params, data.x[i], data.y[i], data.mask[i], data.counts[i])
        delta = jax.tree.map(lambda a, b: a - b, local, params)
        if spec.clip_norm is not None:
            norm = float(optax.tree.norm(delta))
            delta = jax.tree.map(lambda d: d * min(1.0, spec.clip_norm / norm), delta)
        total = jax.tree.map(jnp.add, total, delta)
    denom = spec.sampling_rate * n if spec.denominator == "expected" else max(sampled.sum(), 1)
    return jax.tree.map(lambda p, t: p + spec.server_lr * t / denom, params, total), sampled


@pytest.mark.parametrize("spec", [
    fedavg.RoundSpec(sampling_rate=1.0, server_lr=1.0),
    fedavg.RoundSpec(sampling_rate=0.5, server_lr=0.7, clip_norm=0.05, denominator="expected"),
])
def test_round_equals_per_agent_loop(setup, spec):
    data, model, params = setup
    key = jax.random.key(11)
    got, metrics = fedavg.make_round(model, LOCAL, spec)(key, params, data)
    want, sampled = _reference_round(key, params, data, model, spec)
    assert metrics["num_sampled"] == sampled.sum()
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), got, want)


def test_chunked_round_equals_plain(setup):
    data, model, params = setup
    spec = fedavg.RoundSpec(sampling_rate=0.5, server_lr=1.0, clip_norm=0.1, noise_std=0.01,
                            denominator="expected")
    key = jax.random.key(3)
    a = fedavg.make_round(model, LOCAL, spec)(key, params, data)
    b = fedavg.make_round(model, LOCAL, spec, chunk_size=4)(key, params, data)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6), a, b)


def test_dp_noise_std_and_independence(setup):
    """With zero local steps every update is 0: the step is pure noise / (qN), std sigma*S/(qN)."""
    data, _, _ = setup
    model = make_model("mlp", (5,), 3, hidden=(64,))          # 579 parameters
    params = model.init(jax.random.key(1))
    sigma, clip, q = 2.0, 0.5, 0.5
    cfg = dp_fedavg.Config(rounds=1, sampling_rate=q, clip_norm=clip, noise_multiplier=sigma,
                           local=LocalTrainConfig(steps=0))
    round_fn = fedavg.make_round(model, cfg.local, dp_fedavg.round_spec(cfg))
    steps = []
    for t in range(20):
        new, _ = round_fn(jax.random.fold_in(jax.random.key(5), t), params, data)
        steps.append(np.concatenate([np.ravel(a - b) for a, b in
                                     zip(jax.tree.leaves(new), jax.tree.leaves(params))]))
    steps = np.stack(steps)                                   # [rounds, num_params]
    expected_std = sigma * clip / (q * data.num_agents)
    assert np.std(steps) == pytest.approx(expected_std, rel=0.05)
    corr = np.corrcoef(steps)                                 # rounds' noise is independent
    off = corr[~np.eye(len(corr), dtype=bool)]
    assert np.max(np.abs(off)) < 6 / np.sqrt(steps.shape[1])   # 6 standard errors


def test_clipping_bounds_each_agent_contribution(setup):
    data, model, params = setup
    clip = 1e-3
    spec = fedavg.RoundSpec(sampling_rate=1.0, server_lr=1.0, clip_norm=clip,
                            denominator="expected")
    new, metrics = fedavg.make_round(model, LocalTrainConfig(steps=5, learning_rate=1.0), spec)(
        jax.random.key(0), params, data)
    step = optax.tree.norm(jax.tree.map(lambda a, b: a - b, new, params))
    assert float(step) <= clip + 1e-7                         # average of vectors of norm <= S
    assert float(metrics["mean_update_norm"]) > 10 * clip     # unclipped updates were larger


def test_poisson_sampling_rate():
    masks = jax.vmap(lambda k: fedavg.sample_agents(k, 50, 0.2))(
        jax.random.split(jax.random.key(0), 200))
    assert float(masks.mean()) == pytest.approx(0.2, abs=0.01)
    assert len({tuple(np.asarray(m)) for m in masks}) == 200   # fresh draw every round


def test_runs_learn_and_report_history(setup):
    data, model, params = setup
    x = np.concatenate([data.local(i)[0] for i in range(data.num_agents)])
    y = np.concatenate([data.local(i)[1] for i in range(data.num_agents)])
    seen = []
    from fedjax_dp.train import accuracy
    h = fedavg.run(jax.random.key(0), data, model,
                   fedavg.Config(rounds=8, local=LocalTrainConfig(steps=5, batch_size=4,
                                                                  learning_rate=0.2)),
                   init_params=params, evaluate=lambda p: {"acc": accuracy(model, p, x, y)},
                   eval_every=4, on_round=lambda t, r: seen.append(t))
    assert seen == list(range(1, 9)) and len(h.rounds) == 8
    assert "acc" in h.rounds[3] and "acc" not in h.rounds[2]
    assert h.rounds[-1]["acc"] > accuracy(model, params, x, y)
    assert h.rounds[-1]["train_loss"] < h.rounds[0]["train_loss"]


def test_dp_fedavg_ledger_equals_dp_accounting():
    import dp_accounting
    cfg = dp_fedavg.Config(rounds=30, sampling_rate=0.1, noise_multiplier=1.1, clip_norm=0.7)
    ledger = dp_fedavg.privacy_ledger(cfg, num_agents=100)
    assert ledger.units() == ["agent"]
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(1.1)), 30)
    acc = dp_accounting.rdp.RdpAccountant(list(accounting.DEFAULT_RDP_ORDERS))
    acc.compose(event)
    assert ledger.epsilon("agent", 1e-5, "rdp") == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9)
    pld = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    pld.compose(event)
    assert ledger.epsilon("agent", 1e-5, "pld") == pytest.approx(pld.get_epsilon(1e-5), rel=1e-6)


@pytest.mark.parametrize("kwargs,match", [
    (dict(noise_multiplier=-1.0), "algorithm.noise_multiplier"),
    (dict(clip_norm=0.0), "algorithm.clip_norm"),
    (dict(sampling_rate=1.5), "algorithm.sampling_rate"),
    (dict(rounds=0), "algorithm.rounds"),
    (dict(denominator="median"), "algorithm.denominator"),
])
def test_dp_fedavg_config_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        dp_fedavg.Config(**kwargs)
