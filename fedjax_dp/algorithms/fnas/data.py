"""DP-FNAS's party data: each party's records split into a training and a validation half
(the search's two halves), stacked and padded over the parties with one Poisson rate.

With a mesh every split is a global array whose party axis (padded to a multiple of the mesh's
devices) is split over its ``agents`` axis: each process reads, pads and transfers only the
parties of its own devices (host numpy or ``np.memmap`` rows included).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.algorithms.fnas import steps
from fedjax_dp.core import agent_stream
from fedjax_dp.core.lift import AGENTS

__all__ = ["check_parties", "host_rates", "iterations_per_epoch", "make_retrain_data",
           "make_search_data", "padded_parties", "split_halves"]


def split_halves(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per party ``(n_train, n_val)``: the first ``ceil(n / 2)`` records train, the rest
    validate."""
    counts = np.asarray(counts, np.int64)
    n_train = (counts + 1) // 2
    return n_train, counts - n_train


def check_parties(counts: np.ndarray) -> None:
    """Every party needs >= 2 records (one in each half); names ``data.num_agents`` otherwise."""
    counts = np.asarray(counts)
    small = np.flatnonzero(counts < 2)
    if small.size:
        k = int(small[0])
        raise ValueError(f"data.num_agents={len(counts)} is too large for the data: party {k} "
                         f"has {int(counts[k])} record(s), DP-FNAS needs >= 2 per party (one "
                         f"training, one validation record)")


def padded_parties(num_parties: int, mesh=None) -> int:
    """Rows of the party axis: K, or with ``mesh`` K padded to a multiple of its devices."""
    if mesh is None:
        return num_parties
    d = mesh.shape[AGENTS]
    return -(-num_parties // d) * d


def _bounds(counts: np.ndarray, half: str) -> tuple[np.ndarray, np.ndarray]:
    """Per party, the first record and the number of records of ``half`` (``train``, ``val``:
    :func:`split_halves`; ``all``: every record)."""
    n_train, n_val = split_halves(counts)
    if half == "train":
        return np.zeros_like(n_train), n_train
    if half == "val":
        return n_train, n_val
    return np.zeros_like(n_train), np.asarray(counts, np.int64)


def _rows(agents, begin: np.ndarray, length: np.ndarray, width: int, lo: int, hi: int):
    """Parties ``[lo, hi)`` of the party axis (rows >= K: padding parties, no records) as host
    ``(x, y, mask)`` of ``width`` records each: party k's records ``begin_k ..`` first, zeros
    after. Reads only these parties' rows of ``agents`` (one slice, memory maps included)."""
    num = len(begin)
    real = slice(min(lo, num), min(hi, num))
    xs, ys = np.asarray(agents.x[real]), np.asarray(agents.y[real])
    p, rows = hi - lo, real.stop - real.start
    shape = tuple(agents.x.shape[2:])
    x = np.zeros((p, width) + shape, np.float32)
    y = np.zeros((p, width), np.int32)
    mask = np.zeros((p, width), bool)
    if rows:
        pos = np.arange(width)[None, :]
        m = pos < length[real, None]
        idx = np.minimum(begin[real, None] + pos, max(agents.x.shape[1] - 1, 0))
        pick = np.arange(rows)[:, None]
        x[:rows] = np.where(m.reshape(m.shape + (1,) * len(shape)), xs[pick, idx], 0)
        y[:rows] = np.where(m, ys[pick, idx], 0)
        mask[:rows] = m
    return x, y, mask


def _global(shape: tuple, mesh, rows_fn) -> jax.Array:
    """A global array of ``shape`` with axis 0 split over ``mesh``: each process builds only its
    own devices' rows, ``rows_fn(lo, hi)`` (``jax.make_array_from_callback``)."""
    def shard(index):
        lo, hi, _ = index[0].indices(shape[0])
        return rows_fn(lo, hi)[(slice(None),) + tuple(index[1:])]
    return jax.make_array_from_callback(shape, agent_stream.agent_sharding(mesh), shard)


def _party_data(agents, half: str, batch_size: int, mesh=None) -> steps.PartyData:
    """One split of every party, stacked and padded. One Poisson rate for all parties, ``q =
    min(1, B / min_k n_k)`` (the smallest party's expected batch is B), so every party's records
    take identical mechanisms; each party divides by its own expected batch ``q n_k``.

    ``mesh``: global arrays of ``K_pad`` rows (:func:`padded_parties`) split over its ``agents``
    axis, each process reading and transferring only its own devices' parties (padding parties:
    no records, rate q, denominator 1)."""
    counts = np.asarray(agents.counts, np.int64)
    begin, length = _bounds(counts, half)
    width = int(length.max())
    q = min(1.0, batch_size / int(length.min()))
    k_pad = padded_parties(len(counts), mesh)
    rate = np.full(k_pad, q, np.float32)
    denom = np.ones(k_pad, np.float32)
    denom[:len(counts)] = q * length
    if mesh is None:
        x, y, mask = _rows(agents, begin, length, width, 0, len(counts))
        return steps.PartyData(x=jnp.asarray(x), y=jnp.asarray(y), mask=jnp.asarray(mask),
                               rate=jnp.asarray(rate), denom=jnp.asarray(denom))
    cache: dict = {}

    def rows(i: int):                                 # x, y, mask of one device's parties
        return lambda lo, hi: cache.setdefault((lo, hi), _rows(agents, begin, length, width,
                                                               lo, hi))[i]

    shape = (k_pad, width)
    return steps.PartyData(
        x=_global(shape + tuple(agents.x.shape[2:]), mesh, rows(0)),
        y=_global(shape, mesh, rows(1)), mask=_global(shape, mesh, rows(2)),
        rate=_global((k_pad,), mesh, lambda lo, hi: rate[lo:hi]),
        denom=_global((k_pad,), mesh, lambda lo, hi: denom[lo:hi]))


def make_search_data(agents, batch_size: int, mesh=None) -> steps.SearchData:
    """The parties' training and validation halves as :class:`steps.SearchData` (``mesh``: split
    over it, :func:`_party_data`)."""
    check_parties(np.asarray(agents.counts))
    return steps.SearchData(train=_party_data(agents, "train", batch_size, mesh),
                            val=_party_data(agents, "val", batch_size, mesh))


def make_retrain_data(agents, batch_size: int, mesh=None) -> steps.PartyData:
    """Every record of every party (retraining; ``mesh``: split over it)."""
    return _party_data(agents, "all", batch_size, mesh)


def host_rates(agents, batch_size: int, retrain_batch_size: int) -> dict[str, np.ndarray]:
    """The K parties' Poisson rates of the ``train`` / ``val`` halves and of ``retrain`` as host
    arrays (what the ledgers read; the data's own may be split over a mesh and padded)."""
    counts = np.asarray(agents.counts, np.int64)
    out = {}
    for name, half, b in (("train", "train", batch_size), ("val", "val", batch_size),
                          ("retrain", "all", retrain_batch_size)):
        length = _bounds(counts, half)[1]
        out[name] = np.full(len(counts), min(1.0, b / int(length.min())), np.float32)
    return out


def iterations_per_epoch(counts: np.ndarray, batch_size: int) -> int:
    """``ceil(max_k n_k / B)``: an epoch is an expected pass over the largest party's records."""
    return max(1, int(math.ceil(int(np.max(counts)) / batch_size)))
