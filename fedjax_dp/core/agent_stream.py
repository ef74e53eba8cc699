"""Stream the agents to the device in fixed-shape chunks (one-shot algorithms at large N).

The one-shot algorithms (AE-DPFL, kNN-DPFL) never need all N agents on the device at once: every
agent's work (train, cast a ballot, find neighbours) is independent of the others', and only sums
over agents leave a chunk. :func:`chunks` cuts the agent axis into chunks of ``size`` agents:

* host-resident data (numpy or memory-mapped arrays, :func:`fedjax_dp.core.is_on_host`): rows
  ``[start, start + size)`` are read on the host and copied to the device; the next chunk is read
  and copied in a background thread while the caller's compiled call on the current one runs
  (double buffering, ``prefetch``, on by default: :data:`PREFETCH`);
* device-resident data: the same rows are sliced on the device.

Every chunk has the same shape ``[size, ...]`` (the last one is padded with empty agents and a
``valid`` mask), so a vmapped per-chunk function compiles once. Peak memory is one or two chunks,
not N. The Python loop is over chunks, never over agents.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
from typing import Iterator

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.core import StackedData, is_on_host, validation

#: Double-buffer host chunks by default (a switch for benchmarks; results never depend on it).
PREFETCH = True

#: Agents per chunk when the config says None (fewer agents: all at once).
DEFAULT_CHUNK = 4096


@dataclasses.dataclass(frozen=True)
class Chunk:
    """Agents ``[start, start + num_real)`` on the device, padded to the chunk size."""

    index: int                 # chunk number
    start: int                 # global index of the first agent
    num_real: int              # real agents in the chunk (the rest is padding)
    agents: StackedData        # [size, ...] device arrays; padded agents have no records
    valid: jax.Array           # [size] bool, True for real agents
    extra: tuple = ()          # per-agent host arrays sliced alongside (e.g. keys), padded


def resolve_size(chunk: int | None, data: StackedData) -> int:
    """Agents per chunk: ``chunk`` or, when None, :data:`DEFAULT_CHUNK`; at most N."""
    n = data.num_agents
    if chunk is None:
        return min(n, DEFAULT_CHUNK)
    return min(validation.check_int("agent_chunk", chunk, minimum=1), n)


def num_chunks(num_agents: int, size: int) -> int:
    return -(-num_agents // size)


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


def _pad_host(a: np.ndarray, size: int) -> np.ndarray:
    a = np.asarray(a)
    if len(a) == size:
        return a
    return np.concatenate([a, np.zeros((size - len(a),) + a.shape[1:], a.dtype)])


def _pad_device(a: jax.Array, size: int) -> jax.Array:
    if a.shape[0] == size:
        return a
    return jnp.concatenate([a, jnp.zeros((size - a.shape[0],) + a.shape[1:], a.dtype)])


def _make(data: StackedData, index: int, start: int, size: int, extra: tuple) -> Chunk:
    n = data.num_agents
    stop = min(n, start + size)
    host = is_on_host(data)
    pad = _pad_host if host else _pad_device
    leaves = [pad(a[start:stop], size) for a in (data.x, data.y, data.mask, data.counts)]
    if host:
        leaves = jax.device_put(leaves)
    ex = tuple(jax.device_put(_pad_host(np.asarray(e[start:stop]), size)) for e in extra)
    valid = jnp.arange(size) < (stop - start)
    return Chunk(index=index, start=start, num_real=stop - start,
                 agents=StackedData(*leaves), valid=valid, extra=ex)


def chunks(data: StackedData, size: int, *, extra: tuple = (), prefetch: bool | None = None
           ) -> Iterator[Chunk]:
    """The agents in chunks of ``size`` (see the module); ``extra``: per-agent host arrays
    (leading axis N) sliced and padded with zeros alongside. With ``prefetch`` and host data the
    next chunk is prepared in a background thread while the caller works on the current one."""
    n = data.num_agents
    starts = range(0, n, size)
    prefetch = PREFETCH if prefetch is None else prefetch
    if not (prefetch and is_on_host(data)) or len(starts) == 1:
        for i, s in enumerate(starts):
            yield _make(data, i, s, size, extra)
        return
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(_make, data, 0, 0, size, extra)
        for i in range(len(starts)):
            current = pending.result()
            if i + 1 < len(starts):
                pending = pool.submit(_make, data, i + 1, starts[i + 1], size, extra)
            yield current
