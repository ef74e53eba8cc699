"""ISRL-DP SPIDER's ``accounting = "reference"``: the reference code's sizing (each of SPIDER's
upload kinds calibrated alone to the full budget) reproduced, its true epsilon reported, and the
default (correct) composition unchanged -- all checked against dp-accounting called directly."""
import dataclasses
import logging

import dp_accounting
import numpy as np
import pytest

from fedjax_dp.algorithms import api, isrl
from fedjax_dp.algorithms.isrl import calibration, engine, protocol
from fedjax_dp.privacy import accounting

logging.getLogger("absl").setLevel(logging.ERROR)   # dp-accounting's fractional-order warnings

DELTA = 1e-4
SPIDER = isrl.ISRL_SPIDER
# two silos: rates K1 / n_i (refresh) and K2 / n_i (difference); silo 0 with K2 = K1 (the
# authors' run), silo 1 with K2 = K1 / 2
RATES = np.array([[0.2, 0.2], [0.2, 0.1]])


def _epsilon(z, releases, delta=DELTA):
    """dp-accounting itself (RDP): PoissonSampled(p, Gaussian(z)) composed c times per kind."""
    acc = dp_accounting.rdp.RdpAccountant(list(accounting.DEFAULT_RDP_ORDERS))
    for p, c in releases:
        if c:
            acc.compose(dp_accounting.PoissonSampledDpEvent(p, dp_accounting.GaussianDpEvent(z)),
                        int(c))
    return acc.get_epsilon(delta)


def _state(rates, counts, z):
    spec = engine.RoundSpec(method=SPIDER.method, num_silos=len(rates), num_available=len(rates))
    ctx = protocol.Context(data=None, model=None, spec=spec, round_fn=None, noise_multiplier=z,
                           rates=np.asarray(rates, np.float64))
    return api.State(step=0, values={"uploads": np.asarray(counts, np.int32)}, context=ctx)


def test_reference_accounting_sizes_each_upload_alone_and_reports_the_true_epsilon():
    """The authors' R = 6 rounds (a refresh AND a difference upload each) are rounds = 12 at
    q = 2: z is the smallest with which each kind's own 6 releases meet epsilon 1 (the costlier
    kind decides, per silo); the ledger composes all 12, the true epsilon of the run."""
    target, r = 1.0, 6
    cfg = SPIDER.Config(rounds=2 * r, phase_length=2, target_epsilon=target, delta=DELTA,
                        accounting="reference")
    z = SPIDER.noise_multiplier(cfg, RATES)
    for zi, (p1, p2) in zip(z, RATES):
        alone = [_epsilon(zi, [(p, r)]) for p in (p1, p2)]      # each kind's own series
        assert max(alone) <= target                              # ... meets the target
        # and z is the smallest that does: 0.3% less noise breaks it for the costlier kind
        assert _epsilon(zi * 0.997, [(max(p1, p2), r)]) > target
    state = _state(RATES, [[r, r]] * 2, z)
    row, = SPIDER.ledger(cfg, state).report(DELTA, ("rdp",))
    true = max(_epsilon(zi, [(p1, r), (p2, r)]) for zi, (p1, p2) in zip(z, RATES))
    assert row["epsilon"] == pytest.approx(true, rel=1e-6)
    assert 1.2 * target < row["epsilon"] < 1.7 * target        # ~1.4x: two full-budget series
    assert "accounting = reference" in row["notes"][0] and "TRUE epsilon" in row["notes"][0]
    assert SPIDER.artifacts(state, None, {"algorithm": {"accounting": "reference",
                                                        "target_epsilon": target}}) == {
        "accounting": "reference", "nominal_epsilon": target}


def test_composed_accounting_is_unchanged_and_meets_the_target():
    """The default composes every kind in one calibration (what ISRL_SPIDER always did): the
    same z as ``calibration.calibrate`` of all kinds, the ledger at most the target, no extra
    result fields; at q = 1 (refresh uploads only) both accountings give the same z."""
    target = 1.0
    cfg = SPIDER.Config(rounds=12, phase_length=2, target_epsilon=target, delta=DELTA)
    assert cfg.accounting == "composed"
    z = SPIDER.noise_multiplier(cfg, RATES)
    for zi, row in zip(z, RATES):
        assert zi == calibration.calibrate(target, DELTA, list(zip(row, (6, 6))))
        assert _epsilon(zi, list(zip(row, (6, 6)))) <= target
        assert _epsilon(zi * 0.98, list(zip(row, (6, 6)))) > target
    ref = SPIDER.noise_multiplier(dataclasses.replace(cfg, accounting="reference"), RATES)
    assert np.all(ref < z)                               # less noise than the correct sizing
    row, = SPIDER.ledger(cfg, _state(RATES, [[6, 6]] * 2, z)).report(DELTA, ("rdp",))
    assert 0.95 * target < row["epsilon"] <= target and "reference" not in row["notes"][0]
    assert SPIDER.artifacts(None, None, {"algorithm": {"target_epsilon": target}}) == {}
    q1 = dataclasses.replace(cfg, phase_length=1)
    np.testing.assert_array_equal(
        SPIDER.noise_multiplier(dataclasses.replace(q1, accounting="reference"), RATES[:1]),
        SPIDER.noise_multiplier(q1, RATES[:1]))


@pytest.mark.parametrize("kwargs, match", [
    (dict(accounting="authors"), "algorithm.accounting must be one of"),
    (dict(accounting="reference", noise_multiplier=1.0), "algorithm.noise_multiplier"),
])
def test_bad_accounting_is_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SPIDER.Config(**kwargs)
