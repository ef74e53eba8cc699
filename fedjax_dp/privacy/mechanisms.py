"""Noise-adding mechanisms: pure JAX functions of an explicit PRNG key (jit- and vmap-able).

Every mechanism here is "constrain sensitivity, then add noise" (the pfl-research split):
:func:`clip_by_global_norm` bounds the L2 sensitivity, :func:`gaussian_noise` /
:func:`laplace_noise` add the noise, and :func:`gaussian_mechanism` / :func:`laplace_mechanism`
are the two put together for a sensitivity the caller has already bounded.

Privacy is *not* computed here. Each docstring states the neighbouring relation, the sensitivity
and the unit of privacy the mechanism is meant for, and the ``dp_accounting`` event that describes
one application of it; the caller records that event in a
:class:`~fedjax_dp.privacy.ledger.PrivacyLedger` (see :mod:`fedjax_dp.privacy.accounting`).

Keys: one key per random draw. A pytree gets one independent key per leaf
(``jax.random.split``), the agents of a distributed vote one key per agent
(:func:`fedjax_dp.core.rng.split_per_agent`); a key is never used twice.

Arguments that set the amount of noise (``std``, ``sigma``, ``noise_multiplier``, ...) are checked
on the host when they are Python or numpy numbers (or concrete arrays): a negative, NaN or infinite
value raises ``ValueError`` naming the parameter before any tracing. Traced values (inside
``jit``/``vmap``) are not checked.
"""
from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.core import rng, validation

__all__ = [
    "gaussian_noise", "gaussian_mechanism", "laplace_noise", "laplace_mechanism",
    "clip_by_global_norm", "agent_vote_noise", "noisy_argmax_vote", "noisy_argmax_laplace",
]


# --------------------------------------------------------------------------- host-side checks

def _check_scale(name: str, value: Any, *, positive: bool = False) -> None:
    """Check a noise scale on the host: finite and ``>= 0`` (``> 0`` if ``positive``).

    Tracers are skipped (they have no value yet); concrete arrays are checked elementwise.
    """
    if isinstance(value, jax.core.Tracer):
        return
    if isinstance(value, (jax.Array, np.ndarray)) and np.ndim(value) > 0:
        arr = validation.check_finite_array(name, value)
        if np.any(arr < 0) or (positive and np.any(arr == 0)):
            bound = "> 0" if positive else ">= 0"
            raise ValueError(f"{name} must be {bound} everywhere, got min {arr.min()!r}")
        return
    if isinstance(value, (jax.Array, np.ndarray)):
        value = np.asarray(value).item()
    v = validation.check_positive(name, value) if positive else \
        validation.check_nonnegative(name, value)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {value!r}")


def _is_shape(x: Any) -> bool:
    if isinstance(x, bool):
        return False
    if isinstance(x, (int, np.integer)):
        return True
    return isinstance(x, (tuple, list)) and all(
        isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in x)


def _float_dtype(dtype) -> Any:
    """``dtype`` if it is a float type, else JAX's default float type."""
    if dtype is not None and jnp.issubdtype(dtype, jnp.floating):
        return dtype
    return jnp.result_type(float)


_SAMPLERS = {"normal": jax.random.normal, "laplace": jax.random.laplace}


@functools.partial(jax.jit, static_argnames=("kind", "specs", "split"))
def _scaled_noise(key: jax.Array, scale, *, kind: str, specs: tuple, split: bool) -> list:
    """``scale *`` standard noise for each ``(shape, dtype)`` of ``specs`` (compiled per specs)."""
    sample = _SAMPLERS[kind]
    keys = jax.random.split(key, len(specs)) if split else [key]
    return [sample(k, shape, dtype) * jnp.asarray(scale, dtype)
            for k, (shape, dtype) in zip(keys, specs)]


def _noise_like(kind: str, key: jax.Array, shape_or_tree: Any, scale, dtype=None) -> Any:
    """``scale *`` standard noise: one array for a shape, a pytree of arrays for a pytree.

    A bare array (a single-leaf pytree) uses ``key`` directly; a pytree with several leaves gets
    one independent key per leaf (``jax.random.split``).
    """
    key = rng.as_key(key)
    if _is_shape(shape_or_tree):
        shape = (int(shape_or_tree),) if isinstance(shape_or_tree, (int, np.integer)) \
            else tuple(int(d) for d in shape_or_tree)
        spec = (shape, jnp.dtype(_float_dtype(dtype)))
        return _scaled_noise(key, scale, kind=kind, specs=(spec,), split=False)[0]
    leaves, treedef = jax.tree_util.tree_flatten(shape_or_tree)
    if not leaves:
        return shape_or_tree
    specs = tuple((tuple(jnp.shape(leaf)),
                   jnp.dtype(_float_dtype(dtype if dtype is not None
                                          else getattr(leaf, "dtype", None))))
                  for leaf in leaves)
    bare = treedef.num_leaves == 1 and treedef.num_nodes == 1       # a bare array / scalar
    noise = _scaled_noise(key, scale, kind=kind, specs=specs, split=not bare)
    return jax.tree_util.tree_unflatten(treedef, noise)


# --------------------------------------------------------------------------- Gaussian

def gaussian_noise(key: jax.Array, shape_or_tree: Any, std, *, dtype=None) -> Any:
    """Noise ``z ~ N(0, std^2 I)``, i.i.d. over every coordinate.

    ``shape_or_tree`` is either a shape (an int or a tuple/list of ints; the result is one array)
    or a pytree of arrays / ``jax.ShapeDtypeStruct`` (the result is a pytree of the same structure
    and shapes; float leaves keep their dtype, others get JAX's default float). Each leaf of a
    pytree draws from its own key (split from ``key``), so no two leaves share noise.

    ``std`` must be finite and ``>= 0`` (checked on the host unless traced).
    """
    _check_scale("std", std)
    return _noise_like("normal", key, shape_or_tree, std, dtype)


def gaussian_mechanism(key: jax.Array, value_tree: Any, l2_sensitivity, noise_multiplier) -> Any:
    """The Gaussian mechanism: ``value + N(0, (noise_multiplier * l2_sensitivity)^2 I)``.

    Neighbouring relation and unit: whatever relation the caller proved ``l2_sensitivity`` for,
    i.e. ``||f(D) - f(D')||_2 <= l2_sensitivity`` over the *whole* pytree (all leaves together)
    for every neighbouring pair ``D ~ D'`` that differ in one unit (an agent's dataset, one
    example, ...). Clip with :func:`clip_by_global_norm` to enforce the bound.

    Sensitivity: ``l2_sensitivity`` (L2, global over the pytree). Noise std:
    ``sigma = noise_multiplier * l2_sensitivity`` on every coordinate.

    Accounting: one application is ``dp_accounting.GaussianDpEvent(noise_multiplier)``
    (``accounting.gaussian_event(noise_multiplier)``); its RDP is ``alpha / (2 z^2)``.
    """
    _check_scale("l2_sensitivity", l2_sensitivity)
    _check_scale("noise_multiplier", noise_multiplier)
    noise = gaussian_noise(key, value_tree, noise_multiplier * l2_sensitivity)
    return jax.tree.map(jnp.add, value_tree, noise)


# --------------------------------------------------------------------------- Laplace

def laplace_noise(key: jax.Array, shape_or_tree: Any, scale, *, dtype=None) -> Any:
    """Noise i.i.d. ``Laplace(0, b)`` with ``b = scale``: density ``exp(-|x| / b) / (2 b)``.

    Variance ``2 b^2``. ``shape_or_tree`` as in :func:`gaussian_noise` (one key per leaf).
    ``scale`` must be finite and ``>= 0``.
    """
    _check_scale("scale", scale)
    return _noise_like("laplace", key, shape_or_tree, scale, dtype)


def laplace_mechanism(key: jax.Array, value_tree: Any, l1_sensitivity, epsilon) -> Any:
    """The Laplace mechanism: ``value + Laplace(0, b)``, ``b = l1_sensitivity / epsilon``.

    Neighbouring relation and unit: the caller's, with
    ``||f(D) - f(D')||_1 <= l1_sensitivity`` summed over all coordinates of all leaves, for
    ``D ~ D'`` differing in one unit. Then one application is ``(epsilon, 0)``-DP for that unit.

    Accounting: ``dp_accounting.LaplaceDpEvent(noise_multiplier)`` with
    ``noise_multiplier = b / l1_sensitivity = 1 / epsilon``
    (``accounting.laplace_event(1 / epsilon)``).

    ``l1_sensitivity`` finite ``>= 0``; ``epsilon`` finite ``> 0``.
    """
    _check_scale("l1_sensitivity", l1_sensitivity)
    _check_scale("epsilon", epsilon, positive=True)
    noise = laplace_noise(key, value_tree, l1_sensitivity / epsilon)
    return jax.tree.map(jnp.add, value_tree, noise)


# --------------------------------------------------------------------------- clipping

def clip_by_global_norm(tree: Any, max_norm) -> tuple[Any, jax.Array]:
    """Scale a pytree so its global L2 norm is at most ``max_norm``.

    ``||tree||_2 = sqrt(sum over all leaves and coordinates of x^2)`` (one norm for the whole
    pytree, not per leaf); the result is ``tree * min(1, max_norm / ||tree||_2)``, and the zero
    tree is returned unchanged (scale 1, no division by zero, finite gradients).

    Returns ``(clipped_tree, norm)`` with ``norm`` the *original* global norm (a float scalar).
    Bounds the L2 sensitivity of a sum of clipped contributions by ``max_norm`` (add/remove one
    contribution) or ``2 * max_norm`` (replace one). ``max_norm`` finite ``>= 0``. Use
    ``jax.vmap(clip_by_global_norm, in_axes=(0, None))`` for per-agent / per-example clipping.
    """
    _check_scale("max_norm", max_norm)
    return _clip_by_global_norm(tree, max_norm)


@jax.jit
def _clip_by_global_norm(tree: Any, max_norm) -> tuple[Any, jax.Array]:
    leaves = jax.tree_util.tree_leaves(tree)
    sq = jnp.zeros((), jnp.result_type(float))
    for leaf in leaves:
        leaf = jnp.asarray(leaf)
        acc = jnp.promote_types(leaf.dtype, jnp.float32)
        sq = sq + jnp.sum(jnp.square(leaf.astype(acc))).astype(sq.dtype)
    positive = sq > 0
    norm = jnp.where(positive, jnp.sqrt(jnp.where(positive, sq, 1.0)), 0.0)
    safe = jnp.where(positive, norm, 1.0)
    scale = jnp.where(positive, jnp.minimum(1.0, max_norm / safe), 1.0)

    def clip(x):
        x = jnp.asarray(x)
        return (x * scale).astype(_float_dtype(x.dtype))

    clipped = jax.tree.map(clip, tree)
    return clipped, norm


# --------------------------------------------------------------------------- noisy votes

def agent_vote_noise(key: jax.Array, num_agents: int, shape: tuple[int, ...], sigma) -> jax.Array:
    """Each agent's share of the vote noise: ``[N, *shape]``, row i ~ ``N(0, sigma^2 / N I)``.

    Row ``i`` is drawn from agent ``i``'s own key (``split_per_agent(key, N)[i]``), so the rows are
    independent and the sum over agents is ``N(0, sigma^2 I)``: the distributed noise of a
    secure-aggregation ("MPC") vote, where no single party ever sees noise-free counts.
    """
    num_agents = validation.check_int("num_agents", num_agents, minimum=1)
    _check_scale("sigma", sigma)
    return _agent_vote_noise(rng.as_key(key), sigma, num_agents=num_agents,
                             shape=tuple(int(d) for d in shape))


@functools.partial(jax.jit, static_argnames=("num_agents", "shape"))
def _agent_vote_noise(key: jax.Array, sigma, *, num_agents: int, shape: tuple) -> jax.Array:
    keys = rng.split_per_agent(key, num_agents)                                # [N]
    std = sigma / jnp.sqrt(jnp.asarray(num_agents, jnp.result_type(float)))
    return jax.vmap(lambda k: jax.random.normal(k, shape))(keys) * std         # [N, *shape]


def noisy_argmax_vote(key: jax.Array, ballots: jax.Array, sigma, *,
                      distributed: bool = True) -> jax.Array:
    """Noisy-argmax vote: ``argmax_c (sum_i ballots[i, q, c] + N(0, sigma^2))`` for each query q.

    ``ballots``: ``[N, Q, C]``, one row per agent per query (typically one-hot votes, or all zeros
    for an abstaining agent). Returns the released labels only, ``int32 [Q]``; the noisy tally is
    never returned.

    * ``distributed=True``: every agent adds its own ``N(0, sigma^2 / N)`` to its ballots (own key
      per agent, :func:`agent_vote_noise`) before the secure sum; the tally carries
      ``N(0, sigma^2)`` in total (voting-dpfl "MPC vote"). Abstaining agents must still add noise.
    * ``distributed=False``: the aggregator adds ``N(0, sigma^2)`` once to the summed tally.

    Both give the same output distribution. Privacy (Gaussian mechanism on the tally ``[Q, C]``):

    * unit ``agent``, relation add/remove one agent's ballots: a one-hot ballot row changes the
      tally of each query by L2 norm 1 per query, so sensitivity ``sqrt(Q)`` over Q queries
      answered at once, or 1 per query: ``GaussianDpEvent(sigma)`` composed Q times.
    * relation replace one agent's ballots (one vote moved from class a to b): sensitivity
      ``sqrt(2)`` per query: ``GaussianDpEvent(sigma / sqrt(2))`` composed Q times.

    Releasing only the argmax also allows data-dependent (PATE / GNMax) RDP analyses.
    ``sigma`` finite ``>= 0``; ``sigma = 0`` gives the plain argmax of the vote sum.
    """
    _check_scale("sigma", sigma)
    ballots = jnp.asarray(ballots)
    if ballots.ndim != 3:
        raise ValueError(f"ballots must have shape [num_agents, num_queries, num_classes], "
                         f"got shape {tuple(ballots.shape)}")
    n, q, c = ballots.shape
    if n == 0 or c == 0:
        raise ValueError(f"ballots needs at least one agent and one class, got shape {(n, q, c)}")
    return _noisy_argmax_vote(rng.as_key(key), ballots, sigma, distributed=bool(distributed))


@functools.partial(jax.jit, static_argnames=("distributed",))
def _noisy_argmax_vote(key: jax.Array, ballots: jax.Array, sigma, *, distributed: bool):
    n, q, c = ballots.shape
    ballots = ballots.astype(_float_dtype(ballots.dtype))
    if distributed:
        noise = _agent_vote_noise(key, sigma, num_agents=n, shape=(q, c))        # [N, Q, C]
        tally = jnp.sum(ballots + noise.astype(ballots.dtype), axis=0)            # [Q, C]
    else:
        noise = jax.random.normal(key, (q, c), ballots.dtype) * sigma             # [Q, C]
        tally = jnp.sum(ballots, axis=0) + noise.astype(ballots.dtype)
    return jnp.argmax(tally, axis=-1).astype(jnp.int32)                           # [Q]


def noisy_argmax_laplace(key: jax.Array, counts: jax.Array, gamma) -> jax.Array:
    """LNMax: ``argmax_c (counts[..., c] + Laplace(0, 1 / gamma))``, returning ``int32 [...]``.

    ``counts``: ``[..., C]`` vote counts (e.g. teacher votes per class, one row per query).
    Privacy per query (Papernot et al. 2017, PATE): unit = one voter (teacher / party), relation
    replace one voter's vote, L1 sensitivity 2 (one count -1, another +1), so one query is
    ``(2 gamma, 0)``-DP: ``LaplaceDpEvent(noise_multiplier=(1/gamma)/2)``; under add/remove one
    voter the L1 sensitivity is 1 and a query is ``(gamma, 0)``-DP.
    ``gamma`` finite ``> 0``.
    """
    _check_scale("gamma", gamma, positive=True)
    counts = jnp.asarray(counts)
    if counts.ndim < 1 or counts.shape[-1] == 0:
        raise ValueError(f"counts must have shape [..., num_classes] with num_classes >= 1, "
                         f"got shape {tuple(counts.shape)}")
    return _noisy_argmax_laplace(rng.as_key(key), counts, gamma)


@jax.jit
def _noisy_argmax_laplace(key: jax.Array, counts: jax.Array, gamma) -> jax.Array:
    counts = counts.astype(_float_dtype(counts.dtype))
    noisy = counts + jax.random.laplace(key, counts.shape, counts.dtype) / gamma
    return jnp.argmax(noisy, axis=-1).astype(jnp.int32)
