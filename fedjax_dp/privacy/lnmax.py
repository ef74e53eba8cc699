"""LNMax: data-dependent moments accounting of the Laplace noisy argmax (PATE 2017; FedKT Sec. 4).

A query releases ``argmax_c (v_c + Lap(1/gamma))`` for a vote histogram ``v [C]``. If one unit of
privacy changes the histogram by at most ``2k`` in L1 norm (``k = 1``: one teacher changes its
vote; ``k = s``: one FedKT party's ``s`` consistent-voting students), the query is
``(eps_p, 0)``-DP with ``eps_p = 2 k gamma`` (FedKT Theorems 1, 3, 8, 9).

Data-dependent bound, per query (PATE 2017 Lemma 4 = FedKT Lemma 7):

    q = sum_{j != *} (2 + gamma d_j) / (4 exp(gamma d_j)),   d_j = v_* - v_j,   capped at 1 - 1/C

Log moments of the privacy loss at integer orders l (FedKT Lemmas 5-6, Theorems 2, 3, 8, 10):

    alpha(l) = min(eps_p^2 l (l+1) / 2,  log_t,  eps_p l)
    log_t    = log((1-q) ((1-q) / (1 - e^{2 z gamma} q))^l + q e^{2 z gamma l})
               if q < 1 / (e^{2 z gamma} + 1), else eps_p l

Composition adds alpha over queries; ``eps = min_l (sum alpha(l) + log(1/delta)) / l``
(Abadi et al. 2016, Theorem 2). The theorems state ``z = k``; the functions keep the two
arguments of the reference code (FedKT always passes ``z == k``).

The moments are an RDP statement: ``alpha(l) = l * RDP(l + 1)`` (:func:`log_moments_to_rdp`), so
a ledger records them with ``add_rdp`` on the orders ``l + 1`` (a slightly tighter conversion
than the paper's :func:`moments_epsilon`). Float64 NumPy on the host, vectorised over queries:
``votes [..., C] -> q [...]``, ``q [...] -> log moments [..., L]``.
"""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from fedjax_dp.core import validation

__all__ = ["DEFAULT_MOMENT_ORDERS", "lnmax_q", "lnmax_log_moments", "moments_epsilon",
           "log_moments_to_rdp"]

#: The reference code's moment orders l = 1..8.
DEFAULT_MOMENT_ORDERS: tuple[int, ...] = tuple(range(1, 9))


def _orders(orders: Iterable[int]) -> np.ndarray:
    """Integer moment orders ``l >= 1``."""
    return validation.check_orders("orders", list(orders), strict=False, integer=True)


def _gamma(gamma) -> float:
    return validation.check_positive("gamma", gamma, finite=True)


def lnmax_q(votes, gamma) -> np.ndarray:
    """Bound on ``Pr[noisy argmax != argmax]`` per query (PATE 2017 Lemma 4; FedKT Lemma 7).

    Args:
      votes: vote counts ``[..., C]`` (``C >= 2``), e.g. one row per query.
      gamma: Laplace parameter: noise ``Lap(1/gamma)`` on every count (``gamma > 0``).
    Returns:
      ``q [...]`` float64: ``sum_{j != *} (2 + gamma d_j) / (4 exp(gamma d_j))`` with
      ``d_j = v_* - v_j``, capped at ``1 - 1/C`` (the bound a uniform guess attains).
    """
    gamma = _gamma(gamma)
    v = np.asarray(votes, dtype=np.float64)
    if v.ndim < 1 or v.shape[-1] < 2:
        raise ValueError(f"votes must have shape [..., num_classes] with num_classes >= 2, "
                         f"got shape {v.shape}")
    if not np.all(np.isfinite(v)) or np.any(v < 0):
        raise ValueError("votes must be finite, non-negative counts")
    num_classes = v.shape[-1]
    top = np.argmax(v, axis=-1)                                            # [...]
    d = np.take_along_axis(v, top[..., None], axis=-1) - v                 # [..., C] gaps >= 0
    terms = (2.0 + gamma * d) / (4.0 * np.exp(gamma * d))                  # [..., C]
    not_top = np.arange(num_classes) != top[..., None]                     # [..., C]
    q = np.sum(np.where(not_top, terms, 0.0), axis=-1)                     # [...]
    return np.minimum(q, 1.0 - 1.0 / num_classes)


def lnmax_log_moments(q, gamma, z: float = 1, k: float = 1,
                      orders: Iterable[int] = DEFAULT_MOMENT_ORDERS) -> np.ndarray:
    """Log moments ``alpha(l)`` of one LNMax query per order (FedKT Theorems 2/3/8/10).

    Args:
      q: ``[...]`` bounds from :func:`lnmax_q` (in ``[0, 1]``).
      gamma: Laplace parameter (``> 0``).
      z: multiplier in the data-dependent term ``log_t`` (its ``e^{2 z gamma}``).
      k: sensitivity multiplier: the query is ``(2 k gamma, 0)``-DP (``k >= 0``; 1 for one
        teacher, ``s`` for one party at the FedKT server). The theorems have ``z == k``.
      orders: integer moment orders ``l >= 1`` (default 1..8).
    Returns:
      ``[..., L]`` float64: ``min(eps_p^2 l(l+1)/2, log_t, eps_p l)`` with ``eps_p = 2 k gamma``,
      ``log_t`` as in the module docstring (``eps_p l`` when ``q >= 1/(e^{2 z gamma} + 1)``).
    """
    gamma = _gamma(gamma)
    z = validation.check_nonnegative("z", z)
    k = validation.check_nonnegative("k", k)
    ls = _orders(orders)                                                   # [L]
    q = np.asarray(q, dtype=np.float64)
    if not np.all(np.isfinite(q)) or np.any(q < 0) or np.any(q > 1):
        raise ValueError("q must hold probabilities in [0, 1]")
    eps_p = 2.0 * k * gamma
    e2z = np.exp(2.0 * z * gamma)
    qq = q[..., None]                                                      # [..., 1]
    small = qq < 1.0 / (e2z + 1.0)                                         # [..., 1]
    safe_q = np.where(small, qq, 0.0)      # keeps the unused branch finite
    with np.errstate(divide="ignore", over="ignore"):
        log_t = np.log((1.0 - safe_q) * ((1.0 - safe_q) / (1.0 - e2z * safe_q)) ** ls
                       + safe_q * np.exp(2.0 * z * gamma * ls))            # [..., L]
    log_t = np.where(small, log_t, eps_p * ls)
    out = np.minimum(np.minimum(eps_p ** 2 * ls * (ls + 1.0) / 2.0, log_t), eps_p * ls)
    return np.maximum(out, 0.0)  # a moment bound is >= 0; guards a -0.0 from rounding at q = 0


def moments_epsilon(total_log_moments, delta,
                    orders: Iterable[int] = DEFAULT_MOMENT_ORDERS) -> float:
    """``eps = min_l (total_alpha(l) + log(1/delta)) / l`` (Abadi et al. 2016 Theorem 2).

    ``total_log_moments [L]``: log moments summed over all composed queries, one per order."""
    delta = validation.check_open_unit("delta", delta)
    ls = _orders(orders)
    total = validation.check_per_order(
        "total_log_moments", total_log_moments, ls.size,
        f"total_log_moments must have one entry per order ({ls.size}), got "
        f"{np.size(total_log_moments)}")
    return float(np.min((total + np.log(1.0 / delta)) / ls))


def log_moments_to_rdp(total_log_moments, orders: Iterable[int] = DEFAULT_MOMENT_ORDERS
                       ) -> tuple[np.ndarray, np.ndarray]:
    """``(rdp_orders, rdp)``: the moments as RDP, ``RDP(l + 1) = alpha(l) / l``.

    The moment of order ``l`` is ``log E_{M(d)}[(p/p')^l] = l * D_{l+1}(M(d) || M(d'))``
    (Renyi divergence of order ``l + 1``), so the result feeds ``PrivacyLedger.add_rdp`` and
    dp-accounting's ``compute_epsilon``.
    """
    ls = _orders(orders)
    total = np.asarray(total_log_moments, dtype=np.float64)
    if total.shape[-1:] != ls.shape:
        raise ValueError(f"total_log_moments must end in one entry per order ({ls.size}), "
                         f"got shape {total.shape}")
    return ls + 1.0, total / ls
