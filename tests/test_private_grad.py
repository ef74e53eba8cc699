"""The private-gradient primitive (fedjax_dp.privacy.private_grad and its parts): gathered ==
masked, clip bound, no truncation, and its users (ISRL uploads, DP-FedSGD, DP-FNAS)."""
import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dp.algorithms.isrl import uploads
from fedjax_dp.privacy import accounting, batch_selection as bs, clipping, noise
from fedjax_dp.privacy import private_grad as pg

N, D = 24, 3


def _loss(params, x, y):
    return jnp.sum((x @ params["w"] + params["b"] - y) ** 2)


@pytest.fixture(scope="module")
def data():
    kx, ky = jax.random.split(jax.random.key(0))
    x = 2.0 * jax.random.normal(kx, (N, D))
    y = jax.random.normal(ky, (N,))
    params = {"w": jnp.ones((D,)), "b": jnp.zeros(())}
    mask = jnp.arange(N) < 21                                          # 3 padding rows
    return x, y, params, mask


def _close(a, b, tol=1e-5):
    for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=tol, atol=tol)


PLANS = [None, bs.RowPlan(first=0, step=3), bs.RowPlan(first=2, step=1),
         bs.RowPlan.for_expected(4.0, N)]


def test_gathered_equals_masked_for_the_same_key(data):
    """private_gradient (selected rows only) == every row's gradient masked to the same draw,
    whatever the plan; the noise is the same draw too."""
    x, y, params, mask = data
    key = jax.random.key(3)
    k_batch, k_noise = jax.random.split(key)
    w = bs.poisson_weights(k_batch, mask, 0.3)
    assert 2 < float(w.sum()) < 21
    total, ref_stats = clipping.masked_clipped_sum(pg.gradient_fn(_loss, params), (x, y), w, 1.5)
    want = noise.release(k_noise, total, 0.7, 5.0)
    for plan in PLANS:
        got, stats = jax.jit(lambda k, p=plan: pg.private_gradient(
            k, _loss, params, x, y, mask, 0.3, 5.0, 1.5, 0.7, plan=p))(key)
        _close(got, want)
        assert float(stats["count"]) == float(w.sum()) == float(ref_stats["count"])
        assert float(stats["clipped"]) == float(ref_stats["clipped"])


def test_clipped_norms_at_most_clip(data):
    """Each record alone (one-hot weights, vmapped) contributes a clipped gradient of norm <= C."""
    x, y, params, mask = data
    clip = 0.05                                                        # below every gradient
    eye = jnp.eye(N)[:21]
    sums, stats = jax.jit(jax.vmap(lambda w: clipping.clipped_sum(
        pg.gradient_fn(_loss, params), (x, y), w, clip, bs.RowPlan(first=1, step=1))))(eye)
    norms = np.asarray(jax.vmap(optax.tree.norm)(sums))
    assert np.all(norms <= clip * (1 + 1e-5)) and np.all(norms >= clip * (1 - 1e-5))
    np.testing.assert_array_equal(np.asarray(stats["clipped"]), 1.0)


def test_large_draw_is_not_truncated(data):
    """Rate 1: every real record is drawn, far more than the first pass (2 rows) holds."""
    x, y, params, mask = data
    w = bs.poisson_weights(jax.random.key(0), mask, 1.0)
    want, _ = clipping.masked_clipped_sum(pg.gradient_fn(_loss, params), (x, y), w, 1.0)
    got, stats = jax.jit(lambda w: clipping.clipped_sum(pg.gradient_fn(_loss, params), (x, y), w,
                                                        1.0, bs.RowPlan(first=2, step=5)))(w)
    assert float(stats["count"]) == 21.0
    _close(got, want)


def test_parties_vmapped_with_different_draws(data):
    """Under vmap over parties (sizes 1 and 3) the loop runs to the largest draw; each party
    equals its own masked sum."""
    x, y, params, mask = data
    masks = jnp.stack([mask, jnp.arange(N) < 5, jnp.arange(N) < 24])
    rates = jnp.array([0.2, 1.0, 0.9])
    ws = jax.vmap(bs.poisson_weights)(jax.random.split(jax.random.key(1), 3), masks, rates)
    fn = pg.gradient_fn(_loss, params)
    plan = bs.RowPlan.for_expected(5.0, N)
    got, _ = jax.jit(jax.vmap(lambda w: clipping.clipped_sum(fn, (x, y), w, 0.5, plan)))(ws)
    for i in range(3):
        want, _ = clipping.masked_clipped_sum(fn, (x, y), ws[i], 0.5)
        _close(jax.tree.map(lambda l: l[i], got), want)
    one, _ = jax.jit(jax.vmap(lambda w: clipping.clipped_sum(fn, (x, y), w, 0.5, plan)))(ws[:1])
    _close(jax.tree.map(lambda l: l[0], one), jax.tree.map(lambda l: l[0], got))


def test_selected_rows_zero_elsewhere(data):
    x, y, params, mask = data
    w = bs.poisson_weights(jax.random.key(2), mask, 0.4)
    fn = pg.gradient_fn(_loss, params)
    rows, _ = bs.selected_rows(fn, (x, y), w, bs.RowPlan(first=1, step=2))
    full = jax.vmap(lambda a, b: fn(a, b)[0])(x, y)
    _close(rows, jax.tree.map(lambda l: l * w.reshape((-1,) + (1,) * (l.ndim - 1)), full))


@pytest.mark.parametrize("private", [True, False])
def test_isrl_uploads_gathered_equal_masked(data, private):
    """ISRL gradient and difference uploads planned for K = 4 equal the unplanned upload (one pass
    over all rows) for the same key."""
    x, y, params, mask = data
    ref = {"w": jnp.full((D,), 0.5), "b": jnp.ones(())}
    key = jax.random.key(7)
    g_plan = uploads.gradient_upload(_loss, private, 4)
    g_all = uploads.gradient_upload(_loss, private, None)
    args = (key, params, x, y, mask, 0.2, 4.2, 1.0, 0.8)
    (a, sa), (b, sb) = jax.jit(g_plan)(*args), jax.jit(g_all)(*args)
    _close(a, b)
    assert float(sa["batch_size"]) == float(sb["batch_size"])
    d_plan = uploads.difference_upload(_loss, private, 4)
    d_all = uploads.difference_upload(_loss, private, None)
    args = (key, params, ref, x, y, mask, 0.2, 4.2, 1.0, 0.3, 0.8)
    (a, sa), (b, sb) = jax.jit(d_plan)(*args), jax.jit(d_all)(*args)
    _close(a, b)
    assert float(sa["clipped"]) == float(sb["clipped"])


def test_fixed_size_selection(data):
    _, _, _, mask = data
    ws = jax.vmap(lambda k: bs.fixed_size_weights(k, mask, 6))(
        jax.random.split(jax.random.key(0), 50))
    assert np.all(np.asarray(ws.sum(1)) == 6)
    assert not np.any(np.asarray(ws)[:, 21:])                          # never padding
    assert len({tuple(np.flatnonzero(r)) for r in np.asarray(ws)}) > 40


def test_events():
    ev = accounting.fixed_size_event(1.0, 100, 10)
    assert isinstance(ev, dp_accounting.SampledWithoutReplacementDpEvent)
    with pytest.raises(ValueError, match="step"):
        bs.RowPlan(first=1, step=0)


def _per_example_loop(per_example_grads, w, clip):
    """Equation (1) by a Python loop over the rows: each gradient, its global norm, clipped,
    weighted, summed (float64 on the host)."""
    total = jax.tree.map(lambda g: np.zeros(g.shape, np.float64), per_example_grads[0])
    for j, g in enumerate(per_example_grads):
        norm = np.sqrt(sum(np.sum(l ** 2) for l in jax.tree.leaves(g)))
        factor = float(w[j]) * min(1.0, clip / max(norm, 1e-12))
        total = jax.tree.map(lambda t, l: t + factor * l, total, g)
    return total


@pytest.fixture(scope="module")
def cnn():
    """A small CNN, its loss, 10 rows (one padding) and each row's gradient (one jitted
    ``jax.grad`` called row by row, float64 on the host), shared by the CNN cases."""
    from fedjax_dp.models import make_model
    from fedjax_dp.train import cross_entropy
    model = make_model("cnn", (12, 12, 1), 4)
    params = model.init(jax.random.key(0))
    loss = cross_entropy(model)
    rng = np.random.default_rng(5)
    x = jnp.asarray(rng.normal(size=(10, 12, 12, 1)).astype(np.float32))
    y = jnp.asarray(rng.integers(0, 4, 10).astype(np.int32))
    mask = jnp.arange(10) < 9                                          # one padding row
    grad = jax.jit(jax.grad(loss))
    per_example = [jax.tree.map(lambda l: np.asarray(l, np.float64), grad(params, x[j], y[j]))
                   for j in range(x.shape[0])]
    return loss, params, x, y, mask, per_example


@pytest.mark.parametrize("rate,plan", [(1.0, None), (0.5, None),
                                       (0.5, bs.RowPlan(first=3, step=2))])
def test_private_gradient_equals_a_per_example_loop_cnn(cnn, rate, plan):
    """A small CNN (conv, dense, biases: leaves of rank 1 to 4), noise 0: the clipped sum over
    the drawn rows / D equals a per-example loop; rate 1 draws every real row (no coins)."""
    loss, params, x, y, mask, per_example = cnn
    key = jax.random.key(4)
    got, stats = jax.jit(lambda k: pg.private_gradient(k, loss, params, x, y, mask, rate, 7.0,
                                                       0.3, 0.0, plan=plan))(key)
    w = bs.poisson_weights(jax.random.split(key)[0], mask, rate)
    if rate == 1.0:
        np.testing.assert_array_equal(np.asarray(w), np.asarray(mask, np.float32))
        assert float(stats["count"]) == 9.0
    want = _per_example_loop(per_example, np.asarray(w), 0.3)
    for u, v in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(u, np.float64), v / 7.0, rtol=1e-4, atol=1e-6)


def test_rate_one_selects_every_real_row_as_the_draw_does():
    """poisson_weights at a Python rate 1 is the mask (no draw), which is what a traced rate 1
    draws (Bernoulli(1) is always 1)."""
    mask = jnp.arange(12) < 7
    key = jax.random.key(9)
    traced = jax.jit(bs.poisson_weights)(key, mask, jnp.float32(1.0))
    np.testing.assert_array_equal(np.asarray(bs.poisson_weights(key, mask, 1.0)),
                                  np.asarray(traced))
    np.testing.assert_array_equal(np.asarray(bs.poisson_weights(key, mask, 1)),
                                  np.asarray(mask, np.float32))


def test_weighted_clipped_sum_mixed_dtypes_and_a_scalar_leaf():
    """Leaves of different dtypes and a scalar leaf: the per-leaf matrices give the global norm
    and the clipped sum of a direct computation."""
    rng = np.random.default_rng(2)
    values = {"a": jnp.asarray(rng.normal(size=(5, 3, 2)).astype(np.float32)),
              "b": jnp.asarray(rng.normal(size=(5,)).astype(np.float32)),
              "c": jnp.asarray(rng.normal(size=(5, 4)).astype(np.float16))}
    w = jnp.asarray([1.0, 0.0, 1.0, 1.0, 0.5])
    total, norms = clipping.weighted_clipped_sum(values, w, 1.2)
    flat = np.concatenate([np.asarray(v, np.float64).reshape(5, -1)
                           for v in jax.tree.leaves(values)], 1)
    want_norms = np.linalg.norm(flat, axis=1)
    np.testing.assert_allclose(np.asarray(norms), want_norms, rtol=1e-3)
    factor = np.asarray(w) * np.minimum(1.0, 1.2 / want_norms)
    for got, v in zip(jax.tree.leaves(total), jax.tree.leaves(values)):
        want = np.tensordot(factor, np.asarray(v, np.float64), axes=(0, 0))
        np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=2e-3, atol=1e-3)
        assert got.dtype == v.dtype
