"""Distributed DP under secure aggregation (DDG and Skellam): the samplers against their exact
pmfs, the rotation against scipy's Hadamard matrix, conditional rounding's norm bound, the
clients' messages and the modular secure sum against plain loops, the server's unwrapping, and
the run (abort below n_min survivors, chunked = one pass, the ledger's curve, refusals)."""
import dataclasses
import math

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
import scipy.stats

from fedjax_dp.algorithms import api, round_parts
from fedjax_dp.algorithms.averaging import dp_fedavg
from fedjax_dp.core import from_ragged, rng
from fedjax_dp.models import make_model
from fedjax_dp.privacy import (discrete_noise, distributed_accounting, distributed_dp,
                               rotation)
from fedjax_dp.stages import Setup, StageConflict
from fedjax_dp.train import LocalTrainConfig

LOCAL = LocalTrainConfig(steps=2, batch_size=4, learning_rate=0.2)


# --------------------------------------------------------------------------- samplers

def _frequencies(draws: np.ndarray, support: np.ndarray) -> np.ndarray:
    return np.array([np.mean(draws == k) for k in support])


@pytest.mark.parametrize("sigma", [0.8, 3.5])
def test_discrete_gaussian_matches_its_pmf(sigma):
    n = 200_000
    draws = np.asarray(discrete_noise.discrete_gaussian(jax.random.key(1), sigma, (n,)))
    ks = np.arange(-int(12 * sigma) - 2, int(12 * sigma) + 3)
    pmf = np.exp(-ks.astype(float) ** 2 / (2 * sigma ** 2))
    pmf /= pmf.sum()
    freq = _frequencies(draws, ks)
    # every atom within 5 standard errors of its probability
    se = np.sqrt(pmf * (1 - pmf) / n)
    assert np.all(np.abs(freq - pmf) <= 5 * se + 1e-6)
    assert abs(draws.var() - np.sum(pmf * ks ** 2)) < 0.03 * sigma ** 2


@pytest.mark.parametrize("variance", [0.6, 9.0])
def test_skellam_matches_its_pmf(variance):
    n = 200_000
    draws = np.asarray(discrete_noise.skellam(jax.random.key(2), variance, (n,)))
    ks = np.arange(-25, 26)
    pmf = scipy.stats.skellam.pmf(ks, variance / 2, variance / 2)
    se = np.sqrt(pmf * (1 - pmf) / n)
    assert np.all(np.abs(_frequencies(draws, ks) - pmf) <= 5 * se + 1e-6)


def test_conditional_rounding_keeps_the_bound_and_is_unbiased_when_loose():
    x = jnp.asarray([0.3, -1.7, 2.5, 0.0, -0.2], jnp.float32)
    keys = jax.random.split(jax.random.key(3), 4000)
    bound = float(jnp.linalg.norm(x)) + 0.4               # tight: many first tries rejected
    tight = np.asarray(jax.vmap(lambda k: discrete_noise.conditional_round(k, x, bound))(keys))
    assert np.all(np.linalg.norm(tight, axis=1) <= bound + 1e-6)
    assert np.all((tight == np.floor(x)) | (tight == np.ceil(x)))
    loose = np.asarray(jax.vmap(lambda k: discrete_noise.conditional_round(k, x, 100.0))(keys))
    np.testing.assert_allclose(loose.mean(0), np.asarray(x), atol=0.03)


def test_norm_check_is_exact_integer_arithmetic():
    """The rounding's norm test equals Python's exact integer sum of squares, also where a
    float32 sum could not tell the bound from one more unit (||r||^2 ~ 2^40)."""
    r = np.random.default_rng(0).integers(-2 ** 20, 2 ** 20, size=(3, 4096)).astype(np.int32)
    exact = [sum(int(v) * int(v) for v in row) for row in r]
    check = jax.jit(discrete_noise.squared_norm_at_most, static_argnums=1)
    for row, sq in zip(r, exact):
        assert bool(check(jnp.asarray(row), sq)) and not bool(check(jnp.asarray(row), sq - 1))


# --------------------------------------------------------------------------- rotation

def test_rotation_is_the_signed_hadamard_and_orthogonal():
    d = 11
    x = jax.random.normal(jax.random.key(4), (3, d))
    sign = rotation.signs(jax.random.key(5), d)
    assert sign.shape == (16,) and rotation.padded_dim(16) == 16 and rotation.padded_dim(1) == 1
    h = scipy.linalg.hadamard(16) / 4.0
    want = (np.pad(np.asarray(x), ((0, 0), (0, 5))) * np.asarray(sign)) @ h.T
    u = rotation.rotate(x, sign)
    np.testing.assert_allclose(u, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(jnp.linalg.norm(u, axis=1), jnp.linalg.norm(x, axis=1), rtol=1e-5)
    np.testing.assert_allclose(rotation.unrotate(u, sign, d), x, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- messages and sums

def _plan(kind="skellam", bits=16, z=1.0, clip=1.0, dim=6, cohort=4, **kw):
    spec = distributed_dp.DistributedNoise(kind=kind, bits=bits, **kw)
    return spec, distributed_dp.plan(spec, noise_multiplier=z, clip=clip, dim=dim, cohort=cohort)


@pytest.mark.parametrize("kind", ["ddg", "skellam"])
def test_messages_and_modular_sum_equal_a_loop(kind):
    """The vmapped messages equal a loop over clients; the masked modular sum of the survivors
    equals the plain sum of their messages mod 2^b; the server's reading is the signed sum."""
    spec, p = _plan(kind, bits=12)
    b, d = 5, 6
    x = jax.random.normal(jax.random.key(6), (b, d)) * 0.3
    ids = jnp.asarray([7, 2, 9, 4, 0], jnp.int32)
    sign = rotation.signs(jax.random.key(8), d)
    keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(9), i))(ids)
    one = lambda k, v: distributed_dp.client_message(k, v, sign, p, kind, 4)  # noqa: E731
    msgs = jax.vmap(one)(keys, x)
    one = jax.jit(one)                        # one client's message, compiled once for the loop
    loop = np.stack([np.asarray(one(keys[i], x[i])) for i in range(b)])
    np.testing.assert_array_equal(np.asarray(msgs), loop)
    assert msgs.dtype == jnp.uint32 and np.all(loop < 2 ** 12) and msgs.shape == (b, 8)
    alive = jnp.asarray([True, False, True, True, False])
    total = distributed_dp.modular_sum(jax.random.key(10), msgs, ids, alive, 12, None)
    want = loop[np.asarray(alive)].astype(np.int64).sum(0) % 2 ** 12
    np.testing.assert_array_equal(np.asarray(total), want)
    signed = np.where(want >= 2 ** 11, want - 2 ** 12, want)
    np.testing.assert_array_equal(np.asarray(distributed_dp.unwrap(total, 12)), signed)
    # the server's estimate is unbiased around the plain sum: rounding and noise are small here
    est = distributed_dp.server_sum(total, sign, p, d)
    plain = np.asarray(x)[np.asarray(alive)].sum(0)
    assert np.max(np.abs(np.asarray(est) - plain)) < 8 * p.scale * math.sqrt(p.total_variance + 3)


def test_unwrap_reads_the_signed_range():
    for bits in (2, 8, 16, 31):
        vals = np.array([0, 1, 2 ** (bits - 1) - 1, 2 ** (bits - 1), 2 ** bits - 1], np.int64)
        got = np.asarray(distributed_dp.unwrap(jnp.asarray(vals, jnp.uint32), bits))
        np.testing.assert_array_equal(got, np.where(vals >= 2 ** (bits - 1), vals - 2 ** bits,
                                                    vals))


def test_parse_refuses_bad_tables():
    parse = distributed_dp.parse
    assert parse("x", "none") is None
    assert parse("x", {"kind": "ddg"}).bits == 16
    for bad, key in (({"kind": "gauss"}, "x.kind"), ({"kind": "ddg", "bits": 40}, "x.bits"),
                     ({"kind": "skellam", "beta": 1.0}, "x.beta"),
                     ({"kind": "ddg", "k_stddevs": 0}, "x.k_stddevs"),
                     ({"kind": "ddg", "bit": 3}, "x.bit"), (3, "x must be")):
        with pytest.raises(ValueError, match=key):
            parse("x", bad)


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
    base = dict(rounds=3, sampling="fixed", cohort_size=4, clip_norm=0.5, noise_multiplier=1.0,
                local=LOCAL, aggregation="secagg", distributed_noise={"kind": "skellam",
                                                                      "bits": 16})
    base.update(kw)
    return dp_fedavg.Config(**{"diagnostics": True, **base})


@pytest.mark.parametrize("kind", ["ddg", "skellam"])
def test_round_decodes_the_modular_sum_of_the_messages(setup, kind):
    """One round's server step equals gamma U^T of the modular sum of the cohort's messages
    (each built from the agent's clipped update by the test), divided by C."""
    fed, model = setup
    cfg = _config(distributed_noise={"kind": kind, "bits": 14}, server_lr=1.0)
    chain = dp_fedavg.chain(cfg, model)
    train_sum, server, fused = round_parts.make_round_parts(chain,
                                                            Setup(fed.num_agents, cfg.rounds))
    params = model.init(jax.random.key(0))
    view = {"params": params, "stages": chain.init_state(jax.random.key(0), params,
                                                         fed.num_agents)}
    k_train, k_noise = jax.random.key(11), jax.random.key(12)
    ids = jnp.asarray([1, 3, 4, 8], jnp.int32)
    valid = jnp.ones((4,), bool)
    rows = jnp.asarray(ids)
    total, _, m = train_sum(k_train, view, fed.agents, rows, ids, valid, {})
    assert total.dtype == jnp.uint32 and float(m) == 4.0      # the server's view: Z_2^b sum
    assert total.shape == (64,) and int(jnp.max(total)) < 2 ** 14
    new, metrics = server(k_noise, view, (total, {}, m), k_train)
    flat0, unravel = jax.flatten_util.ravel_pytree(params)
    d = flat0.size
    p = distributed_dp.plan(cfg.distributed_noise, noise_multiplier=1.0, clip=0.5, dim=d,
                            cohort=4)
    sign = rotation.signs(rng.stream(k_train, "rotation"), d)
    want = distributed_dp.server_sum(total, sign, p, d) / 4.0
    got = jax.flatten_util.ravel_pytree(new["params"])[0] - flat0
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert float(metrics["released"]) == 1.0


@pytest.fixture(scope="module")
def runs(setup):
    """Skellam runs with dropouts (n_min = 3 of C = 4): one pass per round, and chunks of 1."""
    fed, model = setup
    cfg = _config(rounds=6, secagg_dropout=0.3,
                  distributed_noise={"kind": "skellam", "bits": 16, "min_survivors": 3})
    return cfg, [api.run(dp_fedavg, jax.random.key(5), fed, model, cfg,
                         runtime=api.Runtime(chunk_size=c)) for c in (None, 1)]


def test_round_aborts_below_min_survivors(runs):
    _, (run, _) = runs
    released = [h["released"] for h in run.history]
    sampled = [h["num_sampled"] for h in run.history]
    assert released == [float(s >= 3) for s in sampled] and 0 < sum(released) < 6


def test_chunked_rounds_equal_one_pass(runs):
    _, (one, chunked) = runs
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                 one.state.values, chunked.state.values)


def test_ledger_records_the_distributed_curve(runs):
    cfg, (run, _) = runs
    ledger = dp_fedavg.ledger(cfg, run.state)
    [row] = ledger.report(1e-5, accountants=("rdp",))
    assert row["relation"] == dp_fedavg.RELATION_FIXED and not row["data_dependent"]
    d = sum(int(np.prod(l.shape)) for l in jax.tree.leaves(run.state.values["params"]))
    p = distributed_dp.plan(cfg.distributed_noise, noise_multiplier=1.0, clip=0.5, dim=d,
                            cohort=4)
    orders = distributed_accounting.ORDERS
    one = distributed_accounting.round_rdp(
        "skellam", orders, scaled_clip=0.5 / p.scale, dim=p.padded_dim, beta=math.exp(-0.5),
        total_variance=p.total_variance, cohort=4, min_survivors=3)
    sub = distributed_accounting.wor_subsampled_rdp(orders, np.asarray(one), population=10,
                                                    cohort=4)
    want = distributed_accounting.epsilon(orders, 6 * np.asarray(sub), 1e-5)
    assert row["epsilon"] == pytest.approx(want, rel=1e-9)
    # more noise: a smaller epsilon; the report round-trips through JSON
    louder = dp_fedavg.ledger(dataclasses.replace(cfg, noise_multiplier=2.0), run.state)
    assert louder.epsilon("agent", 1e-5) < row["epsilon"]
    assert type(ledger).from_json(ledger.to_json()).epsilon("agent", 1e-5) == row["epsilon"]


def test_refusals_name_the_parameter(setup):
    fed, model = setup
    with pytest.raises(StageConflict, match='^noise "skellam" with aggregation "plain": '
                       'distributed noise shares only add up inside the secure sum'):
        _config(aggregation="plain")
    with pytest.raises(StageConflict, match='^noise "skellam" with participation "poisson": '
                       '.*\\(participation "fixed"\\)'):
        _config(sampling="poisson", sampling_rate=0.5)
    with pytest.raises(ValueError, match="min_survivors must be in \\[1, 4\\]"):
        _config(distributed_noise={"kind": "ddg", "min_survivors": 5})
    with pytest.raises(ValueError, match="noise_multiplier > 0"):
        _config(noise_multiplier=0.0)
    with pytest.raises(ValueError, match="algorithm.distributed_noise.bits"):
        _config(distributed_noise={"kind": "ddg", "bits": 1})
    with pytest.raises(ValueError, match="algorithm.distributed_noise: .*bits"):
        api.run(dp_fedavg, jax.random.key(0), fed, model,
                _config(distributed_noise={"kind": "ddg", "bits": 3}))
    with pytest.raises(ValueError, match="no DpEvent"):
        dp_fedavg.dp_event(_config(), 10)
