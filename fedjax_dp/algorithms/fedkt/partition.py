"""FedKT's splits: every party's data cut into s partitions x t disjoint teacher subsets.

Paper Algorithm 1 line 3: for every party i and partition j, a fresh random re-split
``D^i = D^i_{j,1} u ... u D^i_{j,t}``. :func:`teacher_split` cuts one partition;
:func:`teacher_data_keyed` gathers the subsets of a chunk of parties (keys ``[P, s]``, one per
(party, partition)), :func:`teacher_data_seeds` those of S seeds' chunks at once. Also the
public queries each tier labels (:func:`query_subset`) and the pooled single party of the
centralized-PATE baseline (:func:`pool`).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.core import StackedData, from_ragged


def check_party_sizes(counts, num_teachers: int) -> None:
    """Every party needs at least ``t`` records (one per teacher subset); else a clear error."""
    counts = np.asarray(counts)
    small = np.flatnonzero(counts < num_teachers)
    if small.size:
        i = int(small[0])
        raise ValueError(
            f"party {i} holds {int(counts[i])} records, fewer than num_teachers={num_teachers}: "
            f"each of its t subsets needs at least one record (parties too small: "
            f"{small[:10].tolist()}); lower algorithm.num_teachers or use fewer parties")


def teacher_split(key: jax.Array, count: jax.Array, n_max: int, num_teachers: int):
    """One partition of one party: ``(rows [t, m], sizes [t])`` (Algorithm 1 line 3).

    The party's ``count`` real rows (rows ``0..count-1`` of its padded array) are shuffled and
    cut into ``t`` disjoint contiguous pieces of sizes ``floor((k+1) c / t) - floor(k c / t)``;
    ``rows[k, r]`` is the r-th row of subset k (0 where ``r >= sizes[k]``),
    ``m = ceil(n_max / t)``.
    """
    m = -(-n_max // num_teachers)
    u = jax.random.uniform(key, (n_max,))
    u = jnp.where(jnp.arange(n_max) < count, u, 2.0)           # padding sorts last
    perm = jnp.argsort(u)                                       # [n_max] real rows first
    bounds = (jnp.arange(num_teachers + 1) * count) // num_teachers          # [t + 1]
    pos = bounds[:-1, None] + jnp.arange(m)[None, :]            # [t, m]
    valid = pos < bounds[1:, None]
    rows = jnp.where(valid, perm[jnp.minimum(pos, n_max - 1)], 0)
    return rows.astype(jnp.int32), (bounds[1:] - bounds[:-1]).astype(jnp.int32)


def teacher_data(key: jax.Array, parties: StackedData, num_partitions: int,
                 num_teachers: int) -> StackedData:
    """All teachers' local data, ``[n * s * t, m, ...]`` ordered (party, partition, teacher).

    Partition j of party i uses key ``split(key, n * s)[i * s + j]``: independent re-splits.
    """
    check_party_sizes(parties.counts, num_teachers)
    return _teacher_data(key, parties, num_partitions, num_teachers)


def split_keys(key: jax.Array, num_parties: int, num_partitions: int) -> jax.Array:
    """``[n, s]``: the key of partition j of party i is ``split(key, n * s)[i * s + j]``."""
    return jax.random.split(key, num_parties * num_partitions).reshape(num_parties,
                                                                       num_partitions)


def _teacher_data_impl(key, parties: StackedData, num_partitions: int, num_teachers: int):
    keys = split_keys(key, parties.num_agents, num_partitions)
    return teacher_data_keyed(keys, parties, num_partitions, num_teachers)


def teacher_data_keyed(keys: jax.Array, parties: StackedData, num_partitions: int,
                       num_teachers: int) -> StackedData:
    """:func:`teacher_data` with the per-(party, partition) keys given (``keys [n, s]``): a chunk
    of parties with its slice of the keys gets the same subsets as the whole population. A
    party without records (padding) gives t empty subsets."""
    n, n_max = parties.num_agents, parties.max_size
    split = jax.vmap(jax.vmap(teacher_split, (0, None, None, None)), (0, 0, None, None))
    rows, sizes = split(keys, parties.counts, n_max, num_teachers)       # [n, s, t, m], [n, s, t]
    m = rows.shape[-1]
    x = jax.vmap(lambda xi, ri: xi[ri])(parties.x, rows)                 # [n, s, t, m, ...]
    y = jax.vmap(lambda yi, ri: yi[ri])(parties.y, rows)                 # [n, s, t, m]
    mask = jnp.arange(m) < sizes[..., None]                              # [n, s, t, m]
    a = n * num_partitions * num_teachers
    return StackedData(x=x.reshape((a, m) + x.shape[4:]), y=y.reshape(a, m),
                       mask=mask.reshape(a, m), counts=sizes.reshape(a))


_teacher_data = jax.jit(_teacher_data_impl, static_argnums=(2, 3))


@functools.partial(jax.jit, static_argnums=(2, 3))
def teacher_data_seeds(keys: jax.Array, parties: tuple, num_partitions: int,
                       num_teachers: int) -> StackedData:
    """Seed s's :func:`teacher_data_keyed` of its chunk ``parties[s]`` with ``keys[s]
    [P, s]`` (at its own ``n_max``), padded to the seeds' largest ``m = ceil(n_max / t)`` with
    masked rows (local training never reads them: it samples rows below a subset's count) and
    stacked: ``[S, P s t, m, ...]``. Integer gathers only: the same rows as an unbatched call."""
    m = max(-(-p.max_size // num_teachers) for p in parties)
    out = []
    for i, p in enumerate(parties):          # S seeds (static, small): traced once per S
        d = teacher_data_keyed(keys[i], p, num_partitions, num_teachers)
        pad = m - d.x.shape[1]
        if pad:
            widen = lambda a: jnp.pad(a, [(0, 0), (0, pad)] + [(0, 0)] * (a.ndim - 2))  # noqa
            d = StackedData(x=widen(d.x), y=widen(d.y), mask=widen(d.mask), counts=d.counts)
        out.append(d)
    return jax.tree.map(lambda *ls: jnp.stack(ls), *out)


def query_subset(key: jax.Array, num_public: int, fraction: float) -> np.ndarray:
    """The sorted public indices a noisy tier labels: ``max(1, round(fraction P))`` of the ``P``
    public points drawn without replacement (``permutation(key, P)[:num]``); all when the
    number reaches P."""
    num = max(1, int(round(fraction * num_public)))
    if num >= num_public:
        return np.arange(num_public)
    return np.sort(np.asarray(jax.random.permutation(key, num_public)[:num]))


def pool(parties: StackedData) -> StackedData:
    """All parties' records as one party, in party order (the centralized setting)."""
    xs, ys = zip(*(parties.local(i) for i in range(parties.num_agents)))    # host, not hot
    return from_ragged([np.concatenate(xs)], [np.concatenate(ys)])
