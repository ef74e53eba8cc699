"""The private-gradient primitive (fedjax_dp.train.private_grad): gathered == masked, clip bound,
no truncation, and its users (ISRL uploads, DP-FedSGD, DP-FNAS) on the gathered path."""
import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dp.algorithms.isrl import uploads
from fedjax_dp.privacy import accounting
from fedjax_dp.train import private_grad as pg

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


PLANS = [None, pg.RowPlan(first=0, step=3), pg.RowPlan(first=2, step=1),
         pg.RowPlan.for_expected(4.0, N)]


def test_gathered_equals_masked_for_the_same_key(data):
    """private_gradient (selected rows only) == every row's gradient masked to the same draw,
    whatever the plan; the noise is the same draw too."""
    x, y, params, mask = data
    key = jax.random.key(3)
    k_batch, k_noise = jax.random.split(key)
    w = pg.poisson_weights(k_batch, mask, 0.3)
    assert 2 < float(w.sum()) < 21
    total, ref_stats = pg.masked_clipped_sum(pg.gradient_fn(_loss, params), (x, y), w, 1.5)
    want = pg.release(k_noise, total, 0.7, 5.0)
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
    sums, stats = jax.jit(jax.vmap(lambda w: pg.clipped_sum(
        pg.gradient_fn(_loss, params), (x, y), w, clip, pg.RowPlan(first=1, step=1))))(eye)
    norms = np.asarray(jax.vmap(optax.tree.norm)(sums))
    assert np.all(norms <= clip * (1 + 1e-5)) and np.all(norms >= clip * (1 - 1e-5))
    np.testing.assert_array_equal(np.asarray(stats["clipped"]), 1.0)


def test_large_draw_is_not_truncated(data):
    """Rate 1: every real record is drawn, far more than the first pass (2 rows) holds."""
    x, y, params, mask = data
    w = pg.poisson_weights(jax.random.key(0), mask, 1.0)
    want, _ = pg.masked_clipped_sum(pg.gradient_fn(_loss, params), (x, y), w, 1.0)
    got, stats = jax.jit(lambda w: pg.clipped_sum(pg.gradient_fn(_loss, params), (x, y), w, 1.0,
                                                  pg.RowPlan(first=2, step=5)))(w)
    assert float(stats["count"]) == 21.0
    _close(got, want)


def test_parties_vmapped_with_different_draws(data):
    """Under vmap over parties (sizes 1 and 3) the loop runs to the largest draw; each party
    equals its own masked sum."""
    x, y, params, mask = data
    masks = jnp.stack([mask, jnp.arange(N) < 5, jnp.arange(N) < 24])
    rates = jnp.array([0.2, 1.0, 0.9])
    ws = jax.vmap(pg.poisson_weights)(jax.random.split(jax.random.key(1), 3), masks, rates)
    fn = pg.gradient_fn(_loss, params)
    plan = pg.RowPlan.for_expected(5.0, N)
    got, _ = jax.jit(jax.vmap(lambda w: pg.clipped_sum(fn, (x, y), w, 0.5, plan)))(ws)
    for i in range(3):
        want, _ = pg.masked_clipped_sum(fn, (x, y), ws[i], 0.5)
        _close(jax.tree.map(lambda l: l[i], got), want)
    one, _ = jax.jit(jax.vmap(lambda w: pg.clipped_sum(fn, (x, y), w, 0.5, plan)))(ws[:1])
    _close(jax.tree.map(lambda l: l[0], one), jax.tree.map(lambda l: l[0], got))


def test_selected_rows_zero_elsewhere(data):
    x, y, params, mask = data
    w = pg.poisson_weights(jax.random.key(2), mask, 0.4)
    fn = pg.gradient_fn(_loss, params)
    rows, _ = pg.selected_rows(fn, (x, y), w, pg.RowPlan(first=1, step=2))
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
    ws = jax.vmap(lambda k: pg.fixed_size_weights(k, mask, 6))(
        jax.random.split(jax.random.key(0), 50))
    assert np.all(np.asarray(ws.sum(1)) == 6)
    assert not np.any(np.asarray(ws)[:, 21:])                          # never padding
    assert len({tuple(np.flatnonzero(r)) for r in np.asarray(ws)}) > 40


def test_events():
    assert pg.poisson_event(1.1, 0.1, 5) == accounting.sampled_gaussian_event(1.1, 0.1, 5)
    ev = pg.fixed_size_event(1.0, 100, 10)
    assert isinstance(ev, dp_accounting.SampledWithoutReplacementDpEvent)
    with pytest.raises(ValueError, match="step"):
        pg.RowPlan(first=1, step=0)
