"""The randomized Hadamard rotation of distributed DP (Kairouz, Liu, Steinke ICML 2021, Section
4.1; Agarwal, Kairouz, Liu NeurIPS 2021, Section 4): ``U x = H D x / sqrt(d')`` with ``x`` zero-padded
to ``d' = 2^ceil(log2 d)`` coordinates, ``D`` a diagonal of random signs (public randomness, one
draw per round shared by every client) and ``H`` the d' x d' Walsh-Hadamard matrix (entries +-1).

``U`` is orthogonal, so ``||U x||_2 = ||x||_2`` (the clip's norm bound survives), and it spreads a
vector's mass over all coordinates (each coordinate of ``U x`` is sub-Gaussian with variance
``||x||^2 / d'``), which keeps the per-coordinate range small for the modular sum and the
rounding error spread evenly. The server inverts it: ``U^T y = D H y / sqrt(d')`` (H symmetric,
H H = d' I). The fast transform costs ``O(d' log d')``, as log2(d') butterfly passes.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["padded_dim", "signs", "hadamard", "rotate", "unrotate"]


def padded_dim(dim: int) -> int:
    """``d' = 2^ceil(log2 d)`` (d >= 1)."""
    if int(dim) < 1:
        raise ValueError(f"dim must be an integer >= 1, got {dim!r}")
    return 1 << (int(dim) - 1).bit_length()


def signs(key: jax.Array, dim: int) -> jax.Array:
    """The diagonal of ``D``: ``[d']`` float32 in {-1, +1}, uniform and independent."""
    return jnp.where(jax.random.bernoulli(key, 0.5, (padded_dim(dim),)), 1.0, -1.0
                     ).astype(jnp.float32)


def hadamard(x: jax.Array) -> jax.Array:
    """``H x`` for ``x [..., d']`` (d' a power of 2), unnormalised (H's entries are +-1): the fast
    Walsh-Hadamard transform, ``log2 d'`` butterfly passes over the last axis."""
    d = x.shape[-1]
    if d & (d - 1):
        raise ValueError(f"the last axis must have a power-of-2 length, got {d}")
    lead = x.shape[:-1]
    h = 1
    while h < d:
        y = x.reshape(*lead, d // (2 * h), 2, h)
        a, b = y[..., 0, :], y[..., 1, :]
        x = jnp.stack([a + b, a - b], axis=-2).reshape(*lead, d)
        h *= 2
    return x


def rotate(x: jax.Array, sign: jax.Array) -> jax.Array:
    """``U x = H D pad(x) / sqrt(d')``: ``x [..., d]`` -> ``[..., d']`` (``sign [d']``)."""
    dp = sign.shape[-1]
    pad = [(0, 0)] * (x.ndim - 1) + [(0, dp - x.shape[-1])]
    return hadamard(jnp.pad(x, pad) * sign) / jnp.sqrt(jnp.float32(dp))


def unrotate(y: jax.Array, sign: jax.Array, dim: int) -> jax.Array:
    """``U^T y = D H y / sqrt(d')``, cropped to the first ``dim`` coordinates: ``[..., d]``."""
    dp = sign.shape[-1]
    return (hadamard(y) * sign / jnp.sqrt(jnp.float32(dp)))[..., :dim]
