"""The private-gradient primitive: record selection, per-example clipping, sum, noise, event.

In the spirit of jax_privacy, which keeps batch selection apart from ``clipped_grad``, one
release of ONE party (a DP-FedSGD agent's local step, an ISRL silo's upload, a DP-FNAS party's
half) is four small pure parts:

    b        = select(k_batch, mask)                                    selection, b [n] in {0, 1}
               Poisson:    b_j = Bernoulli(q)_j & mask_j                 (padding rows never)
               fixed size: a uniformly random m-subset of the real rows
    S        = sum_j b_j clip_C(v(x_j)),  clip_C(v) = v min(1, C / ||v||_2)    clipped sum    (1)
    release  = (S + N(0, (z C)^2 I)) / D                                 noise; D = the FIXED
                                                                         expected batch q n
    event    = PoissonSampled(q, Gaussian(z))                            dp-accounting event
               (fixed size: SampledWithoutReplacement(n, m, Gaussian(z)))

``v(x_j)`` is a per-example vector pytree (usually ``grad_w loss(w; x_j, y_j)``, the whole
parameter vector; a record j is one example: one labelled feature vector, or for a next-token
task one whole sequence ``x_j, y_j [T]`` whose loss is its per-token mean,
:mod:`fedjax_dp.models.tasks`, so the unit of privacy stays the record) and ``||.||_2`` is
the GLOBAL L2 norm over all its leaves, so adding or removing one record moves ``S`` by at most
C (the Gaussian mechanism's sensitivity; clipping leaves separately would understate it by up to
sqrt(#leaves)). ``D`` never depends on the realised batch size ``|b|``, which would leak it.

Cost ~ the sample, not the party. Only the selected rows are computed (:func:`clipped_sum`):
their indices are moved to the front (order kept), and a static :class:`RowPlan` gathers them
in padded passes, a first pass of ``first`` rows (about ``qn + 2 sqrt(qn)``) then, while any
selected row is left, further passes of ``step`` rows. The padded capacity falls to the next
bucket ``first + k step`` (k = 0, 1, ...) that holds the draw: a large draw is never truncated.
Under ``vmap`` over parties (or seeds) the loop runs to the largest party's draw. The result
equals the masked sum over all ``n`` rows (:func:`masked_clipped_sum`) up to float summation
order (tested). Gradients are taken for ``~ q n`` rows instead of ``n``; what stays O(n) is the
selection itself (n coin flips and an index compaction), no gradient work. When a pass would
hold every row anyway (no plan, or ``first >= n``), the rows are computed in place with their
weights: no compaction and no gather; and a rate of 1 draws no coins.

The clip of a pass (:func:`weighted_clipped_sum`): every leaf's rows as a matrix
``V_l [B, P_l]``, the global norms ``||V_b||_2`` from them, the factors
``s_b = b_b min(1, C / ||V_b||_2)``, and ``S_l = s^T V_l`` by one contraction over the rows per
leaf: the clipped rows ``s_b V_b`` are never formed.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence

import dp_accounting
import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from fedjax_dp.privacy import accounting, mechanisms

Params = Any

__all__ = ["per_example_bytes", "RowPlan", "poisson_weights", "fixed_size_weights",
           "weighted_clipped_sum", "clipped_sum", "per_example_grads", "clipped_grad_sum",
           "masked_clipped_sum", "selected_rows", "add_noise", "release", "gradient_fn",
           "private_gradient", "poisson_event", "fixed_size_event"]


# --------------------------------------------------------------------------- selection

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


# --------------------------------------------------------------------------- plan

@dataclasses.dataclass(frozen=True)
class RowPlan:
    """Static shapes of the selected-rows loop (see the module docstring).

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


# --------------------------------------------------------------------------- clipping

def weighted_clipped_sum(values: Params, weights: jax.Array, clip) -> tuple[Params, jax.Array]:
    """``(sum_b w_b v_b min(1, C / ||v_b||_2), norms [B])`` for rows ``values`` (a pytree with
    leading axis B; global L2 norm per row) and weights ``w [B]``: the clipped sum (1) of rows
    already computed (one pass of :func:`clipped_sum`). Each leaf is read as a matrix
    ``V_l [B, P_l]`` (a free reshape) and::

        norms_b = sqrt(sum_l sum_p V_l[b, p]^2)      s = w min(1, C / norms)      S_l = s^T V_l

    the norms and the sum from the same matrices, the sum as one contraction over the rows per
    leaf at full float32 precision: the clipped rows ``s_b V_b`` are never formed, and a leaf's
    rows are formed once (reading a ``[B, d_in, d_out]`` gradient in two layouts, for the norm
    and for the contraction, made XLA form a dense layer's per-example outer products twice)."""
    leaves, treedef = jax.tree.flatten(values)
    b = leaves[0].shape[0]
    mats = [l.reshape(b, -1) for l in leaves]                                   # V_l [B, P_l]
    sq = sum(jnp.sum(jnp.square(m), axis=1, dtype=jnp.promote_types(m.dtype, jnp.float32))
             for m in mats)                                                     # [B]
    norms = jnp.sqrt(sq)                                                        # [B]
    scale = weights * jnp.minimum(1.0, clip / jnp.maximum(norms, 1e-12))        # s [B]
    total = [jnp.dot(scale.astype(m.dtype), m, precision=jax.lax.Precision.HIGHEST)
             .reshape(l.shape[1:]) for m, l in zip(mats, leaves)]               # S_l
    return jax.tree.unflatten(treedef, total), norms


def _stats(count, clipped, aux) -> dict:
    return {"count": count.astype(jnp.float32), "clipped": clipped, "aux": aux}


def masked_clipped_sum(per_example_fn: Callable, data: Sequence[jax.Array], weights: jax.Array,
                       clip) -> tuple[Params, dict]:
    """Reference of (1): ``per_example_fn`` on EVERY row, the unselected masked out (cost n).

    ``per_example_fn(*row) -> (vector pytree, aux scalar)``; ``data``: arrays with leading axis
    n; ``weights [n]``. Returns ``(S, {"count", "clipped", "aux"})`` with ``clipped`` the number
    of selected rows whose norm exceeds ``clip`` and ``aux = sum_j b_j aux_j``."""
    values, aux = jax.vmap(per_example_fn)(*data)
    total, norms = weighted_clipped_sum(values, weights, clip)
    return total, _stats(jnp.sum(weights > 0), jnp.sum(weights * (norms > clip)),
                         jnp.sum(weights * aux))


def per_example_bytes(params: Params, max_records: int) -> int:
    """One agent's working set in a private-gradient step, for sizing chunks of agents
    (:func:`fedjax_dp.core.lift.resolve_chunk_size`): its per-example gradients (``max_records``
    copies of the parameters) plus parameters, gradient and update (3 copies)."""
    from fedjax_dp.core.lift import agent_bytes
    return (max_records + 3) * agent_bytes(params)


def per_example_grads(loss_fn: Callable, params: Params, x: jax.Array, y: jax.Array) -> Params:
    """``vmap(grad(loss_fn))`` over EVERY row: a pytree whose leaves have leading axis B."""
    return jax.vmap(jax.grad(loss_fn), in_axes=(None, 0, 0))(params, x, y)


def clipped_grad_sum(loss_fn: Callable, params: Params, x: jax.Array, y: jax.Array,
                     weights: jax.Array, clip_norm) -> tuple[Params, jax.Array]:
    """Reference of (1) for gradients: ``(sum_b w_b clip_C(grad loss(params; x_b, y_b)),
    norms [B] before clipping)`` computed for every row (cost B; :func:`clipped_sum` computes
    only the selected rows)."""
    return weighted_clipped_sum(per_example_grads(loss_fn, params, x, y), weights, clip_norm)


def _selected_index(weights: jax.Array, length: int) -> tuple[jax.Array, jax.Array]:
    """``(idx [length] int32, count [])``: the selected rows' indices in order, then row 0."""
    n = weights.shape[0]
    sel = weights > 0
    idx = jnp.nonzero(sel, size=n, fill_value=0)[0].astype(jnp.int32)         # [n]
    return jnp.pad(idx, (0, length - n)), jnp.sum(sel.astype(jnp.int32))


def _passes(plan: RowPlan, n: int) -> tuple[int, int]:
    """``(first, length)``: the first pass's rows (<= n) and the padded index length."""
    first = min(plan.first, n)
    rest = n - first
    return first, first + -(-rest // plan.step) * plan.step


def _for_selected(per_pass: Callable, carry, weights: jax.Array, plan: RowPlan):
    """Fold ``per_pass(carry, rows [B] int32, w [B])`` over the selected rows in padded passes
    (``w`` = the rows' weights, 0 on padding). The loop stops after the last selected row."""
    n = weights.shape[0]
    first, length = _passes(plan, n)
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


def clipped_sum(per_example_fn: Callable, data: Sequence[jax.Array], weights: jax.Array, clip,
                plan: RowPlan | None) -> tuple[Params, dict]:
    """Equation (1) over the selected rows only: ``(S, {"count", "clipped", "aux"})``.

    ``per_example_fn(*row) -> (vector pytree, aux scalar)`` for one row of ``data`` (arrays with
    leading axis n); ``weights [n]`` (0 = not selected); ``clip`` C (``inf``: no clipping);
    ``plan``: the padded passes (None: one pass over all rows). A plan whose first pass holds
    all ``n`` rows computes every row in place, weighted (:func:`masked_clipped_sum`: no index
    compaction, no gather). Same value as :func:`masked_clipped_sum` up to summation order."""
    n = weights.shape[0]
    plan = plan or RowPlan(first=n, step=max(1, n))
    if plan.first >= n:
        # one pass over every row anyway: no index compaction and no gather, the unselected
        # rows weigh 0 (the masked sum itself, the same terms in the same order)
        return masked_clipped_sum(per_example_fn, data, weights, clip)
    shapes = jax.eval_shape(per_example_fn, *[a[0] for a in data])[0]
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

    def per_pass(carry, rows, w):
        total, aux_sum, clipped = carry
        values, aux = jax.vmap(per_example_fn)(*[jnp.take(a, rows, axis=0) for a in data])
        part, norms = weighted_clipped_sum(values, w, clip)
        return (jax.tree.map(jnp.add, total, part), aux_sum + jnp.sum(w * aux),
                clipped + jnp.sum(w * (norms > clip)))

    init = (zeros, jnp.zeros(()), jnp.zeros(()))
    (total, aux_sum, clipped), count = _for_selected(per_pass, init, weights, plan)
    return total, _stats(count, clipped, aux_sum)


def selected_rows(per_example_fn: Callable, data: Sequence[jax.Array], weights: jax.Array,
                  plan: RowPlan | None) -> tuple[Params, jax.Array]:
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

    return _for_selected(per_pass, out, weights, plan)[0]


# --------------------------------------------------------------------------- noise

def add_noise(key: jax.Array, tree: Params, std, *, per_leaf: bool = False) -> Params:
    """``tree + N(0, std^2 I)`` over every coordinate.

    ``per_leaf=False``: ONE flat draw ``std * normal(key, [d])`` over the raveled tree (one
    PRNG call; compiles faster). ``per_leaf=True``: one key per leaf
    (:func:`fedjax_dp.privacy.mechanisms.gaussian_noise` of the tree). Both are i.i.d.
    ``N(0, std^2)`` per coordinate; they differ only in the random stream."""
    if per_leaf:
        return jax.tree.map(jnp.add, tree, mechanisms.gaussian_noise(key, tree, std))
    flat, unravel = ravel_pytree(tree)
    return unravel(flat + mechanisms.gaussian_noise(key, flat.shape, std))


def release(key: jax.Array, total: Params, std, denominator, *, noise: bool = True,
            per_leaf: bool = False) -> Params:
    """``(S + N(0, std^2 I)) / D`` (``noise=False``: ``S / D``, the non-private baselines)."""
    if noise:
        total = add_noise(key, total, std, per_leaf=per_leaf)
    return jax.tree.map(lambda s: s / denominator, total)


# --------------------------------------------------------------------------- composed

def gradient_fn(loss_fn: Callable, params: Params) -> Callable:
    """``v(x, y) = (grad_w loss_fn(params, x, y), 0)``: the per-example gradient of the whole
    parameter pytree, in the ``per_example_fn`` form of :func:`clipped_sum`."""
    grad = jax.grad(loss_fn)
    return lambda x, y: (grad(params, x, y), jnp.zeros(()))


def private_gradient(key: jax.Array, loss_fn: Callable, params: Params, x: jax.Array,
                     y: jax.Array, mask: jax.Array, rate, denominator, clip, noise_std, *,
                     plan: RowPlan | None, private: bool = True,
                     per_leaf_noise: bool = False) -> tuple[Params, dict]:
    """One DP-SGD gradient release of one party (the whole primitive):

        k_batch, k_noise = split(key)
        b = poisson_weights(k_batch, mask, rate)                                     [n]
        g = ( sum_j b_j clip_C(grad loss(params; x_j, y_j)) + N(0, std^2 I) ) / D

    ``x [n, ...]``, ``y [n]`` (sequences: ``[n, T]``), ``mask [n]``; ``private=False``: no
    clipping and no noise.
    Event (one release): :func:`poisson_event` ``(std / C, rate)``.
    Returns ``(g, {"count", "clipped", "aux"})``."""
    k_batch, k_noise = jax.random.split(key)
    weights = poisson_weights(k_batch, mask, rate)                                # [n]
    total, stats = clipped_sum(gradient_fn(loss_fn, params), (x, y), weights,
                               clip if private else jnp.inf, plan)
    if not private:
        stats = {**stats, "clipped": jnp.zeros(())}
    return release(k_noise, total, noise_std, denominator, noise=private,
                   per_leaf=per_leaf_noise), stats


# --------------------------------------------------------------------------- accounting

def poisson_event(noise_multiplier: float, rate: float, steps: int = 1):
    """``SelfComposed(PoissonSampled(q, Gaussian(z)), steps)`` (q = 1: no sampling wrapper):
    the event of ``steps`` Poisson releases with noise std ``z C``. Relation: add/remove one
    record."""
    return accounting.sampled_gaussian_event(noise_multiplier, rate, steps)


def fixed_size_event(noise_multiplier: float, num_records: int, size: int, steps: int = 1):
    """``SelfComposed(SampledWithoutReplacement(n, m, Gaussian(z)), steps)``: fixed-size
    selection of ``m`` of ``n`` records. Relation: replace one record (dp-accounting's relation
    for this event; a replaced record moves the clipped sum by up to 2C, so ``z`` is the noise
    std over 2C)."""
    event = dp_accounting.SampledWithoutReplacementDpEvent(
        int(num_records), int(size), dp_accounting.GaussianDpEvent(float(noise_multiplier)))
    return event if steps == 1 else dp_accounting.SelfComposedDpEvent(event, int(steps))
