"""DP-FedAvg audited inside one real run (:mod:`fedjax_dp.audit.one_run`, Steinke et al. 2023).

``m`` canary agents are drawn; each is included in the population independently with probability
1/2 (coins from the audit key's ``"canary_inclusion"`` stream). An included canary is an agent
whose local update is always ``canary_scale * S * u_j`` (``u_j`` a uniformly random unit vector
of the model's dimension, from ``fold_in(k_directions, j)``; with ``canary_scale >= 1`` its
clipped update is exactly ``S u_j``): the worst case for the add/remove-one-agent relation in a
direction no real update favours. The run is the library's DP-FedAvg round engine, unchanged
(Poisson cohorts over real and canary agents alike, the config's clip, noise, correlated noise
or secure aggregation). Score of canary j: ``<theta_T - theta_0, u_j>``.

Poisson sampling only: its event, hence the claimed epsilon, does not depend on the population's
size, which the canaries change (a fixed-size cohort's would).
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from fedjax_dp.algorithms import api, rounds, rounds_protocol
from fedjax_dp.algorithms.averaging import dp_fedavg
from fedjax_dp.audit.one_run import CanaryScores, register_run
from fedjax_dp.core import StackedData, rng, validation

__all__ = ["canary_run"]


def _with_canaries(agents: StackedData, count: int) -> StackedData:
    """The population with ``count`` canary agents appended (one record each, a copy of agent 0's
    first record: their updates ignore their data)."""
    def grow(a, fill):
        extra = jnp.broadcast_to(fill, (count,) + a.shape[1:]).astype(a.dtype)
        return jnp.concatenate([jnp.asarray(a), extra], axis=0)

    mask0 = jnp.zeros(agents.mask.shape[1:], bool).at[0].set(True).astype(agents.mask.dtype)
    return StackedData(x=grow(agents.x, jnp.asarray(agents.x)[0]),
                       y=grow(agents.y, jnp.asarray(agents.y)[0]),
                       mask=grow(agents.mask, mask0), counts=grow(agents.counts, 1))


def _direction(k_directions: jax.Array, j: jax.Array, dim: int) -> jax.Array:
    """Canary j's unit vector ``[dim]``."""
    u = jax.random.normal(jax.random.fold_in(k_directions, j), (dim,), jnp.float32)
    return u / jnp.linalg.norm(u)


def canary_run(key: jax.Array, data: api.FederatedData, model, config: dp_fedavg.Config, *,
               canaries: int, canary_scale: float = 1.0, delta: float,
               accountant: str = "rdp") -> CanaryScores:
    """One DP-FedAvg run of ``config.rounds`` rounds with ``canaries`` canary agents, each
    included with probability 1/2: the in / out canaries' scores and the ledger's epsilon."""
    m = validation.check_int("canaries", canaries, minimum=2)
    scale = validation.check_positive("canary_scale", canary_scale)
    if config.sampling != "poisson":
        raise ValueError("the one-run audit needs algorithm.sampling = \"poisson\" (a fixed-size "
                         "cohort's epsilon depends on the population's size, which the canaries "
                         "change)")
    k_in, k_dir, k_run = (rng.stream(key, s) for s in ("canary_inclusion", "canary_directions",
                                                        "canary_run"))
    included = np.asarray(jax.random.bernoulli(k_in, 0.5, (m,)))
    ids_in = np.flatnonzero(included).astype(np.int32)
    n_real = data.num_agents
    agents = _with_canaries(data.agents.on_device(), len(ids_in))
    canary_of = jnp.concatenate([jnp.full((n_real,), -1, jnp.int32), jnp.asarray(ids_in)])
    spec = dp_fedavg.round_spec(config)
    local = rounds.local_sgd_update(model, config.local)
    size = lambda p: sum(int(np.prod(l.shape)) for l in jax.tree.leaves(p))  # noqa: E731
    push = scale * float(config.clip_norm)

    def update(k, params, x, y, mask, count, extras):
        new, metrics = local(k, params, x, y, mask, count, extras)
        j = extras["canary"]
        flat, unravel = ravel_pytree(params)
        canary = unravel(flat + push * _direction(k_dir, jnp.maximum(j, 0), size(params)))
        return jax.tree.map(lambda c, r: jnp.where(j >= 0, c, r), canary, new), metrics

    fed = dataclasses.replace(data, agents=agents)
    state = rounds.init_rounds(k_run, fed, model, config.local, spec,
                               agent_update=update, extras={"canary": canary_of})
    theta0 = ravel_pytree(state.values["params"])[0]
    for t in range(config.rounds):
        state, _ = rounds_protocol.step(state, api.step_key(k_run, t))
    moved = ravel_pytree(state.values["params"])[0] - theta0
    dirs = jax.vmap(lambda j: _direction(k_dir, j, moved.size))(jnp.arange(m))     # [m, d]
    scores = np.asarray(dirs @ moved)
    claimed = dp_fedavg.ledger(config).epsilon("agent", delta, accountant)
    return CanaryScores(in_scores=scores[included], out_scores=scores[~included],
                        claimed_epsilon=float(claimed), delta=float(delta), unit="agent",
                        relation=dp_fedavg.RELATION,
                        canary=f"an agent whose update is {scale:g} x clip_norm along a random "
                               f"unit vector; score <theta_T - theta_0, u_j>",
                        extras={"rounds": config.rounds, "real_agents": n_real,
                                "accountant": accountant})


register_run("dp_fedavg", canary_run)
