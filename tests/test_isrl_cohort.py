"""ISRL rounds cost the cohort: the gathered round (the M available silos' rows gathered into an
[M, ...] buffer, the default) equals the masked all-silo reference round for every member (same
key; float tolerance; upload counts and ledgers identical), does not depend on the unavailable
silos, and computes about M/N of the masked round's flops. Elsewhere: chunked gathered == plain
gathered (``test_isrl_algorithms.test_chunked_round_equals_plain``, which runs the default
gathered round), the SDP rounds gathered == masked (``test_isrl_sdp``), 8-device sharding of
both (``tests/isrl_sharded_check.py``)."""
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dp.algorithms import api, isrl
from fedjax_dp.algorithms.isrl import availability, engine
from fedjax_dp.core import StackedData
from isrl_fixtures import FED, MODEL, config, run_case

logging.getLogger("absl").setLevel(logging.ERROR)


def test_available_ids_are_the_m_smallest_scores():
    """ids (ascending) = the silos whose uniform score ranks below M; the mask marks them."""
    n, m = 7, 3
    np.testing.assert_array_equal(np.asarray(availability.available_ids(jax.random.key(0), 5, 5)),
                                  np.arange(5))
    for seed in range(3):
        key = jax.random.key(seed)
        ids = np.asarray(availability.available_ids(key, n, m))
        scores = np.asarray(jax.random.uniform(key, (n,)))
        expect = np.sort(np.argsort(scores, kind="stable")[:m])
        np.testing.assert_array_equal(ids, expect)
        mask = np.asarray(availability.available_mask(key, n, m))
        assert mask.sum() == m and np.all(mask[ids] == 1.0)


#: one member per round kind: MB-SGD (gradient uploads), SPIDER (refresh + difference),
#: Prox-PL-SVRG (snapshot + difference + restart draw), Local SGD (K local steps). The SDP rounds
#: (SDP SPIDER: shuffled gradient reports on refresh rounds -- SDP MB-SGD's round -- and shuffled
#: difference reports) are checked gathered == masked in
#: ``test_isrl_sdp.test_sdp_spider_on_a_fine_grid_follows_the_exact_estimator``. The non-private
#: members are the same rounds without clip and noise.
MEMBERS = ["isrl_mb_sgd", "isrl_spider", "isrl_prox_pl_svrg", "isrl_local_sgd"]


@pytest.mark.parametrize("name", MEMBERS)
def test_gathered_round_equals_masked_round(name):
    """Same seed: parameters, estimator state, per-round metrics equal up to float order; upload
    counts (all the ledger reads besides the public rates and z) and the ledger identical."""
    gathered, masked = run_case(name), run_case(name, cohort="masked")
    g_vals, m_vals = gathered.state.values, masked.state.values
    np.testing.assert_array_equal(np.asarray(g_vals["uploads"]), np.asarray(m_vals["uploads"]))
    assert int(np.asarray(g_vals["uploads"]).sum()) > 0
    for a, b in zip(jax.tree.leaves(g_vals), jax.tree.leaves(m_vals)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-6)
    for ra, rb in zip(gathered.history, masked.history):
        assert ra.keys() == rb.keys()
        for k in ra:
            np.testing.assert_allclose(ra[k], rb[k], rtol=2e-5, atol=2e-6, err_msg=k)
    algo, cfg = isrl.ALGORITHMS[name], config(name)
    if algo.private:
        assert (algo.ledger(cfg, gathered.state).report(1e-5, ("rdp",))
                == algo.ledger(cfg, masked.state).report(1e-5, ("rdp",)))


def test_round_state_ignores_the_unavailable_silos():
    """Records of the silo not available in round 0 set to NaN (the silo ids are those of
    ``available_ids`` of the round's availability key): the new state of the gathered round, and
    of the masked round, is unchanged bit for bit (the objective diagnostic, which reads every
    silo, is a metric, not state). That the gathered round does not even compute the unavailable
    silos is the flop count below."""
    name = "isrl_spider"
    key = api.step_key(jax.random.key(0), 0)
    ids = np.asarray(availability.available_ids(jax.random.split(key, 3)[0], 4, 3))
    away = np.setdiff1d(np.arange(4), ids)
    assert away.size == 1
    for cohort in engine.COHORTS:
        state = isrl.ALGORITHMS[name].init(jax.random.key(0), FED, MODEL, config(name),
                                           api.Runtime(chunk_size=None, cohort=cohort))
        ctx = state.context
        x = np.asarray(ctx.data.agents.x).copy()
        x[away] = np.nan
        poisoned = engine.SiloData(agents=StackedData(
            x=jnp.asarray(x), y=ctx.data.agents.y, mask=ctx.data.agents.mask,
            counts=ctx.data.agents.counts), rates=ctx.data.rates,
            denominators=ctx.data.denominators)
        clean, _ = ctx.round_fn(key, state.values, ctx.data)
        dirty, _ = ctx.round_fn(key, state.values, poisoned)
        for a, b in zip(jax.tree.leaves(clean), jax.tree.leaves(dirty)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=cohort)


def test_gathered_round_does_about_m_over_n_of_the_work():
    """XLA's cost analysis of one MB-SGD round (no objective diagnostic), N = 64 silos: the
    gathered round with M = 4 needs a small fraction of the masked round's flops."""
    n, m = 64, 4
    rng = np.random.default_rng(0)
    data = StackedData(x=jnp.asarray(rng.normal(size=(n, 8, 5)), jnp.float32),
                       y=jnp.zeros((n, 8), jnp.int32), mask=jnp.ones((n, 8), bool),
                       counts=jnp.full((n,), 8, jnp.int32))
    sdata = engine.silo_data(data, (4,))
    model = MODEL
    params = model.init(jax.random.key(0))
    spec = engine.RoundSpec(method="mb_sgd", num_silos=n, num_available=m,
                            report_objective=False)
    values = engine.initial_values(spec, params, engine.hyper(0.1, 1.0, 1.0))
    flops = {}
    for cohort in engine.COHORTS:
        fn = engine.make_round(engine.loss_for(model), spec, cohort=cohort)
        cost = fn.lower(jax.random.key(1), values, sdata).cost_analysis()
        cost = cost[0] if isinstance(cost, (list, tuple)) else cost
        flops[cohort] = float(cost["flops"])
    assert 0 < flops["gather"] < 4 * (m / n) * flops["masked"], flops


def test_bad_cohort_names_the_parameter():
    with pytest.raises(ValueError, match="runtime.cohort"):
        engine.make_round(engine.loss_for(MODEL), engine.RoundSpec("mb_sgd", 4, 2),
                          cohort="all")
    with pytest.raises(ValueError, match="runtime.cohort"):
        api.Runtime(cohort="all")
