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

Weakened runs (``weaken``, audited against the ORIGINAL config's claim, as the single-release
harnesses' variants): ``"halve-noise"`` trains with ``noise_multiplier / 2``; ``"no-clip"`` trains
with the clip raised to ``10 * canary_scale * S`` and the noise multiplier scaled so that the
noise std stays ``z S``, and the canaries push ``canary_scale * S`` (default 100) unclipped.
:func:`plan_run` checks a request before any work.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from fedjax_dp.stages.updates import LocalSteps
from fedjax_dp.algorithms import api, rounds, rounds_protocol
from fedjax_dp.algorithms.averaging import dp_fedavg
from fedjax_dp.audit.harness import ParameterError
from fedjax_dp.audit.one_run import CanaryScores, register_run
from fedjax_dp.core import StackedData, rng, validation

__all__ = ["WEAKENINGS", "plan_run", "canary_run"]

#: the weakened runs :func:`canary_run` offers (module docstring)
WEAKENINGS = ("halve-noise", "no-clip")


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


def plan_run(config: dp_fedavg.Config, *, canary_scale: float | None = None,
             weaken: str | None = None) -> tuple[dp_fedavg.Config, float]:
    """``(the config the canary run trains with, the canaries' scale)``, checked before any work:
    Poisson sampling; ``weaken`` one of :data:`WEAKENINGS` (or None) and possible for ``config``;
    ``canary_scale`` (default 1, 100 with ``"no-clip"``) refused where it would change nothing
    (:class:`ParameterError` naming ``weaken`` or ``canary_scale``)."""
    if config.sampling != "poisson":
        raise ValueError("the one-run audit needs algorithm.sampling = \"poisson\" (a fixed-size "
                         "cohort's epsilon depends on the population's size, which the canaries "
                         "change)")
    if weaken is not None and weaken not in WEAKENINGS:
        raise ParameterError("weaken", f"must be one of {list(WEAKENINGS)} (or None) for a "
                                       f"one-run audit of dp_fedavg, got {weaken!r}")
    if canary_scale is None:
        scale = 100.0 if weaken == "no-clip" else 1.0
    else:
        scale = validation.check_positive("canary_scale", canary_scale, finite=True)
        if weaken == "no-clip" and scale <= 1:
            raise ParameterError("canary_scale", f"must be above 1 with weaken='no-clip' (a "
                                                 f"canary within the clip is not clipped "
                                                 f"anyway), got {canary_scale!r}")
        if weaken != "no-clip" and scale > 1 and config.adaptive_clip is None:
            raise ParameterError("canary_scale", f"above 1 changes nothing with a fixed clip: "
                                                 f"the canary's update is clipped to exactly "
                                                 f"algorithm.clip_norm (it applies below 1, "
                                                 f"with algorithm.adaptive_clip or with "
                                                 f"weaken='no-clip'), got {canary_scale!r}")
    z, clip = float(config.noise_multiplier), float(config.clip_norm)
    if weaken == "halve-noise":
        if not z > 0:
            raise ParameterError("weaken", "'halve-noise' needs algorithm.noise_multiplier > 0 "
                                           "(half of no noise is no noise)")
        return dataclasses.replace(config, noise_multiplier=z / 2), scale
    if weaken == "no-clip":
        if config.adaptive_clip is not None or config.aggregation != "plain":
            raise ParameterError("weaken", "'no-clip' needs a fixed clip and plain aggregation "
                                           "(no algorithm.adaptive_clip, whose count release "
                                           "reads the clip; no secure aggregation, whose "
                                           "fixed-point range it sizes)")
        run_clip = 10.0 * scale * clip
        return dataclasses.replace(config, clip_norm=run_clip,
                                   noise_multiplier=z * clip / run_clip), scale
    return config, scale


def canary_run(key: jax.Array, data: api.FederatedData, model, config: dp_fedavg.Config, *,
               canaries: int, canary_scale: float | None = None, delta: float,
               accountant: str = "rdp", weaken: str | None = None,
               chunk_size: int | str | None = "auto") -> CanaryScores:
    """One DP-FedAvg run of ``config.rounds`` rounds with ``canaries`` canary agents, each
    included with probability 1/2: the in / out canaries' scores and the ledger's epsilon of
    ``config`` (with ``weaken``, the run is the weakened config's: :func:`plan_run`).
    ``chunk_size``: agents per chunk (``api.Runtime``; the results do not depend on it)."""
    m = validation.check_int("canaries", canaries, minimum=2)
    run_config, scale = plan_run(config, canary_scale=canary_scale, weaken=weaken)
    k_in, k_dir, k_run = (rng.stream(key, s) for s in ("canary_inclusion", "canary_directions",
                                                        "canary_run"))
    included = np.asarray(jax.random.bernoulli(k_in, 0.5, (m,)))
    ids_in = np.flatnonzero(included).astype(np.int32)
    n_real = data.num_agents
    agents = _with_canaries(data.agents.on_device(), len(ids_in))
    canary_of = jnp.concatenate([jnp.full((n_real,), -1, jnp.int32), jnp.asarray(ids_in)])
    local = rounds.local_sgd_update(model, config.local)
    size = lambda p: sum(int(np.prod(l.shape)) for l in jax.tree.leaves(p))  # noqa: E731
    push = scale * float(config.clip_norm)

    def update(k, params, x, y, mask, count, extras):
        new, metrics = local(k, params, x, y, mask, count, extras)
        j = extras["canary"]
        flat, unravel = ravel_pytree(params)
        canary = unravel(flat + push * _direction(k_dir, jnp.maximum(j, 0), size(params)))
        return jax.tree.map(lambda c, r: jnp.where(j >= 0, c, r), canary, new), metrics

    fed = dataclasses.replace(data, agents=agents, client_ids=None)   # + canaries
    chain = dataclasses.replace(dp_fedavg.chain(run_config), client_update=LocalSteps(update))
    state = rounds.init_rounds(k_run, fed, model, chain, run_config.rounds,
                               api.Runtime(chunk_size=chunk_size), local=config.local,
                               extras={"canary": canary_of}, diagnostics=run_config.diagnostics)
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
                                "accountant": accountant, "weaken": weaken,
                                "canary_scale": scale,
                                "run_noise_multiplier": float(run_config.noise_multiplier),
                                "run_clip_norm": float(run_config.clip_norm)})


register_run("dp_fedavg", canary_run, check=plan_run)
