"""Record selection for one release, and the loop over the selected rows only.

    b = select(k_batch, mask)                                         b [n] in {0, 1}
        Poisson:    b_j = Bernoulli(q)_j & mask_j                     (padding rows never)
        fixed size: a uniformly random m-subset of the real rows

Cost ~ the sample, not the party: the selected rows' indices are moved to the front (order kept)
and a static :class:`RowPlan` gathers them in padded passes, a first pass of ``first`` rows
(about ``qn + 2 sqrt(qn)``) then, while any selected row is left, passes of ``step`` rows. The
padded capacity is the next bucket ``first + k step`` (k = 0, 1, ...) that holds the draw: a
large draw is never truncated. Under ``vmap`` over parties (or seeds) the loop runs to the
largest party's draw. What stays O(n) is the selection itself (n coin flips and an index
compaction), no per-row work; a rate of 1 draws no coins.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

__all__ = ["poisson_weights", "fixed_size_weights", "RowPlan", "for_selected", "selected_rows"]


def poisson_weights(key: jax.Array, mask: jax.Array, rate) -> jax.Array:
    """Poisson selection: ``b [n]`` float32, ``b_j = Bernoulli(rate)_j & mask_j``.

    Every real row (``mask`` true) is included independently with probability ``rate``; padding
    rows never. One ``bernoulli(key, rate, [n])`` draw, so the same key selects the same rows
    whatever is computed from them. A Python ``rate >= 1`` (every row, as full-batch DP-SGD)
    draws nothing: ``Bernoulli(1)`` is always 1, so ``b = mask``, the value of the draw."""
    if isinstance(rate, (int, float)) and not isinstance(rate, bool) and rate >= 1:
        return mask.astype(bool).astype(jnp.float32)
    keep = jax.random.bernoulli(key, rate, mask.shape)
    return (keep & mask.astype(bool)).astype(jnp.float32)


def fixed_size_weights(key: jax.Array, mask: jax.Array, size: int) -> jax.Array:
    """Fixed-size selection: ``b [n]`` float32 with ``b_j = 1`` on a uniformly random subset of
    ``min(size, #real rows)`` real rows (the ``size`` smallest of i.i.d. uniform scores; padding
    rows score +inf)."""
    n = mask.shape[0]
    if not 0 < size <= n:
        raise ValueError(f"size must be in [1, {n}] (the padded rows), got {size}")
    scores = jnp.where(mask.astype(bool), jax.random.uniform(key, (n,)), jnp.inf)     # [n]
    chosen = jnp.argsort(scores)[:size]                                               # [size]
    weights = jnp.zeros((n,), jnp.float32).at[chosen].set(1.0)
    return weights * mask.astype(jnp.float32)


@dataclasses.dataclass(frozen=True)
class RowPlan:
    """Static shapes of the selected-rows loop (module docstring).

    first: rows gathered unconditionally (0: none); step: rows of each further pass (>= 1).
    The padded capacity is the smallest ``first + k step >= |b|``.
    """

    first: int
    step: int

    def __post_init__(self):
        if self.first < 0 or self.step < 1:
            raise ValueError(f"RowPlan needs first >= 0 and step >= 1, got first={self.first}, "
                             f"step={self.step}")

    @classmethod
    def for_expected(cls, expected: float, num_rows: int) -> "RowPlan":
        """The plan for an expected draw of ``expected`` rows of ``num_rows``:
        ``first = min(n, ceil(mu + 2 sqrt(mu)))`` with ``mu = min(expected, n)`` (a Poisson draw
        exceeds it with probability ~2%), ``step = ceil(first / 4)``."""
        if not expected >= 0 or num_rows < 1:
            raise ValueError(f"expected must be >= 0 and num_rows >= 1, got {expected}, "
                             f"{num_rows}")
        mu = min(float(expected), float(num_rows))
        first = max(1, min(num_rows, math.ceil(mu + 2.0 * math.sqrt(mu))))
        return cls(first=first, step=max(1, math.ceil(first / 4)))


def _selected_index(weights: jax.Array, length: int) -> tuple[jax.Array, jax.Array]:
    """``(idx [length] int32, count [])``: the selected rows' indices in order, then row 0."""
    n = weights.shape[0]
    sel = weights > 0
    idx = jnp.nonzero(sel, size=n, fill_value=0)[0].astype(jnp.int32)         # [n]
    return jnp.pad(idx, (0, length - n)), jnp.sum(sel.astype(jnp.int32))


def for_selected(per_pass: Callable, carry, weights: jax.Array, plan: RowPlan):
    """Fold ``per_pass(carry, rows [B] int32, w [B])`` over the selected rows in padded passes
    (``w`` = the rows' weights, 0 on padding). The loop stops after the last selected row."""
    n = weights.shape[0]
    first = min(plan.first, n)                                   # the first pass's rows
    length = first + -(-(n - first) // plan.step) * plan.step    # the padded index length
    idx, count = _selected_index(weights, length)

    def one(carry, start, size):
        pos = start + jnp.arange(size, dtype=jnp.int32)                       # [B]
        rows = jax.lax.dynamic_slice_in_dim(idx, start, size)                  # [B]
        w = jnp.where(pos < count, jnp.take(weights, rows), 0.0)               # [B]
        return per_pass(carry, rows, w)

    if first:
        carry = one(carry, jnp.int32(0), first)
    if length > first:
        step = plan.step

        def body(state):
            j, c = state
            return j + 1, one(c, first + j * step, step)

        carry = jax.lax.while_loop(lambda s: first + s[0] * step < count, body,
                                   (jnp.zeros((), jnp.int32), carry))[1]
    return carry, count


def selected_rows(per_example_fn: Callable, data: Sequence[jax.Array], weights: jax.Array,
                  plan: RowPlan | None) -> tuple[Any, jax.Array]:
    """``(v [n, ...], aux [n])``: ``per_example_fn(*row) -> (vector pytree, aux scalar)`` at the
    selected rows, zeros elsewhere (for a protocol that needs the rows themselves, e.g. the
    shuffle model's per-record reports); only the selected rows are computed."""
    n = weights.shape[0]
    plan = plan or RowPlan(first=n, step=max(1, n))
    shapes = jax.eval_shape(per_example_fn, *[a[0] for a in data])
    out = jax.tree.map(lambda s: jnp.zeros((n,) + tuple(s.shape), s.dtype), shapes)

    def per_pass(buf, rows, w):
        values = jax.vmap(per_example_fn)(*[jnp.take(a, rows, axis=0) for a in data])
        keep = w > 0

        def put(b, v):
            k = keep.reshape((-1,) + (1,) * (v.ndim - 1))
            return b.at[rows].add(jnp.where(k, v, jnp.zeros((), v.dtype)))
        return jax.tree.map(put, buf, values)

    return for_selected(per_pass, out, weights, plan)[0]
