"""Per-example clipped gradients for DP-SGD-style algorithms.

For examples b = 1..B with gradients g_b (whole parameter pytrees), the clipped sum is

    sum_b w_b * g_b * min(1, S / ||g_b||_2)

where ||.||_2 is the GLOBAL L2 norm over every leaf of the pytree (not per tensor: clipping tensors
separately understates the sensitivity by up to sqrt(#tensors)). Each clipped term has norm <= S,
so adding or removing one example changes the sum by at most S in L2 (the Gaussian mechanism's
sensitivity); ``w_b`` in {0, 1} masks padded or unsampled examples.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

Params = Any


def per_example_grads(loss_fn: Callable, params: Params, x: jax.Array, y: jax.Array) -> Params:
    """``vmap(grad(loss_fn))``: a pytree whose leaves have leading axis B."""
    return jax.vmap(jax.grad(loss_fn), in_axes=(None, 0, 0))(params, x, y)


def clipped_grad_sum(loss_fn: Callable, params: Params, x: jax.Array, y: jax.Array,
                     weights: jax.Array, clip_norm: float):
    """Sum of per-example gradients clipped to global L2 norm ``clip_norm``.

    Args:
      loss_fn: per-example loss ``loss_fn(params, x, y) -> scalar``.
      x: [B, ...] examples; y: [B] labels; weights: [B] (0/1 mask of the examples that count).
    Returns:
      (clipped sum pytree, per-example norms before clipping [B]).
    """
    grads = per_example_grads(loss_fn, params, x, y)
    norms = jax.vmap(optax.tree.norm)(grads)                                # [B]
    scale = weights * jnp.minimum(1.0, clip_norm / jnp.maximum(norms, 1e-12))  # [B]
    summed = jax.tree.map(lambda g: jnp.tensordot(scale.astype(g.dtype), g, axes=(0, 0)), grads)
    return summed, norms
