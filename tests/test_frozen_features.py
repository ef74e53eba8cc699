"""Frozen features (``data.features``, fedjax_dp/data/features.py) and the harder options of the
``synthetic`` source (issue 25, Voting DPFL fair controls).

* the map is fitted on the PUBLIC split only: other private training records give the same map;
* the mapped splits equal a direct computation (PCA from the public covariance's eigenvectors,
  a random projection from its key), streamed or not, and kNN-DPFL uses the same map (no copy);
* a head-only DP-FedAvg run on frozen features goes through the runner (linear head of the
  map's width) and its privacy accounting is the one without features;
* ``synthetic``'s defaults are the old generator's values, bit for bit (reference below);
* bad options are refused naming the key.
"""
import copy

import jax
import numpy as np
import pytest

from fedjax_dp.algorithms.voting import knn_dpfl
from fedjax_dp.data import features, sources
from fedjax_dp.experiments import calibrate
from fedjax_dp.experiments import config as config_lib
from fedjax_dp.data import population
from fedjax_dp.experiments import runner

SMALL = dict(num_train=120, num_public=40, num_test=30, num_features=6, num_classes=3)


def _resolved(**data) -> dict:
    raw = {"data": {"dataset": "synthetic", "dataset_options": dict(SMALL), "num_agents": 4,
                    **data},
           "model": {"name": "logistic"},
           "train": {"steps": 2, "batch_size": 8},
           "algorithm": {"name": "dp_fedavg", "rounds": 2, "sampling_rate": 1.0,
                         "clip_norm": 1.0, "noise_multiplier": 1.0},
           "privacy": {"accountants": ["rdp"]},
           "run": {"progress": False, "checkpoint_every": 0, "compilation_cache": "off"}}
    return config_lib.resolve(raw)


def test_the_map_reads_only_the_public_split():
    spec = {"map": "pca", "dim": 3}
    a = population.build(_resolved(features=spec))
    other = dict(SMALL, num_train=200)                 # other private records, same public split
    b = population.build(_resolved(features=spec, dataset_options=other))
    raw_a = sources.synthetic(**SMALL)
    raw_b = sources.synthetic(**other)
    assert np.array_equal(raw_a.x_public, raw_b.x_public)
    assert not np.array_equal(raw_a.x_train[:100], raw_b.x_train[:100])
    np.testing.assert_array_equal(a.dataset.x_public, b.dataset.x_public)
    np.testing.assert_array_equal(a.dataset.x_test, b.dataset.x_test)
    # the same for a Dataset whose training features are replaced outright
    ds = sources.synthetic(**SMALL)
    phi = features.fit(spec, ds.x_public)
    changed = ds.__class__(**{**{f: getattr(ds, f) for f in ("name", "y_train", "x_public",
                                                            "y_public", "x_test", "y_test",
                                                            "num_classes")},
                              "x_train": ds.x_train * -3.0 + 1.0})
    out = features.frozen(changed, spec)
    np.testing.assert_array_equal(out.x_public, phi.transform(ds.x_public))
    np.testing.assert_array_equal(out.x_train, phi.transform(changed.x_train))


def test_mapped_splits_equal_a_direct_computation():
    ds = sources.synthetic(**SMALL)
    pub = ds.x_public.astype(np.float64)
    mu = pub.mean(0)
    w, v = np.linalg.eigh(np.cov(pub - mu, rowvar=False))            # ascending eigenvalues
    top = v[:, ::-1][:, :3]                                           # [D, 3]
    out = features.frozen(ds, {"map": "pca", "dim": 3})
    direct = (ds.x_train - mu) @ top                                  # [n, 3], up to signs
    signs = np.sign(np.sum(out.x_train * direct, axis=0))
    np.testing.assert_allclose(out.x_train, direct * signs, atol=1e-4)
    np.testing.assert_allclose(out.x_test, ((ds.x_test - mu) @ top) * signs, atol=1e-4)
    assert out.feature_shape == (3,) and out.name == "synthetic+pca3"
    # a random projection: x @ G / sqrt(m), G from the seed's key
    rp = features.frozen(ds, {"map": "random_projection", "dim": 2, "seed": 5})
    g = np.asarray(jax.random.normal(jax.random.key(5), (6, 2)))
    np.testing.assert_allclose(rp.x_public, ds.x_public @ g / np.sqrt(2), rtol=1e-5, atol=1e-5)
    # streamed: each training block mapped, the same values
    streamed = features.frozen(sources.synthetic_stream(**SMALL), {"map": "pca", "dim": 3})
    np.testing.assert_allclose(streamed.materialize().x_train, out.x_train, atol=1e-6)
    # kNN-DPFL votes with the same map (one implementation) and its traced apply agrees
    assert knn_dpfl.FeatureMap is features.FeatureMap
    assert knn_dpfl.fit_feature_map is features.fit_feature_map
    phi = features.fit({"map": "pca", "dim": 3}, ds.x_public)
    np.testing.assert_allclose(np.asarray(phi.apply(ds.x_test, lead=1)), phi.transform(ds.x_test),
                               atol=1e-5)


def test_head_only_dp_fedavg_on_frozen_features_through_the_runner():
    cfg = _resolved(features={"map": "pca", "dim": 4}, validation_fraction=0.2)
    result = runner.run(cfg)
    assert result["dataset"] == "synthetic+pca4"
    assert 0.0 <= result["test_accuracy"] <= 1.0 and "val_accuracy" in result
    s = runner.setup(cfg)
    assert s.model.feature_shape == (4,)
    assert sum(leaf.size for leaf in jax.tree.leaves(s.model.init(jax.random.key(0)))) \
        == 4 * 3 + 3                                            # the linear head: W [4, 3], b [3]
    # the map uses public data only: the accounting is the one planned for the raw features
    (agent,) = [g["epsilon"] for g in result["privacy"] if g["unit"] == "agent"]
    assert agent > 0 and agent == pytest.approx(calibrate.planned_epsilon(_resolved(), "agent"),
                                                rel=1e-9)


def _old_synthetic(num_train=1000, num_public=200, num_test=200, num_features=20,
                   num_classes=10, seed=0, separation=3.0, num_domains=1, domain_shift=1.0):
    """The generator as it was before the harder options (reference for bit-identity)."""
    streams = [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(4)]
    directions = streams[0].normal(size=(num_classes, num_features))
    norms = np.linalg.norm(directions, axis=1, keepdims=True)
    means = separation * directions / np.where(norms > 0, norms, 1.0)
    offsets = domain_shift * streams[0].normal(size=(num_domains, num_features))

    def split(rng, n):
        y = rng.permutation(np.arange(n) % num_classes).astype(np.int32)
        dom = rng.permutation(np.arange(n) % num_domains).astype(np.int64)
        x = rng.normal(size=(n, num_features)) + means[y]
        if num_domains > 1:
            x = x + offsets[dom]
        return x.astype(np.float32), y, (dom if num_domains > 1 else None)
    return [split(streams[i], n) for i, n in ((1, num_train), (2, num_public), (3, num_test))]


@pytest.mark.parametrize("options", [{}, dict(num_train=50, num_features=4, num_classes=3,
                                              seed=3, separation=1.5, num_domains=2)])
def test_synthetic_defaults_are_unchanged(options):
    ds = sources.synthetic(**options)
    (xt, yt, dt), (xp, yp, _), (xs, ys, _) = _old_synthetic(**options)
    for got, want in ((ds.x_train, xt), (ds.y_train, yt), (ds.x_public, xp), (ds.y_public, yp),
                      (ds.x_test, xs), (ds.y_test, ys)):
        assert got.dtype == want.dtype and np.array_equal(got, want)
    assert (ds.domain_train is None) == (dt is None)
    same = sources.synthetic(**options, clusters_per_class=1, num_informative=0)
    assert np.array_equal(same.x_train, ds.x_train)


def test_harder_synthetic_options():
    ds = sources.synthetic(num_train=600, num_public=0, num_test=0, num_features=8,
                           num_classes=3, clusters_per_class=2, num_informative=2, seed=1)
    assert np.array_equal(np.bincount(ds.y_train), [200, 200, 200])           # still balanced
    for c in range(3):                                 # no signal beyond the first 2 coordinates
        assert np.abs(ds.x_train[ds.y_train == c, 2:].mean(0)).max() < 0.35
    # two clusters per class: the class mean is not the clusters' (the within-class spread grows)
    spread = np.mean([ds.x_train[ds.y_train == c, :2].var(0).sum() for c in range(3)])
    assert spread > 2.0 + 0.5                          # unit noise alone: 2.0


@pytest.mark.parametrize("features_table, match", [
    ({"map": "svd", "dim": 2}, r"data\.features\.map"),
    ({"map": "pca"}, r"data\.features\.dim"),
    ({"map": "pca", "dim": 0}, r"data\.features\.dim"),
    ({"map": "pca", "dim": 2, "width": 3}, r"data\.features\.width"),
    ({"dim": 2}, r"data\.features\.map"),
    ("pca", r"data\.features"),
])
def test_bad_feature_options_name_the_key(features_table, match):
    with pytest.raises(config_lib.ConfigError, match=match):
        _resolved(features=features_table)


def test_bad_options_found_when_building_name_the_key(tmp_path):
    with pytest.raises(config_lib.ConfigError, match=r"data\.features\.dim must be <= the input "
                                                     r"dimension 6"):
        population.build(_resolved(features={"map": "pca", "dim": 7}))
    cfg = copy.deepcopy(_resolved())
    population.save(cfg, tmp_path / "pop")
    stacked = _resolved(dataset=f"stacked:{tmp_path / 'pop'}", dataset_options={},
                        features={"map": "pca", "dim": 2})
    with pytest.raises(config_lib.ConfigError, match=r"data\.features cannot be used with a "
                                                     r"stacked population"):
        population.build(stacked)
    with pytest.raises(ValueError, match="num_informative must be in"):
        sources.synthetic(num_features=4, num_informative=5)
    with pytest.raises(ValueError, match="clusters_per_class"):
        sources.synthetic(clusters_per_class=0)


def test_network_map_trained_on_a_disjoint_labelled_public_dataset():
    """``map = "network"``: the hidden layer of an MLP trained on another dataset (here wbcd's 30
    features for a 30-feature generated task); the task's own splits are not read to fit it."""
    spec = {"map": "network", "dim": 4, "source": "wbcd", "steps": 30, "learning_rate": 0.5}
    ds = sources.synthetic(**dict(SMALL, num_features=30))
    phi = features.fit(spec, ds.x_public)
    again = features.fit(spec, ds.x_public[:5] * 7.0)       # other public records: same map
    np.testing.assert_array_equal(phi.matrix, again.matrix)
    out = features.frozen(ds, spec)
    direct = np.maximum(ds.x_train @ phi.matrix + phi.bias, 0.0)
    np.testing.assert_allclose(out.x_train, direct, rtol=1e-5, atol=1e-5)
    assert out.name == "synthetic+network4" and out.feature_shape == (4,)
    np.testing.assert_allclose(np.asarray(phi.apply(ds.x_test, lead=1)), phi.transform(ds.x_test),
                               atol=1e-5)
    for bad, match in (({"map": "network", "dim": 4}, r"data\.features\.source is required"),
                       ({"map": "pca", "dim": 2, "source": "wbcd"}, r"data\.features\.source"),
                       ({"map": "network", "dim": 4, "source": "wbcd", "steps": 0},
                        r"data\.features\.steps")):
        with pytest.raises(config_lib.ConfigError, match=match):
            _resolved(features=bad)
    with pytest.raises(ValueError, match=r"data\.features\.source 'wbcd' has feature shape"):
        features.frozen(sources.synthetic(**SMALL), spec)
