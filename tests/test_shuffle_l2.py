"""The L2 analysis of the shuffle-DP binomial vector sum (fedjax_dp.privacy.shuffle_l2) against
exact enumeration of the released integer sums' distributions on tiny cases.

"Exact" here is the worst case over every rounded report an L2-clipped record can produce
(shuffle_l2's set (1), enumerated by brute force): for each such report m, the exact epsilon(delta)
of the pair ((1 - q) Q + q P_m, Q) (T-fold product), P_m / Q the exact product of shifted /
unshifted Bin(N, 1/2) pmfs, in both directions; the maximum over m. Every analysis that bounds a
mixture over the rounding by its worst outcome (both analyses here do) is >= this number, and it
is attained by a record whose scaled coordinates are integers.
"""
import itertools
import json
import math

import numpy as np
import pytest
from scipy import stats

from fedjax_dp.privacy import PrivacyLedger, shuffle, shuffle_accounting as sa, shuffle_l2

#: The L2 analysis is within this factor of the exact worst-case epsilon on the tiny cases (the
#: measured ratios are 1.17-1.31: the RDP-to-(eps, delta) conversion of one release).
L2_FACTOR = 1.4


def rounded_set(k, d):
    """Brute force: sign-free integer vectors |m| with |m_j| <= K reachable by rounding a y with
    ||y||_2 <= K (|y_j| in (|m_j| - 1, |m_j|])."""
    return [m for m in itertools.product(range(k + 1), repeat=d)
            if sum((x - 1) ** 2 for x in m if x) < k * k]


def release_pair(n, k, m, q):
    o = np.arange(n + k + 1)
    base = stats.binom.pmf(o, n, 0.5)
    p = qq = np.ones(1)
    for mj in m:
        p = np.multiply.outer(p, stats.binom.pmf(o - mj, n, 0.5)).ravel()
        qq = np.multiply.outer(qq, base).ravel()
    return (1 - q) * qq + q * p, qq


def exact_epsilon(p, q, delta):
    """Smallest eps >= 0 with sum (p - e^eps q)_+ <= delta in both directions (exact pmfs)."""
    def one(a, b):
        fin = b > 0
        inf_mass = a[~fin].sum()
        loss = np.log(np.maximum(a[fin], 1e-300)) - np.log(b[fin])
        order = np.argsort(-loss)
        desc, ca, cb = loss[order], np.cumsum(a[fin][order]), np.cumsum(b[fin][order])

        def hs(e):
            i = np.searchsorted(-desc, -e, side="left")          # outcomes with loss > e
            return inf_mass + (ca[i - 1] - math.exp(e) * cb[i - 1] if i else 0.0)

        if hs(0.0) <= delta:
            return 0.0
        lo, hi = 0.0, 60.0
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if hs(mid) <= delta else (mid, hi)
        return hi
    return max(one(p, q), one(q, p))


def exact_worst(n, k, d, q, releases, delta):
    best = 0.0
    for m in rounded_set(k, d):
        if not any(m):
            continue
        p1, q1 = release_pair(n, k, m, q)
        p, qq = p1, q1
        for _ in range(releases - 1):
            p, qq = np.multiply.outer(p, p1).ravel(), np.multiply.outer(qq, q1).ravel()
        best = max(best, exact_epsilon(p, qq, delta))
    return best


@pytest.mark.parametrize("n,k,d,q,releases", [
    (30, 2, 1, 1.0, 1), (30, 2, 3, 1.0, 1), (60, 3, 2, 0.3, 1),
    (40, 2, 1, 1.0, 2)])
def test_l2_analysis_is_an_upper_bound_within_a_factor_of_the_exact_epsilon(n, k, d, q, releases):
    delta = 1e-3
    exact = exact_worst(n, k, d, q, releases, delta)
    cfg = shuffle.ShuffleConfig(1.0, k, n)
    l2 = sa.epsilon(cfg, d, releases, delta, sampling_probability=q, analysis="l2")
    per_coord = sa.epsilon(cfg, d, releases, delta, sampling_probability=q)
    assert exact > 0.5                                   # a case with something to bound
    assert l2 >= exact - 1e-9
    assert l2 <= L2_FACTOR * exact
    assert per_coord >= exact - 1e-6                     # the enumeration's own sanity check


def test_the_rounded_set_and_its_l2_norm_match_brute_force():
    for k, d in [(1, 3), (2, 2), (3, 3), (4, 2)]:
        brute = max(sum(x * x for x in m) for m in rounded_set(k, d))
        assert shuffle_l2.max_rounded_l2(k, d) == pytest.approx(math.sqrt(brute))
        assert len(rounded_set(k, d)) == sum(                # the sign-free vectors |m| of (1)
            1 for m in itertools.product(range(k + 1), repeat=d)
            if sum((x - 1) ** 2 for x in m if x) <= k * k - 1)
    # Large d: at most K + sqrt(d) grid steps (the bound), far below K sqrt(d).
    assert shuffle_l2.max_rounded_l2(16, 167) <= 16 + math.sqrt(167)
    assert shuffle_l2.max_rounded_l2(16, 167) < 16 * math.sqrt(167) / 7


def test_release_rdp_is_the_worst_rounded_report_by_brute_force():
    n, k, d = 50, 3, 3
    f = shuffle_l2.coordinate_rdp(n, k)                  # [A, K + 1]
    rho, pi_d = shuffle_l2.release_rdp(n, k, d)
    brute = np.max([f[:, list(m)].sum(axis=1) for m in rounded_set(k, d)], axis=0)
    np.testing.assert_allclose(rho, brute, rtol=1e-12)
    assert 0 <= pi_d < 1e-6
    assert np.all(np.diff(f, axis=1) > 0)                # a larger shift diverges more


def test_l2_analysis_is_much_tighter_than_per_coordinate_at_d_167():
    # WBCD's MLP 30-5-2 (d = 167), K = 16: one release, no sampling.
    cfg = shuffle.ShuffleConfig(1.0, 16, 200_000)
    l2 = sa.epsilon(cfg, 167, 1, 1e-5, analysis="l2")
    per_coord = sa.epsilon(cfg, 167, 1, 1e-5)
    print(f"d=167 K=16 N=2e5 one release: per-coordinate eps {per_coord:.3f}, L2 eps {l2:.3f}")
    assert l2 < per_coord / 4


def test_l2_events_in_json_the_ledger_and_calibration():
    cfg = shuffle.ShuffleConfig(1.0, 2, 60)
    ev = sa.make_event(cfg, 2, 3, sampling_probability=0.5, analysis="l2")
    back = sa.BinomialSumEvent.from_json(json.loads(json.dumps(ev.to_json())))
    assert back == ev and back.analysis == "l2"
    assert "analysis" not in sa.make_event(cfg, 2, 3).to_json()   # old JSON unchanged
    ledger = PrivacyLedger().add_parallel("shuffle", [ev], relation="add/remove one report")
    (row,) = ledger.report(1e-3, ("pld",))
    assert row["epsilon"] == pytest.approx(float(sa.pld(ev).get_epsilon_for_delta(1e-3)))
    h = 1e-3                                             # a coarse grid keeps this fast
    n = sa.calibrate_noise_trials(2.0, 1e-3, granularity=2, dimension=2, releases=3,
                                  sampling_probability=0.5, analysis="l2",
                                  value_discretization_interval=h)
    eps = lambda trials: sa.epsilon(cfg.replace(noise_trials=trials), 2, 3, 1e-3,
                                    sampling_probability=0.5, analysis="l2",
                                    value_discretization_interval=h)
    assert eps(n) <= 2.0 < eps(n - 1)


def test_l2_analysis_refuses_what_it_does_not_cover():
    cfg = shuffle.ShuffleConfig(1.0, 2, 60)
    with pytest.raises(ValueError, match="add_remove"):
        sa.make_event(cfg, 2, relation="replace", analysis="l2")
    with pytest.raises(ValueError, match="norm"):
        sa.make_event(cfg.replace(norm="linf"), 2, analysis="l2")
    with pytest.raises(ValueError, match="analysis"):
        sa.make_event(cfg, 2, analysis="l3")
    with pytest.raises(ValueError, match="noise_trials"):
        sa.epsilon(cfg.replace(noise_trials=3), 2, 1, 1e-3, analysis="l2")


def test_sdp_config_takes_the_analysis():
    from fedjax_dp.algorithms.isrl import sdp
    from fedjax_dp.core import validation
    specs = validation.field_specs(sdp.SpiderConfig)
    assert specs["shuffle_analysis"]("algorithm.shuffle_analysis", "l2") == "l2"
    assert sdp.Config().shuffle_analysis == "per_coordinate"
    with pytest.raises(ValueError, match="algorithm.shuffle_analysis"):
        specs["shuffle_analysis"]("algorithm.shuffle_analysis", "exact")
