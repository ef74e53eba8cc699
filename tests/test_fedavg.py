"""FedAvg / DP-FedAvg rounds against a per-agent reference loop, clipping, noise and sampling."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from typing import NamedTuple

import chains
from fedjax_dp.algorithms import api
from fedjax_dp.algorithms.averaging import dp_fedavg, fedavg
from fedjax_dp.core import cohort, from_ragged
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


def _poisson(q):
    return cohort.Sampling("poisson", rate=q)


class Spec(NamedTuple):
    """The round's settings (the reference loop reads them; :func:`chains.chain` builds the
    chain of stages from them)."""
    sampling: cohort.Sampling
    server_lr: float
    clip_norm: float | None = None
    noise_multiplier: float = 0.0
    denominator: str = "sampled"


def _runner(model, spec, data, local=LOCAL, **kwargs):
    chain = spec if not isinstance(spec, Spec) else chains.chain(model, local, **spec._asdict())
    return chains.ParamsRunner(chain, data, **kwargs)


@functools.lru_cache(maxsize=None)
def _jitted_update(model, local):
    """One agent's local update, jitted once per (model, local) (the reference loops share it)."""
    return jax.jit(make_local_update(model, local))


def _reference_round(key, params, data, model, spec):
    """The round written the slow way: a Python loop over the sampled agents (test oracle)."""
    n = data.num_agents
    k_sample, k_train, k_noise = jax.random.split(key, 3)
    sampled = cohort.sample_cohort(k_sample, n, spec.sampling)
    update = _jitted_update(model, LOCAL)
    total = jax.tree.map(jnp.zeros_like, params)
    for i in sampled:
        local, _ = update(jax.random.fold_in(k_train, int(i)), params, data.x[i], data.y[i],
                          data.mask[i], data.counts[i])
        delta = jax.tree.map(lambda a, b: a - b, local, params)
        if spec.clip_norm is not None:
            norm = float(optax.tree.norm(delta))
            delta = jax.tree.map(lambda d: d * min(1.0, spec.clip_norm / norm), delta)
        total = jax.tree.map(jnp.add, total, delta)
    denom = spec.sampling.expected(n) if spec.denominator == "expected" else max(len(sampled), 1)
    return jax.tree.map(lambda p, t: p + spec.server_lr * t / denom, params, total), sampled


def _close(a, b, tol=1e-5):
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=tol, atol=tol), a, b)


_FULL = Spec(sampling=_poisson(1.0), server_lr=1.0)
_CLIPPED = Spec(sampling=_poisson(0.5), server_lr=0.7, clip_norm=0.05,
                            denominator="expected")


# The masked round with a clip, Poisson sampling and the expected denominator is not run here:
# test_gathered_round_equals_masked_round_for_every_key asserts masked == gathered for exactly
# that kind of round (plus noise), and the gathered one equals the loop below.
@pytest.mark.parametrize("spec,mode", [(_FULL, "gather"), (_FULL, "masked"),
                                       (_CLIPPED, "gather")],
                         ids=["full-gather", "full-masked", "clipped-gather"])
def test_round_equals_per_agent_loop(setup, spec, mode):
    data, model, params = setup
    key = jax.random.key(11)
    got, metrics = _runner(model, spec, data, cohort=mode)(key, params)
    want, sampled = _reference_round(key, params, data, model, spec)
    assert metrics["num_sampled"] == len(sampled)
    _close(got, want)


NOISY = Spec(sampling=_poisson(0.5), server_lr=1.0, clip_norm=0.1, noise_multiplier=0.1,
                         denominator="expected")


def test_gathered_round_equals_masked_round_for_every_key(setup):
    """Same key, same participants, same agent keys: the cohort buffer changes nothing; a pass
    size of 2 forces several passes (a draw larger than its bucket is split, never truncated)."""
    data, model, params = setup
    masked = _runner(model, NOISY, data, cohort="masked")
    split = _runner(model, NOISY, data, pass_size=2)
    host = _runner(model, NOISY, data.on_host())
    for t in (0, 3):
        key = jax.random.key(100 + t)
        want = masked(key, params)
        for runner in (split, host):
            _close(runner(key, params), want)
            np.testing.assert_array_equal(runner.last_indices, masked.last_indices)
    assert max(split.compiled_pass_sizes) == 2 and len(split.compiled_pass_sizes) <= 2
    assert set(host.compiled_pass_sizes) <= set(host.plan.buckets)


def test_prefetched_cohort_equals_fresh_one(setup):
    data, model, params = setup
    runner = _runner(model, NOISY, data.on_host())
    key = jax.random.key(7)
    want = runner(key, params)
    runner.prefetch(key)
    assert runner.feeder.pending_rounds == 1
    _close(runner(key, params), want)
    assert runner.feeder.pending_rounds == 0


def test_chunked_round_equals_plain(setup):
    data, model, params = setup
    key = jax.random.key(3)
    a = _runner(model, NOISY, data, cohort="masked")(key, params)
    b = _runner(model, NOISY, data, chunk_size=4)(key, params)
    _close(a, b)


def test_fixed_size_round_equals_loop(setup):
    data, model, params = setup
    spec = Spec(sampling=cohort.Sampling("fixed", size=4), server_lr=1.0,
                            clip_norm=0.05, denominator="expected")
    key = jax.random.key(4)
    runner = _runner(model, spec, data.on_host())
    got, metrics = runner(key, params)
    want, sampled = _reference_round(key, params, data, model, spec)
    assert len(sampled) == 4 and metrics["num_sampled"] == 4
    assert runner.compiled_pass_sizes == (4,)
    _close(got, want)


def test_dp_noise_std_and_independence(setup):
    """With zero local steps every update is 0: the step is pure noise / (qN), std sigma*S/(qN)."""
    data, _, _ = setup
    model = make_model("mlp", (5,), 3, hidden=(64,))          # 579 parameters
    params = model.init(jax.random.key(1))
    sigma, clip, q = 2.0, 0.5, 0.5
    cfg = dp_fedavg.Config(rounds=1, sampling_rate=q, clip_norm=clip, noise_multiplier=sigma,
                           local=LocalTrainConfig(steps=0))
    round_fn = _runner(model, dp_fedavg.chain(cfg, model), data, local=cfg.local)
    steps = []
    for t in range(20):
        new, _ = round_fn(jax.random.fold_in(jax.random.key(5), t), params)
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
    spec = Spec(sampling=_poisson(1.0), server_lr=1.0, clip_norm=clip,
                            denominator="expected")
    new, metrics = _runner(model, spec, data, local=LocalTrainConfig(steps=5, learning_rate=1.0))(
        jax.random.key(0), params)
    step = optax.tree.norm(jax.tree.map(lambda a, b: a - b, new, params))
    assert float(step) <= clip + 1e-7                         # average of vectors of norm <= S
    assert float(metrics["mean_update_norm"]) > 10 * clip     # unclipped updates were larger


def _masks(keys, n, sampling):
    """``cohort.sample_mask(k, n, sampling)`` for every key ``k`` ``[R, N]``: the same coins
    (:func:`cohort.cohort_coins`) drawn in one vmapped call, checked equal to ``sample_mask``
    on a few keys."""
    draw = jax.jit(jax.vmap(cohort.cohort_coins, in_axes=(0, None, None)),
                   static_argnums=(1, 2))
    masks = np.asarray(draw(keys, n, sampling)).astype(np.float32)
    for i in (0, 1, len(keys) - 1):
        np.testing.assert_array_equal(masks[i], cohort.sample_mask(keys[i], n, sampling))
    return masks


def test_poisson_sampling_has_the_law_of_independent_coins():
    """Binomial(N, q) then a uniform subset == N independent Bernoulli(q) coins: per-agent
    inclusion rate q, pair inclusion q^2, count mean qN and variance qN(1-q); fresh each round."""
    n, q, rounds = 40, 0.3, 4000
    keys = jax.random.split(jax.random.key(0), rounds)
    masks = _masks(keys, n, _poisson(q))                                      # [R, N]
    se = np.sqrt(q * (1 - q) / rounds)
    assert np.all(np.abs(masks.mean(0) - q) < 5 * se)
    pair = (masks[:, :, None] * masks[:, None, :]).mean(0)[~np.eye(n, dtype=bool)]
    assert abs(pair.mean() - q * q) < 0.005 and np.all(np.abs(pair - q * q) < 0.05)
    counts = masks.sum(1)
    assert counts.mean() == pytest.approx(q * n, rel=0.02)
    assert counts.var() == pytest.approx(q * (1 - q) * n, rel=0.1)
    assert len({m.tobytes() for m in masks[:200]}) == 200


def test_fixed_size_sampling_is_uniform():
    n, c, rounds = 12, 5, 3000
    keys = jax.random.split(jax.random.key(1), rounds)
    masks = _masks(keys, n, cohort.Sampling("fixed", size=c))
    assert np.all(masks.sum(1) == c)
    se = np.sqrt((c / n) * (1 - c / n) / rounds)
    assert np.all(np.abs(masks.mean(0) - c / n) < 5 * se)


@pytest.mark.parametrize("rate,n,align", [(0.01, 1000, 1), (0.3, 50, 8), (1.0, 20, 1)])
def test_cohort_plan_covers_every_draw(rate, n, align):
    plan = cohort.CohortPlan.for_sampling(_poisson(rate), n, align=align)
    assert len(plan.buckets) <= 3 and all(b % align == 0 for b in plan.buckets)
    for m in range(0, n + 1):
        passes = plan.passes(m)
        rows = sum(b for _, b in passes)
        assert rows >= m and passes[0][0] == 0
        starts = [s for s, _ in passes]
        assert starts == sorted(starts) and all(b in plan.buckets for _, b in passes)
        assert sum(min(b, max(0, m - s)) for s, b in passes) == m     # every agent, once


def test_common_passes_of_one_cohort_are_the_plans_passes():
    """S = 1 of cohort.common_passes (the host round's layout) is the plan's own passes,
    padded by pad_ids: a single run's round is laid out exactly as before."""
    plan = cohort.CohortPlan.for_sampling(_poisson(0.3), 50, align=2, pass_size=6)
    r = np.random.default_rng(3)
    for m in (0, 1, 3, 6, 7, 13, 20):
        ix = np.sort(r.choice(50, size=m, replace=False))
        got = cohort.common_passes(plan, [ix])
        want = [cohort.pad_ids(ix, start, b) for start, b in plan.passes(m)]
        assert len(got) == len(want)
        for (ids, valid), (w_ids, w_valid) in zip(got, want):
            np.testing.assert_array_equal(ids, w_ids[None])
            np.testing.assert_array_equal(valid, w_valid[None])
    # S cohorts: P the most passes, B_j the bucket holding every seed's rows of pass j
    got = cohort.common_passes(plan, [np.arange(2), np.arange(9)])
    assert [ids.shape for ids, _ in got] == [(2, 6), (2, 4)]
    assert got[1][1][0].sum() == 0 and got[1][1][1].sum() == 3


def test_runs_learn_and_report_history(setup):
    data, model, params = setup
    x = np.concatenate([data.local(i)[0] for i in range(data.num_agents)])
    y = np.concatenate([data.local(i)[1] for i in range(data.num_agents)])
    seen = []
    from fedjax_dp.train import accuracy
    cfg = fedavg.Config(rounds=8, local=LocalTrainConfig(steps=5, batch_size=4,
                                                         learning_rate=0.2))
    fed = api.FederatedData(agents=data, num_classes=model.num_classes)
    state = fedavg.init(jax.random.key(0), fed, model, cfg)
    state = api.State(step=0, values={**state.values, "params": params}, context=state.context)
    h = api.run(fedavg, jax.random.key(0), fed, model, cfg, state=state,
                evaluate=lambda out: {"acc": accuracy(model, out.params, x, y)},
                eval_every=4, on_step=lambda t, r: seen.append(t)).history
    assert seen == list(range(1, 9)) and len(h) == 8
    assert "acc" in h[3] and "acc" not in h[2]
    assert h[-1]["acc"] > accuracy(model, params, x, y)
    assert h[-1]["train_loss"] < h[0]["train_loss"]


def test_dp_fedavg_ledger_equals_dp_accounting():
    import dp_accounting
    cfg = dp_fedavg.Config(rounds=30, sampling_rate=0.1, noise_multiplier=1.1, clip_norm=0.7)
    ledger = dp_fedavg.ledger(cfg)
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
    (dict(sampling="uniform"), "algorithm.sampling"),
    (dict(sampling="fixed", cohort_size=0), "algorithm.cohort_size"),
])
def test_dp_fedavg_config_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        dp_fedavg.Config(**kwargs)


def test_cohort_size_above_the_population_is_refused(setup):
    data, model, _ = setup
    from fedjax_dp.algorithms import api
    cfg = dp_fedavg.Config(rounds=1, sampling="fixed", cohort_size=data.num_agents + 1)
    with pytest.raises(ValueError, match=r"algorithm.cohort_size must be in \[1, 6\]"):
        dp_fedavg.init(jax.random.key(0), api.FederatedData(agents=data, num_classes=3), model,
                       cfg)


def test_fixed_size_ledger_equals_dp_accounting_replace_one(setup):
    """C of N without replacement: replace-one relation, sensitivity 2S, Gaussian(sigma / 2)."""
    import dp_accounting
    from fedjax_dp.algorithms import api
    data, model, _ = setup
    cfg = dp_fedavg.Config(rounds=10, sampling="fixed", cohort_size=3, noise_multiplier=1.5)
    state = dp_fedavg.init(jax.random.key(0), api.FederatedData(agents=data, num_classes=3),
                           model, cfg)
    ledger = dp_fedavg.ledger(cfg, state)
    acc = dp_accounting.rdp.RdpAccountant(
        list(accounting.DEFAULT_RDP_ORDERS),
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    acc.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.SampledWithoutReplacementDpEvent(
        6, 3, dp_accounting.GaussianDpEvent(0.75)), 10))
    rows = ledger.report(1e-5)                       # PLD does not apply: RDP only, no error
    assert [r["accountant"] for r in rows] == ["rdp"]
    assert rows[0]["epsilon"] == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9)
    assert "replace one" in rows[0]["relation"]
