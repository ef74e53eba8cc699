"""FedKT seeds in one compiled call per chunk (``fedkt.batched_step`` = the phases of
:mod:`fedjax_dp.algorithms.fedkt.phases` over S seeds; a single run is S = 1): runner.run_seeds
equals runner.run per seed (test accuracy, history, every epsilon); the protocol's batched steps
equal separate runs array by array (L2 with seed-dependent party queries, streamed padded
chunks of memory-mapped parties at different ``n_max``, kept models); tree learners and reused
models are not batched."""
import dataclasses

import jax
import numpy as np
import pytest

from fedjax_dp import data
from fedjax_dp.algorithms import api
from fedjax_dp.algorithms import seeds as seed_driver
from fedjax_dp.algorithms.fedkt import fedkt, learners, phases
from fedjax_dp.core import from_ragged, load_stacked, save_stacked
from fedjax_dp.experiments import config as config_lib
from fedjax_dp.experiments import runner
from fedjax_dp.models import make_model
from fedjax_dp.train import LocalTrainConfig

DIGITS = "configs/fedkt/digits.toml"
DIGITS_SETS = ["train.steps=5", "algorithm.student_steps=5", "algorithm.final_steps=5",
               "model.name=\"logistic\"", "data.num_agents=3", "privacy.accountants=[\"rdp\"]",
               "run.progress=false", "algorithm.data_dependent=true"]   # dd rows and z compared


def _same_record(joint, alone):
    assert joint["seed"] == alone["seed"] and joint["vmapped_seeds"] == 2
    assert joint["test_accuracy"] == pytest.approx(alone["test_accuracy"], abs=1e-9)
    assert len(joint["history"]) == len(alone["history"]) == len(fedkt.PHASES)
    for a, b in zip(joint["history"], alone["history"]):
        assert a.keys() == b.keys()
        for k in a:
            if not k.endswith("_s"):                   # timings are the batch's
                assert a[k] == (pytest.approx(b[k], rel=1e-9) if isinstance(b[k], float)
                                else b[k]), k
    assert [(g["unit"], g["accountant"], g["data_dependent"]) for g in joint["privacy"]] == \
        [(g["unit"], g["accountant"], g["data_dependent"]) for g in alone["privacy"]]
    assert [g["epsilon"] for g in joint["privacy"]] == pytest.approx(
        [g["epsilon"] for g in alone["privacy"]], rel=1e-9)


@pytest.mark.parametrize("level", ["L1"])
def test_run_seeds_equals_separate_runs(level):
    base = config_lib.load(DIGITS, DIGITS_SETS + [f"algorithm.level=\"{level}\""])
    configs = [dict(base, seed=s) for s in (0, 1)]
    together = runner.run_seeds(configs)
    assert together is not None
    for joint, cfg in zip(together, configs):
        _same_record(joint, runner.run(cfg))
    if level != "L0":
        assert len(together[0]["privacy"]) == 4           # party / example x dd / di (rdp)
    # the seeds are not broadcast: different partitions, queries and models
    assert together[0]["history"][-1] != together[1]["history"][-1]


# ----------------------------------------------------------------------------- protocol level

C = 3
TRAIN = LocalTrainConfig(steps=6, batch_size=8, learning_rate=1e-2, optimizer="adam")
FIELDS = ("teacher_votes", "z", "party_labels", "student_preds", "server_votes",
          "server_labels", "server_mask")


@pytest.fixture(scope="module")
def tiny():
    ds = data.synthetic(num_train=120, num_public=30, num_test=30, num_features=16,
                        num_classes=C, seed=0)
    parties = []
    for seed in (0, 1):                       # the seed's partition: different parties, n_max
        idx = data.partition("dirichlet", ds.y_train, 3, seed, beta=1.0, min_size=12)
        parties.append(from_ragged([ds.x_train[i] for i in idx], [ds.y_train[i] for i in idx]))
    assert parties[0].max_size != parties[1].max_size
    # chunks of 4 models (18 teachers: 4 chunks and a remainder of 2): a seed's models must be
    # trained by the compiled body of its separate run's chunks (chunked and unchunked vmaps
    # differ in the last bits)
    mlp = learners.JaxLearner(make_model("mlp", (16,), C, hidden=(8,)), TRAIN, chunk_size=4)
    return ds, parties, mlp


def _data(ds, parties):
    return api.FederatedData(agents=parties, num_classes=C, x_public=ds.x_public,
                             y_public=ds.y_public)


def _states(tiny, cfg, parties=None, **kw):
    ds, default, mlp = tiny
    keys = [jax.random.key(10), jax.random.key(11)]
    fed = [_data(ds, p) for p in (parties or default)]
    return keys, fed, [fedkt.init(k, d, mlp.model, cfg, teacher=mlp, student=mlp, final=mlp, **kw)
                       for k, d in zip(keys, fed)]


def _run_both(tiny, cfg, parties=None):
    keys, fed, states = _states(tiny, cfg, parties)
    batch = seed_driver.seed_batch(fedkt, states)
    assert batch is not None
    histories = [[], []]
    for t in range(len(fedkt.PHASES)):
        states, metrics = batch(states, [api.step_key(k, t) for k in keys])
        for h, m in zip(histories, metrics):
            h.append(m)
    alone = []
    for k, d, st in zip(keys, fed, _states(tiny, cfg, parties)[2]):
        done = api.run(fedkt, k, d, tiny[2].model, cfg, state=st)
        alone.append((done.state, [{k: v for k, v in r.items() if k != "round"}
                                   for r in done.history]))
    return states, histories, alone


def _assert_equal_runs(states, histories, alone, kept, exact=True):
    for st, hist, (ref, ref_hist) in zip(states, histories, alone):
        assert st.step == ref.step == len(fedkt.PHASES)
        for f in FIELDS:
            np.testing.assert_array_equal(st.values[f], ref.values[f], err_msg=f)
            assert st.values[f].dtype == ref.values[f].dtype, f
        for name in kept:          # "map": each seed runs its separate run's compiled body
            for a, b in zip(jax.tree.leaves(st.values[name]), jax.tree.leaves(ref.values[name])):
                if exact:
                    np.testing.assert_array_equal(a, b, err_msg=name)
                else:
                    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=name)
        for m, r in zip(hist, ref_hist):
            assert m.keys() == r.keys()
            assert {k: v for k, v in m.items() if not k.endswith("_s")} == \
                {k: v for k, v in r.items() if not k.endswith("_s")}
        x = np.asarray(fedkt.output(st).predict_labels(np.zeros((2, 16), np.float32)))
        np.testing.assert_array_equal(x, fedkt.output(ref).predict_labels(
            np.zeros((2, 16), np.float32)))
        for a, b in zip(api.ledgers(fedkt, st.context.config, st),
                        api.ledgers(fedkt, ref.context.config, ref)):
            assert [r["epsilon"] for r in a.report(1e-5, ("rdp",))] == pytest.approx(
                [r["epsilon"] for r in b.report(1e-5, ("rdp",))], rel=1e-12)
    # different seeds, different runs
    assert not np.array_equal(states[0].values["teacher_votes"],
                              states[1].values["teacher_votes"])


@pytest.mark.parametrize("seed_axis", ["map"])   # "vmap": the learner test below (suite time)
def test_l2_seed_dependent_queries_kept_models_equal_separate_runs(tiny, seed_axis, monkeypatch):
    # L2 with a query fraction: each seed's parties label their own public subset (stacked on
    # the seed axis); one chunk of device parties: teachers and students are kept. "map" (the
    # CPU's default): bit for bit; "vmap" (accelerators): the models to float tolerance
    monkeypatch.setattr(learners, "SEED_AXIS", seed_axis)
    cfg = fedkt.Config(num_partitions=2, num_teachers=3, level="L2", gamma=0.5,
                       query_fraction=0.5, local=TRAIN)
    states, histories, alone = _run_both(tiny, cfg)
    assert not np.array_equal(states[0].context.party_queries, states[1].context.party_queries)
    _assert_equal_runs(states, histories, alone, kept=("teachers", "students", "final"),
                       exact=seed_axis == "map")


def test_l1_streamed_host_parties_equal_separate_runs(tiny, tmp_path):
    # L1 (the server's queries differ by seed); memory-mapped parties in chunks of 2 of 3 (the
    # last one padded), each seed at its own n_max
    mapped = []
    for i, p in enumerate(tiny[1]):
        save_stacked(tmp_path / f"p{i}", p)
        mapped.append(load_stacked(tmp_path / f"p{i}", mmap=True))
    cfg = fedkt.Config(num_partitions=2, num_teachers=3, level="L1", gamma=0.5,
                       query_fraction=0.5, party_chunk=2, local=TRAIN)
    states, histories, alone = _run_both(tiny, cfg, mapped)
    assert "teachers" not in states[0].values and "students" not in states[0].values
    _assert_equal_runs(states, histories, alone, kept=("final",))


def test_not_batched_returns_none(tiny):
    # tree learners are fitted in a host loop (not JAX): the runner runs the seeds one by one
    base = config_lib.load("configs/fedkt/wbcd.toml", ["privacy.accountants=[\"rdp\"]"])
    assert runner.run_seeds([dict(base, seed=0), dict(base, seed=1)]) is None
    cfg = fedkt.Config(num_partitions=2, num_teachers=3, level="L0", local=TRAIN)
    ds, parties, mlp = tiny
    trees = learners.SklearnLearner("decision_tree", C, max_depth=3)
    states = [fedkt.init(jax.random.key(s), _data(ds, p), mlp.model, cfg, teacher=trees,
                         student=mlp, final=mlp) for s, p in zip((0, 1), parties)]
    assert "not a JAX model" in phases.unsupported(states)
    assert seed_driver.seed_batch(fedkt, states) is None
    # reused fitted teachers; the reference loop backend; seeds with different configs
    _, _, states = _states(tiny, cfg, fitted_teachers=object())
    assert seed_driver.seed_batch(fedkt, states) is None
    loop = dataclasses.replace(mlp, backend="loop")
    states = [fedkt.init(jax.random.key(s), _data(ds, p), mlp.model, cfg, teacher=loop,
                         student=mlp, final=mlp) for s, p in zip((0, 1), parties)]
    assert seed_driver.seed_batch(fedkt, states) is None
    _, _, states = _states(tiny, cfg)
    other = fedkt.init(jax.random.key(2), _data(ds, parties[1]), mlp.model,
                       dataclasses.replace(cfg, num_teachers=2), teacher=mlp, student=mlp,
                       final=mlp)
    assert phases.unsupported([states[0], other]) == "the seeds' configs differ"


# (4, "map") under -m sweep (suite time): the "map" seed mode is checked bit for bit through
# whole runs by the L2 test above
@pytest.mark.parametrize("chunk, seed_axis", [(None, "vmap"),
                                              pytest.param(4, "map", marks=pytest.mark.sweep),
                                              pytest.param(4, "vmap", marks=pytest.mark.sweep)])
def test_learner_seed_methods_equal_one_call_per_seed(chunk, seed_axis):
    # S = 2 seeds x A = 10 models, in chunks of 4 (two and a remainder of 2) or unchunked: a
    # loop over the seeds in one call ("map", the CPU's default) equals a call per seed bit for
    # bit; a vmap over the seeds (accelerators) changes the rounding on the CPU (not the result
    # beyond float tolerance)
    from fedjax_dp.core import StackedData
    rng = np.random.default_rng(0)
    model = make_model("mlp", (16,), 10, hidden=(16,))
    lrn = learners.JaxLearner(model, LocalTrainConfig(steps=4, batch_size=8,
                                                      learning_rate=1e-2, optimizer="adam"),
                              chunk_size=chunk)
    num, a, m, q = 2, 10, 20, 12
    data = StackedData(x=rng.normal(size=(num, a, m, 16)).astype(np.float32),
                       y=rng.integers(0, 10, (num, a, m)).astype(np.int32),
                       mask=np.ones((num, a, m), bool), counts=np.full((num, a), m, np.int32))
    ik, tk = (jax.random.split(jax.random.key(i), (num, a)) for i in (0, 1))
    xs = rng.normal(size=(num, q, 16)).astype(np.float32)
    ys = rng.integers(0, 10, (num, a, q)).astype(np.int32)
    ms = rng.random((num, a, q)) < 0.8
    kw = {"seed_axis": seed_axis}
    joint = lrn.fit_keyed_seeds(ik, tk, data, **kw)
    shared = lrn.fit_shared_keyed_seeds(ik, tk, xs[0], ys, ms, **kw)
    own = lrn.fit_shared_keyed_seeds(ik, tk, xs, ys, ms, x_axis=0, **kw)
    same = (np.testing.assert_array_equal if seed_axis == "map" else
            lambda u, v: np.testing.assert_allclose(u, v, rtol=1e-4, atol=1e-5))
    for s in range(num):
        alone = lrn.fit_keyed(ik[s], tk[s], jax.tree.map(lambda l: l[s], data))
        for p, r in ((joint, alone), (shared, lrn.fit_shared_keyed(ik[s], tk[s], xs[0], ys[s],
                                                                     ms[s])),
                     (own, lrn.fit_shared_keyed(ik[s], tk[s], xs[s], ys[s], ms[s]))):
            for u, v in zip(jax.tree.leaves(p), jax.tree.leaves(r)):
                same(u[s], v)
        one = jax.tree.map(lambda l: l[s], own)
        np.testing.assert_array_equal(lrn.predict_seeds(own, xs[0], **kw)[s],
                                      lrn.predict(one, xs[0]))
        np.testing.assert_array_equal(lrn.predict_seeds(own, xs, x_axis=0, **kw)[s],
                                      lrn.predict(one, xs[s]))
    assert not np.array_equal(jax.tree.leaves(joint)[0][0], jax.tree.leaves(joint)[0][1])
    with pytest.raises(ValueError, match="seed_axis"):
        lrn.predict_seeds(own, xs[0], seed_axis="scan")
