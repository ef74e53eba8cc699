"""Clipping to a global L2 norm, written once (:func:`clip_by_global_norm`), and the clipped sums.

    clip_C(v) = v min(1, C / ||v||_2)            S = sum_j b_j clip_C(v(x_j))               (1)

``||.||_2`` is the GLOBAL L2 norm over all leaves of the pytree ``v``, so adding or removing one
record moves ``S`` by at most C (the Gaussian mechanism's sensitivity; clipping leaves separately
would understate it by up to sqrt(#leaves)). ``v(x_j)`` is a per-example vector pytree (usually
``grad_w loss(w; x_j, y_j)``; a record is one example, or one whole sequence ``x_j, y_j [T]``
whose loss is its per-token mean, so the unit of privacy stays the record). :func:`clipped_sum`
computes only the selected rows (:mod:`fedjax_dp.privacy.batch_selection`).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

from fedjax_dp.privacy.batch_selection import RowPlan, for_selected
from fedjax_dp.privacy.noise import check_scale, float_dtype

Params = Any

__all__ = ["clip_by_global_norm", "weighted_clipped_sum", "masked_clipped_sum", "clipped_sum",
           "per_example_grads", "clipped_grad_sum"]


def _factor(norm: jax.Array, max_norm) -> jax.Array:
    """``min(1, C / norm)``, and 1 at ``norm = 0`` (no division by zero, finite gradients)."""
    positive = norm > 0
    return jnp.where(positive, jnp.minimum(1.0, max_norm / jnp.where(positive, norm, 1.0)), 1.0)


def clip_by_global_norm(tree: Any, max_norm) -> tuple[Any, jax.Array]:
    """Scale a pytree so its global L2 norm is at most ``max_norm``.

    ``||tree||_2 = sqrt(sum over all leaves and coordinates of x^2)`` (one norm for the whole
    pytree, not per leaf); the result is ``tree * min(1, max_norm / ||tree||_2)``, and the zero
    tree is returned unchanged (scale 1, no division by zero, finite gradients).

    Returns ``(clipped_tree, norm)`` with ``norm`` the *original* global norm (a float scalar).
    Bounds the L2 sensitivity of a sum of clipped contributions by ``max_norm`` (add/remove one
    contribution) or ``2 * max_norm`` (replace one). ``max_norm`` finite ``>= 0``. Use
    ``jax.vmap(clip_by_global_norm, in_axes=(0, None))`` for per-agent / per-example clipping."""
    check_scale("max_norm", max_norm)
    return _clip_by_global_norm(tree, max_norm)


@jax.jit
def _clip_by_global_norm(tree: Any, max_norm) -> tuple[Any, jax.Array]:
    leaves = jax.tree_util.tree_leaves(tree)
    sq = jnp.zeros((), jnp.result_type(float))
    for leaf in leaves:
        leaf = jnp.asarray(leaf)
        acc = jnp.promote_types(leaf.dtype, jnp.float32)
        sq = sq + jnp.sum(jnp.square(leaf.astype(acc))).astype(sq.dtype)
    positive = sq > 0
    norm = jnp.where(positive, jnp.sqrt(jnp.where(positive, sq, 1.0)), 0.0)
    scale = _factor(norm, max_norm)

    def clip(x):
        x = jnp.asarray(x)
        return (x * scale).astype(float_dtype(x.dtype))

    return jax.tree.map(clip, tree), norm


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
    scale = weights * _factor(norms, clip)                                      # s [B]
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


def per_example_grads(loss_fn: Callable, params: Params, x: jax.Array, y: jax.Array) -> Params:
    """``vmap(grad(loss_fn))`` over EVERY row: a pytree whose leaves have leading axis B."""
    return jax.vmap(jax.grad(loss_fn), in_axes=(None, 0, 0))(params, x, y)


def clipped_grad_sum(loss_fn: Callable, params: Params, x: jax.Array, y: jax.Array,
                     weights: jax.Array, clip_norm) -> tuple[Params, jax.Array]:
    """Reference of (1) for gradients: ``(sum_b w_b clip_C(grad loss(params; x_b, y_b)),
    norms [B] before clipping)`` computed for every row (cost B; :func:`clipped_sum` computes
    only the selected rows)."""
    return weighted_clipped_sum(per_example_grads(loss_fn, params, x, y), weights, clip_norm)


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
    (total, aux_sum, clipped), count = for_selected(per_pass, init, weights, plan)
    return total, _stats(count, clipped, aux_sum)
