"""File loaders (npz, IDX, LIBSVM, CSV), dataset_from_arrays and the TFDS adapter.

Every fixture is generated into tmp_path; nothing is downloaded.
"""
import gzip
import struct
import sys

import numpy as np
import pytest

from fedjax_dp.data import (dataset_from_arrays, load_csv, load_dataset, load_idx, load_libsvm,
                            load_npz, load_tfds, read_idx)


def write_idx(path, array: np.ndarray, *, compress: bool = False, type_code: int = None):
    """Write ``array`` in the MNIST IDX binary format (independent of the loader)."""
    codes = {np.dtype(np.uint8): 0x08, np.dtype(np.int8): 0x09, np.dtype(np.int16): 0x0B,
             np.dtype(np.int32): 0x0C, np.dtype(np.float32): 0x0D, np.dtype(np.float64): 0x0E}
    code = codes[array.dtype] if type_code is None else type_code
    header = bytes([0, 0, code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    payload = header + array.astype(array.dtype.newbyteorder(">")).tobytes()
    opener = gzip.open if compress else open
    with opener(path, "wb") as f:
        f.write(payload)


@pytest.fixture
def mnist_like():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(12, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, size=12).astype(np.uint8)
    return images, labels


# --------------------------------------------------------------------------------------- npz

def test_npz_round_trip(tmp_path):
    x = np.random.default_rng(1).normal(size=(7, 4, 4, 1)).astype(np.float32)
    y = np.arange(7) % 3
    path = tmp_path / "data.npz"
    np.savez(path, images=x, targets=y)
    x2, y2 = load_npz(path, x_key="images", y_key="targets")
    np.testing.assert_array_equal(x2, x)
    np.testing.assert_array_equal(y2, y)
    assert x2.dtype == np.float32 and y2.dtype == np.int32


def test_npz_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.npz"):
        load_npz(tmp_path / "missing.npz")
    path = tmp_path / "d.npz"
    np.savez(path, x=np.zeros((3, 2)), y=np.zeros(4, int))
    with pytest.raises(ValueError, match="different lengths: 3 and 4"):
        load_npz(path)
    with pytest.raises(ValueError, match=r"key 'feat' not found.*\['x', 'y'\]"):
        load_npz(path, x_key="feat")
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip archive")
    with pytest.raises(ValueError, match="bad.npz"):
        load_npz(bad)
    np.savez(tmp_path / "f.npz", x=np.zeros((2, 2)), y=np.array([0.5, 1.0]))
    with pytest.raises(ValueError, match="integer class labels"):
        load_npz(tmp_path / "f.npz")


# --------------------------------------------------------------------------------------- IDX

@pytest.mark.parametrize("compress", [False, True])
def test_idx_round_trip(tmp_path, mnist_like, compress):
    images, labels = mnist_like
    suffix = ".gz" if compress else ""
    ipath, lpath = tmp_path / f"img-idx3-ubyte{suffix}", tmp_path / f"lab-idx1-ubyte{suffix}"
    write_idx(ipath, images, compress=compress)
    write_idx(lpath, labels, compress=compress)
    if compress:
        assert ipath.read_bytes()[:2] == b"\x1f\x8b"
    raw = read_idx(ipath)
    assert raw.dtype == np.uint8
    np.testing.assert_array_equal(raw, images)
    x, y = load_idx(ipath, lpath, scale=False)
    assert x.shape == (12, 28, 28, 1) and x.dtype == np.float32 and y.dtype == np.int32
    np.testing.assert_array_equal(x[..., 0], images)
    np.testing.assert_array_equal(y, labels)
    xs, _ = load_idx(ipath, lpath)
    np.testing.assert_array_equal(xs, images[..., None].astype(np.float32) / np.float32(255))
    assert xs.max() <= 1.0


@pytest.mark.parametrize("dtype", [np.int16, np.int32, np.float32, np.float64])
def test_idx_wider_dtypes(tmp_path, dtype):
    arr = (np.arange(24).reshape(2, 3, 4) - 7).astype(dtype)
    write_idx(tmp_path / "a.idx", arr)
    out = read_idx(tmp_path / "a.idx")
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out, arr)


def test_idx_errors(tmp_path, mnist_like):
    images, labels = mnist_like
    with pytest.raises(FileNotFoundError, match="nope-idx"):
        read_idx(tmp_path / "nope-idx")
    bad = tmp_path / "bad-magic"
    bad.write_bytes(b"\x12\x34\x08\x01" + b"\x00" * 8)
    with pytest.raises(ValueError, match="bad-magic.*bad magic number 12340801"):
        read_idx(bad)
    write_idx(tmp_path / "badcode", labels, type_code=0x07)
    with pytest.raises(ValueError, match="bad magic number"):
        read_idx(tmp_path / "badcode")
    truncated = tmp_path / "truncated"
    write_idx(truncated, images)
    truncated.write_bytes(truncated.read_bytes()[:-5])
    with pytest.raises(ValueError, match="truncated.*declares shape"):
        read_idx(truncated)
    (tmp_path / "empty").write_bytes(b"")
    with pytest.raises(ValueError, match="empty"):
        read_idx(tmp_path / "empty")
    write_idx(tmp_path / "img", images)
    write_idx(tmp_path / "lab", labels[:5])
    with pytest.raises(ValueError, match="different lengths: 12 and 5"):
        load_idx(tmp_path / "img", tmp_path / "lab")
    with pytest.raises(ValueError, match="must be 1-D"):
        load_idx(tmp_path / "img", tmp_path / "img")


# ------------------------------------------------------------------------------------ LIBSVM

def test_libsvm_round_trip_and_label_mapping(tmp_path):
    path = tmp_path / "a.libsvm"
    # 1-based indices, sparse rows, {-1, +1} labels (cod-rna style).
    path.write_text("+1 1:0.5 3:2\n-1 2:1.25\n+1 4:-3\n-1 1:1 2:1 3:1 4:1\n")
    x, y = load_libsvm(path)
    expected = np.array([[0.5, 0, 2, 0], [0, 1.25, 0, 0], [0, 0, 0, -3], [1, 1, 1, 1]],
                        np.float32)
    np.testing.assert_array_equal(x, expected)
    np.testing.assert_array_equal(y, [1, 0, 1, 0])  # -1 -> 0, +1 -> 1
    x6, y6, classes = load_libsvm(path, num_features=6, return_classes=True)
    assert x6.shape == (4, 6) and np.all(x6[:, 4:] == 0)
    np.testing.assert_array_equal(classes, [-1, 1])
    np.testing.assert_array_equal(classes[y6], [1, -1, 1, -1])


def test_libsvm_multiclass_and_errors(tmp_path):
    path = tmp_path / "m.txt"
    path.write_text("3 1:1\n1 1:2\n2 1:3\n3 1:4\n")
    _, y = load_libsvm(path)
    np.testing.assert_array_equal(y, [2, 0, 1, 2])  # {1, 2, 3} -> {0, 1, 2}
    with pytest.raises(FileNotFoundError, match="absent.libsvm"):
        load_libsvm(tmp_path / "absent.libsvm")
    bad = tmp_path / "bad.libsvm"
    bad.write_text("1 x:y:z\n")
    with pytest.raises(ValueError, match="bad.libsvm"):
        load_libsvm(bad)
    with pytest.raises(ValueError, match="num_features"):
        load_libsvm(path, num_features=0)


# --------------------------------------------------------------------------------------- CSV

def test_csv(tmp_path):
    path = tmp_path / "adult_like.csv"
    path.write_text("age,hours,income\n39,40,<=50K\n50,13, >50K\n38,40,<=50K\n")
    x, y, classes = load_csv(path, skip_header=1, return_classes=True)
    np.testing.assert_array_equal(x, [[39, 40], [50, 13], [38, 40]])
    np.testing.assert_array_equal(y, [0, 1, 0])
    assert list(classes) == ["<=50K", ">50K"]
    numeric = tmp_path / "numeric.tsv"
    numeric.write_text("7\t0.5\t1\n-2\t1.5\t2\n7\t2.5\t3\n")
    x0, y0 = load_csv(numeric, label_column=0, delimiter="\t")
    np.testing.assert_array_equal(x0, [[0.5, 1], [1.5, 2], [2.5, 3]])
    assert y0.tolist() == [1, 0, 1]  # {-2, 7} -> {0, 1}
    with pytest.raises(ValueError, match="label_column"):
        load_csv(numeric, label_column=3, delimiter="\t")
    with pytest.raises(ValueError, match="non-numeric"):
        load_csv(path)  # the header row is not numeric
    with pytest.raises(FileNotFoundError, match="none.csv"):
        load_csv(tmp_path / "none.csv")


# ------------------------------------------------------------------------ dataset_from_arrays

def test_dataset_from_arrays_split_logic():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(100, 5))
    x[:, 0] = np.arange(100)  # a unique id per record, to check disjointness
    y = np.arange(100) % 4
    ds = dataset_from_arrays("mine", x, y, test_fraction=0.2, public_fraction=0.1, seed=3)
    assert ds.sizes == {"train": 70, "public": 10, "test": 20}
    assert ds.num_classes == 4 and ds.feature_shape == (5,)
    ids = np.concatenate([ds.x_train[:, 0], ds.x_public[:, 0], ds.x_test[:, 0]])
    np.testing.assert_array_equal(np.sort(ids), np.arange(100))  # disjoint and covering
    np.testing.assert_array_equal(np.bincount(ds.y_test), [5, 5, 5, 5])  # stratified
    np.testing.assert_array_equal(y[ds.x_train[:, 0].astype(int)], ds.y_train)  # rows aligned
    again = dataset_from_arrays("mine", x, y, test_fraction=0.2, public_fraction=0.1, seed=3)
    np.testing.assert_array_equal(again.x_train, ds.x_train)
    other = dataset_from_arrays("mine", x, y, test_fraction=0.2, public_fraction=0.1, seed=4)
    assert not np.array_equal(other.x_test, ds.x_test)
    with_domains = dataset_from_arrays("mine", x, y, domains=np.arange(100) // 50,
                                       num_classes=6)
    np.testing.assert_array_equal(with_domains.domain_train,
                                  with_domains.x_train[:, 0].astype(int) // 50)
    assert with_domains.num_classes == 6


def test_dataset_from_arrays_errors():
    x, y = np.zeros((10, 2)), np.arange(10) % 2
    with pytest.raises(ValueError, match="test_fraction"):
        dataset_from_arrays("d", x, y, test_fraction=1.5)
    with pytest.raises(ValueError, match=r"test_fraction \+ public_fraction must be < 1"):
        dataset_from_arrays("d", x, y, test_fraction=0.5, public_fraction=0.5)
    with pytest.raises(ValueError, match="same length"):
        dataset_from_arrays("d", x, y[:9])
    with pytest.raises(ValueError, match=r"y must be in \[0, 0\]"):
        dataset_from_arrays("d", x, y, num_classes=1)


def test_loader_to_dataset_pipeline(tmp_path, mnist_like):
    images, labels = mnist_like
    write_idx(tmp_path / "i.gz", images, compress=True)
    write_idx(tmp_path / "l.gz", labels, compress=True)
    ds = dataset_from_arrays("mnist-files", *load_idx(tmp_path / "i.gz", tmp_path / "l.gz"),
                             test_fraction=0.25, public_fraction=0.25, num_classes=10)
    assert ds.feature_shape == (28, 28, 1) and ds.sizes == {"train": 6, "public": 3, "test": 3}


# -------------------------------------------------------------------------------------- TFDS

def test_tfds_missing_gives_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)  # makes the import fail
    with pytest.raises(ImportError, match=r"pip install fedjax-dp\[tfds\]"):
        load_tfds("mnist")


def test_tfds_mock_data_without_tensorflow():
    tfds = pytest.importorskip("tensorflow_datasets")
    with tfds.testing.mock_data(num_examples=20):
        ds = load_tfds("mnist", public_fraction=0.5)
        again = load_dataset("tfds:mnist", public_fraction=0.5)
    assert ds.name == "mnist" and ds.num_classes == 10
    assert ds.feature_shape == (28, 28, 1)
    assert ds.sizes == {"train": 20, "public": 10, "test": 10}
    assert ds.x_train.dtype == np.float32 and 0.0 <= ds.x_train.min() <= ds.x_train.max() <= 1.0
    np.testing.assert_array_equal(ds.x_public, again.x_public)


def test_tfds_adapter_on_fake_source(monkeypatch):
    tfds = pytest.importorskip("tensorflow_datasets")
    rng = np.random.default_rng(0)
    tables = {split: [{"features": rng.normal(size=3).astype(np.float64),
                       "target": np.int64(i % 3)} for i in range(n)]
              for split, n in (("train", 30), ("test", 10))}
    calls = []

    def fake_data_source(name, *, split, data_dir=None, download=True):
        calls.append((name, split, data_dir, download))
        return tables[split]  # a plain sequence of dicts, without dataset_info

    monkeypatch.setattr(tfds, "data_source", fake_data_source)
    ds = load_tfds("tabular", image_key="features", label_key="target", public_fraction=0.3,
                   public_from="train", data_dir="/data", max_test=6)
    assert calls == [("tabular", "train", "/data", False), ("tabular", "test", "/data", False)]
    assert ds.feature_shape == (3,) and ds.num_classes == 3  # from max(label) + 1
    assert ds.sizes == {"train": 21, "public": 9, "test": 6}
    np.testing.assert_allclose(ds.x_test, np.stack([r["features"] for r in tables["test"][:6]]),
                               rtol=1e-6)
    train_and_public = np.concatenate([ds.x_train, ds.x_public])
    assert len(np.unique(train_and_public, axis=0)) == 30  # disjoint, covering
    with pytest.raises(ValueError, match=r"no feature 'image'.*\['features', 'target'\]"):
        load_tfds("tabular", label_key="target")
    with pytest.raises(ValueError, match="public_from"):
        load_tfds("tabular", public_from="val")
