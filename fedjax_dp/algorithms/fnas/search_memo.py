"""Replay of search epochs already run in this process, so one search retrained several ways
(the ``algorithm.retrain_seed`` grid of ``configs/experiments/fnas_discriminative.toml``) costs
one search.

A search epoch is a deterministic function of the search's config (every field but the
retraining ones), the step's key and the parties' data. :func:`lookup` returns the stored outcome
of such an epoch (the new search value, its metrics and its seconds), :func:`store` keeps it.
The replayed search still *happened*: its privacy cost is charged as before. The memo holds ONE
search config at a time (a new one clears it), in host memory, at most :func:`max_bytes` of
search values; past that a run recomputes the epochs not stored.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import Any

import jax
import numpy as np

#: Config fields that only shape the retraining (normalised away from the memo key).
RETRAIN_FIELDS = ("retrain_epochs", "retrain_batch_size", "retrain_lr", "retrain_channels",
                  "retrain_cells", "clip_retrain", "noise_retrain", "private_retrain",
                  "retrain_seed")

#: The most bytes of search values the memo holds, whatever the machine's memory.
MAX_BYTES = 8 * 2 ** 30


def max_bytes() -> int:
    """The memo's budget: a quarter of the host's physical memory, at most :data:`MAX_BYTES`."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = 4 * 2 ** 30
    return min(MAX_BYTES, total // 4)

_memo: dict = {}
_owner: list = [None]             # the search config the memo holds
_bytes: list = [0]


def search_config(config: Any) -> Any:
    """``config`` with every retraining field at its default: equal for runs whose searches are
    equal."""
    defaults = {f.name: f.default for f in dataclasses.fields(config) if f.name in RETRAIN_FIELDS}
    return dataclasses.replace(config, **defaults)


def fingerprint(tree: Any) -> str:
    """A SHA-256 of every leaf's shape, dtype and bytes (the parties' search data). A global
    array spanning several processes (the data split over a multi-process mesh) is hashed from
    this process's shards, and the processes' digests are then gathered and hashed together
    (``process_allgather``, every process calls it): equal on every process, and a change of
    any process's parties changes it everywhere (so every process hits or misses the memo)."""
    h = hashlib.sha256()
    spread = False
    for leaf in jax.tree.leaves(tree):
        if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
            spread = True
            h.update(repr((leaf.shape, np.dtype(leaf.dtype).str)).encode())
            shards = sorted(leaf.addressable_shards,
                            key=lambda s: [i.indices(n)[:2] for i, n in zip(s.index, leaf.shape)])
            for s in shards:
                h.update(repr(s.index).encode())
                h.update(np.ascontiguousarray(np.asarray(s.data)).tobytes())
            continue
        a = np.asarray(leaf)
        h.update(repr((a.shape, a.dtype.str)).encode())
        h.update(np.ascontiguousarray(a).tobytes())
    if not spread:
        return h.hexdigest()
    from jax.experimental import multihost_utils
    digests = multihost_utils.process_allgather(np.frombuffer(h.digest(), np.uint8))
    return hashlib.sha256(np.ascontiguousarray(digests).tobytes()).hexdigest()


def _key(config: Any, data_id: str, step_key: jax.Array, t: int) -> tuple:
    return (search_config(config), data_id, int(t),
            np.asarray(jax.random.key_data(step_key)).tobytes())


def lookup(config: Any, data_id: str, step_key: jax.Array, t: int) -> tuple | None:
    """``(value, metrics, seconds)`` of search epoch ``t`` run with ``step_key`` (the value back
    on the default device), or None."""
    hit = _memo.get(_key(config, data_id, step_key, t))
    if hit is None:
        return None
    value, metrics, seconds = hit
    return jax.tree.map(jax.numpy.asarray, value), dict(metrics), seconds


def store(config: Any, data_id: str, step_key: jax.Array, t: int, value: Any, metrics: dict,
          seconds: float) -> None:
    """Keep search epoch ``t``'s outcome (clears the memo first if it held another search
    config; the seeds of one config, each with its own data, are kept side by side)."""
    owner = search_config(config)
    if _owner[0] != owner:
        clear()
        _owner[0] = owner
    size = sum(int(np.prod(np.shape(x))) * np.dtype(x.dtype).itemsize
               for x in jax.tree.leaves(value))
    if _bytes[0] + size > max_bytes():
        return
    _bytes[0] += size
    host = jax.device_get(value)                     # numpy leaves: host memory
    _memo[_key(config, data_id, step_key, t)] = (host, dict(metrics), float(seconds))


def clear() -> None:
    """Forget every stored epoch."""
    _memo.clear()
    _owner[0] = None
    _bytes[0] = 0
