"""Tree aggregation (DP-FTRL; Kairouz, McMahan, Song, Thakkar, Thakurta, Xu, "Practical and
Private (Deep) Learning without Sampling or Shuffling", ICML 2021), streamed on the device.

The server's noisy prefix sums over a tree of b rounds: each node of a binary tree over the b
leaves (rounds) gets its own noise ``Z(l, i) ~ N(0, I_d)`` (level l, index i: the leaves
``[i 2^l, (i + 1) 2^l)``), and the prefix sum of the first c rounds is released with the noise of
the nodes of c's dyadic decomposition, one per set bit l of c::

    P(c) = sum_{l: bit l of c} Z(l, 2 floor(c / 2^(l+1)))          (only left children are used)

Round t adds the noise increment ``P(c) - P(c - 1)``, c = (t mod b) + 1, so the model (a prefix
sum of the rounds' noisy sums) carries the noise P(c). The tree restarts every b rounds (its
root key is that round's noise key); the node noises are regenerated from ``fold_in(root, l, i)``
when needed, so the state is the root key and the round counter: no node is ever stored.

Privacy. Unit one agent, relation add or remove one agent's data. The participation groups
(:mod:`fedjax_dp.privacy.correlated_noise`) give every agent at most one round per tree, so it
enters the nodes that contain its leaf and are used: at most ``ceil(log2(b + 1))`` of them
(:func:`used_nodes_per_leaf`; dp-accounting's depth), each with noise ``z S``. One tree is
dp-accounting's ``SingleEpochTreeAggregationDpEvent(z, b)``; the ceil(T / b) trees of a run
compose (every agent may appear once in each): ``SelfComposed(SingleEpochTree(z, b),
ceil(T / b))``. No amplification by the sampling within a group is claimed.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["levels", "decomposition", "used_nodes_per_leaf", "dp_event", "init_state",
           "next_noise"]


def levels(b: int) -> int:
    """The tree's levels a prefix count c <= b can use: ``ceil(log2(b + 1))``."""
    return max(1, math.ceil(math.log2(int(b) + 1)))


def decomposition(c: int) -> list[tuple[int, int]]:
    """The nodes ``(level, index)`` whose noise P(c) carries (numpy; the tests' reference)."""
    return [(l, 2 * (c >> (l + 1))) for l in range(max(1, int(c).bit_length()))
            if (c >> l) & 1]


def used_nodes_per_leaf(b: int) -> np.ndarray:
    """``[b]``: for each leaf j, the number of nodes used by some prefix c <= b that contain it
    (brute force over every prefix; its maximum is the tree's L2 sensitivity squared)."""
    used = {node for c in range(1, int(b) + 1) for node in decomposition(c)}
    return np.array([sum(1 for (l, i) in used if i * 2 ** l <= j < (i + 1) * 2 ** l)
                     for j in range(int(b))])


def dp_event(noise_multiplier: float, b: int, rounds: int):
    """``SelfComposed(SingleEpochTreeAggregation(z, b), ceil(T / b))`` (add/remove one agent)."""
    import dp_accounting
    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.SingleEpochTreeAggregationDpEvent(noise_multiplier, int(b)),
        -(-int(rounds) // int(b)))


def init_state() -> dict:
    """The stream's state: the current tree's root key (set at its first round) and the round."""
    return {"root": jnp.zeros((2,), jnp.uint32), "t": jnp.int32(0)}


def next_noise(b: int, key: jax.Array, state: dict, dim: int) -> tuple[jax.Array, dict]:
    """``(P(c) - P(c - 1) [d], state')`` for round ``state["t"]``: c = (t mod b) + 1; a new
    tree (root ``key``, this round's noise key) starts when t mod b = 0."""
    t = state["t"]
    j = t % b
    root = jnp.where(j == 0, jax.random.key_data(key), state["root"])
    rk = jax.random.wrap_key_data(root)

    def prefix(c):                         # sum over the set bits l of c, statically unrolled
        total = jnp.zeros((dim,), jnp.float32)
        for l in range(levels(b)):
            node = jax.random.fold_in(jax.random.fold_in(rk, l), (c >> (l + 1)) * 2)
            z = jax.random.normal(node, (dim,), jnp.float32)
            total = total + jnp.where(((c >> l) & 1) == 1, z, 0.0)
        return total

    c = j + 1
    return prefix(c) - prefix(c - 1), {"root": root, "t": t + 1}
