"""FedProx's Synthetic(alpha, beta) generator (Li et al. 2020, Section 5.1) and the natural
partition: statistics against the published generator's formulas, determinism, bad input."""
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from fedjax_dp.data.fedprox_synthetic import (MIN_SIZE, SIZE_MU, SIZE_SIGMA, feature_variances,
                                              fedprox_synthetic)
from fedjax_dp.data.partition import natural, partition
from fedjax_dp.data.sources import DATASETS, load_dataset
from fedjax_dp.experiments import config as config_lib
from fedjax_dp.data import population


@pytest.fixture(scope="module")
def het():
    return fedprox_synthetic(alpha=1.0, beta=1.0, seed=0)       # the published Synthetic(1, 1)


@pytest.fixture(scope="module")
def iid():
    return fedprox_synthetic(iid=True, seed=0)


def _label_table(ds, num_clients: int) -> np.ndarray:
    """[K, C] training-label counts per client."""
    table = np.zeros((num_clients, ds.num_classes), np.int64)
    np.add.at(table, (ds.domain_train, ds.y_train), 1)
    return table


def _mean_label_entropy(ds, num_clients: int) -> float:
    p = _label_table(ds, num_clients)
    p = p / p.sum(1, keepdims=True)
    return float(-(p * np.log(np.where(p > 0, p, 1.0))).sum(1).mean())


def test_published_shape_and_split(het):
    assert DATASETS["fedprox_synthetic"] is fedprox_synthetic
    assert het.feature_shape == (60,) and het.num_classes == 10
    assert het.name == "fedprox_synthetic(1,1)"
    counts = np.bincount(het.domain_train, minlength=30)                 # [30] train records
    assert len(counts) == 30 and np.all(np.diff(het.domain_train) >= 0)  # client after client
    # every client holds >= 50 records and keeps int(0.9 n_k) >= 45 of them for training
    assert counts.min() >= math.floor(0.9 * MIN_SIZE)
    # t_k = int(0.9 n_k) gives n_k in [t_k / 0.9, (t_k + 1) / 0.9): the test split, the other
    # n_k - t_k records of every client, holds between sum t_k / 9 and that + 30 / 0.9 records
    assert counts.sum() / 9 <= het.sizes["test"] < counts.sum() / 9 + 30 / 0.9
    assert 0 < het.sizes["public"] and het.y_public.max() < 10


def test_client_sizes_follow_the_published_lognormal():
    """n_k = floor(exp(N(4, 2^2))) + 50: P(n_k >= m) = 1 - Phi((ln(m - 50) - 4) / 2). The
    largest gap between the empirical and this survival function over 3000 clients (a
    Kolmogorov-Smirnov distance; 1% critical value 0.030) rules out e.g. sigma 1.5 or 2.5
    (gaps 0.069, 0.054) and mu 3.5 or 4.5 (0.099)."""
    K = 3000
    ds = fedprox_synthetic(num_clients=K, num_features=2, seed=3, train_fraction=0.5,
                           public_clients=0)
    half = np.bincount(ds.domain_train, minlength=K)    # floor(n_k / 2): n_k >= 2t iff half >= t
    assert half.min() >= MIN_SIZE // 2
    m = np.unique(np.round(np.geomspace(52, 20000, 60) / 2).astype(int) * 2)   # even sizes
    expected = 1 - stats.norm.cdf((np.log(m - MIN_SIZE) - SIZE_MU) / SIZE_SIGMA)
    empirical = (half[None, :] >= m[:, None] // 2).mean(1)
    assert np.abs(empirical - expected).max() < 0.035


def test_features_have_the_stated_covariance_and_means(het, iid):
    """x ~ N(v_k, diag(j^-1.2)); v_k ~ N(B_k, 1) with B_k ~ N(0, beta^2); IID: v_k = 0."""
    sigma2 = feature_variances(60)
    assert np.allclose(sigma2[:3], [1.0, 2 ** -1.2, 3 ** -1.2])
    for ds in (het, iid):
        x, c = ds.x_train.astype(np.float64), ds.domain_train
        means = np.zeros((30, 60))
        np.add.at(means, c, x)
        means /= np.bincount(c)[:, None]
        within = ((x - means[c]) ** 2).mean(0)                 # [60] within-client variance
        assert np.all(np.abs(within / sigma2 - 1) < 0.15)
    # IID: every client's mean is 0 (within 5 standard errors)
    x = iid.x_train.astype(np.float64)
    assert np.all(np.abs(x.mean(0)) < 5 * np.sqrt(sigma2 / len(x)))
    # non-IID: the clients' means spread with variance 1 + beta^2 (200 clients, paired draws)
    for beta in (0.0, 2.0):
        ds = fedprox_synthetic(beta=beta, num_clients=200, num_features=10, seed=1,
                               public_clients=0)
        m = np.zeros((200, 10))
        np.add.at(m, ds.domain_train, ds.x_train.astype(np.float64))
        m /= np.bincount(ds.domain_train)[:, None]
        assert abs(m.var() / (1 + beta ** 2) - 1) < 0.25, beta


def test_label_distributions_heterogeneous_for_1_1_and_homogeneous_for_iid(het, iid):
    """Chi-square test of homogeneity of the clients' label distributions."""
    def p_value(ds):
        table = _label_table(ds, 30)
        table = table[:, table.sum(0) > 0]
        return stats.chi2_contingency(table).pvalue
    assert p_value(het) < 1e-100
    assert p_value(iid) > 1e-3
    assert _mean_label_entropy(iid, 30) > 2 * _mean_label_entropy(het, 30)


def test_heterogeneity_ordering_and_alpha_leaves_labels_unchanged(het):
    """IID < Synthetic(0, 0) < Synthetic(1, 1) in label heterogeneity (mean per-client label
    entropy falls; IID is checked above); u_k ~ N(0, alpha^2) shifts every logit equally, so
    alpha changes no label."""
    K = 200
    d00 = fedprox_synthetic(alpha=0.0, beta=0.0, num_clients=K, seed=2, public_clients=0)
    d11 = fedprox_synthetic(alpha=1.0, beta=1.0, num_clients=K, seed=2, public_clients=0)
    assert _mean_label_entropy(d00, K) > _mean_label_entropy(d11, K) + 0.03
    d01 = fedprox_synthetic(alpha=0.0, beta=1.0, seed=0)       # het is Synthetic(1, 1), seed 0
    assert np.array_equal(d01.x_train, het.x_train)
    assert np.mean(d01.y_train == het.y_train) > 0.999
    d51 = fedprox_synthetic(alpha=5.0, beta=1.0, seed=0)
    assert np.mean(d51.y_train == het.y_train) > 0.999


def test_determinism_and_independent_public_stream(het):
    again = fedprox_synthetic(alpha=1.0, beta=1.0, seed=0)
    for f in ("x_train", "y_train", "x_test", "y_test", "x_public", "domain_train"):
        assert np.array_equal(getattr(het, f), getattr(again, f)), f
    other = fedprox_synthetic(seed=1)
    assert not np.array_equal(other.y_train[:100], het.y_train[:100]) or \
        other.sizes != het.sizes
    no_public = fedprox_synthetic(seed=0, public_clients=0)
    assert no_public.sizes["public"] == 0
    assert np.array_equal(no_public.x_train, het.x_train)
    assert np.array_equal(no_public.x_test, het.x_test)
    assert np.array_equal(load_dataset("fedprox_synthetic").y_train, het.y_train)


def test_natural_partition_one_agent_per_client(het):
    parts = partition("natural", het.y_train, 30, 0, domains=het.domain_train)
    assert len(parts) == 30
    for k, p in enumerate(parts):
        assert np.array_equal(p, np.flatnonzero(het.domain_train == k))
    # unordered, non-contiguous ids: agents ordered by id, each with exactly its records
    ids = np.array([7, 3, 7, 9, 3, 3])
    assert [p.tolist() for p in natural(ids)] == [[1, 4, 5], [0, 2], [3]]
    with pytest.raises(ValueError, match=r"num_agents must equal the number of clients \(3\)"):
        natural(ids, 4)
    with pytest.raises(ValueError, match="domains"):
        partition("natural", het.y_train, 30, 0)
    # from a config's [data] table: the dataset's own client ids, num_agents checked
    d = {"partition": "natural", "partition_options": {}, "num_agents": 30}
    got = population.partition_indices(d, het, 0)
    assert all(np.array_equal(a, b) for a, b in zip(got, parts))
    with pytest.raises(config_lib.ConfigError, match=r"data\.num_agents must equal .* \(30\)"):
        population.partition_indices(dict(d, num_agents=10), het, 0)
    no_domains = load_dataset("synthetic", num_train=20, num_public=0, num_test=0)
    with pytest.raises(config_lib.ConfigError, match='"natural" needs a dataset with training'):
        population.partition_indices(d, no_domains, 0)


@pytest.mark.parametrize("kwargs, match", [
    (dict(alpha=-1.0), r"alpha must be a finite number >= 0"),
    (dict(beta=float("nan")), r"beta must be a number"),
    (dict(beta=float("inf")), r"beta must be a finite number >= 0"),
    (dict(iid=True, alpha=1.0), r"alpha must be 0 or unset with iid=True"),
    (dict(iid=1), r"iid must be a bool"),
    (dict(num_clients=0), r"num_clients must be >= 1"),
    (dict(num_features=0), r"num_features must be in \[1, 65536\]"),
    (dict(num_classes=1), r"num_classes must be in \[2, 65536\]"),
    (dict(seed=-1), r"seed must be >= 0"),
    (dict(train_fraction=1.0), r"train_fraction must be in \[0.02, 1\)"),
    (dict(public_clients=-1), r"public_clients must be >= 0"),
])
def test_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        fedprox_synthetic(**kwargs)


def test_shipped_config_builds_one_agent_per_client(het):
    """configs/fedavg/synthetic_1_1.toml's population (no training): agent k holds exactly
    client k's training records, in their order."""
    path = Path(__file__).resolve().parents[1] / "configs" / "fedavg" / "synthetic_1_1.toml"
    config = config_lib.load(path, ["run.agents_on=\"host\""])
    assert config["data"]["partition"] == "natural"
    agents = population.build(config).agents
    counts = np.bincount(het.domain_train)
    assert np.array_equal(np.asarray(agents.counts), counts)
    x = np.asarray(agents.x)
    for k in (0, int(np.argmax(counts)), 29):
        assert np.array_equal(x[k, :counts[k]], het.x_train[het.domain_train == k])
    with pytest.raises(config_lib.ConfigError, match=r"data\.num_agents must equal"):
        population.build(config_lib.load(path, ["data.num_agents=10"]))
