"""Accounting wrappers against direct dp_accounting calls, and the privacy ledger."""
import json
import math

import dp_accounting as dpa
import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

from fedjax_dp.privacy import accounting as A
from fedjax_dp.privacy import calibration
from fedjax_dp.privacy import PrivacyLedger

DELTA = 1e-5
ORDERS = list(A.DEFAULT_RDP_ORDERS)


# ----------------------------------------------------------------------------- accounting

@pytest.mark.parametrize("z", [0.8, 1.1, 2.0])
@pytest.mark.parametrize("q", [0.01, 0.1, 1.0])
@pytest.mark.parametrize("steps", [1, 100])
def test_sampled_gaussian_rdp_matches_direct(z, q, steps):
    direct = dpa.rdp.RdpAccountant(orders=ORDERS)
    direct.compose(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z)), steps)
    assert A.sampled_gaussian_epsilon(z, q, steps, DELTA, "rdp") == pytest.approx(
        direct.get_epsilon(DELTA), rel=1e-9)


# PLD is slow for huge epsilons (q = 1, T = 100 gives eps ~ 100): a spread of the rest.
@pytest.mark.parametrize("z, q, steps", [(0.8, 0.01, 100), (1.1, 0.1, 1), (2.0, 0.1, 100),
                                         (1.1, 1.0, 1), (2.0, 0.01, 1)])
def test_sampled_gaussian_pld_matches_direct(z, q, steps):
    direct = pld_lib.from_gaussian_mechanism(
        z, sampling_prob=q, value_discretization_interval=A.DEFAULT_PLD_DISCRETIZATION)
    if steps > 1:
        direct = direct.self_compose(steps)
    assert A.sampled_gaussian_epsilon(z, q, steps, DELTA, "pld") == pytest.approx(
        direct.get_epsilon_for_delta(DELTA), rel=1e-6)


def test_sampled_gaussian_event_structure():
    e = A.sampled_gaussian_event(1.1, 0.01, 100)
    assert e == dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.01, dpa.GaussianDpEvent(1.1)),
                                        100)
    assert A.sampled_gaussian_event(1.1, 1.0, 7) == dpa.SelfComposedDpEvent(
        dpa.GaussianDpEvent(1.1), 7)                       # no Poisson wrapper at q = 1
    assert A.sampled_gaussian_event(1.1, 0.5, 0) == dpa.NoOpDpEvent()


def test_known_value_gaussian_sigma_25_500_compositions():
    # Gaussian mechanism, sensitivity 1, sigma 25, composed 500 times, delta 1e-3: RDP eps ~3.09.
    assert A.epsilon(A.gaussian_event(25.0, 500), 1e-3, "rdp") == pytest.approx(3.09, abs=0.01)
    # PLD is tight here: 500 Gaussians of std 25 are one Gaussian of std 25 / sqrt(500).
    assert A.epsilon(A.gaussian_event(25.0, 500), 1e-3, "pld") == pytest.approx(
        dpa.get_epsilon_gaussian(25.0 / math.sqrt(500), 1e-3), abs=2e-3)


def test_gaussian_event_rdp_closed_form():
    rdp = A.event_rdp(A.gaussian_event(3.0, 40))
    np.testing.assert_allclose(rdp, 40 * np.asarray(ORDERS) / (2 * 9.0), rtol=1e-12)


def test_laplace_event_is_pure_dp():
    # noise_multiplier b / Delta = 2 gives eps = 0.5 per application, 1.5 for three.
    assert A.epsilon(A.laplace_event(2.0), 1e-9, "pld") == pytest.approx(0.5, abs=1e-3)
    assert A.epsilon(A.laplace_event(2.0, 3), 1e-9, "pld") <= 1.5 + 1e-3
    assert A.laplace_event(2.0, 3) == dpa.SelfComposedDpEvent(dpa.LaplaceDpEvent(2.0), 3)


@pytest.mark.parametrize("z", [0.1, 0.02])
def test_small_noise_pld_is_an_upper_bound_on_a_fitted_grid(z):
    """10 Gaussians of multiplier z are one of z / sqrt(10) (exact epsilon: dp_accounting's
    analytic Gaussian). The PLD grid is coarsened below z = 0.32 (the default grid: 19 s at z =
    0.1, 75 GiB at 0.01) and the epsilon stays an upper bound within 0.05% of the exact one."""
    event = A.gaussian_event(z, 10)
    exact = dpa.get_epsilon_gaussian(z / math.sqrt(10), DELTA)
    got = A.epsilon(event, DELTA, "pld")
    assert exact - 1e-9 <= got <= exact * (1 + 5e-4)
    assert A.pld_interval(event) == pytest.approx(max(A.DEFAULT_PLD_DISCRETIZATION, 1e-5 / z**2))
    assert A.pld_interval(A.sampled_gaussian_event(0.5, 0.1, 3)) == A.DEFAULT_PLD_DISCRETIZATION
    assert A.pld_interval(A.gaussian_event(0.3)) == pytest.approx(1e-5 / 0.09)
    assert A.pld_interval(dpa.ComposedDpEvent([A.gaussian_event(2.0), A.laplace_event(1e-4)])) \
        == pytest.approx(1e-2)                                    # the noisiest part decides


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_noise_outside_the_accountable_range_is_bounded_toward_less_noise(accountant):
    """Below 1e-6 a Gaussian counts as noiseless (dp-accounting's RDP of the sampled Gaussian
    underflowed to epsilon 0 at z = 1e-160 and divided by zero at 1e-200); above 1e12 as 1e12
    (its RDP overflowed at 1e160)."""
    for z in (1e-8, 1e-160, 1e-200, 1e-300):
        assert A.epsilon(A.sampled_gaussian_event(z, 0.01, 1000), DELTA, accountant) == math.inf
        assert A.epsilon(A.gaussian_event(z, 10), DELTA, accountant) == math.inf
    assert 1e12 < A.epsilon(A.gaussian_event(1e-6, 10), DELTA, "rdp") < math.inf  # in range
    for b in (1e-8, 1e-300):                     # Laplace: non-private (1/b overflowed the PLD)
        assert A.epsilon(A.laplace_event(b, 3), DELTA, accountant) == math.inf
    assert A.epsilon(dpa.PoissonSampledDpEvent(0.1, dpa.LaplaceDpEvent(1e-300)), DELTA,
                     "pld") == math.inf
    assert A.epsilon(A.laplace_event(1e300), DELTA, accountant) == 0.0
    for z in (1e160, 1e300):
        assert A.epsilon(A.sampled_gaussian_event(z, 0.01, 10), DELTA, accountant) == \
            A.epsilon(A.sampled_gaussian_event(1e12, 0.01, 10), DELTA, accountant) == 0.0


def test_calibration_probes_go_through_the_same_accounting():
    """A large target's noise multiplier (about 0.05: the default PLD grid took about a minute per
    probe) comes back, and meets its target by both accountants."""
    for accountant in ("rdp", "pld"):
        z = calibration.calibrate_noise_multiplier(
            250.0, DELTA, lambda z: A.gaussian_event(z), accountant, tol=1e-2)
        assert 0.01 < z < 0.2
        assert A.epsilon(A.gaussian_event(z), DELTA, accountant) <= 250.0


def test_delta_for_epsilon_matches_direct():
    e = A.gaussian_event(2.0, 10)
    for kind, direct in [("rdp", dpa.rdp.RdpAccountant(orders=ORDERS)),
                         ("pld", dpa.pld.PLDAccountant(value_discretization_interval=1e-4))]:
        direct.compose(e)
        assert A.delta_for_epsilon(e, 3.0, kind) == pytest.approx(direct.get_delta(3.0), rel=1e-9)
    eps = A.epsilon(e, DELTA, "pld")
    assert A.delta_for_epsilon(e, eps, "pld") <= DELTA * (1 + 1e-9)


def test_epsilon_from_rdp_matches_compute_epsilon():
    rdp = np.random.default_rng(0).uniform(0, 0.05, len(ORDERS)) * np.asarray(ORDERS)
    eps, order = A.epsilon_from_rdp(ORDERS, rdp, DELTA)
    want_eps, want_order = rdp_lib.compute_epsilon(ORDERS, list(rdp), DELTA)
    assert eps == pytest.approx(want_eps, rel=1e-12) and order == want_order


def _class_names(obj, found):
    if isinstance(obj, dict):
        if "class_name" in obj:
            found.append(obj["class_name"])
        for v in obj.values():
            _class_names(v, found)
    elif isinstance(obj, list):
        for v in obj:
            _class_names(v, found)
    return found


def test_event_to_json_recursive_and_round_trip():
    e = dpa.ComposedDpEvent([A.sampled_gaussian_event(1.1, 0.01, 100), A.laplace_event(2.0, 3)])
    j = A.event_to_json(e)
    assert _class_names(j, []) == ["ComposedDpEvent", "SelfComposedDpEvent",
                                   "PoissonSampledDpEvent", "GaussianDpEvent",
                                   "SelfComposedDpEvent", "LaplaceDpEvent"]
    assert j["events"][0]["event"]["sampling_probability"] == 0.01
    assert j["events"][0]["count"] == 100
    text = json.dumps(j, allow_nan=False)
    assert A.event_from_json(text) == e


@pytest.mark.parametrize("call, name", [
    (lambda: A.epsilon(A.gaussian_event(1.0), 0.0), "delta"),
    (lambda: A.epsilon(A.gaussian_event(1.0), 1.0), "delta"),
    (lambda: A.epsilon(A.gaussian_event(1.0), 1e-5, "moments"), "accountant"),
    (lambda: A.epsilon("not an event", 1e-5), "event"),
    (lambda: A.sampled_gaussian_event(-1.0, 0.1, 10), "noise_multiplier"),
    (lambda: A.sampled_gaussian_event(1.0, 0.0, 10), "sampling_rate"),
    (lambda: A.sampled_gaussian_event(1.0, 1.5, 10), "sampling_rate"),
    (lambda: A.sampled_gaussian_event(1.0, 0.1, -1), "steps"),
    (lambda: A.sampled_gaussian_event(1.0, 0.1, 2.5), "steps"),
    (lambda: A.sampled_gaussian_epsilon(1.0, 0.1, 10, -1e-5), "delta"),
    (lambda: A.laplace_event(0.0), "noise_multiplier"),
    (lambda: A.gaussian_event(1.0, -2), "count"),
    (lambda: A.make_accountant("rdp", orders=[0.5, 2.0]), "orders"),
    (lambda: A.epsilon_from_rdp([2.0, 3.0], [0.1], 1e-5), "same length"),
    (lambda: A.delta_for_epsilon(A.gaussian_event(1.0), -1.0), "epsilon"),
    (lambda: A.epsilon(dpa.UnsupportedDpEvent(), 1e-5), "does not support"),
])
def test_accounting_bad_inputs(call, name):
    with pytest.raises(ValueError, match=name):
        call()


# ----------------------------------------------------------------------------- ledger

REL = "add/remove one agent"


def test_ledger_composition_equals_composing_by_hand():
    e1, e2 = A.gaussian_event(4.0, 20), A.laplace_event(10.0, 2)
    ledger = PrivacyLedger().add_event("agent", e1, relation=REL, sensitivity=1.0)
    ledger.add_event("agent", e2, relation=REL)
    assert ledger.event("agent") == dpa.ComposedDpEvent([e1, e2])
    for kind in ("rdp", "pld"):
        direct = A.make_accountant(kind)
        direct.compose(e1)
        direct.compose(e2)
        assert ledger.epsilon("agent", DELTA, kind) == pytest.approx(direct.get_epsilon(DELTA),
                                                                     rel=1e-9)
    assert ledger.epsilon("agent", DELTA) > A.epsilon(e1, DELTA)


def test_ledger_units_are_separate():
    ledger = PrivacyLedger()
    ledger.add_event("agent", A.gaussian_event(2.0, 5), relation=REL)
    ledger.add_event("instance", A.gaussian_event(0.5, 50), relation="replace one instance")
    assert ledger.units() == ["agent", "instance"]
    assert ledger.epsilon("agent", DELTA) == pytest.approx(
        A.epsilon(A.gaussian_event(2.0, 5), DELTA), rel=1e-12)
    assert ledger.event("instance") == A.gaussian_event(0.5, 50)
    with pytest.raises(ValueError, match="relation"):
        ledger.add_event("agent", A.gaussian_event(1.0), relation="replace one agent")
    with pytest.raises(ValueError, match="unit"):
        ledger.epsilon("party", DELTA)


def test_ledger_data_dependent_rdp_sums_and_converts():
    rng = np.random.default_rng(1)
    r1 = rng.uniform(0, 0.01, len(ORDERS)) * np.asarray(ORDERS)
    r2 = rng.uniform(0, 0.02, len(ORDERS)) * np.asarray(ORDERS)
    ledger = PrivacyLedger()
    ledger.add_rdp("instance", ORDERS, r1, relation="replace one instance", note="GNMax")
    ledger.add_rdp("instance", ORDERS, r2, relation="replace one instance")
    want, _ = rdp_lib.compute_epsilon(ORDERS, list(r1 + r2), DELTA)
    assert ledger.epsilon("instance", DELTA) == pytest.approx(want, rel=1e-12)
    assert ledger.data_dependent("instance")
    with pytest.raises(ValueError, match="accountant"):
        ledger.epsilon("instance", DELTA, "pld")
    with pytest.raises(ValueError, match="orders"):
        ledger.add_rdp("instance", ORDERS[:-1], r1[:-1], relation="replace one instance")
    with pytest.raises(ValueError, match="data-dependent"):
        ledger.event("instance")
    # An event on the same unit is converted to RDP on the grid and added.
    ledger.add_event("instance", A.gaussian_event(5.0, 3), relation="replace one instance")
    closed = 3 * np.asarray(ORDERS) / (2 * 25.0)
    want, _ = rdp_lib.compute_epsilon(ORDERS, list(r1 + r2 + closed), DELTA)
    assert ledger.epsilon("instance", DELTA) == pytest.approx(want, rel=1e-9)


def test_report_fields_and_json():
    rng = np.random.default_rng(2)
    ledger = PrivacyLedger()
    ledger.add_event("agent", A.sampled_gaussian_event(1.1, 0.1, 10), relation=REL,
                     sensitivity=1.0, note="DP-FedAvg")
    ledger.add_rdp("instance", ORDERS, rng.uniform(0, 0.1, len(ORDERS)),
                   relation="replace one instance")
    rows = ledger.report(DELTA)
    text = json.dumps(rows, allow_nan=False)
    assert json.loads(text) == rows
    assert [(r["unit"], r["accountant"]) for r in rows] == [("agent", "rdp"), ("agent", "pld"),
                                                             ("instance", "rdp")]
    for r in rows:
        assert {"unit", "relation", "epsilon", "delta", "accountant", "data_dependent",
                "events"} <= set(r)
        assert r["delta"] == DELTA and isinstance(r["data_dependent"], bool)
    agent_rdp, agent_pld, inst = rows
    assert agent_rdp["epsilon"] == pytest.approx(
        A.sampled_gaussian_epsilon(1.1, 0.1, 10, DELTA, "rdp"), rel=1e-12)
    assert agent_pld["epsilon"] == pytest.approx(
        A.sampled_gaussian_epsilon(1.1, 0.1, 10, DELTA, "pld"), rel=1e-12)
    assert not agent_rdp["data_dependent"] and inst["data_dependent"]
    assert _class_names(agent_rdp["events"], []) == ["SelfComposedDpEvent",
                                                     "PoissonSampledDpEvent", "GaussianDpEvent"]
    assert agent_rdp["notes"] == ["DP-FedAvg"] and agent_rdp["relation"] == REL
    assert set(inst["events"][0]) == {"orders", "rdp"}
    assert len(inst["events"][0]["rdp"]) == len(ORDERS)
    # The events recorded in a guarantee reproduce its epsilon.
    assert A.epsilon(A.event_from_json(agent_rdp["events"][0]), DELTA) == agent_rdp["epsilon"]
    with pytest.raises(ValueError, match="rdp"):
        ledger.report(DELTA, accountants=("pld",))
    assert PrivacyLedger().report(DELTA) == []


def test_parallel_worst_member():
    members = [A.gaussian_event(2.0, 10), A.gaussian_event(1.0, 10), A.gaussian_event(3.0, 10),
               A.gaussian_event(1.0, 10)]
    ledger = PrivacyLedger().add_parallel("party", members, relation="replace one party")
    eps = [A.epsilon(m, DELTA) for m in members]
    assert ledger.epsilon("party", DELTA) == pytest.approx(max(eps), rel=1e-12)
    row = ledger.report(DELTA, accountants=("rdp",))[0]
    assert row["parallel"][0]["worst_member"] == 1 and row["parallel"][0]["num_members"] == 4
    assert row["parallel"][0]["distinct_members"][1]["members"] == [1, 3]
    # Composed with a sequential event of the same unit: max_i eps(event + member_i).
    extra = A.gaussian_event(1.5, 4)
    ledger.add_event("party", extra, relation="replace one party")
    want = max(A.epsilon(dpa.ComposedDpEvent([m, extra]), DELTA) for m in members)
    assert ledger.epsilon("party", DELTA) == pytest.approx(want, rel=1e-12)
    assert ledger.event("party", delta=DELTA) == dpa.ComposedDpEvent([members[1], extra])
    with pytest.raises(ValueError, match="delta"):
        ledger.event("party")


def test_parallel_worst_member_depends_on_delta():
    # A pure-DP member (eps = 1 at every delta) against a Gaussian one whose epsilon grows as
    # delta shrinks: which member is worst is decided at report time.
    laplace, gauss = A.laplace_event(1.0), A.gaussian_event(2.0)
    lo_delta, hi_delta = 1e-10, 1e-2
    assert A.epsilon(gauss, hi_delta, "pld") < 0.999 < 1.001 < A.epsilon(gauss, lo_delta, "pld")
    ledger = PrivacyLedger().add_parallel("party", [laplace, gauss], relation="r")
    assert ledger.report(hi_delta, ("pld",))[0]["parallel"][0]["worst_member"] == 0
    assert ledger.report(lo_delta, ("pld",))[0]["parallel"][0]["worst_member"] == 1


def test_merged_and_json_round_trip():
    a = PrivacyLedger().add_event("agent", A.gaussian_event(3.0, 10), relation=REL)
    b = PrivacyLedger().add_event("agent", A.gaussian_event(2.0, 5), relation=REL)
    b.add_parallel("party", [A.gaussian_event(2.0), A.gaussian_event(4.0)], relation="r")
    b.add_rdp("instance", ORDERS, np.full(len(ORDERS), 0.01), relation="replace one instance")
    m = a.merged(b)
    assert len(a) == 1 and len(m) == 4
    assert m.epsilon("agent", DELTA) == pytest.approx(A.epsilon(dpa.ComposedDpEvent(
        [A.gaussian_event(3.0, 10), A.gaussian_event(2.0, 5)]), DELTA), rel=1e-12)
    again = PrivacyLedger.from_json(json.dumps(m.to_json()))
    assert again.entries == m.entries
    assert again.report(DELTA) == m.report(DELTA)
    with pytest.raises(ValueError, match="relation"):
        a.merged(PrivacyLedger().add_event("agent", A.gaussian_event(1.0), relation="other"))


@pytest.mark.parametrize("call, name", [
    (lambda L: L.add_event("", A.gaussian_event(1.0), relation=REL), "unit"),
    (lambda L: L.add_event("agent", A.gaussian_event(1.0), relation=""), "relation"),
    (lambda L: L.add_event("agent", "gaussian", relation=REL), "event"),
    (lambda L: L.add_event("agent", A.gaussian_event(1.0), relation=REL, sensitivity=-1),
     "sensitivity"),
    (lambda L: L.add_parallel("party", [], relation=REL), "events_per_member"),
    (lambda L: L.add_rdp("x", [2.0, 3.0], [0.1], relation=REL), "same length"),
    (lambda L: L.add_rdp("x", [0.5, 3.0], [0.1, 0.2], relation=REL), "orders"),
    (lambda L: L.add_rdp("x", [2.0, 3.0], [0.1, -0.2], relation=REL), "rdp"),
    (lambda L: L.report(0.0), "delta"),
    (lambda L: L.report(DELTA, accountants=("zcdp",)), "accountants"),
])
def test_ledger_bad_inputs(call, name):
    with pytest.raises(ValueError, match=name):
        call(PrivacyLedger())


def test_dp_accounting_low_order_warnings_are_summarised_once():
    """dp-accounting warns per low RDP order on every run; the library drops those warnings and
    logs one INFO line per distinct (q, sigma) instead. Epsilon is unchanged. (Handlers sit on
    the two loggers themselves: absl's logger may not propagate to the root.)"""
    import logging

    import dp_accounting
    from fedjax_dp.privacy import accounting

    class Collect(logging.Handler):
        def __init__(self):
            super().__init__(level=logging.DEBUG)
            self.messages = []

        def emit(self, record):
            self.messages.append((record.name, record.getMessage()))

    absl_logger, ours = logging.getLogger("absl"), logging.getLogger("fedjax_dp.privacy")
    seen = Collect()
    levels = absl_logger.level, ours.level
    for lg in (absl_logger, ours):
        lg.addHandler(seen)
        lg.setLevel(logging.INFO)
    try:
        event = accounting.sampled_gaussian_event(1.37, 0.3, 30)
        eps = [accounting.epsilon(event, 1e-5) for _ in range(3)]
        ours_seen, seen.messages = seen.messages, []
        # the warnings exist upstream (dp-accounting's own function, not the library's memo)
        accounting._SAMPLED_GAUSSIAN_RDP(0.3, 1.37, list(accounting.DEFAULT_RDP_ORDERS))
        assert any("failed to converge" in m for _, m in seen.messages)
    finally:
        for lg, level in zip((absl_logger, ours), levels):
            lg.removeHandler(seen)
            lg.setLevel(level)
    assert not [m for _, m in ours_seen if "failed to converge" in m]
    summaries = [m for name, m in ours_seen if name == "fedjax_dp.privacy"]
    assert len(summaries) == 1 and "sigma=1.37" in summaries[0]
    direct = dp_accounting.rdp.RdpAccountant(list(accounting.DEFAULT_RDP_ORDERS))
    direct.compose(event)
    assert eps == [direct.get_epsilon(1e-5)] * 3


def test_printed_guarantees_say_when_they_are_data_dependent():
    from fedjax_dp.experiments.runner import guarantee_line
    row = {"unit": "party", "epsilon": 1.23456, "delta": 1e-5, "accountant": "rdp"}
    assert guarantee_line({**row, "data_dependent": True}) == \
        "party: eps=1.235 at delta=1e-05 (rdp, data-dependent)"
    assert guarantee_line({**row, "data_dependent": False}) == \
        "party: eps=1.235 at delta=1e-05 (rdp)"
    assert guarantee_line({**row, "epsilon": None}) == \
        "party: eps=inf at delta=1e-05 (rdp)"                 # result.json's null: no guarantee


def test_report_memo_computes_each_ledger_once_and_matches_direct(monkeypatch):
    """Identical ledgers (a sweep's seeds and non-privacy grid points) are accounted once; the
    memoised epsilon equals dp-accounting's, and a different event is not served from the memo."""
    from fedjax_dp.privacy import ledger as ledger_lib
    monkeypatch.setattr(ledger_lib, "_EPSILON_MEMO", type(ledger_lib._EPSILON_MEMO)())
    calls = []
    real = A.composed_accountant
    monkeypatch.setattr(A, "composed_accountant", lambda *a, **k: calls.append(a) or real(*a, **k))

    def ledger(z):
        return PrivacyLedger().add_event(
            "record", dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.05, dpa.GaussianDpEvent(z)), 40),
            relation="add/remove one record")

    first = ledger(1.3).report(DELTA, accountants=("rdp", "pld"))
    again = ledger(1.3).report(DELTA, accountants=("rdp", "pld"))
    assert len(calls) == 2 and again == first              # one RDP and one PLD computation
    direct = dpa.rdp.RdpAccountant(orders=ORDERS)
    direct.compose(dpa.PoissonSampledDpEvent(0.05, dpa.GaussianDpEvent(1.3)), 40)
    assert first[0]["epsilon"] == pytest.approx(direct.get_epsilon(DELTA), rel=1e-9)
    other = ledger(1.4).report(DELTA, accountants=("rdp",))
    assert len(calls) == 3 and other[0]["epsilon"] < first[0]["epsilon"]
