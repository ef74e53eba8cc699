"""One-shot voting algorithms on host-resident agents streamed in chunks: host == device, chunked ==
unchunked, memory-mapped populations end to end, the streamed tally against a per-agent loop,
progress per chunk, and bad input rejected before any work (FedKT's host-resident run is tested in
tests/test_fedkt.py, sharing that file's compiled functions)."""
import dataclasses

import jax
import numpy as np
import pytest

from fedjax_dp.algorithms.voting import ae_dpfl, knn_dpfl
from fedjax_dp.core import agent_stream
from fedjax_dp.algorithms import api
from fedjax_dp.algorithms.fedkt import fedkt
from fedjax_dp.core import from_arrays, load_stacked, save_stacked
from fedjax_dp.core import progress as progress_lib
from fedjax_dp.core.lift import resolve_chunk_size
from fedjax_dp.models import make_model
from fedjax_dp.privacy import vote as vote_lib
from fedjax_dp.train import LocalTrainConfig
from voting_fixtures import run_voting

N, M, D, C, Q = 7, 6, 4, 3, 6
DELTA = 1e-5
STUDENT = dict(student_steps=2, student_batch_size=4)
AE = ae_dpfl.Config(sigma=1.5, num_queries=Q, local=LocalTrainConfig(steps=2, batch_size=4),
                    data_dependent=True, **STUDENT)                  # the clean sums compared
# aggregate noise: the per-agent shares' tally is AE-DPFL's (same code), tested there
KNN = knn_dpfl.Config(k=2, sigma=0.7, num_queries=Q, feature_map="identity", knn_method="top_k",
                      vote_noise="aggregate", data_dependent=True, **STUDENT)


@pytest.fixture(scope="module")
def problem():
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
    device = host.on_device()
    model = make_model("logistic", (D,), C)
    return host, device, x_public, model

_RUNS: dict = {}


def _run(problem, module, cfg, where, chunk, progress=progress_lib.SILENT):
    host, device, x_public, model = problem
    agents = {"host": host, "device": device}[where]
    key = (module.__name__, where, chunk, cfg.vote_noise)
    if key not in _RUNS or progress is not progress_lib.SILENT:
        data = api.FederatedData(agents=agents, num_classes=C, x_public=x_public)
        done = api.run(module, jax.random.key(3), data, model,
                       dataclasses.replace(cfg, agent_chunk=chunk),
                       runtime=api.Runtime(chunk_size=None, progress=progress))
        _RUNS[key] = done
    return _RUNS[key]


def _same(a, b, module, cfg):
    va, vb = a.state.values, b.state.values
    np.testing.assert_array_equal(va["labels"], vb["labels"])
    np.testing.assert_array_equal(va["clean_vote_sums"], vb["clean_vote_sums"])
    units = ("agent", "instance", "agent_data_dependent", "instance_data_dependent")
    la, lb = module.ledger(cfg, a.state), module.ledger(cfg, b.state)
    assert [la.epsilon(u, DELTA) for u in units] == [lb.epsilon(u, DELTA) for u in units]


@pytest.mark.parametrize("where,chunk", [("host", 3), ("host", None), ("device", 3)])
def test_ae_dpfl_host_streamed_equals_device_resident(problem, where, chunk):
    ref = _run(problem, ae_dpfl, AE, "device", None)             # all agents in one chunk
    got = _run(problem, ae_dpfl, AE, where, chunk)
    _same(ref, got, ae_dpfl, AE)
    np.testing.assert_array_equal(ref.state.values["agent_ballots"],
                                  got.state.values["agent_ballots"])
    np.testing.assert_array_equal(ref.state.values["agent_losses"],
                                  got.state.values["agent_losses"])
    assert ("agent_params" in got.state.values) == (where == "device")   # host: never kept
    assert ref.state.values["clean_vote_sums"].sum() == N * Q             # one ballot each


def test_ae_dpfl_stored_ballots_match_a_per_agent_loop(problem):
    """The ballot kept for agent i and query t is argmax f_i(x_t) of agent i's own model."""
    host, device, x_public, model = problem
    done = _run(problem, ae_dpfl, AE, "device", 3)
    v, qidx = done.state.values, done.state.context.query_indices
    assert v["agent_ballots"].dtype == np.int8 and v["agent_ballots"].shape == (N, Q)
    for i in range(N):
        p = jax.tree.map(lambda l: l[i], v["agent_params"])
        want = np.argmax(np.asarray(model.logits(p, x_public[qidx])), -1)
        np.testing.assert_array_equal(v["agent_ballots"][i], want)


@pytest.mark.parametrize("where,chunk", [("host", 3), ("device", 3)])
def test_knn_dpfl_host_streamed_equals_device_resident(problem, where, chunk):
    cfg = dataclasses.replace(KNN, k=2)
    ref = _run(problem, knn_dpfl, cfg, "device", None)
    got = _run(problem, knn_dpfl, cfg, where, chunk)
    _same(ref, got, knn_dpfl, cfg)
    # the clean sums are the brute-force kNN label counts / k, summed over agents
    host, _, x_public, _ = problem
    queries = x_public[ref.state.context.query_indices]
    want = np.zeros((Q, C))
    for i in range(N):
        xi, yi = host.local(i)
        for t, qx in enumerate(queries):
            for j in np.argsort(np.sum((xi - qx) ** 2, 1), kind="stable")[:2]:
                want[t, yi[j]] += 0.5
    np.testing.assert_allclose(ref.state.values["clean_vote_sums"], want)


def test_memory_mapped_population_end_to_end(problem, tmp_path):
    host, device, x_public, model = problem
    save_stacked(tmp_path / "agents", host)
    mapped = load_stacked(tmp_path / "agents", mmap=True)
    assert isinstance(mapped.x, np.memmap)
    res = run_voting(ae_dpfl, jax.random.key(3), mapped, model,
                     dataclasses.replace(AE, agent_chunk=3), x_public, chunk_size=None)
    ref = _run(problem, ae_dpfl, AE, "device", None)
    np.testing.assert_array_equal(res.labels, ref.state.values["labels"])
    np.testing.assert_array_equal(res.clean_vote_sums, ref.state.values["clean_vote_sums"])
    assert res.agent_params is None and res.agent_ballots.shape == (N, Q)
    out = ae_dpfl.output(res.state)
    assert out.predict_labels(x_public).shape == (12,)


def test_streamed_tally_equals_a_per_agent_loop():
    """Per-agent noise shares summed one agent at a time in agent order: the chunked tally equals
    a plain loop over agents (float32 round-off: XLA may fuse the share's scaling into the add)
    and is bitwise the same for every chunk size; counts are exact."""
    key = jax.random.key(5)
    rng = np.random.default_rng(1)
    n, q, c = N, Q, C                                  # the AE-DPFL runs' shapes: no new compile
    ballots = rng.integers(-1, c, (n, q)).astype(np.int8)          # -1: abstain
    std = np.float32(0.3)
    shares = np.asarray(vote_lib.agent_query_noise(key, np.arange(n), np.arange(q), std, c))
    counts = np.zeros((q, c), np.int32)
    noise = np.zeros((q, c), np.float32)
    for i in range(n):                                             # the reference loop
        voted = ballots[i] >= 0
        counts[np.arange(q)[voted], ballots[i][voted]] += 1
        noise = noise + shares[i]
    first = None
    for size in (3, 7):
        tally = vote_lib.tally_init(q, c)
        for start in range(0, n, size):
            block = ballots[start:start + size]
            pad = size - len(block)
            block = np.concatenate([block, np.full((pad, q), 2, np.int8)])   # padding: ignored
            tally = vote_lib.tally_add(tally, key, block, np.arange(start, start + size),
                                          np.arange(size) < size - pad, std, num_classes=c,
                                          per_agent=True)
        np.testing.assert_array_equal(np.asarray(tally.counts), counts)
        np.testing.assert_allclose(np.asarray(tally.noise), noise, rtol=0, atol=1e-5)
        first = np.asarray(tally.noise) if first is None else first
        np.testing.assert_array_equal(np.asarray(tally.noise), first)       # chunk-independent
    # the shares of different agents and queries are distinct draws (no key reused)
    assert len(np.unique(shares.round(6))) == shares.size


def _tasks(rec):
    return [(t["name"], t["total"], t["unit"], t["done"]) for t in rec.tasks]


def test_progress_is_reported_per_chunk(problem):
    rec = progress_lib.RecordingProgress()
    _run(problem, ae_dpfl, AE, "host", 3, progress=rec)
    assert _tasks(rec) == [("local training", 3, "chunk", 3),                 # ceil(7 / 3)
                           ("vote", 3, "chunk", 3), ("student", 1, "model", 1)]


def test_knn_progress_reports_vote_chunks_and_self_training_rounds(problem):
    """kNN-DPFL: the vote per chunk of agents; a self-trained student per training round."""
    host, _, x_public, model = problem
    rec = progress_lib.RecordingProgress()
    cfg = dataclasses.replace(KNN, agent_chunk=3, student_semi_supervised=True,
                              student_self_training_rounds=2, student_confidence=0.1)
    api.run(knn_dpfl, jax.random.key(3), api.FederatedData(agents=host, num_classes=C,
                                                           x_public=x_public),
            model, cfg, runtime=api.Runtime(chunk_size=None, progress=rec))   # not memoised
    assert _tasks(rec) == [("vote", 3, "chunk", 3), ("student", 3, "round", 3)]


def test_mesh_vote_is_the_streamed_vote(problem):
    """With ``runtime.mesh`` AE-DPFL votes on its stored ballots as without one: the streamed
    vote, one unit of progress per chunk, the same labels."""
    from fedjax_dp.core import agent_mesh
    done = _run(problem, ae_dpfl, AE, "device", None)
    rec = progress_lib.RecordingProgress()
    ctx = dataclasses.replace(done.state.context,
                              runtime=api.Runtime(chunk_size=None, mesh=agent_mesh(),
                                                  progress=rec))
    kept = ("agent_ballots", "agent_losses", "agent_params")
    state = api.State(step=1, values={k: done.state.values[k] for k in kept}, context=ctx)
    state, _ = ae_dpfl.step(state)
    assert _tasks(rec) == [("vote", 1, "chunk", 1)]                  # N = 7: one chunk
    np.testing.assert_array_equal(state.values["labels"], done.state.values["labels"])


@pytest.mark.parametrize("module,cfg", [(ae_dpfl, AE), (knn_dpfl, KNN)])
def test_host_agents_with_a_mesh_equal_no_mesh(problem, module, cfg):
    """Host-resident agents with ``runtime.mesh`` (this process's devices) are streamed split
    over it: the same labels, clean sums and ballots as without a mesh; every agent counted
    once in ``agents_per_process``."""
    from fedjax_dp.core import agent_mesh
    host, _, x_public, model = problem
    data = api.FederatedData(agents=host, num_classes=C, x_public=x_public)
    state = module.init(jax.random.key(3), data, model, dataclasses.replace(cfg, agent_chunk=3),
                        api.Runtime(chunk_size=None, mesh=agent_mesh()))
    for _ in module.PHASES[:-1]:
        state, _ = module.step(state)
    want = _run(problem, module, cfg, "host", 3).state.values
    for name in ("labels", "clean_vote_sums") + (("agent_ballots",) if module is ae_dpfl else ()):
        np.testing.assert_array_equal(state.values[name], want[name], err_msg=name)
    assert state.values["agents_per_process"].tolist() == [N]
    assert want["agents_per_process"].tolist() == [N]


def test_bad_input_raises_before_any_work(problem):
    host, device, x_public, model = problem
    with pytest.raises(ValueError, match=r"algorithm\.agent_chunk"):
        ae_dpfl.Config(agent_chunk=0)
    with pytest.raises(ValueError, match=r"algorithm\.agent_chunk"):
        knn_dpfl.Config(agent_chunk=-2)
    with pytest.raises(ValueError, match="chunk_size"):
        resolve_chunk_size(0, num_agents=host.num_agents, default=agent_stream.DEFAULT_CHUNK)
    x, y, counts = np.asarray(host.x).copy(), np.asarray(host.y), np.asarray(host.counts).copy()
    empty = counts.copy()
    empty[4] = 0
    data = api.FederatedData(agents=from_arrays(x, y, empty), num_classes=C, x_public=x_public)
    with pytest.raises(ValueError, match=r"\[4\]"):
        ae_dpfl.init(jax.random.key(0), data, model, AE)
    x[2, 1, 0] = np.nan
    bad = from_arrays(x, y, counts, check=False)                    # skipped its own check
    for module, cfg in ((ae_dpfl, AE), (knn_dpfl, KNN), (fedkt, fedkt.Config(num_teachers=1))):
        data = api.FederatedData(agents=bad, num_classes=C, x_public=x_public)
        with pytest.raises(ValueError, match="NaN"):
            module.init(jax.random.key(0), data, model, cfg)


@pytest.mark.parametrize("noise", ["per_agent", "aggregate"])
def test_tally_step_equals_adds_then_release(noise):
    """The streamed vote's one compiled call per chunk (add, and release at the last chunk)
    gives the tally and the labels of the separate adds and release."""
    n, q, c = 11, 5, 4
    key = jax.random.key(7)
    ballots = np.random.default_rng(1).integers(-1, c, (n, q)).astype(np.int8)
    std, sigma, div = np.float32(0.8), np.float32(2.0), np.float32(1.0)
    per_agent = noise == "per_agent"
    step = vote_lib.tally_step_fn(c, per_agent, noise, False)
    ref, got = vote_lib.tally_init(q, c), vote_lib.tally_init(q, c)
    size, starts = 4, list(range(0, n, 4))
    for i, start in enumerate(starts):
        block = ballots[start:start + size]
        valid = np.arange(size) < len(block)
        block = np.concatenate([block, np.full((size - len(block), q), -1, np.int8)])
        ids = np.arange(start, start + size, dtype=np.int32)
        ref = vote_lib.tally_add(ref, key, block, ids, valid, std, num_classes=c,
                                    per_agent=per_agent)
        got, labels = step(got, key, block, ids, valid, std, sigma, div,
                           np.bool_(i == len(starts) - 1))
        if i < len(starts) - 1:
            assert np.all(np.asarray(labels) == -1)                   # nothing released yet
    np.testing.assert_array_equal(np.asarray(got.counts), np.asarray(ref.counts))
    np.testing.assert_array_equal(np.asarray(got.noise), np.asarray(ref.noise))
    want = vote_lib.tally_release(ref, key, sigma, div, noise=noise)
    np.testing.assert_array_equal(np.asarray(labels), np.asarray(want))
