"""FedKT's files: the noise-free vote histograms a run writes (``votes.npz``) and reads back.

:func:`save_votes` writes what :func:`load_votes` reads, the input of
``fedjax-dp account fedkt --votes FILE`` (:func:`fedjax_dp.algorithms.fedkt.privacy.account`).
Written atomically; read as data: arrays only (no pickle), at most :data:`MAX_VOTES_BYTES`.
"""
from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np

#: a votes file (its arrays, uncompressed) is at most this long
MAX_VOTES_BYTES = 4 << 30


def save_votes(path, votes, z: int | None = None) -> Path:
    """``votes`` (and ``z`` when not None) as a compressed ``.npz`` at ``path``, atomically."""
    from fedjax_dp.core import files
    path = Path(path)
    buf = io.BytesIO()
    np.savez_compressed(buf, votes=np.asarray(votes),
                        **({"z": np.asarray(z)} if z is not None else {}))
    files.write_bytes(path, buf.getvalue())
    return path


def _z(value, where: str) -> int | None:
    """``z`` as read: None, or one integer."""
    if value is None:
        return None
    a = np.asarray(value)
    if a.shape != () or a.dtype.kind not in "iuf" or not float(a).is_integer():
        raise ValueError(f"--votes {where}: z must be one integer, got {value!r}")
    return int(a)


def load_votes(path) -> tuple[np.ndarray, int | None]:
    """``(votes, z)`` from a ``.npz`` (key ``votes``, optional ``z``) or ``.json`` file
    (``{"votes": [...], "z": ...}`` or a bare nested list); anything else is a one-line
    ValueError naming the file."""
    from fedjax_dp.core import files
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"--votes file {str(p)!r} does not exist")
    where = repr(str(p))
    if p.suffix == ".npz":
        try:
            with zipfile.ZipFile(p) as zf:
                size = sum(i.file_size for i in zf.infolist())
            if size > MAX_VOTES_BYTES:
                raise ValueError(f"its arrays take {size:,} bytes, more than {MAX_VOTES_BYTES:,}")
            with np.load(p, allow_pickle=False) as f:
                if "votes" in f.files:
                    votes, z = f["votes"], (f["z"] if "z" in f.files else None)
                elif len(f.files) == 1:
                    votes, z = f[f.files[0]], None
                else:
                    raise ValueError(f"must hold an array named 'votes', got {f.files}")
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
            raise ValueError(f"--votes file {where} is not a votes archive: "
                             f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    elif p.suffix == ".json":
        data = files.read_json(p, max_bytes=MAX_VOTES_BYTES, max_depth=32, root="/",
                               what="--votes file")           # the file named: followed
        if isinstance(data, dict):
            if "votes" not in data:
                raise ValueError(f"--votes file {where}: a JSON object must have a 'votes' key")
            votes, z = data["votes"], data.get("z")
        else:
            votes, z = data, None
        try:
            votes = np.asarray(votes)
        except (ValueError, TypeError) as e:
            raise ValueError(f"--votes file {where}: votes must be a numeric array [..., Q, C] "
                             f"({str(e).splitlines()[0]})") from None
    else:
        raise ValueError(f"--votes must be a .npz or .json file, got {p.suffix!r}")
    if votes.dtype.kind not in "iuf" or votes.ndim < 2:
        raise ValueError(f"votes must be a numeric array [..., Q, C], got shape {votes.shape}")
    return votes, _z(z, where)
