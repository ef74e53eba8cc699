"""Composite objectives F = f0 + f1 and the proximal operators of f1 (pure functions on pytrees).

The ISRL-DP paper (Lowy et al., Assumption 2) lets f1 be any proper, closed, convex function;
the algorithms step with

    prox_{eta f1}(z) = argmin_y  eta f1(y) + ||y - z||_2^2 / 2.

Closed forms, over the WHOLE parameter vector (every leaf of the pytree, concatenated):

    none     f1 = 0                      prox(z) = z
    l1       f1 = lam ||w||_1            prox(z) = sign(z) max(|z| - eta lam, 0)   (soft threshold)
    l2_ball  f1 = indicator{||w||_2 <= r}  prox(z) = z min(1, r / ||z||_2)       (projection)
    box      f1 = indicator{lo <= w <= hi} prox(z) = clip(z, lo, hi)             (projection)

The indicators' prox does not depend on the step. ``value(w)`` returns f1(w) (``inf`` outside the
set of an indicator, up to a relative tolerance of 1e-5 for float round-off).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import optax

from fedjax_dp.core import validation

Params = Any

NAMES = ("none", "l1", "l2_ball", "box")

#: Relative slack of the indicators' membership test (float32 round-off after a projection).
TOLERANCE = 1e-5


@dataclasses.dataclass(frozen=True)
class Prox:
    """f1 and its prox. ``name`` in :data:`NAMES`; ``strength`` is lam (``l1``), ``radius`` r
    (``l2_ball``), ``low`` / ``high`` the box (``box``). Hashable (a static argument of jit)."""

    name: str = "none"
    strength: float = 0.0
    radius: float = 1.0
    low: float = -1.0
    high: float = 1.0

    def __post_init__(self):
        validation.check_choice("algorithm.prox", self.name, NAMES)
        validation.check_nonnegative("algorithm.prox_strength", self.strength)
        validation.check_positive("algorithm.prox_radius", self.radius)
        lo = validation.check_number("algorithm.prox_low", self.low)
        hi = validation.check_number("algorithm.prox_high", self.high)
        if not lo <= hi:
            raise ValueError(f"algorithm.prox_low must be <= algorithm.prox_high, got {lo} > {hi}")
        if self.name == "l1" and not math.isfinite(self.strength):
            raise ValueError(f"algorithm.prox_strength must be finite, got {self.strength}")

    def __call__(self, z: Params, step) -> Params:
        return apply(self, z, step)

    def value(self, w: Params) -> jax.Array:
        return value(self, w)


def soft_threshold(z: Params, threshold) -> Params:
    """``sign(z) max(|z| - threshold, 0)`` leaf-wise (the prox of ``threshold * ||.||_1``)."""
    return jax.tree.map(lambda l: jnp.sign(l) * jnp.maximum(jnp.abs(l) - threshold, 0.0), z)


def project_l2_ball(z: Params, radius) -> Params:
    """``z min(1, r / ||z||_2)`` with the global L2 norm over all leaves."""
    norm = optax.tree.norm(z)
    scale = jnp.minimum(1.0, radius / jnp.maximum(norm, 1e-30))
    return jax.tree.map(lambda l: l * scale.astype(l.dtype), z)


def project_box(z: Params, low, high) -> Params:
    return jax.tree.map(lambda l: jnp.clip(l, low, high), z)


def apply(prox: Prox, z: Params, step) -> Params:
    """``prox_{step f1}(z)`` (see the module docstring); ``step`` = eta >= 0 (may be traced)."""
    if prox.name == "none":
        return z
    if prox.name == "l1":
        return soft_threshold(z, step * prox.strength)
    if prox.name == "l2_ball":
        return project_l2_ball(z, prox.radius)
    return project_box(z, prox.low, prox.high)


def value(prox: Prox, w: Params) -> jax.Array:
    """f1(w) as a float32 scalar (``inf`` outside an indicator's set)."""
    if prox.name == "none":
        return jnp.zeros((), jnp.float32)
    if prox.name == "l1":
        return prox.strength * sum(jnp.sum(jnp.abs(l)) for l in jax.tree.leaves(w))
    if prox.name == "l2_ball":
        inside = optax.tree.norm(w) <= prox.radius * (1 + TOLERANCE)
    else:
        slack = TOLERANCE * max(1.0, abs(prox.low), abs(prox.high))
        inside = jnp.all(jnp.stack([jnp.all((l >= prox.low - slack) & (l <= prox.high + slack))
                                    for l in jax.tree.leaves(w)]))
    return jnp.where(inside, 0.0, jnp.inf).astype(jnp.float32)
