"""Exact per-agent k-nearest-neighbour label counts without a sort: threshold search + one count.

kNN-DPFL needs, for every agent i and query t, the label histogram of the k records of agent i
nearest to query t. ``jax.lax.top_k`` is a single-threaded partial sort per row on CPU; the
histogram only needs the *set* of the k nearest, ``{j : s_j <= tau}`` with ``tau`` the k-th
smallest score. So:

1. **Scores** ``s[a, n, q] = ||b_j||^2 - 2 <b_j, x_t>`` (the squared distance minus ``||x_t||^2``,
   same ranking): one GEMM per block on augmented operands (:func:`augmented_scores`; padded
   records score ``+inf``). The record axis is major, so every count is a reduction over it.
2. **Threshold** (:func:`kth_smallest_key`): count passes and walk passes narrow a bracket of
   threshold keys per (agent, query) row until ``#{s <= tau} = k``.
3. **Counts and verification** (:func:`_block_counts`): the label counts of ``{s <= tau}`` are
   sums of bit-packed one-hot codes. Rows without exactly ``min(k, n_i)`` chosen records (a tie
   at the k-th distance, where the walk's counting assumption fails) are recomputed with
   ``lax.top_k`` (:func:`topk_counts`). So the chosen set is always exactly ``lax.top_k(-s,
   k)``'s, ties included (lower index first), and an agent with ``n_i < k`` records contributes
   all of them.

The chosen set is a deterministic function of the agent's own records (their scores and their
positions), and adding/removing one record changes it by at most one record in and one out --
what kNN-DPFL's instance-level sensitivity ``sqrt(2)/k`` rests on
(:mod:`fedjax_dp.algorithms.voting.knn_dpfl`); the brute-force sensitivity test runs through this path.

Blocks of ``agent_block`` agents x ``query_block`` queries are visited by ``lax.map``; their size is
device-aware (:func:`block_sizes`) and does not change the result."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.scipy.special import ndtri

from fedjax_dp.core.lift import chunked, pad_rows

SEARCH_STEPS = 8          # count passes with model / regula-falsi guesses before bisection
WALK_WIDTH = 3            # walk record by record once every row is this close to the k-th
QUERY_BLOCK = 128         # CPU: queries per block: an [8, 600, 128] float32 block is 2.5 MB
AGENT_BLOCK = 8           # CPU: agents per block of the scores GEMM [8 n, d + 1] x [d + 1, 128]
WIDE_BLOCK_COPIES = 4     # accelerators: a wide block needs about this many copies of its scores
                          # (scores; the fallback's transposed copy, sort keys and indices)
FIRST_COUNT_PASSES = 3    # count passes every block makes before the adaptive loop
COMPACT = 32              # continue on a gathered buffer once <= 1/32 of a block's rows search
FIX_ROWS = 1024           # a block redoes up to 1 row in this many (at least 1) alone with top-k
                          # when its count is off (a tie at the k-th); more: the whole block
FIRST_SPREAD = 6.0        # the first pass counts at the model quantile -+ this many records
_IMAX = 2 ** 31 - 1


def to_key(f: jax.Array) -> jax.Array:
    """Order-preserving map float32 -> int32 (``a < b`` iff ``key(a) < key(b)``, for non-NaN)."""
    i = lax.bitcast_convert_type(f, jnp.int32)
    return i ^ ((i >> 31) & 0x7FFFFFFF)


def _from_key(k: jax.Array) -> jax.Array:
    """Inverse of :func:`to_key` (the map is an involution on the bit pattern)."""
    return lax.bitcast_convert_type(k ^ ((k >> 31) & 0x7FFFFFFF), jnp.float32)


def _active(k: int, lo_key, hi_key, c_lo, c_hi) -> jax.Array:
    """Rows still searching. Adjacent keys with ``c(lo) < k < c(hi)`` are a tie at ``hi``: no
    threshold separates it, the row stops (the caller's verification sends the block to top-k)."""
    return (c_lo != k) & (c_hi > k) & (hi_key - lo_key != 1)


def _passes(s: jax.Array, k: int, target, t0: jax.Array, dens: jax.Array, state, *,
            search_steps: int, walk_width: int, max_passes: int, stop_at: int, first: int = 0):
    """Count / walk passes over ``s [a, n, q]`` until at most ``stop_at`` rows are active.

    ``state = (it, lo_key, hi_key, c_lo, c_hi)`` (``it`` scalar, the rest ``[a, q]`` int32);
    ``t0``/``dens [a, q]`` the normal-model first guess and density. ``first`` count passes run
    unconditionally first (no activity check or branch). Returns the new state."""
    count_dtype = jnp.int16 if s.shape[1] < 2 ** 15 else jnp.int32
    big = to_key(jnp.float32(jnp.finfo(jnp.float32).max))

    def count(t):
        # c(t) [a, q]: float compare (same order as the keys, but -0.0 == 0.0: the verification
        # covers that corner); partial counts in int16 when they fit
        return jnp.sum((s <= t[:, None, :]).astype(count_dtype), axis=1,
                       dtype=count_dtype).astype(jnp.int32)

    def count_pass(it, lo_key, hi_key, c_lo, c_hi):
        act = _active(k, lo_key, hi_key, c_lo, c_hi)
        lo_v, hi_v = _from_key(lo_key), _from_key(hi_key)
        cl, ch = c_lo.astype(jnp.float32), c_hi.astype(jnp.float32)
        lo_inf = lo_v == -jnp.inf
        regula = lo_v + (hi_v - lo_v) * ((target - cl) / (ch - cl))
        newton = jnp.where(lo_inf, hi_v - (ch - target) / dens, lo_v + (target - cl) / dens)
        guess = jnp.where(it == 0, t0, jnp.where(lo_inf | (hi_key == big), newton, regula))
        g_key = to_key(guess)
        mid = (lo_key >> 1) + (hi_key >> 1) + (lo_key & hi_key & 1)           # floor average
        use = (it < search_steps) & jnp.isfinite(guess) & (g_key > lo_key) & (g_key < hi_key)
        t_key = jnp.where(use, g_key, mid)
        c = count(_from_key(t_key))
        up, down = act & (c >= k), act & (c < k)
        return (jnp.where(down, t_key, lo_key), jnp.where(up, t_key, hi_key),
                jnp.where(down, c, c_lo), jnp.where(up, c, c_hi))

    def walk_pass(lo_key, hi_key, c_lo, c_hi):
        act = _active(k, lo_key, hi_key, c_lo, c_hi)
        go_up = (k - c_lo) <= (c_hi - k)
        # up: the smallest key > lo. down: the largest key <= hi, as the smallest ~key > ~hi - 1
        # (~key = -key - 1 reverses the order; an integer min is faster than XLA's float min)
        flip = jnp.where(go_up, 0, -1).astype(jnp.int32)
        bound = jnp.where(go_up, lo_key, ~hi_key - 1)[:, None, :]
        flipped = to_key(s) ^ flip[:, None, :]
        nxt = jnp.min(jnp.where(flipped > bound, flipped, _IMAX), axis=1)
        up, down = act & go_up, act & ~go_up
        return (jnp.where(up, nxt, lo_key), jnp.where(down, ~nxt - 1, hi_key),
                jnp.where(up, c_lo + 1, c_lo), jnp.where(down, c_hi - 1, c_hi))

    def cond(state):
        it, lo_key, hi_key, c_lo, c_hi = state
        n_active = jnp.sum(_active(k, lo_key, hi_key, c_lo, c_hi), dtype=jnp.int32)
        return (n_active > stop_at) & (it < max_passes)

    def body(state):
        it, lo_key, hi_key, c_lo, c_hi = state
        act = _active(k, lo_key, hi_key, c_lo, c_hi)
        width = jnp.max(jnp.where(act, jnp.minimum(k - c_lo, c_hi - k), 0))
        new = lax.cond(width <= walk_width,
                       lambda st: walk_pass(*st),
                       lambda st: count_pass(it, *st), (lo_key, hi_key, c_lo, c_hi))
        return (it + 1,) + new

    def bracket_pass(lo_key, hi_key, c_lo, c_hi):
        # counts at t0 -+ FIRST_SPREAD records by the model density; lo / hi become the nearest
        # points with c < k / c >= k
        t_a, t_b = t0 - FIRST_SPREAD / dens, t0 + FIRST_SPREAD / dens
        c_a, c_b = count(t_a), count(t_b)
        k_a, k_b = to_key(t_a), to_key(t_b)
        ok_a = jnp.isfinite(t_a) & (k_a > lo_key) & (k_a < hi_key)   # else: ignored
        ok_b = jnp.isfinite(t_b) & (k_b > lo_key) & (k_b < hi_key)
        below_a, below_b = ok_a & (c_a < k), ok_b & (c_b < k)
        above_a, above_b = ok_a & (c_a >= k), ok_b & (c_b >= k)
        lo = jnp.where(below_b, k_b, jnp.where(below_a, k_a, lo_key))
        cl = jnp.where(below_b, c_b, jnp.where(below_a, c_a, c_lo))
        hi = jnp.where(above_a, k_a, jnp.where(above_b, k_b, hi_key))
        ch = jnp.where(above_a, c_a, jnp.where(above_b, c_b, c_hi))
        return lo, hi, cl, ch

    it, lo_key, hi_key, c_lo, c_hi = state
    if first:
        lo_key, hi_key, c_lo, c_hi = bracket_pass(lo_key, hi_key, c_lo, c_hi)
        lo_key, hi_key, c_lo, c_hi = lax.fori_loop(
            1, first, lambda i, st: count_pass(it + i, *st), (lo_key, hi_key, c_lo, c_hi))
        it = it + first
    return lax.while_loop(cond, body, (it, lo_key, hi_key, c_lo, c_hi))


def kth_smallest_key(s: jax.Array, k: int, n_real: jax.Array, mean: jax.Array,
                     sd: jax.Array, *, search_steps: int = SEARCH_STEPS,
                     walk_width: int = WALK_WIDTH,
                     compact: int = COMPACT) -> tuple[jax.Array, jax.Array]:
    """A threshold key ``tau [a, q]`` with ``#{j : s_j <= tau} = min(k, n_real)`` when no tie.

    ``s [a, n, q]`` float32 scores (reduced over axis 1; absent records ``+inf``), ``n_real [a]``
    finite entries per agent, ``mean``/``sd [a, q]`` of each row's finite scores (only steer the
    first guesses; any values give the same result). Keeps per row a bracket of threshold keys
    (:func:`to_key`) ``lo < hi`` with exact counts ``c(lo) < k < c(hi)`` and narrows it:

    * count pass at ``t`` (one compare-and-count over the block): the first pass counts at two
      thresholds ``t0 -+ FIRST_SPREAD / density`` around the normal quantile
      ``t0 = mean + Phi^-1((k - 1/2)/n) sd`` (density of the normal model there); then regula
      falsi between the bracket ends in value space (or a Newton step with the normal density
      while an end is still infinite); after ``search_steps`` passes, bisection on the integer
      keys (<= 32 more);
    * walk pass, once every row is within ``walk_width`` records of the k-th: one masked min
      moves ``lo`` up to the next record (``c(lo) += 1``) or ``hi`` down below the previous one
      (``c(hi) -= 1``), whichever end is nearer.

    **Compaction**: once at most ``rows / compact`` of the block's ``a q`` rows are active, their
    scores are gathered into a ``[1, n, rows / compact]`` buffer and the passes continue on it
    alone. ``compact = 0`` never compacts.

    A row is done when ``c(lo) = k`` or ``c(hi) = k`` (``tau`` = that end), when it has ``<= k``
    records (``tau = key(float32 max)``: all of them), or when ``lo`` and ``hi`` are adjacent keys
    (a tie at the k-th: no threshold separates it). Without ties a block needs at most
    ``search_steps + 32 + walk_width`` passes; the loop is capped just above that. The counts of
    walk passes assume no tied scores; the caller verifies ``#{s <= tau}`` and falls back to an
    exact top-k if it is off, so ties and the cap never give a wrong set. Returns ``(tau [a, q]
    int32 keys, passes [])``."""
    a, n, q = s.shape
    n_real = jnp.broadcast_to(n_real[:, None], (a, q)).astype(jnp.int32)
    nf = jnp.maximum(n_real, 1).astype(jnp.float32)
    lo_key = jnp.full((a, q), to_key(jnp.float32(-jnp.inf)), jnp.int32)   # c(lo) = 0
    hi_key = jnp.full((a, q), to_key(jnp.float32(jnp.finfo(jnp.float32).max)), jnp.int32)
    c_lo, c_hi = jnp.zeros_like(n_real), n_real
    target = jnp.float32(k - 0.5)
    z = ndtri(jnp.clip(target / nf, 1e-6, 1 - 1e-6))
    t0 = mean + z * sd                                                       # normal quantile
    dens = nf * jnp.exp(-0.5 * z * z) / (math.sqrt(2 * math.pi) * jnp.maximum(sd, 1e-30))
    kw = dict(search_steps=search_steps, walk_width=walk_width,
              max_passes=search_steps + 34 + walk_width)   # bound without ties; a guard with them
    # the first count passes run without the activity check; small k walks from the start
    first = 0 if k <= walk_width else min(FIRST_COUNT_PASSES, search_steps)
    rows = a * q
    cap = rows // compact if compact else 0
    state = _passes(s, k, target, t0, dens, (jnp.int32(0), lo_key, hi_key, c_lo, c_hi),
                    stop_at=cap, first=first, **kw)
    it, lo_key, hi_key, c_lo, c_hi = state
    tau = jnp.where(c_lo == k, lo_key, hi_key)
    if not cap:
        return tau, it
    # gather the <= cap active rows (filler slots: an inactive copy of row 0) into [1, n, cap]
    act = _active(k, lo_key, hi_key, c_lo, c_hi).reshape(rows)
    idx = jnp.nonzero(act, size=cap, fill_value=rows)[0]                    # [cap]
    real = idx < rows
    src = jnp.where(real, idx, 0)

    def pick(v):
        return v.reshape(rows)[src][None, :]                                  # [1, cap]

    sc = s[src // q, :, src % q].T[None]                                     # [1, n, cap]
    sub = (it, pick(lo_key), pick(hi_key), jnp.where(real[None, :], pick(c_lo), k), pick(c_hi))
    it, lo_c, hi_c, cl_c, _ = _passes(sc, k, target, pick(t0), pick(dens), sub, stop_at=0, **kw)
    tau_c = jnp.where(cl_c == k, lo_c, hi_c)[0]
    tau = tau.reshape(rows).at[idx].set(tau_c, mode="drop").reshape(a, q)
    return tau, it


def _code_layout(k: int) -> tuple[int, int]:
    """``(bits, per)``: bits a class count takes (a count is at most ``k < 2^bits``) and classes
    per int32 word (``floor(31 / bits)``)."""
    bits = max(1, int(k).bit_length())
    return bits, max(1, 31 // bits)


def _label_codes(y: jax.Array, k: int, num_classes: int) -> tuple[jax.Array, int, int]:
    """Pack per-class counts into int32 words: ``codes [a, n, W]`` with ``bits`` bits a class.

    ``floor(31 / bits)`` classes share a word (:func:`_code_layout`), so a sum of codes over the
    chosen records holds every class count without carries."""
    bits, per = _code_layout(k)
    words = -(-num_classes // per)
    word = y // per                                                           # [a, n]
    shift = (y % per) * bits
    codes = jnp.where(word[..., None] == jnp.arange(words), jnp.left_shift(1, shift)[..., None],
                      0).astype(jnp.int32)                                    # [a, n, W]
    return codes, bits, per


def _unpack(sums: jax.Array, bits: int, per: int, num_classes: int) -> jax.Array:
    """``sums [a, q, W]`` int32 -> counts ``[a, q, C]`` float32."""
    c = jnp.arange(num_classes)
    word = sums[..., c // per]                                                # [a, q, C]
    return ((word >> ((c % per) * bits)) & ((1 << bits) - 1)).astype(jnp.float32)


def augment_records(x: jax.Array, mask: jax.Array) -> jax.Array:
    """``[a, n, d + 1]``: each record ``b`` (zeros when padded) and ``||b||^2`` (``+inf`` when
    padded), so that one GEMM with :func:`augment_queries` gives the scores."""
    sq = jnp.where(mask, jnp.sum(x * x, axis=-1), jnp.inf)                    # [a, n]
    return jnp.concatenate([jnp.where(mask[..., None], x, 0.0), sq[..., None]], axis=-1)


def augment_queries(queries: jax.Array) -> jax.Array:
    """``[q, d + 1]``: ``(-2 x_t, 1)``."""
    return jnp.concatenate([-2.0 * queries, jnp.ones((queries.shape[0], 1), queries.dtype)], 1)


def augmented_scores(xa: jax.Array, qa: jax.Array) -> jax.Array:
    """``s [a, n, q] = ||b_j||^2 - 2 <b_j, x_t>`` (``+inf`` for padded records): one GEMM
    ``[a n, d + 1] x [d + 1, q]``. ``Precision.HIGHEST``: a GPU's default TF32 rounding of
    ``||b_j||^2`` would move the ranking away from the float32 distances."""
    a, n, d1 = xa.shape
    s = jnp.dot(xa.reshape(a * n, d1), qa.T, precision=lax.Precision.HIGHEST)
    return s.reshape(a, n, -1)


def scores(x: jax.Array, mask: jax.Array, queries: jax.Array) -> jax.Array:
    """The scores the search ranks by, ``[a, n, q]``, from plain records ``x [a, n, d]``,
    ``mask [a, n]`` and ``queries [q, d]``."""
    return augmented_scores(augment_records(x, mask), augment_queries(queries))


def agent_stats(x: jax.Array, mask: jax.Array):
    """Per agent, over its real records ``b`` of ``x [a, n, d]``: ``E[b] [a, d]``,
    ``Var(b_d) [a, d]``, ``E[sq] [a]``, ``Var(sq) [a]``, ``Cov(sq, b) [a, d]`` (``sq = ||b||^2``;
    raw moments: they only steer the first guesses)."""
    m = mask.astype(jnp.float32)                                             # [a, n]
    b = jnp.where(mask[..., None], x, 0.0)                                   # [a, n, d]
    sq = jnp.sum(b * b, axis=-1)                                             # [a, n]
    cnt = jnp.maximum(jnp.sum(m, axis=1), 1.0)                               # [a]
    w = jnp.stack([m, sq], axis=1) / cnt[:, None, None]                      # [a, 2, n]
    first = jnp.einsum("awn,and->awd", w, b)                                 # E[b], E[sq b]
    mb, msqb = first[:, 0], first[:, 1]
    eb2 = jnp.einsum("an,and->ad", w[:, 0], b * b)                           # E[b^2]
    msq = jnp.sum(w[:, 1], axis=1)                                           # E[sq]
    esq2 = jnp.sum(w[:, 1] * sq, axis=1)                                     # E[sq^2]
    return (mb, jnp.maximum(eb2 - mb * mb, 0.0), msq, jnp.maximum(esq2 - msq * msq, 0.0),
            msqb - msq[:, None] * mb)


def score_moments(stats, qa: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Mean and sd ``[a, q]`` of ``s_j = sq_j - 2 <b_j, x_t>`` over each agent's records::

        mean = E[sq] - 2 E[b].x,   var = Var(sq) - 4 Cov(sq, b).x + 4 x' Cov(b) x

    with ``Cov(b)`` taken as diagonal (three tiny GEMMs, no pass over the scores). Only steers the
    first threshold guesses of :func:`kth_smallest_key`: any value is correct."""
    mb, vb, msq, vsq, csb = stats
    x = -0.5 * qa[:, :-1]                                                     # [q, d]
    mean = msq[:, None] - 2.0 * mb @ x.T
    var = vsq[:, None] - 4.0 * csb @ x.T + 4.0 * vb @ (x * x).T
    return mean, jnp.sqrt(jnp.maximum(var, 1e-30))


def topk_counts(s: jax.Array, y: jax.Array, k: int, num_classes: int) -> jax.Array:
    """Reference / fallback: ``lax.top_k`` over each row of ``s [a, n, q]`` -> ``[a, q, C]``."""
    st = jnp.transpose(s, (0, 2, 1))                                          # [a, q, n]
    kk = min(k, st.shape[-1])
    neg, idx = lax.top_k(-st, kk)                                             # [a, q, kk]
    lab = jnp.take_along_axis(jnp.broadcast_to(y[:, None, :], st.shape), idx, axis=-1)
    real = jnp.isfinite(neg).astype(jnp.float32)
    return jnp.sum(jax.nn.one_hot(lab, num_classes, dtype=jnp.float32) * real[..., None], axis=-2)


def _block_counts(xa, y, codes, n_real, stats, qa, k: int, num_classes: int,
                  search_steps: int, walk_width: int, compact: int, fix_rows: int = FIX_ROWS):
    """``[a, q, C]`` neighbour label counts of one block (its scores stay in cache).
    ``codes [a, n, W]``: :func:`_label_codes` of ``y`` (per agent block)."""
    s = augmented_scores(xa, qa)                                              # [a, n, q]
    mean, sd = score_moments(stats, qa)
    tau, _ = kth_smallest_key(s, k, n_real, mean, sd, search_steps=search_steps,
                              walk_width=walk_width, compact=compact)
    bits, per = _code_layout(k)
    chosen = s <= _from_key(tau)[:, None, :]                                  # [a, n, q]
    # one reduction for all W words
    sums = jnp.sum(jnp.where(chosen[:, :, None, :], codes[..., None], 0), axis=1)  # [a, W, q]
    sums = jnp.swapaxes(sums, 1, 2)                                           # [a, q, W]
    counts = _unpack(sums, bits, per, num_classes)                            # [a, q, C]
    # rows without exactly min(k, n_i) chosen (a tie at the k-th) get the exact top-k: up to
    # rows / fix_rows of them alone, more by the whole block
    bad = jnp.sum(counts, -1) != jnp.minimum(k, n_real)[:, None].astype(jnp.float32)  # [a, q]
    n_bad = jnp.sum(bad, dtype=jnp.int32)
    cap = max(1, bad.size // fix_rows)

    def fix(c):
        return lax.cond(n_bad <= cap,
                        lambda c: _topk_rows(c, s, y, bad, k, num_classes, cap),
                        lambda c: topk_counts(s, y, k, num_classes), c)
    return lax.cond(n_bad == 0, lambda c: c, fix, counts)


def _topk_rows(counts: jax.Array, s: jax.Array, y: jax.Array, bad: jax.Array, k: int,
               num_classes: int, cap: int) -> jax.Array:
    """``counts [a, q, C]`` with the (at most ``cap``) rows marked in ``bad [a, q]`` replaced by
    :func:`topk_counts` of those rows alone: their scores ``[cap, n]`` are gathered, ranked by
    ``lax.top_k`` (ties: lower index first) and their counts scattered back; the other rows
    keep theirs (exactly ``min(k, n_i)`` scores at or below the threshold: top-k's set)."""
    a, n, q = s.shape
    rows = a * q
    idx = jnp.nonzero(bad.reshape(rows), size=cap, fill_value=rows)[0]       # [cap]
    src = jnp.where(idx < rows, idx, 0)
    ai, qi = src // q, src % q
    fixed = topk_counts(s[ai, :, qi][:, :, None], y[ai], k, num_classes)[:, 0]   # [cap, C]
    return counts.reshape(rows, -1).at[idx].set(fixed, mode="drop").reshape(counts.shape)


def block_sizes(a: int, n: int, q: int, device_defaults=None) -> tuple[int, int]:
    """Target ``(agent_block, query_block)`` of :func:`neighbour_label_counts` for ``a`` agents
    of ``n`` records and ``q`` queries on the device of ``device_defaults``
    (:func:`fedjax_dp.core.defaults.defaults`, the default device's when None):

    * CPU: ``(AGENT_BLOCK, QUERY_BLOCK)``, a block whose scores stay in cache across the passes;
    * accelerator: one wide block (every pass one kernel over all its rows), ``query_block = q``
      and ``agent_block = a`` when ``WIDE_BLOCK_COPIES * 4 a n q`` bytes fit the device's
      ``chunk_budget_bytes`` (None: always), else the most agents that fit (and fewer queries
      when one agent's row of all queries does not fit).
    """
    if device_defaults is None:
        from fedjax_dp.core import defaults as defaults_lib
        device_defaults = defaults_lib.defaults()
    if not device_defaults.accelerator:
        return AGENT_BLOCK, QUERY_BLOCK
    budget = device_defaults.chunk_budget_bytes
    if budget is None:
        return max(1, a), max(1, q)
    per_row = WIDE_BLOCK_COPIES * 4 * max(1, n)          # bytes per (agent, query) row
    qb = max(1, min(q, budget // per_row))
    if qb < q:
        qb = max(64, qb // 64 * 64)                          # multiples of 64: faster GEMMs
    ab = max(1, min(a, budget // (per_row * qb)))
    return ab, qb


def agent_block_size(a: int, target: int) -> int:
    """Agents per block: ``target`` if it divides ``a``, else a divisor in ``[target/2, target]``
    (no padding), else ``target`` (the last block is padded)."""
    target = max(1, min(target, a))
    for b in range(target, max(1, target // 2) - 1, -1):
        if a % b == 0:
            return b
    return target


def query_block_size(q: int, target: int) -> int:
    """Queries per block: all ``q`` if ``q <= target``; else the multiple of 64 in
    ``[64, target]`` that pads ``q`` least (ties: the larger), else ``target`` (the scores GEMM is
    faster per query at multiples of 64, which outweighs a few padded queries)."""
    if q <= target:
        return max(1, q)
    sizes = list(range(64, target + 1, 64))
    if not sizes:
        return max(1, target)
    return min(sizes, key=lambda b: (-(-q // b) * b, -b))


def neighbour_label_counts(x: jax.Array, y: jax.Array, mask: jax.Array, queries: jax.Array,
                           k: int, num_classes: int, *, agent_block: int | None = None,
                           query_block: int | None = None, search_steps: int = SEARCH_STEPS,
                           walk_width: int = WALK_WIDTH, compact: int = COMPACT,
                           fix_rows: int = FIX_ROWS) -> jax.Array:
    """Per agent and query, how many of the agent's k nearest records carry each label.

    ``x [a, n, d]``, ``y [a, n]`` int, ``mask [a, n]`` (real records), ``queries [q, d]`` -> ``[a,
    q, C]`` float32 counts (each row sums to ``min(k, n_i)``). Squared Euclidean distance; ties
    broken by lower record index (as ``lax.top_k``). Blocks of ``agent_block`` x ``query_block``
    (None: :func:`block_sizes`); the result does not depend on the block sizes. A block's rows with
    a tie at the k-th are redone with ``lax.top_k`` alone while they are at most one in
    ``fix_rows``, else the whole block (the same counts either way)."""
    a, n, d = x.shape
    q = queries.shape[0]
    if agent_block is None or query_block is None:
        auto_ab, auto_qb = block_sizes(a, n, q)
        agent_block = auto_ab if agent_block is None else agent_block
        query_block = auto_qb if query_block is None else query_block
    ab = agent_block_size(a, int(agent_block))
    qb = query_block_size(q, int(query_block))
    # padded agents have no real records: zero counts, sliced off below
    x, y, mask = pad_rows((x, y, mask), ab)
    qblocks = chunked(augment_queries(pad_rows(queries, qb)), qb)          # [q/qb, qb, d+1]

    def per_agent_block(blk):
        xb, yb, mb, stats = blk
        xa = augment_records(xb, mb)                                          # [ab, n, d+1]
        n_real = jnp.sum(mb, axis=1, dtype=jnp.int32)
        codes = _label_codes(yb, k, num_classes)[0]                          # [ab, n, W]

        def per_query_block(qa):
            return _block_counts(xa, yb, codes, n_real, stats, qa, k, num_classes,
                                 search_steps, walk_width, compact, fix_rows)

        out = lax.map(per_query_block, qblocks)                               # [q/qb, ab, qb, C]
        return jnp.transpose(out, (1, 0, 2, 3)).reshape(ab, -1, num_classes)

    out = lax.map(per_agent_block, chunked((x, y, mask, agent_stats(x, mask)), ab))
    return out.reshape((-1,) + out.shape[2:])[:a, :q]                       # out [na, ab, Qp, C]
