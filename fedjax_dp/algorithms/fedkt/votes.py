"""FedKT's vote maths (pure, compiled): teacher vote counts, consistent voting, LNMax labels.

Paper Section 3 (teachers / students) and 3.3 (consistent voting):

    v_m(x) = #{k : T_k(x) = m}                              teacher votes of one partition
    y(x) = argmax_m v_m(x)  (+ Lap(1/gamma) per count)       LNMax label
    v_c(x) = s * #{i : U^i_j(x) = c for every j in [s]}       the server's consistent vote

and the top-2 gaps behind the example-level sensitivity (Theorem 8, :mod:`.privacy`). Counts are
exact integers, so every chunking of the parties gives the same histograms.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.privacy import mechanisms


@functools.partial(jax.jit, static_argnums=1)
def vote_counts(preds: jax.Array, num_classes: int) -> jax.Array:
    """``preds [..., t, Q] -> counts [..., Q, C]``: v_m(x) = #{voters predicting m}."""
    return jnp.sum(jax.nn.one_hot(preds, num_classes, dtype=jnp.int32), axis=-3)


@functools.partial(jax.jit, static_argnums=1)
def consistent_vote(student_preds: jax.Array, num_classes: int) -> jax.Array:
    """Server histogram with consistent voting (Section 3.3): ``[n, s, Q] -> [Q, C]`` (int32).

    Party i adds s to class c for query x only if all its s students predict c, else nothing:
    ``v_c(x) = s * #{i : U^i_j(x) = c for all j}``.
    """
    s = student_preds.shape[1]
    first = student_preds[:, 0]                                            # [n, Q]
    agree = jnp.all(student_preds == first[:, None], axis=1)               # [n, Q]
    ballots = jax.nn.one_hot(first, num_classes, dtype=jnp.int32) * agree[..., None]  # [n, Q, C]
    return s * jnp.sum(ballots, axis=0)


@jax.jit
def noisy_labels(keys: jax.Array, counts: jax.Array, gamma: float) -> jax.Array:
    """LNMax for a batch of voting groups: ``argmax_c counts[g, q, c] + Lap(1/gamma)``.

    ``keys [G]`` one key per group (party/partition, or the server), ``counts [G, Q, C]``;
    within a group every query and class draws its own Laplace variable. Returns ``[G, Q]``.
    Per query: L1 sensitivity 2 (one teacher) or 2s (one party at the server) -> (2 gamma, 0)- or
    (2 s gamma, 0)-DP (replace relation). Each group is :func:`mechanisms.noisy_argmax_laplace`.
    """
    return jax.vmap(mechanisms.noisy_argmax_laplace, in_axes=(0, 0, None))(keys, counts, gamma)


def top2_gaps(counts) -> np.ndarray:
    """Gap between the two largest counts, ``[..., C] -> [...]`` (host, exact integers)."""
    c = np.sort(np.asarray(counts), axis=-1)
    return c[..., -1] - c[..., -2]


def partitions_at_risk(teacher_votes, gap_threshold: int = 2) -> np.ndarray:
    """z_i: per party, the number of partitions with a query whose top-2 gap <= threshold.

    ``teacher_votes [n, s, Q, C]`` (noiseless, as the students learnt them) -> ``[n]``.
    """
    risky = np.any(top2_gaps(teacher_votes) <= gap_threshold, axis=-1)   # [n, s]
    return risky.sum(axis=-1)


@functools.partial(jax.jit, static_argnums=(1, 2))
def chunk_votes(preds: jax.Array, shape: tuple, num_classes: int) -> jax.Array:
    """``preds [G s t, Q]`` -> ``[G, s, Q, C]`` teacher vote counts (int32), ``shape = (G, s,
    t)``: the teachers of a chunk, ordered (group, partition, teacher)."""
    return vote_counts(preds.reshape(shape + (-1,)), num_classes)


@jax.jit
def argmax_labels(votes: jax.Array) -> jax.Array:
    """Noiseless labels ``argmax_m v_m`` (ties: the lowest class): ``[G, Q, C] -> int32 [G, Q]``."""
    return jnp.argmax(votes, -1).astype(jnp.int32)


@functools.partial(jax.jit, static_argnums=1)
def consistent_votes_seeds(preds: jax.Array, num_classes: int) -> jax.Array:
    """``[S, P, s, Qs] -> [S, Qs, C]``: :func:`consistent_vote` of every seed's chunk."""
    return jax.vmap(lambda p: consistent_vote(p, num_classes))(preds)


def int_dtype(max_value: int):
    """The smallest signed integer type holding ``[-1, max_value]`` (compact stored counts and
    class indices; -1 pads)."""
    return np.int8 if max_value <= 127 else np.int16 if max_value <= 32767 else np.int32
