"""DP-FedSGD: the vmapped round against per-agent / per-record loops, Poisson masks, clipping,
noise (std and independence), instance-level accounting (worst agent) and the runner."""
import dataclasses

import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import chains
from fedjax_dp.algorithms.averaging import dp_fedsgd
from fedjax_dp.core import cohort, for_each_agent, from_ragged
from fedjax_dp.experiments import config as config_lib
from fedjax_dp.experiments import runner
from fedjax_dp.models import Model, make_model
from fedjax_dp.privacy import accounting, noise as noise_lib
from fedjax_dp.train import LocalTrainConfig, cross_entropy

DELTA = 1e-5


@pytest.fixture(scope="module")
def setup():
    r = np.random.default_rng(0)
    sizes = [4, 6, 3, 5]
    ys = [r.integers(0, 3, size=n) for n in sizes]
    xs = [r.normal(size=(len(y), 5)).astype(np.float32) + y[:, None] for y in ys]
    model = make_model("mlp", (5,), 3, hidden=(6,))
    cfg = dp_fedsgd.Config(rounds=1, sampling_rate=0.75, clip_norm=0.3, noise_multiplier=0.7,
                           server_lr=0.9, diagnostics=True,
                           local=LocalTrainConfig(steps=2, batch_size=2, learning_rate=0.5))
    return from_ragged(xs, ys), model, model.init(jax.random.key(0)), cfg


def _plan(cfg, data):
    return (jnp.asarray(dp_fedsgd.record_sampling_rates(cfg, data.counts), jnp.float32),
            jnp.asarray(dp_fedsgd.expected_batch_sizes(cfg, data.counts), jnp.float32))


def _reference_round(key, params, data, model, cfg):
    """The round the slow way: loops over agents, steps and records (numpy clipping, plain SGD)."""
    n = data.num_agents
    k_sample, k_train, _ = jax.random.split(key, 3)
    sampled = cohort.sample_mask(k_sample, n, cfg.participation) > 0
    rates, denoms = _plan(cfg, data)
    loss = jax.jit(jax.grad(cross_entropy(model)))
    total = jax.tree.map(jnp.zeros_like, params)
    for i in range(n):
        agent_key = jax.random.fold_in(k_train, i)
        p = params
        for step_key in jax.random.split(agent_key, cfg.local.steps):
            k_batch, k_noise = jax.random.split(step_key)
            keep = np.asarray(jax.random.bernoulli(k_batch, rates[i], data.mask[i].shape))
            g_sum = jax.tree.map(jnp.zeros_like, p)
            for j in range(int(data.counts[i])):              # real records only
                if not keep[j]:
                    continue
                g = loss(p, data.x[i, j], data.y[i, j])
                norm = np.sqrt(sum(float(jnp.sum(l ** 2)) for l in jax.tree.leaves(g)))
                g_sum = jax.tree.map(lambda s, l: s + l * min(1.0, cfg.clip_norm / norm), g_sum, g)
            noise = noise_lib.gaussian_noise(k_noise, g_sum, cfg.noise_multiplier * cfg.clip_norm)
            p = jax.tree.map(lambda w, s, z: w - cfg.local.learning_rate * (s + z) / denoms[i],
                             p, g_sum, noise)
        if sampled[i]:
            total = jax.tree.map(lambda t, w, w0: t + w - w0, total, p, params)
    count = max(sampled.sum(), 1)
    return jax.tree.map(lambda w, t: w + cfg.server_lr * t / count, params, total), sampled


def _make_round(*args, **kwargs):
    """DP-FedSGD's round runner called on bare params (its stages hold no state)."""
    return chains.ParamsRunner.of(dp_fedsgd.make_round(*args, **kwargs))


def _close(a, b):
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=2e-5, atol=2e-6), a, b)


@pytest.fixture(scope="module")
def plain_round(setup):
    data, model, _, cfg = setup
    return _make_round(model, cfg, data, *_plan(cfg, data))   # compiled once, shared


def test_round_equals_per_agent_per_record_loop(setup, plain_round):
    data, model, params, cfg = setup
    key = jax.random.key(7)
    got, metrics = plain_round(key, params)
    want, want_sampled = _reference_round(key, params, data, model, cfg)
    np.testing.assert_array_equal(plain_round.last_indices, np.flatnonzero(want_sampled))
    assert 0 < want_sampled.sum() < data.num_agents        # the mask really selects
    assert metrics["num_sampled"] == want_sampled.sum()
    _close(got, want)


def test_chunked_and_masked_rounds_equal_the_gathered_one(setup, plain_round):
    data, model, params, cfg = setup
    rates, denoms = _plan(cfg, data)
    key = jax.random.key(3)
    gathered = plain_round(key, params)
    chunked = _make_round(model, cfg, data, rates, denoms, chunk_size=2)(key, params)
    masked = _make_round(model, cfg, data, rates, denoms, cohort="masked")(key, params)
    _close(gathered, chunked)
    _close(gathered, masked)


def test_record_sampling_rates_and_denominators():
    local = LocalTrainConfig(batch_size=15)
    counts = np.array([60, 30, 10, 45])
    cfg = dp_fedsgd.Config(local=local)
    np.testing.assert_allclose(dp_fedsgd.record_sampling_rates(cfg, counts),
                               [0.25, 0.5, 1.0, 1 / 3])
    np.testing.assert_allclose(dp_fedsgd.expected_batch_sizes(cfg, counts), [15, 15, 10, 15])
    fixed = dp_fedsgd.Config(local=local, record_sampling_rate=0.2)
    np.testing.assert_allclose(dp_fedsgd.record_sampling_rates(fixed, counts), 0.2)
    np.testing.assert_allclose(dp_fedsgd.expected_batch_sizes(fixed, counts), 0.2 * counts)


def test_poisson_mask_rate_and_padding_never_sampled():
    n_max, counts = 50, jnp.array([30, 50, 1])
    rates = jnp.array([0.3, 0.05, 0.9])
    mask = jnp.arange(n_max)[None, :] < counts[:, None]                         # [3, 50]
    keys = jax.random.split(jax.random.key(0), 400 * 3).reshape(400, 3)
    draw = jax.vmap(jax.vmap(dp_fedsgd.sample_records))                        # [trials, agents]
    w = np.asarray(draw(keys, jnp.broadcast_to(mask, (400,) + mask.shape),
                        jnp.broadcast_to(rates, (400, 3))))                     # [400, 3, 50]
    assert set(np.unique(w)) <= {0.0, 1.0}
    assert not np.any(w[:, ~np.asarray(mask)])                                  # never padding
    for a in range(3):
        real = w[:, a, :int(counts[a])]
        p = float(rates[a])
        se = np.sqrt(p * (1 - p) / real.size)
        assert abs(real.mean() - p) < 5 * se
    # records are drawn independently: batch sizes vary like a binomial, not all-or-nothing
    sizes = w[:, 0].sum(-1)
    assert np.var(sizes) == pytest.approx(30 * 0.3 * 0.7, rel=0.3)


def _zero_gradient_model(dim: int) -> Model:
    """Logits that do not depend on the parameters: every gradient is exactly zero."""
    return Model(init=lambda key: {"w": jnp.zeros((dim,))},
                 apply=lambda p, x: jnp.zeros((3,)) * jnp.sum(p["w"]) + jnp.arange(3.0),
                 name="zero", feature_shape=(5,), num_classes=3)


def test_noise_std_and_independence_across_agents_steps_and_rounds(setup):
    """Zero gradients: each step moves an agent by -lr * N(0, (zC)^2) / (p n_i). With E steps
    the std is sqrt(E) times one step's (it would be E times if the steps shared noise); agents'
    noise is uncorrelated, and so is the noise of two rounds."""
    data, _, _, _ = setup
    dim, steps, lr, z, clip = 2000, 4, 0.5, 1.3, 0.4
    model = _zero_gradient_model(dim)
    cfg = dp_fedsgd.Config(rounds=1, clip_norm=clip, noise_multiplier=z,
                           local=LocalTrainConfig(steps=steps, batch_size=2, learning_rate=lr))
    rates, denoms = _plan(cfg, data)
    params = model.init(None)
    lifted = jax.jit(for_each_agent(dp_fedsgd.make_local_dp_sgd(model, cfg),
                                    (0, None, 0, 0, 0, 0, 0)))
    n = data.num_agents
    local, _ = lifted(jax.random.split(jax.random.key(1), n), params, data.x, data.y, data.mask,
                      rates, denoms)
    moves = np.asarray(local["w"])                                               # [N, dim]
    for i in range(n):
        want = lr * z * clip * np.sqrt(steps) / float(denoms[i])
        assert np.std(moves[i]) == pytest.approx(want, rel=0.06)
    corr = np.corrcoef(moves)
    assert np.max(np.abs(corr[~np.eye(n, dtype=bool)])) < 6 / np.sqrt(dim)

    round_fn = _make_round(model, cfg, data, rates, denoms)
    a, _ = round_fn(jax.random.key(2), params)
    b, _ = round_fn(jax.random.key(3), params)
    want = lr * z * clip * np.sqrt(steps) * np.sqrt(np.sum(1 / np.asarray(denoms) ** 2)) / n
    assert np.std(a["w"]) == pytest.approx(want, rel=0.06)                    # mean of N agents
    assert abs(np.corrcoef(a["w"], b["w"])[0, 1]) < 6 / np.sqrt(dim)


def test_per_example_clipping_bounds_each_record(setup):
    data, model, params, _ = setup
    loss = cross_entropy(model)
    x = data.x[1] * 3.0
    clip = 1e-3                                                       # far below every gradient
    count = int(data.counts[1])

    # rows 0..count-1: one record each (one-hot weights); last row: all records at once
    w = jnp.concatenate([jnp.eye(data.max_size)[:count], data.mask[1][None].astype(jnp.float32)])
    g, stats = jax.jit(jax.vmap(lambda wj: dp_fedsgd.noisy_gradient(
        jax.random.key(0), loss, params, x, data.y[1], wj, clip, 0.0, 4.0)))(w)
    g_norms = np.asarray(jax.vmap(optax.tree.norm)(g))                        # [count + 1]
    np.testing.assert_array_equal(np.asarray(stats["clipped"]), [1.0] * count + [count])
    np.testing.assert_allclose(g_norms[:count], clip / 4.0, rtol=1e-5)       # each one clipped
    assert g_norms[-1] <= clip * count / 4.0 + 1e-6
    # one DP-SGD step without noise: the update is at most lr * C * (batch) / denominator
    cfg = dp_fedsgd.Config(clip_norm=clip, noise_multiplier=0.0,
                           local=LocalTrainConfig(steps=1, batch_size=2, learning_rate=1.0))
    new, metrics = jax.jit(dp_fedsgd.make_local_dp_sgd(model, cfg))(
        jax.random.key(4), params, x, data.y[1], data.mask[1], 1.0, 2.0)
    step = float(optax.tree.norm(jax.tree.map(jnp.subtract, new, params)))
    assert 0 < step <= clip * count / 2.0 + 1e-6
    assert float(metrics["clipped_fraction"]) == 1.0


def _direct_epsilon(z, p, steps, delta, accountant="rdp"):
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(p, dp_accounting.GaussianDpEvent(z)), int(steps))
    acc = (dp_accounting.rdp.RdpAccountant(list(accounting.DEFAULT_RDP_ORDERS))
           if accountant == "rdp"
           else dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4))
    return acc.compose(event).get_epsilon(delta)


def test_ledger_is_the_worst_agent_computed_directly():
    cfg = dp_fedsgd.Config(rounds=6, clip_norm=1.0, noise_multiplier=1.1,
                           local=LocalTrainConfig(steps=3, batch_size=15))
    counts = np.array([60, 30, 60, 45])                       # p = .25, .5, .25, .333
    ledger = dp_fedsgd.instance_ledger(cfg, counts)
    assert ledger.units() == ["instance"]
    assert "record" in ledger.relation("instance")
    want = _direct_epsilon(1.1, 0.5, 18, DELTA)               # smallest agent is the worst
    assert ledger.epsilon("instance", DELTA) == pytest.approx(want, rel=1e-9)
    assert ledger.epsilon("instance", DELTA, "pld") == pytest.approx(
        _direct_epsilon(1.1, 0.5, 18, DELTA, "pld"), rel=1e-6)
    np.testing.assert_array_equal(dp_fedsgd.worst_agents(cfg, counts), [1])
    report = ledger.report(DELTA, accountants=("rdp",))[0]
    assert report["unit"] == "instance" and report["data_dependent"] is False
    # unequal participation: agent 1 (p .5) ran 1 round, agent 0 (p .25) all 6: max of both
    part = np.array([6, 1, 2, 6])
    ledger = dp_fedsgd.instance_ledger(cfg, counts, part)
    per_agent = [_direct_epsilon(1.1, p, 3 * t, DELTA)
                 for p, t in zip([0.25, 0.5, 0.25, 1 / 3], part)]
    assert ledger.epsilon("instance", DELTA) == pytest.approx(max(per_agent), rel=1e-9)
    np.testing.assert_array_equal(dp_fedsgd.worst_agents(cfg, counts, part), [1, 3])
    # one rate for everyone, every round: a single distinct member
    same = dp_fedsgd.Config(rounds=6, noise_multiplier=1.1, record_sampling_rate=0.1,
                            local=LocalTrainConfig(steps=3))
    assert dp_fedsgd.instance_ledger(same, counts).epsilon("instance", DELTA) == pytest.approx(
        _direct_epsilon(1.1, 0.1, 18, DELTA), rel=1e-9)


@pytest.mark.parametrize("kwargs, match", [
    ({"clip_norm": 0.0}, "algorithm.clip_norm"),
    ({"noise_multiplier": -1.0}, "algorithm.noise_multiplier"),
    ({"record_sampling_rate": 0.0}, "algorithm.record_sampling_rate"),
    ({"record_sampling_rate": 1.5}, "algorithm.record_sampling_rate"),
    ({"rounds": 0}, "algorithm.rounds"),
    ({"sampling_rate": 0.0}, "algorithm.sampling_rate"),
    ({"local": LocalTrainConfig(batching="stored")}, "train.batching"),
])
def test_config_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        dp_fedsgd.Config(**kwargs)


def test_accounting_input_errors():
    cfg = dp_fedsgd.Config(rounds=3)
    with pytest.raises(ValueError, match="counts"):
        dp_fedsgd.instance_ledger(cfg, np.array([5, 0]))
    with pytest.raises(ValueError, match="participation"):
        dp_fedsgd.instance_ledger(cfg, np.array([5, 6]), np.array([1, 4]))
    with pytest.raises(ValueError, match="participation"):
        dp_fedsgd.instance_ledger(cfg, np.array([5, 6]), np.array([1]))


def test_end_to_end_through_the_runner(tmp_path):
    cfg = config_lib.resolve({
        "seed": 1,
        "data": {"dataset": "synthetic", "num_agents": 6, "partition": "label_shards",
                 "partition_options": {"classes_per_agent": 2},
                 "dataset_options": {"num_train": 240, "num_test": 200, "num_public": 10,
                                     "num_features": 8, "num_classes": 4}},
        "model": {"name": "logistic"},
        "train": {"steps": 4, "batch_size": 10, "learning_rate": 0.5},
        "algorithm": {"name": "dp_fedsgd", "rounds": 6, "sampling_rate": 0.5,
                      "clip_norm": 1.0, "noise_multiplier": 0.8},
        "privacy": {"delta": DELTA, "accountants": ["rdp"]},
        "run": {"eval_every": 3, "progress": False},
    })
    result = runner.run(cfg, tmp_path, progress=False)
    assert result["algorithm"] == "dp_fedsgd" and result["num_agents"] == 6
    assert result["test_accuracy"] > 0.6                      # chance is 0.25
    assert len(result["history"]) == 6 and "test_accuracy" in result["history"][-1]
    (guarantee,) = result["privacy"]
    assert guarantee["unit"] == "instance" and guarantee["data_dependent"] is False
    # agents hold 40 records (p = 10/40); the worst agent ran at most 6 rounds x 4 steps
    assert guarantee["epsilon"] <= _direct_epsilon(0.8, 0.25, 24, DELTA) + 1e-9
    assert guarantee["epsilon"] > 0
    assert (tmp_path / "result.json").exists()


def test_execution_choices_leave_params_participation_and_ledger_unchanged(setup):
    """Gathered (device / host-resident agents) and masked all-agent rounds of a whole run: the
    same parameters, the same participation counts T_i and so the same instance-level ledger."""
    from fedjax_dp.algorithms import api
    data, model, _, cfg = setup
    cfg = dataclasses.replace(cfg, rounds=3)
    runs = {}
    for name, agents, mode in (("gather", data, "gather"), ("host", data.on_host(), "gather"),
                               ("masked", data, "masked")):
        fed = api.FederatedData(agents=agents, num_classes=3)
        runs[name] = api.run(dp_fedsgd, jax.random.key(0), fed, model, cfg,
                             runtime=api.Runtime(chunk_size=None, cohort=mode)).state
    want = runs["masked"]
    assert 0 < int(np.sum(want.values["participation"])) < 3 * data.num_agents
    for name in ("gather", "host"):
        got = runs[name]
        _close(got.values["params"], want.values["params"])
        np.testing.assert_array_equal(got.values["participation"],
                                      want.values["participation"])
        assert dp_fedsgd.ledger(cfg, got).to_json() == dp_fedsgd.ledger(cfg, want).to_json()
