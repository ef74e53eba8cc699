"""Checkpoints of a multi-round run and what a resume needs; a checkpoint is data, never code.

A checkpoint of step t is a folder ``<out>/checkpoints/step_<t>/`` holding

* ``values/leaf_<i>.bin``: the bytes of each array of ``State.values`` (parameters, optimiser
  and server state, counters such as DP-FedSGD's participation or ISRL-DP's upload counts), C
  order, no header: the dtype and shape are in ``meta.json``;
* ``meta.json``: the format, the step t, the fingerprint of the config (:func:`fingerprint`),
  the tree's structure (dicts, lists, tuples and named tuples, so optax states come back as
  themselves), each array's dtype and shape, the history of rounds 1..t and the privacy
  ledger(s) of the state at t;
* ``digests.json``: a SHA-256 of ``meta.json`` and of every array file, checked before any of
  them is used (a damaged or edited file is refused, not trained on).

**Files are data.** Restoring parses these files into a fixed set of types: dicts, lists,
tuples, ``None``, arrays of a listed dtype (:data:`DTYPES`), Python scalars, PRNG keys of a
listed implementation, and named tuples looked up *by exact name* in a registry
(:func:`registry`): the named-tuple classes of the fresh ``init`` state of the same config (the
classes the library itself built), optax's public ``*State`` classes and the classes the
algorithm declares (``Algorithm.checkpoint_types``, e.g. DP-FNAS's retraining state). No name
read from a file is imported or walked, nothing callable is looked up, and a named tuple is
built only from exactly its declared fields. Every file is a regular file inside the
checkpoint (no symlinks), read with a size bound (:mod:`fedjax_dp.core.files`); anything else
raises :class:`CheckpointError` with one line.

The PRNG state needs no file: step t's key is ``api.step_key(root, t)``, so the resumed run
draws exactly the keys the uninterrupted run would have drawn; the ledger is a function of the
config, the data and the saved counters, so it is the same too.

Writing is atomic and durable: the folder is built under a temporary name (every file fsynced)
and renamed when complete, so a run killed (or a disk filled) while writing leaves the previous
checkpoint intact; a signal during the write takes effect after it. The last ``keep`` are kept.
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import jax
import numpy as np

from fedjax_dp.algorithms import api
from fedjax_dp.core import files, stop

FORMAT = 2
FOLDER = "checkpoints"
_PREFIX = "step_"
# run-table keys that change how a run executes, never what it computes (tested equal), so a
# run may resume with other values; every other key must match the checkpoint's config
EXECUTION_KEYS = ("progress", "checkpoint_every", "chunk_size", "agents_on", "on_nonfinite",
                  "rounds_per_call",
                  "compilation_cache", "log", "wandb_project", "log_epsilon_every", "mesh",
                  "distributed")
#: the dtypes an array of a checkpoint may have
DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "bfloat16", "float32", "float64", "complex64", "complex128")
#: the PRNG key implementations a checkpoint may name
KEY_IMPLS = ("threefry2x32", "rbg", "unsafe_rbg")
#: bounds on what a checkpoint may ask the reader to hold
MAX_META_BYTES = 512 * 2**20
MAX_ARRAYS = 100_000
MAX_ARRAY_BYTES = 64 * 2**30
_FILE_NAME = re.compile(r"^(meta\.json|values/leaf_\d{5,}\.bin)$")


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from (missing, corrupted, hostile or of another
    config)."""


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


def _class_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _encode(tree: Any, leaves: list, path: str) -> Any:
    """The JSON description of ``tree``'s structure; its leaves are appended to ``leaves``."""
    if tree is None:
        return {"none": True}
    if _is_namedtuple(tree):
        return {"namedtuple": _class_name(type(tree)),
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


def _namedtuple_classes(tree: Any) -> set[type]:
    """The named-tuple classes in ``tree`` (a state the library built)."""
    found: set[type] = set()
    stack = [tree]
    while stack:
        x = stack.pop()
        if _is_namedtuple(x):
            found.add(type(x))
            stack.extend(x)
        elif isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
    return found


def registry(template_values: Any = None, extra: tuple[type, ...] = ()) -> dict[str, type]:
    """The named-tuple classes a checkpoint may name, by exact ``module:qualname``: those in
    ``template_values`` (a fresh ``init``'s values of the same config), optax's public
    ``*State`` classes, and ``extra`` (``Algorithm.checkpoint_types``)."""
    import optax
    classes = _namedtuple_classes(template_values) | set(extra)
    classes |= {v for k, v in vars(optax).items() if k.endswith("State")
                and isinstance(v, type) and issubclass(v, tuple) and hasattr(v, "_fields")}
    return {_class_name(c): c for c in classes}


def _decode(spec: Any, leaves: list, types: dict[str, type], where: str) -> Any:
    """Rebuild the tree described by ``spec`` (parsed JSON) from ``leaves``; only the kinds
    :func:`_encode` writes, named tuples only from ``types``."""
    if not isinstance(spec, dict) or len(spec) not in (1, 2, 3):
        raise CheckpointError(f"{where}: a tree node must be a small JSON object")
    if spec.keys() == {"none"}:
        return None
    if spec.keys() == {"namedtuple", "fields"}:
        name, fields = spec["namedtuple"], spec["fields"]
        cls = types.get(name) if isinstance(name, str) else None
        if cls is None:
            raise CheckpointError(f"{where}: names the class {str(name)[:120]!r}, which is not "
                                  f"one a checkpoint of this run may hold; refusing to load it")
        if not isinstance(fields, dict) or list(fields) != list(cls._fields):
            raise CheckpointError(f"{where}: the fields of {name} must be exactly "
                                  f"{list(cls._fields)}")
        return cls(**{f: _decode(s, leaves, types, f"{where}.{f}") for f, s in fields.items()})
    if spec.keys() == {"dict"} and isinstance(spec["dict"], dict):
        return {k: _decode(s, leaves, types, f"{where}.{k}") for k, s in spec["dict"].items()}
    if spec.keys() in ({"list"}, {"tuple"}):
        (kind, items), = spec.items()
        if not isinstance(items, list):
            raise CheckpointError(f"{where}: a {kind} node must hold a JSON list")
        out = [_decode(s, leaves, types, f"{where}[{i}]") for i, s in enumerate(items)]
        return out if kind == "list" else tuple(out)
    index = spec.get("leaf")
    if type(index) is not int or not 0 <= index < len(leaves) or \
            not spec.keys() <= {"leaf", "python", "key_impl"}:
        raise CheckpointError(f"{where}: not a tree node this library writes")
    leaf = leaves[index]
    if "python" in spec:
        kinds = {"bool": bool, "int": int, "float": float}
        if spec["python"] not in kinds or leaf.shape != ():
            raise CheckpointError(f"{where}: a Python scalar must be bool, int or float")
        return kinds[spec["python"]](leaf)
    if "key_impl" in spec:
        if spec["key_impl"] not in KEY_IMPLS:
            raise CheckpointError(f"{where}: PRNG key implementation must be one of "
                                  f"{list(KEY_IMPLS)}")
        return jax.random.wrap_key_data(leaf, impl=spec["key_impl"])
    return leaf


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _leaf_file(i: int) -> str:
    return f"values/leaf_{i:05d}.bin"


# ----------------------------------------------------------------------------- save / load

def directory(out: str | Path) -> Path:
    return Path(out) / FOLDER


def saved_steps(out: str | Path) -> list[tuple[int, Path]]:
    """``(step, folder)`` of every checkpoint folder under ``out`` (real folders, not
    symlinks), oldest first."""
    root = directory(out)
    if not root.is_dir() or root.is_symlink():
        return []
    found = []
    for p in root.iterdir():
        if p.is_dir() and not p.is_symlink() and p.name.startswith(_PREFIX) \
                and p.name[len(_PREFIX):].isdigit():
            found.append((int(p.name[len(_PREFIX):]), p))
    return sorted(found)


def latest(out: str | Path) -> Path | None:
    """The newest complete checkpoint folder under ``out`` (None if there is none)."""
    steps = saved_steps(out)
    return steps[-1][1] if steps else None


def save(out: str | Path, state: api.State, *, config: dict, history: list[dict],
         ledgers: list[dict], keep: int = 2) -> Path:
    """Write step ``state.step``'s checkpoint under ``out`` atomically; keep the last ``keep``.
    A Ctrl-C or SIGTERM during the write takes effect after it; a failed write (a full disk)
    removes its temporary folder and raises :class:`fedjax_dp.core.files.WriteError`."""
    with stop.deferred():
        return _save(out, state, config=config, history=history, ledgers=ledgers, keep=keep)


def _save(out: str | Path, state: api.State, *, config: dict, history: list[dict],
          ledgers: list[dict], keep: int) -> Path:
    leaves: list = []
    structure = _encode(state.values, leaves, "values")
    host = [np.asarray(x) for x in jax.device_get(leaves)]          # tobytes(): C order
    root = directory(out)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{_PREFIX}{state.step:08d}"
    tmp = root / f".{final.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        (tmp / "values").mkdir(parents=True)
        digests = {}
        for i, x in enumerate(host):
            if x.size:
                data = x.tobytes()
                _write_new(tmp / _leaf_file(i), data)
                digests[_leaf_file(i)] = _sha256(data)
        meta = {"format": FORMAT, "step": state.step, "fingerprint": fingerprint(config),
                "structure": structure,
                "arrays": [{"dtype": str(x.dtype), "shape": list(x.shape)} for x in host],
                "history": history, "ledgers": ledgers}
        data = json.dumps(meta, indent=1).encode()
        _write_new(tmp / "meta.json", data)
        digests["meta.json"] = _sha256(data)
        _write_new(tmp / "digests.json",
                   json.dumps({"format": FORMAT, "files": digests}, indent=1).encode())
        files.fsync_folder(tmp / "values")
        files.fsync_folder(tmp)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        files.fsync_folder(root)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise files.WriteError(e.errno or 5, f"cannot write checkpoint {str(final)!r}: "
                               f"{e.strerror or e}") from None
    for _, old in saved_steps(out)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def files_of(path: str | Path) -> list[str]:
    """The files a checkpoint folder consists of (its ``digests.json`` and the files it lists,
    checked): what a multi-process run sends the other processes, nothing else of the folder."""
    return ["digests.json"] + sorted(_digests(Path(path)))


def _write_new(path: Path, data: bytes) -> None:
    with open(path, "xb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _digests(path: Path) -> dict[str, str]:
    """``digests.json`` of a checkpoint folder: ``{relative file: SHA-256}``, checked."""
    if path.is_symlink() or not path.is_dir():
        raise CheckpointError(f"checkpoint {str(path)!r} is not a folder")
    try:
        d = files.read_json(path / "digests.json", max_bytes=64 * 2**20, max_depth=3,
                            what="checkpoint digests", expect=dict)
    except files.UntrustedFileError as e:
        if not (path / "digests.json").exists() and (path / "meta.json").exists():
            raise CheckpointError(f"checkpoint {str(path)!r} was written by an earlier "
                                  f"version (format 1, no digests.json); this version reads "
                                  f"format {FORMAT}: start the run again") from None
        raise CheckpointError(f"checkpoint {str(path)!r} is corrupted or incomplete ({e})") \
            from None
    listed = d.get("files")
    if d.get("format") != FORMAT or not isinstance(listed, dict) or "meta.json" not in listed \
            or len(listed) > MAX_ARRAYS + 1 or not all(
                isinstance(k, str) and _FILE_NAME.match(k) and isinstance(v, str)
                and re.fullmatch(r"[0-9a-f]{64}", v) for k, v in listed.items()):
        raise CheckpointError(f"checkpoint {str(path)!r}: digests.json is not a format-"
                              f"{FORMAT} list of files and SHA-256 digests")
    return listed


def _read_checked(path: Path, name: str, digests: dict[str, str], max_bytes: int) -> bytes:
    """The bytes of ``path/name`` after checking them against their digest."""
    if name not in digests:
        raise CheckpointError(f"checkpoint {str(path)!r} is corrupted: {name} has no digest")
    try:
        data = files.read_bytes(path / name, max_bytes=max_bytes, what="checkpoint file")
    except files.UntrustedFileError as e:
        raise CheckpointError(f"checkpoint {str(path)!r} is corrupted or incomplete ({e})") \
            from None
    if _sha256(data) != digests[name]:
        raise CheckpointError(f"checkpoint {str(path)!r} is corrupted: {name} does not match "
                              f"its SHA-256")
    return data


def read_meta(path: str | Path) -> dict:
    """The checked ``meta.json`` of a checkpoint folder (its digest, format and field types)."""
    path = Path(path)
    digests = _digests(path)
    data = _read_checked(path, "meta.json", digests, MAX_META_BYTES)
    try:
        meta = files.parse_json(data, what=f"checkpoint {str(path)!r} meta.json")
    except files.UntrustedFileError as e:
        raise CheckpointError(str(e)) from None
    _check_meta(path, meta)
    meta["_digests"] = digests
    return meta


def _check_meta(path: Path, meta: Any) -> None:
    def bad(what: str):
        raise CheckpointError(f"checkpoint {str(path)!r}: meta.json {what}")

    if not isinstance(meta, dict):
        bad("is not a JSON object")
    if meta.get("format") != FORMAT:
        bad(f"has format {str(meta.get('format'))[:40]!r}; this version reads format {FORMAT}")
    if type(meta.get("step")) is not int or meta["step"] < 0:
        bad("step must be an integer >= 0")
    if not isinstance(meta.get("fingerprint"), str):
        bad("fingerprint must be a string")
    arrays = meta.get("arrays")
    if not isinstance(arrays, list) or len(arrays) > MAX_ARRAYS:
        bad(f"arrays must be a list of at most {MAX_ARRAYS} arrays")
    total = 0
    for i, a in enumerate(arrays):
        if not (isinstance(a, dict) and a.keys() == {"dtype", "shape"}
                and a["dtype"] in DTYPES and isinstance(a["shape"], list)
                and len(a["shape"]) <= 32
                and all(type(n) is int and n >= 0 for n in a["shape"])):
            bad(f"array {i} must be {{dtype: one of {list(DTYPES)}, shape: [int >= 0, ...]}}")
        total += int(np.prod(a["shape"], dtype=np.float64)) * jax.numpy.dtype(a["dtype"]).itemsize
    if total > MAX_ARRAY_BYTES:
        bad(f"describes {total:,} bytes of arrays, more than {MAX_ARRAY_BYTES:,}")
    history = meta.get("history")
    if not isinstance(history, list) or not all(
            isinstance(r, dict) and r.get("round") == t + 1 for t, r in enumerate(history)):
        bad("history must be a list of round records numbered 1, 2, ...")
    if not isinstance(meta.get("ledgers"), list):
        bad("ledgers must be a list")
    if not isinstance(meta.get("structure"), dict):
        bad("structure must be a JSON object")


def check_config(path: str | Path, config: dict) -> dict:
    """The checkpoint's meta, after checking it was written by a run of ``config``."""
    meta = read_meta(path)
    if meta["fingerprint"] != fingerprint(config):
        raise CheckpointError(f"checkpoint {str(path)!r} belongs to a different config (only "
                              f"run.{{{', '.join(EXECUTION_KEYS)}}} may change on resume)")
    return meta


def restore(path: str | Path, template: api.State, config: dict,
            types: tuple[type, ...] = ()) -> tuple[api.State, dict]:
    """The state saved at ``path`` (its context is ``template``'s: a fresh ``init`` of the same
    config) and the checkpoint's meta. ``types``: named-tuple classes a later state holds that
    the template does not (:func:`registry`). Refuses another config's, a corrupted, a hostile
    or a mismatched checkpoint with :class:`CheckpointError`."""
    path = Path(path)
    meta = check_config(path, config)
    digests = meta.pop("_digests")
    leaves = []
    for i, a in enumerate(meta["arrays"]):
        dtype, shape = jax.numpy.dtype(a["dtype"]), tuple(a["shape"])
        size = int(np.prod(shape, dtype=np.int64))
        if size == 0:
            leaves.append(np.zeros(shape, dtype))
            continue
        nbytes = size * dtype.itemsize
        data = _read_checked(path, _leaf_file(i), digests, nbytes)
        if len(data) != nbytes:
            raise CheckpointError(f"checkpoint {str(path)!r} is corrupted: array {i} holds "
                                  f"{len(data)} bytes, its shape needs {nbytes}")
        leaves.append(np.frombuffer(data, dtype).reshape(shape).copy())
    values = _decode(meta["structure"], leaves, registry(template.values, types), "values")
    values = _like_template(values, template.values, path)
    return api.State(step=meta["step"], values=values, context=template.context), meta


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
        if isinstance(t, jax.Array) and not t.is_fully_addressable:
            return _place_global(leaf, t.sharding)
        if isinstance(t, jax.Array):
            # committed as the template is: an uncommitted template (a run's fresh state) gets
            # an uncommitted array on the default device, so the restored run calls the very
            # program the run compiled (jit keys its programs on commitment, too)
            return jax.device_put(leaf, t.sharding if t.committed else None)
        if isinstance(t, np.generic):
            return leaf[()]
        return leaf                        # host arrays stay host arrays (dtype kept)

    return jax.tree_util.tree_map_with_path(place, values)


def _place_global(leaf: Any, sharding) -> jax.Array:
    """A restored (host-side, identical on every process) array placed on a sharding over
    several processes' devices: each process puts its own shards from its copy (no transfer
    between hosts); PRNG keys through their key data."""
    if isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        impl = jax.random.key_impl(leaf)
        data = np.asarray(jax.random.key_data(leaf))
        return jax.jit(lambda d: jax.random.wrap_key_data(d, impl=impl),
                       out_shardings=sharding)(data)
    return jax.device_put(np.asarray(leaf), sharding)


def _dtype(x: Any):
    return x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype


def _flat(tree: Any) -> list[tuple[str, Any]]:
    return [(jax.tree_util.keystr(kp), leaf)
            for kp, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]]
