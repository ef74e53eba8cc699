"""The secure-aggregation side of an averaging round (``RoundSpec.secagg``): a pass's secure sum
of the agents' clipped updates, in fixed point (central noise added by the server afterwards) or,
with ``RoundSpec.distributed``, as the modular sum of the agents' noised integer messages
(:mod:`fedjax_dp.privacy.distributed_dp`), and the server's reading of that modular sum; the
checks made before any work (the fixed-point range, the distributed plan's bits).

``spec`` is the round's :class:`~fedjax_dp.algorithms.rounds.RoundSpec`.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from fedjax_dp.core import rng
from fedjax_dp.privacy import distributed_dp as distributed_lib
from fedjax_dp.privacy import rotation
from fedjax_dp.privacy import secagg as secagg_lib
from fedjax_dp.privacy import secagg_masks

__all__ = ["SecAggFields", "distributed_plan", "pass_sum", "distributed_release",
           "check_secagg_range", "check_distributed_plan"]


@dataclasses.dataclass(frozen=True)
class SecAggFields(secagg_lib.SecAggOptions):
    """The secure aggregation fields of a Config (DP-FedAvg, AE-DPFL, kNN-DPFL; their specs and
    checks: :class:`~fedjax_dp.privacy.secagg.SecAggOptions`), with their defaults.

    docs/secagg.md: ``"plain"`` float sum (default) or ``"secagg"`` (updates / ballots
    secret-shared with ``secagg_frac_bits`` fraction bits). DP-FedAvg: masks on a
    ``secagg_neighbours``-regular graph (None: complete). The votes: among ``secagg_talliers``
    talliers. An agent drops (its shares never arrive; DP-FedAvg: after masking) with probability
    ``secagg_dropout``."""

    aggregation: str = "plain"
    secagg_talliers: int = 2
    secagg_frac_bits: int = 16
    secagg_neighbours: int | None = None
    secagg_dropout: float = 0.0


def distributed_plan(spec, k_train: jax.Array, dim: int):
    """The round's plan (scale, noise, norm bound) and public rotation signs ``[d']``, the same
    for every pass of the round (from ``k_train``'s "rotation" stream)."""
    plan = distributed_lib.plan(spec.distributed, noise_multiplier=spec.noise_multiplier,
                                clip=spec.clip_norm, dim=dim, cohort=spec.sampling.size)
    return plan, rotation.signs(rng.stream(k_train, "rotation"), dim)


def pass_sum(spec, k_train: jax.Array, deltas: Any, ids: jax.Array, valid: jax.Array
             ) -> tuple[Any, jax.Array]:
    """``(total, alive [B])``: the secure sum of a pass's clipped updates ``deltas [B, ...]``
    over the survivors ``alive`` (valid rows whose agent did not drop): the fixed-point sum (a
    pytree), or with distributed noise the modular sum of the messages, ``[d']`` uint32."""
    # the pass's own masking / dropout keys (its first agent's id tells passes apart);
    # fold_in(k_train, crc32("secagg") = 1951061648) is no agent's training key for N < 1.95e9
    k_pass = jax.random.fold_in(rng.stream(k_train, "secagg"), ids[0])
    k_mask, k_drop = jax.random.split(k_pass)
    # every agent drops independently, its coin from fold_in(k_drop, id) (dp_fedavg's proof)
    alive = (secagg_lib.drop_within(k_drop, valid, spec.secagg.dropout, ids)       # [B]
             if spec.secagg.dropout else valid)
    if spec.distributed is None:
        return secagg_masks.secure_tree_sum(k_mask, deltas, ids, alive, spec.secagg), alive
    flat = jax.vmap(lambda t: ravel_pytree(t)[0])(deltas)                          # [B, d]
    plan, sign = distributed_plan(spec, k_train, flat.shape[1])
    k_client = rng.stream(k_train, "distributed_noise")
    n_min = spec.distributed.survivors_needed(spec.sampling.size)
    msgs = jax.vmap(lambda i, x: distributed_lib.client_message(                    # [B, d']
        jax.random.fold_in(k_client, i), x, sign, plan, spec.distributed.kind, n_min))(ids, flat)
    total = distributed_lib.modular_sum(k_mask, msgs, ids, alive, plan.bits,
                                        spec.secagg.neighbours)
    return total, alive


def distributed_release(spec, k_train: jax.Array, params: Any, total: jax.Array,
                        num_sampled: jax.Array) -> tuple[Any, jax.Array]:
    """The server's estimate of the survivors' sum from the modular sum ``total [d']`` (a pytree
    like ``params``), zero when the round aborts (fewer than n_min survivors), and whether it
    was released (bool, public: it depends on the dropouts alone)."""
    _, unravel = ravel_pytree(params)
    dim = sum(int(math.prod(l.shape)) for l in jax.tree.leaves(params))
    plan, sign = distributed_plan(spec, k_train, dim)
    released = num_sampled >= spec.distributed.survivors_needed(spec.sampling.size)
    flat = jnp.where(released, distributed_lib.server_sum(total, sign, plan, dim), 0.0)
    return unravel(flat), released


def check_secagg_range(spec, rows: int) -> None:
    """Secure aggregation needs a bound on the sum (before any work): every coordinate of a
    clipped update is at most ``clip_norm`` in absolute value, so a pass of ``rows`` agents sums
    to at most ``rows * clip_norm`` per coordinate, which must fit the ring
    (:func:`fedjax_dp.privacy.secagg.check_range`). Distributed noise has its plan's range."""
    if spec.secagg is None or spec.distributed is not None:
        return
    if spec.clip_norm is None:
        raise ValueError("algorithm.aggregation = 'secagg' needs clipped updates (clip_norm): "
                         "the fixed-point range is bounded by the number of agents x clip_norm")
    bound, name = float(spec.clip_norm), "algorithm.clip_norm"
    if spec.adaptive is not None:
        if spec.adaptive.max_clip_norm is None:
            raise ValueError("algorithm.aggregation = 'secagg' with algorithm.adaptive_clip needs "
                             "algorithm.adaptive_clip.max_clip_norm (> 0): the fixed-point range "
                             "is bounded by the number of agents x the largest clip norm")
        bound = max(bound, spec.adaptive.max_clip_norm)
        name = "max(algorithm.clip_norm, algorithm.adaptive_clip.max_clip_norm)"
    secagg_lib.check_range(f"{name} x agents per pass ({rows})", rows * bound,
                           spec.secagg.frac_bits, rows)


def check_distributed_plan(spec, params: Any) -> None:
    """Bits that cannot hold the sum of the model's ``params``, refused before any work."""
    if spec.distributed is None:
        return
    dim = sum(int(np.prod(l.shape)) for l in jax.tree.leaves(params))
    try:
        distributed_lib.plan(spec.distributed, noise_multiplier=spec.noise_multiplier,
                             clip=spec.clip_norm, dim=dim, cohort=spec.sampling.size)
    except ValueError as e:
        raise ValueError(f"algorithm.distributed_noise: {e}") from None
