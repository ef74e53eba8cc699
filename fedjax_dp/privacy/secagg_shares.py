"""Additive secret sharing among J >= 2 non-colluding talliers and their joint argmax (MPC-vote).

Agent i's noisy ballot for the Q queries, ``x_i = b_i / divisor + z_i`` (``[Q, C]``, the ballot
and the agent's own noise share of :mod:`fedjax_dp.privacy.vote`), is encoded in the ring
(:func:`fedjax_dp.privacy.secagg.encode`, ``E(x_i)``) and split into J shares::

    s_{i,1}, ..., s_{i,J-1} ~ Uniform(Z_{2^32})^{Q x C}      (from agent i's own key)
    s_{i,J} = E(x_i) - sum_{j<J} s_{i,j}   mod 2^32

Tallier j receives ``s_{i,j}`` from every agent and adds them, ``T_j = sum_i s_{i,j} mod 2^32``
(over the surviving agents: a dropped agent's shares reach no tallier). The talliers then
jointly compute ``argmax_c D(sum_j T_j)`` per query and reveal only that index; the combination
``sum_j T_j`` happens inside their MPC and is never revealed (here: simulated in one function,
:func:`release_labels`, that returns labels only).

What one tallier sees. Any J-1 of the J shares of ``E(x_i)`` are independent and uniform on
``Z_{2^32}^{Q x C}``, whatever ``x_i``: a coalition of up to J - 1 talliers learns nothing about
any agent's ballot. All J together would learn every ballot, hence "non-colluding".

Keys. Agent i's shares come from ``fold_in(key, i)`` (global agent index; never the noise key),
identical however the agents are chunked. The sum of shares is ``sum_i E(x_i) mod 2^32`` exactly, so
chunked accumulation (:func:`tally_add`) equals the one-shot :func:`tallier_sums`."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from fedjax_dp.privacy import secagg

__all__ = ["share", "tallier_sums", "tally_init", "tally_add", "combine", "release_labels",
           "reveal_sum", "secure_argmax", "secure_sum_diagnostic"]


@functools.partial(jax.jit, static_argnames=("talliers",))
def share(key: jax.Array, agent_ids: jax.Array, encoded: jax.Array, talliers: int) -> jax.Array:
    """``encoded [a, ...]`` uint32 -> shares ``[a, J, ...]`` uint32 (see the module formula).

    ``agent_ids [a]``: global indices; agent i's J-1 uniform shares are ``random.bits(fold_in(key,
    i), (J-1, ...))``."""
    def one(i, x):
        r = jax.random.bits(jax.random.fold_in(key, i), (talliers - 1,) + x.shape, jnp.uint32)
        last = x - jnp.sum(r, axis=0, dtype=jnp.uint32)                  # wraps mod 2^32
        return jnp.concatenate([r, last[None]], axis=0)                   # [J, ...]

    return jax.vmap(one)(agent_ids, encoded)


@jax.jit
def tallier_sums(shares: jax.Array, contrib: jax.Array) -> jax.Array:
    """``T_j = sum_{i: contrib_i} s_{i,j} mod 2^32``: ``shares [a, J, ...]``, ``contrib [a]``
    bool -> ``[J, ...]`` uint32 (each tallier adds only what it received)."""
    c = contrib.reshape(contrib.shape + (1,) * (shares.ndim - 1))
    return jnp.sum(jnp.where(c, shares, jnp.uint32(0)), axis=0, dtype=jnp.uint32)


def tally_init(talliers: int, shape: tuple[int, ...]) -> jax.Array:
    """The talliers' running sums ``[J, *shape]`` uint32, all zero."""
    return jnp.zeros((talliers,) + tuple(shape), jnp.uint32)


@functools.partial(jax.jit, static_argnames=("frac_bits",))
def tally_add(acc: jax.Array, key: jax.Array, values: jax.Array, agent_ids: jax.Array,
              contrib: jax.Array, *, frac_bits: int) -> jax.Array:
    """Add a chunk of agents to the talliers' sums: ``acc [J, Q, C]`` + shares of
    ``E(values)`` (``values [a, Q, C]`` float, ``agent_ids [a]``, ``contrib [a]`` bool: real,
    surviving agents). Chunk by chunk equals all at once (sums mod 2^32 are associative)."""
    enc = secagg.encode(values, frac_bits)                                 # [a, Q, C]
    return acc + tallier_sums(share(key, agent_ids, enc, acc.shape[0]), contrib)


@jax.jit
def combine(acc: jax.Array) -> jax.Array:
    """``sum_j T_j mod 2^32`` (inside the talliers' MPC): ``[J, ...]`` -> ``[...]`` uint32."""
    return jnp.sum(acc, axis=0, dtype=jnp.uint32)


@functools.partial(jax.jit, static_argnames=("frac_bits",))
def release_labels(acc: jax.Array, extra: jax.Array | None = None, *,
                   frac_bits: int) -> jax.Array:
    """The talliers' joint output: ``argmax_c to_signed(sum_j T_j + E(extra))`` per query,
    ``int32 [Q]`` and nothing else.

    ``extra [Q, C]`` (optional, float): a term the talliers add jointly inside the MPC (the vote's
    aggregate noise, ``vote_noise = "aggregate"``). The argmax is taken on the signed integers, so
    it is exact (no float rounding of the decoded sums)."""
    total = combine(acc)
    if extra is not None:
        total = total + secagg.encode(extra, frac_bits)
    return jnp.argmax(secagg.to_signed(total), axis=-1).astype(jnp.int32)


def reveal_sum(acc: jax.Array, frac_bits: int) -> jax.Array:
    """DIAGNOSTIC ONLY (tests, benchmarks): the decoded sum ``D(sum_j T_j)`` ``[Q, C]`` float32,
    which the real protocol never reveals. Never call it from an algorithm."""
    return secagg.decode(combine(acc), frac_bits)


def secure_argmax(key: jax.Array, values: jax.Array, contrib: jax.Array,
                  config: secagg.SecAggConfig, agent_ids: jax.Array | None = None) -> jax.Array:
    """One-shot MPC vote: ``values [N, Q, C]`` (the agents' noisy ballots) shared among
    ``config.talliers`` talliers, summed over ``contrib [N]``, ``argmax`` per query ``int32 [Q]``.
    ``agent_ids`` default ``arange(N)``."""
    n, q, c = values.shape
    ids = jnp.arange(n) if agent_ids is None else agent_ids
    acc = tally_add(tally_init(config.talliers, (q, c)), key, values, ids, contrib,
                    frac_bits=config.frac_bits)
    return release_labels(acc, frac_bits=config.frac_bits)


def secure_sum_diagnostic(key: jax.Array, values: jax.Array, contrib: jax.Array,
                          config: secagg.SecAggConfig,
                          agent_ids: jax.Array | None = None) -> jax.Array:
    """DIAGNOSTIC ONLY: the decoded sum that :func:`secure_argmax` takes the argmax of,
    ``[Q, C]`` float32 (for tests; the protocol never reveals it)."""
    n, q, c = values.shape
    ids = jnp.arange(n) if agent_ids is None else agent_ids
    acc = tally_add(tally_init(config.talliers, (q, c)), key, values, ids, contrib,
                    frac_bits=config.frac_bits)
    return reveal_sum(acc, config.frac_bits)
