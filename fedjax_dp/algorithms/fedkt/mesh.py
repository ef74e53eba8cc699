"""FedKT over a mesh: each chunk's per-party work split over the ``agents`` axis of the devices.

With ``runtime.mesh`` (:func:`fedjax_dp.core.agent_mesh`: every device of every process under
``jax.distributed``) the ``teachers`` and ``students`` phases (:mod:`.phases`, JAX learners)
stream their chunks as global arrays split over the mesh
(:func:`fedjax_dp.core.agent_stream.chunks` with ``mesh``; the chunk rounded up to a multiple of
the device count, :func:`chunk_size`), each process reading only its own devices' rows of
host-resident data, and run a chunk's work in ONE compiled ``shard_map`` (:func:`over_mesh`):
every party's teachers (students) train, predict and vote on exactly one device of one process.
Their keys are sliced on the host from the global ones, so the results equal the run without a
mesh. Results leave the mesh with :func:`to_host` (``process_allgather`` across processes); the
server's consistent vote is a cross-device ``psum`` (:func:`server_vote_fn`, exact integers);
:func:`parties_per_process` counts the real parties each process ran. Without a mesh every
function here is the identity of the single-device path.
"""
from __future__ import annotations

import functools

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P

from fedjax_dp.algorithms.fedkt import votes
from fedjax_dp.core.lift import AGENTS


def chunk_size(size: int, mesh) -> int:
    """``size`` parties per chunk rounded up to a multiple of the mesh's devices (None: as is)."""
    if mesh is None:
        return size
    ndev = mesh.shape[AGENTS]
    return -(-size // ndev) * ndev


def over_mesh(fn, mesh, in_specs, out_specs):
    """``fn`` itself without a mesh (its own compiled calls, the single-device path); with one,
    ``jit(shard_map(fn))``: ONE compiled call in which each device runs ``fn`` on its shard of
    the arguments split over ``agents`` (``in_specs`` / ``out_specs``)."""
    if mesh is None:
        return fn
    return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                                 check_vma=False))


def replicated(x, mesh):
    """``x`` (host or one device) as a global array replicated over ``mesh`` (None: ``x``): the
    shared inputs of a computation over a mesh spanning several processes."""
    if mesh is None:
        return x
    return jax.device_put(np.asarray(x), NamedSharding(mesh, P()))


def to_host(x) -> np.ndarray:
    """``x`` as a host array: a global array split over other processes' devices is gathered
    (``process_allgather``, a collective every process calls in the same order)."""
    if isinstance(x, jax.Array) and not (x.is_fully_addressable or x.is_fully_replicated):
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)


def gathered(models, rows: int, mesh, axis: int = 1):
    """Kept models of a mesh run, stacked on ``axis`` (1: seed-stacked ``[S, A, ...]``): the
    real ``rows`` models gathered onto this process's default device (the padding dropped), as
    the single-device run keeps them (None: ``models``)."""
    if mesh is None:
        return models
    index = (slice(None),) * axis + (slice(0, rows),)
    return jax.tree.map(lambda leaf: jax.numpy.asarray(to_host(leaf)[index]), models)


def parties_per_process(chunk, mesh, axis: int = 0) -> np.ndarray:
    """``int64 [process_count]``: the chunk's real parties on each process's devices, read from
    this process's addressable shards of the chunk (host-side; other processes' entries 0).
    Without a mesh every process runs every party: ``num_real`` for each."""
    counts = np.zeros(jax.process_count(), np.int64)
    if mesh is None:
        counts[:] = chunk.num_real
        return counts
    size = len(chunk.valid)
    owner = {}
    for shard in jax.tree.leaves(chunk.agents)[0].addressable_shards:
        lo, hi, _ = shard.index[axis].indices(size)
        owner[(lo, hi)] = shard.device.process_index
    for (lo, hi), process in owner.items():
        counts[process] += int(np.sum(chunk.valid[lo:hi]))
    return counts


def all_processes(counts: np.ndarray, mesh) -> np.ndarray:
    """This process's :func:`parties_per_process` totals summed with every other process's
    (``process_allgather``) when a mesh spans several processes."""
    if mesh is None or jax.process_count() == 1:
        return counts
    return np.asarray(multihost_utils.process_allgather(counts)).sum(axis=0)


@functools.lru_cache(maxsize=16)
def server_vote_fn(num_classes: int, mesh):
    """``[S, P, s, Qs] -> [S, Qs, C]``: :func:`.votes.consistent_votes_seeds` of a chunk; with a
    mesh every device votes its parties and a ``psum`` adds the devices' histograms (exact
    integers, replicated)."""
    def vote(preds):
        return votes.consistent_votes_seeds(preds, num_classes)

    if mesh is None:
        return vote
    return over_mesh(lambda p: jax.lax.psum(vote(p), AGENTS), mesh, (P(None, AGENTS),), P())
