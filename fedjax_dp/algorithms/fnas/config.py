"""DP-FNAS's configuration (:class:`Config`, validated on construction) and the search's
hyperparameters derived from it (:func:`search_hyper`)."""
from __future__ import annotations

import dataclasses

from fedjax_dp.algorithms.fnas import steps
from fedjax_dp.core import validation
from fedjax_dp.models import darts

__all__ = ["Config", "RANDOM_GENOTYPE", "mechanism", "memory_drivers", "search_hyper"]

_v = validation

#: ``Config.fixed_genotype`` value that retrains a random genotype (no search).
RANDOM_GENOTYPE = "random"


@dataclasses.dataclass(frozen=True)
class Config:
    """DP-FNAS search (DARTS space, Algorithm 1) and retraining of the derived network.

    Search space: ``nodes`` (>= 1), ``channels`` (>= 1), ``cells`` (>= 1), ``primitives``
    (subset of the 8 DARTS primitives), ``stem_multiplier``.
    Search: ``search_epochs``, ``batch_size`` B (expected Poisson batch of the smallest party's
    half: rate ``min(1, B / min_k n_k)`` for all parties), ``order`` ('first' | 'second'),
    ``second_order_method`` ('finite_difference' | 'jvp'), ``xi`` (virtual step), weight SGD
    ``w_lr`` (cosine to ``w_lr_min``), ``w_momentum``, ``w_weight_decay``; alpha Adam
    ``alpha_lr``, ``alpha_b1``, ``alpha_b2``, ``alpha_weight_decay``.
    Privacy: ``private`` (False: FNAS, no clipping and no noise); clip norms R^G
    ``clip_weights``, R^H ``clip_arch``, R^C ``clip_second`` (> 0) and noise multipliers sigma
    ``noise_weights``, tau ``noise_arch``, ``noise_second`` (>= 0).
    Retraining: ``retrain_epochs``, ``retrain_batch_size``, ``retrain_lr``, ``retrain_channels``
    / ``retrain_cells`` (0: as in the search), ``clip_retrain``, ``noise_retrain``;
    ``fixed_genotype`` (a genotype's JSON): skip the search and retrain that genotype;
    ``"random"`` (:data:`RANDOM_GENOTYPE`): retrain a uniformly random genotype of the same size
    (:func:`darts.random_genotype`, key stream ``"random_genotype"``, independent of the data).
    ``private_retrain`` (default true): false retrains WITHOUT clipping or noise after a private
    search (the paper's protocol; the ledger then declares the retrained network uncovered).
    ``retrain_seed`` (default -1: the run's key): >= 0 draws the retraining's initialisation,
    sampling and noise from ``key(retrain_seed)``, so one search is retrained under several seeds.
    ``diagnostics`` (default false): every epoch also reports its losses, clipped fractions and
    realised batch sizes, computed from the parties' records without noise; an explicit opt-in
    the ledger then declares uncovered (without it an epoch reports its phase and timings only).
    """

    nodes: int = 4
    channels: int = 4
    cells: int = 3
    primitives: tuple = darts.PRIMITIVES
    stem_multiplier: int = 3
    search_epochs: int = 10
    batch_size: int = 32
    order: str = "first"
    second_order_method: str = "finite_difference"
    xi: float = 0.025
    w_lr: float = 0.025
    w_lr_min: float = 0.001
    w_momentum: float = 0.9
    w_weight_decay: float = 3e-4
    alpha_lr: float = 3e-4
    alpha_b1: float = 0.5
    alpha_b2: float = 0.999
    alpha_weight_decay: float = 1e-3
    private: bool = True
    clip_weights: float = 1.0
    clip_arch: float = 1.0
    clip_second: float = 1.0
    noise_weights: float = 1.0
    noise_arch: float = 1.0
    noise_second: float = 1.0
    retrain_epochs: int = 10
    retrain_batch_size: int = 32
    retrain_lr: float = 0.05
    retrain_channels: int = 0
    retrain_cells: int = 0
    clip_retrain: float = 1.0
    noise_retrain: float = 1.0
    fixed_genotype: str = ""
    private_retrain: bool = True
    retrain_seed: int = -1
    diagnostics: bool = False        # the non-private epoch metrics: an explicit opt-in

    FIELDS = {"nodes": _v.Int(1, 64), "channels": _v.Int(1, _v.WIDTH_MAX),
              "cells": _v.Int(1, 1024),
              "primitives": _v.Custom(darts.check_primitives, bad=("x", 3)),
              "stem_multiplier": _v.Int(1, 1024), "search_epochs": _v.Int(1),
              "batch_size": _v.Int(1, _v.BATCH_MAX), "order": _v.Choice(("first", "second")),
              "second_order_method": _v.Choice(("finite_difference", "jvp")),
              "xi": _v.Float(0.0), "w_lr": _v.Float(0.0, low_open=True),
              "w_lr_min": _v.Float(0.0, low_open=True), "w_momentum": _v.Float(0.0),
              "w_weight_decay": _v.Float(0.0), "alpha_lr": _v.Float(0.0, low_open=True),
              # Adam's betas: 1 divides by 1 - beta^t = 0 (NaN in the first step)
              "alpha_b1": _v.Float(0.0, 1.0, high_open=True),
              "alpha_b2": _v.Float(0.0, 1.0, high_open=True),
              "alpha_weight_decay": _v.Float(0.0), "private": _v.Bool(),
              "clip_weights": _v.Float(0.0, low_open=True),
              "clip_arch": _v.Float(0.0, low_open=True),
              "clip_second": _v.Float(0.0, low_open=True),
              "noise_weights": _v.Float(0.0), "noise_arch": _v.Float(0.0),
              "noise_second": _v.Float(0.0), "retrain_epochs": _v.Int(0),
              "retrain_batch_size": _v.Int(1, _v.BATCH_MAX),
              "retrain_lr": _v.Float(0.0, low_open=True),
              "retrain_channels": _v.Int(0, _v.WIDTH_MAX), "retrain_cells": _v.Int(0, 1024),
              "clip_retrain": _v.Float(0.0, low_open=True), "noise_retrain": _v.Float(0.0),
              "fixed_genotype": _v.Text("a genotype JSON string, \"random\" or \"\""),
              "private_retrain": _v.Bool(), "retrain_seed": _v.Int(-1),
              "diagnostics": _v.Bool()}

    def __post_init__(self):
        validation.check_config(self, "algorithm")
        if self.fixed_genotype == RANDOM_GENOTYPE:
            if self.retrain_epochs < 1:
                raise ValueError("algorithm.retrain_epochs must be >= 1 with a fixed_genotype")
        elif self.fixed_genotype:
            try:
                g = darts.Genotype.from_json(self.fixed_genotype)
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"algorithm.fixed_genotype is not a valid genotype: {e}") from None
            if g.nodes != self.nodes:
                raise ValueError(f"algorithm.fixed_genotype has {g.nodes} nodes but "
                                 f"algorithm.nodes is {self.nodes}")
            if self.retrain_epochs < 1:
                raise ValueError("algorithm.retrain_epochs must be >= 1 with a fixed_genotype")

    @property
    def retrain_private(self) -> bool:
        """Whether retraining clips and adds noise (``private`` and ``private_retrain``)."""
        return self.private and self.private_retrain

    @property
    def search_steps(self) -> int:
        """Search epochs run (0 when ``fixed_genotype`` skips the search)."""
        return 0 if self.fixed_genotype else self.search_epochs

    @property
    def rounds(self) -> int:
        """Total protocol steps (search epochs + retrain epochs), for progress displays."""
        return self.search_steps + self.retrain_epochs

    @property
    def space(self) -> darts.SearchSpace:
        return darts.SearchSpace(nodes=self.nodes, channels=self.channels, cells=self.cells,
                                 primitives=self.primitives, stem_multiplier=self.stem_multiplier)


def mechanism(config: Config, clip: str, noise: str, private: bool | None = None
              ) -> steps.Mechanism:
    """The clip and noise of one privatised update, read from ``config``'s fields ``clip`` /
    ``noise``."""
    return steps.Mechanism(clip=float(getattr(config, clip)), noise=float(getattr(config, noise)),
                           private=config.private if private is None else private)


def search_hyper(config: Config, total_iterations: int) -> steps.SearchHyper:
    return steps.SearchHyper(
        weights=mechanism(config, "clip_weights", "noise_weights"),
        arch=mechanism(config, "clip_arch", "noise_arch"),
        second=mechanism(config, "clip_second", "noise_second"),
        order=config.order, second_order_method=config.second_order_method, xi=config.xi,
        w_lr=config.w_lr, w_lr_min=config.w_lr_min, w_momentum=config.w_momentum,
        w_weight_decay=config.w_weight_decay, total_iterations=total_iterations,
        alpha_lr=config.alpha_lr, alpha_b1=config.alpha_b1, alpha_b2=config.alpha_b2,
        alpha_weight_decay=config.alpha_weight_decay)


def memory_drivers(config: Config, phase: str) -> dict:
    """The config keys (-> values) that drive a ``phase`` iteration's memory."""
    if phase == "search":
        return {f"algorithm.{k}": getattr(config, k)
                for k in ("batch_size", "channels", "cells", "nodes")}
    return {"algorithm.retrain_batch_size": config.retrain_batch_size,
            **{f"algorithm.retrain_{k}": getattr(config, f"retrain_{k}") or
               f"0 -> {getattr(config, k)}" for k in ("channels", "cells")}}
