"""Noise correlated across rounds (banded MF and BLT, strategies from jax-privacy) in DP-FedAvg:
the streamed noise against C^-1 Z solved densely and its covariance against the strategy, the
sensitivity by brute force over every b-min-sep participation pattern, the events against
dp-accounting, and the run's rounds (groups, fused calls, seeds, refusals)."""
import itertools
import math

import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import chains
from fedjax_dp.algorithms import api, round_parts, seeds
from fedjax_dp.algorithms.averaging import dp_fedavg
from fedjax_dp.core import from_ragged
from fedjax_dp.models import make_model
from fedjax_dp.privacy import DEFAULT_RDP_ORDERS, correlated_noise, tree_noise
from fedjax_dp.stages import Setup, updates
from fedjax_dp.train import LocalTrainConfig

LOCAL = LocalTrainConfig(steps=2, batch_size=4, learning_rate=0.2)
T = 6
#: a given BLT (no optimisation in the tests): two buffers
BLT = {"kind": "blt", "min_sep": 2, "buf_decay": [0.9, 0.4], "output_scale": [0.2, 0.3]}
BANDED = {"kind": "banded_mf", "bands": 2}


def _spec(table, rounds_=T):
    return correlated_noise.check_rounds("algorithm.noise",
                                         correlated_noise.parse("algorithm.noise", table), rounds_)


def _dense_c(spec):
    """C written out from its Toeplitz coefficients (numpy; the test's own)."""
    c = correlated_noise.strategy_coefs(spec)
    n = spec.rounds
    return np.array([[c[i - j] if i >= j else 0.0 for j in range(n)] for i in range(n)])


@pytest.fixture(scope="module", params=[BANDED, BLT], ids=["banded_mf", "blt"])
def spec(request):
    return _spec(request.param)


def test_blt_coefficients_are_the_given_buffers():
    c = correlated_noise.strategy_coefs(_spec(BLT))
    d, s = np.array(BLT["buf_decay"]), np.array(BLT["output_scale"])
    want = [1.0] + [float(np.sum(s * d ** (k - 1))) for k in range(1, T)]   # t_k = sum s d^(k-1)
    np.testing.assert_allclose(c, want, rtol=1e-6)


def test_streamed_noise_is_c_inverse_z(spec):
    """The round-by-round stream equals C^-1 Z solved densely, for the same draws Z."""
    dim, key = 3, jax.random.key(2)
    state = correlated_noise.init_state(spec, dim)
    step = jax.jit(lambda k, st: correlated_noise.next_noise(spec, k, st, dim))  # one round
    got, zs = [], []
    for t in range(T):
        k = jax.random.fold_in(key, t)
        y, state = step(k, state)
        got.append(np.asarray(y))
        zs.append(np.asarray(jax.random.normal(k, (dim,), jnp.float32)))
    want = np.linalg.solve(_dense_c(spec), np.stack(zs))
    np.testing.assert_allclose(np.stack(got), want, rtol=1e-4, atol=1e-5)


def test_noise_covariance_is_the_strategys(spec):
    """Over 20,000 streams the noise's covariance across rounds is C^-1 C^-T."""
    def stream(key):
        state = correlated_noise.init_state(spec, 1)

        def body(st, t):
            y, st = correlated_noise.next_noise(spec, jax.random.fold_in(key, t), st, 1)
            return st, y[0]

        return jax.lax.scan(body, state, jnp.arange(T))[1]

    ys = np.asarray(jax.vmap(stream)(jax.random.split(jax.random.key(5), 20000)))   # [S, T]
    c_inv = np.linalg.inv(_dense_c(spec))
    np.testing.assert_allclose(np.cov(ys.T), c_inv @ c_inv.T, atol=0.05)


def _brute_sensitivity(c, b, k):
    """max ||C u||_2 over u in {-1, 0, 1}^n whose support has gaps >= b and at most k entries."""
    n, best = c.shape[0], 0.0
    for u in itertools.product((-1, 0, 1), repeat=n):
        idx = [i for i, x in enumerate(u) if x]
        if len(idx) > k or any(j - i < b for i, j in zip(idx, idx[1:])):
            continue
        best = max(best, float(np.linalg.norm(c @ np.array(u, float))))
    return best


def test_sensitivity_by_brute_force(spec):
    want = _brute_sensitivity(_dense_c(spec), spec.cycle, spec.participations)
    assert correlated_noise.sensitivity(spec) == pytest.approx(want, rel=1e-5)
    if spec.kind == "banded_mf":           # unit columns with disjoint support: sqrt(k)
        assert want == pytest.approx(math.sqrt(spec.participations), rel=1e-5)


@pytest.mark.parametrize("q", [1.0, 0.3])
def test_events_against_dp_accounting(spec, q):
    """banded_mf: each agent's k = ceil(T / b) rounds, Poisson within its group, are the
    amplified event, built here with dp-accounting; blt: one Gaussian on C x, sensitivity s."""
    z = 1.3
    cfg = dp_fedavg.Config(rounds=T, sampling_rate=q, noise_multiplier=z, local=LOCAL,
                           noise={k: v for k, v in (BANDED if spec.kind == "banded_mf"
                                                    else BLT).items()})
    got = dp_fedavg.ledger(cfg).epsilon("agent", 1e-5, accountant="rdp")
    if spec.kind == "banded_mf":
        event = dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)),
            math.ceil(T / spec.cycle))
    else:
        s = _brute_sensitivity(_dense_c(spec), spec.cycle, spec.participations)
        event = dp_accounting.GaussianDpEvent(z / s)
    want = dp_accounting.rdp.RdpAccountant(list(DEFAULT_RDP_ORDERS)).compose(event).get_epsilon(1e-5)
    assert got == pytest.approx(want, rel=1e-6)


# --------------------------------------------------------------------------- the rounds

def _zero_update(key, params, x, y, mask, count, extras):
    return params, {}


def test_server_adds_the_streamed_noise(spec):
    """The server's noise over T rounds of zero updates is z S (C^-1 Z) / m, Z from the rounds'
    noise keys."""
    n, z, s_clip = 10, 0.7, 0.5
    table = BANDED if spec.kind == "banded_mf" else BLT
    cfg = dp_fedavg.Config(rounds=T, sampling_rate=1.0, clip_norm=s_clip, noise_multiplier=z,
                           local=LOCAL, noise=table)
    chain = chains.replace(dp_fedavg.chain(cfg), client_update=updates.LocalSteps(_zero_update))
    assert chain.noise.strategy == spec
    _, server, _ = round_parts.make_round_parts(chain, Setup(n, T))
    params = {"w": jnp.zeros((2,)), "b": jnp.zeros((1,))}
    states = list(chain.init_state(jax.random.key(0), params, n))
    states[4] = correlated_noise.init_state(spec, 3)
    view = {"params": params, "stages": tuple(states)}
    sums = (params, {}, jnp.float32(0.0))
    steps, zs = [], []
    for t in range(T):
        k = jax.random.key(100 + t)
        new, _ = server(k, view, sums)
        flat = jnp.concatenate([new["params"]["b"] - view["params"]["b"],
                                new["params"]["w"] - view["params"]["w"]])
        steps.append(np.asarray(flat))
        zs.append(np.asarray(jax.random.normal(k, (3,), jnp.float32)))
        view = new
    m = n / spec.cycle
    want = z * s_clip * np.linalg.solve(_dense_c(spec), np.stack(zs)) / m
    np.testing.assert_allclose(np.stack(steps), want, rtol=1e-4, atol=1e-6)


# --------------------------------------------------------------------------- tree aggregation

def _greedy_nodes(c: int) -> list[tuple[int, int]]:
    """The test's own dyadic decomposition of the first c leaves: the largest aligned blocks
    from the left, block [start, start + 2^l) being node (l, start / 2^l)."""
    nodes, start = [], 0
    for l in reversed(range(c.bit_length())):
        if (c >> l) & 1:
            nodes.append((l, start >> l))
            start += 1 << l
    return nodes


def test_tree_sensitivity_by_brute_force_and_event():
    """Every prefix uses the greedy dyadic blocks; the most nodes holding one leaf (the squared
    sensitivity of one participation per tree) is dp-accounting's depth ceil(log2(b + 1)), so the
    run's event is the Gaussian of z / sqrt(depth) per tree."""
    for c in range(1, 65):
        assert sorted(tree_noise.decomposition(c)) == sorted(_greedy_nodes(c))
    for b in range(1, 21):
        used = {n for c in range(1, b + 1) for n in _greedy_nodes(c)}
        per_leaf = [sum(1 for (l, i) in used if i << l <= j < (i + 1) << l) for j in range(b)]
        assert max(per_leaf) == math.ceil(math.log2(b + 1)) == tree_noise.levels(b)
        np.testing.assert_array_equal(tree_noise.used_nodes_per_leaf(b), per_leaf)
    z, b, rounds_ = 1.3, 5, 12
    spec = _spec({"kind": "tree", "min_sep": b}, rounds_)
    acc = dp_accounting.rdp.RdpAccountant(
        DEFAULT_RDP_ORDERS, dp_accounting.NeighboringRelation.REPLACE_SPECIAL)
    acc.compose(correlated_noise.dp_event(spec, z, 0.5))
    want = np.asarray(DEFAULT_RDP_ORDERS) * 3 / (2 * z ** 2) * 3      # depth 3, 3 trees
    np.testing.assert_allclose(acc._rdp, want, rtol=1e-12)
    assert correlated_noise.sensitivity(spec) == pytest.approx(math.sqrt(3))


def test_tree_noise_covariance_is_the_trees():
    """Streamed over two trees of b = 5 rounds, the running sums of the noise are the prefix
    noises: Cov(P(c), P(c')) = shared nodes of c and c' within a tree, 0 across trees."""
    b, d = 5, 40_000
    spec = _spec({"kind": "tree", "min_sep": b}, 2 * b)
    state = correlated_noise.init_state(spec, d)
    step = jax.jit(lambda k, st: correlated_noise.next_noise(spec, k, st, d))
    noise = []
    for t in range(2 * b):
        n, state = step(jax.random.key(500 + t), state)
        noise.append(np.asarray(n))
    noise = np.stack(noise)                                                # [2b, d]
    prefix = np.concatenate([np.cumsum(noise[:b], 0), np.cumsum(noise[b:], 0)])
    shared = np.array([[len(set(_greedy_nodes(c % b + 1)) & set(_greedy_nodes(e % b + 1)))
                        if c // b == e // b else 0 for e in range(2 * b)] for c in range(2 * b)])
    np.testing.assert_allclose(prefix @ prefix.T / d, shared, atol=0.06)
    assert int(state["t"]) == 2 * b


def test_tree_run_through_dp_fedavg(setup):
    """DP-FedAvg with tree noise: groups take turns, fused calls agree, the ledger's event is
    the composed single-epoch tree."""
    fed, model = setup
    cfg = _config(noise={"kind": "tree", "min_sep": 2})
    runs = [api.run(dp_fedavg, jax.random.key(3), fed, model, cfg,
                    runtime=api.Runtime(rounds_per_call=rpc)) for rpc in (1, 4)]
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                 runs[0].state.values, runs[1].state.values)
    event = dp_fedavg.ledger(cfg, runs[0].state).event("agent")
    assert isinstance(event.event, dp_accounting.SingleEpochTreeAggregationDpEvent)
    assert event.count == 3 and event.event.step_counts == 2


@pytest.fixture(scope="module")
def setup():
    r = np.random.default_rng(4)
    sizes = [4, 6, 3, 5, 6, 2, 5, 4, 3, 6]
    ys = [r.integers(0, 3, size=k) for k in sizes]
    xs = [r.normal(size=(len(y), 5)).astype(np.float32) + y[:, None] for y in ys]
    model = make_model("mlp", (5,), 3, hidden=(6,))
    return api.FederatedData(agents=from_ragged(xs, ys), num_classes=3), model


def _config(**kw):
    base = dict(rounds=T, sampling_rate=1.0, clip_norm=0.5, noise_multiplier=0.8, local=LOCAL,
                noise=BANDED)
    base.update(kw)
    return dp_fedavg.Config(**{"diagnostics": True, **base})


def test_groups_take_turns_and_fused_calls_agree(setup):
    fed, model = setup
    cfg = _config()
    runs = [api.run(dp_fedavg, jax.random.key(3), fed, model, cfg,
                    runtime=api.Runtime(rounds_per_call=rpc)) for rpc in (1, 4)]
    groups = np.asarray(runs[0].state.values["stages"][0]["group"])
    sizes = [int(np.sum(groups == t % 2)) for t in range(T)]
    assert [h["num_sampled"] for h in runs[0].history] == sizes     # q = 1: the whole group
    assert 0 < sizes[0] < fed.num_agents and int(runs[0].state.values["stages"][0]["round"]) == T
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                 runs[0].state.values, runs[1].state.values)
    # S seeds vmapped equal the seeds run alone
    keys = [jax.random.key(s) for s in (1, 2)]
    together = seeds.run_seeds(dp_fedavg, keys, [fed] * 2, model, _config(sampling_rate=0.6),
                               runtime=api.Runtime(rounds_per_call=1))
    assert together is not None
    for key, joint in zip(keys, together):
        alone = api.run(dp_fedavg, key, fed, model, _config(sampling_rate=0.6),
                        runtime=api.Runtime(rounds_per_call=1))
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                     joint.state.values, alone.state.values)


def test_refusals_name_the_parameter(setup):
    fed, model = setup
    with pytest.raises(ValueError, match=r"algorithm.noise.bands = 9 must be at most"):
        _config(noise={"kind": "banded_mf", "bands": 9})
    with pytest.raises(ValueError, match="algorithm.noise.kind"):
        _config(noise={"kind": "trees"})
    with pytest.raises(ValueError, match="algorithm.noise.min_sep"):
        _config(noise={"kind": "tree"})
    with pytest.raises(ValueError, match="buf_decay"):
        _config(noise={"kind": "blt", "min_sep": 2, "buf_decay": [1.5], "output_scale": [1.0]})
    with pytest.raises(ValueError, match="fused device path"):
        api.run(dp_fedavg, jax.random.key(0),
                api.FederatedData(agents=fed.agents.on_host(), num_classes=3), model, _config())


def test_correlated_noise_with_fixed_cohorts_and_with_adaptive_clipping_runs(setup):
    """Once refused, both combinations are chains of stages that run: C of the round's group
    (cyclic groups of exactly C within), and the adaptive clip's count with the streamed noise."""
    fed, model = setup
    fixed = _config(sampling="fixed", cohort_size=3)
    adaptive = _config(adaptive_clip={"count_noise": 2.0})
    runs = {}
    for name, cfg in (("fixed", fixed), ("adaptive", adaptive)):
        res = runs[name] = api.run(dp_fedavg, jax.random.key(3), fed, model, cfg,
                                   runtime=api.Runtime(rounds_per_call=4))
        assert all(np.isfinite(np.asarray(v)).all()
                   for v in jax.tree.leaves(res.state.values["params"]))
        assert int(res.state.values["stages"][0]["round"]) == T
        assert math.isfinite(dp_fedavg.ledger(cfg, res.state).epsilon("agent", 1e-5))
    assert [h["num_sampled"] for h in runs["fixed"].history] == [3.0] * T
    assert len(runs["adaptive"].history) == T
    assert all("clip_norm" in h for h in runs["adaptive"].history)
