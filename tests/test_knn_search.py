"""Threshold-search kNN label counts (knn_search) vs a plain loop and vs lax.top_k: exact sets,
ties (lower index first), ragged / empty agents, block sizes, search paths, label packing."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dp.ops import knn_search
from fedjax_dp.core import from_ragged


@functools.partial(jax.jit, static_argnames=("k", "num_classes", "agent_block", "query_block",
                                             "search_steps", "walk_width", "compact", "fix_rows"))
def _compiled_counts(x, y, mask, queries, *, k, num_classes, agent_block, query_block,
                     search_steps, walk_width, compact, fix_rows):
    return knn_search.neighbour_label_counts(x, y, mask, queries, k, num_classes,
                                             agent_block=agent_block, query_block=query_block,
                                             search_steps=search_steps, walk_width=walk_width,
                                             compact=compact, fix_rows=fix_rows)


def _counts(x, y, mask, queries, k, num_classes, agent_block=1, query_block=256,
            search_steps=knn_search.SEARCH_STEPS, walk_width=knn_search.WALK_WIDTH,
            compact=knn_search.COMPACT, fix_rows=knn_search.FIX_ROWS):
    """Every setting passed explicitly: calls with the same settings (given or defaulted) share
    one compiled program (the tests below share shapes for that)."""
    return _compiled_counts(x, y, mask, queries, k=k, num_classes=num_classes,
                            agent_block=agent_block, query_block=query_block,
                            search_steps=search_steps, walk_width=walk_width, compact=compact,
                            fix_rows=fix_rows)


_TOPK = jax.jit(knn_search.topk_counts, static_argnums=(2, 3))


def _loop(xs, ys, queries, k, c):
    """numpy loop over agents and queries: float32 scores as the kernel computes them, stable
    argsort (lower index first on ties)."""
    out = np.zeros((len(xs), len(queries), c), np.float32)
    for i, (x, y) in enumerate(zip(xs, ys)):
        if len(x) == 0:
            continue
        x32 = np.asarray(x, np.float32)
        for t, q in enumerate(np.asarray(queries, np.float32)):
            d = np.sum((x32.astype(np.float64) - q) ** 2, axis=1)
            for j in np.argsort(d, kind="stable")[:k]:
                out[i, t, y[j]] += 1
    return out


def _data(seed, sizes, d=5, c=4, q=9):
    rng = np.random.default_rng(seed)
    xs = [rng.normal(size=(n, d)).astype(np.float32) for n in sizes]
    ys = [rng.integers(0, c, n).astype(np.int32) for n in sizes]
    queries = rng.normal(size=(q, d)).astype(np.float32)
    return xs, ys, queries


@pytest.mark.parametrize("k", [1, 4, 12])
def test_counts_equal_a_loop_over_agents_and_queries(k):
    xs, ys, queries = _data(0, [40, 17, 12, 3, 0])        # ragged, one with < k, one empty
    data = from_ragged(xs, ys, allow_empty=True)
    got = np.asarray(_counts(data.x, data.y, data.mask, jnp.asarray(queries), k=k, num_classes=4))
    np.testing.assert_array_equal(got, _loop(xs, ys, queries, k, 4))
    np.testing.assert_array_equal(got.sum(-1), np.minimum(k, [40, 17, 12, 3, 0])[:, None]
                                  * np.ones((1, len(queries))))


def test_equal_to_top_k_on_ties_lower_index_first():
    """Duplicated records tie at the k-th distance: the chosen set is lax.top_k's (lower index
    first), through the verified fallback (k = 3: five rows tie at the k-th, walking from the
    start; k = 7: one row, after the count passes)."""
    rng = np.random.default_rng(1)
    base = rng.normal(size=(6, 3)).astype(np.float32)
    x = np.concatenate([base, base, base[:2]])             # 14 records, many exact duplicates
    y = rng.integers(0, 3, len(x)).astype(np.int32)
    queries = np.concatenate([base[:3], rng.normal(size=(4, 3)).astype(np.float32)])
    for k in (3, 7):
        got = np.asarray(_counts(jnp.asarray(x[None]), jnp.asarray(y[None]),
                                 jnp.ones((1, len(x)), bool), jnp.asarray(queries), k=k,
                                 num_classes=3))
        s = knn_search.scores(jnp.asarray(x[None]), jnp.ones((1, len(x)), bool),
                              jnp.asarray(queries))
        ref = np.asarray(_TOPK(s, jnp.asarray(y[None]), k, 3))
        np.testing.assert_array_equal(got, ref)


def test_many_tied_records_across_the_kth_terminate_and_match_top_k():
    """20 identical records straddle the k-th neighbour (k = 10): no threshold gives exactly k,
    the search must stop (adjacent keys / pass cap) and the fallback give top-k's set."""
    rng = np.random.default_rng(6)
    x = np.concatenate([np.zeros((20, 3)), rng.normal(3.0, 1.0, size=(15, 3))]).astype(np.float32)
    x = x[rng.permutation(len(x))]
    y = rng.integers(0, 3, len(x)).astype(np.int32)
    queries = np.array([[0.1, 0.0, 0.0], [3.0, 3.0, 3.0]], np.float32)
    got = _counts(jnp.asarray(x[None]), jnp.asarray(y[None]), jnp.ones((1, len(x)), bool),
                  jnp.asarray(queries), k=10, num_classes=3)
    np.testing.assert_array_equal(np.asarray(got), _loop([x], [y], queries, 10, 3))


@pytest.mark.parametrize("agent_block,query_block", [(2, 4), (3, 256), (6, 5)])
def test_block_sizes_do_not_change_the_counts(agent_block, query_block):
    """Agent blocks dividing the agents or one block of all, query blocks padding the queries or
    holding them all (one block of both: test_one_wide_block_equals_the_loop)."""
    xs, ys, queries = _data(2, [30, 30, 25, 30, 28, 30], q=11)
    data = from_ragged(xs, ys)
    args = (data.x, data.y, data.mask, jnp.asarray(queries))
    plain = _counts(*args, k=6, num_classes=4)
    blocked = _counts(*args, k=6, num_classes=4, agent_block=agent_block, query_block=query_block)
    np.testing.assert_array_equal(np.asarray(blocked), np.asarray(plain))


def test_search_paths_agree_bisection_only_and_no_walk():
    """Pure bisection (no model/secant guesses), with and without walking, and guesses without
    walking give the same exact sets (guesses and walking: the defaults, every other test)."""
    xs, ys, queries = _data(3, [50, 50, 44], d=6, q=16)
    data = from_ragged(xs, ys)
    args = (data.x, data.y, data.mask, jnp.asarray(queries))
    ref = _loop(xs, ys, queries, 7, 4)
    for steps, width in [(0, 0), (0, 3), (20, 0)]:
        got = _counts(*args, k=7, num_classes=4, search_steps=steps, walk_width=width)
        np.testing.assert_array_equal(np.asarray(got), ref)


_KTH = jax.jit(knn_search.kth_smallest_key, static_argnames=("k", "compact"))


@pytest.mark.parametrize("compact", [0, 4, 64])
def test_threshold_has_exactly_k_keys_below_and_few_passes(compact):
    """Exactly k scores at or below tau, with and without compacting the last active rows
    (compact 64: 128 rows, a buffer of 2), and with badly wrong moments (only guesses)."""
    rng = np.random.default_rng(4)
    s = jnp.asarray(rng.normal(size=(2, 200, 64)).astype(np.float32) * 30 + 5)
    good = (jnp.mean(s, axis=1), jnp.std(s, axis=1))
    bad = (jnp.full((2, 64), -1e3), jnp.full((2, 64), 1e-3))
    keys = np.asarray(knn_search.to_key(s))
    for k in (1, 10, 199):
        for mean, sd in (good, bad):
            tau, passes = _KTH(s, k=k, n_real=jnp.array([200, 200]), mean=mean, sd=sd,
                               compact=compact)
            np.testing.assert_array_equal(np.sum(keys <= np.asarray(tau)[:, None, :], 1), k)
            assert int(passes) <= 45                      # search_steps + 34 + walk_width cap


def test_compaction_does_not_change_the_counts():
    """Blocks of 4 agents x 64 queries (256 rows): compacting at 1/4, 1/32 or never -- and at
    1/256 (a one-row buffer) -- gives the loop's counts. (The shapes of
    test_tied_rows_redone_alone_or_by_block_equal_the_loop: the default 1/32 compiles once.)"""
    xs, ys, queries = _data(7, [50, 50, 44, 50], d=4, q=64)
    data = from_ragged(xs, ys)
    args = (data.x, data.y, data.mask, jnp.asarray(queries))
    ref = _loop(xs, ys, queries, 7, 4)
    for compact in (0, 4, 32, 256):
        got = _counts(*args, k=7, num_classes=4, agent_block=4, query_block=64, compact=compact)
        np.testing.assert_array_equal(np.asarray(got), ref)


def test_score_moments_from_record_statistics():
    """mean / variance of s_j over an agent's real records, from per-agent statistics (exact
    when the records' covariance is diagonal: independent features)."""
    rng = np.random.default_rng(8)
    x = (rng.normal(size=(2, 4000, 3)) * [1.0, 2.0, 0.5] + [0.3, -1.0, 2.0]).astype(np.float32)
    mask = np.ones((2, 4000), bool)
    mask[1, 3000:] = False                                  # padded records are ignored
    q = rng.normal(size=(5, 3)).astype(np.float32)
    qa = knn_search.augment_queries(jnp.asarray(q))
    mean, sd = jax.jit(lambda x, mask, qa: knn_search.score_moments(      # one program
        knn_search.agent_stats(x, mask), qa))(jnp.asarray(x), jnp.asarray(mask), qa)
    for i in range(2):
        xi = x[i][mask[i]].astype(np.float64)
        s = np.sum(xi ** 2, 1)[:, None] - 2 * xi @ q.T.astype(np.float64)   # [n_i, q]
        np.testing.assert_allclose(np.asarray(mean)[i], s.mean(0), rtol=0.05, atol=0.1)
        np.testing.assert_allclose(np.asarray(sd)[i], s.std(0), rtol=0.1)


def test_query_block_sizes():
    """Multiples of 64 (fast GEMMs) padding Q least; small Q in one block."""
    assert knn_search.query_block_size(1000, 128) == 128          # 8 blocks, 24 padded
    assert knn_search.query_block_size(1000, 256) == 256          # 1024 either way: larger
    assert knn_search.query_block_size(1152, 256) == 192          # 6 x 192, no padding
    assert knn_search.query_block_size(9, 256) == 9
    assert knn_search.query_block_size(11, 5) == 5                # below 64: as given


def test_block_sizes_cpu_cache_blocks_and_one_wide_block_on_accelerators():
    """CPU: the cache-sized blocks; an accelerator: one block of every agent and query while
    WIDE_BLOCK_COPIES copies of its scores fit the chunk budget, else as many agents as fit
    (and queries in multiples of 64 when one agent's row does not fit)."""
    from fedjax_dp.core import defaults as defaults_lib
    cpu = defaults_lib.defaults(platform="cpu")
    assert knn_search.block_sizes(1000, 600, 1000, cpu) == (knn_search.AGENT_BLOCK,
                                                           knn_search.QUERY_BLOCK)
    big = defaults_lib.defaults(platform="gpu", device_memory=80 * 2 ** 30)
    assert knn_search.block_sizes(1000, 600, 1000, big) == (1000, 1000)
    unreported = defaults_lib.defaults(platform="gpu")
    assert knn_search.block_sizes(10 ** 6, 600, 1000, unreported) == (10 ** 6, 1000)
    small = defaults_lib.defaults(platform="gpu", device_memory=2 ** 30)
    ab, qb = knn_search.block_sizes(1000, 600, 1000, small)
    assert qb == 1000 and 1 <= ab < 1000
    assert knn_search.WIDE_BLOCK_COPIES * 4 * ab * 600 * qb <= small.chunk_budget_bytes
    tiny = defaults_lib.defaults(platform="tpu", device_memory=2 ** 24)
    ab, qb = knn_search.block_sizes(10, 600, 1000, tiny)
    assert ab == 1 and qb % 64 == 0 and 64 <= qb < 1000


def test_one_wide_block_equals_the_loop():
    """The accelerator's layout (every agent and query in one block) on this CPU: the loop's
    counts, ragged agents included. (The shapes and settings of the compaction and tied-rows
    tests' default block: one compiled program.)"""
    xs, ys, queries = _data(9, [50, 33, 5, 50], d=4, q=64)
    data = from_ragged(xs, ys)
    got = _counts(data.x, data.y, data.mask, jnp.asarray(queries), k=7, num_classes=4,
                  agent_block=4, query_block=64)
    np.testing.assert_array_equal(np.asarray(got), _loop(xs, ys, queries, 7, 4))


def test_tied_rows_redone_alone_or_by_block_equal_the_loop():
    """A record duplicated so that the copy ties with the k-th nearest of query 0: the search's
    count is off on that row (and on the few others where the twins straddle the k-th); those
    rows alone are redone with top-k (fix_rows 16: up to 16 of the block's 256 rows) or, past
    the buffer, the whole block (fix_rows 1024): both equal the loop (lower index first)."""
    xs, ys, queries = _data(11, [50, 50, 50, 50], d=4, q=64)
    x0 = xs[0].astype(np.float64)
    order = np.argsort(np.sum((x0 - queries[0].astype(np.float64)) ** 2, 1), kind="stable")
    k = 7
    xs[0][order[-1]] = xs[0][order[k - 1]]                 # the farthest becomes the k-th's twin
    data = from_ragged(xs, ys)
    args = (data.x, data.y, data.mask, jnp.asarray(queries))

    @jax.jit                                              # one program (eager: one per op)
    def below_tau(x, mask, queries):
        s = knn_search.scores(x, mask, queries)
        mean, sd = knn_search.score_moments(knn_search.agent_stats(x, mask),
                                            knn_search.augment_queries(queries))
        tau, _ = knn_search.kth_smallest_key(s, k, jnp.sum(mask, 1), mean, sd)
        return jnp.sum(knn_search.to_key(s) <= tau[:, None, :], 1)
    below = np.asarray(below_tau(data.x, data.mask, jnp.asarray(queries)))
    assert below[0, 0] == k + 1 and 1 <= np.sum(below != k) <= 16     # rows to redo
    want = _loop(xs, ys, queries, k, 4)
    for fix_rows in (16, 1024):
        got = np.asarray(_counts(*args, k=k, num_classes=4, agent_block=4, query_block=64,
                                 fix_rows=fix_rows))
        np.testing.assert_array_equal(got, want)
