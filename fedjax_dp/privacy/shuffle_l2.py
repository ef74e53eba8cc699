"""An L2-sensitivity analysis of the shuffle-DP binomial vector sum (one release's dominating PLD).

The per-coordinate analysis of :mod:`fedjax_dp.privacy.shuffle_accounting` (Cheu et al. 2021's
and Lowy et al.'s) lets EVERY coordinate of one report move its sum by the full grid range ``K``:
``d`` compositions of the pair ``(B + K, B)``, i.e. an effective L2 sensitivity of
``K sqrt(d)`` grid steps. A report clipped in L2 cannot do that. This module accounts one release
by the set of rounded reports an L2-clipped record can actually produce, with Renyi divergences
(additive over coordinates, so the worst report of the set is a small knapsack), and turns the
resulting privacy profile into a dominating pair (a PLD), which then goes through the SAME
Poisson subsampling and composition code as the per-coordinate analysis
(:func:`fedjax_dp.privacy.shuffle_accounting.pld` with ``event.analysis == 'l2'``).

**The rounded reports** (add/remove one report; ``norm = 'l2'``). ``y = K clip(x) / C`` has
``||y||_2 <= K`` and ``|y_j| <= K``; randomised rounding gives ``m_j in {floor(y_j), ceil(y_j)}``,
so ``|m_j| <= ceil(|y_j|)`` and ``|y_j| > |m_j| - 1`` whenever ``m_j != 0``. Hence every
possible rounded report lies in

    S(K, d) = { m in Z^d : |m_j| <= K,  sum_{j: m_j != 0} (|m_j| - 1)^2 <= K^2 - 1 }       (1)

(the strict ``< K^2`` of integers). Its largest L2 norm (:func:`max_rounded_l2`) is about
``K + sqrt(d)`` grid steps, not ``K``: every coordinate may round away from 0.

**One coordinate.** ``B ~ Bin(N, 1/2)``, window ``W = [a, b]`` with ``a = max(0, N/2 - sqrt(Z N))``
and ``b = min(N - K, N/2 + sqrt(Z N))`` (``Z = 20``), ``pi = P(B not in W)`` (exact, scipy).
``P'_k`` = law of ``B + k`` given ``B in W`` (``0 < k <= K``): supported inside ``[0, N]``, so
its Renyi divergence from ``B`` is finite:

    f_alpha(k) = D_alpha(P'_k || B) = log sum_{o in W} P'_k(o + k)^alpha P(B = o + k)^(1 - alpha)
                 / (alpha - 1)                                                              (2)

(computed exactly on the window). With ``p = 1/2``, ``o -> N - o`` maps ``(B - k, B)`` onto
``(B + k, B)`` and ``D_alpha(B || B + k)`` = ``D_alpha(B - k || B)``: both directions and both
signs give (2).

**One release.** Fix a neighbouring pair; the other reports' sum ``R`` is independent of the
changed report's rounding ``m`` and of the noise, so the release pair is a post-processing (add
``R``) of ``(m + B_vec, B_vec)`` mixed over ``m in S(K, d)``. Write ``m + B_vec = (1 - pi_d) P'_m +
pi_d P''_m`` with ``P'_m = (x)_j P'_{m_j}`` (every noise coordinate in its window; the mass
``pi_d = 1 - (1 - pi)^d`` goes to ``P''``, padded to the same ``pi_d`` for every ``m``). Renyi
divergence is additive over independent coordinates and ``exp((alpha - 1) D_alpha)`` is jointly
convex, so (Mironov 2017, Prop. 1 and the convexity of Renyi divergence)

    rho(alpha) = max_{m in S(K, d)} sum_j f_alpha(|m_j|)                                    (3)

bounds ``D_alpha`` of the good part of the mixture in either direction; (3) is a knapsack over
the number of coordinates raised above 1 and the budget ``K^2 - 1`` (:func:`release_rdp`,
exact dynamic programming). The conversion of Canonne, Kamath and Steinke 2020 (Prop. 12; the
one ``dp_accounting`` uses) gives, for every ``eps``,

    delta_1(eps) = pi_d + min_alpha exp((alpha - 1)(rho(alpha) - eps)) (1 - 1/alpha)^(alpha - 1)
                   / alpha                                                                 (4)

and for ``eps < 0`` the identity ``H_{e^eps}(P||Q) = 1 - e^eps + e^eps H_{e^-eps}(Q||P)``.

**A dominating pair.** The true hockey-stick curve of the release is convex in ``g = e^eps``,
equals 1 at ``g = 0`` and lies below (4); hence it lies below the lower convex hull of (4)'s
points on a grid (and of ``(0, 1)``). The connect-the-dots PLD (Doroshenko et al. 2022, Alg. 1;
``pld_pmf.create_pmf_pessimistic_connect_dots``) of those hull values has exactly the
piecewise-linear hull as its hockey-stick curve, so it is a dominating pair of the release for
every ``g >= 0`` in both directions (Zhu, Dong and Wang 2022, Def. 7): Poisson subsampling
(their Thm. 11) and adaptive composition (Thm. 10) then apply to it exactly as to the
per-coordinate pair (:func:`fedjax_dp.privacy.shuffle_accounting.pld`).

The result is a valid upper bound for add/remove of one report clipped in L2 (``norm = 'l2'``), but
NOT always tighter than the per-coordinate analysis (small ``d`` or ``K = 1``: the RDP conversion
(4) costs a little), which therefore stays the default (docs/shuffle_dp.md)."""
from __future__ import annotations

import functools
import math

import numpy as np
from dp_accounting.pld import pld_pmf
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from fedjax_dp.core import validation

__all__ = ["ANALYSES", "ORDERS", "max_rounded_l2", "window",
           "coordinate_rdp", "release_rdp", "release_delta", "release_pld"]

#: The two analyses of the binomial vector sum: Cheu et al.'s per-coordinate one (default) and
#: this module's L2 one.
ANALYSES = ("per_coordinate", "l2")

#: Renyi orders of (3)-(4) (any real alpha > 1 may be used for one release).
ORDERS: tuple = tuple(float(a) for a in np.concatenate([
    1.0 + np.geomspace(0.01, 1.0, 20, endpoint=False), np.arange(2.0, 12.0, 0.25),
    np.arange(12.0, 64.0, 1.0), np.arange(64.0, 257.0, 8.0)]))

#: Half-width of the noise window in units of sqrt(N): P(outside) <= 2 e^{-2 Z} (Hoeffding).
WINDOW_Z = 20.0

#: Epsilon grid of the dominating pair: points in [-EPS_MAX, EPS_MAX] (multiples of the PLD
#: discretisation interval); the curve above EPS_MAX is taken as the infinity mass.
_GRID_POINTS = 2001


def _check(noise_trials, granularity, dimension) -> tuple[int, int, int]:
    n = validation.check_int("noise_trials", noise_trials, minimum=1)
    k = validation.check_int("granularity", granularity, minimum=1)
    d = validation.check_int("dimension", dimension, minimum=1)
    return n, k, d


def _knapsack(values: np.ndarray, granularity: int, dimension: int) -> np.ndarray:
    """``max_{m in S(K, d)} sum_j values[:, |m_j|]`` per row (1): ``values [A, K + 1]``, column 0
    = 0 (an unchanged coordinate). Dynamic programming over the number ``c`` of coordinates
    with ``|m_j| >= 2`` (cost ``(|m_j| - 1)^2 >= 1`` each, so ``c <= K^2 - 1``) and the budget
    used; the other ``d - c`` coordinates take ``|m_j| = 1`` (cost 0) or 0, whichever is worth
    more. Returns ``[A]``."""
    k, d = granularity, dimension
    budget = k * k - 1
    free = np.maximum(values[:, 1], 0.0) if k >= 1 else np.zeros(len(values))   # [A]
    best = free * d                                      # c = 0
    if k < 2 or budget < 1:
        return best
    a = values.shape[0]
    neg = -np.inf
    v = np.full((a, budget + 1), neg)
    v[:, 0] = 0.0                                        # V[c=0][cost exactly 0]
    for c in range(1, min(d, budget) + 1):
        nxt = np.full((a, budget + 1), neg)
        for m in range(2, k + 1):
            cost = (m - 1) ** 2
            if cost > budget:
                break
            cand = v[:, :budget + 1 - cost] + values[:, m:m + 1]
            nxt[:, cost:] = np.maximum(nxt[:, cost:], cand)
        v = nxt
        if not np.isfinite(v).any():
            break
        best = np.maximum(best, v.max(axis=1) + free * (d - c))
    return best


def max_rounded_l2(granularity: int, dimension: int) -> float:
    """``max ||m||_2`` over the rounded reports (1), in grid steps (``K + sqrt(d)`` at most,
    up to the rounding): the L2 sensitivity of the integer sums (add/remove)."""
    k = validation.check_int("granularity", granularity, minimum=1)
    d = validation.check_int("dimension", dimension, minimum=1)
    sq = np.arange(k + 1, dtype=np.float64)[None, :] ** 2
    return float(math.sqrt(_knapsack(sq, k, d)[0]))


def window(noise_trials: int, granularity: int) -> tuple[int, int, float]:
    """``(a, b, pi)``: the noise window ``W = [a, b]`` (``b <= N - K``) and ``pi = P(B not in
    W)``, exact (scipy)."""
    from scipy import stats
    n = validation.check_int("noise_trials", noise_trials, minimum=1)
    k = validation.check_int("granularity", granularity, minimum=1)
    if n < 2 * k:
        raise ValueError(f"noise_trials must be >= 2 * granularity = {2 * k} for the L2 "
                         f"analysis (the shifted binomial must fit in [0, N]), got {n}")
    half = math.sqrt(WINDOW_Z * n)
    a = max(0, math.floor(n / 2 - half))
    b = min(n - k, math.ceil(n / 2 + half))
    pi = float(stats.binom.cdf(a - 1, n, 0.5) + stats.binom.sf(b, n, 0.5)) if (a > 0 or b < n) \
        else 0.0
    return a, b, min(1.0, pi)


@functools.lru_cache(maxsize=32)
def coordinate_rdp(noise_trials: int, granularity: int, orders: tuple = ORDERS) -> np.ndarray:
    """(2): ``f[i, k] = D_{orders[i]}(P'_k || B)`` for ``k = 0..K`` (column 0 = 0): ``[A, K+1]``."""
    from scipy import stats
    from scipy.special import logsumexp
    a, b, pi = window(noise_trials, granularity)
    n, k = noise_trials, granularity
    al = np.asarray(orders, np.float64)[:, None]                          # [A, 1]
    if np.any(al <= 1):
        raise ValueError(f"orders must be > 1, got {orders!r}")
    o = np.arange(a, b + 1, dtype=np.int64)                               # [W]
    log_p = stats.binom.logpmf(o, n, 0.5) - math.log1p(-pi)               # log P'_k(o + k)
    out = np.zeros((al.shape[0], k + 1))
    rows = max(1, int(4e6 // len(o)))                  # orders per chunk: [rows, W] <= 4M floats
    for s in range(1, k + 1):
        log_q = stats.binom.logpmf(o + s, n, 0.5)                         # log P(B = o + k)
        for i in range(0, al.shape[0], rows):
            a_ = al[i:i + rows]
            terms = a_ * log_p[None, :] + (1.0 - a_) * log_q[None, :]     # [rows, W]
            out[i:i + rows, s] = np.maximum(logsumexp(terms, axis=1) / (a_[:, 0] - 1.0), 0.0)
    return out


@functools.lru_cache(maxsize=32)
def release_rdp(noise_trials: int, granularity: int, dimension: int,
                orders: tuple = ORDERS) -> tuple[np.ndarray, float]:
    """(3) and the decomposition mass: ``(rho [A], pi_d)`` for one release of the ``d``-coordinate
    sum (add/remove one L2-clipped report, worst rounded report of (1))."""
    n, k, d = _check(noise_trials, granularity, dimension)
    f = coordinate_rdp(n, k, tuple(orders))
    _, _, pi = window(n, k)
    pi_d = -math.expm1(d * math.log1p(-pi)) if pi < 1 else 1.0
    return _knapsack(f, k, d), float(pi_d)


def release_delta(noise_trials: int, granularity: int, dimension: int,
                  epsilons: np.ndarray) -> np.ndarray:
    """(4): an upper bound on one release's hockey-stick divergence at each ``eps`` (either
    direction), ``[E]``; negative ``eps`` by the identity in the module docstring."""
    rho, pi_d = release_rdp(noise_trials, granularity, dimension)
    al = np.asarray(ORDERS, np.float64)[:, None]                          # [A, 1]
    eps = np.asarray(epsilons, np.float64)

    def positive(e):                                                      # e >= 0, [E]
        log_d = ((al - 1) * (rho[:, None] - e[None, :] + np.log1p(-1.0 / al)) - np.log(al))
        return np.minimum(1.0, np.exp(np.min(log_d, axis=0)) + pi_d)

    out = np.empty_like(eps)
    pos = eps >= 0
    out[pos] = positive(eps[pos])
    neg = ~pos
    if neg.any():
        e = eps[neg]
        out[neg] = np.minimum(1.0, -np.expm1(e) + np.exp(e) * positive(-e))
    return out


def _lower_hull(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Values at ``x`` (increasing) of the greatest convex function below the points
    ``(x_i, y_i)`` (monotone chain; linear between hull vertices)."""
    hull: list[int] = []
    for i in range(len(x)):
        while len(hull) >= 2:
            i0, i1 = hull[-2], hull[-1]
            # drop i1 if it lies on or above the chord i0 -> i
            if (y[i1] - y[i0]) * (x[i] - x[i0]) >= (y[i] - y[i0]) * (x[i1] - x[i0]):
                hull.pop()
            else:
                break
        hull.append(i)
    return np.interp(x, x[hull], y[hull])


@functools.lru_cache(maxsize=32)
def release_pld(noise_trials: int, granularity: int, dimension: int,
                value_discretization_interval: float) -> pld_lib.PrivacyLossDistribution:
    """A dominating pair (PLD, both directions) of ONE release under the L2 analysis: the
    connect-the-dots PLD of the lower convex hull (in ``e^eps``, with the point ``(0, 1)``) of (4)
    on a grid of ``eps`` in ``[-E, E]``, ``E`` where (4) has reached its floor ``pi_d`` (or 60)."""
    n, k, d = _check(noise_trials, granularity, dimension)
    h = validation.check_positive("value_discretization_interval", value_discretization_interval)
    rho, pi_d = release_rdp(n, k, d)
    al = np.asarray(ORDERS, np.float64)
    # Largest eps worth a grid point: where the RDP term of (4) is below max(pi_d, 1e-15).
    floor = max(pi_d, 1e-15)
    e_max = float(np.min(rho + (-math.log(floor) - np.log(al)) / (al - 1) + np.log1p(-1 / al)))
    e_max = min(max(e_max, 10 * h), 60.0)
    top = max(2, int(math.ceil(e_max / h)))
    ints = np.unique(np.round(np.linspace(-top, top, _GRID_POINTS)).astype(np.int64))
    eps = ints * h
    deltas = release_delta(n, k, d, eps)                                   # [G]
    g = np.concatenate([[0.0], np.exp(eps)])
    hull = _lower_hull(g, np.concatenate([[1.0], deltas]))[1:]
    # Float noise only: make it non-increasing by raising values (never lowering them).
    hull = np.clip(np.maximum.accumulate(hull[::-1])[::-1], 0.0, 1.0)
    pmf = pld_pmf.create_pmf_pessimistic_connect_dots(h, ints, hull)
    return pld_lib.PrivacyLossDistribution(pmf, pmf)
