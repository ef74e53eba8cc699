"""Stream the agents to the device in fixed-shape chunks (one-shot algorithms at large N).

One-shot algorithms (AE-DPFL, kNN-DPFL, FedKT) never need all N agents on the device: each
agent's work is independent and only sums over agents leave a chunk (docs/scale.md).
:func:`chunks`, the package's one host chunker, cuts the agent axis into chunks of ``size``:
host-resident rows (:func:`fedjax_dp.core.is_on_host`) are read and padded by numpy and copied
with ``jax.device_put``, the next chunk in a background thread (:data:`PREFETCH`); device rows
are taken by one compiled gather. Every chunk has the shape ``[size, ...]`` (the last padded,
with a host ``valid`` mask), so nothing compiles per chunk and peak memory is one or two chunks.

With ``mesh`` (an ``agents`` mesh, possibly spanning several processes under
``jax.distributed``) every chunk is a global array whose agent axis is split over the mesh's
devices: each process reads, pads and transfers only the rows of its own devices' shards
(``jax.make_array_from_callback``), so a compiled call over the chunk runs each agent on exactly
one device of one process (the chunk size is then a multiple of the mesh's device count).
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
from typing import Any, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.core import defaults as defaults_lib, seed_axis, validation
from fedjax_dp.core.lift import AGENTS, num_chunks

#: Double-buffer host chunks: None (default) as :func:`fedjax_dp.core.defaults.defaults` decides,
#: True/False forces it (for benchmarks; results never depend on it).
PREFETCH: bool | None = None

#: Agents per chunk when the config says None (fewer agents: all at once).
DEFAULT_CHUNK = 4096


@dataclasses.dataclass(frozen=True)
class Chunk:
    """Agents ``[start, start + num_real)`` on the device, padded to the chunk size."""

    index: int                 # chunk number
    start: int                 # global index of the first agent
    num_real: int              # real agents in the chunk (the rest is padding)
    agents: Any                # the chunked tree, [size, ...] on the agent axis, on the device
    valid: np.ndarray          # [size] bool (host), True for real agents
    extra: tuple = ()          # per-agent host arrays sliced alongside (e.g. keys), padded

    @property
    def ids(self) -> np.ndarray:
        """``[size]`` int32 global agent indices ``start + j`` (host; padding continues past N)."""
        return np.arange(self.start, self.start + len(self.valid), dtype=np.int32)


def _host_rows(a, start: int, stop: int, size: int, axis: int, fill) -> np.ndarray:
    """Rows ``[start, stop)`` of the host array ``a`` along ``axis`` (only these read), padded with
    ``fill`` to ``size`` rows."""
    index = (slice(None),) * axis + (slice(start, stop),)
    part = np.asarray(a[index])
    if stop - start < size:
        shape = list(part.shape)
        shape[axis] = size - (stop - start)
        part = np.concatenate([part, np.full(shape, fill, part.dtype)], axis=axis)
    return part


@functools.partial(jax.jit, static_argnames=("size", "axis", "fill"))
def _device_rows(leaves: list, start, *, size: int, axis: int, fill) -> list:
    """Rows ``[start, start + size)`` of device arrays along ``axis``, rows past the end filled
    with ``fill``: one compiled gather for every chunk of a stream (``start`` traced)."""
    idx = start + jnp.arange(size)
    return [jnp.take(a, idx, axis=axis, mode="fill", fill_value=fill) for a in leaves]


def agent_sharding(mesh, axis: int = 0):
    """The ``NamedSharding`` that splits axis ``axis`` (the agents) over ``mesh``'s ``agents``."""
    from jax.sharding import NamedSharding, PartitionSpec as P
    return NamedSharding(mesh, P(*([None] * axis), AGENTS))


def _host_chunk(a, start: int, stop: int, size: int, axis: int, fill, mesh) -> jax.Array:
    """Rows ``[start, stop)`` of the host array ``a`` padded to ``size``, on the device; with
    ``mesh`` a global array over it, each process reading only its own devices' rows."""
    if mesh is None:
        return jax.device_put(_host_rows(a, start, stop, size, axis, fill))
    shape = tuple(a.shape[:axis]) + (size,) + tuple(a.shape[axis + 1:])

    def shard(index):                                 # this device's slice of the chunk
        lo, hi, _ = index[axis].indices(size)
        rows = _host_rows(a, min(start + lo, stop), min(start + hi, stop), hi - lo, axis, fill)
        return rows[tuple(index[:axis]) + (slice(None),) + tuple(index[axis + 1:])]

    return jax.make_array_from_callback(shape, agent_sharding(mesh, axis), shard)


def _make(index: int, tree, size: int, axis: int, fill, extra: tuple, num: int, take: bool,
          stack: bool, mesh=None) -> Chunk:
    start = index * size
    stop = min(num, start + size)
    if take:
        leaves, treedef = jax.tree.flatten(tree)
        out: list = [None] * len(leaves)
        on_device = [i for i, a in enumerate(leaves) if not isinstance(a, np.ndarray)]
        for i, a in enumerate(leaves):
            if isinstance(a, np.ndarray):
                out[i] = _host_chunk(a, start, stop, size, axis, fill, mesh)
        if on_device:
            taken = _device_rows([leaves[i] for i in on_device], np.int32(start), size=size,
                                 axis=axis, fill=fill)
            if mesh is not None:
                taken = jax.device_put(taken, agent_sharding(mesh, axis))
            for i, a in zip(on_device, taken):
                out[i] = a
        tree = jax.tree.unflatten(treedef, out)
    ex = tuple(_host_chunk(np.asarray(e[start:stop]), 0, stop - start, size, 0, 0, mesh)
               for e in extra)
    valid = np.arange(size) < (stop - start)
    return Chunk(index=index, start=start, num_real=stop - start, valid=valid, extra=ex,
                 agents=seed_axis.stack_seeds(tree) if stack else tree)


def chunks(tree, size: int, *, axis: int = 0, fill=0, extra: tuple = (), take: bool = True,
           stack: bool = False, prefetch: bool | None = None, mesh=None) -> Iterator[Chunk]:
    """The agents in chunks of ``size`` (see the module). ``tree``: a pytree (:class:`StackedData`,
    stored ballots, ...) of host or device arrays whose axis ``axis`` is the agent axis, of one
    length N (``axis = 1`` for ``[S, N, ...]`` with a leading seed axis). Each chunk's ``agents``
    is the rows ``[start, start + size)`` along ``axis``, padded with ``fill`` (a padded
    :class:`StackedData` agent has no records). ``extra``: per-agent host arrays (leading axis N)
    sliced and zero-padded alongside. ``prefetch``: default :data:`PREFETCH`. ``take`` False:
    every chunk's ``agents`` is the whole ``tree`` (device data whose rows ``ids`` the caller's
    compiled call takes itself). ``stack``: ``tree`` is a list of S seeds' trees, each chunk's
    ``agents`` their rows stacked ``[S, size, ...]``. ``mesh``: every chunk (and ``extra``) a
    global array with the agent axis split over the mesh (see the module; ``size`` a multiple of
    its device count). ``ValueError`` if the lengths differ."""
    validation.check_int("size", size, minimum=1)
    if mesh is not None and size % mesh.shape[AGENTS]:
        raise ValueError(f"chunks: size ({size}) must be a multiple of the mesh's "
                         f"{mesh.shape[AGENTS]} devices to split every chunk over them")
    lengths = {int(np.shape(a)[axis]) for a in jax.tree.leaves(tree)}
    if len(lengths) != 1:
        raise ValueError(f"chunks: every leaf of tree must have one length on axis {axis} "
                         f"(the agents), got {sorted(lengths)}")
    n = lengths.pop()
    count = num_chunks(n, size)
    make = functools.partial(_make, tree=tree, size=size, axis=axis, fill=fill, extra=extra,
                             num=n, take=take, stack=stack, mesh=mesh)
    if prefetch is None:
        prefetch = defaults_lib.defaults().prefetch if PREFETCH is None else PREFETCH
    host = take and any(isinstance(a, np.ndarray) for a in jax.tree.leaves(tree))
    if not (prefetch and host) or count <= 1:
        yield from map(make, range(count))
        return
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(make, 0)
        for i in range(count):
            current = pending.result()
            if i + 1 < count:
                pending = pool.submit(make, i + 1)
            yield current
