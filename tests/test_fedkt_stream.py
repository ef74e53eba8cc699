"""FedKT with its parties streamed in chunks (``algorithm.party_chunk``): chunked == unchunked and
host- (memory-mapped) == device-resident at L1 and L2 (votes, labels, predictions, ledgers, final
model), the chunked server vote against a loop, per-model keys sliced from the whole run's, progress
per chunk, tree learners on host data, and bad input rejected. Tiny shapes (those of
tests/test_stream_oneshot.py) so the compiled functions are few and shared."""
import contextlib
import dataclasses

import jax
import numpy as np
import pytest

from fedjax_dp.algorithms import api, fedkt, learners
from fedjax_dp.core import from_arrays, load_stacked, save_stacked
from fedjax_dp.core import progress as progress_lib
from fedjax_dp.models import make_model
from fedjax_dp.train import LocalTrainConfig

N, M, D, C = 7, 6, 4, 3
S, T = 2, 2
LOCAL = LocalTrainConfig(steps=3, batch_size=4, learning_rate=0.1, optimizer="adam")
# query_fraction 1: L1 and L2 runs have the same shapes (only the noise differs): one compile
CFG = fedkt.Config(num_partitions=S, num_teachers=T, gamma=0.5, query_fraction=1.0,
                   student_steps=3, final_steps=3, local=LOCAL)


@pytest.fixture(scope="module")
def problem(tmp_path_factory):
    rng = np.random.default_rng(0)
    means = rng.normal(size=(C, D)).astype(np.float32) * 2
    y = rng.integers(0, C, (N, M)).astype(np.int32)
    x = (means[y] + rng.normal(size=(N, M, D))).astype(np.float32)
    counts = np.array([6, 3, 5, 6, 2, 4, 6], np.int32)            # ragged: padding and masks
    x[np.arange(M)[None, :] >= counts[:, None]] = 0.0
    y[np.arange(M)[None, :] >= counts[:, None]] = 0
    yp = rng.integers(0, C, 12)
    x_public = (means[yp] + rng.normal(size=(12, D))).astype(np.float32)
    host = from_arrays(x, y, counts)
    path = tmp_path_factory.mktemp("fedkt_stream") / "parties"
    save_stacked(path, host)
    mapped = load_stacked(path, mmap=True)
    assert isinstance(mapped.x, np.memmap)
    return dict(host=host, mapped=mapped, device=host.on_device(), x_public=x_public,
                y_public=yp, model=make_model("logistic", (D,), C))


_RUNS: dict = {}


def _run(problem, level, where, chunk, progress=progress_lib.SILENT):
    memo = (level, where, chunk)
    if memo not in _RUNS or progress is not progress_lib.SILENT:
        data = api.FederatedData(agents=problem[where], num_classes=C,
                                 x_public=problem["x_public"])
        cfg = dataclasses.replace(CFG, level=level, party_chunk=chunk)
        _RUNS[memo] = api.run(fedkt, jax.random.key(4), data, problem["model"], cfg,
                              runtime=api.Runtime(chunk_size=None, progress=progress))
    return _RUNS[memo]


FIELDS = ("teacher_votes", "z", "party_labels", "student_preds", "server_votes",
          "server_labels", "server_mask")


@pytest.mark.parametrize("level", ["L1", "L2"])
@pytest.mark.parametrize("where,chunk", [("mapped", 2), ("device", 2), ("mapped", None)])
def test_chunked_and_host_streamed_runs_equal_the_unchunked_device_run(problem, level, where,
                                                                       chunk):
    """Same key: the same votes, labels, predictions, ledgers and final model whatever the chunk
    size (2: chunks 2, 2, 2 and a padded 1) and wherever the parties live (a memory map)."""
    ref = _run(problem, level, "device", None).state                 # one chunk of all 7
    got = _run(problem, level, where, chunk).state
    for field in FIELDS:
        np.testing.assert_array_equal(got.values[field], ref.values[field], err_msg=field)
    cfg = got.context.config
    for a, b in zip(fedkt.ledger(cfg, ref), fedkt.ledger(cfg, got)):
        assert a.to_json() == b.to_json() and len(a) > 0
        assert a.epsilon("party", 1e-5) == b.epsilon("party", 1e-5)
    x = problem["x_public"]
    np.testing.assert_array_equal(fedkt.output(got).predict_labels(x),
                                  fedkt.output(ref).predict_labels(x))
    jax.tree.map(np.testing.assert_array_equal, fedkt.fitted(got, "final"),
                 fedkt.fitted(ref, "final"))
    # compact integer storage: counts <= t and class indices
    assert got.values["teacher_votes"].dtype == np.int8
    assert got.values["student_preds"].shape == (N, S, len(got.context.server_queries))
    # the unchunked device run keeps its models; a streamed one only their votes / predictions
    assert not fedkt.streamed(ref)
    assert fedkt.streamed(got)
    for name in ("teachers", "students"):
        with pytest.raises(ValueError, match="not kept"):
            fedkt.fitted(got, name)


def test_kept_models_reproduce_the_stored_votes_and_predictions(problem):
    """The unchunked run's teachers (one at a time) give teacher_votes; its students give
    student_preds: what the streamed phases keep instead of the models."""
    st = _run(problem, "L1", "device", None).state
    lrn = st.context.learners["teachers"]
    teachers, students = fedkt.fitted(st, "teachers"), fedkt.fitted(st, "students")
    xq = problem["x_public"][st.context.party_queries]
    xs = problem["x_public"][st.context.server_queries]
    votes = np.zeros((N, S, len(xq), C), np.int64)
    for i in range(N):                                               # loop reference
        for j in range(S):
            for k in range(T):
                p = np.asarray(lrn.predict(lrn.take(teachers, (i * S + j) * T + k), xq))[0]
                votes[i, j, np.arange(len(xq)), p] += 1
            got = np.asarray(lrn.predict(lrn.take(students, i * S + j), xs))[0]
            np.testing.assert_array_equal(st.values["student_preds"][i, j], got)
    np.testing.assert_array_equal(st.values["teacher_votes"], votes)
    np.testing.assert_array_equal(st.values["party_labels"], votes.argmax(-1))    # L1: clean


def test_chunked_server_vote_matches_loop():
    rng = np.random.default_rng(2)
    preds = rng.integers(0, C, (N, S, 9)).astype(np.int8)
    preds[:3, :, :4] = 1                                             # some agreement
    want = np.zeros((9, C), np.int64)
    for i in range(N):
        for q in range(9):
            if (preds[i, :, q] == preds[i, 0, q]).all():
                want[q, preds[i, 0, q]] += S
    for size in (2, N):                                              # padded chunks, one chunk
        np.testing.assert_array_equal(fedkt.server_votes(preds, C, size), want)


def test_per_model_keys_slice_like_the_whole_run(problem):
    """fit_keyed on slices of model_keys trains the same models as fit on all of them: the
    teacher of global index a gets the same keys in every chunk."""
    td = fedkt.teacher_data(jax.random.key(1), problem["device"], S, T)     # [28, ...]
    lrn = learners.JaxLearner(problem["model"], LOCAL, chunk_size=None)
    ik, tk = learners.model_keys(jax.random.key(2), td.num_agents)
    whole = lrn.fit(jax.random.key(2), td)
    part = lrn.fit_keyed(ik[4:8], tk[4:8], jax.tree.map(lambda a: a[4:8], td))
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(a[4:8], b), whole, part)
    # and different teachers differ (no key reused)
    leaf = jax.tree.leaves(whole)[0]
    assert len({np.asarray(leaf[a]).tobytes() for a in range(td.num_agents)}) == td.num_agents


class _Recorder(progress_lib.Progress):
    enabled = True

    def __init__(self):
        self.tasks = []

    @contextlib.contextmanager
    def task(self, name, total=None, unit="it"):
        rec = {"name": name, "total": total, "unit": unit, "done": 0}
        self.tasks.append(rec)

        class _T(progress_lib.Task):
            def update(self, n=1):
                rec["done"] += n
        yield _T()


def test_progress_is_reported_per_chunk(problem):
    rec = _Recorder()
    _run(problem, "L1", "mapped", 2, progress=rec)
    by = {t["name"]: t for t in rec.tasks}
    for name in ("teachers", "students"):
        assert by[name]["total"] == by[name]["done"] == 4               # ceil(7 / 2)
        assert by[name]["unit"] == "chunk"


def test_tree_learners_on_host_parties_equal_device(problem):
    """Tree learners are not streamed (one chunk of all parties, host loop): host == device."""
    tree = learners.SklearnLearner("decision_tree", C, max_depth=2)
    cfg = dataclasses.replace(CFG, level="L1", party_chunk=2)
    runs = [fedkt.run(jax.random.key(0), problem[w], problem["x_public"], cfg, num_classes=C,
                      teacher=tree, student=tree, final=tree) for w in ("mapped", "device")]
    for field in FIELDS:
        np.testing.assert_array_equal(getattr(runs[0], field), getattr(runs[1], field))
    assert runs[0].teachers is not None and len(runs[0].teachers) == N * S * T


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2"])
def test_bad_party_chunk_is_rejected(bad):
    with pytest.raises(ValueError, match=r"algorithm\.party_chunk"):
        fedkt.Config(party_chunk=bad)
