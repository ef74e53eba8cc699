"""Small files in the published layouts of TFF's HDF5 and LEAF's JSON federated datasets (for
tests/test_federated_formats.py and tests/test_data_convert.py; generated, nothing downloads).

TFF (``HDF5ClientData``): ``examples/<client_id>/<feature> [n, ...]``; LEAF: ``{"users",
"num_samples", "user_data": {user: {"x", "y"}}}`` shards in ``train/`` and ``test/``.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

h5py = __import__("pytest").importorskip("h5py")


def write_tff(path: Path, clients: dict[str, dict[str, np.ndarray]]) -> Path:
    """One TFF client file: ``clients[id][feature]`` arrays (string features as bytes lists)."""
    with h5py.File(path, "w") as f:
        for cid, feats in clients.items():
            g = f.create_group(f"examples/{cid}")
            for name, value in feats.items():
                if isinstance(value, list):           # variable-length byte strings
                    g.create_dataset(name, data=np.array(value, dtype=object),
                                     dtype=h5py.string_dtype())
                else:
                    g[name] = value
    return path


def emnist_clients(rng, sizes, num_classes=62) -> dict:
    """``{client_id: {"pixels" [n,28,28] f32, "label" [n] i32}}`` with TFF-like writer ids."""
    out = {}
    for c, n in enumerate(sizes):
        out[f"f{c:04d}_{c % 7:02d}"] = {
            "pixels": rng.random((n, 28, 28), dtype=np.float32),
            "label": rng.integers(0, num_classes, n).astype(np.int32)}
    return out


def write_emnist(folder: Path, rng, train_sizes, test_sizes, *, digits=False) -> Path:
    """``fed_emnist[_digitsonly]_{train,test}.h5`` in ``folder``; the test file's clients are
    the train file's first ``len(test_sizes)`` ids (TFF splits each writer's examples)."""
    prefix = "fed_emnist_digitsonly" if digits else "fed_emnist"
    k = 10 if digits else 62
    train = emnist_clients(rng, train_sizes, k)
    test = {cid: v for cid, v in zip(train, emnist_clients(rng, test_sizes, k).values())}
    write_tff(folder / f"{prefix}_train.h5", train)
    write_tff(folder / f"{prefix}_test.h5", test)
    return folder


def write_leaf(folder: Path, split: str, shards: list[dict[str, tuple[list, list]]]) -> None:
    """LEAF shards ``folder/split/all_data_<i>_niid_0_keep_0_<split>_9.json``, shard i holding
    ``{user: (xs, ys)}``."""
    d = folder / split
    d.mkdir(parents=True, exist_ok=True)
    for i, users in enumerate(shards):
        doc = {"users": list(users), "num_samples": [len(v[1]) for v in users.values()],
               "user_data": {u: {"x": xs, "y": ys} for u, (xs, ys) in users.items()},
               "hierarchies": []}
        (d / f"all_data_{i}_niid_0_keep_0_{split}_9.json").write_text(json.dumps(doc))
