"""Partitioners: disjointness, coverage, determinism, the FedKT Dirichlet rule and errors."""
import jax
import numpy as np
import pytest

from fedjax_dp.core.stacked import from_partition
from fedjax_dp.data import (PARTITIONS, by_domain, class_counts, dirichlet, iid, label_shards,
                            one_class, partition)

LABELS = np.repeat(np.arange(10), 100)  # 1000 records, 10 balanced classes
np.random.default_rng(0).shuffle(LABELS)


def assert_disjoint(parts, n, *, covers=False):
    assert all(p.dtype == np.int64 and p.ndim == 1 for p in parts)
    flat = np.concatenate(parts)
    assert len(np.unique(flat)) == len(flat), "an index is given to two agents"
    assert flat.min() >= 0 and flat.max() < n
    if covers:
        np.testing.assert_array_equal(np.sort(flat), np.arange(n))


def same(a, b):
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def label_skew(labels, parts):
    """Mean total-variation distance between each agent's label distribution and the global one."""
    counts = class_counts(labels, parts).astype(float)
    local = counts / counts.sum(1, keepdims=True)
    glob = np.bincount(labels) / len(labels)
    return 0.5 * np.abs(local - glob).sum(1).mean()


# ----------------------------------------------------------------------------------- iid

def test_iid():
    parts = iid(LABELS, 7, 0)
    assert len(parts) == 7
    assert_disjoint(parts, 1000, covers=True)
    assert {len(p) for p in parts} == {142,143}
    assert same(parts, iid(1000, 7, 0))  # labels or a count
    assert same(parts, iid(LABELS, 7, 0))
    assert not same(parts, iid(LABELS, 7, 1))
    key = jax.random.key(3)
    assert same(iid(LABELS, 7, key), iid(LABELS, 7, key))
    assert not same(iid(LABELS, 7, key), iid(LABELS, 7, jax.random.key(4)))
    assert label_skew(LABELS, parts) < 0.15


@pytest.mark.parametrize("args, match", [
    ((LABELS, 0, 0), "num_agents must be in"), ((5, 6, 0), r"num_agents must be in \[1, 5\]"),
    ((LABELS, 2, None), "seed_or_key"), ((LABELS, 2, -1), "seed_or_key"),
    ((LABELS, 2, "abc"), "seed_or_key"), ((0, 1, 0), "labels_or_n"),
    ((np.zeros((3, 2)), 1, 0), "1-D"),
])
def test_iid_errors(args, match):
    with pytest.raises(ValueError, match=match):
        iid(*args)


# ------------------------------------------------------------------------------ dirichlet

def test_dirichlet_covers_and_is_deterministic():
    parts = dirichlet(LABELS, 10, 0.5, 0)
    assert len(parts) == 10
    assert_disjoint(parts, 1000, covers=True)
    assert min(len(p) for p in parts) >= 10
    assert same(parts, dirichlet(LABELS, 10, 0.5, 0))
    assert not same(parts, dirichlet(LABELS, 10, 0.5, 1))
    key = jax.random.key(0)
    assert same(dirichlet(LABELS, 10, 0.5, key), dirichlet(LABELS, 10, 0.5, key))


def reference_dirichlet(labels, n_parties, beta, seed, min_size_req=10):
    """An independent transcription of the NIID-Bench / FedKT loop (np.random.Generator)."""
    rng = np.random.default_rng(seed)
    N, K = len(labels), labels.max() + 1
    min_size = 0
    while min_size < min_size_req:
        idx_batch = [[] for _ in range(n_parties)]
        for k in range(K):
            idx_k = np.where(labels == k)[0]
            rng.shuffle(idx_k)
            proportions = rng.dirichlet(np.repeat(beta, n_parties))
            proportions = np.array([p * (len(idx_j) < N / n_parties)
                                    for p, idx_j in zip(proportions, idx_batch)])
            proportions = proportions / proportions.sum()
            proportions = (np.cumsum(proportions) * len(idx_k)).astype(int)[:-1]
            idx_batch = [idx_j + idx.tolist()
                         for idx_j, idx in zip(idx_batch, np.split(idx_k, proportions))]
            min_size = min(len(idx_j) for idx_j in idx_batch)
    return [np.sort(np.array(b, dtype=np.int64)) for b in idx_batch]


@pytest.mark.parametrize("beta, seed", [(0.5, 0), (0.1, 3), (5.0, 7)])
def test_dirichlet_matches_reference_loop(beta, seed):
    assert same(dirichlet(LABELS, 10, beta, seed), reference_dirichlet(LABELS, 10, beta, seed))


def test_dirichlet_cap_rule_limits_large_agents():
    # Zeroing p_j for agents holding >= N/n means an agent can only exceed N/n within one class.
    parts = dirichlet(LABELS, 10, 0.1, 5)
    assert max(len(p) for p in parts) < 1000 / 10 + 100  # at most one class (100) past the cap


def test_dirichlet_heterogeneity_responds_to_beta():
    skew = {beta: np.mean([label_skew(LABELS, dirichlet(LABELS, 10, beta, s))
                           for s in range(5)]) for beta in (0.1, 1.0, 100.0)}
    assert skew[0.1] > skew[1.0] > skew[100.0]
    assert skew[0.1] > 0.5 and skew[100.0] < 0.15


def test_dirichlet_min_size():
    parts = dirichlet(LABELS, 20, 0.3, 0, min_size=30)
    assert min(len(p) for p in parts) >= 30
    assert_disjoint(parts, 1000, covers=True)
    with pytest.raises(ValueError, match="min_size=60 cannot be met"):
        dirichlet(LABELS, 20, 0.3, 0, min_size=60, max_tries=3)
    with pytest.raises(ValueError, match="min_size=200 cannot be met: 10 agents"):
        dirichlet(LABELS, 10, 0.5, 0, min_size=200)


@pytest.mark.parametrize("kwargs, match", [
    ({"beta": 0.0}, "beta must be > 0"), ({"beta": -1.0}, "beta"),
    ({"beta": float("inf")}, "beta must be finite"), ({"num_agents": 0}, "num_agents"),
    ({"num_agents": 1001}, "num_agents"), ({"min_size": -1}, "min_size"),
    ({"max_tries": 0}, "max_tries"), ({"labels": np.array([0, -1, 2])}, "labels must be >= 0"),
    ({"labels": np.array([0.5, 1.0])}, "labels must hold integers"),
])
def test_dirichlet_errors(kwargs, match):
    args = {"labels": LABELS, "num_agents": 10, "beta": 0.5, "seed_or_key": 0, **kwargs}
    with pytest.raises(ValueError, match=match):
        dirichlet(**args)


# --------------------------------------------------------------------------- label_shards

@pytest.mark.parametrize("num_agents, c", [(10, 6), (7, 3), (20, 2), (3, 10)])
def test_label_shards_exact_classes_and_balance(num_agents, c):
    parts = label_shards(LABELS, num_agents, c, 0)
    assert_disjoint(parts, 1000)
    counts = class_counts(LABELS, parts)
    assert np.all((counts > 0).sum(1) == c), "every agent holds exactly c classes"
    holders = (counts > 0).sum(0)  # how many agents hold each class
    assert holders.max() - holders.min() <= 1  # classes used about equally
    # Every held class is fully distributed, near-equally among its holders.
    for k in range(10):
        if holders[k]:
            assert counts[:, k].sum() == 100
            held = counts[:, k][counts[:, k] > 0]
            assert held.max() - held.min() <= 1


def test_label_shards_samples_per_agent_and_determinism():
    parts = label_shards(LABELS, 10, 6, 0, samples_per_agent=50)
    assert [len(p) for p in parts] == [50] * 10
    counts = class_counts(LABELS, parts)
    assert np.all((counts > 0).sum(1) == 6)
    assert set(counts[counts > 0].tolist()) == {8, 9}  # 50 = 6 * 8 + 2
    assert_disjoint(parts, 1000)
    assert same(parts, label_shards(LABELS, 10, 6, 0, samples_per_agent=50))
    assert not same(parts, label_shards(LABELS, 10, 6, 1, samples_per_agent=50))


def test_label_shards_errors():
    with pytest.raises(ValueError, match=r"classes_per_agent must be in \[1, 10\]"):
        label_shards(LABELS, 10, 11, 0)
    with pytest.raises(ValueError, match="classes_per_agent"):
        label_shards(LABELS, 10, 0, 0)
    with pytest.raises(ValueError, match="samples_per_agent must be >= 6"):
        label_shards(LABELS, 10, 6, 0, samples_per_agent=5)
    with pytest.raises(ValueError, match="holders need"):
        label_shards(LABELS, 10, 6, 0, samples_per_agent=200)
    tiny = np.array([0, 0, 1, 1, 1, 1, 1, 1])
    with pytest.raises(ValueError, match="class 0 has 2 records but 4 agents hold it"):
        label_shards(tiny, 8, 1, 0)


def test_one_class():
    parts = one_class(LABELS, 10, 0)
    counts = class_counts(LABELS, parts)
    assert np.all((counts > 0).sum(1) == 1)
    assert sorted(np.argmax(counts, 1).tolist()) == list(range(10))  # a different class each
    assert_disjoint(parts, 1000, covers=True)
    pairs = one_class(LABELS, 5, 0, classes_per_agent=2)
    assert np.all((class_counts(LABELS, pairs) > 0).sum(1) == 2)
    with pytest.raises(ValueError, match="classes_per_agent"):
        one_class(LABELS, 5, 0, classes_per_agent=3)


# ------------------------------------------------------------------------------ by_domain

def test_by_domain():
    domains = np.array([2] * 6 + [0] * 4 + [5] * 5)
    parts = by_domain(domains)
    assert [p.tolist() for p in parts] == [list(range(6, 10)), list(range(6)),
                                           list(range(10, 15))]  # domains in order 0, 2, 5
    split = by_domain(domains, 0, agents_per_domain=2)
    assert len(split) == 6
    assert_disjoint(split, 15, covers=True)
    for i, d in enumerate([0, 0, 2, 2, 5, 5]):
        assert np.all(domains[split[i]] == d)
    assert same(split, by_domain(domains, 0, agents_per_domain=2))
    assert [len(p) for p in split] == [2, 2, 3, 3, 3, 2]
    with pytest.raises(ValueError, match="domain 0 has 4 records, fewer than agents_per_domain=5"):
        by_domain(domains, 0, agents_per_domain=5)
    with pytest.raises(ValueError, match="agents_per_domain"):
        by_domain(domains, agents_per_domain=0)


# ------------------------------------------------------------------------------- registry

def test_registry_dispatch():
    assert set(PARTITIONS) == {"iid", "dirichlet", "label_shards", "one_class", "by_domain",
                               "natural"}
    assert same(partition("iid", LABELS, 4, 0), iid(LABELS, 4, 0))
    assert same(partition("dirichlet", LABELS, 10, 1, beta=0.5), dirichlet(LABELS, 10, 0.5, 1))
    assert same(partition("label_shards", LABELS, 10, 2, classes_per_agent=6),
                label_shards(LABELS, 10, 6, 2))
    domains = np.arange(1000) % 2
    assert same(partition("by_domain", LABELS, 4, 0, domains=domains),
                by_domain(domains, 0, agents_per_domain=2))
    with pytest.raises(ValueError, match="multiple of the number of domains"):
        partition("by_domain", LABELS, 3, 0, domains=domains)
    with pytest.raises(ValueError, match=r"unknown partition 'shards'.*'dirichlet'"):
        partition("shards", LABELS, 4, 0)
    with pytest.raises(ValueError, match="bad arguments for partition 'dirichlet'"):
        partition("dirichlet", LABELS, 4, 0)  # beta missing


def test_partition_feeds_stacked_data():
    x = np.arange(1000, dtype=np.float32)[:, None]
    parts = dirichlet(LABELS, 5, 0.5, 0)
    stacked = from_partition(x, LABELS, parts)
    assert stacked.num_agents == 5
    np.testing.assert_array_equal(np.asarray(stacked.counts), [len(p) for p in parts])
    xi, yi = stacked.local(2)
    np.testing.assert_array_equal(xi[:, 0], parts[2])
    np.testing.assert_array_equal(yi, LABELS[parts[2]])
