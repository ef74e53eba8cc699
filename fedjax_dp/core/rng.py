"""PRNG helpers. Every random draw gets its own key; keys are split, never reused.

Conventions: ``split_per_agent(key, n)`` gives one independent key per agent (leading axis n),
``round_keys(key, r)`` one per round; ``fold_in`` derives a named stream (e.g. the noise of round t)
from a root key so that adding a new random draw elsewhere never shifts an existing stream.
:func:`agent_keys` gives rows of ``split_per_agent(key, n)`` without the other rows (inside a
compiled chunk of agents).

With JAX's default ``threefry2x32`` keys, :func:`as_key` of an int seed and :func:`stream` of a
concrete key compute the key's two words on the host (:func:`threefry2x32`, bit for bit JAX's)
instead of compiling a small program per process; other key implementations, traced keys and batches
of keys take JAX's own path."""
from __future__ import annotations

import zlib

import jax
import jax.numpy as jnp
import numpy as np

_THREEFRY = "threefry2x32"
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def threefry2x32(key_words, x0, x1) -> tuple[np.ndarray, np.ndarray]:
    """The Threefry-2x32 hash (20 rounds; Salmon et al. 2011, as ``jax.extend.random.
    threefry_2x32``) of the uint32 counter pairs ``(x0, x1)`` under the key words
    ``(k0, k1)``, on the host (numpy)."""
    k0, k1 = (np.uint32(k) for k in key_words)
    ks = (k0, k1, k0 ^ k1 ^ np.uint32(0x1BD11BDA))
    x0 = np.array(x0, np.uint32, ndmin=1)
    x1 = np.array(x1, np.uint32, ndmin=1)
    with np.errstate(over="ignore"):
        x0 += ks[0]
        x1 += ks[1]
        for i in range(5):
            for r in _ROTATIONS[i % 2]:
                x0 += x1
                x1 = (x1 << np.uint32(r)) | (x1 >> np.uint32(32 - r))
                x1 ^= x0
            x0 += ks[(i + 1) % 3]
            x1 += ks[(i + 2) % 3] + np.uint32(i + 1)
    return x0, x1


def _host_threefry(key) -> bool:
    """Whether ``key`` is one concrete typed threefry2x32 key (its words can be read)."""
    return (not isinstance(key, jax.core.Tracer) and jnp.shape(key) == ()
            and jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)
            and str(jax.random.key_impl(key)) == _THREEFRY)


def _wrap(words) -> jax.Array:
    return jax.random.wrap_key_data(np.asarray(words, np.uint32), impl=_THREEFRY)


def as_key(seed_or_key) -> jax.Array:
    """A typed PRNG key from an int seed (or pass a key through unchanged)."""
    if isinstance(seed_or_key, (int, np.integer)):
        seed = int(seed_or_key)
        if 0 <= seed < 2 ** 31 and str(jax.config.jax_default_prng_impl) == _THREEFRY:
            return _wrap([0, seed])          # jax.random.key(seed)'s words: (seed >> 32, seed)
        return jax.random.key(seed)
    key = seed_or_key
    if not jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.wrap_key_data(key)
    return key


def stream(key: jax.Array, name: str) -> jax.Array:
    """An independent key for the named purpose (``fold_in`` with a stable hash of ``name``)."""
    return fold_in(as_key(key), zlib.crc32(name.encode()) & 0x7FFFFFFF)


def fold_in(key: jax.Array, data: int) -> jax.Array:
    """``jax.random.fold_in(key, data)`` (``0 <= data < 2**32``), computed on the host for one
    concrete threefry key: ``threefry2x32(key, (0, data))``."""
    if not _host_threefry(key) or not 0 <= int(data) < 2 ** 32:
        return jax.random.fold_in(key, data)
    words = np.asarray(jax.random.key_data(key))
    o0, o1 = threefry2x32(words, 0, int(data))
    return _wrap([o0[0], o1[0]])


def split_per_agent(key: jax.Array, num_agents: int) -> jax.Array:
    """``num_agents`` independent keys, shape ``[num_agents]`` (one per agent)."""
    return jax.random.split(as_key(key), num_agents)


def agent_keys(key: jax.Array, ids, num_agents: int) -> jax.Array:
    """Rows ``ids`` of ``split_per_agent(key, num_agents)`` (traceable: a chunk of agents computes
    its own keys inside its compiled call; O(len(ids)) work, not O(N)). ``ids`` may hold values
    ``>= num_agents`` (padding rows of a chunk): their keys are valid keys that no real agent
    uses. Bit for bit the keys of :func:`split_per_agent` under either setting of
    ``jax_threefry_partitionable``; another key implementation computes the whole split."""
    key = as_key(key)
    ids = jnp.asarray(ids, jnp.uint32)
    if str(jax.random.key_impl(key)) != _THREEFRY:
        return jax.random.split(key, num_agents)[ids]
    if jax.config.jax_threefry_partitionable:
        # split(key, n)[i] = threefry(key, (0, i)) = fold_in(key, i)
        return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, ids)
    # the original split: out = threefry(key, (iota(n), n + iota(n))) concatenated, then
    # reshaped [n, 2]: row i holds out[2i], out[2i + 1]
    from jax.extend.random import threefry_2x32
    words = jax.random.key_data(key)
    n = jnp.uint32(num_agents)

    def word(j):
        m = jnp.where(j < n, j, j - n)
        o = threefry_2x32((words[0], words[1]), jnp.concatenate([m.ravel(), (m + n).ravel()]))
        o0, o1 = o[:m.size].reshape(m.shape), o[m.size:].reshape(m.shape)
        return jnp.where(j < n, o0, o1)

    data = jnp.stack([word(2 * ids), word(2 * ids + 1)], -1)
    return jax.random.wrap_key_data(data, impl=_THREEFRY)


def numpy_rng(seed_or_key) -> np.random.Generator:
    """A numpy Generator deterministically derived from an int seed or a JAX key (host-side work)."""
    if isinstance(seed_or_key, (int, np.integer)):
        return np.random.default_rng(int(seed_or_key))
    data = np.asarray(jax.random.key_data(as_key(seed_or_key))).astype(np.uint64).ravel()
    return np.random.default_rng([int(v) for v in data])


def counter_normals(key: jax.Array, hi: jax.Array, lo: jax.Array, d: int) -> jax.Array:
    """``[m, d]`` float32 standard normals, row r a pure function of ``(key, hi[r], lo[r])``
    (counter mode): the Threefry-2x32 hash (``jax.extend.random.threefry_2x32``) of the counter
    pairs ``(hi[r], lo[r] h + j)``, ``j < h = ceil(d / 2)``, gives two uint32 words per pair
    (values ``j`` and ``h + j``); each word becomes a uniform in ``(-1, 1)`` as
    ``jax.random.uniform`` makes one and then ``sqrt(2) erfinv(u)`` as ``jax.random.normal``
    does. ``hi``, ``lo [m]`` integers with ``lo h + j < 2^32``.

    Any rows, in any batch or chunk, on any device, give the same values; distinct counter pairs
    give independent values. One hash per two values (``normal(fold_in(fold_in(key, hi), lo),
    (d,))`` hashes once for the key and once per value)."""
    from jax.extend.random import threefry_2x32
    words = jax.random.key_data(key)
    h = -(-d // 2)
    m = hi.shape[0]
    x0 = jnp.broadcast_to(hi.astype(jnp.uint32)[:, None], (m, h)).reshape(-1)
    x1 = (lo.astype(jnp.uint32)[:, None] * np.uint32(h)
          + jnp.arange(h, dtype=jnp.uint32)[None, :]).reshape(-1)
    bits = threefry_2x32((words[0], words[1]), jnp.concatenate([x0, x1]))      # [2 m h]
    bits = bits.reshape(2, m, h).transpose(1, 0, 2).reshape(m, 2 * h)[:, :d]
    f = jax.lax.bitcast_convert_type((bits >> 9) | np.uint32(0x3F800000), jnp.float32) - 1.0
    low = np.nextafter(np.float32(-1.0), np.float32(0.0))
    u = jnp.maximum(low, f * (np.float32(1.0) - low) + low)                        # [-1, 1)
    return np.float32(np.sqrt(2.0)) * jax.lax.erf_inv(u)
