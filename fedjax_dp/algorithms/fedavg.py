"""FedAvg (McMahan et al. 2017), the non-private baseline; its round is shared with DP-FedAvg.

One round t (voting-dpfl paper, Algorithm 1 without lines 3-4 of NoisyUpdate):

    m_t ~ Poisson sampling: agent i participates with probability q, independently (a mask [N])
    Delta_i = LocalSGD_E(theta_t; D_i) - theta_t                    for every agent (one vmap)
    theta_{t+1} = theta_t + eta_s * sum_i m_t[i] Delta_i / max(1, sum_i m_t[i])

All N agents compute their update in one vectorised call and the participation mask selects the
sum; the number of participants varies per round without any Python list of agents.
"""
from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from fedjax_dp.algorithms import api
from fedjax_dp.core import StackedData, agent_sum, for_each_agent, validation
from fedjax_dp.models import Model
from fedjax_dp.privacy import PrivacyLedger, mechanisms
from fedjax_dp.train import LocalTrainConfig, check_trainable, make_local_update
from fedjax_dp.train.local import resolve_chunk_size

Params = Any


@dataclasses.dataclass(frozen=True)
class Config:
    """FedAvg: ``rounds`` rounds, Poisson agent sampling rate ``sampling_rate`` (q)."""

    rounds: int = 20
    sampling_rate: float = 1.0
    server_lr: float = 1.0
    local: LocalTrainConfig = LocalTrainConfig()

    def __post_init__(self):
        validation.check_int("algorithm.rounds", self.rounds, minimum=1)
        validation.check_probability("algorithm.sampling_rate", self.sampling_rate)
        validation.check_positive("algorithm.server_lr", self.server_lr)


@dataclasses.dataclass(frozen=True)
class RoundSpec:
    """What one federated-averaging round does with the agents' updates.

    clip_norm: clip each agent's update to this global L2 norm (None: no clipping).
    noise_std: std of the Gaussian noise added once to the *sum* of updates.
    denominator: ``'sampled'`` divides the sum by the realised number of participants
      (FedAvg; the voting-dpfl paper's Algorithm 1), ``'expected'`` by the fixed q*N
      (McMahan et al. 2018's fixed-denominator estimator, needed for DP-FedAvg's guarantee).
    """

    sampling_rate: float
    server_lr: float
    clip_norm: float | None = None
    noise_std: float = 0.0
    denominator: str = "sampled"


def sample_agents(key: jax.Array, num_agents: int, sampling_rate: float) -> jax.Array:
    """Poisson sampling mask [N] in {0., 1.}: each agent independently with probability q."""
    return jax.random.bernoulli(key, sampling_rate, (num_agents,)).astype(jnp.float32)


@functools.lru_cache(maxsize=64)
def make_round(model: Model, local: LocalTrainConfig, spec: RoundSpec, *,
               chunk_size: int | None = None, mesh=None) -> Callable:
    """A jitted ``round(key, params, data) -> (params, metrics)`` for the given spec.

    ``chunk_size``: agents per chunk for local training (identical results; see
    :func:`fedjax_dp.train.local.resolve_chunk_size` for ``"auto"``, resolved in ``init``).
    Compiled once per (model, local config, spec, execution plan) and shared by every caller.
    """
    lifted = for_each_agent(make_local_update(model, local), (0, None, 0, 0, 0, 0),
                            chunk_size=chunk_size, mesh=mesh)

    def round_fn(key: jax.Array, params: Params, data: StackedData):
        n = data.x.shape[0]
        k_sample, k_train, k_noise = jax.random.split(key, 3)
        sampled = sample_agents(k_sample, n, spec.sampling_rate)                  # [N]
        local_params, losses = lifted(jax.random.split(k_train, n), params,
                                      data.x, data.y, data.mask, data.counts)
        deltas = jax.tree.map(lambda l, g: l - g[None], local_params, params)     # [N, ...]
        norms = jax.vmap(optax.tree.norm)(deltas)                                # [N]
        if spec.clip_norm is not None:
            deltas = jax.vmap(lambda d: mechanisms.clip_by_global_norm(d, spec.clip_norm)[0]
                              )(deltas)
        total = agent_sum(deltas, sampled)                                        # secure sum
        if spec.noise_std > 0:
            total = jax.tree.map(jnp.add, total,
                                 mechanisms.gaussian_noise(k_noise, total, spec.noise_std))
        num_sampled = jnp.sum(sampled)
        if spec.denominator == "expected":
            denom = spec.sampling_rate * n
        else:
            denom = jnp.maximum(num_sampled, 1.0)
        new_params = jax.tree.map(lambda g, s: g + spec.server_lr * s / denom, params, total)
        metrics = {
            "num_sampled": num_sampled,
            "train_loss": jnp.sum(sampled * losses) / jnp.maximum(num_sampled, 1.0),
            "mean_update_norm": jnp.sum(sampled * norms) / jnp.maximum(num_sampled, 1.0),
        }
        return new_params, metrics

    return jax.jit(round_fn)


@dataclasses.dataclass
class History:
    """What :func:`run` produced: final params and one metrics dict per round (host floats)."""

    params: Params
    rounds: list[dict] = dataclasses.field(default_factory=list)
    wall_time_s: float = 0.0


def drive_rounds(step: Callable[[int, Params], tuple[Params, dict]], history: History,
                 rounds: int, *, evaluate: Callable[[Params], dict] | None = None,
                 eval_every: int = 0, on_round: Callable[[int, dict], None] | None = None
                 ) -> History:
    """The host loop over rounds of the pre-protocol API (DP-FedSGD until it is ported).

    ``step(t, params) -> (params, metrics)`` runs round t (0-based) from ``history.params``;
    metrics become host floats, ``evaluate`` runs every ``eval_every`` rounds and after the last,
    and ``on_round(t + 1, record)`` sees every record as soon as it exists.
    """
    params = history.params
    start = time.perf_counter()
    for t in range(rounds):
        params, metrics = step(t, params)
        record = {"round": t + 1, **{k: float(v) for k, v in metrics.items()}}
        if evaluate is not None and eval_every and ((t + 1) % eval_every == 0 or t + 1 == rounds):
            record.update(evaluate(params))
        history.rounds.append(record)
        history.params = params
        if on_round is not None:
            on_round(t + 1, record)
    history.wall_time_s = time.perf_counter() - start
    return history


# --------------------------------------------------------------------------- the protocol
# (fedjax_dp.algorithms.api): FedAvg and DP-FedAvg share init / step / output and differ only in
# their RoundSpec.

DESCRIPTION = "FedAvg, non-private (McMahan et al. 2017)"
USES_LOCAL_TRAIN = True


def round_spec(config: Config) -> RoundSpec:
    return RoundSpec(sampling_rate=config.sampling_rate, server_lr=config.server_lr)


@dataclasses.dataclass(frozen=True)
class Context:
    """The static part of an averaging run's state."""

    agents: StackedData
    model: Model
    round_fn: Callable


def init_rounds(key: jax.Array, data: api.FederatedData, model: Model, local: LocalTrainConfig,
                spec: RoundSpec, runtime: api.Runtime = api.Runtime()) -> api.State:
    """State of a round-based averaging run: ``values = {"params": model.init(split(key)[0])}``."""
    check_trainable(data.agents)
    params = model.init(api.init_key(key))
    chunk_size = resolve_chunk_size(runtime.chunk_size, params, data.num_agents)
    round_fn = make_round(model, local, spec, chunk_size=chunk_size, mesh=runtime.mesh)
    return api.State(step=0, values={"params": params},
                     context=Context(agents=data.agents, model=model, round_fn=round_fn))


def init(key: jax.Array, data: api.FederatedData, model: Model, config: Config,
         runtime: api.Runtime = api.Runtime()) -> api.State:
    return init_rounds(key, data, model, config.local, round_spec(config), runtime)


def num_steps(config: Config) -> int:
    return config.rounds


def step(state: api.State, key: jax.Array) -> tuple[api.State, dict]:
    """One round (:func:`make_round`) from ``state.values["params"]``."""
    ctx: Context = state.context
    params, metrics = ctx.round_fn(key, state.values["params"], ctx.agents)
    return api.State(step=state.step + 1, values={"params": params}, context=ctx), metrics


def output(state: api.State) -> api.Output:
    return api.Output(model=state.context.model, params=state.values["params"])


def ledger(config: Config, state: api.State | None = None) -> PrivacyLedger:
    """FedAvg gives no privacy guarantee: an empty ledger."""
    return PrivacyLedger()


def run_with(module, key: jax.Array, data: StackedData, model: Model, config, *,
             init_params: Params | None = None,
             evaluate: Callable[[Params], dict] | None = None, eval_every: int = 0,
             on_round: Callable[[int, dict], None] | None = None,
             chunk_size: int | str | None = "auto", mesh=None) -> History:
    """Plain-Python entry point of an averaging module: :func:`api.run` from stacked agents.

    Round t uses ``fold_in(split(key)[1], t)`` and the model starts from ``split(key)[0]`` (or
    ``init_params``); ``on_round(t, metrics)`` is called after every round.
    """
    fed = api.FederatedData(agents=data, num_classes=model.num_classes)
    runtime = api.Runtime(chunk_size=chunk_size, mesh=mesh)
    state = module.init(key, fed, model, config, runtime)
    if init_params is not None:
        state = api.State(step=0, values={"params": init_params}, context=state.context)
    wrapped = None if evaluate is None else (lambda out: evaluate(out.params))
    result = api.run(module, key, fed, model, config, runtime=runtime, evaluate=wrapped,
                     eval_every=eval_every, on_step=on_round, state=state)
    return History(params=result.state.values["params"], rounds=result.history,
                   wall_time_s=result.wall_time_s)


def run(key: jax.Array, data: StackedData, model: Model, config: Config, **kwargs) -> History:
    """FedAvg over all stacked agents (keyword arguments as :func:`run_with`)."""
    import sys
    return run_with(sys.modules[__name__], key, data, model, config, **kwargs)


def privacy_ledger(config: Config, num_agents: int | None = None) -> PrivacyLedger:
    """Kept for callers of the pre-protocol API: :func:`ledger`."""
    return ledger(config)
