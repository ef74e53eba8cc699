"""The voting families' chunks over ``runtime.mesh``: the chunk size rounded to the mesh, results
brought to the host on every process, and the count of agents each process worked on."""
from __future__ import annotations

from typing import Iterable

import jax
import numpy as np
from jax.experimental import multihost_utils

from fedjax_dp.core import AGENTS, agent_stream


def mesh_chunk(size: int, mesh) -> int:
    """``size`` rounded up to a multiple of ``mesh``'s device count (``size`` itself without a
    mesh): the chunk of :func:`fedjax_dp.core.agent_stream.chunks` with ``mesh=``."""
    if mesh is None:
        return size
    ndev = mesh.shape[AGENTS]
    return -(-size // ndev) * ndev


def to_host(x) -> np.ndarray:
    """``x`` (a jax or host array) as a host array holding every row, on every process:
    ``np.asarray`` where the process holds all of it (fully addressable or replicated), else
    ``process_allgather`` of the global array (a collective: every process calls it, in the
    same order)."""
    if not isinstance(x, jax.Array) or x.is_fully_addressable or x.is_fully_replicated:
        return np.asarray(x)
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


class AgentCount:
    """The real agents this process worked on, chunk by chunk (host-side, cheap): with ``mesh``
    the rows of each chunk's addressable shards that are real agents, without one every real
    agent of the chunk. :meth:`per_process` gives ``[P]`` counts (index: process), gathered
    across the processes with a mesh (``[N]`` without one: this process did every agent)."""

    def __init__(self, mesh):
        self.mesh, self.local = mesh, 0

    def add(self, chunk: agent_stream.Chunk) -> None:
        if self.mesh is None:
            self.local += chunk.num_real
            return
        mine = np.zeros(len(chunk.valid), bool)
        for shard in jax.tree.leaves(chunk.agents)[0].addressable_shards:
            mine[shard.index[0]] = True
        self.local += int(np.sum(mine & chunk.valid))

    def counted(self, chunks: Iterable[agent_stream.Chunk]) -> Iterable[agent_stream.Chunk]:
        """``chunks`` as they are, each one added as it passes."""
        for chunk in chunks:
            self.add(chunk)
            yield chunk

    def per_process(self) -> np.ndarray:
        """``[P]`` int64: real agents per process (see the class)."""
        if self.mesh is None or jax.process_count() == 1:
            return np.asarray([self.local], np.int64)
        got = multihost_utils.process_allgather(np.asarray(self.local, np.int32))
        return np.asarray(got, np.int64).reshape(-1)
