"""The round engine fused on the device (fedjax_dp.algorithms.rounds): K rounds per compiled call
equal one round per call and the per-agent loop; cohorts sampled on the device, in chunks that
follow the realised cohort (a cohort past one chunk is run exactly); no recompilation."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dp.algorithms import api, calls, fused_rounds, rounds
from fedjax_dp.algorithms.averaging import dp_fedavg, dp_fedsgd
from fedjax_dp.core import cohort, from_ragged
from fedjax_dp.models import make_model
from fedjax_dp.privacy import noise as noise_lib
from fedjax_dp.stages import Setup
from fedjax_dp.train import LocalTrainConfig, make_local_update

LOCAL = LocalTrainConfig(steps=2, batch_size=4, learning_rate=0.2)


@pytest.fixture(scope="module")
def setup():
    r = np.random.default_rng(3)
    sizes = [4, 6, 3, 5, 6, 2, 5, 4, 3, 6, 2, 5]
    ys = [r.integers(0, 3, size=n) for n in sizes]
    xs = [r.normal(size=(len(y), 5)).astype(np.float32) + y[:, None] for y in ys]
    model = make_model("mlp", (5,), 3, hidden=(6,))
    fed = api.FederatedData(agents=from_ragged(xs, ys), num_classes=3)
    return fed, model


def _close(a, b, tol=1e-5):
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=tol, atol=tol), a, b)


# --------------------------------------------------------------------------- sampling on the device

@pytest.mark.parametrize("rate", [0.0, 1e-9, 0.3, 0.999, 1.0])
def test_poisson_threshold_never_exceeds_the_accounted_rate(rate):
    q = cohort.realised_rate(rate)
    assert q <= rate and rate - q < 2.0 ** -32 + 1e-18


def test_cohort_coins_laws():
    n = 2000
    keys = jax.random.split(jax.random.key(0), 200)
    poisson = cohort.Sampling("poisson", rate=0.05)
    draw = jax.jit(jax.vmap(cohort.cohort_coins, in_axes=(0, None, None)), static_argnums=(1, 2))
    counts = np.asarray(draw(keys[:60], n, poisson).sum(axis=1))
    # Binomial(2000, 0.05): mean 100, std 9.75; the mean of 60 draws within 4 std errors
    assert abs(counts.mean() - 100) < 4 * 9.75 / np.sqrt(60)
    fixed = cohort.Sampling("fixed", size=7)
    masks = np.asarray(draw(keys, 20, fixed))
    assert (masks.sum(axis=1) == 7).all()
    # every agent equally likely: 200 * 7 / 20 = 70 inclusions each, binomial std ~ 6.7
    assert np.abs(masks.sum(axis=0) - 70).max() < 5 * 6.7
    assert bool(cohort.cohort_coins(keys[0], 9, cohort.Sampling("poisson", rate=1.0)).all())
    # the host driver's cohort is the same draw
    np.testing.assert_array_equal(cohort.sample_cohort(keys[1], n, poisson),
                                  np.flatnonzero(np.asarray(cohort.cohort_coins(keys[1], n,
                                                                                poisson))))


@pytest.mark.parametrize("method", ["scan", "scan_unrolled"])
@pytest.mark.parametrize("chunk", [1, 3, 8])
def test_cohort_chunks_enumerate_the_cohort_in_order(chunk, method):
    coins = np.random.default_rng(1).random(23) < 0.4
    rank = jnp.cumsum(jnp.asarray(coins, jnp.int32))
    m = int(rank[-1])
    got = []
    for j in range(-(-m // chunk)):
        ids, valid = fused_rounds.cohort_chunk(rank, rank[-1], jnp.int32(j), chunk, method)
        got += np.asarray(ids)[np.asarray(valid)].tolist()
        assert (np.asarray(ids) < 23).all()
    assert got == np.flatnonzero(coins).tolist()


# --------------------------------------------------------------------------- fused == one per call

def _dp_fedavg_config(**kw):
    base = dict(rounds=9, sampling_rate=0.4, clip_norm=0.5, noise_multiplier=0.7,
                local=LOCAL, diagnostics=True)
    base.update(kw)
    return dp_fedavg.Config(**base)


def _run(algorithm, setup, config, rpc, key=jax.random.key(5), **runtime):
    fed, model = setup
    return api.run(algorithm, key, fed, model, config,
                   runtime=api.Runtime(rounds_per_call=rpc, **runtime))


def test_fused_rounds_equal_one_round_per_call(setup):
    config = _dp_fedavg_config()
    one = _run(dp_fedavg, setup, config, 1)
    assert one.state.context.round_fn.fusable
    for rpc in (4,):
        many = _run(dp_fedavg, setup, config, rpc)
        _close(one.state.values, many.state.values)
        assert [h["round"] for h in many.history] == list(range(1, 10))
        for a, b in zip(one.history, many.history):
            assert a.keys() == b.keys()
            np.testing.assert_allclose([a[k] for k in a], [b[k] for k in a], rtol=1e-5)


def test_fused_rounds_equal_the_per_agent_loop(setup):
    """Two fused rounds (one call of the program above) against the round written as a Python
    loop over the sampled agents (the cohort read from the same device draw, the noise the
    library's Gaussian of the round's noise key)."""
    fed, model = setup
    config = _dp_fedavg_config()
    key = jax.random.key(11)
    state = dp_fedavg.init(key, fed, model, config, api.Runtime(rounds_per_call=4))
    got = dp_fedavg.multi_step(state, key, 0, 2)[0].values["params"]
    sampling, clip_norm = config.participation, config.clip_norm
    noise_std, server_lr = config.noise_multiplier * config.clip_norm, config.server_lr
    update = jax.jit(make_local_update(model, LOCAL))
    params = model.init(api.init_key(key))
    n, data = fed.num_agents, fed.agents
    for t in range(2):
        k_sample, k_train, k_noise = jax.random.split(api.step_key(key, t), 3)
        total = jax.tree.map(jnp.zeros_like, params)
        for i in cohort.sample_cohort(k_sample, n, sampling):
            local, _ = update(jax.random.fold_in(k_train, int(i)), params, data.x[i], data.y[i],
                              data.mask[i], data.counts[i])
            delta = jax.tree.map(jnp.subtract, local, params)
            scale = min(1.0, clip_norm / float(optax.tree.norm(delta)))
            total = jax.tree.map(lambda a, d: a + d * scale, total, delta)
        noise = noise_lib.gaussian_noise(k_noise, total, noise_std)
        params = jax.tree.map(lambda p, s, z: p + server_lr * (s + z) / (0.4 * n),
                              params, total, noise)
    _close(got, params)


def test_cohort_past_one_chunk_is_run_exactly(setup):
    """Chunks of 2 agents at q = 0.6 of 12 (M ~ 7: several chunks, every round): the fused
    gathered rounds equal the masked reference (every agent trains, the coins select) and the
    host-driven rounds (the agents host-resident)."""
    fed, model = setup
    config = _dp_fedavg_config(rounds=3, sampling_rate=0.6)
    chain = dp_fedavg.chain(config, model)
    setup_ = Setup(fed.num_agents, config.rounds)
    runner = rounds.RoundRunner(chain, setup_, fed.agents, pass_size=2)
    masked = rounds.RoundRunner(chain, setup_, fed.agents, cohort="masked")
    host = rounds.RoundRunner(chain, setup_, fed.agents.on_host(), pass_size=2)
    assert runner.fusable and not host.fusable
    params = model.init(jax.random.key(0))
    values = {"params": params,
              "stages": chain.init_state(jax.random.key(0), params, fed.num_agents)}
    key = jax.random.key(2)
    sizes = [int(cohort.sample_cohort(rounds.round_keys(api.step_key(key, t))[0], 12,
                                      config.participation).size) for t in range(3)]
    assert max(sizes) > 2                                 # past one chunk
    a, ma = runner.run_rounds(values, key, 0, 3)
    b, mb = masked.run_rounds(values, key, 0, 3)
    _close(a, b)
    np.testing.assert_array_equal(np.asarray(ma["num_sampled"])[:3], sizes)
    np.testing.assert_allclose(ma["train_loss"][:3], mb["train_loss"][:3], rtol=1e-5)
    v = values
    for t in range(3):
        v, _ = host.one(v, api.step_key(key, t))
    _close(a, v)


def test_dp_fedsgd_participation_counted_on_the_device(setup):
    fed, model = setup
    config = dp_fedsgd.Config(rounds=4, sampling_rate=0.5, clip_norm=1.0, noise_multiplier=1.0,
                              local=LOCAL)
    key = jax.random.key(4)
    fused = _run(dp_fedsgd, setup, config, "auto", key=key)
    steps = _run(dp_fedsgd, setup, config, 1, key=key)
    want = np.zeros(fed.num_agents, np.int64)
    for t in range(4):
        k_sample = rounds.round_keys(api.step_key(key, t))[0]
        want += rounds.sample_agents(k_sample, fed.num_agents, config.participation).astype(int)
    np.testing.assert_array_equal(fused.state.values["participation"], want)
    np.testing.assert_array_equal(steps.state.values["participation"], want)
    _close(fused.state.values["params"], steps.state.values["params"])
    # the ledger the run reports is the one planned before it
    planned = dp_fedsgd.planned_ledger(config, fused.state, key)(config)
    assert planned.epsilon("instance", 1e-5) == pytest.approx(
        dp_fedsgd.ledger(config, fused.state).epsilon("instance", 1e-5))


def test_one_compilation_whatever_the_count_and_cohort(setup):
    """Calls of different sizes and Poisson cohorts of different sizes run the same program."""
    fed, model = setup
    config = _dp_fedavg_config(rounds=12)            # the program of the tests above
    state = dp_fedavg.init(jax.random.key(1), fed, model, config,
                           api.Runtime(rounds_per_call=4))
    fused = state.context.round_fn.fused.rounds
    key = jax.random.key(8)
    sizes = set()
    for start, count in ((0, 1), (1, 4), (5, 2), (7, 4), (11, 1)):
        state, metrics = dp_fedavg.multi_step(state, key, start, count)
        sizes.update(np.asarray(metrics["num_sampled"])[:count].astype(int).tolist())
    assert len(sizes) > 1 and state.step == 12
    assert fused._cache_size() == 1
    # one round stepped on its own is the same program with count 1
    stepped, metrics = dp_fedavg.step(state, api.step_key(key, 12))
    assert stepped.step == 13 and np.ndim(metrics["num_sampled"]) == 0
    assert fused._cache_size() == 1


def test_calls_end_on_boundaries(setup):
    fed, model = setup
    calls = []

    class Recording:
        def __getattr__(self, name):
            return getattr(dp_fedavg, name)

        def multi_step(self, state, key, start, count):
            calls.append((start, count))
            return dp_fedavg.multi_step(state, key, start, count)

    config = _dp_fedavg_config(rounds=11)
    evals = []
    api.run(Recording(), jax.random.key(0), fed, model, config,
            runtime=api.Runtime(rounds_per_call=4), eval_every=5, boundaries=(3,),
            evaluate=lambda out: evals.append(1) or {})
    assert calls == [(0, 3), (3, 2), (5, 1), (6, 3), (9, 1), (10, 1)]
    assert len(evals) == 3                                  # rounds 5, 10 and the last


def test_call_sizer():
    fixed = calls.CallSizer(3, capacity=8)
    assert fixed.next() == 3
    capped = calls.CallSizer(20, capacity=8)
    assert capped.next() == 8
    auto = calls.CallSizer("auto", capacity=64)
    assert auto.next() == 1
    auto.observe(1, 5.0)                  # the first call compiles: not a measurement
    assert auto.next() == 2
    auto.observe(2, 0.002)                # 1 ms a round: grows by at most 4x a call
    assert auto.next() == 8
    auto.observe(8, 0.008)
    assert auto.next() == 32
    auto.observe(32, 0.032)
    assert auto.next() == 64              # the capacity
    auto.observe(64, 64.0)                # 1 s a round
    assert auto.next() == 1
    with pytest.raises(ValueError, match="rounds_per_call"):
        api.Runtime(rounds_per_call=0)
    with pytest.raises(ValueError, match="rounds_per_call"):
        calls.resolve_capacity(2.5)


def test_fused_secure_aggregation_equals_one_round_per_call(setup):
    config = _dp_fedavg_config(rounds=4, aggregation="secagg", secagg_dropout=0.2)
    one = _run(dp_fedavg, setup, config, 1)
    many = _run(dp_fedavg, setup, config, 4)
    _close(one.state.values, many.state.values, tol=1e-4)


def test_fixed_cohorts_fused(setup):
    config = _dp_fedavg_config(rounds=3, sampling="fixed", cohort_size=5)
    res = _run(dp_fedavg, setup, config, "auto")         # the first call runs 1 round, then 2
    assert [h["num_sampled"] for h in res.history] == [5.0, 5.0, 5.0]
