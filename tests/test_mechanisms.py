"""Noise mechanisms: noise magnitudes, key independence, clipping and noisy votes."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from fedjax_dp.privacy import clipping as C, mechanisms as M, noise as N


def key(i=0):
    return jax.random.key(i)


# ----------------------------------------------------------------------------- Gaussian noise

def test_gaussian_noise_std_and_mean():
    std = 2.5
    z = np.asarray(N.gaussian_noise(key(0), (200_000,), std), np.float64)
    assert z.shape == (200_000,)
    # std of the sample std is about std / sqrt(2n) = 0.004; 2% is > 10 standard errors.
    assert abs(z.std() / std - 1) < 0.02
    assert abs(z.mean()) < 5 * std / math.sqrt(z.size)


def test_gaussian_noise_zero_std_is_zero():
    assert np.all(np.asarray(N.gaussian_noise(key(0), (3, 4), 0.0)) == 0)


def test_gaussian_noise_pytree_one_key_per_leaf():
    tree = {"a": jnp.zeros((50_000,)), "b": jnp.zeros((50_000,)),
            "c": [jnp.zeros((2, 3), jnp.bfloat16), jnp.zeros((4,), jnp.int32)]}
    noise = N.gaussian_noise(key(1), tree, 1.0)
    assert jax.tree.structure(noise) == jax.tree.structure(tree)
    assert noise["a"].shape == (50_000,) and noise["c"][0].shape == (2, 3)
    assert noise["c"][0].dtype == jnp.bfloat16          # float leaves keep their dtype
    assert jnp.issubdtype(noise["c"][1].dtype, jnp.floating)
    a, b = np.asarray(noise["a"]), np.asarray(noise["b"])
    assert not np.allclose(a, b)
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.03          # independent leaves (5 sigma ~ 0.022)
    # A single array uses the key directly, like the equivalent shape.
    np.testing.assert_array_equal(N.gaussian_noise(key(2), jnp.zeros((5,)), 1.0),
                                  N.gaussian_noise(key(2), (5,), 1.0))


def test_same_key_same_noise_different_key_different_noise():
    a = N.gaussian_noise(key(3), (100,), 1.0)
    np.testing.assert_array_equal(a, N.gaussian_noise(key(3), (100,), 1.0))
    assert not np.allclose(a, N.gaussian_noise(key(4), (100,), 1.0))
    # Raw uint32 keys and int seeds work too and are consistent with typed keys.
    np.testing.assert_array_equal(a, N.gaussian_noise(jax.random.key_data(key(3)), (100,), 1.0))


def test_gaussian_mechanism_adds_noise_of_std_z_times_sensitivity():
    value = {"w": jnp.full((100_000,), 3.0), "b": jnp.ones((4,))}
    out = M.gaussian_mechanism(key(5), value, l2_sensitivity=0.5, noise_multiplier=4.0)
    d = np.asarray(out["w"], np.float64) - 3.0
    assert abs(d.std() / 2.0 - 1) < 0.02
    exact = M.gaussian_mechanism(key(5), value, l2_sensitivity=0.5, noise_multiplier=0.0)
    np.testing.assert_array_equal(exact["w"], value["w"])


def test_jit_and_vmap_with_traced_scale():
    f = jax.jit(lambda k, s: N.gaussian_noise(k, (1000,), s))
    np.testing.assert_allclose(f(key(6), 2.0), N.gaussian_noise(key(6), (1000,), 2.0), rtol=1e-6)
    keys = jax.random.split(key(7), 4)
    rows = np.asarray(jax.vmap(lambda k: N.gaussian_noise(k, (1000,), 1.0))(keys))
    assert rows.shape == (4, 1000)
    assert len({r.tobytes() for r in rows}) == 4


# ----------------------------------------------------------------------------- Laplace noise

def test_laplace_noise_scale():
    b = 1.5
    z = np.asarray(N.laplace_noise(key(8), (200_000,), b), np.float64)
    assert abs(np.abs(z).mean() / b - 1) < 0.02          # E|X| = b
    assert abs(z.std() / (math.sqrt(2) * b) - 1) < 0.03  # sd = sqrt(2) b


def test_laplace_mechanism_scale_is_sensitivity_over_epsilon():
    value = jnp.zeros((200_000,))
    out = np.asarray(M.laplace_mechanism(key(9), value, l1_sensitivity=2.0, epsilon=0.5),
                     np.float64)
    assert abs(np.abs(out).mean() / 4.0 - 1) < 0.02


def test_noisy_argmax_laplace():
    counts = jnp.array([[0.0, 5.0, 2.0], [7.0, 1.0, 0.0]])
    out = M.noisy_argmax_laplace(key(10), counts, gamma=1e6)
    np.testing.assert_array_equal(out, [1, 0])
    assert out.dtype == jnp.int32 and out.shape == (2,)
    # Flip probability for counts (d, 0), d = 1, b = 1/gamma = 1: P(L1 - L0 > 1), where the
    # difference of two Laplace(b) has tail P(D > d) = exp(-d/b) (2 + d/b) / 4.
    q = 40_000
    counts = jnp.tile(jnp.array([[1.0, 0.0]]), (q, 1))
    flips = np.mean(np.asarray(M.noisy_argmax_laplace(key(11), counts, gamma=1.0)) == 1)
    expected = math.exp(-1) * 3 / 4
    assert abs(flips - expected) < 5 * math.sqrt(expected * (1 - expected) / q)


# ----------------------------------------------------------------------------- clipping

def _tree():
    rng = np.random.default_rng(0)
    return {"w": rng.normal(size=(3, 4)).astype(np.float32),
            "b": rng.normal(size=(4,)).astype(np.float32),
            "nested": [rng.normal(size=(2, 2, 2)).astype(np.float32)]}


@pytest.mark.parametrize("max_norm", [0.5, 1e3])
def test_clip_by_global_norm_matches_numpy(max_norm):
    tree = _tree()
    leaves = jax.tree.leaves(tree)
    norm = math.sqrt(sum(float(np.sum(np.asarray(x, np.float64) ** 2)) for x in leaves))
    clipped, got_norm = C.clip_by_global_norm(tree, max_norm)
    np.testing.assert_allclose(got_norm, norm, rtol=1e-5)
    scale = min(1.0, max_norm / norm)
    for c, x in zip(jax.tree.leaves(clipped), leaves):
        np.testing.assert_allclose(c, x * scale, rtol=1e-5, atol=1e-7)
    new_norm = math.sqrt(sum(float(np.sum(np.asarray(x, np.float64) ** 2))
                             for x in jax.tree.leaves(clipped)))
    assert new_norm == pytest.approx(min(norm, max_norm), rel=1e-5)
    # The norm is global: clipping each leaf on its own gives a different answer.
    if max_norm < norm:
        per_leaf = [x * min(1.0, max_norm / np.linalg.norm(x)) for x in leaves]
        assert not all(np.allclose(c, p) for c, p in zip(jax.tree.leaves(clipped), per_leaf))


def test_clip_by_global_norm_zero_tree_and_gradient():
    zero = {"a": jnp.zeros((3,)), "b": jnp.zeros((2, 2))}
    clipped, norm = C.clip_by_global_norm(zero, 1.0)
    assert float(norm) == 0.0
    assert all(np.all(np.asarray(x) == 0) for x in jax.tree.leaves(clipped))
    grad = jax.grad(lambda t: jnp.sum(C.clip_by_global_norm(t, 1.0)[0]["a"]))(zero)
    assert all(np.all(np.isfinite(np.asarray(g))) for g in jax.tree.leaves(grad))


def test_clip_vmapped_per_agent_equals_loop():
    rng = np.random.default_rng(1)
    stacked = {"w": rng.normal(size=(5, 3, 2)).astype(np.float32) * np.arange(1, 6)[:, None, None],
               "b": rng.normal(size=(5, 2)).astype(np.float32)}
    clipped, norms = jax.vmap(C.clip_by_global_norm, in_axes=(0, None))(stacked, 2.0)
    for i in range(5):
        one, n = C.clip_by_global_norm(jax.tree.map(lambda x: x[i], stacked), 2.0)
        np.testing.assert_allclose(norms[i], n, rtol=1e-6)
        for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(clipped)):
            np.testing.assert_allclose(b[i], a, rtol=1e-6)


# ----------------------------------------------------------------------------- noisy votes

def _ballots(n=7, q=30, c=4, seed=0):
    votes = np.random.default_rng(seed).integers(0, c, size=(n, q))
    return jax.nn.one_hot(votes, c)                                   # [N, Q, C]


@pytest.mark.parametrize("distributed", [True, False])
def test_noisy_argmax_vote_sigma_zero_is_plain_argmax(distributed):
    ballots = _ballots()
    out = M.noisy_argmax_vote(key(12), ballots, 0.0, distributed=distributed)
    assert out.shape == (30,) and out.dtype == jnp.int32
    np.testing.assert_array_equal(out, np.argmax(np.asarray(ballots).sum(0), -1))


def test_agent_vote_noise_independent_across_agents_and_queries():
    n, q, c, sigma = 8, 2000, 5, 3.0
    noise = np.asarray(M.agent_vote_noise(key(13), n, (q, c), sigma), np.float64)
    assert noise.shape == (n, q, c)
    rows = noise.reshape(n, -1)
    assert len({r.tobytes() for r in rows}) == n                    # no two agents share noise
    corr = np.corrcoef(rows)
    off = corr[~np.eye(n, dtype=bool)]
    assert np.max(np.abs(off)) < 0.05                               # 5 sigma ~ 0.022 each
    # Each agent's share has std sigma / sqrt(N); the sum over agents has std sigma.
    np.testing.assert_allclose(rows.std(axis=1), sigma / math.sqrt(n), rtol=0.05)
    total = noise.sum(0)                                            # [Q, C]
    assert abs(total.var() / sigma ** 2 - 1) < 0.05
    # Across queries: consecutive queries' noise is uncorrelated.
    flat = total.reshape(q, c)
    assert abs(np.corrcoef(flat[:-1].ravel(), flat[1:].ravel())[0, 1]) < 0.05


@pytest.mark.parametrize("distributed", [True, False])
def test_noisy_argmax_vote_flip_rate_matches_gaussian_sum(distributed):
    # Three agents vote 2:1 for class 0 over class 1 on every query; with total noise
    # N(0, sigma^2) on each class count, class 1 wins with probability Phi(-1 / (sigma sqrt 2)).
    q, sigma = 20_000, 1.0
    votes = np.zeros((3, q), int)
    votes[2] = 1
    ballots = jax.nn.one_hot(votes, 2)
    out = np.asarray(M.noisy_argmax_vote(key(14), ballots, sigma, distributed=distributed))
    expected = stats.norm.cdf(-1 / (sigma * math.sqrt(2)))
    assert abs(np.mean(out == 1) - expected) < 5 * math.sqrt(expected * (1 - expected) / q)


def test_noisy_argmax_vote_jit_with_traced_sigma_and_key_dependence():
    ballots = _ballots(q=200)
    f = jax.jit(M.noisy_argmax_vote, static_argnames="distributed")
    a = f(key(15), ballots, 2.0)
    np.testing.assert_array_equal(a, M.noisy_argmax_vote(key(15), ballots, 2.0))
    assert not np.array_equal(a, f(key(16), ballots, 2.0))


# ----------------------------------------------------------------------------- bad inputs

@pytest.mark.parametrize("call, name", [
    (lambda: N.gaussian_noise(key(), (3,), -1.0), "std"),
    (lambda: N.gaussian_noise(key(), (3,), float("nan")), "std"),
    (lambda: N.gaussian_noise(key(), (3,), float("inf")), "std"),
    (lambda: N.gaussian_noise(key(), (3,), True), "std"),
    (lambda: N.gaussian_noise(key(), (3,), np.array([1.0, -1.0])), "std"),
    (lambda: M.gaussian_mechanism(key(), jnp.zeros(3), -1.0, 1.0), "l2_sensitivity"),
    (lambda: M.gaussian_mechanism(key(), jnp.zeros(3), 1.0, -0.1), "noise_multiplier"),
    (lambda: N.laplace_noise(key(), (3,), -2.0), "scale"),
    (lambda: M.laplace_mechanism(key(), jnp.zeros(3), 1.0, 0.0), "epsilon"),
    (lambda: M.laplace_mechanism(key(), jnp.zeros(3), -1.0, 1.0), "l1_sensitivity"),
    (lambda: C.clip_by_global_norm({"a": jnp.ones(2)}, -1.0), "max_norm"),
    (lambda: M.noisy_argmax_vote(key(), _ballots(), -1.0), "sigma"),
    (lambda: M.noisy_argmax_vote(key(), jnp.ones((3, 4)), 1.0), "ballots"),
    (lambda: M.noisy_argmax_laplace(key(), jnp.ones((3, 4)), 0.0), "gamma"),
    (lambda: M.agent_vote_noise(key(), 0, (2, 2), 1.0), "num_agents"),
])
def test_bad_inputs_raise_value_error_naming_parameter(call, name):
    with pytest.raises(ValueError, match=name):
        call()
