"""Correlated noise stages (DP-FTRL / the matrix mechanism; :mod:`fedjax_dp.privacy.
correlated_noise`): round t adds ``z_u S (C^-1 Z)_t``, streamed from the stage's state, so the
model carries the noise of ``C x + Z``, a Gaussian mechanism on ``C x``. The server holds the
noise state across rounds, which is why no distributed noise can be correlated.

The analysis, by participation (factor f: 1 under add/remove, 2 under replace-one):

- ``banded_mf`` with Poisson rate q within b-min-sep groups, b >= the bands: amplified banded MF
  (Choquette-Choo et al. NeurIPS 2023, Theorem 4), ``SelfComposed(PoissonSampled(q, G(z)),
  ceil(T / b))``. An adaptive clip's count is released in the agent's turn on the same cohort
  with independent noise, so it joins that turn's Gaussian (the combined z; module
  :mod:`fedjax_dp.stages.noise`); C_t is public (a function of earlier releases), so the stream
  ``x_t / C_t`` has per-turn sensitivity 1 and the normalised stream is the analysed one.
- every other participation, and ``blt`` always (no amplification claimed): the whole run is one
  Gaussian mechanism on ``C x`` with sensitivity ``f s S``, ``s^2`` the maximum over min-sep
  participation patterns of at most k turns of ``||C u||^2`` (``toeplitz.minsep_sensitivity_
  squared``, Theorem 2 of arXiv 2405.13763; min-sep and k from the participation: b and
  ceil(T / b) for cyclic groups, 1 and T otherwise): ``Gaussian(z_u / (f s))``, composed with
  the count's ``SelfComposed(Gaussian(z_c / f), k)`` under adaptive clipping.
- ``tree`` (restarted every b rounds, one turn per tree, so the participation's min-sep must be
  at least b): ``SelfComposed(SingleEpochTreeAggregation(z_u / f, b), ceil(T / b))``, composed
  with the count's turns as above.
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

from jax.flatten_util import ravel_pytree

from fedjax_dp.privacy import correlated_noise as correlated_lib
from fedjax_dp.privacy import tree_noise
from fedjax_dp.stages.base import register, requires
from fedjax_dp.stages.noise import (Account, Noise, Setup, _clip_norm, compose_with_count,
                                    update_multiplier)

__all__ = ["CorrelatedNoise", "BandedMF", "BLT", "Tree"]


class CorrelatedNoise(Noise):
    """A strategy (``strategy``: :class:`~fedjax_dp.privacy.correlated_noise.CorrelatedNoise`,
    with the run's T) and the guarantee's multiplier z. State: the streaming ``C^-1``'s."""

    correlated: ClassVar[bool] = True

    def init(self, dim: int):
        return correlated_lib.init_state(self.strategy, dim)

    def release(self, key, total, scale, z_u, state, chain):
        """``total + z_u S (C^-1 Z)_t`` and the stream's next state."""
        flat, unravel = ravel_pytree(total)
        noise, state = correlated_lib.next_noise(self.strategy, key, state, flat.size)
        return unravel(flat + (z_u * scale) * noise), state

    def _pattern_event(self, chain, setup: Setup):
        """``Gaussian(z_u / (f s))`` over the participation's min-sep patterns, with the count."""
        import dp_accounting
        part = chain["participation"]
        k = part.turns(setup.rounds)
        s = correlated_lib.pattern_sensitivity(self.strategy, part.min_sep, k)
        z_u = update_multiplier(chain, setup)
        event = dp_accounting.GaussianDpEvent(z_u / (part.factor * s))
        return compose_with_count(event, chain, setup, k), s

    def account(self, chain, setup: Setup) -> Account:
        part = chain["participation"]
        event, s = self._pattern_event(chain, setup)
        return Account(event, part.relation, part.factor * _clip_norm(chain, self),
                       f"{self.NAME} noise (T = {setup.rounds}), min-sep {part.min_sep}: one "
                       f"Gaussian mechanism on C x, sensitivity s = {s:.4g} per unit of clip "
                       f"over min-sep patterns of at most {part.turns(setup.rounds)} turns")


@register
@dataclasses.dataclass(frozen=True)
class BandedMF(CorrelatedNoise):
    NAME: ClassVar[str] = "banded_mf"
    CONFIG: ClassVar[str] = 'algorithm.noise = {kind = "banded_mf", bands = b}'
    SUMMARY: ClassVar[str] = ("b-banded Toeplitz matrix mechanism (amplified with Poisson "
                              "within b-min-sep groups)")
    OPTIONS: ClassVar[dict] = {"bands": correlated_lib.OPTIONS["bands"],
                               "optimizer_steps": correlated_lib.OPTIONS["optimizer_steps"]}
    strategy: correlated_lib.CorrelatedNoise = correlated_lib.CorrelatedNoise("banded_mf", 2, 2)
    multiplier: float = 1.0
    sensitivity: float | None = None

    def amplified(self, chain) -> bool:
        part = chain["participation"]
        return part.amplified_banded_rate is not None and part.min_sep >= self.strategy.cycle

    def account(self, chain, setup: Setup) -> Account:
        part = chain["participation"]
        if not self.amplified(chain):
            return super().account(chain, setup)
        from jax_privacy.experimental import accounting as jp_accounting
        event = jp_accounting.amplified_bandmf_event(
            self.multiplier, setup.rounds, num_bands=part.min_sep,
            sampling_prob=part.amplified_banded_rate)
        return Account(event, part.relation, part.factor * _clip_norm(chain, self),
                       f"amplified banded MF (b = {self.strategy.cycle} bands, min-sep "
                       f"{part.min_sep}, T = {setup.rounds}): round t adds z S (C^-1 Z)_t and "
                       f"Poisson-samples group t mod {part.min_sep} with rate q (jax-privacy's "
                       f"event)")


@register
@dataclasses.dataclass(frozen=True)
class BLT(CorrelatedNoise):
    NAME: ClassVar[str] = "blt"
    CONFIG: ClassVar[str] = 'algorithm.noise = {kind = "blt", min_sep = b}'
    SUMMARY: ClassVar[str] = "buffered linear Toeplitz matrix mechanism (no amplification)"
    OPTIONS: ClassVar[dict] = {k: correlated_lib.OPTIONS[k] for k in
                               ("min_sep", "optimizer_steps", "buf_decay", "output_scale")}
    strategy: correlated_lib.CorrelatedNoise = correlated_lib.CorrelatedNoise("blt", 2, 2)
    multiplier: float = 1.0
    sensitivity: float | None = None


@register
@dataclasses.dataclass(frozen=True)
class Tree(CorrelatedNoise):
    NAME: ClassVar[str] = "tree"
    CONFIG: ClassVar[str] = 'algorithm.noise = {kind = "tree", min_sep = b}'
    SUMMARY: ClassVar[str] = "tree aggregation restarted every b rounds (DP-FTRL)"
    OPTIONS: ClassVar[dict] = {"min_sep": correlated_lib.OPTIONS["min_sep"]}
    strategy: correlated_lib.CorrelatedNoise = correlated_lib.CorrelatedNoise("tree", 2, 2)
    multiplier: float = 1.0
    sensitivity: float | None = None

    def requirements(self):
        b = self.strategy.cycle
        return (requires("participation", lambda c: c["participation"].min_sep >= b,
                         f"tree aggregation restarted every b = {b} rounds is analysed with at "
                         f"most one turn per agent per tree: participation needs min-sep >= {b} "
                         f"(cyclic groups)"),)

    def account(self, chain, setup: Setup) -> Account:
        part = chain["participation"]
        z_u = update_multiplier(chain, setup)
        b = self.strategy.cycle
        event = compose_with_count(tree_noise.dp_event(z_u / part.factor, b, setup.rounds),
                                   chain, setup, part.turns(setup.rounds))
        return Account(event, part.relation, part.factor * _clip_norm(chain, self),
                       f"tree aggregation over each {b} rounds (T = {setup.rounds}), one turn per "
                       f"tree (dp-accounting's SingleEpochTreeAggregation, a tree per b rounds)")
