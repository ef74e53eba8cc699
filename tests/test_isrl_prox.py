"""ISRL family building blocks: prox operators (closed forms, brute force), f1 values, silo
availability (exactly M, each silo with frequency M/N), and a lasso solved to its known sparse
solution by non-private Prox-MB-SGD (the engine with f1 = L1, full batches, no noise)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dp.algorithms.isrl import availability, engine, estimators
from fedjax_dp.algorithms.isrl import prox as prox_lib
from fedjax_dp.core import StackedData


def _tree(rng):
    return {"a": jnp.asarray(rng.normal(size=(3, 2)), jnp.float32),
            "b": jnp.asarray(rng.normal(size=(4,)), jnp.float32)}


def _flat(tree):
    return np.concatenate([np.ravel(np.asarray(l)) for l in jax.tree.leaves(tree)])


def _brute_prox_1d(f, z, step, grid):
    """argmin_y step f(y) + (y - z)^2 / 2 over a fine grid (scalar, separable f1)."""
    vals = step * f(grid) + 0.5 * (grid - z) ** 2
    return grid[np.argmin(vals)]


def test_soft_threshold_matches_closed_form_and_brute_force():
    rng = np.random.default_rng(0)
    z = _tree(rng)
    p = prox_lib.Prox("l1", strength=0.7)
    out = _flat(p(z, 0.5))
    flat = _flat(z)
    expect = np.sign(flat) * np.maximum(np.abs(flat) - 0.35, 0.0)
    np.testing.assert_allclose(out, expect, atol=1e-7)
    grid = np.linspace(-4, 4, 80001)
    brute = [_brute_prox_1d(lambda y: 0.7 * np.abs(y), v, 0.5, grid) for v in flat]
    np.testing.assert_allclose(out, brute, atol=2e-4)
    assert float(p.value(z)) == pytest.approx(0.7 * np.abs(flat).sum(), rel=1e-6)


def test_l2_ball_projection_is_global_and_box_clips():
    rng = np.random.default_rng(1)
    z = jax.tree.map(lambda l: 3 * l, _tree(rng))
    ball = prox_lib.Prox("l2_ball", radius=1.5)
    out = _flat(ball(z, 123.0))                              # step does not matter
    flat = _flat(z)
    np.testing.assert_allclose(out, flat * 1.5 / np.linalg.norm(flat), rtol=1e-6)
    assert np.linalg.norm(out) == pytest.approx(1.5, rel=1e-6)
    assert float(ball.value(ball(z, 1.0))) == 0.0 and float(ball.value(z)) == np.inf
    inside = jax.tree.map(lambda l: l * 0.01, z)
    np.testing.assert_allclose(_flat(ball(inside, 1.0)), _flat(inside))   # identity inside
    box = prox_lib.Prox("box", low=-0.5, high=0.25)
    np.testing.assert_allclose(_flat(box(z, 1.0)), np.clip(flat, -0.5, 0.25))
    assert float(box.value(box(z, 1.0))) == 0.0 and float(box.value(z)) == np.inf
    none = prox_lib.Prox()
    np.testing.assert_array_equal(_flat(none(z, 1.0)), flat)
    assert float(none.value(z)) == 0.0


@pytest.mark.parametrize("kwargs, name", [
    (dict(name="l0"), "algorithm.prox"),
    (dict(name="l1", strength=-1.0), "algorithm.prox_strength"),
    (dict(name="l2_ball", radius=0.0), "algorithm.prox_radius"),
    (dict(name="box", low=1.0, high=0.0), "algorithm.prox_low")])
def test_bad_prox_fails_naming_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name):
        prox_lib.Prox(**kwargs)


def test_availability_exactly_m_and_uniform_frequency():
    n, m, rounds = 7, 3, 4000
    keys = jax.random.split(jax.random.key(0), rounds)
    masks = np.asarray(jax.vmap(lambda k: availability.available_mask(k, n, m))(keys))
    assert masks.shape == (rounds, n) and set(np.unique(masks)) <= {0.0, 1.0}
    assert np.all(masks.sum(axis=1) == m)                              # exactly M every round
    freq = masks.mean(axis=0)
    # binomial std of a frequency: sqrt(p (1 - p) / rounds) ~ 0.0078; allow 4 std
    np.testing.assert_allclose(freq, m / n, atol=4 * np.sqrt(m / n * (1 - m / n) / rounds))
    # every M-subset equally likely: pairs co-occur with frequency M(M-1) / (N(N-1))
    pair = (masks[:, 0] * masks[:, 1]).mean()
    assert pair == pytest.approx(m * (m - 1) / (n * (n - 1)), abs=0.025)
    assert np.all(np.asarray(availability.available_mask(keys[0], n, n)) == 1.0)
    for bad in (0, n + 1):
        with pytest.raises(ValueError, match="algorithm.num_available"):
            availability.check(bad, n)


def _squared(params, x, y):
    return 0.5 * (jnp.dot(params["w"], x) - y) ** 2


def test_lasso_with_l1_prox_reaches_the_known_sparse_solution():
    """Each silo's design has X_i^T X_i / n_i = I, so the minimiser of
    (1/N) sum_i (1/(2 n_i)) ||X_i w - y_i||^2 + lam ||w||_1 is soft_threshold(b, lam) with
    b = (1/N) sum_i X_i^T y_i / n_i; prox-gradient with full batches must reach it exactly."""
    rng = np.random.default_rng(3)
    d, n, lam = 8, 20, 0.3
    w_true = np.array([2.0, -1.5, 0, 0, 0.8, 0, 0, 0.1])
    xs, ys = [], []
    for _ in range(2):
        q, _ = np.linalg.qr(rng.normal(size=(n, d)))
        x = np.sqrt(n) * q                                            # x^T x / n = I
        xs.append(x)
        ys.append(x @ w_true + 0.05 * rng.normal(size=n))
    b = np.mean([x.T @ y / n for x, y in zip(xs, ys)], axis=0)
    expect = np.sign(b) * np.maximum(np.abs(b) - lam, 0)
    assert np.sum(expect == 0) >= 3                                    # a sparse solution
    data = StackedData(x=jnp.asarray(np.stack(xs), jnp.float32),
                       y=jnp.asarray(np.stack(ys), jnp.float32),
                       mask=jnp.ones((2, n), bool), counts=jnp.full((2,), n, jnp.int32))
    spec = engine.RoundSpec(method="mb_sgd", num_silos=2, num_available=2, private=False,
                            prox=prox_lib.Prox("l1", strength=lam))
    round_fn = engine.make_round(_squared, spec)
    sdata = engine.silo_data(data, (n,))                               # rate 1: full batches
    values = engine.initial_values(spec, {"w": jnp.zeros(d)}, engine.hyper(0.5, np.inf, 0.0))
    step = jax.jit(lambda k, v: round_fn(k, v, sdata))
    for t in range(60):
        values, metrics = step(jax.random.key(t), values)
    w = np.asarray(values["params"]["w"])
    np.testing.assert_allclose(w, expect, atol=1e-5)
    np.testing.assert_array_equal(w == 0, expect == 0)                 # exact zeros
    f0 = np.mean([np.mean(0.5 * (x @ w - y) ** 2) for x, y in zip(xs, ys)])
    assert float(metrics["objective"]) == pytest.approx(f0 + lam * np.abs(w).sum(), rel=1e-5)


def test_estimator_updates():
    v = {"a": jnp.ones(3)}
    avg = {"a": jnp.full(3, 2.0)}
    np.testing.assert_array_equal(estimators.spider_update(v, avg, True)["a"], 2.0)
    np.testing.assert_array_equal(estimators.spider_update(v, avg, False)["a"], 3.0)
    g, out = estimators.svrg_update(v, avg, True)
    np.testing.assert_array_equal(g["a"], 2.0) and np.testing.assert_array_equal(out["a"], 2.0)
    g, out = estimators.svrg_update(v, avg, False)
    np.testing.assert_array_equal(g["a"], 1.0) and np.testing.assert_array_equal(out["a"], 3.0)
    w, ref = {"a": jnp.array([3.0, 4.0])}, {"a": jnp.zeros(2)}
    assert float(estimators.difference_clip(w, ref, 1.0, None)) == 2.0
    assert float(estimators.difference_clip(w, ref, 10.0, 0.5)) == pytest.approx(2.5)
    assert float(estimators.difference_clip(w, ref, 1.0, 0.5)) == 2.0
