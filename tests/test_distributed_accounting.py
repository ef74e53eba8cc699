"""fedjax_dp.privacy.distributed_accounting against independent values: exact Renyi divergences
of Skellam / sums of discrete Gaussians (pmfs built here), exact enumeration of conditional
rounding, dp-accounting's RDP accountant, and an exact end-to-end hockey-stick check of one
sampled, rounded, noised round with dropouts."""
from __future__ import annotations

import itertools
import math

import dp_accounting
import numpy as np
import pytest
from scipy import special, stats

from fedjax_dp.privacy import distributed_accounting as A

REL = 1e-9  # float slack when a bound meets the exact value (e.g. DDG at large sigma)


# ---------------------------------------------------------------- independent reference values

def _skellam_logpmf(variance: float, k_max: int) -> np.ndarray:
    """log P(X = k), k in [-k_max, k_max], X = Pois(v/2) - Pois(v/2), by an explicit log-space
    convolution of the two Poisson pmfs (no Bessel functions, no underflow in the tails)."""
    lam = variance / 2.0
    i = np.arange(0, 2 * k_max + 400)
    lp = i * math.log(lam) - lam - special.gammaln(i + 1)
    out = np.empty(2 * k_max + 1)
    for idx, k in enumerate(range(-k_max, k_max + 1)):
        a = abs(k)
        out[idx] = special.logsumexp(lp[a:] + lp[:len(lp) - a])
    return out


def _dg_logpmf(sigma: float, k_max: int) -> np.ndarray:
    k = np.arange(-k_max, k_max + 1)
    lw = -k * k / (2.0 * sigma * sigma)
    return lw - special.logsumexp(lw)


def _logconv(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    m = a[:, None] + b[None, :]
    out = np.empty(len(a) + len(b) - 1)
    for s in range(len(out)):
        i = np.arange(max(0, s - len(b) + 1), min(len(a) - 1, s) + 1)
        out[s] = special.logsumexp(m[i, s - i])
    return out


def _renyi_shift(logp: np.ndarray, shift: int, alpha: float, window: int | None = None) -> float:
    """D_alpha(P || P shifted by `shift`) for a pmf on the integers centred in the array (log
    values), summed over the outcomes within `window` of the centre (default: all but the edge):
    dropping outcomes only lowers the value, so a bound above it is tested one-sidedly."""
    logq = np.full_like(logp, -np.inf)
    logq[shift:] = logp[:len(logp) - shift]
    mid = len(logp) // 2
    w = mid - shift if window is None else min(window, mid - shift)
    sl = slice(mid - w, mid + w + 1)
    return float(special.logsumexp(alpha * logp[sl] + (1 - alpha) * logq[sl]) / (alpha - 1))


def test_skellam_reference_pmf_matches_scipy():
    for v in (1.0, 5.0, 40.0):
        lp = _skellam_logpmf(v, 200)
        k = np.arange(-30, 31)
        np.testing.assert_allclose(lp[200 - 30:200 + 31], stats.skellam.logpmf(k, v / 2, v / 2),
                                   rtol=1e-7, atol=1e-9)


# ---------------------------------------------------------------- rounding norm bound

def _rounding_outcomes(x: np.ndarray):
    """Every outcome of independent randomized rounding of x with its probability."""
    lo = np.floor(x)
    frac = x - lo
    for bits in itertools.product((0, 1), repeat=len(x)):
        b = np.array(bits)
        p = float(np.prod(np.where(b == 1, frac, 1 - frac)))
        if p > 0:
            yield lo + b, p


@pytest.mark.parametrize("dim", [1, 2, 3, 5, 8])
def test_rounded_norm_bound_holds_exactly(dim):
    rng = np.random.default_rng(dim)
    dirs = [np.eye(dim)[0], np.ones(dim) / math.sqrt(dim)] + [
        u / np.linalg.norm(u) for u in rng.normal(size=(6, dim))]
    for c in (0.3, 1.0, 2.0, 3.7, 6.0):
        for u in dirs:
            x = c * u
            outs = list(_rounding_outcomes(x))
            worst = max(np.linalg.norm(r) for r, _ in outs)
            assert worst <= A.rounded_norm_bound(c, dim, 0.0) + 1e-12  # beta = 0: always
            for beta in (math.exp(-0.5), 0.1, 0.01):
                bound = A.rounded_norm_bound(c, dim, beta)
                fail = sum(p for r, p in outs if np.linalg.norm(r) > bound)
                assert fail <= beta, (c, u, beta, fail)


def test_l1_bound():
    assert A.l1_bound(3.0, 100) == 9.0       # integer vectors: ||r||_1 <= ||r||_2^2
    assert A.l1_bound(3.0, 4) == 6.0         # sqrt(d) ||r||_2


# ---------------------------------------------------------------- Skellam and DDG vs exact

@pytest.mark.parametrize("mu", [1.0, 3.0, 10.0, 50.0])
def test_skellam_rdp_bounds_exact_divergence(mu):
    lp = _skellam_logpmf(mu, 350)
    for shift in (1, 2, 3, 6):
        for alpha in (2, 3, 5, 10, 32, 100):
            exact = _renyi_shift(lp, shift, alpha)
            bound = A.skellam_rdp([alpha], l1=shift, l2=shift, variance=mu)[0]
            assert bound >= exact * (1 - REL), (mu, shift, alpha, exact, bound)


def test_skellam_rdp_bounds_exact_divergence_2d():
    """Product noise: the exact divergence of a vector shift adds over coordinates."""
    for mu in (2.0, 8.0):
        lp = _skellam_logpmf(mu, 300)
        for shift in ((1, 1), (2, 1), (3, -2), (1, 4)):
            l1 = float(sum(abs(s) for s in shift))
            l2 = math.hypot(*shift)
            for alpha in (2, 4, 16, 64):
                exact = sum(_renyi_shift(lp, abs(s), alpha) for s in shift)
                bound = A.skellam_rdp([alpha], l1=l1, l2=l2, variance=mu)[0]
                assert bound >= exact * (1 - REL), (mu, shift, alpha, exact, bound)


def test_skellam_variance_convention():
    """`variance` is the total variance 2 lam of Pois(lam) - Pois(lam); in lam the paper's bound
    reads a D2^2/(4 lam) + min(((2a-1) D2^2 + 6 D1)/(16 lam^2), 3 D1/(4 lam))."""
    lam, d1, d2 = 3.0, 5.0, 3.0
    a = np.arange(2, 50)
    want = a * d2 ** 2 / (4 * lam) + np.minimum(((2 * a - 1) * d2 ** 2 + 6 * d1) / (16 * lam ** 2),
                                                3 * d1 / (4 * lam))
    np.testing.assert_allclose(A.skellam_rdp(a, l1=d1, l2=d2, variance=2 * lam), want, rtol=1e-12)
    lp = _skellam_logpmf(2 * lam, 300)
    assert np.exp(lp).sum() == pytest.approx(1.0)
    k = np.arange(-300, 301)
    assert float(np.sum(np.exp(lp) * k * k)) == pytest.approx(2 * lam)


@pytest.mark.parametrize("sigma", [0.5, 0.6, 0.8, 1.0, 2.5])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_ddg_rdp_bounds_exact_divergence(sigma, n):
    # Each share truncated at +-K; the sum is exact (to e^-800) within +-K, which holds the
    # outcomes that carry the divergence ((alpha - 1) shift <= 124 from the centre).
    k_max = 150
    base = _dg_logpmf(sigma, k_max)
    lp = base
    for _ in range(n - 1):
        lp = _logconv(lp, base)
    for shift in (1, 2, 4):
        for alpha in (1.5, 2, 4, 8, 32):
            exact = _renyi_shift(lp, shift, alpha, window=k_max)
            bound = A.ddg_rdp([alpha], l1=shift, l2=shift, share_sigma=sigma, num_shares=n,
                              dim=1)[0]
            assert bound >= exact * (1 - REL) - 1e-12, (sigma, n, shift, alpha, exact, bound)


def test_ddg_rdp_bounds_exact_divergence_2d():
    sigma, n = 0.55, 2
    base = _dg_logpmf(sigma, 60)
    lp = _logconv(base, base)
    for shift in ((1, 1), (2, 1), (1, 3)):
        for alpha in (2, 8):
            exact = sum(_renyi_shift(lp, abs(s), alpha, window=60) for s in shift)
            bound = A.ddg_rdp([alpha], l1=float(sum(shift)), l2=math.hypot(*shift),
                              share_sigma=sigma, num_shares=n, dim=2)[0]
            assert bound >= exact * (1 - REL), (shift, alpha, exact, bound)


# ---------------------------------------------------------------- sampling without replacement

_WOR_ORDERS = np.array(list(range(2, 41)) + [64, 128, 300, 512], dtype=float)


@pytest.mark.parametrize("population,cohort,s", [(1000, 10, 1.0), (100, 30, 0.7),
                                                  (5000, 100, 2.0), (10, 9, 0.5)])
def test_wor_gaussian_vs_dp_accounting(population, cohort, s):
    ours = A.wor_subsampled_rdp(_WOR_ORDERS, lambda j: j / (2 * s * s), population=population,
                                cohort=cohort)
    acc = dp_accounting.rdp.RdpAccountant(list(_WOR_ORDERS),
                                          dp_accounting.NeighboringRelation.REPLACE_ONE)
    acc.compose(dp_accounting.SampledWithoutReplacementDpEvent(
        population, cohort, dp_accounting.GaussianDpEvent(s)))
    # dp-accounting: Theorem 27 (Gaussian-specific, <= Theorem 9) up to order 256, Theorem 9 above;
    # ours is additionally capped by the unsampled curve.
    ref = np.minimum(acc._rdp, _WOR_ORDERS / (2 * s * s))
    assert np.all(ours >= ref * (1 - REL))
    big = _WOR_ORDERS > 256
    np.testing.assert_allclose(ours[big], ref[big], rtol=1e-6)
    small = (_WOR_ORDERS <= 40) & (ref < _WOR_ORDERS / (2 * s * s))
    # Theorem 27 uses the Gaussian's own structure: up to ~35% tighter at mid orders for small
    # q and large s (5000, 100, 2.0), equal elsewhere.
    assert np.all(ours[small] <= ref[small] * 1.4)


def test_wor_theorem9_direct_evaluation():
    """Theorem 9 summed directly (plain floats) for a non-Gaussian curve, small orders."""
    def curve(j):
        return 0.3 * j + 0.05 * math.sqrt(j)
    for n, m in ((50, 5), (20, 10), (7, 2)):
        g = m / n
        for a in range(2, 25):
            e2 = curve(2)
            tot = 1 + g * g * math.comb(a, 2) * min(4 * (math.exp(e2) - 1), 2 * math.exp(e2))
            tot += sum(g ** j * math.comb(a, j) * math.exp((j - 1) * curve(j)) * 2
                       for j in range(3, a + 1))
            want = min(math.log(tot) / (a - 1), curve(a))
            got = A.wor_subsampled_rdp([a], curve, population=n, cohort=m)[0]
            assert got == pytest.approx(want, rel=1e-10)


def test_wor_array_form_and_full_cohort():
    orders = np.arange(2, 60)
    curve = orders * 0.02
    by_array = A.wor_subsampled_rdp(orders, curve, population=200, cohort=20)
    by_call = A.wor_subsampled_rdp(orders, lambda j: 0.02 * j, population=200, cohort=20)
    np.testing.assert_allclose(by_array, by_call, rtol=1e-12)
    sparse = np.array([2, 10, 40])   # missing integers take the next larger order's value: >=
    assert np.all(A.wor_subsampled_rdp(sparse, sparse * 0.02, population=200, cohort=20)
                  >= by_call[sparse - 2] * (1 - REL))
    np.testing.assert_array_equal(A.wor_subsampled_rdp(orders, curve, population=20, cohort=20),
                                  curve)


def test_run_rdp_composes_rounds_and_takes_worst_survivor_count():
    kw = dict(scaled_clip=5.0, dim=16, beta=math.exp(-0.5), total_variance=400.0, cohort=8)
    one = A.run_rdp("ddg", A.ORDERS, **kw, min_survivors=4, population=100, rounds=1)
    np.testing.assert_allclose(A.run_rdp("ddg", A.ORDERS, **kw, min_survivors=4, population=100,
                                         rounds=7), 7 * one)
    # round_rdp is the max over M in [n_min, m] of the DDG bound with M shares of mu / n_min
    d2 = A.rounded_norm_bound(5.0, 16, math.exp(-0.5))
    per_m = [A.ddg_rdp(A.ORDERS, l1=2 * A.l1_bound(d2, 16), l2=2 * d2, share_sigma=math.sqrt(100.0),
                       num_shares=mm, dim=16) for mm in range(4, 9)]
    np.testing.assert_allclose(A.round_rdp("ddg", A.ORDERS, **kw, min_survivors=4),
                               np.max(per_m, axis=0), rtol=1e-12)
    sk = A.round_rdp("skellam", A.ORDERS, **kw, min_survivors=4)
    np.testing.assert_allclose(sk, A.skellam_rdp(A.ORDERS, l1=2 * A.l1_bound(d2, 16), l2=2 * d2,
                                                 variance=400.0))


# ---------------------------------------------------------------- exact end-to-end check

def _conditional_rounding(x, bound):
    outs = [(r, p) for r, p in _rounding_outcomes(np.asarray(x, float))
            if float(r @ r) <= bound * bound + 1e-9]
    z = sum(p for _, p in outs)
    return [(tuple(int(v) for v in r), p / z) for r, p in outs]


def _noise_pmf(kind, shares, share_var, k_max):
    """pmf of the sum of `shares` noise shares on [-k_max, k_max] (one coordinate)."""
    k = np.arange(-k_max, k_max + 1)
    if kind == "skellam":
        v = shares * share_var
        return stats.skellam.pmf(k, v / 2, v / 2)
    w = np.exp(-k * k / (2 * share_var))
    one = w / w.sum()
    out = one
    for _ in range(shares - 1):
        out = np.convolve(out, one)[k_max:3 * k_max + 1]
    return out


def _release(data, kind, mu, n_min, drop_p, clip, beta, k_max, cohort=2):
    """Exact output law of one round on a grid [-K, K]^2 plus the abort mass."""
    bound = A.rounded_norm_bound(clip, 2, beta)
    rounded = [_conditional_rounding(x, bound) for x in data]
    pad = 12
    grid = np.zeros((2 * k_max + 1, 2 * k_max + 1))
    abort = 0.0
    cohorts = list(itertools.combinations(range(len(data)), cohort))
    for s in cohorts:
        for alive in itertools.product((0, 1), repeat=cohort):
            w = np.prod([1 - drop_p if a else drop_p for a in alive]) / len(cohorts)
            members = [s[i] for i in range(cohort) if alive[i]]
            if w == 0:
                continue
            if len(members) < n_min:
                abort += w
                continue
            sums = {(0, 0): 1.0}
            for i in members:
                new = {}
                for v, pv in sums.items():
                    for r, pr in rounded[i]:
                        key = (v[0] + r[0], v[1] + r[1])
                        new[key] = new.get(key, 0.0) + pv * pr
                sums = new
            noise = _noise_pmf(kind, len(members), mu / n_min, k_max + pad)
            for (v0, v1), pv in sums.items():
                a0 = noise[pad - v0: pad - v0 + 2 * k_max + 1]
                a1 = noise[pad - v1: pad - v1 + 2 * k_max + 1]
                grid += w * pv * np.outer(a0, a1)
    return grid, abort


def _hockey(p, q, p_missing, eps):
    return float(np.maximum(p - math.exp(eps) * q, 0).sum()) + p_missing


_DELTAS = (0.2, 0.05, 1e-3, 1e-5)
_REST = [np.array([0.3, -0.7]), np.array([0.0, 0.0])]   # clients 2 and 3 (population 3)


def _worst_ratio(kind, rdp, pairs, mu, n_min, drop_p, clip, k_max):
    """max over deltas and input pairs of exact_delta(eps_accountant(delta)) / delta for one
    round: population 3, cohort 2 without replacement, client 1's data replaced."""
    beta, worst = math.exp(-0.5), 0.0
    laws = []
    for x, x2 in pairs:
        p, pa = _release([x] + _REST, kind, mu, n_min, drop_p, clip, beta, k_max)
        q, qa = _release([x2] + _REST, kind, mu, n_min, drop_p, clip, beta, k_max)
        assert pa == pytest.approx(qa, abs=1e-15)   # aborting does not depend on the data
        miss_p, miss_q = 1 - p.sum() - pa, 1 - q.sum() - qa
        assert max(abs(miss_p), abs(miss_q)) < 1e-9  # the grid holds the law
        laws.append((p, q, max(miss_p, 0.0), max(miss_q, 0.0)))
    for delta in _DELTAS:
        eps = A.epsilon(A.ORDERS, rdp, delta)
        for p, q, miss_p, miss_q in laws:
            exact = max(_hockey(p, q, miss_p, eps), _hockey(q, p, miss_q, eps))
            worst = max(worst, exact / delta)
    return worst


def _round_rdp_small(kind, clip, mu, n_min):
    return A.run_rdp(kind, A.ORDERS, scaled_clip=clip, dim=2, beta=math.exp(-0.5),
                     total_variance=mu, cohort=2, min_survivors=n_min, population=3, rounds=1)


@pytest.mark.parametrize("kind", ["skellam", "ddg"])
@pytest.mark.parametrize("mu,n_min,drop_p", [(8.0, 2, 0.0), (30.0, 1, 0.3)])
def test_exact_round_delta_within_accountant(kind, mu, n_min, drop_p):
    """Scaled clip 2 in d = 2: Delta_2^2 = 7.2, so conditional rounding rejects (2, 2) (the
    diagonal input's outcomes are renormalised); dropouts with n_min = 1 mix in 1-share rounds
    and aborts."""
    s = math.sqrt(2.0)
    pairs = [(np.array([s, s]), np.array([-s, -s])),
             (np.array([2.0, 0.0]), np.array([-2.0, 0.0])),
             (np.array([1.5, 1.3]), np.array([-1.5, -1.3])),
             (np.array([s, s]), np.array([0.0, 0.0]))]
    rdp = _round_rdp_small(kind, 2.0, mu, n_min)
    assert _worst_ratio(kind, rdp, pairs, mu, n_min, drop_p, 2.0, 90) <= 1.0


@pytest.mark.parametrize("kind", ["skellam", "ddg"])
@pytest.mark.parametrize("mu,n_min,drop_p", [(60.0, 2, 0.0), (250.0, 2, 0.0), (250.0, 1, 0.3)])
def test_exact_round_delta_sharp_case(kind, mu, n_min, drop_p):
    """Scaled clip 6: x = (5.69, 1.89) mostly rounds to (6, 2), so replacing x by -x moves the
    sum by ~12.6 against the accountant's 2 Delta_2 = 13.1: the check has teeth. An accountant
    with half the sensitivity (add/remove instead of replace; 4x the variance) fails it."""
    x = np.array([5.69, 1.89])
    k_max = int(12 * math.sqrt(4 * mu / n_min)) + 20
    rdp = _round_rdp_small(kind, 6.0, mu, n_min)
    assert _worst_ratio(kind, rdp, [(x, -x)], mu, n_min, drop_p, 6.0, k_max) <= 1.0
    if n_min == 2 and mu == 250.0:
        wrong = _round_rdp_small(kind, 6.0, 4 * mu, n_min)
        assert _worst_ratio(kind, wrong, [(x, -x)], mu, n_min, drop_p, 6.0, k_max) > 1.0


# ---------------------------------------------------------------- plan and calibrate

def test_plan_fills_the_range_with_equality():
    for kind, n_min in (("skellam", None), ("ddg", 7)):
        p = A.plan(kind, noise_multiplier=1.3, clip=0.7, dim=1000, cohort=10, bits=16,
                   k_stddevs=3.5, min_survivors=n_min)
        m, c, z, k, nm = 10, 0.7, 1.3, 3.5, n_min or 10
        assert p.padded_dim == 1024
        used = k * math.sqrt(((m * c) ** 2 / 1024 + (m / nm) * (z * c) ** 2) / p.scale ** 2 + m / 4)
        assert used == pytest.approx(2.0 ** 15, rel=1e-12)
        assert p.total_variance == pytest.approx((z * c / p.scale) ** 2, rel=1e-12)
        assert p.rounded_norm == A.rounded_norm_bound(c / p.scale, 1024, math.exp(-0.5))
        assert p.l1 == A.l1_bound(p.rounded_norm, 1024)
        assert p.min_survivors == nm


def test_plan_too_few_bits_names_bits():
    # (2^(b-1) / k)^2 > m / 4 with m = 64, k = 4: 2^(b-1) > 16, b >= 6
    for bits in (4, 5):
        with pytest.raises(ValueError, match=rf"bits={bits}.*at least 6"):
            A.plan("skellam", noise_multiplier=1.0, clip=1.0, dim=10, cohort=64, bits=bits,
                   k_stddevs=4)
    A.plan("skellam", noise_multiplier=1.0, clip=1.0, dim=10, cohort=64, bits=6, k_stddevs=4)


_CAL = dict(delta=1e-5, clip=1.0, dim=1000, population=10_000, cohort=100, rounds=100)


def _plan_eps(kind, z, bits, **extra):
    p = A.plan(kind, noise_multiplier=z, clip=_CAL["clip"], dim=_CAL["dim"],
               cohort=_CAL["cohort"], bits=bits, **extra)
    rdp = A.run_rdp(kind, A.ORDERS, scaled_clip=p.clip / p.scale, dim=p.padded_dim, beta=p.beta,
                    total_variance=p.total_variance, cohort=p.cohort,
                    min_survivors=p.min_survivors, population=_CAL["population"],
                    rounds=_CAL["rounds"])
    return A.epsilon(A.ORDERS, rdp, _CAL["delta"])


@pytest.mark.parametrize("kind,extra", [("skellam", {}), ("ddg", {}),
                                        ("ddg", {"min_survivors": 80})])
def test_calibrate_is_tight(kind, extra):
    z = A.calibrate(kind, target_epsilon=2.0, bits=12, **_CAL, **extra)
    assert _plan_eps(kind, z, 12, **extra) <= 2.0
    assert _plan_eps(kind, z * 0.98, 12, **extra) > 2.0


def test_calibrate_more_bits_less_noise_and_gaussian_limit():
    zs = [A.calibrate("skellam", target_epsilon=2.0, bits=b, **_CAL) for b in (9, 10, 12, 16, 24)]
    assert all(a >= b for a, b in zip(zs, zs[1:])), zs
    assert zs[0] > 1.1 * zs[-1]        # few bits: the rounding costs noise
    # the central Gaussian with the same sampling (std z c, replace-one sensitivity 2c):
    orders = list(range(2, 65))
    def gauss_eps(z):
        acc = dp_accounting.rdp.RdpAccountant(orders,
                                              dp_accounting.NeighboringRelation.REPLACE_ONE)
        sampled = dp_accounting.SampledWithoutReplacementDpEvent(
            _CAL["population"], _CAL["cohort"], dp_accounting.GaussianDpEvent(z / 2))
        acc.compose(dp_accounting.SelfComposedDpEvent(sampled, _CAL["rounds"]))
        eps, order = acc.get_epsilon_and_optimal_order(_CAL["delta"])
        assert order < 64
        return eps
    assert gauss_eps(zs[-1]) <= 2.0           # ours is conservative ...
    assert gauss_eps(zs[-1] / 1.02) > 2.0     # ... by under 2%


def test_calibrate_unreachable():
    with pytest.raises(ValueError, match="target_epsilon.*unreachable.*bits"):
        A.calibrate("skellam", target_epsilon=0.05, delta=1e-5, clip=1.0, dim=64, population=100,
                    cohort=10, rounds=100, bits=6)


# ---------------------------------------------------------------- bad inputs

_PLAN = dict(noise_multiplier=1.0, clip=1.0, dim=10, cohort=5, bits=16)


@pytest.mark.parametrize("call,name", [
    (lambda: A.plan("gauss", **_PLAN), "kind"),
    (lambda: A.plan("ddg", **{**_PLAN, "bits": 1}), "bits"),
    (lambda: A.plan("ddg", **{**_PLAN, "bits": 32}), "bits"),
    (lambda: A.plan("ddg", **{**_PLAN, "bits": 8.0}), "bits"),
    (lambda: A.plan("ddg", **{**_PLAN, "clip": 0.0}), "clip"),
    (lambda: A.plan("ddg", **{**_PLAN, "clip": float("nan")}), "clip"),
    (lambda: A.plan("ddg", **{**_PLAN, "noise_multiplier": -1.0}), "noise_multiplier"),
    # squared in the plan: overflowed past ~1e150 (OverflowError), divided by zero below
    (lambda: A.plan("ddg", **{**_PLAN, "noise_multiplier": 1e300}),
     r"noise_multiplier must be in \[1e-12, 1e\+12\]"),
    (lambda: A.plan("ddg", **{**_PLAN, "clip": 1e-300}), r"clip must be in \[1e-12, 1e\+12\]"),
    (lambda: A.plan("ddg", **{**_PLAN, "dim": 0}), "dim"),
    (lambda: A.plan("ddg", **{**_PLAN, "cohort": 0}), "cohort"),
    (lambda: A.plan("ddg", **_PLAN, min_survivors=0), "min_survivors"),
    (lambda: A.plan("ddg", **_PLAN, min_survivors=6), "min_survivors"),
    (lambda: A.plan("ddg", **_PLAN, beta=1.0), "beta"),
    (lambda: A.plan("ddg", **_PLAN, k_stddevs=0.0), "k_stddevs"),
    (lambda: A.rounded_norm_bound(-1.0, 4, 0.5), "scaled_clip"),
    (lambda: A.skellam_rdp([2.5], l1=1, l2=1, variance=1.0), "orders"),
    (lambda: A.skellam_rdp([2], l1=1, l2=1, variance=0.0), "variance"),
    (lambda: A.ddg_rdp([2], l1=1, l2=1, share_sigma=0.3, num_shares=2, dim=1), "share_sigma"),
    (lambda: A.ddg_rdp([1.0], l1=1, l2=1, share_sigma=1, num_shares=2, dim=1), "orders"),
    (lambda: A.wor_subsampled_rdp([2], lambda j: j, population=5, cohort=6), "cohort"),
    (lambda: A.wor_subsampled_rdp([2, 3], [1.0], population=5, cohort=2), "base_rdp"),
    (lambda: A.run_rdp("ddg", [2], scaled_clip=1, dim=4, beta=0.5, total_variance=0.1,
                       cohort=4, min_survivors=4, population=10, rounds=1), "total_variance"),
    (lambda: A.run_rdp("skellam", [2], scaled_clip=1, dim=4, beta=0.5, total_variance=1,
                       cohort=4, min_survivors=4, population=10, rounds=-1), "rounds"),
    (lambda: A.epsilon([2], [1.0], 0.0), "delta"),
    (lambda: A.calibrate("ddg", target_epsilon=0.0, **_CAL, bits=16), "target_epsilon"),
])
def test_bad_inputs_name_the_parameter(call, name):
    with pytest.raises(ValueError, match=name):
        call()
