"""FedKT's files: the noise-free vote histograms a run writes (``votes.npz``) and reads back.

:func:`save_votes` writes what :func:`load_votes` reads, the input of
``fedjax-dp account fedkt --votes FILE`` (:func:`fedjax_dp.algorithms.fedkt.privacy.account`).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def save_votes(path, votes, z: int | None = None) -> Path:
    """``votes`` (and ``z`` when not None) as a compressed ``.npz`` at ``path``."""
    path = Path(path)
    np.savez_compressed(path, votes=np.asarray(votes),
                        **({"z": np.asarray(z)} if z is not None else {}))
    return path


def load_votes(path) -> tuple[np.ndarray, int | None]:
    """``(votes, z)`` from a ``.npz`` (key ``votes``, optional ``z``) or ``.json`` file
    (``{"votes": [...], "z": ...}`` or a bare nested list)."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"--votes file {str(p)!r} does not exist")
    if p.suffix == ".npz":
        with np.load(p) as f:
            if "votes" in f.files:
                votes, z = f["votes"], (int(f["z"]) if "z" in f.files else None)
            elif len(f.files) == 1:
                votes, z = f[f.files[0]], None
            else:
                raise ValueError(f"--votes npz must hold an array named 'votes', got {f.files}")
    elif p.suffix == ".json":
        data = json.loads(p.read_text())
        if isinstance(data, dict):
            if "votes" not in data:
                raise ValueError("--votes JSON object must have a 'votes' key")
            votes, z = data["votes"], data.get("z")
        else:
            votes, z = data, None
        votes = np.asarray(votes)
    else:
        raise ValueError(f"--votes must be a .npz or .json file, got {p.suffix!r}")
    if votes.dtype.kind not in "iuf" or votes.ndim < 2:
        raise ValueError(f"votes must be a numeric array [..., Q, C], got shape {votes.shape}")
    return votes, (None if z is None else int(z))
