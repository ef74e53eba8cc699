"""The host-computed keys of :mod:`fedjax_dp.core.rng` equal JAX's, bit for bit, and cost no
compilation; :func:`~fedjax_dp.core.rng.agent_keys` gives rows of ``split_per_agent``."""
import zlib

import jax
import numpy as np
import pytest

from fedjax_dp.core import rng


def _words(key):
    return np.asarray(jax.random.key_data(key))


@pytest.mark.parametrize("seed", [0, 1, 7, 12345, 2 ** 31 - 1])
def test_as_key_and_stream_equal_jax(seed):
    key = rng.as_key(seed)
    ref = jax.random.key(seed)
    np.testing.assert_array_equal(_words(key), _words(ref))
    assert jax.random.key_impl(key) == jax.random.key_impl(ref)
    for name in ("init", "train", "vote", "partition", "synthetic_features"):
        want = jax.random.fold_in(ref, zlib.crc32(name.encode()) & 0x7FFFFFFF)
        np.testing.assert_array_equal(_words(rng.stream(key, name)), _words(want))
    for data in (0, 1, 2 ** 31, 2 ** 32 - 1):
        np.testing.assert_array_equal(_words(rng.fold_in(key, data)),
                                      _words(jax.random.fold_in(ref, data)))


def test_threefry2x32_matches_jax_hash():
    from jax.extend.random import threefry_2x32
    key = rng.as_key(3)
    counts = np.arange(10, dtype=np.uint32)
    want = np.asarray(threefry_2x32(tuple(_words(key)), counts))
    o0, o1 = rng.threefry2x32(_words(key), counts[:5], counts[5:])
    np.testing.assert_array_equal(np.concatenate([o0, o1]), want)


def test_key_derivation_compiles_nothing():
    from fedjax_dp.core.compilation import CompileLog
    with CompileLog() as log:
        root = rng.as_key(4242)
        rng.stream(rng.stream(root, "algorithm"), "init")
    assert log.count == 0


def test_traced_keys_take_jax_path():
    root = rng.as_key(5)
    f = jax.jit(lambda k: jax.random.key_data(rng.stream(k, "x")))
    np.testing.assert_array_equal(np.asarray(f(root)), _words(rng.stream(root, "x")))


@pytest.mark.parametrize("partitionable", [True, False])
@pytest.mark.parametrize("n", [1, 5, 1000])
def test_agent_keys_are_rows_of_split_per_agent(partitionable, n):
    with jax.threefry_partitionable(partitionable):
        key = rng.stream(rng.as_key(3), "init")
        want = _words(rng.split_per_agent(key, n))
        ids = np.arange(n, dtype=np.int32)
        got = jax.jit(lambda k, i: jax.random.key_data(rng.agent_keys(k, i, n)))(key, ids)
        np.testing.assert_array_equal(np.asarray(got), want)
        sub = np.array([n - 1, 0, n // 2], np.int32)           # any rows, any order
        got = jax.random.key_data(rng.agent_keys(key, sub, n))
        np.testing.assert_array_equal(np.asarray(got), want[sub])


def test_counter_normals_are_the_hash_of_their_counters_and_standard_normal():
    """Row r is a pure function of (key, hi[r], lo[r]): equal to the host hash of its counters
    turned into normals, whatever rows it is drawn with; the values are N(0, 1)."""
    from scipy import stats
    key = rng.as_key(11)
    hi = np.array([0, 5, 5, 2 ** 20], np.uint32)
    lo = np.array([0, 0, 3, 7], np.uint32)
    d = 5                                                     # h = 3 pairs, the last word dropped
    normals = jax.jit(rng.counter_normals, static_argnums=3)  # one compiled call per row count
    z = np.asarray(normals(key, hi, lo, d))
    for r in range(4):                                        # the same row alone, by the host
        x1 = lo[r] * 3 + np.arange(3, dtype=np.uint32)
        w0, w1 = rng.threefry2x32(_words(key), np.full(3, hi[r], np.uint32), x1)
        words = np.concatenate([w0, w1])[:d]
        f = ((words >> 9) | np.uint32(0x3F800000)).view(np.float32) - np.float32(1.0)
        low = np.nextafter(np.float32(-1.0), np.float32(0.0))
        u = np.maximum(low, f * (np.float32(1.0) - low) + low)
        from scipy.special import erfinv
        np.testing.assert_allclose(z[r], np.sqrt(2.0) * erfinv(u.astype(np.float64)), atol=2e-6)
        np.testing.assert_array_equal(np.asarray(normals(
            key, hi[r:r + 1], lo[r:r + 1], d))[0], z[r])
    big = np.asarray(normals(key, np.arange(4000, dtype=np.uint32),
                             np.arange(4000, dtype=np.uint32) % 17, 10)).ravel()
    assert stats.kstest(big, "norm").pvalue > 1e-3
