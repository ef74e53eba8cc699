"""Confidence bounds on error rates and the empirical epsilon lower bound of a distinguishing test.

A mechanism M is (eps, delta)-DP for the neighbouring pair (D, D') only if every test
``reject D' when s(M(.)) >= tau`` has false-positive rate ``FPR = P[s(M(D')) >= tau]`` and
false-negative rate ``FNR = P[s(M(D)) < tau]`` with (Kairouz, Oh and Viswanath 2015, Thm. 2.1)

    FPR + e^eps FNR >= 1 - delta     and     FNR + e^eps FPR >= 1 - delta,

so with upper confidence bounds ``FPR_hi >= FPR`` and ``FNR_hi >= FNR``

    eps >= eps_lb = max( log((1 - delta - FNR_hi) / FPR_hi), log((1 - delta - FPR_hi) / FNR_hi), 0 )

(Jagielski, Ullman and Oprea 2020; Nasr et al. 2021). The rates' one-sided Clopper-Pearson
upper bounds (Clopper and Pearson 1934) from independent trials are each at level
``1 - alpha/2``, ``alpha = 1 - confidence``: by the union bound both hold at once with
probability >= ``confidence``, hence so does ``eps >= eps_lb``.

No data snooping (:func:`audit_threshold`): the threshold is chosen on the FIRST half of each
world's trials and the bound computed on the SECOND half, independent of the choice.
"""
from __future__ import annotations

import dataclasses

import numpy as np
from scipy import stats

from fedjax_dp.core import validation

__all__ = ["clopper_pearson", "clopper_pearson_upper", "clopper_pearson_lower",
           "epsilon_from_rates", "ThresholdBound", "audit_threshold", "error_counts"]


def _counts(successes, trials) -> tuple[np.ndarray, np.ndarray]:
    k = np.asarray(successes)
    n = np.asarray(trials)
    if k.dtype.kind not in "iu" or n.dtype.kind not in "iu":
        raise ValueError(f"successes and trials must be integers, got dtypes {k.dtype} and "
                         f"{n.dtype}")
    if np.any(n < 1) or np.any(k < 0) or np.any(k > n):
        raise ValueError("successes must be in [0, trials] and trials >= 1")
    return k.astype(np.float64), n.astype(np.float64)


def clopper_pearson_upper(successes, trials, alpha: float) -> np.ndarray:
    """One-sided ``1 - alpha`` upper bound on a binomial rate: ``Beta.ppf(1 - alpha, k + 1, n - k)``
    (1 when ``k = n``). Vectorised over ``successes`` / ``trials``."""
    alpha = validation.check_open_unit("alpha", alpha)
    k, n = _counts(successes, trials)
    with np.errstate(invalid="ignore"):
        hi = stats.beta.ppf(1.0 - alpha, k + 1.0, np.maximum(n - k, 1e-300))
    return np.where(k >= n, 1.0, hi)


def clopper_pearson_lower(successes, trials, alpha: float) -> np.ndarray:
    """One-sided ``1 - alpha`` lower bound: ``Beta.ppf(alpha, k, n - k + 1)`` (0 when ``k = 0``)."""
    alpha = validation.check_open_unit("alpha", alpha)
    k, n = _counts(successes, trials)
    with np.errstate(invalid="ignore"):
        lo = stats.beta.ppf(alpha, np.maximum(k, 1e-300), n - k + 1.0)
    return np.where(k <= 0, 0.0, lo)


def clopper_pearson(successes, trials, confidence: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """Two-sided Clopper-Pearson interval at ``confidence``: ``alpha / 2`` in each tail."""
    confidence = validation.check_open_unit("confidence", confidence)
    alpha = 1.0 - confidence
    return (clopper_pearson_lower(successes, trials, alpha / 2),
            clopper_pearson_upper(successes, trials, alpha / 2))


def epsilon_from_rates(fpr, fnr, delta: float) -> np.ndarray:
    """``max(log((1 - delta - fnr) / fpr), log((1 - delta - fpr) / fnr), 0)`` elementwise: with a
    test's exact rates the smallest epsilon it allows at ``delta``, with upper confidence bounds
    the audit's lower bound. A zero rate with a positive numerator gives infinity."""
    delta = validation.check_nonnegative("delta", delta)
    fpr = np.asarray(fpr, np.float64)
    fnr = np.asarray(fnr, np.float64)

    def ratio(num, den):
        with np.errstate(divide="ignore", invalid="ignore"):
            out = np.log(np.maximum(num, 0.0)) - np.log(den)
        return np.where(num > 0, out, -np.inf)

    both = np.maximum(ratio(1.0 - delta - fnr, fpr), ratio(1.0 - delta - fpr, fnr))
    return np.maximum(both, 0.0)


def error_counts(stat_d: np.ndarray, stat_d_prime: np.ndarray, thresholds: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """``(#{s(M(D')) >= tau}, #{s(M(D)) < tau})`` for every ``tau`` of ``thresholds [T]``."""
    d = np.sort(np.asarray(stat_d, np.float64))
    dp = np.sort(np.asarray(stat_d_prime, np.float64))
    t = np.asarray(thresholds, np.float64)
    false_pos = dp.size - np.searchsorted(dp, t, side="left")      # D' with s >= tau
    false_neg = np.searchsorted(d, t, side="left")                  # D with s < tau
    return false_pos.astype(np.int64), false_neg.astype(np.int64)


@dataclasses.dataclass(frozen=True)
class ThresholdBound:
    """The audit's bound: threshold (from the selection half), the evaluation half's counts and
    rates, their upper bounds and the epsilon lower bound at ``delta`` with ``confidence``."""

    epsilon_lower_bound: float
    threshold: float
    fpr: float                 # observed on the evaluation half
    fnr: float
    fpr_upper: float
    fnr_upper: float
    evaluation_trials: int     # per world


def _candidates(a: np.ndarray, b: np.ndarray, max_candidates: int) -> np.ndarray:
    pooled = np.concatenate([a, b])
    values = np.unique(pooled)
    if values.size <= max_candidates:
        return values
    qs = np.linspace(0.0, 1.0, max_candidates)
    return np.unique(np.quantile(pooled, qs, method="inverted_cdf"))


def audit_threshold(stat_d, stat_d_prime, delta: float, confidence: float = 0.95, *,
                    max_candidates: int = 2048) -> ThresholdBound:
    """The epsilon lower bound of the best threshold test, without data snooping (the module).

    ``stat_d [n]``, ``stat_d_prime [n']``: the statistic over independent trials in world D
    (where it tends to be larger) and D'. Candidate thresholds: the observed values, or
    ``max_candidates`` pooled quantiles; the test is ``s >= tau``. ``ValueError`` on fewer than
    2 trials per world or non-finite statistics.
    """
    delta = validation.check_open_unit("delta", delta)
    confidence = validation.check_open_unit("confidence", confidence)
    d = np.asarray(stat_d, np.float64).reshape(-1)
    dp = np.asarray(stat_d_prime, np.float64).reshape(-1)
    if d.size < 2 or dp.size < 2:
        raise ValueError(f"each world needs at least 2 trials, got {d.size} and {dp.size}")
    if not (np.all(np.isfinite(d)) and np.all(np.isfinite(dp))):
        raise ValueError("the statistics must be finite")
    alpha = (1.0 - confidence) / 2.0          # per rate: union bound over the two
    hd, hdp = d.size // 2, dp.size // 2
    sel_d, ev_d = d[:hd], d[hd:]
    sel_dp, ev_dp = dp[:hdp], dp[hdp:]
    cands = _candidates(sel_d, sel_dp, max_candidates)
    fp, fn = error_counts(sel_d, sel_dp, cands)
    score = epsilon_from_rates(clopper_pearson_upper(fp, hdp, alpha),
                               clopper_pearson_upper(fn, hd, alpha), delta)
    tau = float(cands[int(np.argmax(score))])
    fp, fn = error_counts(ev_d, ev_dp, np.asarray([tau]))
    n_d, n_dp = ev_d.size, ev_dp.size
    fpr_hi = float(clopper_pearson_upper(fp, n_dp, alpha)[0])
    fnr_hi = float(clopper_pearson_upper(fn, n_d, alpha)[0])
    eps = float(epsilon_from_rates(fpr_hi, fnr_hi, delta))
    return ThresholdBound(epsilon_lower_bound=eps, threshold=tau, fpr=float(fp[0]) / n_dp,
                          fnr=float(fn[0]) / n_d, fpr_upper=fpr_hi, fnr_upper=fnr_hi,
                          evaluation_trials=int(min(n_d, n_dp)))
