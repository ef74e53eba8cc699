"""The averaging rounds (:mod:`fedjax_dp.algorithms.rounds`) fused on the device: up to K rounds
in ONE compiled call, each cohort trained in chunks of ``c`` agents, only the chunks it fills.
"""
from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Callable

import jax
import jax.numpy as jnp

from fedjax_dp.algorithms.round_parts import PARTICIPATION, advance, view_of
from fedjax_dp.core import cohort as cohort_lib
from fedjax_dp.core import defaults as defaults_lib

__all__ = ["add_trees", "cohort_chunk", "make_fused_rounds"]


def add_trees(a, b):
    """The leaf-wise sum of two pytrees (two passes' or chunks' sums)."""
    return jax.tree.map(jnp.add, a, b)


def cohort_chunk(rank: jax.Array, count: jax.Array, j: jax.Array, chunk: int,
                 method: str = "scan") -> tuple[jax.Array, jax.Array]:
    """Chunk ``j`` of a round's cohort, traceable: ``(ids [c] int32, valid [c] bool)``.

    ``rank = cumsum(coins)`` ``[N]`` (non-decreasing), ``count = rank[-1]`` the cohort size M.
    Row b holds the agent of rank ``r_b = j c + b + 1``, the first index with ``rank >= r_b``
    (``searchsorted``, O(c log N)); rows with ``r_b > M`` are padding (valid False; their id is
    clipped to a real agent, whose work the masked sum selects away). ``method``: the
    searchsorted method (:attr:`fedjax_dp.core.defaults.Defaults.cohort_search`)."""
    r = j * chunk + jnp.arange(1, chunk + 1, dtype=jnp.int32)                        # [c]
    ids = jnp.searchsorted(rank, r, side="left", method=method).astype(jnp.int32)
    return jnp.minimum(ids, rank.shape[0] - 1), r <= count


@functools.lru_cache(maxsize=64)
def make_fused_rounds(train_sum: Callable, server: Callable, chain, num_agents: int,
                      chunk: int, masked: bool, participation: bool,
                      capacity: int) -> SimpleNamespace:
    """The rounds fused on the device, compiled once per arguments.

    ``train_sum`` / ``server``: a round's pieces (:func:`~fedjax_dp.algorithms.round_parts.
    make_round_parts` of ``chain``). ``chunk``: agents per chunk c; ``masked``: every agent
    trains, the coins select (the reference); ``participation``: ``values["participation"] [N]
    int32`` += the round's coins; ``capacity``: K.

    Returns ``SimpleNamespace(rounds, one, run_keys, one_keys)``:
    ``rounds(values, keys [K], count, source, extras) -> (values, metrics)`` (compiled): the
    rounds of keys ``keys[:count]`` in turn, ``count <= K`` traced; metrics ``[K]`` per metric,
    the first ``count`` rows filled. ``run_keys(root, start)``: the keys of rounds ``start ..
    start + K - 1`` of the run with root ``root`` (round t's key :func:`api.step_key`
    ``(root, t)``); ``one_keys(key)``: ``key`` repeated K times, so that one round is the same
    compiled program with count 1 (a run stepped one round at a time and one run K rounds per
    call compile one round program, not two). ``one(values, key, source, extras)``: one round
    with an explicit round key, traceable (the seed driver vmaps it).
    """
    n = num_agents
    search = defaults_lib.defaults().cohort_search

    def cohort_sums(k_train, view, coins, source, extras):
        """The cohort's sums: every agent masked (the reference), or the ceil(M / c) chunks
        the cohort fills."""
        if masked:
            ids = jnp.arange(n, dtype=jnp.int32)
            return train_sum(k_train, view, source, None, ids, coins, extras)
        rank = jnp.cumsum(coins.astype(jnp.int32))                          # [N]
        m = rank[-1]

        def chunk_sums(j):
            ids, valid = cohort_chunk(rank, m, j, chunk, search)
            return train_sum(k_train, view, source, ids, ids, valid, extras)

        zero = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                            jax.eval_shape(chunk_sums, jnp.int32(0)))

        def body(carry):
            j, acc = carry
            return j + 1, add_trees(acc, chunk_sums(j))

        # the chunks actually filled: ceil(M / c) of them (none for an empty cohort)
        return jax.lax.while_loop(lambda carry: carry[0] * chunk < m, body,
                                  (jnp.int32(0), zero))[1]

    def one_round(values, key, source, extras):
        k_sample, k_train, k_noise = jax.random.split(key, 3)               # round_keys
        coins = chain.participation.coins(k_sample, n, values["stages"][PARTICIPATION])
        view = view_of(values)
        sums = cohort_sums(k_train, view, coins, source, extras)
        new_view, metrics = server(k_noise, view, sums, k_train)
        out = advance(chain, values, new_view)
        if participation:
            out["participation"] = values["participation"] + coins.astype(jnp.int32)
        return out, metrics

    def rounds(values, keys, count, source, extras):
        shapes = jax.eval_shape(lambda v: one_round(v, keys[0], source, extras)[1], values)
        buffer = jax.tree.map(lambda s: jnp.zeros((capacity,) + s.shape, s.dtype), shapes)

        def body(i, carry):
            vals, buf = carry
            vals, metrics = one_round(vals, keys[i], source, extras)
            buf = jax.tree.map(lambda b, m: jax.lax.dynamic_update_index_in_dim(b, m, i, 0),
                               buf, metrics)
            return vals, buf

        return jax.lax.fori_loop(0, count, body, (values, buffer))

    return SimpleNamespace(rounds=jax.jit(rounds), one=one_round,
                           run_keys=functools.partial(_run_keys, capacity=capacity),
                           one_keys=functools.partial(_one_keys, capacity=capacity))


@functools.partial(jax.jit, static_argnames="capacity")
def _run_keys(root: jax.Array, start: jax.Array, *, capacity: int) -> jax.Array:
    """Round keys ``[K]`` of rounds ``start .. start + K - 1`` of the run with root ``root``:
    :func:`api.step_key` ``(root, t) = fold_in(split(root)[1], t)``."""
    base = jax.random.split(root)[1]
    return jax.vmap(lambda i: jax.random.fold_in(base, start + i))(
        jnp.arange(capacity, dtype=jnp.int32))


@functools.partial(jax.jit, static_argnames="capacity")
def _one_keys(key: jax.Array, *, capacity: int) -> jax.Array:
    """``key`` repeated ``[K]`` (one round run by the K-round program with count 1)."""
    return jnp.broadcast_to(key[None], (capacity,) + key.shape)
