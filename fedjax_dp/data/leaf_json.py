"""LEAF's federated datasets from their JSON files (Caldas et al. 2018, "LEAF: A Benchmark for
Federated Settings"; github.com/TalwalkarLab/leaf; nothing downloads).

LEAF's preprocessing (``./preprocess.sh ... --sf ... -t sample``) writes, per dataset, the folders
``data/train/`` and ``data/test/``, each holding one or more ``*.json`` shards::

    {"users": [u_1, ...], "num_samples": [n_1, ...],
     "user_data": {u_1: {"x": [record, ...], "y": [label, ...]}, ...}}

(plus an optional ``"hierarchies"`` list, not used). SRC is the folder holding ``train/`` and
``test/``. Each user becomes one agent with its own records; shards are read one at a time, in
file-name order, users in each shard's ``users`` order. Records:

* leaf_femnist: ``x`` 784 floats (a 28 x 28 image, row-major, as LEAF writes it) ->
  ``x [28, 28, 1]`` float32, ``y`` in [0, 62).
* leaf_shakespeare: ``x`` an 80-character string, ``y`` the next character -> one next-character
  record ``x = ids(s)``, ``y = ids(s[1:] + next)`` (``[80]`` int32 each) over TFF's character
  vocabulary (:data:`fedjax_dp.data.vocab.SHAKESPEARE`; LEAF's characters outside it are OOV).
* leaf_sent140: ``x`` the tweet's raw entry ``[id, date, query, user, text]``, ``y`` 0 / 1 ->
  ``x [25]`` the ids of the text's first 25 words (LEAF's ``split_line``) over the training
  split's most frequent words (or a vocabulary file), zero-padded, stored as float32 (exact
  integers; a classification record), ``y`` the sentiment (2 classes).
"""
from __future__ import annotations

import collections
from pathlib import Path
from typing import Iterator

import numpy as np

from fedjax_dp.data import vocab as vocab_lib
from fedjax_dp.data.client_reader import ClientReader

KEYS = ("users", "num_samples", "user_data")


def shard_files(root, split: str) -> list[Path]:
    """The sorted ``*.json`` shards of ``root/split``; a missing or empty folder is refused."""
    folder = Path(root).expanduser() / split
    if not folder.is_dir():
        raise ValueError(f"SRC {str(Path(root))!r} must hold LEAF's {split}/ folder of .json "
                         f"shards; {str(folder)!r} does not exist")
    files = sorted(folder.glob("*.json"))
    if not files:
        raise ValueError(f"{str(folder)!r} holds no .json shard")
    return files


#: a LEAF shard is read whole: at most this long (FEMNIST's are ~200 MB)
MAX_SHARD_BYTES = 8 << 30


def read_shard(path) -> dict:
    """One LEAF shard, its layout checked (keys, lengths) with errors naming the file. Read as
    data: a regular file (a symlink must stay inside SRC) of at most :data:`MAX_SHARD_BYTES`;
    JSON nested past Python's recursion limit is refused like any invalid JSON."""
    from fedjax_dp.core import files
    path = Path(path)
    text = files.read_bytes(path, max_bytes=MAX_SHARD_BYTES, root=path.parent.parent,
                            what="LEAF shard")
    d = files.parse_json(text, what=f"LEAF shard {str(path)!r}")
    if not isinstance(d, dict) or any(k not in d for k in KEYS):
        found = sorted(d) if isinstance(d, dict) else type(d).__name__
        raise ValueError(f"{str(path)!r} is not a LEAF shard: it needs the keys {list(KEYS)}, "
                         f"found {found}")
    users, nums, data = d["users"], d["num_samples"], d["user_data"]
    if not isinstance(users, list) or not isinstance(nums, list) or not isinstance(data, dict):
        raise ValueError(f"{str(path)!r} is not a LEAF shard: 'users' and 'num_samples' must be "
                         f"lists and 'user_data' a table")
    if len(users) != len(nums):
        raise ValueError(f"{str(path)!r}: 'users' has {len(users)} entries but 'num_samples' "
                         f"has {len(nums)}")
    for u, n in zip(users, nums):
        if not isinstance(u, str):
            raise ValueError(f"{str(path)!r}: user ids must be strings, got {u!r}")
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"{str(path)!r}: user {u!r} has num_samples {n!r}, not a count "
                             f">= 0")
        rec = data.get(u)
        if not isinstance(rec, dict) or not isinstance(rec.get("x"), list) or \
                not isinstance(rec.get("y"), list):
            raise ValueError(f"{str(path)!r}: user_data[{u!r}] must be {{'x': [...], 'y': "
                             f"[...]}}")
        if len(rec["x"]) != n or len(rec["y"]) != n:
            raise ValueError(f"{str(path)!r}: user {u!r} has num_samples {n} but "
                             f"{len(rec['x'])} x and {len(rec['y'])} y (every field needs one "
                             f"entry per record)")
    return d


class LeafClients(ClientReader):
    """The users of one LEAF dataset's train and test shards as a
    :class:`fedjax_dp.data.client_reader.ClientReader`, one shard in memory at a time."""

    def __init__(self, fmt: str, src):
        self.name = fmt
        root = Path(src).expanduser()
        if not root.exists():
            raise ValueError(f"SRC {str(root)!r} does not exist (LEAF's data folder holding "
                             f"train/ and test/)")
        self.files = {split: shard_files(root, split) for split in ("train", "test")}
        self.paths = {split: root / split for split in ("train", "test")}

    def sizes(self, split: str) -> Iterator[tuple[str, int]]:
        for path in self.files[split]:
            d = read_shard(path)
            yield from zip(d["users"], (int(n) for n in d["num_samples"]))

    def clients(self, split: str) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
        for path in self.files[split]:
            d = read_shard(path)
            for u in d["users"]:
                rec = d["user_data"][u]
                try:
                    x, y = self._records(rec["x"], rec["y"])
                except (ValueError, TypeError) as e:
                    raise ValueError(f"{str(path)!r}: user {u!r}: {e}") from None
                yield u, x, y

    def _records(self, xs: list, ys: list) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def _labels(self, ys: list) -> np.ndarray:
        y = np.asarray(ys)
        if y.size and (y.dtype.kind not in "iuf" or np.any(y != np.round(y))
                       or y.min() < 0 or y.max() >= self.num_classes):
            raise ValueError(f"labels must be integers in [0, {self.num_classes}) for "
                             f"{self.name}")
        return y.astype(np.int32).reshape(-1)


class FEMNIST(LeafClients):
    """LEAF FEMNIST (by writer): ``x [28, 28, 1]`` float32, 62 classes."""

    feature_shape = (28, 28, 1)
    num_classes = 62

    def __init__(self, src):
        super().__init__("leaf_femnist", src)

    def _records(self, xs, ys):
        x = np.asarray(xs, np.float32)
        if x.ndim != 2 or x.shape[1] != 784:
            raise ValueError(f"x must be rows of 784 pixels, got shape {x.shape}")
        return x.reshape(-1, 28, 28, 1), self._labels(ys)


class Shakespeare(LeafClients):
    """LEAF Shakespeare (by speaking role): next-character records ``x, y [80]`` int32."""

    def __init__(self, src, *, seq_len: int = vocab_lib.SHAKESPEARE_T):
        vocab_lib.set_next_token(self, seq_len, vocab_lib.SHAKESPEARE)
        super().__init__("leaf_shakespeare", src)

    def _records(self, xs, ys):
        n, t = len(xs), self.seq_len
        x = np.zeros((n, t), np.int32)
        y = np.zeros((n, t), np.int32)
        for j, (s, nxt) in enumerate(zip(xs, ys)):   # conversion time: a loop over records
            if not isinstance(s, str) or not isinstance(nxt, str) or len(nxt) != 1:
                raise ValueError("x must be strings and y single characters")
            if len(s) != t:
                raise ValueError(f"x strings must have {t} characters (--seq-len), got "
                                 f"{len(s)}")
            x[j] = self.vocab.ids(s)
            y[j] = self.vocab.ids(s[1:] + nxt)
        return x, y


class Sent140(LeafClients):
    """LEAF Sent140 (by Twitter user): ``x [25]`` word ids (float32), ``y`` in {0, 1}."""

    num_classes = 2

    def __init__(self, src, *, vocab_size: int | None = None, vocab_file=None,
                 seq_len: int = vocab_lib.SENT140_T):
        self.seq_len, self.vocab_size, self.vocab_file = seq_len, vocab_size, vocab_file
        self.feature_shape = (seq_len,)
        super().__init__("leaf_sent140", src)

    @staticmethod
    def _text(entry) -> str:
        if not isinstance(entry, list) or len(entry) < 5 or not isinstance(entry[4], str):
            raise ValueError("x entries must be [id, date, query, user, text] lists")
        return entry[4]

    def word_counts(self, progress: bool = False) -> collections.Counter:
        """word -> occurrences in the training tweets."""
        counts: collections.Counter = collections.Counter()
        files = self.files["train"]
        if progress:
            from tqdm.auto import tqdm
            files = tqdm(files, desc="counting words", unit="shard")
        for path in files:
            d = read_shard(path)
            for u in d["users"]:
                for entry in d["user_data"][u]["x"]:
                    counts.update(vocab_lib.split_line(self._text(entry)))
        return counts

    def prepare(self, progress: bool = False) -> None:
        self.vocab = vocab_lib.choose_vocab(self.vocab_file, self.vocab_size,
                                            lambda: self.word_counts(progress))

    def _records(self, xs, ys):
        x = np.zeros((len(xs), self.seq_len), np.float32)
        for j, entry in enumerate(xs):                # conversion time: a loop over records
            x[j] = vocab_lib.sent140_ids(self._text(entry), self.vocab, self.seq_len)
        return x, self._labels(ys)
