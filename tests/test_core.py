import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dp.core import (agent_mesh, agent_sum, as_key, for_each_agent, for_each_agent_sum,
                            from_partition, from_ragged, numpy_rng, split_per_agent, stream)


def _ragged(sizes=(3, 5, 1, 4), d=2, seed=0):
    r = np.random.default_rng(seed)
    xs = [r.normal(size=(n, d)).astype(np.float32) for n in sizes]
    ys = [r.integers(0, 3, size=n) for n in sizes]
    return xs, ys


def test_from_ragged_layout_mask_counts():
    xs, ys = _ragged()
    d = from_ragged(xs, ys)
    assert d.x.shape == (4, 5, 2) and d.y.shape == (4, 5) and d.mask.shape == (4, 5)
    np.testing.assert_array_equal(d.counts, [3, 5, 1, 4])
    np.testing.assert_array_equal(d.mask.sum(1), d.counts)
    for i, (x, y) in enumerate(zip(xs, ys)):
        lx, ly = d.local(i)
        np.testing.assert_array_equal(lx, x)
        np.testing.assert_array_equal(ly, y)
        assert not np.any(np.asarray(d.x[i, len(x):]))        # padding is zeros
        assert np.all(np.asarray(d.mask[i, :len(x)])) and not np.any(np.asarray(d.mask[i, len(x):]))


def test_from_ragged_pad_to_and_pytree():
    xs, ys = _ragged()
    d = from_ragged(xs, ys, pad_to=8)
    assert d.max_size == 8
    leaves = jax.tree.leaves(d)
    assert len(leaves) == 4 and all(l.shape[0] == 4 for l in leaves)
    doubled = jax.jit(lambda s: jax.tree.map(lambda l: l * 2, s))(d)
    np.testing.assert_array_equal(doubled.counts, 2 * d.counts)


def test_from_partition_matches_indices():
    x = np.arange(20, dtype=np.float32).reshape(10, 2)
    y = np.arange(10) % 3
    parts = [np.array([0, 3]), np.array([9, 1, 2]), np.array([5])]
    d = from_partition(x, y, parts)
    for i, p in enumerate(parts):
        lx, ly = d.local(i)
        np.testing.assert_array_equal(lx, x[p])
        np.testing.assert_array_equal(ly, y[p])


@pytest.mark.parametrize("kwargs,match", [
    (dict(xs=[np.ones((2, 2)), np.ones((0, 2))], ys=[np.zeros(2, int), np.zeros(0, int)]),
     "agent 1 has no records"),
    (dict(xs=[np.ones((2, 2)), np.ones((2, 3))], ys=[np.zeros(2, int)] * 2), "feature shape"),
    (dict(xs=[np.array([[np.nan, 1.0]])], ys=[np.zeros(1, int)]), "NaN"),
    (dict(xs=[np.ones((2, 2))], ys=[np.zeros(3, int)]), r"ys\[0\] must have shape"),
    (dict(xs=[np.ones((2, 2))], ys=[np.zeros(2, int)], pad_to=1), "pad_to"),
    (dict(xs=[], ys=[]), "at least one agent"),
])
def test_from_ragged_rejects_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        from_ragged(**kwargs)


def test_from_partition_rejects_out_of_range():
    with pytest.raises(ValueError, match=r"indices\[0\]"):
        from_partition(np.ones((3, 2)), np.zeros(3, int), [np.array([0, 3])])


def _agent_fn(x, mask, w):
    """A one-agent function with a matmul, a reduction and a masked mean."""
    h = jnp.tanh(x @ w)                                   # [n, k]
    return {"mean": (h * mask[:, None]).sum(0) / jnp.maximum(mask.sum(), 1), "max": h.max()}


def test_vmap_equals_loop_and_chunked_equals_plain():
    xs, ys = _ragged(sizes=(3, 5, 1, 4, 2, 2, 5))
    d = from_ragged(xs, ys)
    w = jnp.asarray(np.random.default_rng(1).normal(size=(2, 3)), jnp.float32)
    axes = (0, 0, None)
    plain = jax.jit(for_each_agent(_agent_fn, axes))(d.x, d.mask, w)
    loop = for_each_agent(_agent_fn, axes, backend="loop")(d.x, d.mask, w)
    for chunk in (1, 3, 7, 10):   # 3 does not divide 7: the remainder path is exercised
        chunked = jax.jit(for_each_agent(_agent_fn, axes, chunk_size=chunk))(d.x, d.mask, w)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6),
                     chunked, plain)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6), loop, plain)
    # the loop reference computed each agent alone: check one by hand
    i = 1
    h = np.tanh(np.asarray(xs[i]) @ np.asarray(w))
    np.testing.assert_allclose(plain["mean"][i], h.mean(0), rtol=1e-5)


def test_agent_sum_lift_equals_loop_sum_and_never_reads_deselected_rows():
    xs, ys = _ragged(sizes=(3, 5, 1, 4, 2, 2, 5))
    d = from_ragged(xs, ys)
    x = np.asarray(d.x).copy()
    x[2] = np.nan                                      # a deselected agent full of NaN
    x = jnp.asarray(x)
    w = jnp.asarray(np.random.default_rng(1).normal(size=(2, 3)), jnp.float32)
    where = np.array([1, 1, 0, 1, 0, 1, 1], bool)
    axes = (0, 0, None)
    one = jax.jit(_agent_fn)
    outs = [one(x[i], d.mask[i], w) for i in range(7) if where[i]]     # the loop reference
    want = jax.tree.map(lambda *ls: np.sum(np.stack(ls), axis=0), *outs)
    for chunk in (None, 1, 3, 7, 10):     # 3 does not divide 7: a scanned head and a tail
        got = jax.jit(lambda *a, chunk=chunk: for_each_agent_sum(_agent_fn, axes, chunk_size=chunk)(
            *a, where=where))(x, d.mask, w)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                     got, want)
        assert all(np.isfinite(l).all() for l in jax.tree.leaves(got))
    every = for_each_agent_sum(_agent_fn, axes, chunk_size=3)(d.x, d.mask, w)   # where: all
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b.sum(0), rtol=1e-5, atol=1e-6),
                 every, for_each_agent(_agent_fn, axes)(d.x, d.mask, w))
    with pytest.raises(ValueError, match=r"where must have shape \(7,\)"):
        for_each_agent_sum(_agent_fn, axes)(d.x, d.mask, w, where=np.ones(6, bool))


def test_mesh_single_device_equals_plain():
    xs, ys = _ragged(sizes=(3, 5, 1))
    d = from_ragged(xs, ys)
    w = jnp.ones((2, 3))
    plain = for_each_agent(_agent_fn, (0, 0, None))(d.x, d.mask, w)
    sharded = jax.jit(for_each_agent(_agent_fn, (0, 0, None), mesh=agent_mesh()))(d.x, d.mask, w)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), sharded, plain)


def test_loop_backend_names_failing_agent():
    def bad(x):
        if x.shape[0] > 0:
            raise FloatingPointError("boom")
        return x
    with pytest.raises(RuntimeError, match="agent 0 failed"):
        for_each_agent(bad, backend="loop")(jnp.ones((2, 3)))


def test_for_each_agent_argument_errors():
    with pytest.raises(ValueError, match="in_axes"):
        for_each_agent(lambda a, b: a, in_axes=(0, 1))(jnp.ones((2, 2)), jnp.ones((2, 2)))
    with pytest.raises(ValueError, match="disagree on the number of agents"):
        for_each_agent(lambda a, b: a, in_axes=(0, 0), mesh=agent_mesh())(
            jnp.ones((2, 2)), jnp.ones((3, 2)))
    with pytest.raises(ValueError, match="chunk_size"):
        for_each_agent(lambda a: a, chunk_size=0)
    with pytest.raises(ValueError, match="backend"):
        for_each_agent(lambda a: a, backend="pmap")


def test_agent_sum_weighted():
    t = {"a": jnp.arange(12.0).reshape(4, 3), "b": jnp.arange(4.0)}
    w = jnp.array([1.0, 0.0, 1.0, 0.0])
    s = agent_sum(t, w)
    np.testing.assert_allclose(s["a"], np.arange(12.0).reshape(4, 3)[[0, 2]].sum(0))
    np.testing.assert_allclose(s["b"], 2.0)
    np.testing.assert_allclose(agent_sum(t)["b"], 6.0)


def test_rng_helpers_give_distinct_streams():
    key = as_key(3)
    keys = split_per_agent(key, 16)
    draws = np.asarray(jax.vmap(lambda k: jax.random.normal(k, (8,)))(keys))
    assert len({tuple(r) for r in draws.round(6)}) == 16          # no two agents share a stream
    a = jax.random.normal(stream(key, "noise"), (4,))
    b = jax.random.normal(stream(key, "partition"), (4,))
    assert not np.allclose(a, b)
    np.testing.assert_array_equal(a, jax.random.normal(stream(key, "noise"), (4,)))
    assert numpy_rng(key).integers(1 << 30) == numpy_rng(key).integers(1 << 30)
    assert numpy_rng(1).integers(1 << 30) != numpy_rng(2).integers(1 << 30)
