"""DP-FNAS's placement: its compiled iterations (checked against the memory budget, shared by
equal runs) and, with ``runtime.mesh``, the state replicated on the mesh and the count of the
parties each process holds."""
from __future__ import annotations

import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.core import memory


_COMPILED: dict = {}


def compile_checked(fn, *args, what: str = "a step", drivers=None) -> tuple[Any, float]:
    """``fn`` (a jitted function) compiled for the shapes of ``args``, and the seconds compiling
    took (0 when an equal run already compiled it: runs with equal configs and shapes share it).
    A new compilation that cannot fit in memory is refused (:func:`memory.check_fits`, naming
    ``what`` and the config keys ``drivers``)."""
    sig = (fn, jax.tree.structure(args),
           tuple((np.shape(a), str(jnp.asarray(a).dtype) if not isinstance(a, jax.Array)
                  else str(a.dtype), getattr(a, "sharding", None))
                 for a in jax.tree.leaves(args)))
    if sig in _COMPILED:
        return _COMPILED[sig], 0.0
    start = time.perf_counter()
    compiled = fn.lower(*args).compile()
    memory.check_fits(compiled, what=what, drivers=drivers)
    _COMPILED[sig] = compiled
    return compiled, time.perf_counter() - start


def agents_per_process(party_rows: jax.Array, num_parties: int, mesh) -> tuple[int, ...]:
    """The real parties (rows < ``num_parties`` of ``party_rows``' leading axis) whose rows each
    process holds, from the addressable shards (host-side, no data read); with several processes
    gathered (``process_allgather``), one entry per process. Without a mesh: ``(num_parties,)``."""
    if mesh is None:
        return (num_parties,)
    rows = {s.index[0].indices(party_rows.shape[0])[:2] for s in party_rows.addressable_shards}
    local = sum(max(0, min(hi, num_parties) - lo) for lo, hi in rows)
    if jax.process_count() == 1:
        return (local,)
    from jax.experimental import multihost_utils
    return tuple(int(c) for c in np.ravel(multihost_utils.process_allgather(np.int64(local))))


def replicated_on(mesh, tree):
    """``tree`` replicated on ``mesh`` (as it is without a mesh): the server state and keys every
    device reads, equal on every process (:func:`fedjax_dp.core.lift.replicate`: the state
    ``init`` or the memo made and the epoch's key are local arrays, which a multi-process mesh
    refuses to mix in, so they are placed from a host copy)."""
    if mesh is None:
        return tree
    from fedjax_dp.core.lift import replicate
    return replicate(tree, mesh)
