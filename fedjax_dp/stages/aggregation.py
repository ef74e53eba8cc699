"""Aggregation stages: how the cohort's contributions are summed.

``plain``   the float sum (the server sees each agent's contribution; central DP).
``secagg``  secure aggregation (:mod:`fedjax_dp.privacy.secagg_masks`): pairwise masks in fixed
            point, the server sees only the sum, equal to the plain sum up to ``M 2^-(f+1)`` per
            coordinate; agents may drop after masking (``dropout``, each coin
            ``fold_in(k_drop, id)``). A distributed noise stage replaces the fixed-point sum by
            the modular sum of its integer messages (:meth:`SecureSum.sum`).
"""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax

from fedjax_dp.core import rng
from fedjax_dp.privacy import secagg as secagg_lib
from fedjax_dp.privacy import secagg_masks
from fedjax_dp.stages.base import Stage, register, requires

__all__ = ["Aggregation", "PlainSum", "SecureSum"]


class Aggregation(Stage):
    """The aggregation protocol: ``stacked`` (whether the engine must hold the pass's
    contributions ``[B, ...]``, else it sums them as it goes) and ``sum``."""

    KIND: ClassVar[str] = "aggregation"
    stacked: ClassVar[bool] = False
    secure: ClassVar[bool] = False

    def check_range(self, chain, rows: int) -> None:
        """Refuse, before any work, a sum that cannot be held (plain: nothing to check)."""


@register
@dataclasses.dataclass(frozen=True)
class PlainSum(Aggregation):
    NAME: ClassVar[str] = "plain"
    CONFIG: ClassVar[str] = 'algorithm.aggregation = "plain"'
    SUMMARY: ClassVar[str] = "the float sum of the contributions"
    OPTIONS: ClassVar[dict] = {}


@register
@dataclasses.dataclass(frozen=True)
class SecureSum(Aggregation):
    """Secure aggregation of the contributions with the settings ``config``."""

    NAME: ClassVar[str] = "secagg"
    CONFIG: ClassVar[str] = 'algorithm.aggregation = "secagg"'
    SUMMARY: ClassVar[str] = "secure sum in fixed point (or mod 2^b with distributed noise)"
    OPTIONS: ClassVar[dict] = {"secagg_frac_bits": "f in [0, 30]",
                               "secagg_neighbours": "an even k >= 2 or none (complete graph)",
                               "secagg_dropout": "p in [0, 1): each agent drops after masking"}
    stacked: ClassVar[bool] = True
    secure: ClassVar[bool] = True
    config: secagg_lib.SecAggConfig = secagg_lib.SecAggConfig()

    def requirements(self):
        return (requires("clipping", lambda c: c["noise"].encodes or
                         c["clipping"].range_bound() is not None,
                         "the secure sum's fixed-point ring is sized by the largest clip: "
                         "clip the updates (adaptive: set adaptive_clip.max_clip_norm)"),)

    def sum(self, k_train: jax.Array, contributions: Any, ids: jax.Array, valid: jax.Array,
            chain, clip, z_u: float) -> tuple[Any, jax.Array]:
        """``(total, alive [B])``: the secure sum of the pass's ``contributions [B, ...]`` over
        the survivors (valid rows whose agent did not drop); the noise stage's modular sum of
        its messages where it encodes them (distributed noise)."""
        # the pass's own masking / dropout keys (its first agent's id tells passes apart);
        # fold_in(k_train, crc32("secagg") = 1951061648) is no agent's training key for N < 1.95e9
        k_pass = jax.random.fold_in(rng.stream(k_train, "secagg"), ids[0])
        k_mask, k_drop = jax.random.split(k_pass)
        alive = (secagg_lib.drop_within(k_drop, valid, self.config.dropout, ids)    # [B]
                 if self.config.dropout else valid)
        if chain["noise"].encodes:
            return chain["noise"].encoded_sum(k_train, k_mask, contributions, ids, alive,
                                              self.config, chain, clip, z_u), alive
        return secagg_masks.secure_tree_sum(k_mask, contributions, ids, alive, self.config), \
            alive

    def check_range(self, chain, rows: int) -> None:
        """Every coordinate of a clipped update is at most the clip in absolute value, so a
        pass of ``rows`` agents sums to at most ``rows x clip``, which must fit the ring
        (:func:`fedjax_dp.privacy.secagg.check_range`); distributed noise has its plan's."""
        if chain["noise"].encodes:
            return
        clip = chain["clipping"]
        name = ("algorithm.clip_norm" if not clip.adaptive else
                "max(algorithm.clip_norm, algorithm.adaptive_clip.max_clip_norm)")
        secagg_lib.check_range(f"{name} x agents per pass ({rows})", rows * clip.range_bound(),
                               self.config.frac_bits, rows)
