"""The privacy of the shuffle-DP binomial vector sum (:mod:`fedjax_dp.privacy.shuffle`): its
exact PLD, events for a ledger, epsilon / delta and the noise calibration.

Privacy (unit: one report = one record; relation: add/remove one report, or replace one report):

* **Sensitivity.** Adding or removing one report changes each ``S_j`` by ``ybar_xj`` in
  ``[-K, K]``; replacing one changes it by ``ybar_xj - ybar_x'j`` in ``[-2K, 2K]``. Integer
  per-coordinate (L-infinity) sensitivity ``s = K`` (add/remove) or ``s = 2K`` (replace)
  (:func:`per_coordinate_sensitivity`).
* **One coordinate is dominated by ``(B + s, B)``, B ~ Bin(N, 1/2).** Fix a neighbouring pair. The
  other reports' rounded values ``R`` are independent of the changed report and of ``B``, so the
  coordinate's pair ``(R + B, R + D + B)`` (``D`` the random change) is a post-processing (add
  ``R``) of ``(B, D + B)``. By joint convexity of the hockey-stick divergence
  ``H_g(P || Q) = sum_o [P(o) - g Q(o)]_+``, ``H_g(D + B || B) <= max_k H_g(k + B || B)`` over
  the integers ``|k| <= s`` in the support of ``D`` (and likewise with the arguments swapped). The
  binomial pmf is log-concave, so ``P(B = o - k) / P(B = o)`` is non-decreasing in ``o`` for
  ``k > 0`` (monotone likelihood ratio): the Neyman-Pearson test of ``B`` against ``B + k`` at
  any level is the same threshold test for every ``k > 0``, and its power grows with ``k``; hence
  the trade-off function of ``(B, B + k)`` is pointwise above that of ``(B, B + s)`` for
  ``0 < k <= s``. With ``p = 1/2``, ``o -> N - o`` maps ``(B - k, B)`` onto ``(B + k, B)``, so
  negative shifts are no worse. Therefore ``H_g`` of every coordinate's pair is at most that of
  ``(B + s, B)`` for every ``g > 0`` and both orders: ``(B + s, B)`` is a dominating pair.
* **d coordinates.** Rounding and noise are independent across coordinates, so one release's
  pair is a product of per-coordinate pairs, each dominated by ``(B + s, B)``; products of
  dominated pairs are dominated by the product of the dominating pairs (product of the
  post-processing kernels). The release is dominated by ``(B + s, B)^{(x) d}``: its PLD is the
  per-coordinate PLD composed ``d`` times. This uses only the L-infinity bound; it is valid for any
  change vector (the L2 bound would give ~sqrt(d) less noise for Gaussian noise, but the rounding
  can move every coordinate by one grid step, and no single dominating pair is known for the
  binomial under an L2 constraint, so we do not claim it).
* **T releases** compose adaptively: the PLD composed ``d * T`` times
  (``self_compose``), as for any dominating pair (Zhu, Dong and Wang 2022, Thm. 10).
* The weights (which reports are real / sampled) may be random but must not depend on the
  neighbouring record's value beyond its presence. Amplification by subsampling is claimed only
  when the event says so (``sampling_probability = q < 1``: each record independently in each
  release with probability q, add/remove): one release's pair ``(P, Q)`` (d coordinates)
  becomes ``((1-q) Q + q P, Q)`` / ``(Q, (1-q) Q + q P)`` before the T releases compose
  (Zhu, Dong and Wang 2022, Thm. 11; computed from the pessimistic PLD of ``(P, Q)``).

The PLD of ``(B + s, B)`` is built EXACTLY from the two binomial pmfs: outcomes with
non-negligible mass are enumerated (a window of ``+- sqrt(35 N)`` around the mean, Hoeffding
tail ``<= e^-70`` per side), the exact mass outside the window (scipy's binomial cdf/sf) and the
mass where the other pmf is 0 become the infinity mass (pessimistic). Two discretisations, both
pessimistic (the reported delta is >= the true one):

* ``'connect_dots'`` (default): Doroshenko et al. 2022, Alg. 1
  (``dp_accounting.pld.pld_pmf.create_pmf_pessimistic_connect_dots``) from the exact
  hockey-stick curve at the rounded losses. Its error does not accumulate over the ``d * T``
  compositions the way rounding every loss up does, so it is the one to use for real ``d``.
* ``'buckets'``: ``dp_accounting.pld.privacy_loss_distribution.from_two_probability_mass_functions``
  (privacy buckets: each loss rounded up to the grid); exact input, but loose after many
  compositions (bias up to ``d T h``).

RDP does not apply: ``B + s`` puts mass where ``B`` has none, so every Renyi divergence is
infinite; the PLD accountant is the one that handles that mass (as ``delta``).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Mapping

import dp_accounting
import numpy as np
from dp_accounting.pld import pld_pmf
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from fedjax_dp.core import validation
from fedjax_dp.privacy import accounting, shuffle_l2
from fedjax_dp.privacy.shuffle import (MAX_NOISE_TRIALS, NOISE_PROBABILITY, WINDOW_Z,
                                       ShuffleConfig, check_config)
from fedjax_dp.privacy.shuffle_l2 import ANALYSES

__all__ = ["RELATIONS", "METHODS", "ANALYSES", "BinomialSumEvent", "per_coordinate_sensitivity",
           "make_event", "coordinate_pmfs", "coordinate_pld", "pld", "epsilon",
           "delta_for_epsilon", "calibrate_noise_trials"]

#: Neighbouring relations (one report = one record) and the text a ledger records for them.
RELATIONS: dict[str, str] = {
    "add_remove": "add/remove one report",
    "replace": "replace one report",
}

METHODS = ("connect_dots", "buckets")

#: The PLD discretisation used with the other events of a ledger (the PLD accountant's).
DEFAULT_PLD_DISCRETIZATION = accounting.DEFAULT_PLD_DISCRETIZATION

#: Finite-loss mass below which a composed PLD is replaced by "no privacy" (epsilon = inf).
_NO_PRIVACY_MASS = 1e-10

#: Outcomes whose (upper) mass is below e^this are moved to the infinity mass (pessimistic).
_LOG_TINY = -69.0


def per_coordinate_sensitivity(config: ShuffleConfig, relation: str = "add_remove") -> int:
    """Integer L-infinity sensitivity of the sums: ``K`` (add/remove one report) or ``2K``
    (replace one report)."""
    config = check_config(config)
    validation.check_choice("relation", relation, tuple(RELATIONS))
    return config.granularity * (2 if relation == "replace" else 1)


@dataclasses.dataclass(frozen=True)
class BinomialSumEvent:
    """``count`` releases of a ``dimension``-coordinate binomial sum: what a ledger records.

    Each coordinate of each release is dominated by the pair ``(B + sensitivity, B)``,
    ``B ~ Bin(noise_trials, 1/2)`` (module docstring); the PLD is that pair's composed
    ``dimension * count`` times. With ``sampling_probability = q < 1`` every record enters each
    release independently with probability ``q`` (Poisson; add/remove only): each release's
    pair is subsampled before the ``count`` releases compose (:func:`pld`).
    ``analysis``: ``'per_coordinate'`` (default: the pair above, Cheu et al.'s analysis) or
    ``'l2'`` (one release's dominating pair from the L2-clipped report's rounded set,
    :mod:`fedjax_dp.privacy.shuffle_l2`; add/remove, ``sensitivity`` = K, L2 clipping).
    JSON: :meth:`to_json` / :meth:`from_json` (``analysis`` written only when ``'l2'``).
    """
    noise_trials: int
    sensitivity: int
    dimension: int
    count: int = 1
    sampling_probability: float = 1.0
    analysis: str = "per_coordinate"

    CLASS_NAME = "BinomialSumEvent"

    def __post_init__(self):
        object.__setattr__(self, "noise_trials", validation.check_int(
            "noise_trials", self.noise_trials, minimum=1, maximum=2 ** 52))
        object.__setattr__(self, "sensitivity", validation.check_int(
            "sensitivity", self.sensitivity, minimum=1))
        object.__setattr__(self, "dimension", validation.check_int(
            "dimension", self.dimension, minimum=1))
        object.__setattr__(self, "count", validation.check_int("count", self.count, minimum=1))
        object.__setattr__(self, "sampling_probability", validation.check_probability(
            "sampling_probability", self.sampling_probability))
        validation.check_choice("analysis", self.analysis, ANALYSES)

    @property
    def compositions(self) -> int:
        return self.dimension * self.count

    def to_json(self) -> dict:
        return {"class_name": self.CLASS_NAME, "module_name": __name__,
                "noise_trials": self.noise_trials, "noise_probability": NOISE_PROBABILITY,
                "sensitivity": self.sensitivity, "dimension": self.dimension,
                "count": self.count, "sampling_probability": self.sampling_probability,
                **({} if self.analysis == "per_coordinate" else {"analysis": self.analysis})}

    @classmethod
    def from_json(cls, data: Mapping) -> "BinomialSumEvent":
        if not isinstance(data, Mapping) or data.get("class_name") != cls.CLASS_NAME:
            raise ValueError(f"data must be a {cls.CLASS_NAME} JSON object, got {data!r}")
        if data.get("noise_probability", NOISE_PROBABILITY) != NOISE_PROBABILITY:
            raise ValueError(f"noise_probability must be {NOISE_PROBABILITY} (the only one this "
                             f"analysis covers), got {data['noise_probability']!r}")
        return cls(noise_trials=data["noise_trials"], sensitivity=data["sensitivity"],
                   dimension=data["dimension"], count=data.get("count", 1),
                   sampling_probability=data.get("sampling_probability", 1.0),
                   analysis=data.get("analysis", "per_coordinate"))


def make_event(config: ShuffleConfig, dimension: int, releases: int = 1,
               relation: str = "add_remove", sampling_probability: float = 1.0,
               analysis: str = "per_coordinate") -> BinomialSumEvent:
    """The event for ``releases`` adaptive releases of :func:`shuffle_vector_sum` on ``[n, d]``.

    ``sampling_probability``: each record is a report of a release independently with this
    probability (Poisson sampling, e.g. the weights of a silo's minibatch); amplification is
    analysed for the add/remove relation only. ``analysis``: ``'per_coordinate'`` or ``'l2'``
    (:mod:`fedjax_dp.privacy.shuffle_l2`; needs ``config.norm == 'l2'`` and add/remove)."""
    q = validation.check_probability("sampling_probability", sampling_probability)
    _check_analysis(analysis, relation, check_config(config).norm)
    if q < 1 and relation != "add_remove":
        raise ValueError(f"sampling_probability < 1 needs relation='add_remove' (Poisson "
                         f"subsampling is analysed for add/remove only), got {relation!r}")
    return BinomialSumEvent(noise_trials=config.noise_trials,
                            sensitivity=per_coordinate_sensitivity(config, relation),
                            dimension=dimension, count=releases, sampling_probability=q,
                            analysis=analysis)


def _check_analysis(analysis: str, relation: str, norm: str = "l2") -> None:
    validation.check_choice("analysis", analysis, ANALYSES)
    if analysis == "l2" and relation != "add_remove":
        raise ValueError(f"analysis='l2' covers relation='add_remove' only, got {relation!r}")
    if analysis == "l2" and norm != "l2":
        raise ValueError(f"analysis='l2' needs reports clipped in L2 (config.norm='l2'), got "
                         f"norm={norm!r}")


def _log_binom(o: np.ndarray, n: int) -> np.ndarray:
    from scipy import stats
    return stats.binom.logpmf(o, n, NOISE_PROBABILITY)


def coordinate_pmfs(noise_trials: int, sensitivity: int) -> dict:
    """The dominating pair of one coordinate on its enumerated window (numpy, float64).

    Returns ``outcomes [m]`` (integers ``o``), ``log_upper [m] = log P(B + s = o)``,
    ``log_lower [m] = log P(B = o)``, and ``tail_upper`` / ``tail_lower``: each distribution's
    exact mass outside the window (scipy binomial cdf / sf).
    """
    from scipy import stats
    n = validation.check_int("noise_trials", noise_trials, minimum=1)
    s = validation.check_int("sensitivity", sensitivity, minimum=1)
    half = math.sqrt(WINDOW_Z * n)
    lo = max(0, math.floor(n / 2 - half))
    hi = min(n + s, math.ceil(n / 2 + s + half))
    o = np.arange(lo, hi + 1, dtype=np.int64)
    tail = lambda shift: float(stats.binom.cdf(lo - 1 - shift, n, NOISE_PROBABILITY)
                               + stats.binom.sf(hi - shift, n, NOISE_PROBABILITY))
    return {"outcomes": o, "log_upper": _log_binom(o - s, n), "log_lower": _log_binom(o, n),
            "tail_upper": tail(s), "tail_lower": tail(0)}


def _connect_dots_pmf(log_p: np.ndarray, log_q: np.ndarray, tail_p: float,
                      interval: float) -> pld_pmf.PLDPmf:
    """Pessimistic connect-the-dots PLD pmf of (upper P, lower Q) from the exact hockey stick.

    ``delta(e) = sum_{l(o) > e} (P(o) - e^e Q(o)) + P(l = inf)`` at the floor / ceil grid points of
    every finite loss ``l(o) = log P(o) - log Q(o)``."""
    # Outcomes the lower pmf cannot produce, and upper outcomes of negligible mass (< e^-69),
    # count as infinite loss (pessimistic; it keeps the loss range, hence the grid, short).
    tiny = log_p < _LOG_TINY
    inf_mass = tail_p + float(np.exp(log_p[(np.isneginf(log_q) | tiny)]).sum())
    fin = np.isfinite(log_q) & ~tiny
    loss = log_p[fin] - log_q[fin]
    order = np.argsort(-loss)
    desc = loss[order]
    cum_p = np.concatenate([[0.0], np.cumsum(np.exp(log_p[fin][order]))])
    cum_q = np.concatenate([[0.0], np.cumsum(np.exp(log_q[fin][order]))])
    grid = np.unique(np.concatenate([np.floor(loss / interval), np.ceil(loss / interval)]))
    grid = grid.astype(np.int64) if grid.size else np.zeros(1, np.int64)  # all mass infinite
    eps = grid * interval
    above = np.searchsorted(-desc, -eps, side="left")       # #outcomes with loss > eps
    deltas = cum_p[above] - np.exp(eps) * cum_q[above] + inf_mass
    # Float error only: make the curve non-increasing by raising values (never lowering them).
    deltas = np.clip(np.maximum.accumulate(deltas[::-1])[::-1], inf_mass, 1.0)
    return pld_pmf.create_pmf_pessimistic_connect_dots(interval, grid, deltas)


@functools.lru_cache(maxsize=64)
def coordinate_pld(noise_trials: int, sensitivity: int, *,
                   value_discretization_interval: float = DEFAULT_PLD_DISCRETIZATION,
                   method: str = "connect_dots") -> pld_lib.PrivacyLossDistribution:
    """PLD of one coordinate's dominating pair ``(B + s, B)``, both directions (remove: upper
    ``B + s``; add: upper ``B``), pessimistic. ``method``: ``'connect_dots'`` or ``'buckets'``
    (``from_two_probability_mass_functions``). Cached (PLDs are immutable)."""
    h = validation.check_positive("value_discretization_interval", value_discretization_interval)
    validation.check_choice("method", method, METHODS)
    pm = coordinate_pmfs(noise_trials, sensitivity)
    lp, lq = pm["log_upper"], pm["log_lower"]
    if method == "buckets":
        keys = pm["outcomes"].tolist()
        upper = dict(zip(keys, lp.tolist()))
        lower = dict(zip(keys, lq.tolist()))
        # Each window's outside mass as an outcome of its own distribution only: counted as
        # infinite loss in the direction where it is upper (>= its true contribution).
        upper["outside_upper"] = math.log(pm["tail_upper"]) if pm["tail_upper"] > 0 else -math.inf
        lower["outside_lower"] = math.log(pm["tail_lower"]) if pm["tail_lower"] > 0 else -math.inf
        return pld_lib.from_two_probability_mass_functions(
            lower, upper, pessimistic_estimate=True, value_discretization_interval=h,
            log_mass_truncation_bound=_LOG_TINY, symmetric=False)
    remove = _connect_dots_pmf(lp, lq, pm["tail_upper"], h)
    add = _connect_dots_pmf(lq, lp, pm["tail_lower"], h)
    return pld_lib.PrivacyLossDistribution(remove, add)


def _check_event(event: Any) -> BinomialSumEvent:
    if not isinstance(event, BinomialSumEvent):
        raise ValueError(f"event must be a BinomialSumEvent, got {type(event).__name__}")
    return event


@functools.lru_cache(maxsize=16)
def pld(event: BinomialSumEvent, *,
        value_discretization_interval: float = DEFAULT_PLD_DISCRETIZATION,
        method: str = "connect_dots") -> pld_lib.PrivacyLossDistribution:
    """The event's PLD (cached; PLDs are immutable).

    Without sampling: :func:`coordinate_pld` self-composed ``dimension * count`` times. With
    Poisson sampling ``q < 1``: one release's PLD (``dimension`` compositions) is subsampled
    (:func:`_subsampled`), then self-composed ``count`` times.
    """
    event = _check_event(event)
    h = value_discretization_interval
    q = event.sampling_probability
    if event.analysis == "l2":
        # One release's dominating pair from the L2 analysis, then the same subsampling and
        # composition as below.
        release = shuffle_l2.release_pld(event.noise_trials, event.sensitivity,
                                         event.dimension, h)
        if q < 1:
            release = _subsampled(release, q, h)
        return release if event.count == 1 else release.self_compose(event.count)
    one = coordinate_pld(event.noise_trials, event.sensitivity,
                         value_discretization_interval=h, method=method)
    per_release = event.dimension if q < 1 else event.compositions
    # Probability that a coordinate's loss is finite (B + s <= N); if a release has practically
    # none left, dp_accounting's composition and subsampling break down (all mass truncated; an
    # IndexError at N < s): every delta < 1 - 1e-10 then has epsilon = inf, and we say so with a
    # degenerate PLD. With sampling (q < 1) that is an upper bound, exact for every delta < q.
    from scipy import stats
    log_finite = float(stats.binom.logcdf(event.noise_trials - event.sensitivity,
                                          event.noise_trials, NOISE_PROBABILITY))
    if per_release * log_finite < math.log(_NO_PRIVACY_MASS):
        return pld_lib.PrivacyLossDistribution.create_from_rounded_probability(
            {0: _NO_PRIVACY_MASS}, 1.0 - _NO_PRIVACY_MASS, h)
    release = one if per_release == 1 else one.self_compose(per_release)
    if q == 1:
        return release
    sub = _subsampled(release, q, h)
    return sub if event.count == 1 else sub.self_compose(event.count)


def _subsampled(release: pld_lib.PrivacyLossDistribution, q: float, h: float
                ) -> pld_lib.PrivacyLossDistribution:
    """Poisson subsampling (rate ``q``, add/remove) of a release with dominating pair (P, Q).

    ``release``'s remove-direction PLD (pessimistic, so itself the PLD of a pair (P~, Q~) that
    dominates (P, Q)) gives P~ on the loss grid ``L``, ``Q~(L) = P~(L) e^-L`` and
    ``Q~(-inf) = 1 - sum_L Q~(L)``. Subsampling a dominated mechanism is dominated by
    ``((1-q) Q~ + q P~, Q~)`` (remove) and ``(Q~, (1-q) Q~ + q P~)`` (add) (Zhu, Dong and Wang
    2022, Thm. 11): losses ``log(1 - q + q e^L)`` and ``-log(1 - q + q e^L)``, with masses
    ``P~(L) (q + (1-q) e^-L)`` and ``P~(L) e^-L``; ``Q~(-inf)`` sits at ``log(1-q)`` and
    ``-log(1-q)``; ``P~(inf)`` stays infinite (remove, mass ``q P~(inf)``). Losses are rounded
    up to the grid (pessimistic). Reads the dense pmf's arrays (dp_accounting has no public
    accessor for them: these private fields are why pyproject.toml bounds dp-accounting < 0.7).
    """
    dense = release._pmf_remove.to_dense_pmf()                    # pylint: disable=protected-access
    loss = (dense._lower_loss + np.arange(dense.size)) * dense._discretization  # [m]
    p = np.asarray(dense._probs, dtype=np.float64)                # [m]
    p_inf = float(dense._infinity_mass)
    keep = p > 0
    loss, p = loss[keep], p[keep]
    q_fin = p * np.exp(-loss)                                     # Q~ on finite losses
    q_neg_inf = max(0.0, 1.0 - float(q_fin.sum()))
    log_mix = np.logaddexp(math.log1p(-q), math.log(q) + loss)    # log(1 - q + q e^L)

    def rounded(values: np.ndarray, masses: np.ndarray) -> dict:
        keys, where = np.unique(np.ceil(values / h).astype(np.int64), return_inverse=True)
        return dict(zip(keys.tolist(), np.bincount(where, weights=masses).tolist()))

    remove = rounded(np.append(log_mix, math.log1p(-q)),
                     np.append(p * (q + (1 - q) * np.exp(-loss)), (1 - q) * q_neg_inf))
    add = rounded(np.append(-log_mix, -math.log1p(-q)), np.append(q_fin, q_neg_inf))
    return pld_lib.PrivacyLossDistribution.create_from_rounded_probability(
        remove, q * p_inf, h, pessimistic_estimate=True,
        rounded_probability_mass_function_add=add, infinity_mass_add=0.0, symmetric=False)


def epsilon(config: ShuffleConfig, dimension: int, releases: int, delta: float, *,
            relation: str = "add_remove", method: str = "connect_dots",
            value_discretization_interval: float = DEFAULT_PLD_DISCRETIZATION,
            sampling_probability: float = 1.0, analysis: str = "per_coordinate") -> float:
    """Epsilon at ``delta`` of ``releases`` releases of the ``dimension``-coordinate sum (PLD;
    ``analysis`` ``'per_coordinate'`` or ``'l2'``, see :class:`BinomialSumEvent`)."""
    delta = validation.check_open_unit("delta", delta)
    event = make_event(check_config(config), dimension, releases, relation,
                       sampling_probability, analysis)
    return float(pld(event, value_discretization_interval=value_discretization_interval,
                     method=method).get_epsilon_for_delta(delta))


def delta_for_epsilon(config: ShuffleConfig, dimension: int, releases: int, epsilon: float, *,
                      relation: str = "add_remove", method: str = "connect_dots",
                      value_discretization_interval: float = DEFAULT_PLD_DISCRETIZATION,
                      analysis: str = "per_coordinate") -> float:
    """Delta at ``epsilon`` (the hockey-stick divergence of the composed PLD, both directions)."""
    epsilon = validation.check_nonnegative("epsilon", epsilon)
    event = make_event(check_config(config), dimension, releases, relation,
                       analysis=analysis)
    return float(pld(event, value_discretization_interval=value_discretization_interval,
                     method=method).get_delta_for_epsilon(epsilon))


def calibrate_noise_trials(target_epsilon: float, delta: float, *, granularity: int,
                           dimension: int, releases: int, relation: str = "add_remove",
                           max_trials: int = 2 ** 40, rtol: float = 0.0,
                           sampling_probability: float = 1.0,
                           value_discretization_interval: float = DEFAULT_PLD_DISCRETIZATION,
                           analysis: str = "per_coordinate",
                           target_name: str = "target_epsilon") -> int:
    """Smallest ``N`` with ``epsilon <= target_epsilon`` at ``delta`` (discrete search), for
    ``releases`` releases of ``dimension`` coordinates (Poisson-sampled at
    ``sampling_probability``).

    Epsilon is non-increasing in ``N`` (``Bin(N + 1) = Bin(N) + `` an independent bit: a
    post-processing), so doubling brackets the answer and integer bisection finds it (stopped once
    the bracket is within ``rtol`` relative width; ``rtol = 0``: the exact smallest ``N``). The
    result always meets the target. Raises ``ValueError`` if ``max_trials`` is not enough.
    ``analysis``: ``'per_coordinate'`` or ``'l2'`` (:class:`BinomialSumEvent`; for ``'l2'`` the
    bound is not proven monotone in ``N``, but the returned ``N`` is always one that was evaluated
    and meets the target)."""
    target = validation.check_positive("target_epsilon", target_epsilon, finite=True)
    delta = validation.check_open_unit("delta", delta)
    k = validation.check_int("granularity", granularity, minimum=1)
    dimension = validation.check_int("dimension", dimension, minimum=1)
    releases = validation.check_int("releases", releases, minimum=1)
    validation.check_choice("relation", relation, tuple(RELATIONS))
    q = validation.check_probability("sampling_probability", sampling_probability)
    if q < 1 and relation != "add_remove":
        raise ValueError(f"sampling_probability < 1 needs relation='add_remove', got "
                         f"{relation!r}")
    max_trials = validation.check_int("max_trials", max_trials, minimum=1,
                                      maximum=MAX_NOISE_TRIALS)
    rtol = validation.check_nonnegative("rtol", rtol)
    _check_analysis(analysis, relation)
    s = k * (2 if relation == "replace" else 1)
    # Largest N with no privacy at all (the L2 analysis needs N >= 2K: shuffle_l2.window).
    floor = 2 * k - 1 if analysis == "l2" else s - 1

    def eps_at(n: int) -> float:
        if n <= floor:
            return math.inf
        return float(pld(BinomialSumEvent(n, s, dimension, releases, q, analysis),
                         value_discretization_interval=value_discretization_interval
                         ).get_epsilon_for_delta(delta))

    # Start from the Gaussian approximation (std sqrt(N)/2, sensitivity s, d*T compositions),
    # then bracket [lo, hi] with eps(lo) > target >= eps(hi) by doubling / halving.
    # (L2: sensitivity max_rounded_l2 grid steps, T compositions.)
    if analysis == "l2":
        z = dp_accounting.get_sigma_gaussian(target, delta) * math.sqrt(releases)
        sens = shuffle_l2.max_rounded_l2(k, dimension)
    else:
        z = dp_accounting.get_sigma_gaussian(target, delta) * math.sqrt(dimension * releases)
        sens = s
    hi = int(min(max_trials, max(floor + 1, math.ceil(4 * (sens * z) ** 2))))
    while (eps_hi := eps_at(hi)) > target:
        if hi >= max_trials:
            fix = ("max_trials or the target" if target_name == "target_epsilon" else
                   target_name)              # a config's name for the target: its only lever
            raise ValueError(f"{target_name}={target:g} is unreachable with noise_trials <= "
                             f"max_trials={max_trials} (epsilon={eps_hi:.4g} at delta="
                             f"{delta:g}); raise {fix}")
        hi = min(2 * hi, max_trials)
    lo = max(floor, hi // 2)
    while lo > floor and eps_at(lo) <= target:
        hi, lo = lo, max(floor, lo // 2)                # below floor + 1: no privacy at all
    while hi - lo > max(1.0, rtol * lo):
        mid = (lo + hi) // 2
        if eps_at(mid) <= target:
            hi = mid
        else:
            lo = mid
    return hi
