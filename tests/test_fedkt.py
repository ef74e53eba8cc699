"""FedKT (Algorithm 1): parties streamed in chunks (chunked == unchunked, memory-mapped host ==
device, at L1 and L2), teacher splits, one-call training vs a loop, consistent voting vs a loop
for every model type, noise independence, L1/L2 accounting vs independent computation,
reproducibility, errors, configs end to end, tree learners, baselines."""
import dataclasses
from pathlib import Path
from types import SimpleNamespace

import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dp import data
from fedjax_dp.algorithms import api
from fedjax_dp.algorithms.fedkt import baselines as fedkt_baselines
from fedjax_dp.algorithms.fedkt import fedkt, files, learners, partition, phases, privacy, votes
from fedjax_dp.algorithms.fedkt import solo
from fedjax_dp.core import from_ragged, rng
from fedjax_dp.core import progress as progress_lib
from fedjax_dp.experiments import config as config_lib
from fedjax_dp.experiments import runner
from fedjax_dp.models import make_model
from fedjax_dp.privacy import lnmax
from fedjax_dp.train import LocalTrainConfig

ROOT = Path(__file__).resolve().parents[1]
C = 3
TRAIN = LocalTrainConfig(steps=12, batch_size=8, learning_rate=1e-2, optimizer="adam")


@pytest.fixture(scope="module")
def setup():
    ds = data.synthetic(num_train=120, num_public=30, num_test=30, num_features=16,
                        num_classes=C, seed=0)
    idx = data.partition("dirichlet", ds.y_train, 3, 0, beta=1.0, min_size=12)
    xs = [ds.x_train[i] for i in idx]
    ys = [ds.y_train[i] for i in idx]
    flat = from_ragged(xs, ys)
    img = from_ragged([x.reshape(-1, 4, 4, 1) for x in xs], ys)
    lrn = {name: learners.JaxLearner(make_model(name, (16,), C, hidden=(8,)), TRAIN,
                                     chunk_size=None)
           for name in ("logistic", "mlp")}
    # CNN students (their consistent vote is what is tested); logistic teachers / final model on
    # the same 4x4x1 images keep the CNN to one compiled training function (XLA compiles a
    # vmapped CNN backward pass slowly on the CPU)
    lrn["cnn"] = learners.JaxLearner(make_model("cnn", (4, 4, 1), C),
                                     dataclasses.replace(TRAIN, steps=3), chunk_size=None)
    lrn["img_logistic"] = learners.JaxLearner(make_model("logistic", (4, 4, 1), C), TRAIN,
                                              chunk_size=None)
    lrn["trees"] = learners.SklearnLearner("decision_tree", C, max_depth=3)
    lrn["forest"] = learners.SklearnLearner("random_forest", C, max_depth=3, n_estimators=5)
    return dict(ds=ds, flat=flat, img=img, lrn=lrn)


def run_fedkt(key, parties, xp, cfg, *, teacher, student, final, **kw):
    """A FedKT run through api.run, its state's values as attributes (the tests' view)."""
    d = api.FederatedData(agents=parties, num_classes=C, x_public=xp)
    model = next((lr.model for lr in (final, teacher, student) if learners.is_jax(lr)),
                 make_model("logistic", parties.feature_shape, C))
    state = fedkt.init(key, d, model, cfg, teacher=teacher, student=student, final=final, **kw)
    st = api.run(fedkt, key, d, model, cfg, state=state).state
    kept = {n: fedkt.fitted(st, n) if n in st.values or not learners.is_jax(
        st.context.learners[n]) else None for n in ("teachers", "students", "final")}
    out = fedkt.output(st)
    return SimpleNamespace(
        state=st, config=cfg, party_queries=st.context.party_queries,
        server_queries=st.context.server_queries, **kept,
        **{f: st.values[f] for f in ("teacher_votes", "z", "party_labels", "student_preds",
                                     "server_votes", "server_labels", "server_mask")},
        accuracy=lambda x, y: float(np.mean(out.predict_labels(x) == np.asarray(y))))

_RUNS = {}


def run_small(setup, level="L0", model="mlp", seed=0, **kw):
    """A tiny FedKT run (memoised per argument set so tests share runs and compilations)."""
    memo = (level, model, seed, tuple(sorted(kw.items())))
    if memo in _RUNS:
        return _RUNS[memo]
    _RUNS[memo] = _run_small(setup, level, model, seed, **kw)
    return _RUNS[memo]


def _run_small(setup, level, model, seed, **kw):
    # data_dependent: the tests read the data-dependent ledger too (an opt-in)
    cfg = fedkt.Config(num_partitions=2, num_teachers=3, level=level, local=TRAIN,
                       **{"gamma": 0.5, "query_fraction": 0.5, "data_dependent": True, **kw})
    if model == "cnn":
        parties, xp = setup["img"], setup["ds"].x_public.reshape(-1, 4, 4, 1)
        t, s, f = setup["lrn"]["img_logistic"], setup["lrn"]["cnn"], setup["lrn"]["img_logistic"]
    elif model == "trees":
        parties, xp = setup["flat"], setup["ds"].x_public
        t, s = setup["lrn"]["trees"], setup["lrn"]["forest"]
        f = s
    else:
        parties, xp = setup["flat"], setup["ds"].x_public
        t = s = f = setup["lrn"][model]
    return run_fedkt(jax.random.key(seed), parties, xp, cfg, teacher=t, student=s,
                     final=f), parties, xp, t, s

# ----------------------------------------------------------------------------- streaming


@pytest.fixture(scope="module")
def mapped(setup, tmp_path_factory):
    """The parties of ``setup`` as a memory-mapped host population (load_stacked)."""
    from fedjax_dp.core import load_stacked, save_stacked
    path = tmp_path_factory.mktemp("fedkt_parties") / "parties"
    save_stacked(path, setup["flat"])
    parties = load_stacked(path, mmap=True)
    assert isinstance(parties.x, np.memmap)
    return parties

_STREAMED = {}


def run_streamed(setup, mapped, level, where, chunk):
    """The reference run of ``level`` again with ``party_chunk=chunk`` on host (memory-mapped)
    or device parties, through api.run with a progress recorder (memoised; chunks of 2 of the
    3 parties: 2 and a padded 1)."""
    memo = (level, where, chunk)
    if memo not in _STREAMED:
        ref = _stream_ref(setup, level)[0]
        t = setup["lrn"]["mlp"]
        parties = {"host": mapped, "device": setup["flat"]}[where]
        cfg = dataclasses.replace(ref.config, party_chunk=chunk)
        d = api.FederatedData(agents=parties, num_classes=C, x_public=setup["ds"].x_public)
        rec = progress_lib.RecordingProgress()
        runtime = api.Runtime(progress=rec)
        state = fedkt.init(jax.random.key(0), d, t.model, cfg, runtime, teacher=t, student=t,
                           final=t)
        done = api.run(fedkt, jax.random.key(0), d, t.model, cfg, runtime=runtime, state=state)
        _STREAMED[memo] = (done.state, rec)
    return _STREAMED[memo]


def _stream_ref(setup, level):
    """The unchunked device-resident reference: run_small's L1 run (shared with the accounting
    tests); at L2 every public point queried, so that every shape but the noise's is one the
    L1 and L0 runs compiled already."""
    if level == "L1":
        return run_small(setup, "L1", "mlp")
    return run_small(setup, "L2", "mlp", query_fraction=1.0)

STREAM_FIELDS = ("teacher_votes", "z", "party_labels", "student_preds", "server_votes",
                 "server_labels", "server_mask")


@pytest.mark.parametrize("level", ["L1", "L2"])
# ("host", None) under -m sweep (suite time): host parties in one chunk; ("host", 2) streams them
@pytest.mark.parametrize("where,chunk", [("host", 2), ("device", 2),
                                         pytest.param("host", None, marks=pytest.mark.sweep)])
def test_streamed_runs_equal_the_unchunked_device_run(setup, mapped, level, where, chunk):
    """Same key: the same teacher votes, party labels (the L2 noise keyed by the global party
    index), student predictions, server votes and labels, ledgers and final model whatever the
    chunk size (2: a full chunk and a padded one) and wherever the parties live (a memory map)."""
    ref = _stream_ref(setup, level)[0].state                       # device, one chunk of all 3
    got, _ = run_streamed(setup, mapped, level, where, chunk)
    for field in STREAM_FIELDS:
        np.testing.assert_array_equal(got.values[field], ref.values[field], err_msg=field)
    for a, b in zip(fedkt.ledger(ref.context.config, ref), fedkt.ledger(got.context.config, got)):
        assert a.to_json() == b.to_json() and len(a) > 0
        for unit in ("party", "example"):
            assert a.epsilon(unit, 1e-5) == b.epsilon(unit, 1e-5)
    jax.tree.map(np.testing.assert_array_equal, fedkt.fitted(got, "final"),
                 fedkt.fitted(ref, "final"))
    x, y = setup["ds"].x_test, setup["ds"].y_test
    assert np.mean(fedkt.output(got).predict_labels(x) == y) == \
        np.mean(fedkt.output(ref).predict_labels(x) == y)
    assert got.values["teacher_votes"].dtype == np.int8              # compact counts (<= t)
    # a streamed run keeps the votes and predictions, not the teachers' / students' parameters
    assert fedkt.streamed(got) and not fedkt.streamed(ref)
    for name in ("teachers", "students"):
        with pytest.raises(ValueError, match="not kept"):
            fedkt.fitted(got, name)


def test_stored_predictions_match_the_kept_students(setup):
    """student_preds (what the final phase reads instead of the students) are the kept
    students' classes on the server queries, one student at a time."""
    res, parties, xp, t, s = run_small(setup, "L1", "mlp")
    xs = xp[res.server_queries]
    for a in range(parties.num_agents * 2):
        want = np.asarray(s.predict(s.take(res.students, a), xs))[0]
        np.testing.assert_array_equal(res.student_preds[a // 2, a % 2], want)


def test_progress_is_reported_per_chunk(setup, mapped):
    _, rec = run_streamed(setup, mapped, "L1", "host", 2)
    assert [(t["name"], t["total"], t["unit"], t["done"]) for t in rec.tasks] == [
        ("teachers", 2, "chunk", 2), ("students", 2, "chunk", 2),     # ceil(3 / 2)
        ("server vote", 2, "chunk", 2), ("final model", 1, "model", 1)]


def test_chunked_server_vote_matches_loop():
    preds = np.array(jax.random.randint(jax.random.key(0), (5, 3, 40), 0, 3), np.int8)
    preds[0, :, :10] = 1                                                   # some agreement
    want = loop_consistent_vote(preds, 3)
    for size in (2, 5):                                     # chunks 2, 2, padded 1; one chunk
        np.testing.assert_array_equal(phases.server_votes(preds[None], 3, size)[0], want)


def test_per_model_keys_slice_like_the_whole_run(setup):
    """fit_keyed on a slice of model_keys trains the same models as fit on all: the teacher of
    global index a gets the same keys in every chunk (shapes of the runs above: 18 and 12)."""
    td = partition.teacher_data(jax.random.key(3), setup["flat"], 2, 3)          # [18, ...]
    lrn = setup["lrn"]["mlp"]
    ik, tk = learners.model_keys(jax.random.key(2), td.num_agents)
    whole = lrn.fit(jax.random.key(2), td)
    part = lrn.fit_keyed(ik[6:], tk[6:], jax.tree.map(lambda a: a[6:], td))   # parties 1, 2
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(a[6:], b), whole, part)


def test_tree_learners_on_host_parties_equal_device(setup, mapped):
    """Tree learners are not streamed (all parties in one chunk, a host loop): host == device."""
    ref, parties, xp, t, s = run_small(setup, "L0", "trees")
    cfg = dataclasses.replace(ref.config, party_chunk=2)
    got = run_fedkt(jax.random.key(0), mapped, xp, cfg, teacher=t, student=s, final=s)
    for field in STREAM_FIELDS:
        np.testing.assert_array_equal(getattr(got, field), getattr(ref, field), err_msg=field)
    assert len(got.teachers) == parties.num_agents * 2 * 3             # trees are kept


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2"])
def test_bad_party_chunk_is_rejected(bad):
    with pytest.raises(ValueError, match=r"algorithm\.party_chunk"):
        fedkt.Config(party_chunk=bad)

# ----------------------------------------------------------------------------- splits


def test_teacher_split_is_a_disjoint_cover_and_partitions_differ(setup):
    parties = setup["flat"]
    td = partition.teacher_data(jax.random.key(3), parties, 2, 3)
    n = parties.num_agents
    assert td.num_agents == n * 2 * 3
    td = jax.tree.map(np.asarray, td)             # host copies: the loops below index numpy
    counts = np.asarray(td.counts).reshape(n, 2, 3)
    for i in range(n):
        xi, yi = parties.local(i)
        c = len(yi)
        for j in range(2):
            assert sorted(counts[i, j]) == sorted([(k + 1) * c // 3 - k * c // 3 for k in range(3)])
            rows = []
            for k in range(3):
                a = (i * 2 + j) * 3 + k
                xa = np.asarray(td.x[a, :int(td.counts[a])])
                assert not np.asarray(td.mask[a, int(td.counts[a]):]).any()
                # each teacher row is one of the party's real rows, with its label
                match = [int(np.flatnonzero((xi == r).all(1))[0]) for r in xa]
                np.testing.assert_array_equal(yi[match], np.asarray(td.y[a, :len(match)]))
                rows.append(match)
            flat = sorted(sum(rows, []))
            assert flat == list(range(c))                     # disjoint, covers the party
        # two partitions are independent re-splits (not the same first subset)
        assert not np.array_equal(np.asarray(td.x[(i * 2) * 3]), np.asarray(td.x[(i * 2 + 1) * 3]))


def test_party_too_small_is_an_error_before_training(setup):
    tiny = from_ragged([np.zeros((5, 16), np.float32), np.zeros((2, 16), np.float32)],
                       [np.zeros(5, np.int32), np.zeros(2, np.int32)])
    cfg = fedkt.Config(num_teachers=3, local=TRAIN)
    with pytest.raises(ValueError, match="party 1 holds 2 records, fewer than num_teachers=3"):
        run_fedkt(jax.random.key(0), tiny, np.zeros((4, 16), np.float32), cfg,
                  teacher=setup["lrn"]["mlp"], student=setup["lrn"]["mlp"],
                  final=setup["lrn"]["mlp"])


@pytest.mark.parametrize("kw,match", [
    ({"num_partitions": 0}, "algorithm.num_partitions"), ({"num_teachers": 0}, "num_teachers"),
    ({"level": "L3"}, "algorithm.level"), ({"gamma": 0.0}, "algorithm.gamma"),
    ({"gamma": float("inf")}, "algorithm.gamma"), ({"query_fraction": 0.0}, "query_fraction"),
    ({"query_fraction": 1.5}, "query_fraction"), ({"teacher": "svm"}, "algorithm.teacher"),
    ({"moment_orders": 0}, "moment_orders")])
def test_config_errors(kw, match):
    with pytest.raises(ValueError, match=match):
        fedkt.Config(**kw)


def test_run_input_errors(setup):
    lr = setup["lrn"]["mlp"]
    cfg = fedkt.Config(num_teachers=3, local=TRAIN)
    with pytest.raises(ValueError, match="x_public has feature shape"):
        run_fedkt(jax.random.key(0), setup["flat"], np.zeros((4, 5), np.float32), cfg,
                  teacher=lr, student=lr, final=lr)
    with pytest.raises(ValueError, match="x_public"):
        run_fedkt(jax.random.key(0), setup["flat"], np.zeros((0, 16), np.float32), cfg,
                  teacher=lr, student=lr, final=lr)

# ----------------------------------------------------------------------------- training


def test_teacher_training_one_call_matches_loop_and_chunks(setup):
    td = partition.teacher_data(jax.random.key(1), setup["flat"], 2, 3)       # 18 teachers
    model = setup["lrn"]["logistic"].model
    key = jax.random.key(7)
    plain = learners.JaxLearner(model, TRAIN, chunk_size=None).fit(key, td)
    chunked = learners.JaxLearner(model, TRAIN, chunk_size=4).fit(key, td)
    loop = learners.JaxLearner(model, TRAIN, backend="loop").fit(key, td)
    for other in (chunked, loop):
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6),
                     plain, other)
    # and the teachers really differ from each other (independent inits and data)
    leaf = jax.tree.leaves(plain)[0]
    assert not np.allclose(leaf[0], leaf[1])


def test_student_shared_input_training_matches_loop(setup):
    xp = setup["ds"].x_public
    y = jax.random.randint(jax.random.key(0), (4, xp.shape[0]), 0, C)
    mask = jnp.ones(y.shape, bool).at[1, :5].set(False)
    model = setup["lrn"]["mlp"].model
    a = learners.JaxLearner(model, TRAIN, chunk_size=None).fit_shared(jax.random.key(2), xp, y, mask)
    b = learners.JaxLearner(model, TRAIN, backend="loop").fit_shared(jax.random.key(2), xp, y, mask)
    jax.tree.map(lambda u, v: np.testing.assert_allclose(u, v, rtol=2e-5, atol=2e-6), a, b)

# ----------------------------------------------------------------------------- voting


def loop_consistent_vote(preds, num_classes):
    """Reference: party i adds s to class c iff all its s students say c (Python loops)."""
    n, s, q = preds.shape
    counts = np.zeros((q, num_classes), np.int64)
    for x in range(q):
        for i in range(n):
            first = preds[i, 0, x]
            if all(preds[i, j, x] == first for j in range(s)):
                counts[x, first] += s
    return counts


def test_consistent_vote_function_matches_loop():
    preds = np.array(jax.random.randint(jax.random.key(0), (5, 3, 40), 0, 3))
    preds[0, :, :10] = 1                                                   # some agreement
    got = np.asarray(votes.consistent_vote(jnp.asarray(preds), 3))
    np.testing.assert_array_equal(got, loop_consistent_vote(preds, 3))


@pytest.mark.parametrize("model", ["logistic", "cnn", "trees"])   # dense, conv, non-JAX
def test_consistent_voting_in_a_run_matches_loop_for_every_model_type(setup, model):
    res, parties, xp, t, s = run_small(setup, "L0", model)
    n = parties.num_agents
    # every student predicted on its own (one model at a time), then the loop vote
    preds = np.stack([np.asarray(s.predict(s.take(res.students, a), xp))[0]
                      for a in range(n * 2)]).reshape(n, 2, -1)
    np.testing.assert_array_equal(res.server_votes, loop_consistent_vote(preds, C))
    np.testing.assert_array_equal(res.server_mask, res.server_votes.sum(-1) > 0)
    # teacher votes are the per-teacher predictions counted per partition
    tp = np.stack([np.asarray(t.predict(t.take(res.teachers, a), xp))[0]
                   for a in range(n * 2 * 3)]).reshape(n, 2, 3, -1)
    ref = np.stack([(tp == c).sum(2) for c in range(C)], -1)
    np.testing.assert_array_equal(res.teacher_votes, ref)
    np.testing.assert_array_equal(res.party_labels, ref.argmax(-1))        # L0: no noise
    acc = res.accuracy(setup["ds"].x_test.reshape((-1,) + xp.shape[1:]), setup["ds"].y_test)
    assert 0.0 <= acc <= 1.0

# ----------------------------------------------------------------------------- noise


def test_noisy_labels_are_independent_across_groups_and_queries():
    counts = jnp.zeros((6, 500, 10), jnp.int32)                            # no signal
    keys = jax.random.split(jax.random.key(0), 6)
    labels = np.asarray(votes.noisy_labels(keys, counts, 1.0))
    # each group: uniform over classes; two groups agree about 1/10 of the time
    for g in range(6):
        assert np.bincount(labels[g], minlength=10).min() > 20
    agree = [np.mean(labels[a] == labels[b]) for a in range(6) for b in range(a + 1, 6)]
    assert max(agree) < 0.2
    # consecutive queries are not correlated
    assert np.mean(labels[:, 1:] == labels[:, :-1]) < 0.2
    # a different key gives different noise; the same key the same
    again = np.asarray(votes.noisy_labels(keys, counts, 1.0))
    np.testing.assert_array_equal(labels, again)


def test_l2_noise_differs_per_party_and_partition(setup):
    # all-agreeing teachers would give identical labels; with huge noise each (party, partition)
    # draws its own labels
    res, *_ = run_small(setup, "L2", "logistic", gamma=1e-3, query_fraction=1.0)
    lab = res.party_labels.reshape(-1, res.party_labels.shape[-1])        # [n*s, Q]
    for a in range(lab.shape[0]):
        for b in range(a + 1, lab.shape[0]):
            assert np.mean(lab[a] == lab[b]) < 0.75


def test_query_fraction_selects_the_noisy_tier(setup):
    l1, *_ = run_small(setup, "L1", "mlp")
    l2, *_ = run_small(setup, "L2", "mlp", gamma=0.3)
    assert len(l1.server_queries) == 15 and len(l1.party_queries) == 30
    assert len(l2.party_queries) == 15 and len(l2.server_queries) == 30
    assert l1.server_mask.all()                          # L1 never drops queries on clean votes


def test_rows_of_one_seed_share_their_teachers_and_l1_students(setup):
    # "teacher reuse" (the removed tools/exp_fedkt.py trained Table 2's teachers once per seed):
    # every random draw has a named stream of the run key, so runs of one seed that differ in
    # level, gamma or query fraction train the same teachers (L2: their votes on its queries)
    # and, at L0 / L1, the same students; a sweep's rows differ only in the noisy tier
    l0, *_ = run_small(setup, "L0", "mlp")
    l1, *_ = run_small(setup, "L1", "mlp")
    l2, *_ = run_small(setup, "L2", "mlp", gamma=0.3)
    np.testing.assert_array_equal(l1.teacher_votes, l0.teacher_votes)
    np.testing.assert_array_equal(l2.teacher_votes, l0.teacher_votes[:, :, l2.party_queries])
    np.testing.assert_array_equal(l1.student_preds, l0.student_preds[:, :, l1.server_queries])

# ----------------------------------------------------------------------------- accounting


def test_l1_accounting_matches_independent_computation(setup):
    res, *_ = run_small(setup, "L1", "mlp")
    cfg, g, s = res.config, res.config.gamma, 2
    dd, di = fedkt.ledger(cfg, res.state)
    z = int(res.z.max())
    k_ex = {0: 0.0, 1: 1.0, 2: 2.0}[z]                    # s = 2: 0, s/2, s
    for unit, k in (("party", s), ("example", k_ex)):
        total = sum(np.asarray(lnmax.lnmax_log_moments(lnmax.lnmax_q(v, g), g, z=k, k=k))
                    for v in res.server_votes)
        orders, rdp = dd.rdp(unit)
        np.testing.assert_allclose(rdp, total / np.arange(1, 9), rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(orders, np.arange(2, 10))
        # data-independent: Q pure (2 s gamma)-DP queries, straight from dp-accounting
        ev = dp_accounting.SelfComposedDpEvent(dp_accounting.LaplaceDpEvent(1 / (2 * s * g)),
                                               len(res.server_queries))
        acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4).compose(ev)
        got = next(r for r in di.report(1e-5, ("pld",)) if r["unit"] == unit)
        assert got["epsilon"] == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9)
        assert got["epsilon"] <= len(res.server_queries) * 2 * s * g + 1e-9
    summary = privacy.privacy_summary(res.config, res.state.values, 1e-5)
    assert set(summary["units"]) == {"party", "example"}
    assert summary["units"]["party"]["data_dependent_rdp_epsilon"] <= \
        summary["units"]["party"]["moments_epsilon"] + 1e-9


def test_l2_accounting_is_worst_party_of_its_queries(setup):
    res, *_ = run_small(setup, "L2", "mlp", gamma=0.3)
    g = 0.3
    dd, di = fedkt.ledger(res.config, res.state)
    n = res.teacher_votes.shape[0]
    for unit, k in (("example", 1.0), ("party", 3.0)):
        per_party = []
        for i in range(n):                                  # loop reference
            tot = np.zeros(8)
            for j in range(2):
                for v in res.teacher_votes[i, j]:
                    tot += lnmax.lnmax_log_moments(lnmax.lnmax_q(v, g), g, z=k, k=k)
            per_party.append(tot / np.arange(1, 9))
        np.testing.assert_allclose(dd.rdp(unit)[1], np.max(per_party, 0), rtol=1e-12)
        ev = dp_accounting.SelfComposedDpEvent(dp_accounting.LaplaceDpEvent(1 / (2 * k * g)),
                                               2 * len(res.party_queries))
        direct = dp_accounting.rdp.RdpAccountant().compose(ev).get_epsilon(1e-5)
        got = next(r for r in di.report(1e-5, ("rdp",)) if r["unit"] == unit)
        assert got["epsilon"] == pytest.approx(direct, rel=0.02)   # different order grids


def test_l0_has_no_ledger_entries(setup):
    res, *_ = run_small(setup, "L0", "logistic")
    dd, di = fedkt.ledger(res.config, res.state)
    assert len(dd) == 0 and len(di) == 0


def test_planned_ledger_is_the_runs_data_independent_ledger(setup):
    # the calibration hook: before training, the Laplace compositions the run will report
    res, *_ = run_small(setup, "L1", "mlp")
    plan = fedkt.planned_ledger(res.config, res.state, jax.random.key(0))
    _, di = fedkt.ledger(res.config, res.state)
    for cfg in (res.config, dataclasses.replace(res.config, gamma=0.25)):
        planned = plan(cfg)
        ref = privacy.ledgers_from_votes(cfg, server_votes=res.server_votes, z=res.z)[1]
        for unit in ("party", "example"):
            assert planned.epsilon(unit, 1e-5) == ref.epsilon(unit, 1e-5)
    assert plan(res.config).epsilon("party", 1e-5) == di.epsilon("party", 1e-5)
    with pytest.raises(ValueError, match="FedKT-L0 adds no noise"):
        fedkt.planned_ledger(dataclasses.replace(res.config, level="L0"), res.state, None)


def test_example_sensitivity_rules():
    assert [privacy.example_k(z, 4) for z in range(5)] == [0.0, 2.0, 2.0, 2.0, 4.0]
    assert [privacy.paper_example_k(z, 4) for z in range(5)] == [0.0, 1.0, 2.0, 3.0, 4.0]
    with pytest.raises(ValueError, match="z"):
        privacy.example_k(5, 4)


def test_gap_threshold_two_is_safe_and_one_is_not():
    """Brute force: one changed teacher vote can flip the argmax only if the top-2 gap <= 2."""
    rng = np.random.default_rng(0)
    flips_at_gap = set()
    for _ in range(3000):
        v = rng.multinomial(rng.integers(2, 9), np.ones(3) / 3)
        for a in range(3):
            for b in range(3):
                if a != b and v[a] > 0:
                    w = v.copy()
                    w[a] -= 1
                    w[b] += 1
                    if w.argmax() != v.argmax():
                        flips_at_gap.add(int(votes.top2_gaps(v)))
    assert max(flips_at_gap) == 2                 # gap 2 can flip (tie-break): paper's 1 misses
    counts = np.array([[[[3, 1, 0], [4, 0, 0]], [[5, 0, 0], [6, 0, 0]]]])  # [1, 2, 2, 3]
    np.testing.assert_array_equal(votes.partitions_at_risk(counts, 2), [1])
    np.testing.assert_array_equal(votes.partitions_at_risk(counts, 1), [0])


def test_account_function_and_votes_file(tmp_path):
    counts = np.tile([18, 2], (1000, 1))
    out = privacy.account(counts, level="L1", gamma=0.05, delta=1e-5, z=1)
    assert out["units"]["example"]["moments_epsilon"] == pytest.approx(20.7565, abs=1e-3)
    assert out["units"]["party"]["moments_epsilon"] == pytest.approx(51.5129, abs=1e-3)
    np.savez(tmp_path / "v.npz", votes=counts, z=1)
    v, z = files.load_votes(tmp_path / "v.npz")
    assert z == 1 and v.shape == (1000, 2)
    with pytest.raises(ValueError, match="npz or .json"):
        files.load_votes(__file__)
    with pytest.raises(ValueError, match="does not exist"):
        files.load_votes(tmp_path / "missing.json")


def test_cli_account_fedkt(tmp_path, capsys):
    import json
    from fedjax_dp.experiments import cli
    path = tmp_path / "votes.json"
    path.write_text(json.dumps({"votes": [[18, 2]] * 1000, "z": 1}))
    assert cli.main(["account", "fedkt", "--votes", str(path), "--gamma", "0.05", "--delta",
                     "1e-5", "--level", "L1", "--s", "2", "--accountant", "rdp"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["z"] == 1 and out["noisy_queries_per_unit"] == 1000
    assert out["units"]["example"]["moments_epsilon"] == pytest.approx(20.7565, abs=1e-3)
    assert out["units"]["party"]["moments_epsilon"] == pytest.approx(51.5129, abs=1e-3)
    assert out["units"]["party"]["data_independent"]["rdp"] > 0
    assert cli.main(["account", "fedkt", "--votes", str(path), "--gamma", "-1", "--delta",
                     "1e-5", "--level", "L1"]) == 2
    assert "gamma" in capsys.readouterr().err

# ----------------------------------------------------------------------------- learners


def test_tree_learners_and_single_class_subsets():
    y = np.stack([np.zeros(20), np.arange(20) % 3, np.arange(20) % 2]).astype(np.int32)
    x = np.random.default_rng(0).normal(size=(3, 20, 4)).astype(np.float32) + 3 * y[..., None]
    d = from_ragged(list(x), list(y))
    for kind in ("decision_tree", "random_forest", "gradient_boosting"):
        lr = learners.SklearnLearner(kind, 3, max_depth=3, n_estimators=5)
        fitted = lr.fit(jax.random.key(0), d)
        p = np.asarray(lr.predict(fitted, x[1]))
        assert p.shape == (3, 20) and (p[0] == 0).all()                  # one-class party
        assert np.mean(p[1] == y[1]) > 0.9                               # fits its data
    with pytest.raises(ValueError, match="learner"):
        learners.SklearnLearner("svm", 3)


def test_xgboost_learner():
    """The shipped ``xgboost`` learner itself (xgboost is a test dependency: no skip)."""
    x = np.random.default_rng(0).normal(size=(2, 30, 4)).astype(np.float32)
    y = np.stack([np.arange(30) % 3, np.where(np.arange(30) % 2, 2, 0)]).astype(np.int32)
    lr = learners.SklearnLearner("xgboost", 3, max_depth=3, n_estimators=5)
    p = np.asarray(lr.predict(lr.fit(jax.random.key(0), from_ragged(list(x), list(y))), x[1]))
    assert set(np.unique(p[1])) <= {0, 2}                                # labels mapped back

# ----------------------------------------------------------------------------- baselines


def solo_reference(key, parties, learner, x_test, y_test) -> np.ndarray:
    """The removed ``baselines.solo``: each party's test accuracy ``[n]``, its model fitted on
    its own records by ONE learner call with ``key``."""
    fitted_models = learner.fit(key, parties)
    preds = np.asarray(learner.predict(fitted_models, x_test))                     # [n, M]
    return np.mean(preds == np.asarray(y_test)[None], axis=1)


@pytest.mark.parametrize("which, cfg", [
    ("logistic", dict(learner="model")),
    ("forest", dict(learner="random_forest", tree_max_depth=3, tree_estimators=5)),
])
def test_solo_is_the_mean_of_the_parties_accuracies(setup, which, cfg):
    # the registered algorithm "fedkt_solo" (learner built from its config) gives the numbers of
    # the removed baselines.solo with the run key's stream "solo"; the trees' host loop too
    ds, parties = setup["ds"], setup["flat"]
    lr = setup["lrn"][which]
    model = lr.model if learners.is_jax(lr) else make_model("logistic", (16,), C)
    data_ = api.FederatedData(agents=parties, num_classes=C)
    config = solo.Config(local=TRAIN, **cfg)
    key = jax.random.key(3)
    done = api.run(solo, key, data_, model, config, runtime=api.Runtime(chunk_size=None))
    per_party = solo_reference(rng.stream(key, "solo"), parties, lr, ds.x_test, ds.y_test)
    out = solo.output(done.state)
    assert out.score(ds.x_test, ds.y_test) == float(np.mean(per_party))
    np.testing.assert_array_equal(
        solo.party_accuracies(lr, solo.fitted(done.state), ds.x_test, ds.y_test), per_party)
    assert len(set(per_party.tolist())) > 1 or parties.num_agents == 1   # n models, not one
    assert solo.ledger(config, done.state).entries == () and not api.hooks(solo).private
    with pytest.raises(ValueError, match="n models"):
        out.predict_labels(ds.x_test)
    with pytest.raises(ValueError, match="algorithm.learner"):
        solo.Config(learner="svm")


def test_solo_sweep_base_runs_end_to_end(tmp_path):
    # the SOLO column's tree row through the runner (host learners: no compilation)
    base = ROOT / "configs" / "experiments" / "bases" / "fedkt_solo_wbcd_trees.toml"
    cfg = config_lib.load(base,
                          ["algorithm.tree_estimators=5", "algorithm.tree_max_depth=3",
                           "data.validation_fraction=0.1", "run.progress=false"])
    result = runner.run(cfg, tmp_path, progress=False)
    assert result["algorithm"] == "fedkt_solo" and result["privacy"] == []
    assert 0.0 <= result["test_accuracy"] <= 1.0 and "val_accuracy" in result


def test_baselines_pate_and_one_round(setup):
    ds, parties = setup["ds"], setup["flat"]
    tree, forest = setup["lrn"]["trees"], setup["lrn"]["forest"]     # host learners: no compile
    pooled = partition.pool(parties)
    assert pooled.num_agents == 1 and int(pooled.counts[0]) == int(parties.counts.sum())
    cfg = fedkt.Config(num_partitions=2, num_teachers=3, centralized=True, local=TRAIN)
    pate = run_fedkt(jax.random.key(0), parties, ds.x_public, cfg, teacher=tree,
                     student=forest, final=forest)
    assert pate.teacher_votes.shape[:2] == (1, 2)
    with pytest.raises(ValueError, match="algorithm.centralized"):
        fedkt.Config(centralized=True, level="L1")
    assert pate.accuracy(ds.x_test, ds.y_test) > 0.4            # chance: 1/3
    lr = setup["lrn"]["logistic"]
    acc = fedkt_baselines.one_round(jax.random.key(1), parties, lr.model, TRAIN, ds.x_test,
                                    ds.y_test, prox_mu=0.1)
    assert 0.0 <= acc <= 1.0


def test_fedprox_term_pulls_towards_the_start(setup):
    from fedjax_dp.train import make_local_update
    model = setup["lrn"]["logistic"].model
    d = setup["flat"]
    p0 = model.init(jax.random.key(0))
    dist = {}
    for mu in (0.0, 5.0):
        cfg = dataclasses.replace(TRAIN, steps=30, optimizer="sgd", learning_rate=0.1,
                                  prox_mu=mu)
        p, _ = make_local_update(model, cfg)(jax.random.key(1), p0, d.x[0], d.y[0], d.mask[0],
                                             d.counts[0])
        dist[mu] = float(sum(jnp.sum((a - b) ** 2) for a, b in
                             zip(jax.tree.leaves(p), jax.tree.leaves(p0))))
    assert dist[5.0] < 0.5 * dist[0.0]
    with pytest.raises(ValueError, match="train.prox_mu"):
        LocalTrainConfig(prox_mu=-1.0)

# ----------------------------------------------------------------------------- configs


@pytest.mark.parametrize("name,overrides", [
    ("wbcd", ["algorithm.tree_estimators=5", "algorithm.tree_max_depth=3",
              "privacy.accountants=[\"rdp\"]"]),
    ("digits", ["train.steps=5", "algorithm.student_steps=5", "algorithm.final_steps=5",
                "model.name=\"logistic\"", "data.num_agents=3",
                "privacy.accountants=[\"rdp\"]"]),
])
def test_configs_end_to_end_tiny(tmp_path, name, overrides):
    cfg = config_lib.load(ROOT / "configs" / "fedkt" / f"{name}.toml",
                          overrides + ["run.progress=false"])
    result = runner.run(cfg, tmp_path, progress=False)
    assert result["algorithm"] == "fedkt" and 0.0 <= result["test_accuracy"] <= 1.0
    rows = {(r["unit"], r["accountant"], r["data_dependent"]) for r in result["privacy"]}
    level = cfg["algorithm"]["level"]
    if level == "L0":
        assert rows == set()
    else:      # no data-dependent row, z or votes.npz unless the config opts in: all covered
        assert rows == {(unit, "rdp", False) for unit in ("party", "example")}
        assert all(r["covers_all_releases"] for r in result["privacy"])
        assert "z" not in result["history"][-1] and not (tmp_path / "votes.npz").exists()
    assert result["history"][0]["teachers_s"] > 0
