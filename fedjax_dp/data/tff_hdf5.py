"""TensorFlow Federated's federated datasets from their published HDF5 files (nothing downloads).

TFF's ``HDF5ClientData`` layout: a top-level group ``examples`` with one subgroup per client,
named by the client id; every subgroup holds the same datasets, one row per example
(``examples/<client_id>/<feature> [n, ...]``). Train and test are separate files, as published
in ``https://storage.googleapis.com/tff-datasets-public/<name>.tar.bz2``:

==================  =================================================  ==============================
format              files (train / test)                               features used
==================  =================================================  ==============================
tff_emnist          fed_emnist_train.h5 / fed_emnist_test.h5           pixels [n,28,28] f32, label [n]
tff_emnist_digits   fed_emnist_digitsonly_train.h5 / _test.h5          (the same, labels 0..9)
tff_shakespeare     shakespeare_train.h5 / shakespeare_test.h5         snippets [n] bytes
tff_stackoverflow   stackoverflow_train.h5 / stackoverflow_test.h5     tokens [n] bytes (space-separated)
tff_cifar100        fed_cifar100_train.h5 / fed_cifar100_test.h5       image [n,32,32,3] u8, label [n]
==================  =================================================  ==============================

Each client becomes one agent holding its own records (:class:`TFFClients`; the order is TFF's,
the client ids sorted as strings). Records:

* EMNIST: ``x [28, 28, 1]`` float32 pixels as published (1.0 = background), ``y`` the label
  (62 classes: digits, upper, lower case; 10 for the digits-only files).
* CIFAR-100: ``x [32, 32, 3]`` float32 = image / 255, ``y`` the fine label (100 classes; the
  coarse label is not used). The train clients (500) and test clients (100) are different.
* Shakespeare: every snippet gives ``ceil((len + 2) / 81)`` next-character records
  ``x, y [80]`` (:func:`fedjax_dp.data.vocab.char_windows`).
* StackOverflow: every sentence gives one next-word record ``x, y [20]``
  (:func:`fedjax_dp.data.vocab.word_sequence`) over the 10,000 most frequent words (counted as
  TFF's ``stackoverflow.word_count``), or a vocabulary read from a file.

Reading needs ``h5py`` (``pip install 'fedjax-dp[federated]'``)."""
from __future__ import annotations

import collections
from pathlib import Path
from typing import Iterator

import numpy as np

from fedjax_dp.data import vocab as vocab_lib
from fedjax_dp.data.client_reader import ClientReader

EXAMPLES = "examples"

#: format -> (train file, test file) as published by TFF
FILES = {
    "tff_emnist": ("fed_emnist_train.h5", "fed_emnist_test.h5"),
    "tff_emnist_digits": ("fed_emnist_digitsonly_train.h5", "fed_emnist_digitsonly_test.h5"),
    "tff_shakespeare": ("shakespeare_train.h5", "shakespeare_test.h5"),
    "tff_stackoverflow": ("stackoverflow_train.h5", "stackoverflow_test.h5"),
    "tff_cifar100": ("fed_cifar100_train.h5", "fed_cifar100_test.h5"),
}


def _h5py():
    try:
        import h5py
    except ImportError:
        raise ValueError("reading TensorFlow Federated's HDF5 files needs h5py: "
                         "pip install 'fedjax-dp[federated]' (or pip install h5py)") from None
    return h5py


def resolve_files(fmt: str, src) -> tuple[Path, Path]:
    """``(train, test)`` paths of a TFF format: ``src`` is the folder holding the published files
    (their names in :data:`FILES`), or the train file itself (``*_train.h5``, the test file
    beside it as ``*_test.h5``)."""
    src = Path(src).expanduser()
    train_name, test_name = FILES[fmt]
    if src.is_dir():
        train, test = src / train_name, src / test_name
    elif src.is_file():
        if not src.name.endswith("_train.h5"):
            raise ValueError(f"SRC {str(src)!r} must be a folder holding {train_name} and "
                             f"{test_name}, or a *_train.h5 file")
        train, test = src, src.with_name(src.name[:-len("_train.h5")] + "_test.h5")
    else:
        raise ValueError(f"SRC {str(src)!r} does not exist (the folder holding {train_name} "
                         f"and {test_name})")
    for p in (train, test):
        if not p.is_file():
            raise ValueError(f"{fmt}: {str(p)!r} does not exist (SRC must hold the published "
                             f"{train_name} and {test_name})")
    return train, test


def open_examples(path):
    """``(h5py file, its 'examples' group)``; a file without that layout is refused, naming it."""
    h5py = _h5py()
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise ValueError(f"{str(path)!r} is not an HDF5 file ({e})") from None
    if EXAMPLES not in f or not isinstance(f[EXAMPLES], h5py.Group):
        f.close()
        raise ValueError(f"{str(path)!r} is not a TensorFlow Federated client file: it has no "
                         f"top-level group {EXAMPLES!r} (layout examples/<client_id>/<feature>)")
    return f, f[EXAMPLES]


def client_ids(group) -> list[str]:
    """The client ids of an ``examples`` group, sorted (TFF's order)."""
    return sorted(group.keys())


def _rows(shape: tuple) -> str:
    """A dataset's record count as a message says it (a scalar has none)."""
    return "no records (a scalar)" if len(shape) == 0 else f"{shape[0]} records"


class TFFClients(ClientReader):
    """The clients of one TFF dataset's train and test files (a base class; one per format).

    :class:`fedjax_dp.data.client_reader.ClientReader`'s interface, reading one client at a time."""

    features: tuple[str, ...] = ()          # the datasets every client group must hold

    def __init__(self, fmt: str, src):
        self.name = fmt
        self.paths = dict(zip(("train", "test"), resolve_files(fmt, src)))
        self._files = {}
        for split, path in self.paths.items():
            f, group = open_examples(path)
            self._files[split] = (f, group)
            ids = client_ids(group)
            if not ids:
                raise ValueError(f"{str(path)!r} holds no clients (examples/ is empty)")
            missing = [k for k in self.features if k not in group[ids[0]]]
            if missing:
                raise ValueError(f"{str(path)!r}: client {ids[0]!r} has no {missing} (a {fmt} "
                                 f"file has examples/<client_id>/{{{', '.join(self.features)}}}; "
                                 f"found {sorted(group[ids[0]].keys())})")

    def close(self) -> None:
        for f, _ in self._files.values():
            f.close()

    def _group(self, split: str):
        return self._files[split][1]

    def _feature(self, split: str, cid: str, name: str):
        group = self._group(split)[cid]
        if name not in group:
            raise ValueError(f"{str(self.paths[split])!r}: client {cid!r} has no feature "
                             f"{name!r}")
        return group[name]

    def _size(self, split: str, cid: str) -> int:
        return int(self._feature(split, cid, self.features[0]).shape[0])

    def check_fields(self, split: str, cid: str) -> None:
        """Every dataset of client ``cid``'s group holds one row per record: the same leading
        dimension as the first feature (:attr:`features`), used or not (a file that disagrees
        with itself is refused, naming the file, the client and both fields)."""
        group, ref = self._group(split)[cid], self.features[0]
        n = self._feature(split, cid, ref).shape
        for name, ds in group.items():
            shape = getattr(ds, "shape", None)
            if shape is None:                    # a subgroup, not a dataset: not a field
                continue
            if len(shape) == 0 or len(n) == 0 or shape[0] != n[0]:
                raise ValueError(f"{self.name}: client {cid!r} in {str(self.paths[split])!r}: "
                                 f"{name} has {_rows(shape)} but {ref} has {_rows(n)} (every "
                                 f"field needs one row per record)")

    def _records(self, split: str, cid: str) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def sizes(self, split: str) -> Iterator[tuple[str, int]]:
        for cid in client_ids(self._group(split)):
            self.check_fields(split, cid)
            yield cid, self._size(split, cid)

    def clients(self, split: str) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
        for cid in client_ids(self._group(split)):
            x, y = self._records(split, cid)
            yield cid, x, y

    def _labels(self, split: str, cid: str, name: str = "label") -> np.ndarray:
        y = np.asarray(self._feature(split, cid, name)[()]).reshape(-1)
        if y.size and (y.dtype.kind not in "iu" or y.min() < 0 or y.max() >= self.num_classes):
            raise ValueError(f"{str(self.paths[split])!r}: client {cid!r} has labels outside "
                             f"[0, {self.num_classes}) for {self.name} (dtype {y.dtype}, range "
                             f"[{y.min()}, {y.max()}])")
        return y.astype(np.int32)


class EMNIST(TFFClients):
    """Federated EMNIST (by writer): ``x [28, 28, 1]`` float32 pixels, 62 (or 10) classes."""

    features = ("pixels", "label")
    feature_shape = (28, 28, 1)

    def __init__(self, src, *, only_digits: bool = False):
        self.num_classes = 10 if only_digits else 62
        super().__init__("tff_emnist_digits" if only_digits else "tff_emnist", src)

    def _records(self, split, cid):
        x = np.asarray(self._feature(split, cid, "pixels")[()], np.float32)
        if x.shape[1:] != (28, 28):
            raise ValueError(f"{str(self.paths[split])!r}: client {cid!r} has pixels of shape "
                             f"{x.shape}, expected [n, 28, 28]")
        return x[..., None], self._labels(split, cid)


class CIFAR100(TFFClients):
    """Federated CIFAR-100 (Pachinko allocation): ``x [32, 32, 3]`` = image / 255, fine labels."""

    features = ("image", "label")
    feature_shape = (32, 32, 3)
    num_classes = 100

    def __init__(self, src):
        super().__init__("tff_cifar100", src)

    def _records(self, split, cid):
        img = np.asarray(self._feature(split, cid, "image")[()])
        if img.shape[1:] != (32, 32, 3):
            raise ValueError(f"{str(self.paths[split])!r}: client {cid!r} has images of shape "
                             f"{img.shape}, expected [n, 32, 32, 3]")
        return img.astype(np.float32) / np.float32(255), self._labels(split, cid)


def _strings(dataset) -> list[bytes]:
    """A string dataset's rows as bytes."""
    return [s if isinstance(s, bytes) else str(s).encode("utf-8")
            for s in np.asarray(dataset[()]).reshape(-1)]


class Shakespeare(TFFClients):
    """Federated Shakespeare (by speaking role): next-character records ``x, y [T]`` int32."""

    features = ("snippets",)

    def __init__(self, src, *, seq_len: int = vocab_lib.SHAKESPEARE_T):
        vocab_lib.set_next_token(self, seq_len, vocab_lib.SHAKESPEARE)
        super().__init__("tff_shakespeare", src)

    def _size(self, split, cid):
        snippets = _strings(self._feature(split, cid, "snippets"))
        return sum(vocab_lib.num_char_windows(len(s), self.seq_len) for s in snippets)

    def _records(self, split, cid):
        return vocab_lib.stack_sequences(
            [vocab_lib.char_windows(s, self.seq_len, self.vocab)
             for s in _strings(self._feature(split, cid, "snippets"))], self.seq_len)


class StackOverflow(TFFClients):
    """Federated StackOverflow (by user): next-word records ``x, y [T]`` int32 over the top
    ``vocab_size`` words (or the words of ``vocab_file``)."""

    features = ("tokens",)

    def __init__(self, src, *, vocab_size: int | None = None,
                 vocab_file=None, seq_len: int = vocab_lib.STACKOVERFLOW_T):
        self.vocab_size, self.vocab_file = vocab_size, vocab_file
        vocab_lib.set_next_token(self, seq_len)
        super().__init__("tff_stackoverflow", src)

    def word_counts(self, progress: bool = False) -> collections.Counter:
        """word -> number of training clients using it (TFF's ``stackoverflow.word_count``)."""
        counts: collections.Counter = collections.Counter()
        ids = client_ids(self._group("train"))
        if progress:
            from tqdm.auto import tqdm
            ids = tqdm(ids, desc="counting words", unit="client")
        for cid in ids:
            used = set()
            for s in _strings(self._feature("train", cid, "tokens")):
                used.update(vocab_lib.words(s))
            counts.update(used)
        return counts

    def prepare(self, progress: bool = False) -> None:
        vocab = vocab_lib.choose_vocab(self.vocab_file, self.vocab_size,
                                       lambda: self.word_counts(progress))
        vocab_lib.set_next_token(self, self.seq_len, vocab)

    def _records(self, split, cid):
        return vocab_lib.stack_sequences(
            [vocab_lib.word_sequence(s, self.vocab, self.seq_len)
             for s in _strings(self._feature(split, cid, "tokens"))], self.seq_len)
