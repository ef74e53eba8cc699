"""Loaders for user-supplied data files (nothing is ever downloaded).

Every loader returns host arrays ``(x, y)``: features ``x`` float32 ``[n, *feature_shape]`` and
labels ``y`` int32 ``[n]``. Missing files raise ``FileNotFoundError`` and malformed files raise
``ValueError``, both naming the path. :func:`dataset_from_arrays` then turns ``(x, y)`` into a
:class:`~fedjax_dp.data.dataset.Dataset` with the same deterministic split logic as the
offline sources.

Supported formats: ``.npz`` (:func:`load_npz`), MNIST-style IDX, gzipped or plain
(:func:`load_idx`, :func:`read_idx`), LIBSVM / svmlight text (:func:`load_libsvm`) and numeric
CSV with a label column (:func:`load_csv`).
"""
from __future__ import annotations

import gzip
import os
from typing import Sequence

import numpy as np

from fedjax_dp.core import validation
from fedjax_dp.data.dataset import Dataset
from fedjax_dp.data.splits import split_counts, split_indices

PathLike = str | os.PathLike

# IDX type codes (third byte of the magic number) -> big-endian numpy dtypes.
IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(">u1"),  # unsigned byte
    0x09: np.dtype(">i1"),  # signed byte
    0x0B: np.dtype(">i2"),  # short
    0x0C: np.dtype(">i4"),  # int
    0x0D: np.dtype(">f4"),  # float
    0x0E: np.dtype(">f8"),  # double
}


def _require_file(path: PathLike, what: str = "file") -> str:
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{what} not found: {path!r}")
    return path


def _integer_labels(name: str, y: np.ndarray, path: str) -> np.ndarray:
    """1-D integer labels (integral floats accepted) as int32; errors name the file."""
    y = np.asarray(y)
    if y.ndim != 1:
        raise ValueError(f"{name} in {path!r} must be 1-D, got shape {y.shape}")
    if y.dtype.kind == "f" and np.all(np.isfinite(y)) and np.all(y == np.round(y)):
        y = y.astype(np.int64)
    if y.size and y.dtype.kind not in "iu":
        raise ValueError(f"{name} in {path!r} must hold integer class labels, got dtype {y.dtype}")
    if y.size and y.min() < 0:
        raise ValueError(f"{name} in {path!r} must be >= 0, got minimum {y.min()}")
    return y.astype(np.int32)


def remap_labels(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Map arbitrary label values to ``0..C-1`` in sorted order.

    Returns ``(y, classes)`` with ``classes[y[i]] == values[i]``: e.g. ``{-1, +1} -> {0, 1}``, ``{1,
    2, 3} -> {0, 1, 2}``, ``{"<=50K", ">50K"} -> {0, 1}``."""
    classes, y = np.unique(np.asarray(values), return_inverse=True)
    return y.astype(np.int32).ravel(), classes


def _check_lengths(x: np.ndarray, y: np.ndarray, path: str) -> None:
    if len(x) != len(y):
        raise ValueError(f"features and labels in {path!r} have different lengths: "
                         f"{len(x)} and {len(y)}")


def load_npz(path: PathLike, x_key: str = "x", y_key: str = "y") -> tuple[np.ndarray, np.ndarray]:
    """Features ``npz[x_key]`` ``[n, ...]`` (float32) and labels ``npz[y_key]`` ``[n]`` (int32)."""
    path = _require_file(path, "npz file")
    try:
        archive = np.load(path, allow_pickle=False)
    except Exception as e:  # zipfile.BadZipFile, OSError, ValueError ...
        raise ValueError(f"cannot read {path!r} as an .npz archive: {e}") from e
    with archive:
        for key in (x_key, y_key):
            if key not in archive.files:
                raise ValueError(f"key {key!r} not found in {path!r}; it holds {archive.files}")
        x = archive[x_key]
        y = archive[y_key]
    if x.ndim < 1 or x.dtype.kind not in "biuf":
        raise ValueError(f"{x_key!r} in {path!r} must be a numeric array [n, ...], got dtype "
                         f"{x.dtype} and shape {x.shape}")
    y = _integer_labels(repr(y_key), y, path)
    _check_lengths(x, y, path)
    if x.ndim == 1:
        x = x[:, None]
    return x.astype(np.float32), y


def _open_maybe_gzip(path: str):
    with open(path, "rb") as f:
        head = f.read(2)
    return gzip.open(path, "rb") if head == b"\x1f\x8b" else open(path, "rb")


def read_idx(path: PathLike) -> np.ndarray:
    """The array stored in one IDX file (the MNIST format), gzipped or plain.

    Layout: a 4-byte magic number ``0x00 0x00 <type code> <ndim>``, then ``ndim`` big-endian
    uint32 dimensions, then the data in big-endian C order. Gzip is detected from the content,
    not the file name. Returns the array in native byte order with its stored dtype.
    """
    path = _require_file(path, "IDX file")
    try:
        with _open_maybe_gzip(path) as f:
            raw = f.read()
    except (OSError, EOFError) as e:
        raise ValueError(f"cannot read IDX file {path!r}: {e}") from e
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in IDX_DTYPES:
        magic = raw[:4].hex() if raw else "<empty file>"
        raise ValueError(f"{path!r} is not an IDX file: bad magic number {magic} (expected "
                         "00 00 <type code in 08,09,0b,0c,0d,0e> <ndim>)")
    dtype = IDX_DTYPES[raw[2]]
    ndim = raw[3]
    header = 4 + 4 * ndim
    if ndim == 0 or len(raw) < header:
        raise ValueError(f"IDX file {path!r} has a truncated header (ndim={ndim})")
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    expected = int(np.prod(dims)) * dtype.itemsize
    if len(raw) - header != expected:
        raise ValueError(f"IDX file {path!r} declares shape {dims} ({expected} data bytes) "
                         f"but holds {len(raw) - header} data bytes")
    data = np.frombuffer(raw, dtype=dtype, offset=header).reshape(dims)
    return data.astype(dtype.newbyteorder("="))


def load_idx(images_path: PathLike, labels_path: PathLike, *,
             scale: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """MNIST-style IDX images and labels as ``(x [n, H, W, 1] float32, y [n] int32)``.

    3-D image files ``[n, H, W]`` get a trailing channel axis; other ranks are kept. With ``scale``
    (default), unsigned-byte images are divided by 255 to lie in [0, 1]."""
    images = read_idx(images_path)
    labels = read_idx(labels_path)
    labels_path = os.fspath(labels_path)
    if labels.ndim != 1:
        raise ValueError(f"labels IDX file {labels_path!r} must be 1-D, got shape {labels.shape}")
    y = _integer_labels("labels", labels, labels_path)
    if len(images) != len(y):
        raise ValueError(f"images {os.fspath(images_path)!r} and labels {labels_path!r} have "
                         f"different lengths: {len(images)} and {len(y)}")
    x = images.astype(np.float32)
    if scale and images.dtype == np.uint8:
        x = x / np.float32(255.0)
    if x.ndim == 3:
        x = x[..., None]  # [n, H, W] -> [n, H, W, 1]
    return x, y


def load_libsvm(path: PathLike, num_features: int | None = None, *, zero_based: bool | str = "auto",
                return_classes: bool = False):
    """A LIBSVM / svmlight file as dense ``(x [n, num_features] float32, y [n] int32)``.

    Labels are remapped to ``0..C-1`` in sorted order of the original values (see
    :func:`remap_labels`): ``{-1, +1} -> {0, 1}`` (cod-rna, a9a), ``{1, 2, ...} -> {0, 1, ...}``.
    With ``return_classes`` the original values are returned too, as ``(x, y, classes)`` with
    ``classes[y[i]]`` the label written in the file. ``num_features`` fixes the width (needed when a
    split file does not mention the last feature); ``zero_based`` is passed to
    ``sklearn.datasets.load_svmlight_file`` ("auto" detects 1-based files, the LIBSVM norm)."""
    from sklearn.datasets import load_svmlight_file

    path = _require_file(path, "LIBSVM file")
    if num_features is not None:
        num_features = validation.check_int("num_features", num_features, minimum=1)
    try:
        x_sparse, values = load_svmlight_file(path, n_features=num_features,
                                              zero_based=zero_based, dtype=np.float64)
    except ValueError as e:
        raise ValueError(f"cannot parse LIBSVM file {path!r}: {e}") from e
    x = np.asarray(x_sparse.toarray(), dtype=np.float32)  # [n, num_features]
    y, classes = remap_labels(values)
    if return_classes:
        return x, y, classes
    return x, y


def load_csv(path: PathLike, *, label_column: int = -1, delimiter: str = ",",
             skip_header: int = 0, return_classes: bool = False):
    """A CSV of numeric features plus one label column as ``(x [n, d] float32, y [n] int32)``.

    The label column may hold any values (numbers or strings); they are remapped to ``0..C-1`` in
    sorted order as in :func:`load_libsvm`. Categorical feature columns are not supported: encode
    them first."""
    path = _require_file(path, "CSV file")
    try:
        table = np.loadtxt(path, dtype=str, delimiter=delimiter, skiprows=skip_header, ndmin=2)
    except ValueError as e:
        raise ValueError(f"cannot parse CSV file {path!r}: {e}") from e
    if table.shape[0] == 0 or table.shape[1] < 2:
        raise ValueError(f"CSV file {path!r} must have at least one row and two columns "
                         f"(features and a label), got shape {table.shape}")
    col = validation.check_int("label_column", label_column, minimum=-table.shape[1],
                               maximum=table.shape[1] - 1) % table.shape[1]
    labels = np.char.strip(table[:, col])
    try:
        x = np.delete(table, col, axis=1).astype(np.float64).astype(np.float32)
    except ValueError as e:
        raise ValueError(f"CSV file {path!r} has non-numeric feature values: {e}") from e
    y, classes = remap_labels(labels)
    if return_classes:
        return x, y, classes
    return x, y


def dataset_from_arrays(name: str, x: np.ndarray, y: np.ndarray, *, test_fraction: float = 0.2,
                        public_fraction: float = 0.2, seed: int = 0,
                        num_classes: int | None = None, domains: Sequence[int] | None = None,
                        stratify: bool = True) -> Dataset:
    """Split ``(x [n, ...], y [n])`` into a :class:`Dataset` (same logic as the offline sources).

    ``round(n * test_fraction)`` records go to test and ``round(n * public_fraction)`` to public
    (stratified by label when possible), the rest to train. ``num_classes`` defaults to ``max(y) +
    1``. ``domains`` (one id per record) is carried into ``domain_train``."""
    x = validation.check_finite_array("x", x)
    y = np.asarray(y)
    validation.check_same_length(("x", "y"), x, y)
    if len(y) == 0:
        raise ValueError("x and y must hold at least one record, got 0")
    if x.ndim == 1:
        x = x[:, None]
    if num_classes is None:
        if y.dtype.kind not in "iuf":
            raise ValueError(f"y must hold integer class labels, got dtype {y.dtype}")
        num_classes = int(np.max(y)) + 1
    y = validation.check_labels("y", y, validation.check_int("num_classes", num_classes,
                                                             minimum=1))
    num_test, num_public = split_counts(len(y), test_fraction, public_fraction)
    train, public, test = split_indices(y, num_test=num_test, num_public=num_public, seed=seed,
                                        stratify=stratify)
    domain_train = None
    if domains is not None:
        domains = np.asarray(domains)
        validation.check_same_length(("domains", "x"), domains, x)
        domain_train = domains[train]
    return Dataset(name=name, x_train=x[train], y_train=y[train], x_public=x[public],
                   y_public=y[public], x_test=x[test], y_test=y[test], num_classes=num_classes,
                   domain_train=domain_train)
