"""GNMax data-dependent RDP (PATE 2018 Thm 6): spec test values, vectorised vs scalar, conversion."""
import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant

from fedjax_dp.privacy.gnmax import (PATE_ORDERS, gnmax_epsilon, gnmax_logq, gnmax_rdp,
                                     gnmax_total_rdp)

ORDERS = [2, 5, 10, 20, 50, 100]


@pytest.mark.parametrize("votes,sigma,expected", [
    ([10, 0, 0], 0.5, -102.87988902484489),
    ([100, 50, 30, 20, 0], 25, -2.1483911044301687),
    ([5, 5, 0], 10, -0.4054651081081643),                 # the cap log(1 - 1/C)
])
def test_logq_spec_values(votes, sigma, expected):
    assert gnmax_logq(votes, sigma) == pytest.approx(expected, rel=1e-8)


def test_rdp_spec_values():
    np.testing.assert_allclose(
        gnmax_rdp(-5.0, 10.0, ORDERS),
        [0.007585714072, 0.012229931382, 0.040502496355, 0.195442648363, 0.5, 1.0], rtol=1e-8)
    np.testing.assert_allclose(gnmax_rdp(math.log(0.5), 1.0, ORDERS), ORDERS, rtol=1e-12)


def _rdp_scalar_reference(logq, sigma, orders):
    """PATE 2018 rdp_gaussian written out for one query (a per-query loop reference)."""
    orders = np.asarray(orders, float)
    if np.isneginf(logq):
        return np.zeros_like(orders)
    var = sigma ** 2
    out = orders / var
    mu2 = math.sqrt(var * -logq)
    mu1 = mu2 + 1
    if mu2 <= 1:
        return out
    e1, e2 = mu1 / var, mu2 / var
    if not (logq <= (mu2 - 1) * e2 - mu2 * (math.log(1 + 1 / (mu1 - 1)) + math.log(1 + 1 / (mu2 - 1)))
            and -logq > e2):
        return out
    log1q = math.log1p(-math.exp(logq))
    res = out.copy()
    for i, a in enumerate(orders):
        if a >= mu1:
            continue
        log_a = (a - 1) * (log1q - math.log1p(-math.exp((logq + e2) * (1 - 1 / mu2))))
        log_b = (a - 1) * (e1 - logq / (mu1 - 1))
        res[i] = min(out[i], np.logaddexp(log1q + log_a, logq + log_b) / (a - 1))
    return res


def test_vectorised_over_queries_matches_a_loop():
    rng = np.random.default_rng(0)
    votes = rng.integers(0, 60, size=(40, 10)).astype(float)
    votes[:10, 3] += 200                                  # some strong-consensus queries
    sigma = 7.0
    logq = gnmax_logq(votes, sigma)
    assert logq.shape == (40,)
    loop_logq = [gnmax_logq(v, sigma) for v in votes]
    np.testing.assert_allclose(logq, loop_logq, rtol=1e-12)
    rdp = gnmax_rdp(logq, sigma, PATE_ORDERS)
    assert rdp.shape == (40, len(PATE_ORDERS))
    ref = np.stack([_rdp_scalar_reference(float(l), sigma, PATE_ORDERS) for l in logq])
    np.testing.assert_allclose(rdp, ref, rtol=1e-10)
    assert np.any(rdp < PATE_ORDERS / sigma ** 2 - 1e-9)   # the data-dependent branch is used
    assert np.all(rdp <= PATE_ORDERS / sigma ** 2 + 1e-12)


def test_certain_outcome_costs_nothing_and_bad_logq_rejected():
    np.testing.assert_array_equal(gnmax_rdp(-np.inf, 3.0, ORDERS), 0.0)
    with pytest.raises(ValueError, match="logq"):
        gnmax_rdp(0.5, 3.0, ORDERS)
    with pytest.raises(ValueError, match="sigma"):
        gnmax_logq([1, 0], 0.0)
    with pytest.raises(ValueError, match="votes"):
        gnmax_logq([1.0, np.nan], 1.0)
    with pytest.raises(ValueError, match="orders"):
        gnmax_rdp(-1.0, 1.0, [0.5, 2])
    with pytest.raises(ValueError, match="delta"):
        gnmax_epsilon([[3, 0]], 1.0, 1.5)


def test_epsilon_conversion_and_data_independent_matches_dp_accounting():
    votes = np.tile([40.0, 5, 3, 2, 0, 0, 0, 0, 0, 0], (300, 1))
    sigma, delta = 10.0, 1e-5
    for sens in (1.0, math.sqrt(2.0), math.sqrt(2.0) / 5):
        eps_dd, eps_di = gnmax_epsilon(votes, sigma, delta, sensitivity=sens)
        grid, dd, di = gnmax_total_rdp(votes, sigma, sens)
        sigma_eff = sigma * math.sqrt(2) / sens
        np.testing.assert_allclose(di, 300 * PATE_ORDERS / sigma_eff ** 2)
        expect_dd = rdp_privacy_accountant.compute_epsilon(
            PATE_ORDERS.tolist(), (300 * gnmax_rdp(gnmax_logq(votes[0], sigma), sigma_eff,
                                                   PATE_ORDERS)).tolist(), delta)[0]
        assert eps_dd == pytest.approx(expect_dd, rel=1e-9)
        acc = dp_accounting.rdp.RdpAccountant(list(PATE_ORDERS))
        acc.compose(dp_accounting.SelfComposedDpEvent(
            dp_accounting.GaussianDpEvent(sigma / sens), 300))
        assert eps_di == pytest.approx(acc.get_epsilon(delta), rel=1e-9)
        assert eps_dd <= eps_di + 1e-12
    # strong consensus is much cheaper than the data-independent bound
    strong = np.tile([100.0, 5, 3, 2, 0, 0, 0, 0, 0, 0], (300, 1))
    eps_dd, eps_di = gnmax_epsilon(strong, sigma, delta, sensitivity=math.sqrt(2))
    assert eps_dd < 0.5 * eps_di


def test_logq_is_scale_invariant_so_sensitivity_only_enters_the_rdp():
    votes = np.array([[9.0, 4, 1], [3, 3, 2]])
    c = math.sqrt(2) / 0.3
    np.testing.assert_allclose(gnmax_logq(votes * c, 2.0 * c), gnmax_logq(votes, 2.0), rtol=1e-12)


def test_pate_orders():
    np.testing.assert_allclose(
        PATE_ORDERS, np.concatenate([np.arange(2, 100.5, 0.5), np.logspace(2, np.log10(500), 100)]))
