"""Shuffle-DP variants: the shuffled path (gathered and masked rounds) reproduces SPIDER's updates
on a fine grid (gradient and rescaled difference reports), the silo-side encoding is the shuffled
vector sum, and the ledger is the exact binomial PLD of the worst silo."""
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dp.algorithms import api, isrl
from fedjax_dp.algorithms.isrl import availability, engine, protocol, sdp, uploads
from fedjax_dp.core import StackedData
from fedjax_dp.privacy import shuffle, shuffle_accounting as sa

logging.getLogger("absl").setLevel(logging.ERROR)


def _quadratic(params, x, y):
    return 0.5 * jnp.sum((params["w"] - x) ** 2)


def test_sdp_spider_on_a_fine_grid_follows_the_exact_estimator():
    """z-free check of the SDP plumbing, M = 2 of N = 3 silos: grid step C / K = 6e-4 and one
    noise trial, so the shuffled sums are the exact sums up to rounding; SPIDER with
    beta_hat = 0.5 then follows the hand computation (refresh: v_r = w_r - mean of the available
    silos' records; otherwise v_r = v_{r-1} + 0.5 (w_r - w_{r-1}), differences rescaled by
    tau / C). The gathered round (default) follows it, and equals the masked reference round
    (same keys: the integer sums are identical)."""
    rng = np.random.default_rng(4)
    x = rng.normal(size=(3, 5, 6)).astype(np.float32)
    data = StackedData(x=jnp.asarray(x), y=jnp.zeros((3, 5)), mask=jnp.ones((3, 5), bool),
                       counts=jnp.full((3,), 5, jnp.int32))
    sdata = engine.silo_data(data, (5, 5))
    cfg = shuffle.ShuffleConfig(clip_norm=10.0, granularity=2 ** 14, noise_trials=1)
    spec = engine.RoundSpec(method="spider", num_silos=3, num_available=2, period=3,
                            smoothness=0.5, report_objective=False, shuffle=cfg)
    rounds = {c: engine.make_round(_quadratic, spec, cohort=c) for c in engine.COHORTS}
    lr, w = 0.3, np.zeros(6)
    values = {c: engine.initial_values(spec, {"w": jnp.zeros(6)}, engine.hyper(lr, 10.0, 0.0))
              for c in engine.COHORTS}
    v = w_prev = None
    for t in range(6):
        key = jax.random.key(t)
        for c in engine.COHORTS:
            values[c], _ = rounds[c](key, values[c], sdata)
        ids = np.asarray(availability.available_ids(jax.random.split(key, 3)[0], 3, 2))
        v = (w - x[ids].mean(axis=(0, 1))) if t % 3 == 0 else v + 0.5 * (w - w_prev)
        w_prev, w = w, w - lr * v
        np.testing.assert_allclose(np.asarray(values["gather"]["params"]["w"]), w, atol=3e-3)
        np.testing.assert_allclose(np.asarray(values["masked"]["params"]["w"]),
                                   np.asarray(values["gather"]["params"]["w"]), rtol=1e-5,
                                   atol=1e-6)
    counts = np.asarray(values["gather"]["uploads"])
    np.testing.assert_array_equal(counts, np.asarray(values["masked"]["uploads"]))
    assert counts.sum(axis=0).tolist() == [2 * 2, 4 * 2]     # (refresh, difference) x M


def test_reports_encoded_in_the_silo_are_the_shuffled_vector_sum():
    """A silo's encoded reports (:func:`uploads.encode_reports`, its own rounding key) plus the
    server's binomial noise and decoding == ``shuffle_vector_sum`` with those two keys, bit for
    bit; weights 0 (unsampled / padding) drop a report."""
    rng = np.random.default_rng(1)
    rows = jnp.asarray(rng.normal(size=(6, 9)) * 0.7, jnp.float32)
    w = jnp.asarray([1, 0, 1, 1, 0, 1], jnp.float32)
    cfg = shuffle.ShuffleConfig(clip_norm=1.0, granularity=8, noise_trials=50)
    key = jax.random.key(3)
    k_round, k_noise = jax.random.split(key)

    @jax.jit
    def both(rows, w):
        est = uploads.shuffled_estimate(k_noise, uploads.encode_reports(k_round, rows, w, cfg),
                                        cfg)
        return est, shuffle.shuffle_vector_sum(key, rows, w, cfg)

    est, ref = both(rows, w)
    np.testing.assert_array_equal(np.asarray(est), np.asarray(ref))


def _fake_state(algo, counts, rates, cfg, params):
    spec = engine.RoundSpec(method=algo.method, num_silos=len(counts), num_available=1,
                            shuffle=cfg)
    ctx = protocol.Context(data=None, model=None, spec=spec, round_fn=None, noise_multiplier=0.0,
                           rates=np.asarray(rates, np.float64))
    return api.State(step=0, values={"uploads": np.asarray(counts), "params": params},
                     context=ctx)


def test_sdp_ledger_is_the_binomial_pld_of_the_worst_silo():
    cfg = shuffle.ShuffleConfig(clip_norm=1.0, granularity=4, noise_trials=4000)
    params = {"a": np.zeros((3, 2)), "b": np.zeros(4)}                    # d = 10
    counts = [[3, 1], [2, 2], [1, 0]]                                      # releases 4, 4, 1
    rates = [[0.5, 0.25], [0.4, 0.4], [1.0, 1.0]]        # silo 1 dominated by silo 0
    algo = isrl.SDP_SPIDER
    conf = algo.Config(clip_norm=1.0, granularity=4, noise_trials=4000)
    row, = algo.ledger(conf, _fake_state(algo, counts, rates, cfg, params)).report(1e-5)
    assert row["unit"] == "shuffle" and row["accountant"] == "pld"
    assert row["relation"] == sa.RELATIONS["add_remove"]
    assert row["parallel"][0]["num_members"] == 2
    direct = max(sa.pld(sa.BinomialSumEvent(
        noise_trials=4000, sensitivity=4, dimension=10, count=c, sampling_probability=q)
    ).get_epsilon_for_delta(1e-5) for c, q in ((4, 0.5), (1, 1.0)))
    assert row["epsilon"] == pytest.approx(direct, rel=1e-9)
    assert row["events"][0]["dimension"] == 10


def test_sdp_calibrates_noise_trials_for_all_rounds(monkeypatch):
    """N is calibrated for d = all parameters and R releases (a silo available every round)."""
    seen = {}

    def fake(target, delta, **kw):
        seen.update(target=target, delta=delta, **kw)
        return 1234

    monkeypatch.setattr(isrl.sdp, "calibrate_noise_trials", fake)
    conf = isrl.SDP_MB_SGD.Config(rounds=3, target_epsilon=5.0, delta=1e-5, granularity=2)
    _, extra = isrl.SDP_MB_SGD.mechanism(conf, np.array([[0.5], [1.0]]),
                                         {"w": np.zeros(7), "b": np.zeros((2, 3))})
    assert seen == dict(target=5.0, delta=1e-5, granularity=2, dimension=13, releases=3,
                        sampling_probability=1.0, analysis="per_coordinate",
                        target_name="algorithm.target_epsilon")
    assert extra["shuffle"] == shuffle.ShuffleConfig(1.0, 2, 1234)


@pytest.mark.parametrize("kwargs, name", [
    (dict(granularity=0), "algorithm.granularity"),
    (dict(noise_trials=0), "algorithm.noise_trials"),
    (dict(target_epsilon=0.0), "algorithm.target_epsilon"), (dict(delta=1.5), "algorithm.delta"),
    (dict(phase_length=0), "algorithm.phase_length"),
    (dict(diff_batch_size=0), "algorithm.diff_batch_size"),
    (dict(smoothness=0.0), "algorithm.smoothness"),
    (dict(clip_norm=float("inf")), "algorithm.clip_norm")])
def test_sdp_bad_config(kwargs, name):
    with pytest.raises(ValueError, match=name):
        sdp.SpiderConfig(**kwargs)
