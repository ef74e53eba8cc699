"""PRNG helpers. Every random draw gets its own key; keys are split, never reused.

Conventions: ``split_per_agent(key, n)`` gives one independent key per agent (leading axis n),
``round_keys(key, r)`` one per round; ``fold_in`` derives a named stream (e.g. the noise of round t)
from a root key so that adding a new random draw elsewhere never shifts an existing stream.
"""
from __future__ import annotations

import zlib

import jax
import numpy as np


def as_key(seed_or_key) -> jax.Array:
    """A typed PRNG key from an int seed (or pass a key through unchanged)."""
    if isinstance(seed_or_key, (int, np.integer)):
        return jax.random.key(int(seed_or_key))
    key = seed_or_key
    if not jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.wrap_key_data(key)
    return key


def stream(key: jax.Array, name: str) -> jax.Array:
    """An independent key for the named purpose (``fold_in`` with a stable hash of ``name``)."""
    return jax.random.fold_in(as_key(key), zlib.crc32(name.encode()) & 0x7FFFFFFF)


def split_per_agent(key: jax.Array, num_agents: int) -> jax.Array:
    """``num_agents`` independent keys, shape ``[num_agents]`` (one per agent)."""
    return jax.random.split(as_key(key), num_agents)


def numpy_rng(seed_or_key) -> np.random.Generator:
    """A numpy Generator deterministically derived from an int seed or a JAX key (host-side work)."""
    if isinstance(seed_or_key, (int, np.integer)):
        return np.random.default_rng(int(seed_or_key))
    data = np.asarray(jax.random.key_data(as_key(seed_or_key))).astype(np.uint64).ravel()
    return np.random.default_rng([int(v) for v in data])
