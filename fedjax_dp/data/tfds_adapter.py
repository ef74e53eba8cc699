"""tensorflow-datasets adapter: any prepared TFDS classification dataset as a :class:`Dataset`.

Reads through ``tfds.data_source`` (random-access ArrayRecord files), which needs no TensorFlow.
TFDS is an optional dependency (``pip install fedjax-dp[tfds]``) imported only when called.
Nothing is downloaded unless ``download=True``: by default the dataset must already be
prepared under ``data_dir`` (or TFDS's default directory).

Following FedKT, the public (server, unlabelled) split is carved out of the test split by
default: ``public_fraction`` of the test records become public and the rest stay test.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from fedjax_dp.core import validation
from fedjax_dp.data.dataset import Dataset
from fedjax_dp.data.splits import holdout

INSTALL_HINT = "tensorflow-datasets is not installed; run `pip install fedjax-dp[tfds]`"


def _import_tfds():
    try:
        import tensorflow_datasets as tfds
    except ImportError as e:
        raise ImportError(INSTALL_HINT) from e
    return tfds


def _to_arrays(source: Sequence[dict[str, Any]], image_key: str, label_key: str, split: str,
               limit: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Stack the records of a data source: ``(x [n, *shape] float32, y [n] int64)``.

    Unsigned-byte features (images) are scaled to [0, 1]; other numeric features are cast."""
    n = len(source) if limit is None else min(limit, len(source))
    if n == 0:
        raise ValueError(f"TFDS split {split!r} is empty")
    xs, ys = [], []
    for i in range(n):  # host-side, one pass; random access by index
        record = source[i]
        for key in (image_key, label_key):
            if key not in record:
                raise ValueError(f"TFDS split {split!r} has no feature {key!r}; its records hold "
                                 f"{sorted(record)} (set image_key= / label_key=)")
        xs.append(np.asarray(record[image_key]))
        ys.append(np.asarray(record[label_key]))
    x = np.stack(xs)  # [n, *feature_shape]
    y = np.stack(ys)  # [n]
    if y.ndim != 1 or y.dtype.kind not in "iu":
        raise ValueError(f"TFDS feature {label_key!r} must be a scalar integer class label, got "
                         f"dtype {y.dtype} and per-record shape {y.shape[1:]}")
    if x.dtype.kind not in "biuf":
        raise ValueError(f"TFDS feature {image_key!r} must be numeric, got dtype {x.dtype}")
    scaled = x.astype(np.float32) / np.float32(255.0) if x.dtype == np.uint8 else x
    if scaled.ndim == 1:
        scaled = scaled[:, None]
    return scaled.astype(np.float32), y.astype(np.int64)


def _num_classes(source: Any, label_key: str, *labels: np.ndarray) -> int:
    """``num_classes`` of the TFDS ClassLabel feature, else ``max(label) + 1``."""
    try:
        return int(source.dataset_info.features[label_key].num_classes)
    except Exception:  # no dataset_info, or not a ClassLabel
        return int(max(int(y.max()) for y in labels if y.size)) + 1


def load_tfds(name: str, *, split_train: str = "train", split_test: str = "test",
              public_fraction: float = 0.5, public_from: str = "test",
              data_dir: str | None = None, image_key: str = "image", label_key: str = "label",
              seed: int = 0, download: bool = False, max_train: int | None = None,
              max_test: int | None = None) -> Dataset:
    """Load TFDS dataset ``name`` as a :class:`Dataset`.

    Args:
      name: a TFDS name, e.g. ``"mnist"``, ``"svhn_cropped"``, ``"cifar10"``.
      split_train: TFDS split name of the training data (slicing like ``"train[:10%]"`` works).
      split_test: TFDS split name of the test data.
      public_fraction: fraction of the ``public_from`` split moved to the public split
        (FedKT: half of the test set).
      public_from: ``"test"`` (default) or ``"train"``.
      data_dir: TFDS data directory (default: TFDS's own).
      image_key: the feature name in a record.
      label_key: the label name in a record.
      seed: shuffle seed of the (stratified) public carve-out.
      download: let TFDS download and prepare the data (off by default: offline first).
      max_train: keep only the first records of the training split (quick experiments).
      max_test: the same for the test split.
    """
    validation.check_choice("public_from", public_from, ("test", "train"))
    validation.check_probability("public_fraction", public_fraction, allow_zero=True)
    if public_fraction >= 1.0:
        raise ValueError(f"public_fraction must be in [0, 1), got {public_fraction}")
    for pname, value in (("max_train", max_train), ("max_test", max_test)):
        if value is not None:
            validation.check_int(pname, value, minimum=1)
    seed = validation.check_int("seed", seed, minimum=0)
    tfds = _import_tfds()

    def source(split: str):
        return tfds.data_source(name, split=split, data_dir=data_dir, download=download)

    train_source = source(split_train)
    test_source = source(split_test)
    x_train, y_train = _to_arrays(train_source, image_key, label_key, split_train, max_train)
    x_test, y_test = _to_arrays(test_source, image_key, label_key, split_test, max_test)
    if x_train.shape[1:] != x_test.shape[1:]:
        raise ValueError(f"TFDS splits {split_train!r} and {split_test!r} have different feature "
                         f"shapes {x_train.shape[1:]} and {x_test.shape[1:]}")
    num_classes = _num_classes(train_source, label_key, y_train, y_test)

    # Carve the public split out of one of the two splits (stratified, seeded).
    xs, ys = (x_test, y_test) if public_from == "test" else (x_train, y_train)
    num_public = int(round(len(ys) * public_fraction))
    if public_from == "train" and num_public >= len(ys):
        raise ValueError(f"public_fraction={public_fraction} leaves no training records")
    rest, public = holdout(np.arange(len(ys), dtype=np.int64), ys, num_public, seed, True)
    x_public, y_public = xs[public], ys[public]
    if public_from == "test":
        x_test, y_test = xs[rest], ys[rest]
    else:
        x_train, y_train = xs[rest], ys[rest]
    return Dataset(name=name, x_train=x_train, y_train=y_train, x_public=x_public,
                   y_public=y_public, x_test=x_test, y_test=y_test, num_classes=num_classes)
