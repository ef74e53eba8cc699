"""Pairwise-mask secure aggregation (Bonawitz et al. 2017) on a k-regular graph (Bell et al. 2020).

B agents (one pass of a round's cohort) hold vectors ``x_b`` (``[B, d]``, e.g. clipped model
updates). Each encodes ``E(x_b)`` in ``Z_{2^32}^d`` (:func:`fedjax_dp.privacy.secagg.encode`) and
sends the server the masked input (Bonawitz et al. 2017, Sec. 4, "masking with one-time pads")::

    y_b = E(x_b) + sum_{c in nbr(b)} sign(b, c) PRG(s_{bc})   mod 2^32,
    sign(b, c) = +1 if id_b < id_c else -1,
    s_{bc} = fold_in(fold_in(key, min(id_b, id_c)), max(id_b, id_c))   (symmetric pair seed)

so that every pair's masks cancel in ``sum_b y_b``. The server's view ``y_b`` is uniform on
``Z_{2^32}^d`` for any agent with at least one neighbour whose seed it does not know.

The graph (Bell et al. 2020, Sec. 3-4). ``nbr(b)``: a k-regular ring (Harary) graph on a random
relabelling of the B rows (a uniformly random permutation from the round's key), each joined
to the k/2 rows on either side; ``k >= B - 1`` (or ``neighbours=None``) is the complete graph of
Bonawitz et al. Cost: ``O(B k d)`` PRG output instead of ``O(B^2 d)``.

Privacy consequence of k. The sum hides an honest agent's input from the server as long as the
graph restricted to honest, surviving agents keeps it connected to others: with a complete graph
the server (even colluding with agents) learns only the sum of the honest survivors; with degree
k an agent whose k neighbours all collude with the server (or all drop out) is exposed, and the
honest survivors may split into components whose partial sums the server learns. Bell et al.
show that k = O(log N) on a random graph keeps the honest survivors connected with overwhelming
probability for a constant fraction of corrupted / dropped agents; a small fixed k (e.g. 2, a
single ring) gives much weaker protection. The random relabelling is per round and per pass.

Dropouts. The survivors' masks towards dropped agents do not cancel; in the real protocol the
survivors reveal Shamir shares of the dropped agents' seeds and the server recomputes
``sum_{b alive} sum_{c in nbr(b), c dropped} sign(b, c) PRG(s_{bc})``. **This module simulates
that step** from the same seeds (:func:`dropout_correction`); the Shamir sharing, the key
agreement, the self-masks of double masking and any malicious behaviour are not simulated.
Padding rows of a pass are treated as agents that dropped.

Result: ``D(sum_{b alive} y_b - correction) = sum_{b alive} x_b + e``, ``|e| <= M 2^-(f+1)`` per
coordinate (M survivors), exactly the plain survivors' sum in fixed point.
"""
from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from fedjax_dp.privacy import secagg

__all__ = ["ring_offsets", "neighbours", "pair_key", "mask_terms", "masked_inputs",
           "dropout_correction", "secure_sum", "secure_tree_sum"]


def ring_offsets(num_rows: int, k: int | None) -> tuple[int, ...]:
    """The neighbour offsets on the ring of ``num_rows`` rows: ``(1..k/2, B-k/2..B-1)``, or
    ``(1..B-1)`` (complete graph) when ``k`` is None or ``k >= B - 1``. Symmetric: ``o`` and
    ``B - o`` are both present, so b is c's neighbour iff c is b's."""
    b = int(num_rows)
    if k is None or k >= b - 1:
        return tuple(range(1, b))
    h = k // 2
    return tuple(range(1, h + 1)) + tuple(range(b - h, b))


@functools.partial(jax.jit, static_argnames=("num_rows", "k"))
def neighbours(key: jax.Array, num_rows: int, k: int | None) -> jax.Array:
    """``nbr [B, K]`` int32: row b's neighbours (``K = len(ring_offsets(B, k))``), a k-regular
    ring graph on the random order ``perm = permutation(key, B)``: the row at ring position r is
    ``perm[r]`` and its neighbours are ``perm[(r + o) mod B]``."""
    offsets = jnp.asarray(ring_offsets(num_rows, k), jnp.int32)              # [K]
    perm = jax.random.permutation(key, num_rows).astype(jnp.int32)           # ring -> row
    pos = jnp.zeros((num_rows,), jnp.int32).at[perm].set(jnp.arange(num_rows, dtype=jnp.int32))
    return perm[(pos[:, None] + offsets[None, :]) % num_rows]                # [B, K]


@jax.jit
def pair_key(key: jax.Array, id_a: jax.Array, id_b: jax.Array) -> jax.Array:
    """The pair seed ``s_ab = fold_in(fold_in(key, min), max)`` (symmetric in a and b)."""
    lo, hi = jnp.minimum(id_a, id_b), jnp.maximum(id_a, id_b)
    return jax.random.fold_in(jax.random.fold_in(key, lo), hi)


def mask_terms(key: jax.Array, ids: jax.Array, nbr: jax.Array, weight: jax.Array,
               dim: int) -> jax.Array:
    """``m_b = sum_s weight[b, s] sign(b, nbr[b, s]) PRG(s_{b, nbr[b, s]})`` mod 2^32: ``[B, d]``.

    ``ids [B]`` agent identities (pair seeds), ``nbr [B, K]``, ``weight [B, K]`` bool (which
    neighbour slots count). Vectorised over the B rows; a scan over the K slots."""
    def slot(acc, cols):
        partner, w = cols                                                    # [B], [B]
        other = ids[partner]

        def one(a, c, on):
            r = jax.random.bits(pair_key(key, a, c), (dim,), jnp.uint32)
            r = jnp.where(a < c, r, jnp.uint32(0) - r)                       # -r mod 2^32
            return jnp.where(on, r, jnp.uint32(0))

        return acc + jax.vmap(one)(ids, other, w), None

    init = jnp.zeros((ids.shape[0], dim), jnp.uint32)
    out, _ = jax.lax.scan(slot, init, (nbr.T, weight.T))
    return out


@functools.partial(jax.jit, static_argnames=("k",))
def masked_inputs(key: jax.Array, encoded: jax.Array, ids: jax.Array,
                  k: int | None) -> tuple[jax.Array, jax.Array]:
    """What the agents send: ``(y [B, d] uint32, nbr [B, K])`` for ``encoded [B, d]`` uint32.

    ``key``: the round's masking key; the graph comes from ``fold_in(key, 0)`` and the pair seeds
    from ``fold_in(key, 1)`` (two streams of one key, see :func:`secure_sum`)."""
    b, d = encoded.shape
    graph_key, seed_key = jax.random.fold_in(key, 0), jax.random.fold_in(key, 1)
    nbr = neighbours(graph_key, b, k)
    return encoded + mask_terms(seed_key, ids, nbr, jnp.ones(nbr.shape, bool), d), nbr


def dropout_correction(key: jax.Array, ids: jax.Array, nbr: jax.Array, alive: jax.Array,
                       dim: int) -> jax.Array:
    """The server's recovery of the dropped agents' masks (SIMULATED: the recomputation of the
    seeds the survivors would reveal from their Shamir shares): ``[d]`` uint32 =
    ``sum_{b alive} sum_{c in nbr(b), c not alive} sign(b, c) PRG(s_{bc})``."""
    seed_key = jax.random.fold_in(key, 1)
    weight = alive[:, None] & ~alive[nbr]                                    # [B, K]
    terms = mask_terms(seed_key, ids, nbr, weight, dim)
    return jnp.sum(jnp.where(alive[:, None], terms, jnp.uint32(0)), axis=0, dtype=jnp.uint32)


def secure_sum(key: jax.Array, x: jax.Array, ids: jax.Array, alive: jax.Array,
               config: secagg.SecAggConfig) -> jax.Array:
    """``sum_{b alive} x_b`` through pairwise masking: ``x [B, d]`` float -> ``[d]`` float32.

    Encode, mask (every row masks, then the non-alive rows drop: padding and dropouts), the server
    adds the survivors' masked inputs mod 2^32, removes the dropped agents' masks
    (:func:`dropout_correction`) and decodes. Equals the plain survivors' sum up to ``M 2^-(f+1)``
    per coordinate."""
    enc = secagg.encode(x, config.frac_bits)
    y, nbr = masked_inputs(key, enc, ids, config.neighbours)
    received = jnp.sum(jnp.where(alive[:, None], y, jnp.uint32(0)), axis=0, dtype=jnp.uint32)
    total = received - dropout_correction(key, ids, nbr, alive, x.shape[1])
    return secagg.decode(total, config.frac_bits)


def secure_tree_sum(key: jax.Array, tree: Any, ids: jax.Array, alive: jax.Array,
                    config: secagg.SecAggConfig) -> Any:
    """:func:`secure_sum` of a pytree with a leading agent axis ``[B, ...]`` (flattened to
    ``[B, d]`` per agent, summed, unflattened): the same structure without the agent axis."""
    one = jax.tree.map(lambda l: l[0], tree)
    _, unravel = ravel_pytree(one)
    flat = jax.vmap(lambda t: ravel_pytree(t)[0])(tree)                     # [B, d]
    total = secure_sum(key, flat.astype(jnp.float32), ids, alive, config)
    return jax.tree.map(lambda a, b: a.astype(b.dtype), unravel(total), one)


@functools.partial(jax.jit, static_argnames=("config",))
def secure_sum_jit(key, x, ids, alive, config):
    """:func:`secure_sum`, compiled (one compilation per shape and config)."""
    return secure_sum(key, x, ids, alive, config)
