"""A round's compiled pieces, built from its chain of stages (:class:`fedjax_dp.stages.Chain`).

The round's *view* is ``{"params": theta_t, "stages": (s_participation, s_client, s_clipping,
s_aggregation, s_noise, s_server)}``, the stages' states in chain order. One round::

    contribution_i = clipping.client(agent_update(fold_in(k_train, i), theta_t; D_i) - theta_t)
    total          = aggregation.sum(contribution_i over the cohort)    (secure: the masked sum)
    released       = noise.release(k_noise, total)     (distributed: noise.decode of the agents'
                                                       own noised messages)
    theta_{t+1}    = server_update(theta_t, released / denominator)
    C_{t+1}        = clipping.server(k_noise, released count)          (adaptive clipping)

No piece branches on an algorithm's flags: each asks its stage.
"""
from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
import optax

from fedjax_dp.core import StackedData, for_each_agent, for_each_agent_sum
from fedjax_dp.core import cohort as cohort_lib
from fedjax_dp.stages import Chain, Setup

__all__ = ["make_round_parts", "view_of", "advance", "PARTICIPATION", "CLIPPING", "NOISE",
           "SERVER"]

#: positions of the stages' states in the view's ``"stages"`` tuple (chain order)
PARTICIPATION, CLIPPING, NOISE, SERVER = 0, 2, 4, 5

_AXES = (0, None, 0, 0, 0, 0, 0)


def _contribution_fn(chain: Chain) -> Callable:
    """One agent's contribution and metrics: ``(key, view, x, y, mask, count, extras)``."""
    agent_update = chain.client_update.agent_update

    def contribution(key, view, x, y, mask, count, extras):
        params = view["params"]
        local_params, metrics = agent_update(key, params, x, y, mask, count, extras)
        delta = jax.tree.map(jnp.subtract, local_params, params)
        norm = optax.tree.norm(delta)
        metrics = {**metrics, "mean_update_norm": norm}
        return chain.clipping.client(delta, norm, count, view["stages"][CLIPPING]), metrics

    return contribution


def _train_sum_fn(chain: Chain, z_u: float, chunk_size: int | None, mesh) -> Callable:
    """``train_sum(k_train, view, source, rows, ids, valid, extras) -> (total, metric sums, M)``:
    the agents ``ids [B]`` (their records ``source``, or ``source[rows]`` gathered inside the
    chunks) contribute with key ``fold_in(k_train, id)``, summed over ``valid [B]`` (a secure
    sum holds the pass's contributions stacked; the plain sum never does)."""
    contribution = _contribution_fn(chain)
    summed = for_each_agent_sum(contribution, _AXES, chunk_size=chunk_size, mesh=mesh)
    stacked = for_each_agent(contribution, _AXES, chunk_size=chunk_size, mesh=mesh)

    def gathered(key, view, row, population: StackedData, extras):
        return contribution(key, view, population.x[row], population.y[row],
                            population.mask[row], population.counts[row], extras)

    summed_rows = for_each_agent_sum(gathered, (0, None, 0, None, 0), chunk_size=chunk_size)
    aggregation = chain.aggregation

    def train_sum(k_train, view, source: StackedData, rows, ids, valid, extras):
        keys = cohort_lib.cohort_keys(k_train, ids)                             # [B]
        mine = jax.tree.map(lambda e: jnp.take(e, ids, axis=0), extras)
        count = lambda v: jnp.sum(v.astype(jnp.float32))                        # noqa: E731
        if not aggregation.stacked and rows is not None and mesh is None:
            total, metric_sums = summed_rows(keys, view, rows, source, mine, where=valid)
            return total, metric_sums, count(valid)
        agents = source if rows is None else cohort_lib.take_rows(source, rows)
        args = (keys, view, agents.x, agents.y, agents.mask, agents.counts, mine)
        if not aggregation.stacked:
            total, metric_sums = summed(*args, where=valid)
            return total, metric_sums, count(valid)
        contributions, metrics = stacked(*args)                                 # [B, ...]
        clip = chain.clipping.clip(view["stages"][CLIPPING])
        total, alive = aggregation.sum(k_train, contributions, ids, valid, chain, clip, z_u)
        return total, cohort_lib.masked_sum(metrics, alive), count(alive)

    return train_sum


def _release(chain: Chain, z_u: float, k_noise, k_train, view, total, num_sampled):
    """``(update sum, count or None, count noised?, noise state, released or None)``: the
    noise stage's release of the round's sum (distributed: its decoding of the agents')."""
    clipping, noise = chain.clipping, chain.noise
    states = view["stages"]
    clip = clipping.clip(states[CLIPPING])
    if noise.encodes:
        update, count, released = noise.decode(k_train, view["params"], total, num_sampled,
                                               chain, clip, z_u)
        return update, count, True, states[NOISE], released
    scale = clip if clipping.adaptive or noise.sensitivity is None else noise.sensitivity
    update, count = clipping.split(total)
    update, noise_state = noise.release(k_noise, update, scale, z_u, states[NOISE], chain)
    return update, count, False, noise_state, None


def _server_fn(chain: Chain, setup: Setup, z_u: float, diagnostics: bool) -> Callable:
    """``server(k_noise, view, sums, k_train) -> (view, metrics)``: noise, divide, step; the
    clip's next state from the released count."""
    expected = chain.expected_cohort(setup)
    count_std = chain.clipping.count_std(expected)

    def server(k_noise, view, sums, k_train=None):
        total, metric_sums, num_sampled = sums
        params, states = view["params"], view["stages"]
        update, count, noised, noise_state, released = _release(
            chain, z_u, k_noise, k_train, view, total, num_sampled)
        if chain.server_update.denominator == "expected":
            denom = expected
        else:
            denom = jnp.maximum(num_sampled, 1.0)
        new_params, server_state = chain.server_update.update(params, states[SERVER], update,
                                                              denom, released)
        seen = jnp.maximum(num_sampled, 1.0)
        metrics = {"num_sampled": num_sampled,
                   **{k: v / seen for k, v in metric_sums.items()}}    # means over the cohort
        if not diagnostics:
            metrics = {}
        if released is not None:              # public: whether the round was released
            metrics = {**metrics, "released": released.astype(jnp.float32)}
        clip_state, clip_metrics = chain.clipping.server(
            k_noise, states[CLIPPING], count, denom, count_std, noised=noised,
            released=released)
        new_states = (states[0], states[1], clip_state, states[3], noise_state, server_state)
        return {"params": new_params, "stages": new_states}, {**metrics, **clip_metrics}

    return server


@functools.lru_cache(maxsize=64)
def make_round_parts(chain: Chain, setup: Setup, *, chunk_size: int | None = None, mesh=None,
                     diagnostics: bool = True) -> tuple[Callable, Callable, Callable]:
    """The compiled pieces of a round of ``chain``: ``(train_sum, server, fused)``.

    ``train_sum(k_train, view, source, rows, ids, valid, extras) -> sums`` (the pass's
    contributions summed, :func:`_train_sum_fn`); ``server(k_noise, view, sums, k_train) ->
    (view, metrics)``; ``fused``: both in one compiled call (the one-pass round). ``extras``: a
    pytree of per-agent values ``[N]`` the client update reads (gathered with the agents).
    ``diagnostics``: report the cohort's size and mean metrics (not private). Cached per
    (chain, setup, plan)."""
    z_u = chain.update_multiplier(setup)
    train_sum = _train_sum_fn(chain, z_u, chunk_size, mesh)
    server = _server_fn(chain, setup, z_u, diagnostics)

    def fused(k_train, k_noise, view, source, rows, ids, valid, extras):
        return server(k_noise, view, train_sum(k_train, view, source, rows, ids, valid, extras),
                      k_train)

    return jax.jit(train_sum), jax.jit(server), jax.jit(fused)


def view_of(values: dict) -> dict:
    """The round's view of the run's values: ``{"params", "stages"}``."""
    return {"params": values["params"], "stages": values["stages"]}


def advance(chain: Chain, values: dict, view: dict) -> dict:
    """The run's values after a round whose server returned ``view``: its params and stage
    states, the participation's state advanced (cyclic groups: the round counter)."""
    states = view["stages"]
    states = (chain.participation.advance(states[PARTICIPATION]),) + tuple(states[1:])
    return {**values, "params": view["params"], "stages": states}

