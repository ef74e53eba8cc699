"""LNMax data-dependent moments (PATE 2017 / FedKT Sec. 4): spec test values, the issue's
composition values, a scalar reference, the RDP conversion and bad input."""
import math

import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant

from fedjax_dp import privacy
from fedjax_dp.privacy import PrivacyLedger, lnmax


def ref_q(votes, gamma):
    """Scalar reference of Lemma 4 (plain Python loop)."""
    top = max(range(len(votes)), key=lambda i: (votes[i], -i))
    q = sum((2 + gamma * (votes[top] - v)) / (4 * math.exp(gamma * (votes[top] - v)))
            for i, v in enumerate(votes) if i != top)
    return min(q, 1 - 1 / len(votes))


def ref_moments(q, gamma, z=1, k=1, orders=range(1, 9)):
    out = []
    for l in orders:
        eps = 2 * k * gamma
        if q < 1 / (math.exp(2 * z * gamma) + 1):
            log_t = math.log((1 - q) * ((1 - q) / (1 - math.exp(2 * z * gamma) * q)) ** l
                             + q * math.exp(2 * z * gamma * l))
        else:
            log_t = eps * l
        out.append(min(eps ** 2 * l * (l + 1) / 2, log_t, eps * l))
    return out


@pytest.mark.parametrize("votes,gamma,expected", [
    ([8, 2], 0.1, 0.35672756346), ([80, 20], 0.04, 0.09978974862),
    ([20, 0], 0.05, 0.27590958088), ([10, 0, 0, 0, 0, 0, 0, 0, 0, 0], 0.1, 0.9)])
def test_q_spec_values(votes, gamma, expected):
    assert lnmax.lnmax_q(votes, gamma) == pytest.approx(expected, abs=1e-10)
    assert lnmax.lnmax_q(votes, gamma).dtype == np.float64


def test_moments_spec_values():
    q = lnmax.lnmax_q([20, 0], 0.1)
    got = lnmax.lnmax_log_moments(q, 0.1, z=1)
    np.testing.assert_allclose(got, [0.04, 0.12, 0.18876908, 0.25994797, 0.33596478,
                                     0.41723835, 0.50416405, 0.59709885], atol=1e-8)


def test_issue_composition_values():
    """1000 identical queries with votes [18, 2], gamma 0.05, delta 1e-5."""
    q = lnmax.lnmax_q(np.tile([18, 2], (1000, 1)), 0.05)                  # [1000]
    example = lnmax.lnmax_log_moments(q, 0.05).sum(0)
    party = lnmax.lnmax_log_moments(q, 0.05, z=2, k=2).sum(0)
    assert lnmax.moments_epsilon(example, 1e-5) == pytest.approx(20.7565, abs=1e-3)
    assert lnmax.moments_epsilon(party, 1e-5) == pytest.approx(51.5129, abs=1e-3)
    # the k-only form of the signature gives the same party-level value here
    assert lnmax.moments_epsilon(lnmax.lnmax_log_moments(q, 0.05, k=2).sum(0), 1e-5) == \
        pytest.approx(51.5129, abs=1e-3)


def test_vectorised_over_queries_matches_scalar_reference():
    rng = np.random.default_rng(0)
    votes = rng.integers(0, 30, size=(4, 25, 5))                          # [..., Q, C]
    for gamma, z, k in [(0.05, 1, 1), (0.2, 2, 2), (0.5, 3, 3), (0.1, 1, 2)]:
        q = lnmax.lnmax_q(votes, gamma)
        assert q.shape == (4, 25)
        m = lnmax.lnmax_log_moments(q, gamma, z=z, k=k, orders=range(1, 12))
        assert m.shape == (4, 25, 11)
        for idx in np.ndindex(4, 25):
            qr = ref_q(list(votes[idx]), gamma)
            assert q[idx] == pytest.approx(qr, rel=1e-12, abs=1e-15)
            np.testing.assert_allclose(m[idx], ref_moments(qr, gamma, z, k, range(1, 12)),
                                       rtol=1e-10, atol=1e-14)


def test_moments_never_exceed_pure_dp_bound_and_epsilon_formula():
    q = np.linspace(0, 0.9, 50)
    m = lnmax.lnmax_log_moments(q, 0.3, z=2, k=2)
    ls = np.arange(1, 9)
    assert np.all(m <= 2 * 2 * 0.3 * ls + 1e-12) and np.all(m >= 0)
    total = m.sum(0)
    brute = min((total[i] + math.log(1e5)) / l for i, l in enumerate(ls))
    assert lnmax.moments_epsilon(total, 1e-5) == pytest.approx(brute, rel=1e-12)


def test_rdp_conversion_through_the_ledger_matches_dp_accounting():
    q = lnmax.lnmax_q(np.tile([18, 2], (1000, 1)), 0.05)
    total = lnmax.lnmax_log_moments(q, 0.05).sum(0)
    orders, rdp = lnmax.log_moments_to_rdp(total)
    np.testing.assert_allclose(orders, np.arange(2, 10))
    np.testing.assert_allclose(rdp * (orders - 1), total)                 # alpha(l) = l RDP(l+1)
    ledger = PrivacyLedger().add_rdp("example", orders, rdp, relation="replace one example")
    got = ledger.report(1e-5, ("rdp",))[0]
    direct, _ = rdp_privacy_accountant.compute_epsilon(orders.tolist(), rdp.tolist(), 1e-5)
    assert got["data_dependent"] and got["epsilon"] == pytest.approx(direct, rel=1e-12)
    # the dp-accounting conversion is never looser than the moments accountant's
    assert got["epsilon"] <= lnmax.moments_epsilon(total, 1e-5) + 1e-9


def test_public_exports():
    assert privacy.lnmax_q is lnmax.lnmax_q
    assert privacy.lnmax_log_moments is lnmax.lnmax_log_moments
    assert privacy.moments_epsilon is lnmax.moments_epsilon


@pytest.mark.parametrize("call,match", [
    (lambda: lnmax.lnmax_q([3, 1], 0.0), "gamma"),
    (lambda: lnmax.lnmax_q([3, 1], float("inf")), "gamma"),
    (lambda: lnmax.lnmax_q([3], 0.1), "num_classes"),
    (lambda: lnmax.lnmax_q([3, -1], 0.1), "votes"),
    (lambda: lnmax.lnmax_log_moments(1.5, 0.1), "q"),
    (lambda: lnmax.lnmax_log_moments(0.1, 0.1, k=-1), "k"),
    (lambda: lnmax.lnmax_log_moments(0.1, 0.1, orders=[0, 1]), "orders"),
    (lambda: lnmax.lnmax_log_moments(0.1, 0.1, orders=[1.5]), "orders"),
    (lambda: lnmax.moments_epsilon(np.zeros(8), 1.0), "delta"),
    (lambda: lnmax.moments_epsilon(np.zeros(3), 1e-5), "one entry per order"),
])
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()
