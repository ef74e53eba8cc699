"""kNN-DPFL: kNN ballots vs brute force, padding, instance sensitivity by brute force, feature maps,
accounting, config validation and the shipped config end to end (tiny)."""
import dataclasses
import math
from pathlib import Path

import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dp.algorithms.voting import knn_dpfl
from fedjax_dp.core import from_ragged
from fedjax_dp.experiments import config as config_lib
from fedjax_dp.experiments import runner
from fedjax_dp.models import make_model
from fedjax_dp.privacy import accounting, vote
from voting_fixtures import run_voting

ROOT = Path(__file__).resolve().parents[1]
C, D = 3, 4
_BALLOTS = jax.jit(knn_dpfl.knn_ballots, static_argnames=("k", "num_classes"))


def _brute_force(xs, ys, queries, k, c):
    """numpy float64 kNN per agent and query (stable argsort: lower index first on ties)."""
    out = np.zeros((len(xs), len(queries), c))
    for i, (x, y) in enumerate(zip(xs, ys)):
        for t, qx in enumerate(queries):
            d = np.sum((np.asarray(x, np.float64) - qx) ** 2, axis=1)
            for j in np.argsort(d, kind="stable")[:k]:
                out[i, t, y[j]] += 1.0 / k
    return out


def _ragged(seed, sizes):
    rng = np.random.default_rng(seed)
    xs = [rng.normal(size=(n, D)).astype(np.float32) for n in sizes]
    ys = [rng.integers(0, C, n).astype(np.int32) for n in sizes]
    return xs, ys


def _ballots(xs, ys, queries, k, pad_to=None):
    """``pad_to``: one padded width for neighbouring data sets (one compiled program for all)."""
    data = from_ragged(xs, ys, allow_empty=True, pad_to=pad_to)
    return np.asarray(_BALLOTS(data.x, data.y, data.mask, jnp.asarray(queries), k=k,
                               num_classes=C))


# The ballot tests below share 3 agents padded to 8 records, 8 queries and k = 3: one compiled
# program for all of them (and the agent-removal sets: 2 agents).
K, PAD, NQ = 3, 8, 8


def test_knn_ballots_match_brute_force_with_ragged_agents():
    xs, ys = _ragged(0, [8, 2, 5])                        # agent 1 has fewer than k records
    queries = np.random.default_rng(1).normal(size=(NQ, D)).astype(np.float32)
    got = _ballots(xs, ys, queries, k=K, pad_to=PAD)
    np.testing.assert_allclose(got, _brute_force(xs, ys, queries, K, C), atol=1e-6)
    np.testing.assert_allclose(got[1].sum(-1), 2 / 3)     # normalised by k, not by its size
    np.testing.assert_allclose(got[[0, 2]].sum(-1), 1.0, atol=1e-6)


def test_padded_rows_are_never_chosen():
    # padding rows are zeros; a query AT zero would pick them if they were not masked
    xs = [np.full((2, D), 5.0, np.float32), np.full((6, D), 4.0, np.float32),
          np.full((8, D), 3.0, np.float32)]
    ys = [np.array([1, 1], np.int32), np.zeros(6, np.int32), np.full(8, 2, np.int32)]
    got = _ballots(xs, ys, np.zeros((NQ, D), np.float32), k=K, pad_to=PAD)
    np.testing.assert_allclose(got[0, :, 1], 2 / 3)        # only its 2 real records, label 1
    np.testing.assert_allclose(got[0, :, 0], 0.0)          # padded label 0 never counted
    np.testing.assert_allclose(got[1, :, 0], 1.0)
    np.testing.assert_allclose(got[2, :, 2], 1.0)


def test_instance_sensitivity_brute_force():
    """Add/remove each record (and add candidate records) on tiny data: the largest L2 change of
    the vote sum per query is sqrt(2)/k (attained), below the paper's sqrt(2/k)."""
    k = K
    xs, ys = _ragged(2, [5, 3, 4])                        # agent 1 has exactly k records
    rng = np.random.default_rng(3)
    queries = rng.normal(size=(NQ, D)).astype(np.float32)
    base = _ballots(xs, ys, queries, k, pad_to=PAD).sum(0)  # [Q, C]
    worst = 0.0
    neighbours = []
    for i in range(len(xs)):
        for j in range(len(xs[i])):                       # remove record j of agent i
            nx = [x if a != i else np.delete(x, j, 0) for a, x in enumerate(xs)]
            ny = [y if a != i else np.delete(y, j, 0) for a, y in enumerate(ys)]
            neighbours.append((nx, ny))
        for _ in range(4):                                # add a record near the queries
            new_x = (queries[rng.integers(len(queries))] + 0.01 * rng.normal(size=D))
            new_y = rng.integers(0, C)
            nx = [x if a != i else np.vstack([x, new_x[None].astype(np.float32)])
                  for a, x in enumerate(xs)]
            ny = [y if a != i else np.append(y, np.int32(new_y)) for a, y in enumerate(ys)]
            neighbours.append((nx, ny))
    for nx, ny in neighbours:
        other = _ballots(nx, ny, queries, k, pad_to=PAD).sum(0)
        worst = max(worst, float(np.max(np.linalg.norm(other - base, axis=1))))
    derived = vote.vote_sensitivity("instance", "neighbour_counts", k)
    assert worst <= derived + 1e-6
    assert worst == pytest.approx(derived, abs=1e-5)        # the bound is tight
    assert vote.vote_sensitivity("instance", "neighbour_counts", k, rule="paper") > derived


def test_agent_sensitivity_brute_force():
    """Removing any one agent moves each query's vote sum by at most 1 (L2). (k, the number of
    queries and the padded width of test_instance_sensitivity_brute_force: one compiled program
    for the full set.)"""
    k = K
    xs, ys = _ragged(4, [4, 6, 3])
    queries = np.random.default_rng(5).normal(size=(NQ, D)).astype(np.float32)
    full = _ballots(xs, ys, queries, k, pad_to=PAD).sum(0)
    for i in range(len(xs)):
        rest = _ballots(xs[:i] + xs[i + 1:], ys[:i] + ys[i + 1:], queries, k, pad_to=PAD).sum(0)
        assert np.max(np.linalg.norm(full - rest, axis=1)) <= 1.0 + 1e-6


def test_chunked_knn_vote_equals_plain():
    """Ragged last chunks of agents (3 + 1) and queries (2 + 2 + 1). (The shapes and ballot
    function of the next test: its "auto" vote sums are this plain sum's compiled program.)"""
    xs, ys = _ragged(6, [6, 4, 7, 3])
    data = from_ragged(xs, ys)
    queries = jnp.asarray(np.random.default_rng(7).normal(size=(5, D)), jnp.float32)
    fn = knn_dpfl.ballot_fn(2, C, "auto")
    agents = (data.x, data.y, data.mask)
    plain = vote.vote_sums(fn, agents, queries, num_classes=C)
    chunked = vote.vote_sums(fn, agents, queries, num_classes=C, agent_chunk=3, query_chunk=2)
    np.testing.assert_allclose(chunked, plain, atol=1e-6)
    np.testing.assert_allclose(plain, _brute_force(xs, ys, np.asarray(queries), 2, C).sum(0),
                               atol=1e-5)
    key = jax.random.key(0)
    np.testing.assert_array_equal(
        vote.mpc_vote(key, fn, agents, queries, 0.5, num_classes=C, agent_chunk=3,
                      query_chunk=2),
        vote.mpc_vote(key, fn, agents, queries, 0.5, num_classes=C))


def test_knn_methods_give_identical_vote_sums_and_config_checks_the_name():
    xs, ys = _ragged(8, [7, 4, 6, 2])
    data = from_ragged(xs, ys)
    queries = jnp.asarray(np.random.default_rng(9).normal(size=(5, D)), jnp.float32)
    agents = (data.x, data.y, data.mask)
    sums = {m: vote.vote_sums(knn_dpfl.ballot_fn(2, C, m), agents, queries, num_classes=C)
            for m in knn_dpfl.KNN_METHODS}
    np.testing.assert_array_equal(sums["threshold"], sums["top_k"])
    with pytest.raises(ValueError, match="algorithm.knn_method"):
        knn_dpfl.Config(knn_method="sort")
    with pytest.raises(ValueError, match="method"):
        knn_dpfl.ballot_fn(2, C, "sort")


def test_feature_maps_use_public_data_only():
    rng = np.random.default_rng(8)
    public = rng.normal(size=(40, 2, 3, 1)).astype(np.float32)
    x = rng.normal(size=(5, 2, 3, 1)).astype(np.float32)
    ident = knn_dpfl.fit_feature_map("identity", jax.random.key(0), public, 4)
    np.testing.assert_allclose(ident.apply(x, lead=1), x.reshape(5, 6))
    rp = knn_dpfl.fit_feature_map("random_projection", jax.random.key(0), public, 4)
    rp2 = knn_dpfl.fit_feature_map("random_projection", jax.random.key(0), public * 3, 4)
    np.testing.assert_array_equal(rp.matrix, rp2.matrix)   # independent of any data
    assert rp.apply(x, lead=1).shape == (5, 4)
    pca = knn_dpfl.fit_feature_map("pca", jax.random.key(0), public, 3)
    flat = public.reshape(40, 6).astype(np.float64)
    cov = np.cov(flat - flat.mean(0), rowvar=False)
    top = np.linalg.eigh(cov)[1][:, ::-1][:, :3]
    np.testing.assert_allclose(np.abs(top.T @ pca.matrix), np.eye(3), atol=1e-4)
    np.testing.assert_allclose(pca.apply(x, lead=1),
                               (x.reshape(5, 6) - pca.mean) @ pca.matrix, atol=1e-5)
    with pytest.raises(ValueError, match="feature_dim"):
        knn_dpfl.fit_feature_map("pca", jax.random.key(0), public, 7)
    with pytest.raises(ValueError, match="feature_map"):
        knn_dpfl.fit_feature_map("autoencoder", jax.random.key(0), public, 2)


def test_config_and_k_validation():
    for kwargs, match in [({"k": 0}, "algorithm.k"), ({"sigma": -1.0}, "algorithm.sigma"),
                          ({"feature_map": "x"}, "feature_map"),
                          ({"instance_sensitivity": "tight"}, "instance_sensitivity"),
                          ({"num_queries": 0}, "num_queries"),
                          ({"student_steps": -1}, "student_steps"),
                          ({"agent_chunk": 0}, "agent_chunk")]:
        with pytest.raises(ValueError, match=match):
            knn_dpfl.Config(**kwargs)
    data = from_ragged(*_ragged(9, [5, 2, 4]))
    with pytest.raises(ValueError, match=r"algorithm.k must be in \[1, 2\].*agent 1"):
        knn_dpfl.check_k(3, data)
    assert knn_dpfl.check_k(2, data) == 2


def test_ledger_instance_and_agent_units_match_dp_accounting():
    cfg = knn_dpfl.Config(k=4, sigma=2.0, num_queries=50)
    ledger = knn_dpfl.ledger(cfg)
    for unit, z in (("instance", 2.0 * 4 / math.sqrt(2)), ("agent", 2.0)):
        acc = dp_accounting.rdp.RdpAccountant(list(accounting.DEFAULT_RDP_ORDERS))
        acc.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), 50))
        assert ledger.epsilon(unit, 1e-5) == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9)
    paper = knn_dpfl.ledger(knn_dpfl.Config(k=4, sigma=2.0, num_queries=50,
                                            instance_sensitivity="paper"))
    assert paper.epsilon("instance", 1e-5) > ledger.epsilon("instance", 1e-5)


def test_run_end_to_end_on_synthetic_beats_chance():
    from fedjax_dp.data import synthetic
    from fedjax_dp.train import accuracy
    ds = synthetic(num_train=400, num_public=120, num_test=200, num_features=8, num_classes=3,
                   seed=0)
    data = from_ragged(list(ds.x_train.reshape(8, 50, 8)), list(ds.y_train.reshape(8, 50)))
    model = make_model("logistic", (8,), 3)
    cfg = knn_dpfl.Config(k=5, sigma=0.5, num_queries=100, feature_map="identity",
                          student_steps=100, agent_chunk=3, query_chunk=40, data_dependent=True)
    res = run_voting(knn_dpfl, jax.random.key(0), data, model, cfg, ds.x_public)
    assert res.labels.shape == (100,) and res.clean_vote_sums.shape == (100, 3)
    assert np.mean(res.labels == ds.y_public[res.query_indices]) > 0.8
    assert accuracy(model, res.params, ds.x_test, ds.y_test) > 0.7
    # the aggregate noise draw: the same queries and clean sums, labels as accurate
    agg = run_voting(knn_dpfl, jax.random.key(0), data, model,
                     dataclasses.replace(cfg, vote_noise="aggregate"), ds.x_public)
    np.testing.assert_array_equal(agg.query_indices, res.query_indices)
    np.testing.assert_array_equal(agg.clean_vote_sums, res.clean_vote_sums)
    assert np.mean(agg.labels == ds.y_public[agg.query_indices]) > 0.8
    with pytest.raises(ValueError, match="algorithm.vote_noise"):
        knn_dpfl.Config(vote_noise="per_query")
    with pytest.raises(ValueError, match="num_queries"):
        run_voting(knn_dpfl, jax.random.key(0), data, model,
                     knn_dpfl.Config(k=5, num_queries=121), ds.x_public)
    with pytest.raises(ValueError, match="algorithm.k"):
        run_voting(knn_dpfl, jax.random.key(0), data, model, knn_dpfl.Config(k=51), ds.x_public)


def test_shipped_config_runs_end_to_end_tiny(tmp_path):
    cfg = config_lib.load(ROOT / "configs" / "knn_dpfl" / "mnist5k.toml",
                          ["data.num_agents=10", "algorithm.num_queries=20",
                           "algorithm.student_steps=5", "model.hidden=[8]",
                           "algorithm.feature_dim=8", "run.progress=false"])
    result = runner.run(cfg, tmp_path, progress=False)
    assert result["algorithm"] == "knn_dpfl" and 0 <= result["test_accuracy"] <= 1
    units = {(g["unit"], g["accountant"]): g for g in result["privacy"]}
    assert units[("instance", "rdp")]["data_dependent"] is False
    # no data-dependent epsilon unless the config opts in: the guarantees cover every release
    assert not any(g["data_dependent"] for g in result["privacy"])
    assert all(g["covers_all_releases"] for g in result["privacy"])
    assert units[("agent", "pld")]["epsilon"] > units[("instance", "pld")]["epsilon"]
    assert result["history"][0]["num_queries"] == 20
