"""The named noise mechanisms: pure JAX functions of an explicit PRNG key (jit- and vmap-able).

Each is "constrain sensitivity, then add noise" (the pfl-research split): clipping
(:mod:`fedjax_dp.privacy.clipping`) bounds the sensitivity, :mod:`fedjax_dp.privacy.noise`
draws the noise, and :func:`gaussian_mechanism` / :func:`laplace_mechanism` add it to a value
whose sensitivity the caller has bounded; the noisy-argmax votes release only a label.

Privacy is *not* computed here. Each docstring states the neighbouring relation, the sensitivity and
the unit of privacy, and the ``dp_accounting`` event of one application; the caller records it in a
:class:`~fedjax_dp.privacy.ledger.PrivacyLedger`. Keys: one per random draw (one per agent for a
distributed vote, :func:`fedjax_dp.core.rng.split_per_agent`); noise scales are checked on the host
when concrete (:func:`fedjax_dp.privacy.noise.check_scale`)."""
from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from fedjax_dp.core import rng, validation
from fedjax_dp.privacy.noise import check_scale, float_dtype, gaussian_noise, laplace_noise

__all__ = ["gaussian_mechanism", "laplace_mechanism", "agent_vote_noise", "noisy_argmax_vote",
           "noisy_argmax_laplace"]


# --------------------------------------------------------------------------- Gaussian

def gaussian_mechanism(key: jax.Array, value_tree: Any, l2_sensitivity, noise_multiplier) -> Any:
    """The Gaussian mechanism: ``value + N(0, (noise_multiplier * l2_sensitivity)^2 I)``.

    Neighbouring relation and unit: whatever relation the caller proved ``l2_sensitivity`` for,
    i.e. ``||f(D) - f(D')||_2 <= l2_sensitivity`` over the *whole* pytree (all leaves together)
    for every neighbouring pair ``D ~ D'`` that differ in one unit (an agent's dataset, one
    example, ...). Clip with :func:`fedjax_dp.privacy.clipping.clip_by_global_norm` to enforce
    the bound.

    Sensitivity: ``l2_sensitivity`` (L2, global over the pytree). Noise std:
    ``sigma = noise_multiplier * l2_sensitivity`` on every coordinate.

    Accounting: one application is ``dp_accounting.GaussianDpEvent(noise_multiplier)``
    (``accounting.gaussian_event(noise_multiplier)``); its RDP is ``alpha / (2 z^2)``.
    """
    check_scale("l2_sensitivity", l2_sensitivity)
    check_scale("noise_multiplier", noise_multiplier)
    noise = gaussian_noise(key, value_tree, noise_multiplier * l2_sensitivity)
    return jax.tree.map(jnp.add, value_tree, noise)


# --------------------------------------------------------------------------- Laplace

def laplace_mechanism(key: jax.Array, value_tree: Any, l1_sensitivity, epsilon) -> Any:
    """The Laplace mechanism: ``value + Laplace(0, b)``, ``b = l1_sensitivity / epsilon``.

    Neighbouring relation and unit: the caller's, with
    ``||f(D) - f(D')||_1 <= l1_sensitivity`` summed over all coordinates of all leaves, for
    ``D ~ D'`` differing in one unit. Then one application is ``(epsilon, 0)``-DP for that unit.

    Accounting: ``dp_accounting.LaplaceDpEvent(noise_multiplier)`` with
    ``noise_multiplier = b / l1_sensitivity = 1 / epsilon``
    (``accounting.laplace_event(1 / epsilon)``).

    ``l1_sensitivity`` finite ``>= 0``; ``epsilon`` finite ``> 0``."""
    check_scale("l1_sensitivity", l1_sensitivity)
    check_scale("epsilon", epsilon, positive=True)
    noise = laplace_noise(key, value_tree, l1_sensitivity / epsilon)
    return jax.tree.map(jnp.add, value_tree, noise)


# --------------------------------------------------------------------------- noisy votes

def agent_vote_noise(key: jax.Array, num_agents: int, shape: tuple[int, ...], sigma) -> jax.Array:
    """Each agent's share of the vote noise: ``[N, *shape]``, row i ~ ``N(0, sigma^2 / N I)``.

    Row ``i`` is drawn from agent ``i``'s own key (``split_per_agent(key, N)[i]``), so the rows are
    independent and the sum over agents is ``N(0, sigma^2 I)``: the distributed noise of a
    secure-aggregation ("MPC") vote, where no single party ever sees noise-free counts."""
    num_agents = validation.check_int("num_agents", num_agents, minimum=1)
    check_scale("sigma", sigma)
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

    Releasing only the argmax also allows data-dependent (PATE / GNMax) RDP analyses. ``sigma``
    finite ``>= 0``; ``sigma = 0`` gives the plain argmax of the vote sum."""
    check_scale("sigma", sigma)
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
    ballots = ballots.astype(float_dtype(ballots.dtype))
    if distributed:
        noise = _agent_vote_noise(key, sigma, num_agents=n, shape=(q, c))        # [N, Q, C]
        tally = jnp.sum(ballots + noise.astype(ballots.dtype), axis=0)            # [Q, C]
    else:
        noise = jax.random.normal(key, (q, c), ballots.dtype) * sigma             # [Q, C]
        tally = jnp.sum(ballots, axis=0) + noise.astype(ballots.dtype)
    return jnp.argmax(tally, axis=-1).astype(jnp.int32)                           # [Q]


def noisy_argmax_laplace(key: jax.Array, counts: jax.Array, gamma) -> jax.Array:
    """LNMax: ``argmax_c (counts[..., c] + Laplace(0, 1 / gamma))``, returning ``int32 [...]``.

    ``counts``: ``[..., C]`` vote counts (e.g. teacher votes per class, one row per query). Privacy
    per query (Papernot et al. 2017, PATE): unit = one voter (teacher / party), relation replace one
    voter's vote, L1 sensitivity 2 (one count -1, another +1), so one query is ``(2 gamma, 0)``-DP:
    ``LaplaceDpEvent(noise_multiplier=(1/gamma)/2)``; under add/remove one voter the L1 sensitivity
    is 1 and a query is ``(gamma, 0)``-DP. ``gamma`` finite ``> 0``."""
    check_scale("gamma", gamma, positive=True)
    counts = jnp.asarray(counts)
    if counts.ndim < 1 or counts.shape[-1] == 0:
        raise ValueError(f"counts must have shape [..., num_classes] with num_classes >= 1, "
                         f"got shape {tuple(counts.shape)}")
    return _noisy_argmax_laplace(rng.as_key(key), counts, gamma)


@jax.jit
def _noisy_argmax_laplace(key: jax.Array, counts: jax.Array, gamma) -> jax.Array:
    counts = counts.astype(float_dtype(counts.dtype))
    noisy = counts + jax.random.laplace(key, counts.shape, counts.dtype) / gamma
    return jnp.argmax(noisy, axis=-1).astype(jnp.int32)
