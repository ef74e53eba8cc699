"""Checkpoints of a multi-round run (orbax) and what a resume needs.

A checkpoint of step t is a folder ``<out>/checkpoints/step_<t>/`` holding

* ``values/``: the arrays of ``State.values`` (parameters, optimiser and server state, counters
  such as DP-FedSGD's participation or ISRL-DP's upload counts), written by orbax as a flat
  ``{"leaf_00000": array, ...}`` tree;
* ``meta.json``: the step t, the fingerprint of the config (:func:`fingerprint`), the tree's
  structure (dicts, lists, tuples and named tuples, so optax states come back as themselves), a
  SHA-256 of every leaf and of every file under ``values/`` (a corrupted file is refused, not
  trained on), the history of rounds
  1..t and the privacy ledger(s) of the state at t.

The PRNG state needs no file: step t's key is ``api.step_key(root, t)``, so the resumed run
draws exactly the keys the uninterrupted run would have drawn; the ledger is a function of the
config, the data and the saved counters, so it is the same too.

Writing is atomic: the folder is built under a temporary name and renamed when complete, so a
run killed while writing leaves the previous checkpoint intact. The last ``keep`` are kept.
"""
from __future__ import annotations

import contextlib
import copy
import hashlib
import importlib
import json
import os
import shutil
import signal
import threading
from pathlib import Path
from typing import Any

import jax
import numpy as np

from fedjax_dp.algorithms import api

FORMAT = 1
FOLDER = "checkpoints"
_PREFIX = "step_"
# run-table keys that change how a run executes, never what it computes (tested equal), so a
# run may resume with other values; every other key must match the checkpoint's config
EXECUTION_KEYS = ("progress", "checkpoint_every", "chunk_size", "agents_on", "on_nonfinite",
                  "rounds_per_call",
                  "compilation_cache", "log", "wandb_project", "log_epsilon_every")
# modules whose named tuples may appear in a state (optax states, the library's own)
_TRUSTED_MODULES = ("fedjax_dp.", "optax.", "flax.", "chex.")


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from (missing, corrupted, or of another config)."""


# keys added to the config after runs were stored, with the value every earlier run had: left
# out of the fingerprint when they hold it, so those runs still resume and match
LATER_KEYS = {("train", "batching"): "replacement", ("data", "validation_split"): "pooled",
              ("data", "validation_seed"): -1, ("model", "options"): {}, ("data", "features"): {}}


def fingerprint(config: dict) -> str:
    """SHA-256 of the resolved config without the execution-only ``[run]`` keys (and without
    later-added keys at their earlier behaviour, :data:`LATER_KEYS`)."""
    c = copy.deepcopy(config)
    for k in EXECUTION_KEYS:
        c.get("run", {}).pop(k, None)
    for (table, k), value in LATER_KEYS.items():
        if c.get(table, {}).get(k, value) == value:
            c.get(table, {}).pop(k, None)
    return hashlib.sha256(json.dumps(c, sort_keys=True).encode()).hexdigest()


# ----------------------------------------------------------------------------- tree structure

def _is_namedtuple(x: Any) -> bool:
    return isinstance(x, tuple) and hasattr(x, "_fields")


def _is_leaf(x: Any) -> bool:
    return isinstance(x, (jax.Array, np.ndarray, np.generic, bool, int, float))


def _encode(tree: Any, leaves: list, path: str) -> Any:
    """The JSON description of ``tree``'s structure; its leaves are appended to ``leaves``."""
    if tree is None:
        return {"none": True}
    if _is_namedtuple(tree):
        cls = type(tree)
        return {"namedtuple": f"{cls.__module__}:{cls.__qualname__}",
                "fields": {f: _encode(getattr(tree, f), leaves, f"{path}.{f}")
                           for f in tree._fields}}
    if isinstance(tree, dict):
        if not all(isinstance(k, str) for k in tree):
            raise CheckpointError(f"cannot checkpoint {path}: dict keys must be strings")
        return {"dict": {k: _encode(v, leaves, f"{path}.{k}") for k, v in tree.items()}}
    if isinstance(tree, (list, tuple)):
        kind = "list" if isinstance(tree, list) else "tuple"
        return {kind: [_encode(v, leaves, f"{path}[{i}]") for i, v in enumerate(tree)]}
    if _is_leaf(tree):
        entry: dict = {"leaf": len(leaves)}
        if isinstance(tree, (bool, int, float)) and not isinstance(tree, np.generic):
            entry["python"] = type(tree).__name__
        elif isinstance(tree, jax.Array) and jax.dtypes.issubdtype(tree.dtype,
                                                                    jax.dtypes.prng_key):
            entry["key_impl"] = str(jax.random.key_impl(tree))
            tree = jax.random.key_data(tree)
        leaves.append(tree)
        return entry
    raise CheckpointError(f"cannot checkpoint {path}: a {type(tree).__name__} is not an array, "
                          f"a dict, a list, a tuple or a named tuple")


def _namedtuple_class(name: str):
    module, qualname = name.split(":")
    if not module.startswith(_TRUSTED_MODULES):
        raise CheckpointError(f"checkpoint names the class {name!r} outside the trusted "
                              f"modules {list(_TRUSTED_MODULES)}; refusing to load it")
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _decode(spec: Any, leaves: list) -> Any:
    if "none" in spec:
        return None
    if "namedtuple" in spec:
        cls = _namedtuple_class(spec["namedtuple"])
        return cls(**{f: _decode(s, leaves) for f, s in spec["fields"].items()})
    if "dict" in spec:
        return {k: _decode(s, leaves) for k, s in spec["dict"].items()}
    if "list" in spec:
        return [_decode(s, leaves) for s in spec["list"]]
    if "tuple" in spec:
        return tuple(_decode(s, leaves) for s in spec["tuple"])
    leaf = leaves[spec["leaf"]]
    if "python" in spec:
        return {"bool": bool, "int": int, "float": float}[spec["python"]](leaf)
    if "key_impl" in spec:
        return jax.random.wrap_key_data(leaf, impl=spec["key_impl"])
    return leaf


def _digest(leaf: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(leaf).tobytes() + str(leaf.dtype).encode()
                          + str(leaf.shape).encode()).hexdigest()


def _file_digests(folder: Path) -> dict[str, str]:
    """SHA-256 of every file orbax wrote under ``folder``, by relative path: checked before orbax
    reads, so a damaged file is refused before orbax's readers fail in background tasks (which
    then report to stderr after the run has moved on)."""
    return {f.relative_to(folder).as_posix(): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in sorted(folder.rglob("*")) if f.is_file()}


def _leaf_name(i: int) -> str:
    return f"leaf_{i:05d}"


# ----------------------------------------------------------------------------- save / load

def directory(out: str | Path) -> Path:
    return Path(out) / FOLDER


def saved_steps(out: str | Path) -> list[tuple[int, Path]]:
    """``(step, folder)`` of every checkpoint folder under ``out``, oldest first."""
    root = directory(out)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        if p.is_dir() and p.name.startswith(_PREFIX) and p.name[len(_PREFIX):].isdigit():
            found.append((int(p.name[len(_PREFIX):]), p))
    return sorted(found)


def latest(out: str | Path) -> Path | None:
    """The newest complete checkpoint folder under ``out`` (None if there is none)."""
    steps = saved_steps(out)
    return steps[-1][1] if steps else None


@contextlib.contextmanager
def _signals_deferred():
    """Ctrl-C / SIGTERM arriving while a checkpoint is written take effect once it is written
    (milliseconds): orbax finishes its writes in background threads, which an exception raised in
    the middle would leave running until the interpreter stops (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: received.append(signum))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(received):
            handler = previous[sig]
            if callable(handler):
                handler(sig, None)                    # e.g. Python's: raises KeyboardInterrupt
            elif handler == signal.SIG_DFL:
                os.kill(os.getpid(), sig)


def save(out: str | Path, state: api.State, *, config: dict, history: list[dict],
         ledgers: list[dict], keep: int = 2) -> Path:
    """Write step ``state.step``'s checkpoint under ``out`` atomically; keep the last ``keep``.
    A Ctrl-C or SIGTERM during the write takes effect after it."""
    with _signals_deferred():
        return _save(out, state, config=config, history=history, ledgers=ledgers, keep=keep)


def _save(out: str | Path, state: api.State, *, config: dict, history: list[dict],
          ledgers: list[dict], keep: int) -> Path:
    import orbax.checkpoint as ocp
    leaves: list = []
    structure = _encode(state.values, leaves, "values")
    host = [np.asarray(x) for x in jax.device_get(leaves)]
    root = directory(out).absolute()          # orbax refuses relative paths
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{_PREFIX}{state.step:08d}"
    tmp = root / f".{final.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    stored = {_leaf_name(i): x for i, x in enumerate(host) if x.size}   # orbax: no empty arrays
    if stored:
        ocp.PyTreeCheckpointer().save(tmp / "values", stored)
    meta = {"format": FORMAT, "step": state.step, "fingerprint": fingerprint(config),
            "structure": structure, "digests": [_digest(x) for x in host],
            "files": _file_digests(tmp / "values") if stored else {},
            "arrays": [{"dtype": str(x.dtype), "shape": list(x.shape)} for x in host],
            "history": history, "ledgers": ledgers}
    (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    for _, old in saved_steps(out)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def read_meta(path: str | Path) -> dict:
    path = Path(path)
    try:
        meta = json.loads((path / "meta.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"checkpoint {str(path)!r} is corrupted or incomplete "
                              f"(meta.json: {e})") from None
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {str(path)!r} has format {meta.get('format')!r}; "
                              f"this version reads format {FORMAT}")
    return meta


def check_config(path: str | Path, config: dict) -> dict:
    """The checkpoint's meta, after checking it was written by a run of ``config``."""
    meta = read_meta(path)
    if meta["fingerprint"] != fingerprint(config):
        raise CheckpointError(f"checkpoint {str(path)!r} belongs to a different config (only "
                              f"run.{{{', '.join(EXECUTION_KEYS)}}} may change on resume)")
    return meta


def restore(path: str | Path, template: api.State, config: dict) -> tuple[api.State, dict]:
    """The state saved at ``path`` (its context is ``template``'s: a fresh ``init`` of the same
    config) and the checkpoint's meta. Refuses another config's, a corrupted or a mismatched
    checkpoint with :class:`CheckpointError`."""
    import orbax.checkpoint as ocp
    path = Path(path).absolute()              # orbax refuses relative paths
    meta = check_config(path, config)
    arrays = [(jax.numpy.dtype(a["dtype"]), tuple(a["shape"])) for a in meta["arrays"]]
    leaves = [np.zeros(shape, dtype) for dtype, shape in arrays]          # the empty ones stay
    if any(np.prod(shape) for _, shape in arrays):
        # checkpoints written before file digests have no "files"
        if "files" in meta and _file_digests(path / "values") != meta["files"]:
            raise CheckpointError(f"checkpoint {str(path)!r} is corrupted: its array files do "
                                  f"not match their SHA-256")
        try:
            raw = ocp.PyTreeCheckpointer().restore(path / "values")
            for i, (dtype, shape) in enumerate(arrays):
                if np.prod(shape):
                    leaves[i] = np.asarray(raw[_leaf_name(i)]).astype(dtype, copy=False)
        except Exception as e:      # orbax / tensorstore raise many types on damaged files
            raise CheckpointError(f"checkpoint {str(path)!r} is corrupted: its arrays cannot "
                                  f"be read ({type(e).__name__}: {str(e)[:200]})") from None
    for i, (leaf, digest) in enumerate(zip(leaves, meta["digests"])):
        if _digest(leaf) != digest:
            raise CheckpointError(f"checkpoint {str(path)!r} is corrupted: array {i} does not "
                                  f"match its SHA-256")
    values = _decode(meta["structure"], leaves)
    values = _like_template(values, template.values, path)
    return api.State(step=int(meta["step"]), values=values, context=template.context), meta


def _like_template(values: Any, template: Any, path: Path) -> Any:
    """Check every array the template has against the restored one (same shape and dtype) and
    place it as the template's is placed (device and sharding, or host); arrays the template
    lacks (state that appears later in a run) stay host arrays."""
    got = dict(_flat(values))
    want = dict(_flat(template))
    missing = sorted(set(want) - set(got))
    if missing:
        raise CheckpointError(f"checkpoint {str(path)!r} does not match this run: it lacks "
                              f"{missing[:5]}")
    for name, t in want.items():
        g = got[name]
        gd, td = _dtype(g), _dtype(t)
        if np.shape(g) != np.shape(t) or gd != td:
            raise CheckpointError(f"checkpoint {str(path)!r} does not match this run: {name} "
                                  f"is {gd}{list(np.shape(g))}, expected {td}{list(np.shape(t))}")

    def place(kp, leaf):
        t = want.get(jax.tree_util.keystr(kp))
        if isinstance(t, jax.Array):
            return jax.device_put(leaf, t.sharding)
        if isinstance(t, np.generic):
            return leaf[()]
        return leaf                        # host arrays stay host arrays (dtype kept)

    return jax.tree_util.tree_map_with_path(place, values)


def _dtype(x: Any):
    return x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype


def _flat(tree: Any) -> list[tuple[str, Any]]:
    return [(jax.tree_util.keystr(kp), leaf)
            for kp, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]]
