"""Privacy accounting of distributed DP under secure aggregation (DDG and Skellam noise).

Unit: one client. Relation: *replace one client's entire data*; the population size N is public
and each round's cohort is m of the N clients drawn uniformly without replacement.

One round (:mod:`fedjax_dp.privacy.distributed_dp`): every cohort client scales its clipped update
(``||x||_2 <= c``) by ``1/gamma``, rotates it (orthonormal, padded to ``d'`` = a power of 2) and
rounds it by *conditional randomized rounding*: randomized rounding repeated until the integer
vector ``r`` has ``||r||_2 <= Delta_2``. So ``||r||_2 <= Delta_2`` for every draw and, ``r`` being
an integer vector, ``||r||_1 <= min(sqrt(d') Delta_2, Delta_2^2)`` (:func:`l1_bound`). Replacing
one client moves the integer sum by ``r - r'``: L2 sensitivity ``2 Delta_2``, L1 sensitivity
``2 l1_bound(Delta_2)``. Each client adds a noise share; the server sees only the sum mod 2^b.

Bounds used (integer units; ``mu`` = the noise variance per coordinate of the sum):

* Rounding (Kairouz, Liu, Steinke, ICML 2021, arXiv:2102.06387, Theorem 1 / the conditional
  rounding proposition of Sec. 4.1; ICML version Theorem 5): for ``||x||_2 <= c`` and
  ``beta in [0, 1)``, ``Delta_2^2 = min(c^2 + d/4 + sqrt(2 ln(1/beta)) (c + sqrt(d)/2),
  (c + sqrt(d))^2)`` (``beta = 0``: the second term, which holds for every rounding).
* DDG (same paper, Proposition 14, eq. (17)): n iid shares ``N_Z(0, sigma^2)``, sigma >= 1/2,
  integer shift ``||D||_2 <= D2``, ``||D||_1 <= D1``, ``s2 = D2 / (sqrt(n) sigma)``,
  ``s1 = D1 / (sqrt(n) sigma)``, ``tau = 10 sum_{k=1}^{n-1} exp(-2 pi^2 sigma^2 k / (k+1))``:
  ``D_a <= min(a s2^2 / 2 + tau d, a/2 (s2^2 + 2 s1 tau + tau^2 d), a/2 (s2 + tau sqrt(d))^2)``.
  (Theorem 1's zCDP form ``eps = min(sqrt(s2^2 + 2 tau d), s2 + tau sqrt(d))`` is implied.)
* Skellam (Agarwal, Kairouz, Liu, NeurIPS 2021, arXiv:2110.04995, the multi-dimensional Skellam
  RDP bound: Theorem 3.5 with its vector corollary; numbering differs between versions), with
  ``mu`` the TOTAL variance (each coordinate ``Pois(mu/2) - Pois(mu/2)``; the paper writes it
  with the Poisson mean lam = mu/2: ``a D2^2/(4 lam) + min(((2a-1) D2^2 + 6 D1)/(16 lam^2),
  3 D1/(4 lam))``), integer orders ``a > 1``:
  ``D_a <= a D2^2 / (2 mu) + min(((2a - 1) D2^2 + 6 D1) / (4 mu^2), 3 D1 / (2 mu))``.
* Sampling m of N without replacement (Wang, Balle, Kasiviswanathan, AISTATS 2019, Theorem 9),
  integer ``a >= 2``, ``g = m/N``, base curve ``e(j)`` (replace-one), ``e(inf) = inf``:
  ``e'(a) <= log(1 + g^2 C(a,2) min(4 (e^{e(2)} - 1), 2 e^{e(2)})
  + sum_{j=3}^a 2 g^j C(a,j) e^{(j-1) e(j)}) / (a - 1)``, and ``e'(a) <= e(a)``.
* RDP -> (eps, delta): ``dp_accounting``'s ``compute_epsilon`` (Canonne, Kamath, Steinke 2020,
  Prop. 12); rounds compose by adding RDP.

Dropouts: each cohort client survives independently of the data; with M survivors the round
aborts (releases nothing) if ``M < n_min`` (``min_survivors``), else the noise is M shares each
sized for n_min clients (DDG ``N_Z(0, mu / n_min)``, Skellam variance ``mu / n_min``). The output
is a data-independent mixture over survival patterns, so the round's RDP is at most the max over
``M in [n_min, m]`` (a pattern without the replaced client releases the same law on both sides;
``exp((a-1) D_a)`` is jointly convex, so a mixture's D_a is at most its worst component's). The
same argument covers the rounding draws (every pair of draws obeys the sensitivities above); the
rotation (public, orthonormal), the modular wrap, the server's unwrapping and rescaling are
post-processing.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable, Sequence, Union

import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant
from scipy import special

from fedjax_dp.core import validation

__all__ = ["KINDS", "ORDERS", "Plan", "rounded_norm_bound", "l1_bound", "ddg_rdp", "skellam_rdp",
           "wor_subsampled_rdp", "round_rdp", "run_rdp", "epsilon", "plan", "calibrate"]

KINDS = ("ddg", "skellam")
ORDERS: tuple[int, ...] = tuple(range(2, 257)) + (512, 1024)

Curve = Union[Callable[[int], float], Sequence[float], np.ndarray]


#: Real arguments' ranges (``ValueError`` naming the parameter and the range).
_POSITIVE = validation.Float(0.0, low_open=True)            # a finite number > 0
_NONNEGATIVE = validation.Float(0.0)                        # a finite number >= 0
_BETA = validation.Float(0.0, 1.0, high_open=True)          # in [0, 1)
#: the clip norm and the noise multiplier of a plan: the plan is scale-free in the clip (gamma
#: grows with it) and squares both, which overflows past about 1e150 and underflows below
_SCALE = validation.Float(1e-12, 1e12)
#: Integer arguments: an int (``bits=8.0`` is refused, not converted).
_int = functools.partial(validation.check_int, exact=True)


def rounded_norm_bound(scaled_clip: float, dim: int, beta: float) -> float:
    """Delta_2: the L2 bound of a conditionally rounded vector of ``||x||_2 <= scaled_clip``."""
    c = _POSITIVE("scaled_clip", scaled_clip)
    d = _int("dim", dim, minimum=1)
    b = _BETA("beta", beta)
    bound = (c + math.sqrt(d)) ** 2
    if b > 0.0:
        bound = min(bound, c * c + d / 4.0
                    + math.sqrt(2.0 * math.log(1.0 / b)) * (c + math.sqrt(d) / 2.0))
    return math.sqrt(bound)


def l1_bound(l2: float, dim: int) -> float:
    """L1 bound of an integer vector of L2 norm <= l2 in dimension dim: min(sqrt(d) l2, l2^2)."""
    l2 = _NONNEGATIVE("l2", l2)
    return min(math.sqrt(_int("dim", dim, minimum=1)) * l2, l2 * l2)


def ddg_rdp(orders, *, l1: float, l2: float, share_sigma: float, num_shares: int,
            dim: int) -> np.ndarray:
    """RDP of the sum of ``num_shares`` iid N_Z(0, share_sigma^2) per coordinate, for integer
    shifts with L1 <= l1 and L2 <= l2 (Kairouz et al. 2021, Proposition 14); any real order > 1."""
    a = validation.check_orders("orders", orders)
    l1, l2 = _NONNEGATIVE("l1", l1), _NONNEGATIVE("l2", l2)
    n = _int("num_shares", num_shares, minimum=1)
    d = _int("dim", dim, minimum=1)
    sigma = _POSITIVE("share_sigma", share_sigma)
    if n > 1 and sigma < 0.5:
        raise ValueError(f"share_sigma must be >= 0.5 for a sum of {n} discrete Gaussians "
                         f"(Proposition 14's condition), got {share_sigma!r}")
    k = np.arange(1, n, dtype=np.float64)
    tau = 10.0 * float(np.sum(np.exp(-2.0 * math.pi ** 2 * sigma ** 2 * k / (k + 1.0))))
    return _ddg(a, l1, l2, sigma, n, d, tau)


def _ddg(a, l1, l2, sigma, n, d, tau):
    s2 = l2 / (np.sqrt(n) * sigma)
    s1 = l1 / (np.sqrt(n) * sigma)
    return np.minimum(np.minimum(a * s2 ** 2 / 2 + tau * d,
                                 a / 2 * (s2 ** 2 + 2 * s1 * tau + tau ** 2 * d)),
                      a / 2 * (s2 + tau * np.sqrt(d)) ** 2)


def skellam_rdp(orders, *, l1: float, l2: float, variance: float) -> np.ndarray:
    """RDP of Skellam noise of total variance ``variance`` per coordinate for integer shifts
    with L1 <= l1, L2 <= l2 (Agarwal et al. 2021; integer orders)."""
    a = validation.check_orders("orders", orders, integer=True)
    l1, l2 = _NONNEGATIVE("l1", l1), _NONNEGATIVE("l2", l2)
    mu = _POSITIVE("variance", variance)
    return a * l2 ** 2 / (2 * mu) + np.minimum(((2 * a - 1) * l2 ** 2 + 6 * l1) / (4 * mu ** 2),
                                               3 * l1 / (2 * mu))


def _wor(orders: np.ndarray, full: np.ndarray, q: float) -> np.ndarray:
    """Theorem 9 of WBK19 in log space; ``full[j]`` = base RDP at integer j (j >= 2)."""
    out = np.empty_like(orders)
    lq, e2 = math.log(q), full[2]
    t2 = min(math.log(4.0) + (e2 + math.log(-math.expm1(-e2)) if e2 > 0 else -math.inf),
             math.log(2.0) + e2)
    lgam = special.gammaln(np.arange(int(orders.max()) + 2, dtype=np.float64))  # log k! = lgam[k+1]
    for i, a in enumerate(orders.astype(np.int64)):
        j = np.arange(3, a + 1)
        log_comb = lgam[a + 1] - lgam[j + 1] - lgam[a - j + 1]
        terms = np.concatenate([[0.0, 2 * lq + math.log(a * (a - 1) / 2.0) + t2],
                                math.log(2.0) + j * lq + log_comb + (j - 1) * full[3:a + 1]])
        top = terms.max()
        lse = top if math.isinf(top) else top + math.log(np.exp(terms - top).sum())
        out[i] = min(lse / (a - 1), full[a])
    return out


def wor_subsampled_rdp(orders, base_rdp: Curve, *, population: int, cohort: int) -> np.ndarray:
    """RDP of a base mechanism (RDP curve ``base_rdp``, replace-one) run on ``cohort`` of
    ``population`` records sampled without replacement (WBK19 Theorem 9; integer orders).

    ``base_rdp``: a callable ``j -> RDP at integer order j``, or an array on ``orders`` (then the
    RDP at an integer j not in ``orders`` is bounded by that at the next larger order, Renyi
    divergences being non-decreasing in the order)."""
    a = validation.check_orders("orders", orders, integer=True)
    n = _int("population", population, minimum=1)
    m = _int("cohort", cohort, minimum=1, maximum=n)
    top = int(a.max())
    if callable(base_rdp):
        full = np.array([0.0, 0.0] + [float(base_rdp(j)) for j in range(2, top + 1)])
    else:
        base = np.asarray(base_rdp, dtype=np.float64).reshape(-1)
        if base.shape != a.shape:
            raise ValueError(f"base_rdp must have one value per order ({a.size}), got {base.size}")
        srt = np.argsort(a)
        idx = np.searchsorted(a[srt], np.arange(top + 1), side="left")
        full = base[srt][np.minimum(idx, a.size - 1)]
    if np.any(np.isnan(full[2:])) or np.any(full[2:] < 0):
        raise ValueError("base_rdp must be non-negative")
    if m == n:
        return full[a.astype(np.int64)]
    return _wor(a, full, m / n)


def _round_rdp(kind, a, scaled_clip, dim, beta, total_variance, cohort, min_survivors):
    d = _int("dim", dim, minimum=1)
    delta2 = rounded_norm_bound(scaled_clip, d, beta)
    return _shift_rdp(kind, a, 2.0 * l1_bound(delta2, d), 2.0 * delta2, d, total_variance,
                      cohort, min_survivors)


def count_round_rdp(kind: str, orders, *, total_variance: float, cohort: int,
                    min_survivors: int) -> np.ndarray:
    """One round's RDP of a secure sum of per-agent integers in {-1, +1} (an adaptive clip's
    centred bits, doubled) with discrete noise of total variance ``total_variance``: a
    one-coordinate shift with L1 = L2 = 2 under replace-one, worst over the survivors M in
    [min_survivors, cohort] (as :func:`round_rdp`)."""
    a = validation.check_orders("orders", orders, integer=(kind == "skellam"))
    return _shift_rdp(kind, a, 2.0, 2.0, 1, total_variance, cohort, min_survivors)


def _shift_rdp(kind, a, l1, l2, d, total_variance, cohort, min_survivors):
    kind = validation.check_choice("kind", kind, KINDS)
    m = _int("cohort", cohort, minimum=1)
    n_min = _int("min_survivors", min_survivors, minimum=1, maximum=m)
    mu = _POSITIVE("total_variance", total_variance)
    if kind == "skellam":  # M shares of variance mu / n_min: the least noise at M = n_min
        return skellam_rdp(a, l1=l1, l2=l2, variance=mu)
    sigma = math.sqrt(mu / n_min)
    if m > 1 and sigma < 0.5:
        raise ValueError(f"total_variance / min_survivors (a DDG share's variance) must be >= "
                         f"0.25 (Proposition 14), got {mu / n_min!r}")
    k = np.arange(1, m, dtype=np.float64)
    terms = np.exp(-2 * math.pi ** 2 * (mu / n_min) * k / (k + 1))
    taus = 10.0 * np.concatenate([[0.0], np.cumsum(terms)])  # taus[M - 1]: tau of M shares
    worst = np.zeros_like(a)
    for start in range(n_min, m + 1, 512):  # M = survivors in [n_min, m], chunked
        ms = np.arange(start, min(start + 512, m + 1), dtype=np.float64)
        tau = taus[ms.astype(np.int64) - 1][None, :]
        rdp = _ddg(a[:, None], l1, l2, sigma, ms[None, :], d, tau)
        worst = np.maximum(worst, rdp.max(axis=1))
    return worst


def round_rdp(kind: str, orders, *, scaled_clip: float, dim: int, beta: float,
              total_variance: float, cohort: int, min_survivors: int) -> np.ndarray:
    """One round's RDP (no sampling): replace-one sensitivities ``2 Delta_2`` (L2) and
    ``2 l1_bound(Delta_2)`` (L1), worst over the survivor count M in [min_survivors, cohort].
    ``dim``: the rounded vector's dimension (the padded d')."""
    a = validation.check_orders("orders", orders, integer=(kind == "skellam"))
    return _round_rdp(kind, a, scaled_clip, dim, beta, total_variance, cohort, min_survivors)


def run_rdp(kind: str, orders, *, scaled_clip: float, dim: int, beta: float,
            total_variance: float, cohort: int, min_survivors: int, population: int,
            rounds: int, count_variance: float | None = None) -> np.ndarray:
    """RDP of ``rounds`` rounds, each a cohort of ``cohort`` of ``population`` clients sampled
    without replacement (integer orders). ``count_variance``: each round also releases the
    secure sum of the cohort's doubled centred bits with discrete noise of that total variance
    (adaptive clipping): the round's base RDP is the sum of both (one round, one cohort, both
    releases: a product mechanism), amplified once by the sampling."""
    a = validation.check_orders("orders", orders, integer=True)
    t = _int("rounds", rounds, minimum=0)
    n = _int("population", population, minimum=1)
    _int("cohort", cohort, minimum=1, maximum=n)
    full = np.zeros(int(a.max()) + 1)
    base_orders = np.arange(2.0, a.max() + 1)
    full[2:] = _round_rdp(kind, base_orders, scaled_clip, dim, beta,
                          total_variance, cohort, min_survivors)
    if count_variance is not None:
        full[2:] += _shift_rdp(kind, base_orders, 2.0, 2.0, 1, count_variance, cohort,
                               min_survivors)
    return t * wor_subsampled_rdp(a, lambda j: full[j], population=n, cohort=cohort)


def epsilon(orders, rdp, delta: float) -> float:
    """The (eps, delta)-DP epsilon of an RDP curve (dp_accounting ``compute_epsilon``)."""
    d = validation.check_open_unit("delta", delta)
    a = validation.check_orders("orders", orders)
    r = np.asarray(rdp, dtype=np.float64).reshape(-1)
    if r.shape != a.shape:
        raise ValueError(f"rdp must have one value per order ({a.size}), got {r.size}")
    return float(rdp_privacy_accountant.compute_epsilon(a, r, d)[0])


@dataclasses.dataclass(frozen=True)
class Plan:
    """A round's parameters. ``scale`` gamma (model units per integer unit); ``total_variance``
    mu (integer units^2 per coordinate of the sum, n_min shares); ``rounded_norm`` Delta_2;
    ``l1`` = l1_bound(Delta_2, padded_dim); ``noise_multiplier`` z (noise std >= z clip)."""

    kind: str
    scale: float
    total_variance: float
    rounded_norm: float
    l1: float
    padded_dim: int
    bits: int
    k_stddevs: float
    beta: float
    noise_multiplier: float
    clip: float
    cohort: int
    min_survivors: int


def plan(kind: str, *, noise_multiplier: float, clip: float, dim: int, cohort: int, bits: int,
         k_stddevs: float = 4.0, beta: float = math.exp(-0.5),
         min_survivors: int | None = None) -> Plan:
    """Scale gamma so that, per coordinate of the rotated sum of M <= cohort clients (updates
    possibly aligned, noise of up to cohort / n_min shares' worth), k standard deviations fit
    the range: ``k^2 ((m c)^2 / d' + (m / n_min) (z c)^2) / gamma^2 + k^2 m / 4 = 4^(b-1)``;
    then ``mu = (z c / gamma)^2`` and ``Delta_2 = rounded_norm_bound(c / gamma, d', beta)``."""
    kind = validation.check_choice("kind", kind, KINDS)
    z = _SCALE("noise_multiplier", noise_multiplier)
    c = _SCALE("clip", clip)
    d = _int("dim", dim, minimum=1)
    m = _int("cohort", cohort, minimum=1)
    b = _int("bits", bits, minimum=2, maximum=31)
    k = _POSITIVE("k_stddevs", k_stddevs)
    beta = _BETA("beta", beta)
    n_min = m if min_survivors is None else _int("min_survivors", min_survivors, minimum=1,
                                                 maximum=m)
    d_pad = 1 << (d - 1).bit_length()
    room = (2.0 ** (b - 1) / k) ** 2 - m / 4.0
    if room <= 0:
        fits = [bb for bb in range(2, 32) if (2.0 ** (bb - 1) / k) ** 2 > m / 4.0]
        hint = f"at least {fits[0]}" if fits else "more than 31 (reduce cohort or k_stddevs)"
        raise ValueError(f"bits={b} is too few for cohort={m} and k_stddevs={k:g}: the rounding "
                         f"noise alone overflows the range; bits must be {hint}")
    gamma = math.sqrt(((m * c) ** 2 / d_pad + (m / n_min) * (z * c) ** 2) / room)
    delta2 = rounded_norm_bound(c / gamma, d_pad, beta)
    return Plan(kind=kind, scale=gamma, total_variance=(z * c / gamma) ** 2, rounded_norm=delta2,
                l1=l1_bound(delta2, d_pad), padded_dim=d_pad, bits=b, k_stddevs=k, beta=beta,
                noise_multiplier=z, clip=c, cohort=m, min_survivors=n_min)


def _plan_epsilon(p: Plan, delta: float, population: int, rounds: int, orders) -> float:
    rdp = run_rdp(p.kind, orders, scaled_clip=p.clip / p.scale, dim=p.padded_dim, beta=p.beta,
                  total_variance=p.total_variance, cohort=p.cohort, min_survivors=p.min_survivors,
                  population=population, rounds=rounds)
    return epsilon(orders, rdp, delta)


def calibrate(kind: str, *, target_epsilon: float, delta: float, clip: float, dim: int,
              population: int, cohort: int, rounds: int, bits: int, k_stddevs: float = 4.0,
              beta: float = math.exp(-0.5), min_survivors: int | None = None,
              tol: float = 1e-3) -> float:
    """The smallest noise multiplier z (to relative ``tol``) whose plan's ``rounds``-round
    epsilon at ``delta`` is <= ``target_epsilon``; ValueError if no z reaches it."""
    target = _POSITIVE("target_epsilon", target_epsilon)
    validation.check_open_unit("delta", delta)
    tol = validation.check_open_unit("tol", tol)
    n = _int("population", population, minimum=1)
    _int("cohort", cohort, minimum=1, maximum=n)
    _int("rounds", rounds, minimum=1)

    def eps(z: float) -> float:
        p = plan(kind, noise_multiplier=z, clip=clip, dim=dim, cohort=cohort, bits=bits,
                 k_stddevs=k_stddevs, beta=beta, min_survivors=min_survivors)
        if p.kind == "ddg" and p.cohort > 1 and p.total_variance / p.min_survivors < 0.25:
            return math.inf  # a DDG share below sigma = 1/2: no bound at this z
        return _plan_epsilon(p, delta, n, rounds, ORDERS)

    lo, hi = 1e-3, 1e3
    if eps(hi) > target:
        raise ValueError(f"target_epsilon={target:g} is unreachable with bits={bits} (epsilon at "
                         f"noise_multiplier {hi:g} is {eps(hi):.4g}; the rounding alone costs "
                         f"privacy): raise bits or target_epsilon")
    if eps(lo) <= target:
        return lo
    while hi / lo > 1.0 + tol:  # bisection in log z; eps decreases in z
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if eps(mid) <= target else (mid, hi)
    return hi
