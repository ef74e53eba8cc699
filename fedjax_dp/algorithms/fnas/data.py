"""DP-FNAS's party data: each party's records split into a training and a validation half
(the search's two halves), stacked and padded over the parties with one Poisson rate."""
from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from fedjax_dp.algorithms.fnas import steps

__all__ = ["check_parties", "iterations_per_epoch", "make_retrain_data", "make_search_data",
           "split_halves"]


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


def _party_data(xs: list, ys: list, batch_size: int) -> steps.PartyData:
    """Stack ragged per-party arrays. One Poisson rate for all parties, ``q = min(1, B / min_k
    n_k)`` (the smallest party's expected batch is B), so every party's records take identical
    mechanisms; each party divides by its own expected batch ``q n_k``."""
    counts = np.array([len(y) for y in ys], np.int64)
    n_max = int(counts.max())
    shape = xs[0].shape[1:]
    x = np.zeros((len(xs), n_max) + shape, np.float32)
    y = np.zeros((len(xs), n_max), np.int32)
    for k, (xk, yk) in enumerate(zip(xs, ys)):       # host-side construction, once per run
        x[k, :len(yk)], y[k, :len(yk)] = xk, yk
    mask = np.arange(n_max)[None, :] < counts[:, None]
    rate = np.full(len(ys), min(1.0, batch_size / int(counts.min())))
    return steps.PartyData(x=jnp.asarray(x), y=jnp.asarray(y), mask=jnp.asarray(mask),
                           rate=jnp.asarray(rate, jnp.float32),
                           denom=jnp.asarray(rate * counts, jnp.float32))


def make_search_data(agents, batch_size: int) -> steps.SearchData:
    """The parties' training and validation halves as :class:`steps.SearchData`."""
    counts = np.asarray(agents.counts)
    check_parties(counts)
    n_train, _ = split_halves(counts)
    xs = [np.asarray(agents.x[k, :counts[k]]) for k in range(len(counts))]
    ys = [np.asarray(agents.y[k, :counts[k]]) for k in range(len(counts))]
    train = _party_data([x[:t] for x, t in zip(xs, n_train)],
                        [y[:t] for y, t in zip(ys, n_train)], batch_size)
    val = _party_data([x[t:] for x, t in zip(xs, n_train)],
                      [y[t:] for y, t in zip(ys, n_train)], batch_size)
    return steps.SearchData(train=train, val=val)


def make_retrain_data(agents, batch_size: int) -> steps.PartyData:
    counts = np.asarray(agents.counts)
    return _party_data([np.asarray(agents.x[k, :counts[k]]) for k in range(len(counts))],
                       [np.asarray(agents.y[k, :counts[k]]) for k in range(len(counts))],
                       batch_size)


def iterations_per_epoch(counts: np.ndarray, batch_size: int) -> int:
    """``ceil(max_k n_k / B)``: an epoch is an expected pass over the largest party's records."""
    return max(1, int(math.ceil(int(np.max(counts)) / batch_size)))
