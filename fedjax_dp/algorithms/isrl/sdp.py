"""Shuffle-DP (SDP) MB-SGD and FedProx-SPIDER (Lowy et al., Alg. E.1 / Alg. 10 with the vector
summation protocol of Cheu et al. 2021 instead of Gaussian noise).

Round r: every available silo turns each sampled record into one report -- its per-record
gradient (MB-SGD, SPIDER refresh), or ``(C / tau) clip_tau(clip_C(g(w_r)) - clip_C(g(w_{r-1})))``
(SPIDER difference, norm <= C) -- and ALL available silos' reports go through one shuffled vector
sum (:func:`fedjax_dp.privacy.shuffle.shuffle_vector_sum`; the local randomiser runs in the silo
with its own key, :func:`uploads.encode_reports`, the binomial noise once on the sum,
:func:`uploads.shuffled_estimate`). The server decodes the sum, rescales a difference sum by
tau / C, divides by the expected number of reports ``sum_{i in S_r} p_i n_i`` and steps as the
Gaussian variant does (``prox_{eta f1}(w - eta v)``).

Privacy. A central guarantee after shuffling (the trusted shuffler hides who sent what): unit
``'shuffle'``, relation add/remove one report = one record of one silo. One release moves each
coordinate's integer sum by at most K (:mod:`fedjax_dp.privacy.shuffle_accounting`); a record of
silo i can only be in the releases of the rounds silo i was available, and in each it is a
report with probability p_i (the silo's own Poisson record sampling, secret; the largest of its
rates over the upload kinds), so silo i's records compose ``count_i`` Poisson-subsampled releases
of the d-coordinate binomial sum: ``make_event(config, d, count_i, sampling_probability=p_i)``,
accounted by the PLD of the binomial pair (``BinomialSumEvent``; PLD only). No amplification from
silo availability. The worst silo is found by parallel composition over the silos not dominated
in (p_i, count_i). ``noise_trials`` N is calibrated (``calibrate_noise_trials``) for R releases
at the largest p_i.
"""
from __future__ import annotations

import dataclasses

import jax
import numpy as np

from fedjax_dp.algorithms.isrl import mb_sgd, protocol, spider
from fedjax_dp.algorithms.isrl.protocol import Algorithm
from fedjax_dp.core import validation
from fedjax_dp.privacy import PrivacyLedger, calibration, shuffle
from fedjax_dp.privacy.shuffle_accounting import (ANALYSES, RELATIONS, calibrate_noise_trials,
                                                  make_event)

UNIT = "shuffle"
RELATION = RELATIONS["add_remove"]


@dataclasses.dataclass(frozen=True)
class Config(protocol.Config):
    """SDP MB-SGD. clip_norm: C (L2 over the whole vector, also the protocol's bound).
    target_epsilon / delta: the central guarantee after shuffling (delta defaults to
    ``[privacy].delta`` from a config file). granularity: K, grid step C / K. noise_trials: N
    (skip calibration). shuffle_analysis: how the binomial sums are accounted (calibration and
    ledger): ``'per_coordinate'`` (default; Cheu et al.'s analysis, the paper's) or ``'l2'``
    (the L2-clipped report's rounded set, :mod:`fedjax_dp.privacy.shuffle_l2`).
    report_objective, diagnostics: off by default, as every private member's
    (:class:`protocol.PrivateConfig`; explicit opt-ins the ledger then declares)."""

    report_objective: bool = False      # the round metrics computed without noise: opt-ins
    diagnostics: bool = False
    clip_norm: float = 1.0
    target_epsilon: float = 1.0
    delta: float = 1e-5
    granularity: int = 16
    noise_trials: int | None = None
    shuffle_analysis: str = "per_coordinate"

    FIELDS = {**protocol.BUDGET_FIELDS, "granularity": validation.Int(1, 2 ** 20),
              "noise_trials": validation.Int(1, 2 ** 52, optional=True),
              "shuffle_analysis": validation.Choice(ANALYSES)}


@dataclasses.dataclass(frozen=True)
class SpiderConfig(Config):
    """SDP FedProx-SPIDER: as :class:`Config` plus phase_length q, diff_batch_size K2 (None: K1),
    smoothness beta_hat (None: clip differences at 2C)."""

    phase_length: int = 2
    diff_batch_size: int | None = None
    smoothness: float | None = None

    FIELDS = protocol.SPIDER_FIELDS


def dimension(params) -> int:
    """d: the number of coordinates of one report (all parameters)."""
    return int(sum(np.size(l) for l in jax.tree.leaves(params)))


@dataclasses.dataclass(frozen=True)
class ShuffleAlgorithm(Algorithm):
    """An SDP member: the shuffled vector sum replaces the Gaussian uploads."""

    def mechanism(self, config, rates: np.ndarray, params) -> tuple[float, dict]:
        """Noise trials N: calibrated for R releases at the largest record rate of any silo."""
        trials = config.noise_trials
        if trials is None:
            trials = calibrate_noise_trials(
                config.target_epsilon, config.delta, granularity=config.granularity,
                dimension=dimension(params), releases=config.rounds,
                sampling_probability=float(np.max(rates)), analysis=config.shuffle_analysis,
                target_name="algorithm.target_epsilon")
        cfg = shuffle.ShuffleConfig(clip_norm=float(config.clip_norm),
                                    granularity=int(config.granularity), noise_trials=int(trials))
        return 0.0, {"shuffle": cfg}

    def privacy_units(self, config) -> tuple[str, ...]:
        """The ``privacy_units`` hook: ``shuffle``."""
        return (UNIT,)

    def ledger(self, config, state) -> PrivacyLedger:
        """Each silo's releases as one ``BinomialSumEvent`` (count = rounds it was available,
        sampling probability = its largest record rate); worst silo by parallel composition."""
        if state is None:
            raise ValueError("state must be the run's state (its release counts feed the ledger)")
        ctx = state.context
        cfg: shuffle.ShuffleConfig = ctx.spec.shuffle
        counts = np.asarray(state.values["uploads"], np.int64).sum(axis=1)     # [N] releases
        rates = np.max(np.asarray(ctx.rates, np.float64), axis=1)              # [N]
        d = dimension(state.values["params"])
        keep = [i for i in calibration.worst_members(rates[:, None], counts[:, None]).tolist()
                if counts[i] > 0]
        note = (f"{self.name}: shuffled binomial vector sums (N = {cfg.noise_trials} noise "
                f"trials, granularity K = {cfg.granularity}, C = {cfg.clip_norm:g}, d = {d}"
                f"{'; L2 analysis' if config.shuffle_analysis == 'l2' else ''}); "
                f"silo i's records are Poisson-sampled with its largest record rate in each of "
                f"the releases of the rounds it was available (no amplification from silo "
                f"availability); members = silos {keep[:20]} (the others are dominated)")
        out = protocol.declare_uncovered(config, PrivacyLedger())
        if not keep:
            import dp_accounting
            return out.add_event(UNIT, dp_accounting.NoOpDpEvent(), relation=RELATION, note=note)
        events = [make_event(cfg, d, int(counts[i]), sampling_probability=float(rates[i]),
                             analysis=config.shuffle_analysis) for i in keep]
        return out.add_parallel(UNIT, events, relation=RELATION, note=note)


SDP_MB_SGD = ShuffleAlgorithm(
    name="sdp_mb_sgd", Config=Config, method=mb_sgd.RULE.name, private=True,
    DESCRIPTION="SDP MB-SGD: shuffled binomial vector sums of per-record gradients (Lowy et al.)")
SDP_SPIDER = ShuffleAlgorithm(
    name="sdp_spider", Config=SpiderConfig, method=spider.RULE.name, private=True,
    DESCRIPTION="SDP FedProx-SPIDER: refresh and difference sums through the shuffle protocol "
                "(Lowy et al. 2023, Alg. 10)")
