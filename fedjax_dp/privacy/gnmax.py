"""Data-dependent RDP of the Gaussian noisy argmax (GNMax; PATE 2018, Papernot et al., Theorem 6).

voting-dpfl Theorem 7 applies PATE 2018's analysis to the MPC vote: only
``argmax_c (n_c + N(0, sigma^2))`` is released, so a query whose noise-free vote sum ``n`` has a
large margin costs far less than the data-independent ``alpha Delta^2 / (2 sigma^2)``.

All functions are float64 numpy/scipy and vectorised over queries.

* :func:`gnmax_logq`: ``log q >= log Pr[noisy argmax != argmax n]`` per query (union bound)::

      log q = logsumexp_{j != *} log Phi-bar((n_* - n_j) / (sqrt(2) sigma)),  capped at log(1 - 1/C)

* :func:`gnmax_rdp`: PATE 2018 ``rdp_gaussian(logq, sigma, orders)`` (Theorem 6 with the higher
  orders ``mu2 = sigma sqrt(-log q)``, ``mu1 = mu2 + 1`` of its Proposition 10), per query and
  order, never above the data-independent ``alpha / sigma^2``.
* :func:`gnmax_total_rdp` / :func:`gnmax_epsilon`: the per-query vectors summed over all queries on
  one order grid and converted with ``dp_accounting``'s ``compute_epsilon``.

**Sensitivity convention.** PATE's ``rdp_gaussian`` assumes L2 sensitivity ``sqrt(2)`` (one voter
moves its vote from one class to another): its data-independent bound is ``alpha / sigma^2``.
For another sensitivity ``Delta`` (1 for add/remove one agent in voting-dpfl; ``sqrt(2)/k`` for
one record in kNN-DPFL) the problem is rescaled by ``c = sqrt(2) / Delta``: votes ``c n``, noise
``sigma_eff = c sigma``. ``q`` is scale invariant (``gnmax_logq(c n, c sigma) == gnmax_logq(n,
sigma)``), so it is computed with the *actual* ``sigma`` and only the RDP uses ``sigma_eff``.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant
from scipy import special

from fedjax_dp.core import validation

__all__ = ["PATE_ORDERS", "gnmax_logq", "gnmax_rdp", "gnmax_total_rdp", "gnmax_epsilon"]

#: PATE 2018's order grid: 2..100 in steps of 0.5, then 100 log-spaced orders up to 500.
PATE_ORDERS: np.ndarray = np.concatenate([np.arange(2, 100.5, 0.5),
                                          np.logspace(2, np.log10(500), 100)])
PATE_ORDERS.flags.writeable = False


def _check_votes(votes) -> np.ndarray:
    arr = validation.check_finite_array("votes", votes).astype(np.float64)
    if arr.ndim not in (1, 2) or arr.shape[-1] < 2:
        raise ValueError(f"votes must have shape [num_classes] or [num_queries, num_classes] with "
                         f"num_classes >= 2, got shape {arr.shape}")
    return arr


def _check_orders(orders) -> np.ndarray:
    return validation.check_orders("orders", PATE_ORDERS if orders is None else orders)


def gnmax_logq(votes, sigma) -> np.ndarray | float:
    """Upper bound on ``log Pr[argmax(n + N(0, sigma^2 I)) != argmax n]`` (PATE 2018 Prop. 7).

    ``votes``: noise-free vote sums ``[C]`` or ``[Q, C]``. For each query, with ``* = argmax n``
    (first maximum), ``log q = logsumexp_{j != *} log Phi-bar((n_* - n_j) / (sqrt(2) sigma))``,
    capped at ``log(1 - 1/C)``. Returns a float for ``[C]``, an array ``[Q]`` for ``[Q, C]``.
    ``sigma`` finite ``> 0``."""
    v = _check_votes(votes)
    sigma = validation.check_positive("sigma", sigma, finite=True)
    single = v.ndim == 1
    v = np.atleast_2d(v)                                                  # [Q, C]
    q, c = v.shape
    top = np.argmax(v, axis=1)                                            # [Q]
    gaps = v[np.arange(q), top][:, None] - v                               # [Q, C] >= 0
    logsf = special.log_ndtr(-gaps / (math.sqrt(2.0) * sigma))             # log Phi-bar(gap/..)
    logsf[np.arange(q), top] = -np.inf                                     # exclude j = *
    logq = np.minimum(special.logsumexp(logsf, axis=1), math.log(1.0 - 1.0 / c))  # [Q]
    return float(logq[0]) if single else logq


def _log1mexp(x: np.ndarray) -> np.ndarray:
    """``log(1 - exp(x))`` for ``x < 0``, accurate at both ends (PATE 2018's ``_log1mexp``)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return np.where(x < -1.0, np.log1p(-np.exp(x)), np.log(-np.expm1(x)))


def gnmax_rdp(logq, sigma, orders) -> np.ndarray:
    """PATE 2018 ``rdp_gaussian``: data-dependent RDP of one GNMax query (Theorem 6).

    For ``log q`` (a scalar, or an array ``[...]`` of queries) and noise ``sigma`` (PATE's
    convention: sensitivity ``sqrt(2)``, data-independent RDP ``alpha / sigma^2``)::

        mu2 = sigma sqrt(-log q),  mu1 = mu2 + 1,  eps1 = mu1 / sigma^2,  eps2 = mu2 / sigma^2
        valid iff mu2 > 1, -log q > eps2 and
                  log q <= (mu2 - 1) eps2 - mu2 (log(1 + 1/(mu1 - 1)) + log(1 + 1/(mu2 - 1))),
                  and only for orders alpha < mu1; then
        log A = (alpha - 1)(log(1 - q) - log(1 - exp((log q + eps2)(1 - 1/mu2))))
        log B = (alpha - 1)(eps1 - log q / (mu1 - 1))
        rdp   = min(alpha / sigma^2, logaddexp(log(1 - q) + log A, log q + log B) / (alpha - 1))

    and ``rdp = alpha / sigma^2`` elsewhere; ``log q = -inf`` (a certain outcome) gives 0. Returns
    ``[len(orders)]`` for a scalar ``logq``, ``[..., len(orders)]`` for an array."""
    sigma = validation.check_positive("sigma", sigma, finite=True)
    grid = _check_orders(orders)
    lq = np.asarray(logq, dtype=np.float64)
    if np.any(np.isnan(lq)) or np.any(lq > 0):
        raise ValueError("logq must be <= 0 everywhere (a log-probability), got max "
                         f"{np.nanmax(lq) if lq.size else lq!r}")
    lqb = lq[..., None]                                                   # [..., 1]
    var = sigma ** 2
    ret = np.broadcast_to(grid / var, lqb.shape[:-1] + grid.shape).copy()  # [..., A]
    certain = np.isneginf(lqb)                                           # [..., 1]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        safe = np.where(certain, -1.0, lqb)                               # finite stand-in
        mu2 = np.sqrt(var * -safe)
        mu1 = mu2 + 1.0
        eps1 = mu1 / var
        eps2 = mu2 / var
        bound = (mu2 - 1.0) * eps2 - mu2 * (np.log1p(1.0 / (mu1 - 1.0))
                                            + np.log1p(1.0 / (mu2 - 1.0)))
        ok = (mu2 > 1.0) & (safe <= bound) & (-safe > eps2) & ~certain    # [..., 1]
        use = ok & (mu1 > grid)                                          # [..., A]
        log1q = _log1mexp(safe)
        log_a = (grid - 1.0) * (log1q - _log1mexp((safe + eps2) * (1.0 - 1.0 / mu2)))
        log_b = (grid - 1.0) * (eps1 - safe / (mu1 - 1.0))
        dd = np.logaddexp(log1q + log_a, safe + log_b) / (grid - 1.0)
    ret = np.where(use, np.minimum(ret, dd), ret)
    ret = np.where(certain, 0.0, ret)
    return ret


def _sigma_eff(sigma: float, sensitivity) -> float:
    delta_l2 = validation.check_positive("sensitivity", sensitivity, finite=True)
    return sigma * math.sqrt(2.0) / delta_l2


def gnmax_total_rdp(votes, sigma, sensitivity=2 ** 0.5, orders=None
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(orders, data-dependent RDP, data-independent RDP)`` of all queries, summed over queries.

    ``votes [Q, C]`` (or ``[C]``: one query) are the noise-free vote sums in the units in which the
    vote sum has L2 ``sensitivity``; ``sigma`` is the actual std of the noise on the sum. The RDP
    uses ``sigma_eff = sigma sqrt(2) / sensitivity`` (module docstring); the data-independent vector
    is ``Q alpha / sigma_eff^2 = Q alpha sensitivity^2 / (2 sigma^2)``."""
    v = np.atleast_2d(_check_votes(votes))
    sigma = validation.check_positive("sigma", sigma, finite=True)
    sigma_eff = _sigma_eff(sigma, sensitivity)
    grid = _check_orders(orders)
    logq = gnmax_logq(v, sigma)                                          # [Q] (scale-invariant)
    per_query = gnmax_rdp(logq, sigma_eff, grid)                          # [Q, A]
    independent = v.shape[0] * grid / sigma_eff ** 2                      # [A]
    return grid, per_query.sum(axis=0), independent


def gnmax_epsilon(votes, sigma, delta, sensitivity=2 ** 0.5, orders: Sequence[float] | None = None
                  ) -> tuple[float, float]:
    """``(data-dependent epsilon, data-independent epsilon)`` of a whole set of GNMax queries.

    Both RDP curves (:func:`gnmax_total_rdp`) are converted at ``delta`` by
    ``dp_accounting.rdp.rdp_privacy_accountant.compute_epsilon``. ``sensitivity``: the L2
    sensitivity of the vote sum for the unit of privacy (``sqrt(2)``: PATE's convention, one voter
    changes its vote; 1: add/remove one agent). ``orders`` default :data:`PATE_ORDERS`. The
    data-dependent epsilon depends on the private votes (publish it only with smooth sensitivity,
    PATE 2018 Section B)."""
    delta = validation.check_open_unit("delta", delta)
    grid, dd, di = gnmax_total_rdp(votes, sigma, sensitivity, orders)
    eps_dd, _ = rdp_privacy_accountant.compute_epsilon(grid.tolist(), dd.tolist(), delta)
    eps_di, _ = rdp_privacy_accountant.compute_epsilon(grid.tolist(), di.tolist(), delta)
    return float(eps_dd), float(eps_di)
