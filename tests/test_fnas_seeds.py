"""DP-FNAS seeds in one vmapped compiled call (``dp_fnas.batched_step``): equal to separate runs
in both phases (search and retraining), seeds with different genotypes retrain in groups, and
``fedjax-dp sweep --seeds`` records ``vmapped_seeds``.

Tiny shapes as in tests/test_fnas.py (4x4 images, 2 channels, 1 node, 1 cell).
"""
import jax
import numpy as np
import pytest

from fedjax_dp.algorithms import api
from fedjax_dp.algorithms import seeds as seed_driver
from fedjax_dp.algorithms.fnas import dp_fnas
from fedjax_dp.core import from_ragged
from fedjax_dp.experiments import cli, records, runner
from fedjax_dp.experiments import config as config_lib

CONFIG = "configs/fnas/digits_dp.toml"
SETS = ["data.num_agents=2", "data.image_size=4", "algorithm.nodes=1", "algorithm.channels=2",
        "algorithm.cells=1", 'algorithm.primitives=["none","skip_connect"]',
        "algorithm.stem_multiplier=1", "algorithm.search_epochs=2", "algorithm.batch_size=64",
        "algorithm.retrain_epochs=2", "algorithm.retrain_batch_size=128",
        'privacy.accountants=["rdp"]',
        "algorithm.diagnostics=true"]            # the epochs' metrics compared (an opt-in)


def _close(a: dict, b: dict) -> None:
    """Equal metrics apart from timings (``*_s``), to float tolerance."""
    assert a.keys() == b.keys()
    for k in a:
        if not k.endswith("_s"):
            assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-6), k


def test_run_seeds_equals_separate_runs_in_both_phases():
    base = config_lib.load(CONFIG, SETS + ["run.progress=false"])
    configs = [dict(base, seed=s) for s in (0, 1)]
    together = runner.run_seeds(configs)
    assert together is not None and [r["vmapped_seeds"] for r in together] == [2, 2]
    for joint, cfg in zip(together, configs):
        alone = runner.run(cfg)
        assert joint["seed"] == alone["seed"]
        assert joint["test_accuracy"] == pytest.approx(alone["test_accuracy"], abs=1e-6)
        assert joint["genotype"] == alone["genotype"]
        assert [r["phase"] for r in joint["history"]] == [0, 0, 1, 1]      # search, retrain
        assert len(joint["history"]) == len(alone["history"])
        for a, b in zip(joint["history"], alone["history"]):
            _close(a, b)
        assert [g["epsilon"] for g in joint["privacy"]] == pytest.approx(
            [g["epsilon"] for g in alone["privacy"]], rel=1e-9)
        assert joint["search_iterations"] == alone["search_iterations"]
    # different seeds: different runs (the seed axis is not broadcast)
    strip = [[{k: v for k, v in r.items() if not k.endswith("_s")} for r in rec["history"]]
             for rec in together]
    assert strip[0] != strip[1]


# --------------------------------------------------------------------------- the hook itself

SHAPE, CLASSES = (4, 4, 1), 3
PRIMS = ("none", "skip_connect", "avg_pool_3x3")
TINY = dp_fnas.Config(nodes=1, channels=2, cells=1, primitives=PRIMS, stem_multiplier=1,
                      search_epochs=1, batch_size=2, retrain_epochs=2, retrain_batch_size=2)


def _data(seed: int, n: int = 6) -> api.FederatedData:
    rng = np.random.default_rng(seed)
    xs = [rng.normal(size=(n,) + SHAPE).astype(np.float32) for _ in range(2)]
    ys = [rng.integers(0, CLASSES, n) for _ in range(2)]
    return api.FederatedData(agents=from_ragged(xs, ys), num_classes=CLASSES)


def _prefer(state: api.State, op: str) -> api.State:
    """``state`` with an alpha whose genotype takes ``op`` on every edge (both cell types)."""
    s = state.values["search"]
    j = PRIMS.index(op)
    alpha = {k: a.at[:, j].add(5.0) for k, a in s.alpha.items()}
    return api.State(step=state.step, values={**state.values, "search": s._replace(alpha=alpha)},
                     context=state.context)


def _leaves_close(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)


def test_seeds_with_different_genotypes_retrain_in_groups():
    """Three seeds with different data (stacked on the seed axis): one search epoch together,
    then genotypes forced apart (seeds 0 and 2: skip_connect, seed 1: avg_pool) so that
    retraining runs seeds 0 and 2 as one vmapped group (their rows of the stacked data) and seed
    1 on its own; every seed equals its own ``step``."""
    seeds = (0, 1, 2)
    keys = [jax.random.key(10 + s) for s in seeds]
    data = [_data(s) for s in seeds]

    def inits():
        return [dp_fnas.init(k, d, None, TINY) for k, d in zip(keys, data)]

    joint, alone = inits(), inits()
    batch = seed_driver.seed_batch(dp_fnas, joint)
    assert batch is not None
    ops = ("skip_connect", "avg_pool_3x3", "skip_connect")
    for t in range(dp_fnas.num_steps(TINY)):
        step_keys = [api.step_key(k, t) for k in keys]
        joint, got = batch(joint, step_keys)
        singles = [dp_fnas.step(s, k) for s, k in zip(alone, step_keys)]
        alone = [s for s, _ in singles]
        for s in range(len(seeds)):
            _close(got[s], singles[s][1])
            _leaves_close(joint[s].values, alone[s].values)
            assert joint[s].step == alone[s].step == t + 1
        if t + 1 == TINY.search_steps:                 # force the genotypes apart
            joint = [_prefer(s, op) for s, op in zip(joint, ops)]
            alone = [_prefer(s, op) for s, op in zip(alone, ops)]
    genos = [s.context.retrain["genotype"] for s in joint]
    assert genos[0] == genos[2] != genos[1]
    assert [s.context.retrain["genotype"] for s in alone] == genos
    for a, b in zip(joint, alone):
        _leaves_close(dp_fnas.output(a).params, dp_fnas.output(b).params)
    # the seeds' runs differ (per-seed data and keys, not one broadcast run)
    w0, w2 = (jax.tree.leaves(dp_fnas.output(joint[s]).params) for s in (0, 2))
    assert any(not np.allclose(np.asarray(x), np.asarray(y)) for x, y in zip(w0, w2))


def test_batch_plan_declines_what_cannot_share_a_call():
    key = jax.random.key(0)
    same = [dp_fnas.init(key, _data(0), None, TINY) for _ in range(2)]
    assert dp_fnas.batch_plan(same) is not None
    other_shape = [dp_fnas.init(key, _data(0), None, TINY),
                   dp_fnas.init(key, _data(1, n=10), None, TINY)]
    assert dp_fnas.batch_plan(other_shape) is None
    loop = api.Runtime(backend="loop")
    assert dp_fnas.batch_plan([dp_fnas.init(key, _data(s), None, TINY, loop)
                               for s in range(2)]) is None
    with pytest.raises(ValueError, match="states its plan was made for"):
        dp_fnas.batched_step(dp_fnas.batch_plan(same), same[::-1], [key, key])


def test_sweep_vmaps_the_seeds(tmp_path):
    out = tmp_path / "sw"
    argv = ["sweep", CONFIG, *[a for s in SETS for a in ("--set", s)], "--seeds", "2",
            "--out", str(out), "--quiet"]
    assert cli.main(argv) == 0
    recs = records.read([out / "results.jsonl"])
    assert sorted(r["seed"] for r in recs) == [0, 1]
    assert all(r["vmapped_seeds"] == 2 for r in recs)
    # the algorithm's artifacts travel with each record: the genotype each seed retrained
    for r in recs:
        assert set(r["extras"]["genotype"]) >= {"normal", "reduce"}
        assert r["extras"]["search_iterations"] > 0
