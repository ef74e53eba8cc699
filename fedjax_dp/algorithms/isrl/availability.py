"""Silo availability (ISRL-DP paper, Assumption 3): each round a uniformly random subset S_r of
exactly M of the N silos receives the model and may send messages.

Drawn as a mask over the stacked silo axis from the round's key: the M silos with the smallest
i.i.d. uniform scores (a uniformly random M-subset: every M-subset has the same probability by
exchangeability). No Python list of silos; ``M`` is static so the round compiles once.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_dp.core import validation


def check(num_available: int, num_silos: int) -> int:
    """``1 <= M <= N`` (raises naming ``algorithm.num_available``)."""
    return validation.check_int("algorithm.num_available", num_available, minimum=1,
                                maximum=int(num_silos))


def available_mask(key: jax.Array, num_silos: int, num_available: int) -> jax.Array:
    """``[N]`` float32 in {0, 1} with exactly M ones at a uniformly random subset of silos."""
    if num_available >= num_silos:
        return jnp.ones((num_silos,), jnp.float32)
    scores = jax.random.uniform(key, (num_silos,))                          # [N]
    ranks = jnp.argsort(jnp.argsort(scores))                                # [N] in 0..N-1
    return (ranks < num_available).astype(jnp.float32)
