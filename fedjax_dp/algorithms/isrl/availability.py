"""Silo availability (ISRL-DP paper, Assumption 3): each round a uniformly random subset S_r of
exactly M of the N silos receives the model and may send messages.

Drawn from the round's key: the M silos with the smallest i.i.d. uniform scores (a uniformly
random M-subset: every M-subset has the same probability by exchangeability), as M indices
(:func:`available_ids`, what the gathered round trains) or as a mask over the stacked silo axis
(:func:`available_mask`, the masked reference round). ``M`` is static: one compilation.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_dp.core import validation


def check(num_available: int, num_silos: int) -> int:
    """``1 <= M <= N`` (raises naming ``algorithm.num_available``)."""
    return validation.check_int("algorithm.num_available", num_available, minimum=1,
                                maximum=int(num_silos))


def available_ids(key: jax.Array, num_silos: int, num_available: int) -> jax.Array:
    """``[M]`` int32, ascending: the indices of the M silos with the smallest scores (ties: lower
    index first), i.e. the silos a round gathers. ``M`` is static: a fixed-shape gather."""
    if num_available >= num_silos:
        return jnp.arange(num_silos, dtype=jnp.int32)
    scores = jax.random.uniform(key, (num_silos,))                          # [N]
    # top_k of -scores: the M smallest (partial selection); ties: lower index first
    _, smallest = jax.lax.top_k(-scores, num_available)                     # [M]
    return jnp.sort(smallest).astype(jnp.int32)                             # [M]


def available_mask(key: jax.Array, num_silos: int, num_available: int) -> jax.Array:
    """``[N]`` float32 in {0, 1} with exactly M ones, at :func:`available_ids` (same key, same
    silos: the masked reference round selects the silos the gathered round trains)."""
    ids = available_ids(key, num_silos, num_available)
    return jnp.zeros((num_silos,), jnp.float32).at[ids].set(1.0)
