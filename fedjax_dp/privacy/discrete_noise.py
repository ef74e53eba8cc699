"""Integer-valued noise and rounding for distributed DP under secure aggregation, on the device.

Three samplers, each exact given its uniform / exponential / Poisson draws (float32 arithmetic):

- :func:`discrete_gaussian`: ``N_Z(0, sigma^2)``, ``P(k) ~ exp(-k^2 / (2 sigma^2))`` on the
  integers, by rejection from the discrete Laplace of scale ``t = floor(sigma) + 1`` (Canonne,
  Kamath, Steinke, "The Discrete Gaussian for Differential Privacy", NeurIPS 2020, Algorithm 3):
  accept ``Y`` with probability ``exp(-(|Y| - sigma^2 / t)^2 / (2 sigma^2))``; a vectorised loop
  redraws the rejected coordinates until all are accepted (each round accepts with probability
  >= about 0.5, so the loop ends after about log2(d) + a few rounds).
- :func:`skellam`: ``Sk(variance) = Pois(variance / 2) - Pois(variance / 2)`` (Agarwal, Kairouz,
  Liu, NeurIPS 2021, Definition 3.1 with mu = variance / 2): variance ``variance``, closed under
  sums, so n clients' shares of ``variance / n`` sum to exactly ``Sk(variance)``.
- :func:`conditional_round`: conditional randomized rounding (Kairouz, Liu, Steinke, ICML 2021,
  Section 4.1): each coordinate to ``floor(x) + Bernoulli(x - floor(x))`` (unbiased), the whole
  vector redrawn until its L2 norm is at most ``bound`` (the bound the accounting's sensitivity
  uses, :func:`fedjax_dp.privacy.distributed_accounting.rounded_norm_bound`), so the norm bound
  holds always, not just with probability 1 - beta.

Every draw uses its own key: round ``r`` of a loop draws from ``fold_in(key, r)``.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

__all__ = ["discrete_laplace", "discrete_gaussian", "skellam", "randomized_round",
           "squared_norm_at_most", "conditional_round"]

_MAX_TRIES = 10_000        # a while loop's cap: never reached unless the bound is infeasible


def discrete_laplace(key: jax.Array, scale, shape) -> jax.Array:
    """``DLap(t)``: ``P(k) ~ exp(-|k| / t)`` on the integers, int32 ``shape``: the difference of
    two geometric variables ``floor(t E)``, ``E ~ Exp(1)`` (``P(floor(t E) >= k) = e^(-k/t)``)."""
    k1, k2 = jax.random.split(key)
    t = jnp.asarray(scale, jnp.float32)
    g1 = jnp.floor(t * jax.random.exponential(k1, shape, jnp.float32))
    g2 = jnp.floor(t * jax.random.exponential(k2, shape, jnp.float32))
    return (g1 - g2).astype(jnp.int32)


def discrete_gaussian(key: jax.Array, sigma, shape) -> jax.Array:
    """``N_Z(0, sigma^2)`` int32 ``shape`` (Canonne et al. 2020, Algorithm 3); ``sigma > 0``
    (traced or static). Rejected coordinates are redrawn from ``fold_in(key, round)``."""
    sigma = jnp.asarray(sigma, jnp.float32)
    t = jnp.floor(sigma) + 1.0
    s2 = sigma * sigma

    def draw(r):
        kr = jax.random.fold_in(key, r)
        k_y, k_u = jax.random.split(kr)
        y = discrete_laplace(k_y, t, shape)
        gap = jnp.abs(y).astype(jnp.float32) - s2 / t
        accept = jax.random.uniform(k_u, shape, jnp.float32) < jnp.exp(-gap * gap / (2.0 * s2))
        return y, accept

    def cond(c):
        _, ok, r = c
        return (~jnp.all(ok)) & (r < _MAX_TRIES)

    def body(c):                      # one copy of the draw in the program: round 0 included
        y, ok, r = c
        y_new, ok_new = draw(r)
        take = ~ok & ok_new
        return jnp.where(take, y_new, y), ok | ok_new, r + 1

    start = (jnp.zeros(shape, jnp.int32), jnp.zeros(shape, bool), jnp.int32(0))
    y, _, _ = jax.lax.while_loop(cond, body, start)
    return y


def skellam(key: jax.Array, variance, shape) -> jax.Array:
    """``Pois(variance / 2) - Pois(variance / 2)``: int32 ``shape``, mean 0, variance
    ``variance`` (> 0)."""
    lam = jnp.asarray(variance, jnp.float32) / 2.0
    k1, k2 = jax.random.split(key)
    a = jax.random.poisson(k1, lam, shape, jnp.int32)
    b = jax.random.poisson(k2, lam, shape, jnp.int32)
    return a - b


def randomized_round(key: jax.Array, y: jax.Array) -> jax.Array:
    """Unbiased randomised rounding to the integers: ``floor(y) + Bernoulli(y - floor(y))``, int32.

    ``E[result] = y``; ``Var = f (1 - f)`` with ``f = y - floor(y)``. One uniform per entry."""
    lower = jnp.floor(y)
    up = jax.random.uniform(key, y.shape, dtype=y.dtype) < (y - lower)
    return lower.astype(jnp.int32) + up.astype(jnp.int32)


def _square_u64(r: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``r^2`` exactly, as the (high, low) uint32 words of a 64-bit integer (int32 ``r``):
    ``|r| = a_h 2^16 + a_l``, ``r^2 = a_h^2 2^32 + a_h a_l 2^17 + a_l^2``."""
    a = jnp.abs(r).astype(jnp.uint32)                 # |r| <= 2^31 fits uint32
    ah, al = a >> 16, a & jnp.uint32(0xFFFF)
    mid = ah * al                                     # < 2^32
    lo1 = al * al
    lo = lo1 + (mid << 17)                            # wraps mod 2^32
    hi = ah * ah + (mid >> 15) + (lo < lo1).astype(jnp.uint32)
    return hi, lo


def _sum_u64(hi: jax.Array, lo: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The exact 64-bit sum of (high, low) word pairs over the last axis (carries kept)."""
    def add(x, y):
        (h1, l1), (h2, l2) = x, y
        low = l1 + l2
        return h1 + h2 + (low < l1).astype(jnp.uint32), low

    zero = jnp.uint32(0)
    return jax.lax.reduce((hi, lo), (zero, zero), add, (hi.ndim - 1,))


def squared_norm_at_most(r: jax.Array, bound_sq: int) -> jax.Array:
    """Whether ``sum_i r_i^2 <= bound_sq`` for an int32 vector ``r [d]``, decided exactly
    (integer arithmetic in two uint32 words; a float32 sum could err by more than the slack
    the rounding bound leaves). Exact while ``sum_i r_i^2 < 2^64``."""
    b = int(bound_sq)
    hi, lo = _sum_u64(*_square_u64(r))
    bh, bl = jnp.uint32(b >> 32), jnp.uint32(b & 0xFFFFFFFF)
    return (hi < bh) | ((hi == bh) & (lo <= bl))


def conditional_round(key: jax.Array, x: jax.Array, bound: float) -> jax.Array:
    """Randomized rounding of ``x [d]`` repeated (draw ``r`` from ``fold_in(key, r)``) until
    ``||round(x)||_2 <= bound``: int32 ``[d]`` (Kairouz et al. 2021, Section 4.1).

    With ``bound`` from the rounding bound at failure probability beta, each try passes with
    probability at least 1 - beta, so the loop ends after 1 / (1 - beta) tries on average. Should
    a pathological bound exhaust the loop's cap, the client sends zeros: the norm bound, and with
    it the sensitivity, holds in every case."""
    x = jnp.asarray(x, jnp.float32)
    bound_sq = math.floor(float(bound) ** 2)          # ||r||^2 is an integer: exact compare

    def norm_ok(r):
        return squared_norm_at_most(r, bound_sq)

    def cond(c):
        r, i = c
        return ((i == 0) | ~norm_ok(r)) & (i < _MAX_TRIES)

    def body(c):                      # try i from fold_in(key, i), i = 0, 1, ...
        _, i = c
        return randomized_round(jax.random.fold_in(key, i), x), i + 1

    r, _ = jax.lax.while_loop(cond, body, (jnp.zeros(x.shape, jnp.int32), jnp.int32(0)))
    return jnp.where(norm_ok(r), r, 0)      # the cap (never reached in practice): send zeros
