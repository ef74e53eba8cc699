"""Stacked agents: N agents' ragged local datasets as arrays with a leading agent axis.

Layout (the contract every algorithm relies on)::

    x      [N, n_max, *feature_shape]   float   agent i's records in rows [0, counts[i])
    y      [N, n_max]                   int32   labels (0 in padded rows)
    mask   [N, n_max]                   bool    True exactly for rows < counts[i]
    counts [N]                          int32   number of real records per agent

A next-token task (:mod:`fedjax_dp.models.tasks`) stacks sequences: ``x [N, n_max, T]`` int32
input token ids and ``y [N, n_max, T]`` int32 target ids (a label per position; padded rows and
positions hold the pad id 0); ``mask`` and ``counts`` stay per record (per sequence).

Real records always come first and padding last, so "draw a uniformly random real record" is
``randint(0, counts[i])`` and "is this row real" is ``mask``. Padded rows hold zeros and must never
contribute to a loss, a vote or a neighbour search: every consumer multiplies by or selects on
``mask``.

The leaves are device arrays (``from_ragged``) or host numpy arrays, possibly memory-mapped ``.npy``
files (``on_host``, ``from_arrays``, ``load_stacked``, ``stack_records``): then only a round's
cohort, or one chunk of agents, is copied to the device at a time (:mod:`fedjax_dp.core.cohort`), so
N is bounded by host memory or disk."""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.core import agent_stream, defaults as defaults_lib, validation
from fedjax_dp.core.lift import num_chunks


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class StackedData:
    """Padded local datasets of N agents (a pytree; every leaf has leading axis N)."""

    x: jax.Array       # [N, n_max, *feature_shape]
    y: jax.Array       # [N, n_max] (a next-token task: [N, n_max, T])
    mask: jax.Array    # [N, n_max]
    counts: jax.Array  # [N]

    @property
    def num_agents(self) -> int:
        return int(self.x.shape[0])

    @property
    def max_size(self) -> int:
        return int(self.x.shape[1])

    @property
    def feature_shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[2:])

    def agent(self, i: int) -> "StackedData":
        """Agent ``i`` alone, as a one-agent StackedData (for loops in tests and debugging)."""
        return jax.tree.map(lambda a: a[i:i + 1], self)

    def local(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Agent ``i``'s real records (unpadded) as host arrays ``(x [n_i, ...], y [n_i, ...])``."""
        n = int(self.counts[i])
        return np.asarray(self.x[i, :n]), np.asarray(self.y[i, :n])

    def take(self, agent_indices) -> "StackedData":
        """The sub-population of the given agents (gather on the agent axis; stays on the host
        for host-resident data)."""
        if is_on_host(self):
            idx = np.asarray(agent_indices)
            return jax.tree.map(lambda a: np.take(a, idx, axis=0), self)
        idx = jnp.asarray(agent_indices)
        return jax.tree.map(lambda a: a[idx], self)

    def on_host(self) -> "StackedData":
        """The same agents as host numpy arrays (device-resident data is copied once)."""
        return jax.tree.map(np.asarray, self)

    def on_device(self) -> "StackedData":
        """The same agents as device arrays (``jax.device_put``: a copy, no compilation)."""
        return jax.tree.map(lambda a: a if isinstance(a, jax.Array) else jax.device_put(a), self)

    @property
    def nbytes(self) -> int:
        """Bytes held by the four arrays."""
        return int(sum(np.dtype(a.dtype).itemsize * int(np.prod(a.shape))
                       for a in jax.tree.leaves(self)))


def is_on_host(data: StackedData) -> bool:
    """True when the agents' arrays are numpy (or memory-mapped) host arrays, not device arrays."""
    return isinstance(data.x, np.ndarray)


def check_agents(data: StackedData, *, min_records: int = 1, what: str = "to vote") -> None:
    """Before any work: at least one agent, every agent with ``>= min_records`` records, and
    (host data, read in 64 MB slices so a memory map is never loaded whole) finite features."""
    n = data.num_agents
    if n < 1:
        raise ValueError("data.agents must hold at least one agent, got 0")
    counts = np.asarray(data.counts)
    small = np.flatnonzero(counts < min_records)
    if small.size:
        raise ValueError(f"agents {small[:10].tolist()} hold fewer than {min_records} record(s); "
                         f"every agent needs at least {min_records} {what}")
    if is_on_host(data):
        step = max(1, (64 << 20) // max(1, data.x[:1].nbytes))
        for start in range(0, n, step):
            if not np.isfinite(data.x[start:start + step]).all():
                raise ValueError(f"data.agents.x has NaN or infinite features (agents {start}.."
                                 f"{min(n, start + step) - 1}); features must be finite")
            release_pages(data.x)            # a memory map's scanned pages: not kept resident


def from_arrays(x, y, counts, *, check: bool = True) -> StackedData:
    """Host-resident stacked data from already padded arrays (no copy; memory maps allowed).

    Args:
      x: ``[N, n_max, *feature_shape]`` float records, real rows first in every agent.
      y: ``[N, n_max]`` integer labels (a next-token task: ``[N, n_max, T]`` target ids).
      counts: ``[N]`` number of real records per agent, in ``[0, n_max]``.
      check: validate shapes, counts and (in chunks, so a memory map is never read whole at once)
        that the features are finite.
    """
    counts = np.asarray(counts)
    if check:
        if np.ndim(x) < 2:
            raise ValueError(f"x must have shape [N, n_max, ...], got {np.shape(x)}")
        n, n_max = x.shape[:2]
        if n == 0:
            raise ValueError("x must hold at least one agent, got N = 0")
        if tuple(np.shape(y)[:2]) != (n, n_max):
            raise ValueError(f"y must have shape [{n}, {n_max}] (or [{n}, {n_max}, T] for "
                             f"sequences) to match x, got {np.shape(y)}")
        if counts.shape != (n,):
            raise ValueError(f"counts must have shape [{n}], got {counts.shape}")
        if counts.dtype.kind not in "iu":
            raise ValueError(f"counts must be integers, got dtype {counts.dtype}")
        if counts.size and (counts.min() < 0 or counts.max() > n_max):
            raise ValueError(f"counts must be in [0, {n_max}] (the padded length), got values in "
                             f"[{counts.min()}, {counts.max()}]")
        if np.dtype(y.dtype).kind not in "iu":
            raise ValueError(f"y must hold integer labels, got dtype {y.dtype}")
        step = max(1, (64 << 20) // max(1, x[:1].nbytes))
        for start in range(0, n if np.dtype(x.dtype).kind == "f" else 0, step):
            if not np.isfinite(x[start:start + step]).all():
                raise ValueError(f"x has NaN or infinite features (agents {start}.."
                                 f"{min(n, start + step) - 1}); features must be finite")
            release_pages(x)
    n_max = x.shape[1]
    mask = np.arange(n_max)[None, :] < counts[:, None]
    return StackedData(x=x, y=y, mask=mask, counts=counts.astype(np.int32))


def release_pages(a) -> None:
    """Drop the pages of a read-only memory map ``a`` that this process has read (re-read from
    the file when touched again), so scanning a memory-mapped population does not leave it all
    in resident memory. Nothing for other arrays."""
    import mmap
    m = getattr(a, "_mmap", None)
    if m is None or getattr(a, "mode", None) != "r" or not hasattr(mmap, "MADV_DONTNEED"):
        return
    try:
        m.madvise(mmap.MADV_DONTNEED)
    except (OSError, ValueError):
        pass


def save_stacked(path, data: StackedData) -> None:
    """Write ``x.npy``, ``y.npy``, ``counts.npy`` into the folder ``path`` (for :func:`load_stacked`)."""
    from pathlib import Path
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("x", "y", "counts"):
        np.save(out / f"{name}.npy", np.asarray(getattr(data, name)))


def load_stacked(path, *, mmap: bool = True) -> StackedData:
    """Host-resident agents from a folder written by :func:`save_stacked` (memory-mapped by
    default: rows are read from disk only when a cohort or chunk gathers them)."""
    from pathlib import Path
    folder = Path(path)
    missing = [n for n in ("x", "y", "counts") if not (folder / f"{n}.npy").is_file()]
    if missing:
        raise FileNotFoundError(f"{folder} must hold x.npy, y.npy and counts.npy "
                                f"(save_stacked); missing {missing}")
    mode = "r" if mmap else None
    arrays = []
    for n in ("x", "y", "counts"):          # arrays only (no pickle), each named in an error
        try:
            arrays.append(np.load(folder / f"{n}.npy", mmap_mode=mode, allow_pickle=False))
        except (ValueError, OSError, EOFError) as e:
            raise ValueError(f"{n}.npy: {str(e).splitlines()[0] if str(e) else e!r}") from None
    x, y, counts = arrays
    return from_arrays(x, y, np.asarray(counts))


def from_ragged(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray], *,
                pad_to: int | None = None, dtype=np.float32,
                allow_empty: bool = False) -> StackedData:
    """Stack a list of per-agent arrays (ragged lengths) into a padded :class:`StackedData`.

    Args:
      xs: N arrays ``[n_i, *feature_shape]`` (same feature shape for all agents).
      ys: N integer label arrays ``[n_i]`` (sequences: ``[n_i, T]``, one shape ``[T]`` for all).
      pad_to: common length (default: the largest ``n_i``); must be ``>= max n_i``.
      allow_empty: accept agents with no records (they carry an all-False mask).
    """
    if len(xs) == 0:
        raise ValueError("xs must hold at least one agent, got an empty list")
    validation.check_same_length(("xs", "ys"), xs, ys)
    xs = [validation.check_finite_array(f"xs[{i}]", x) for i, x in enumerate(xs)]
    ys = [np.asarray(y) for y in ys]
    feature_shape = xs[0].shape[1:]
    label_shape = ys[0].shape[1:]                 # () for class labels, (T,) for sequences
    for i, (x, y) in enumerate(zip(xs, ys)):
        if x.shape[1:] != feature_shape:
            raise ValueError(f"xs[{i}] has feature shape {x.shape[1:]}, expected {feature_shape} "
                             "(all agents must share one feature shape)")
        if y.ndim < 1 or y.shape != (x.shape[0],) + label_shape:
            raise ValueError(f"ys[{i}] must have shape {[x.shape[0], *label_shape]} to match "
                             f"xs[{i}] and ys[0], got {list(y.shape)}")
        if y.size and y.dtype.kind not in "iu":
            raise ValueError(f"ys[{i}] must hold integer labels, got dtype {y.dtype}")
        if x.shape[0] == 0 and not allow_empty:
            raise ValueError(f"agent {i} has no records; every agent needs at least one "
                             "(pass allow_empty=True to keep empty agents masked out)")
    counts = np.array([x.shape[0] for x in xs], dtype=np.int32)
    n_max = int(counts.max()) if pad_to is None else validation.check_int(
        "pad_to", pad_to, minimum=int(counts.max()))
    n_max = max(n_max, 1)
    num = len(xs)
    x_out = np.zeros((num, n_max) + tuple(feature_shape), dtype=dtype)
    y_out = np.zeros((num, n_max) + tuple(label_shape), dtype=np.int32)
    for i, (x, y) in enumerate(zip(xs, ys)):  # host-side construction, not a hot path
        x_out[i, :len(x)] = x
        y_out[i, :len(y)] = y
    mask = np.arange(n_max)[None, :] < counts[:, None]
    return StackedData(x=jnp.asarray(x_out), y=jnp.asarray(y_out), mask=jnp.asarray(mask),
                       counts=jnp.asarray(counts))


def from_partition(x: np.ndarray, y: np.ndarray, indices: Sequence[np.ndarray], **kwargs
                   ) -> StackedData:
    """Stack the agents of a partition: agent i holds ``x[indices[i]], y[indices[i]]``."""
    x = np.asarray(x)
    y = np.asarray(y)
    validation.check_same_length(("x", "y"), x, y)
    for i, idx in enumerate(indices):
        idx = np.asarray(idx)
        if idx.size and (idx.min() < 0 or idx.max() >= len(x)):
            raise ValueError(f"indices[{i}] must be in [0, {len(x) - 1}]")
    return from_ragged([x[np.asarray(i, dtype=np.int64)] for i in indices],
                       [y[np.asarray(i, dtype=np.int64)] for i in indices], **kwargs)


def client_ids_array(name: str, client_ids, num_records: int) -> np.ndarray:
    """``client_ids`` as a 1-D numpy array of ``num_records`` integer or string ids (an object
    array of Python ints or of strings, e.g. a pandas column, becomes an int64 / str array)."""
    ids = np.asarray(client_ids)
    if ids.ndim != 1 or len(ids) != num_records:
        raise ValueError(f"{name} must be a 1-D array of one client id per record "
                         f"({num_records}), got shape {ids.shape}")
    if ids.dtype.kind == "O" and ids.size:
        kinds = {int if isinstance(v, (int, np.integer)) and not isinstance(v, bool) else
                 str if isinstance(v, str) else type(v) for v in ids.tolist()}
        if kinds == {int}:
            ids = ids.astype(np.int64)
        elif kinds == {str}:
            ids = ids.astype(str)
    if ids.dtype.kind not in "iuUS":
        raise ValueError(f"{name} must hold integer or string client ids (one kind), got dtype "
                         f"{ids.dtype}")
    return ids


def from_client_ids(x, y, client_ids, *, dtype=np.float32) -> tuple[StackedData, np.ndarray]:
    """Group records by client id into stacked agents (device arrays, as :func:`from_ragged`).

    Agent ``i`` is the ``i``-th of the sorted distinct ids (``np.unique``) and holds that
    client's records in their order in ``x``; the second result is those ids, ``ids[i]`` the
    client of agent ``i``. Vectorised: one stable argsort, no loop over records or clients.

    Args:
      x: ``[n, *feature_shape]`` finite features, one row per record.
      y: ``[n]`` integer labels (sequences: ``[n, T]``).
      client_ids: ``[n]`` the client of each record: integers or strings.
      dtype: feature dtype of the result.
    """
    x = validation.check_finite_array("x", x)
    if x.ndim < 2 or len(x) == 0:
        raise ValueError(f"x must hold at least one record [n >= 1, *feature_shape], got shape "
                         f"{x.shape}")
    y = np.asarray(y)
    validation.check_same_length(("x", "y"), x, y)
    if y.dtype.kind not in "iu":
        raise ValueError(f"y must hold integer labels, got dtype {y.dtype}")
    ids = client_ids_array("client_ids", client_ids, len(x))
    unique, agent_of = np.unique(ids, return_inverse=True)          # [N], [n] in [0, N)
    agent_of = agent_of.reshape(-1)
    order = np.argsort(agent_of, kind="stable")                      # records grouped by agent
    counts = np.bincount(agent_of, minlength=len(unique))            # [N] >= 1 each
    starts = np.cumsum(counts) - counts                              # first sorted slot per agent
    agents = agent_of[order]
    slot = np.arange(len(order)) - starts[agents]                    # row within its agent
    n_max = int(counts.max())
    x_out = np.zeros((len(unique), n_max) + x.shape[1:], dtype)
    y_out = np.zeros((len(unique), n_max) + y.shape[1:], np.int32)
    x_out[agents, slot] = x[order]
    y_out[agents, slot] = y[order]
    mask = np.arange(n_max)[None, :] < counts[:, None]
    stacked = StackedData(x=jnp.asarray(x_out), y=jnp.asarray(y_out), mask=jnp.asarray(mask),
                          counts=jnp.asarray(counts.astype(np.int32)))
    return stacked, unique


@dataclasses.dataclass(frozen=True)
class RecordRows:
    """Where a partition puts each record in the stacked grid (:func:`record_rows`).

    records: ``[N, n_max]`` int32 (int64 past 2^31 records), slot ``(i, j)``'s record index
      (agent i's j-th record), -1 in the padding slots ``j >= counts[i]``.
    counts: ``[N]`` int32 records per agent.
    """

    records: np.ndarray
    counts: np.ndarray

    @property
    def n_max(self) -> int:
        return int(self.records.shape[1])

    @property
    def num_agents(self) -> int:
        return int(self.records.shape[0])

    def row_of(self, num_records: int) -> np.ndarray:
        """``[num_records]`` int64: record r's row ``i * n_max + j`` of the flattened
        ``[N * n_max]`` grid, or -1 when no agent holds it."""
        flat = self.records.reshape(-1)
        slots = np.flatnonzero(flat >= 0)
        row_of = np.full(num_records, -1, np.int64)
        row_of[flat[slots]] = slots
        return row_of


def _disjoint(indices: np.ndarray, num_records: int) -> bool:
    """Whether the indices (in ``[0, num_records)``) are pairwise distinct (O(n), no sort)."""
    seen = np.zeros(num_records, bool)
    seen[indices] = True
    return int(np.count_nonzero(seen)) == indices.size


def record_labels(y, rows: RecordRows) -> np.ndarray:
    """``y_out [N, n_max, ...]`` int32: slot ``(i, j)`` holds ``y[records[i, j]]``, 0 in the
    padding slots (gathered by agent chunk: no ``[N, n_max]`` int64 temporary)."""
    y = np.asarray(y)
    records = rows.records
    if records.size and records.max() >= len(y):
        raise ValueError(f"the record rows name record {int(records.max())} but y holds "
                         f"{len(y)} records")
    out = np.zeros(records.shape + y.shape[1:], np.int32)
    step = max(1, (8 << 20) // max(1, records.shape[1]))
    for a in range(0, len(records), step):
        r = records[a:a + step]
        out[a:a + step] = np.where((r >= 0).reshape(r.shape + (1,) * (y.ndim - 1)),
                                   y[np.maximum(r, 0)], 0)
    return out


def _index_dtype(num_records: int):
    return np.int32 if num_records < 2 ** 31 else np.int64


def record_rows(indices: Sequence[np.ndarray], num_records: int) -> RecordRows:
    """The rows of a partition (agent i holds records ``indices[i]``, in that order, of
    ``num_records``): one ``[N, n_max]`` array in place of N index arrays (drop the list after
    this)."""
    num = len(indices)
    if num == 0:
        raise ValueError("indices must hold at least one agent, got an empty list")
    counts = np.fromiter((np.size(i) for i in indices), np.int64, count=num)        # [N]
    if counts.min() == 0:
        raise ValueError(f"agent {int(np.argmin(counts))} has no records; every agent needs "
                         "at least one")
    n_max = int(counts.max())
    flat = np.concatenate([np.asarray(i, dtype=np.int64) for i in indices])          # [sum]
    if flat.min() < 0 or flat.max() >= num_records:
        raise ValueError(f"indices must be in [0, {num_records - 1}]")
    if not _disjoint(flat, num_records):
        raise ValueError("indices must be pairwise disjoint (a record listed twice)")
    records = np.full((num, n_max), -1, _index_dtype(num_records))
    records[np.arange(n_max)[None, :] < counts[:, None]] = flat      # row-major: agent order
    return RecordRows(records=records, counts=counts.astype(np.int32))


def check_rows(rows: RecordRows, num_records: int) -> RecordRows:
    """``rows`` checked: ``records [N, n_max]`` with each agent's ``counts[i] >= 1`` records
    first (in ``[0, num_records)``, pairwise disjoint) and -1 after them."""
    records, counts = np.asarray(rows.records), np.asarray(rows.counts)
    if records.ndim != 2 or counts.shape != records.shape[:1] or records.shape[0] == 0:
        raise ValueError(f"rows.records must be [N >= 1, n_max] and rows.counts [N], got "
                         f"{records.shape} and {counts.shape}")
    if counts.min() < 1:
        raise ValueError(f"agent {int(np.argmin(counts))} has no records; every agent needs "
                         "at least one")
    real = np.arange(records.shape[1])[None, :] < counts[:, None]
    held = records[real]
    if np.any(records[~real] != -1) or held.min() < 0 or held.max() >= num_records:
        raise ValueError(f"rows.records must hold each agent's record indices in [0, "
                         f"{num_records - 1}] first and -1 after its count")
    if not _disjoint(held, num_records):
        raise ValueError("rows.records must be pairwise disjoint (a record listed twice)")
    return rows


def stack_records(blocks: Iterable[np.ndarray], y, indices: Sequence[np.ndarray] | RecordRows,
                  *, path=None, dtype=None) -> StackedData:
    """Host-resident stacked agents written straight from a stream of records.

    The streamed :func:`from_partition`: agent i holds records ``indices[i]`` (in that order) of
    a record set whose labels are ``y [n]`` and whose features arrive as consecutive blocks
    ``[b, *feature_shape]``, scattered into their agents' rows as they arrive (the only copy of
    the features is the result). Equal to ``from_partition(x, y, indices).on_host()``.

    Args:
      blocks: the record features in order, in blocks of any sizes summing to ``n``.
      y: ``[n]`` integer labels (a next-token task: ``[n, T]`` target ids).
      indices: N pairwise disjoint record-index arrays (a partition; every agent needs >= 1), or
        their :func:`record_rows` (so that the caller can free the N arrays first).
      path: a folder: ``x`` is written to ``path/x.npy`` as a memory map (with ``y.npy`` and
        ``counts.npy``, :func:`save_stacked`'s format) and the result is :func:`load_stacked`'s.
      dtype: feature dtype of the result (None: float32, or int32 for integer blocks: token ids).
    """
    y = np.asarray(y)
    if y.ndim < 1 or (y.size and y.dtype.kind not in "iu"):
        raise ValueError(f"y must be an integer label array [n] (or [n, T] target ids), got "
                         f"shape {y.shape} dtype {y.dtype}")
    rows_of = indices if isinstance(indices, RecordRows) else record_rows(indices, len(y))
    counts = rows_of.counts
    num, n_max = len(counts), rows_of.n_max
    y_out = record_labels(y, rows_of)
    row_of = rows_of.row_of(len(y))
    x_out = rows = None
    start = 0
    for block in blocks:
        block = validation.check_finite_array(f"records {start}..", block)
        if x_out is None:
            if dtype is None:
                dtype = np.int32 if block.dtype.kind in "iu" else np.float32
            shape = (num, n_max) + tuple(block.shape[1:])
            if path is None:
                x_out = np.zeros(shape, dtype)            # pages appear as rows are written
            else:
                from pathlib import Path
                Path(path).mkdir(parents=True, exist_ok=True)
                x_out = np.lib.format.open_memmap(Path(path) / "x.npy", mode="w+",
                                                  dtype=dtype, shape=shape)
            rows = x_out.reshape(num * n_max, -1)         # a view
        if start + len(block) > len(y):
            raise ValueError(f"the blocks hold more records than y ({len(y)})")
        where = row_of[start:start + len(block)]
        keep = np.flatnonzero(where >= 0)
        rows[where[keep]] = block.reshape(len(block), -1)[keep]
        start += len(block)
    if start != len(y):
        raise ValueError(f"the blocks hold {start} records but y holds {len(y)}")
    if path is None:
        return from_arrays(x_out, y_out, counts, check=False)
    x_out.flush()
    del x_out, rows
    from pathlib import Path
    np.save(Path(path) / "y.npy", y_out)
    np.save(Path(path) / "counts.npy", counts)
    return load_stacked(path)


@dataclasses.dataclass(frozen=True)
class RecordDraw:
    """Generated records whose features are a pure function of the record: record r's features
    are ``fn(key, params, ids[r], attrs[r])``, so any records can be drawn, in any order and
    batch, with the same values (:func:`stack_drawn`, :meth:`rows`).

    fn: a module-level (hashable), jittable, pure ``fn(key, params, ids [...] int32, attrs)
      -> [..., *feature_shape]`` whose randomness derives from ``(key, ids)`` only (e.g.
      ``fold_in(key, id)`` per record); ``attrs`` holds the records' per-record attributes.
    key: the generator's key. params: a tuple of small arrays every record reads (e.g. the class
      means). attrs: a tuple of per-record host arrays ``[num_records]`` (e.g. cluster ids).
    ids: ``[num_records]`` the records' ids in the generator (None: ``0 .. num_records - 1``; a
      :meth:`subset` keeps its records' original ids, hence their values).
    """

    fn: Any
    key: Any
    params: tuple
    attrs: tuple
    num_records: int
    feature_shape: tuple
    ids: np.ndarray | None = None

    def subset(self, keep) -> "RecordDraw":
        """The records ``keep`` (indices into this draw), renumbered ``0 .. len(keep) - 1``."""
        keep = np.asarray(keep, np.int64)
        ids = keep if self.ids is None else self.ids[keep]
        return dataclasses.replace(self, ids=ids.astype(_index_dtype(int(ids.max(initial=0)) + 1)),
                                   attrs=tuple(a[keep] for a in self.attrs),
                                   num_records=int(keep.size))

    def device_inputs(self) -> tuple:
        """``(key, params, ids, attrs)`` on the device (copied once per use)."""
        put = jax.device_put
        return (self.key, tuple(put(np.asarray(p)) for p in self.params),
                None if self.ids is None else put(self.ids),
                tuple(put(np.asarray(a)) for a in self.attrs))

    def rows(self, records, *, inputs: tuple | None = None) -> np.ndarray:
        """Host features ``[*records.shape, *feature_shape]`` of ``records`` (indices, any shape;
        -1: zeros), drawn on the device in one compiled call per shape."""
        records = np.asarray(records)
        if records.size and (records.max() >= self.num_records or records.min() < -1):
            raise ValueError(f"records must be in [0, {self.num_records - 1}] (or -1), got "
                             f"values in [{records.min()}, {records.max()}]")
        inputs = self.device_inputs() if inputs is None else inputs
        idx = jax.device_put(records.astype(_index_dtype(self.num_records)))
        return np.asarray(_draw_block(self.fn, *inputs, idx))


def _draw(fn, key, params, ids, attrs, records):
    """``fn`` at ``records`` (-1: zeros), reading the per-record arrays at those records."""
    safe = jnp.maximum(records, 0)
    gid = safe if ids is None else ids[safe]
    out = fn(key, params, gid.astype(jnp.int32), tuple(a[safe] for a in attrs))
    real = (records >= 0).reshape(records.shape + (1,) * (out.ndim - records.ndim))
    return jnp.where(real, out, jnp.zeros((), out.dtype))


@functools.partial(jax.jit, static_argnums=0)
def _draw_block(fn, key, params, ids, attrs, records):
    """:func:`_draw` of one block of records (a chunk of agents' slots, or a block of a stream)."""
    return _draw(fn, key, params, ids, attrs, records)


@functools.partial(jax.jit, static_argnums=0, static_argnames=("chunk",))
def _draw_all(fn, key, params, ids, attrs, records, labels, *, chunk: int):
    """``(x [N, n_max, ...], y [N, n_max, ...], mask [N, n_max])`` of the slots ``records
    [N, n_max]`` (-1: padding) with the record labels ``labels [n, ...]``: ``x`` written in place
    chunk by chunk (the last chunk starts at ``N - chunk`` and redraws a few rows)."""
    real = records >= 0
    y = labels[jnp.maximum(records, 0)]
    y = jnp.where(real.reshape(real.shape + (1,) * (y.ndim - 2)), y, jnp.zeros((), y.dtype))
    n = records.shape[0]
    block = jax.eval_shape(lambda r: _draw(fn, key, params, ids, attrs, r),
                           jax.ShapeDtypeStruct((chunk,) + records.shape[1:], records.dtype))
    out = jnp.zeros((n,) + block.shape[1:], block.dtype)

    def body(c, out):
        start = jnp.minimum(c * chunk, n - chunk)
        rows = jax.lax.dynamic_slice_in_dim(records, start, chunk, 0)
        return jax.lax.dynamic_update_slice_in_dim(
            out, _draw(fn, key, params, ids, attrs, rows), start, 0)

    return jax.lax.fori_loop(0, num_chunks(n, chunk), body, out), y, real


#: agents per chunk when :func:`stack_drawn` draws a population
DRAW_CHUNK = 4096


def stack_drawn(draw: RecordDraw, y, rows: RecordRows, *, on: str = "host",
                chunk: int = DRAW_CHUNK, check: bool = True) -> StackedData:
    """Stacked agents drawn where they are consumed: agent i's slot j holds record
    ``rows.records[i, j]`` of the generated record set ``draw`` (labels ``y [n]``).

    ``on = "device"``: one compiled call draws every agent's records on the device (the features
    never exist on the host). ``on = "host"``: chunks of ``chunk`` agents are drawn on the device
    one after the other into host arrays. Both give the same values as :meth:`RecordDraw.rows`,
    whatever ``chunk``. ``check``: validate ``rows`` (:func:`check_rows`)."""
    validation.check_choice("on", on, ("host", "device"))
    validation.check_int("chunk", chunk, minimum=1)
    y = np.asarray(y)
    if check:
        check_rows(rows, draw.num_records)
    if len(y) != draw.num_records:
        raise ValueError(f"y holds {len(y)} labels but the draw {draw.num_records} records")
    counts = np.asarray(rows.counts, np.int32)
    num, chunk = rows.num_agents, min(chunk, rows.num_agents)
    records = rows.records.astype(_index_dtype(draw.num_records), copy=False)
    inputs = draw.device_inputs()
    if on == "device":
        x, y_out, mask = _draw_all(draw.fn, *inputs, jax.device_put(records),
                                   jax.device_put(y.astype(np.int32, copy=False)), chunk=chunk)
        return StackedData(x=x, y=y_out, mask=mask, counts=jax.device_put(counts))
    y_out = record_labels(y, rows)
    x = None
    pending = None

    def copy(start: int, stop: int, block) -> None:
        nonlocal x
        host = np.asarray(block)
        if x is None:
            x = np.empty((num,) + host.shape[1:], host.dtype)   # pages appear as rows are written
        x[start:stop] = host[:stop - start]

    for c in agent_stream.chunks(records, chunk, fill=-1, prefetch=False):  # padded: one shape
        out = _draw_block(draw.fn, *inputs, c.agents)
        if pending is not None:                  # copy the previous chunk while this one draws
            copy(*pending)
        pending = (c.start, c.start + c.num_real, out)
    copy(*pending)
    return from_arrays(x, y_out, counts, check=False)


def auto_placement(nbytes: int, device=None) -> str:
    """``"host"`` or ``"device"``: where ``run.agents_on = "auto"`` keeps ``nbytes`` of agents.

    Host when they exceed ``placement_host_bytes`` of :func:`fedjax_dp.core.defaults.defaults` for
    ``device`` (default: the first local device): ``AUTO_HOST_FRACTION`` (25%) of
    ``device.memory_stats()["bytes_limit"]`` (GPU, TPU: the rest is left to parameters, activations
    and XLA). A device without memory statistics (the CPU, whose "device" memory is host memory)
    keeps populations above ``AUTO_HOST_BYTES`` (64 MiB) on the host: on the device they would be a
    second copy of the data, while host-resident agents are streamed a chunk or a cohort at a time,
    as fast, with the same results."""
    limit = defaults_lib.defaults(device=device).placement_host_bytes
    return "host" if nbytes > limit else "device"


def place(data: StackedData, agents_on: str, device=None) -> StackedData:
    """The agents on ``"device"``, ``"host"`` or ``"auto"`` (:func:`auto_placement`)."""
    if agents_on == "auto":
        agents_on = auto_placement(data.nbytes, device)
    if agents_on == "host":
        return data if is_on_host(data) else data.on_host()
    if agents_on == "device":
        return data.on_device() if is_on_host(data) else data
    raise ValueError(f"agents_on must be 'device', 'host' or 'auto', got {agents_on!r}")
