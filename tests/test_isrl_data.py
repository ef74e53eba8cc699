"""Data for the ISRL-DP experiments: mnist5k odd/even (PCA, parity, 25 digit pairs), WBCD."""
import numpy as np
import pytest
import threadpoolctl

from fedjax_dp.data import (DATASETS, class_counts, mnist5k, mnist5k_oddeven, oddeven_pair_id,
                            partition, wbcd)

SEED = 1


@pytest.fixture(scope="module")
def oddeven():
    return mnist5k_oddeven(seed=SEED)


@pytest.fixture(scope="module")
def raw():
    return mnist5k(seed=SEED)           # the same split, images and digit labels


def test_shapes_labels_and_registry(oddeven, raw):
    ds = oddeven
    assert ds.name == "mnist5k_oddeven" and ds.num_classes == 2
    assert (ds.x_train.shape, ds.x_public.shape, ds.x_test.shape) == ((3000, 50), (1000, 50),
                                                                      (1000, 50))
    for split in ("train", "public", "test"):
        np.testing.assert_array_equal(getattr(ds, f"y_{split}"), getattr(raw, f"y_{split}") % 2)
    assert ds.domain_train.shape == (3000,) and ds.domain_train.dtype == np.int64
    assert DATASETS["mnist5k_oddeven"] is mnist5k_oddeven
    assert mnist5k_oddeven(seed=SEED, pca_dim=8).x_test.shape == (1000, 8)
    with pytest.raises(ValueError, match="pca_dim"):
        mnist5k_oddeven(pca_dim=0)
    with pytest.raises(ValueError, match="standardize"):
        mnist5k_oddeven(standardize="yes")


def test_pca_is_fitted_on_the_public_split_only(oddeven, raw):
    # An independent PCA: eigenvectors of the public split's covariance; every split is
    # projected with the public mean and these directions (equal up to each component's sign).
    flat = lambda x: x.reshape(len(x), -1).astype(np.float64)
    pub = flat(raw.x_public)
    mean = pub.mean(0)
    with threadpoolctl.threadpool_limits(limits=1, user_api="blas"):   # small; avoid contention
        vals, vecs = np.linalg.eigh(np.cov(pub, rowvar=False))
    top = vecs[:, np.argsort(vals)[::-1][:50]]                            # [784, 50]
    for split in ("train", "public", "test"):
        want = (flat(getattr(raw, f"x_{split}")) - mean) @ top           # [n, 50]
        got = getattr(oddeven, f"x_{split}").astype(np.float64)
        signs = np.sign(np.sum(want * got, axis=0))
        np.testing.assert_allclose(got, want * signs, atol=2e-3)
    # The PCA's centring is the public mean: public features are centred, the others are not.
    assert np.abs(oddeven.x_public.mean(0)).max() < 1e-4
    assert np.abs(oddeven.x_train.mean(0)).max() > 1e-3
    # Standardised: unit variance on the public split (its statistics only).
    std = mnist5k_oddeven(seed=SEED, standardize=True)
    np.testing.assert_allclose(std.x_public.std(0), 1.0, rtol=1e-4)
    np.testing.assert_allclose(std.x_test * oddeven.x_public.std(0), oddeven.x_test,
                               rtol=1e-4, atol=1e-5)


def test_by_domain_gives_one_even_odd_pair_per_silo(oddeven, raw):
    digits = raw.y_train
    parts = partition("by_domain", oddeven.y_train, 25, 0, domains=oddeven.domain_train)
    assert len(parts) == 25
    assert sorted(np.concatenate(parts).tolist()) == list(range(3000))
    pairs = []
    for part in parts:
        held = np.unique(digits[part])
        assert len(held) == 2 and held[0] % 2 != held[1] % 2      # one even, one odd digit
        even, odd = sorted(held, key=lambda d: d % 2)
        assert np.all(oddeven.domain_train[part] == oddeven_pair_id(even, odd))
        counts = class_counts(oddeven.y_train[part], [np.arange(len(part))], 2)[0]
        assert counts.min() >= 50                                 # ~60 of each digit (300 / 5)
        pairs.append((int(even), int(odd)))
    assert len(set(pairs)) == 25                                  # all (even, odd) pairs
    # Each digit's records are spread over its 5 pairs evenly (round-robin), from the seed.
    for d in range(10):
        sizes = np.bincount(oddeven.domain_train[digits == d], minlength=25)
        assert np.count_nonzero(sizes) == 5 and sizes.max() - sizes[sizes > 0].min() <= 1
    np.testing.assert_array_equal(mnist5k_oddeven(seed=SEED, pca_dim=2).domain_train,
                                  oddeven.domain_train)
    assert not np.array_equal(mnist5k_oddeven(seed=SEED + 1, pca_dim=2).domain_train[:200],
                              oddeven.domain_train[:200])


def test_wbcd_one_class_two_silos():
    ds = wbcd()
    for seed in (0, 1):
        parts = partition("one_class", ds.y_train, 2, seed)
        labels = sorted(set(np.unique(ds.y_train[p]).tolist()) for p in parts)
        assert labels == [{0}, {1}]                     # one malignant-only, one benign-only
        assert sorted(np.concatenate(parts).tolist()) == list(range(len(ds.y_train)))
