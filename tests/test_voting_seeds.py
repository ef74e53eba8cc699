"""AE-DPFL and kNN-DPFL seeds stepped together (``batched_step``): runner.run_seeds equals
runner.run per seed (test accuracy, history, every epsilon incl. the data-dependent ones), the
seeds differ, and the cases that cannot share compiled calls fall back (None)."""
from pathlib import Path

import jax
import numpy as np
import pytest

from fedjax_dp.algorithms.voting import ae_dpfl, knn_dpfl, voting_dpfl
from fedjax_dp.privacy import vote as vote_lib
from fedjax_dp.algorithms import api
from fedjax_dp.algorithms import seeds as seed_driver
from fedjax_dp.experiments import config as config_lib
from fedjax_dp.experiments import runner

ROOT = Path(__file__).resolve().parents[1]
AE = ROOT / "configs" / "ae_dpfl" / "mnist5k.toml"
KNN = ROOT / "configs" / "knn_dpfl" / "mnist5k.toml"
COMMON = ["data.num_agents=10", "algorithm.num_queries=20", "algorithm.student_steps=5",
          "model.hidden=[8]", "run.progress=false", 'privacy.accountants=["rdp"]',
          "algorithm.agent_chunk=4",                     # 3 chunks, the last one padded
          "algorithm.data_dependent=true"]               # the data-dependent epsilons compared
AE_SETS = COMMON + ["train.steps=3", "algorithm.diagnostics=true"]   # the local metrics too
KNN_SETS = COMMON + ["algorithm.feature_dim=8"]


def _assert_same(joint: dict, alone: dict) -> None:
    assert joint["seed"] == alone["seed"]
    assert joint["test_accuracy"] == pytest.approx(alone["test_accuracy"], abs=1e-6)
    assert len(joint["history"]) == len(alone["history"])
    for a, b in zip(joint["history"], alone["history"]):
        assert a.keys() == b.keys()
        for k in a:
            if isinstance(b[k], str):
                assert a[k] == b[k], k
            else:
                assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-6), k
    key = [(g["unit"], g["accountant"]) for g in alone["privacy"]]
    assert [(g["unit"], g["accountant"]) for g in joint["privacy"]] == key
    assert [g["epsilon"] for g in joint["privacy"]] == pytest.approx(
        [g["epsilon"] for g in alone["privacy"]], rel=1e-9)


def _check(path, sets, data_dependent_units):
    base = config_lib.load(path, sets)
    configs = [dict(base, seed=s) for s in (0, 1)]
    together = runner.run_seeds(configs)
    assert together is not None and [r["vmapped_seeds"] for r in together] == [2, 2]
    for joint, cfg in zip(together, configs):
        _assert_same(joint, runner.run(cfg))
        units = {g["unit"] for g in joint["privacy"]}
        assert data_dependent_units <= units
    # different seeds: different queries, votes and data-dependent guarantees (seed axis kept)
    dd = [[g["epsilon"] for g in r["privacy"] if g["data_dependent"]] for r in together]
    assert together[0]["history"] != together[1]["history"] or dd[0] != dd[1]
    return together


def test_ae_dpfl_seeds_together_equal_separate_runs():
    _check(AE, AE_SETS + ["algorithm.abstain_below=0.4"],
           {"agent_data_dependent", "instance_data_dependent"})


def test_knn_dpfl_seeds_together_equal_separate_runs():
    _check(KNN, KNN_SETS + ["algorithm.student_semi_supervised=true",
                            "algorithm.student_self_training_rounds=1"],
           {"agent_data_dependent", "instance_data_dependent"})


def test_knn_dpfl_host_agents_and_aggregate_noise():
    """Host-resident agents (streamed chunks, stacked per seed) and the aggregate noise mode."""
    _check(KNN, KNN_SETS + ['run.agents_on="host"', 'algorithm.vote_noise="aggregate"',
                            'algorithm.feature_map="random_projection"'],
           {"agent_data_dependent"})


def test_secure_aggregation_is_not_vmapped():
    base = config_lib.load(KNN, KNN_SETS + ['algorithm.aggregation="secagg"'])
    assert runner.run_seeds([dict(base, seed=0), dict(base, seed=1)]) is None


def test_plan_shares_equal_agents_and_refuses_other_shapes():
    """The same agents for both seeds are shared (not stacked); other numbers of agents or a
    mesh give None."""
    base = config_lib.load(KNN, KNN_SETS)
    s0 = runner.setup(dict(base, seed=0))
    plan = runner.plan(base)
    runtime = api.Runtime(chunk_size=None)
    init = [knn_dpfl.init(k, s0.fed, s0.model, plan.algorithm_config, runtime)
            for k in (jax.random.key(0), jax.random.key(1))]
    p = voting_dpfl.seed_plan(init)
    assert p is not None and p.agents_axis is None
    small = runner.setup(dict(config_lib.load(KNN, KNN_SETS + ["data.num_agents=8"]), seed=1))
    other = knn_dpfl.init(jax.random.key(1), small.fed, small.model, plan.algorithm_config,
                          runtime)
    assert seed_driver.seed_batch(knn_dpfl, [init[0], other]) is None
    assert seed_driver.seed_batch(ae_dpfl, []) is None
    # shared agents: the batched vote still equals each seed's own step
    batch = seed_driver.seed_batch(knn_dpfl, init)
    joint, _ = batch(init, [None, None])
    for st, j in zip(init, joint):
        alone, _ = knn_dpfl.step(st)
        np.testing.assert_array_equal(j.values["labels"], alone.values["labels"])
        np.testing.assert_array_equal(j.values["clean_vote_sums"],
                                      alone.values["clean_vote_sums"])
    assert not np.array_equal(joint[0].values["labels"], joint[1].values["labels"])


def test_seeds_noise_is_independent():
    """Noise only (every agent abstains): the batched tally gives each seed exactly its own
    key's noise shares (bitwise), with the total std sigma, and the seeds' noise is
    uncorrelated (the seed axis carries distinct vote keys, never one broadcast key)."""
    import jax.numpy as jnp
    from fedjax_dp.core import rng
    keys = [rng.stream(rng.stream(rng.as_key(s), "algorithm"), "vote") for s in (0, 1, 2)]
    num, n, q, c = 3, 10, 1000, 10
    ballots = jnp.full((num, n, q), -1, jnp.int8)
    ids, valid, std = jnp.arange(n), jnp.ones(n, bool), jnp.float32(1 / np.sqrt(n))
    zero = vote_lib.tally_init(q, c)
    tally = jax.tree.map(lambda l: jnp.broadcast_to(l, (num,) + l.shape), zero)
    step = vote_lib.tally_step_fn(c, True, "per_agent", batched=True)
    out, _ = step(tally, jnp.stack(keys), ballots, ids, valid, std, 1.0, 1, False)
    noise = np.asarray(out.noise).reshape(num, -1)
    for s in range(num):
        alone = vote_lib.tally_add(zero, keys[s], ballots[s], ids, valid, std, num_classes=c,
                                      per_agent=True)
        np.testing.assert_array_equal(np.asarray(alone.noise).ravel(), noise[s])
        assert noise[s].std() == pytest.approx(1.0, abs=0.03)
    corr = np.corrcoef(noise)[np.triu_indices(num, 1)]
    assert np.all(np.abs(corr) < 0.05), corr           # 5 standard errors at 10,000 draws
