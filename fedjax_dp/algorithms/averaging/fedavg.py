"""FedAvg (McMahan et al. 2017), the non-private baseline; its round is shared with DP-FedAvg.

One round t (voting-dpfl paper, Algorithm 1 without lines 3-4 of NoisyUpdate):

    S_t ~ sampling: Poisson (agent i participates with probability q, independently) or a
          uniformly random subset of exactly C agents (``sampling = "fixed"``)
    Delta_i = LocalSGD_E(theta_t; D_i) - theta_t                    for i in S_t (one vmap)
    theta_{t+1} = theta_t + eta_s * sum_{i in S_t} Delta_i / max(1, |S_t|)

A round costs the cohort, not the population (:class:`RoundRunner`): the participants are drawn
on the host (:func:`fedjax_dp.core.cohort.sample_cohort`), gathered into a padded buffer of one of
a few bucket sizes and trained in one vectorised call; only their sum reaches the server. Agent i
trains with ``fold_in(k_train, i)``, so the gathered round equals the reference round that trains
all N agents and masks the unsampled ones (``runtime.cohort = "masked"``), which the tests check.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from fedjax_dp.algorithms import api
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from fedjax_dp.core import (AGENTS, StackedData, for_each_agent, for_each_agent_sum, is_on_host,
                            rng, validation)
from fedjax_dp.core import cohort as cohort_lib
from fedjax_dp.core import memory
from fedjax_dp.models import Model
from fedjax_dp.privacy import PrivacyLedger, mechanisms
from fedjax_dp.privacy import secagg as secagg_lib
from fedjax_dp.privacy import secagg_masks
from fedjax_dp.train import LocalTrainConfig, check_trainable, make_local_update
from fedjax_dp.train.local import resolve_chunk_size

Params = Any


@dataclasses.dataclass(frozen=True)
class Config:
    """FedAvg: ``rounds`` rounds; each round's participants are drawn by ``sampling``:
    ``"poisson"`` (every agent independently with rate ``sampling_rate`` q) or ``"fixed"`` (a
    uniformly random subset of exactly ``cohort_size`` agents). ``diagnostics``: report each
    round's ``num_sampled`` (the realised cohort size) and the cohort's mean ``train_loss`` and
    ``mean_update_norm`` (computed from the agents' data without noise: a private variant's
    ledger declares them as releases it does not cover); false: a round reports nothing."""

    rounds: int = 20
    sampling_rate: float = 1.0
    server_lr: float = 1.0
    local: LocalTrainConfig = LocalTrainConfig()
    sampling: str = "poisson"
    cohort_size: int = 0
    diagnostics: bool = True

    FIELDS = {"rounds": validation.Int(1),
              "sampling_rate": validation.Float(0.0, 1.0, low_open=True),
              "server_lr": validation.Float(0.0, low_open=True),
              "local": validation.Instance(LocalTrainConfig),
              "sampling": validation.Choice(cohort_lib.SAMPLINGS),
              "cohort_size": validation.Int(0), "diagnostics": validation.Bool()}

    def __post_init__(self):
        validation.check_config(self, "algorithm")     # every field, subclasses' too
        if self.sampling == "fixed":
            validation.check_int("algorithm.cohort_size", self.cohort_size, minimum=1)

    @property
    def participation(self) -> cohort_lib.Sampling:
        return cohort_lib.Sampling(self.sampling, rate=self.sampling_rate,
                                   size=self.cohort_size)


@dataclasses.dataclass(frozen=True)
class RoundSpec:
    """What one federated-averaging round does with the agents' updates.

    sampling: how the round's participants are drawn (:class:`fedjax_dp.core.cohort.Sampling`).
    clip_norm: clip each agent's update to this global L2 norm (None: no clipping).
    noise_std: std of the Gaussian noise added once to the *sum* of updates.
    denominator: ``'sampled'`` divides the sum by the realised number of participants
      (FedAvg; the voting-dpfl paper's Algorithm 1), ``'expected'`` by the fixed q*N or C
      (McMahan et al. 2018's fixed-denominator estimator, needed for DP-FedAvg's guarantee).

    secagg: None (the plain masked sum) or secure aggregation of the clipped updates
      (:func:`fedjax_dp.privacy.secagg_masks.secure_tree_sum`: fixed point, pairwise masks on a
      k-regular graph, each agent dropping independently after masking); needs ``clip_norm``
      (the range bound).
    """

    sampling: cohort_lib.Sampling
    server_lr: float
    clip_norm: float | None = None
    noise_std: float = 0.0
    denominator: str = "sampled"
    secagg: secagg_lib.SecAggConfig | None = None
    diagnostics: bool = True        # False: the server reports no metrics (see Config)


def sample_agents(key: jax.Array, num_agents: int, sampling: cohort_lib.Sampling) -> np.ndarray:
    """The round's participation mask ``[N]`` float32 in {0, 1} (host): the same draw as the
    gathered round's cohort (:func:`fedjax_dp.core.cohort.sample_cohort`)."""
    return cohort_lib.sample_mask(key, num_agents, sampling)


@jax.jit
def round_keys(key: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(k_sample, k_train, k_noise) = split(key, 3)``; agent i trains with
    ``fold_in(k_train, i)`` whichever agents are sampled with it. (Jitted: one dispatch.)"""
    k_sample, k_train, k_noise = jax.random.split(key, 3)
    return k_sample, k_train, k_noise


@functools.lru_cache(maxsize=64)
def local_sgd_update(model: Model, local: LocalTrainConfig) -> Callable:
    """FedAvg's agent update: ``(key, params, x, y, mask, count, extras) -> (params, metrics)``,
    E local optax steps (:func:`fedjax_dp.train.make_local_update`); ``extras`` unused."""
    update = make_local_update(model, local)

    def agent(key, params, x, y, mask, count, extras):
        new, loss = update(key, params, x, y, mask, count)
        return new, {"train_loss": loss}

    return agent


@functools.lru_cache(maxsize=64)
def make_round_parts(agent_update: Callable, spec: RoundSpec, num_agents: int, *,
                     chunk_size: int | None = None, mesh=None) -> tuple[Callable, Callable,
                                                                        Callable]:
    """The compiled pieces of a round: ``(train_sum, server, fused)``.

    ``agent_update(key, params, x, y, mask, count, extras) -> (params, metrics)`` is one agent's
    local work (:func:`local_sgd_update`; DP-FedSGD's local DP-SGD); ``extras`` is a pytree of
    per-agent values ``[N]`` (e.g. sampling rates) gathered with the agents.

    ``train_sum(k_train, params, source, rows, ids, valid, extras) -> sums``: the agents ``ids
    [B]`` (their records ``source`` if ``rows`` is None, else ``source[rows]`` gathered on the
    device) run ``agent_update`` with key ``fold_in(k_train, id)``; their updates are clipped and
    summed over the rows with ``valid [B]``::

        sums = (sum_b valid_b Delta_b, {metric: sum_b valid_b metric_b}, M)

    ``server(k_noise, params, sums) -> (params, metrics)``: noise on the sum, divide, apply.
    ``fused``: both in one compiled call (the one-pass round). Compiled once per (update, spec,
    N, execution plan) and shared by every caller; each distinct pass size B is one compilation.
    """
    axes = (0, None, 0, 0, 0, 0, 0)

    def clipped_update(key, params, x, y, mask, count, extras):
        """One agent's contribution to the sum: its update Delta (clipped) and its metrics."""
        local_params, metrics = agent_update(key, params, x, y, mask, count, extras)
        delta = jax.tree.map(jnp.subtract, local_params, params)
        metrics = {**metrics, "mean_update_norm": optax.tree.norm(delta)}
        if spec.clip_norm is not None:
            delta = mechanisms.clip_by_global_norm(delta, spec.clip_norm)[0]
        return delta, metrics

    # the plain sum never materialises the agents' updates [B, ...] (a scan over chunks adds
    # each chunk's sum); secure aggregation needs them stacked (pairwise masks per agent)
    summed = for_each_agent_sum(clipped_update, axes, chunk_size=chunk_size, mesh=mesh)
    stacked = for_each_agent(clipped_update, axes, chunk_size=chunk_size, mesh=mesh)

    def gathered_update(key, params, row, population: StackedData, extras):
        """Agent ``row`` of the device-resident population, read inside the chunk (the cohort's
        records are never copied out as a whole ``[B, n_max, ...]`` buffer)."""
        return clipped_update(key, params, population.x[row], population.y[row],
                              population.mask[row], population.counts[row], extras)

    summed_rows = for_each_agent_sum(gathered_update, (0, None, 0, None, 0),
                                     chunk_size=chunk_size)

    def train_sum(k_train, params, source: StackedData, rows, ids, valid, extras):
        keys = cohort_lib.cohort_keys(k_train, ids)                             # [B]
        mine = jax.tree.map(lambda e: jnp.take(e, ids, axis=0), extras)
        if spec.secagg is None and rows is not None and mesh is None:
            total, metric_sums = summed_rows(keys, params, rows, source, mine, where=valid)
            return total, metric_sums, jnp.sum(valid.astype(jnp.float32))
        agents = source if rows is None else cohort_lib.take_rows(source, rows)
        if spec.secagg is None:
            total, metric_sums = summed(keys, params, agents.x, agents.y, agents.mask,
                                        agents.counts, mine, where=valid)
            return total, metric_sums, jnp.sum(valid.astype(jnp.float32))
        deltas, metrics = stacked(keys, params, agents.x, agents.y, agents.mask,   # [B, ...]
                                  agents.counts, mine)
        # secure aggregation: the pass's own masking / dropout keys (its first agent's id tells
        # passes apart; the pair seeds use the agents' ids), padding rows never deliver. The
        # stream fold_in(k_train, crc32("secagg") = 1951061648) differs from every agent's
        # training key fold_in(k_train, id) for N < 1.95e9 agents.
        k_pass = jax.random.fold_in(rng.stream(k_train, "secagg"), ids[0])
        k_mask, k_drop = jax.random.split(k_pass)
        # every agent drops independently, its coin from fold_in(k_drop, id) (dp_fedavg's proof)
        alive = (secagg_lib.drop_within(k_drop, valid, spec.secagg.dropout, ids)   # [B]
                 if spec.secagg.dropout else valid)
        total = secagg_masks.secure_tree_sum(k_mask, deltas, ids, alive, spec.secagg)
        return (total, cohort_lib.masked_sum(metrics, alive),
                jnp.sum(alive.astype(jnp.float32)))

    def server(k_noise, params, sums):
        total, metric_sums, num_sampled = sums
        if spec.noise_std > 0:
            total = jax.tree.map(jnp.add, total,
                                 mechanisms.gaussian_noise(k_noise, total, spec.noise_std))
        if spec.denominator == "expected":
            denom = spec.sampling.expected(num_agents)
        else:
            denom = jnp.maximum(num_sampled, 1.0)
        new_params = jax.tree.map(lambda g, s: g + spec.server_lr * s / denom, params, total)
        seen = jnp.maximum(num_sampled, 1.0)
        metrics = {"num_sampled": num_sampled,
                   **{k: v / seen for k, v in metric_sums.items()}}    # means over the cohort
        if not spec.diagnostics:
            metrics = {}
        return new_params, metrics

    def fused(k_train, k_noise, params, source, rows, ids, valid, extras):
        return server(k_noise, params, train_sum(k_train, params, source, rows, ids, valid,
                                                 extras))

    return jax.jit(train_sum), jax.jit(server), jax.jit(fused)


def check_secagg_range(spec: RoundSpec, rows: int) -> None:
    """Secure aggregation needs a bound on the sum (before any work): every coordinate of a
    clipped update is at most ``clip_norm`` in absolute value, so a pass of ``rows`` agents sums
    to at most ``rows * clip_norm`` per coordinate, which must fit the ring
    (:func:`fedjax_dp.privacy.secagg.check_range`)."""
    if spec.secagg is None:
        return
    if spec.clip_norm is None:
        raise ValueError("algorithm.aggregation = 'secagg' needs clipped updates (clip_norm): "
                         "the fixed-point range is bounded by the number of agents x clip_norm")
    secagg_lib.check_range(f"algorithm.clip_norm x agents per pass ({rows})",
                           rows * float(spec.clip_norm), spec.secagg.frac_bits, rows)


def _add(a, b):
    return jax.tree.map(jnp.add, a, b)


class RoundRunner:
    """Runs rounds on the gathered cohort (``cohort="gather"``) or on every agent with a
    participation mask (``"masked"``, the reference); both give the same result for a key.

    Gathered: the cohort (:func:`fedjax_dp.core.cohort.sample_cohort`) is padded into passes of
    a few bucket sizes (:class:`~fedjax_dp.core.cohort.CohortPlan`); device-resident agents are
    gathered inside the compiled round, host-resident ones on the host by a
    :class:`~fedjax_dp.core.cohort.CohortFeeder` that prefetches the next round's cohort.
    """

    def __init__(self, model: Model, local: LocalTrainConfig, spec: RoundSpec,
                 agents: StackedData, *, chunk_size: int | None = None, mesh=None,
                 cohort: str = "gather", pass_size: int | None = None,
                 agent_update: Callable | None = None, extras: Any = None,
                 memory_drivers: dict | None = None):
        """``agent_update``: one agent's work (default :func:`local_sgd_update` of ``model`` and
        ``local``); ``extras``: per-agent arrays ``[N]`` it reads (kept on the device);
        ``memory_drivers``: the config keys (-> values) named when a pass cannot fit in memory
        (:mod:`fedjax_dp.core.memory`; default: batch size, chunk size and model)."""
        validation.check_choice("runtime.cohort", cohort, ("gather", "masked"))
        n = agents.num_agents
        spec.sampling.check(n)
        self.agents, self.spec, self.mode, self.mesh = agents, spec, cohort, mesh
        self.num_agents = n
        self.extras = jax.tree.map(jnp.asarray, {} if extras is None else extras)
        update = local_sgd_update(model, local) if agent_update is None else agent_update
        self.parts = make_round_parts(update, spec, n, chunk_size=chunk_size, mesh=mesh)
        align = 1 if mesh is None else mesh.shape[AGENTS]
        self.plan = cohort_lib.CohortPlan.for_sampling(spec.sampling, n, align=align,
                                                       pass_size=pass_size)
        check_secagg_range(spec, n if cohort == "masked" else self.plan.pass_size)
        sharding = None if mesh is None else NamedSharding(mesh, P(AGENTS))
        self.feeder = cohort_lib.CohortFeeder(agents, spec.sampling, self.plan,
                                              sharding=sharding)
        self.last_indices: np.ndarray | None = None
        self.memory_drivers = memory_drivers if memory_drivers is not None else (
            lambda: {"train.batch_size": local.batch_size,
                     "run.chunk_size": memory.chunk_driver(chunk_size, chunk_size),
                     **memory.model_driver(model)})

    def _run_checked(self, fn, num_rows: int, *args):
        """``fn(*args)``, refused before its first run per shape if it cannot fit in memory."""
        memory.check_call(fn, *args, what=f"a round's local training ({num_rows} agents per "
                          "pass)", drivers=self.memory_drivers)
        return fn(*args)

    @property
    def compiled_pass_sizes(self) -> tuple[int, ...]:
        """The pass (bucket) sizes run so far: one compilation each."""
        return tuple(sorted(self.feeder.shapes_used))

    def prefetch(self, key: jax.Array) -> None:
        """Prepare round ``key``'s cohort in the background (host-resident agents only)."""
        if self.mode == "gather" and self.feeder.on_host:
            self.feeder.prefetch(round_keys(key)[0])

    def __call__(self, key: jax.Array, params: Params) -> tuple[Params, dict]:
        k_sample, k_train, k_noise = round_keys(key)
        train_sum, server, fused = self.parts
        if self.mode == "masked":
            if is_on_host(self.agents):
                raise ValueError("runtime.cohort='masked' trains every agent at once and needs "
                                 "device-resident agents; use cohort='gather' for host data")
            mask = sample_agents(k_sample, self.num_agents, self.spec.sampling)
            self.last_indices = np.flatnonzero(mask)
            p = cohort_lib.population_pass(self.agents, mask)
            return self._run_checked(fused, len(p.ids), k_train, k_noise, params, self.agents,
                                     None, p.ids, p.valid, self.extras)
        cohort = self.feeder.get(k_sample)
        self.last_indices = cohort.indices

        def one_pass(p: cohort_lib.CohortPass, fn, *head):
            source, rows = (p.data, None) if p.data is not None else (self.agents, p.ids)
            return self._run_checked(fn, len(p.ids), *head, params, source, rows, p.ids,
                                     p.valid, self.extras)

        if len(cohort.passes) == 1:
            return one_pass(cohort.passes[0], fused, k_train, k_noise)
        sums = cohort_lib.run_passes(cohort, lambda p: one_pass(p, train_sum, k_train), _add)
        return server(k_noise, params, sums)


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
    return RoundSpec(sampling=config.participation, server_lr=config.server_lr,
                     diagnostics=config.diagnostics)


@dataclasses.dataclass(frozen=True)
class Context:
    """The static part of an averaging run's state."""

    agents: StackedData
    model: Model
    round_fn: RoundRunner


def init_rounds(key: jax.Array, data: api.FederatedData, model: Model, local: LocalTrainConfig,
                spec: RoundSpec, runtime: api.Runtime = api.Runtime()) -> api.State:
    """State of a round-based averaging run: ``values = {"params": model.init(split(key)[0])}``."""
    check_trainable(data.agents)
    spec.sampling.check(data.num_agents)
    params = model.init(api.init_key(key))
    expected = max(1, math.ceil(spec.sampling.expected(data.num_agents)))
    chunk_size = resolve_chunk_size(runtime.chunk_size, params, expected)
    drivers = lambda: {"train.batch_size": local.batch_size,  # noqa: E731 (named on refusal)
                       "run.chunk_size": memory.chunk_driver(runtime.chunk_size, chunk_size),
                       **memory.model_driver(model, params)}
    round_fn = RoundRunner(model, local, spec, data.agents, chunk_size=chunk_size,
                           mesh=runtime.mesh, cohort=runtime.cohort, memory_drivers=drivers)
    return api.State(step=0, values={"params": params},
                     context=Context(agents=data.agents, model=model, round_fn=round_fn))


def init(key: jax.Array, data: api.FederatedData, model: Model, config: Config,
         runtime: api.Runtime = api.Runtime()) -> api.State:
    return init_rounds(key, data, model, config.local, round_spec(config), runtime)


def num_steps(config: Config) -> int:
    return config.rounds


def step(state: api.State, key: jax.Array) -> tuple[api.State, dict]:
    """One round (:class:`RoundRunner`) from ``state.values["params"]``."""
    ctx: Context = state.context
    params, metrics = ctx.round_fn(key, state.values["params"])
    return api.State(step=state.step + 1, values={"params": params}, context=ctx), metrics


def prefetch(state: api.State, key: jax.Array) -> None:
    """Start gathering round ``key``'s cohort while the current round computes."""
    state.context.round_fn.prefetch(key)


def seeds_stepper(states: list[api.State]):
    """S seeds' rounds, one vmapped compiled call per round (:func:`round_seeds.stepper`), or
    None where they cannot share it (the seeds then run one by one)."""
    from fedjax_dp.algorithms.averaging import round_seeds          # it imports this module
    return round_seeds.stepper(states)


def output(state: api.State) -> api.Output:
    return api.Output(model=state.context.model, params=state.values["params"])


def artifacts(state: api.State, out_dir=None, run_config: dict | None = None) -> dict:
    """Extra ``result.json`` fields: how the rounds ran (``cohort``: execution, bucket sizes
    planned, pass sizes compiled and run)."""
    runner: RoundRunner = state.context.round_fn
    return {"cohort": {"execution": runner.mode, "pass_size": runner.plan.pass_size,
                       "buckets": list(runner.plan.buckets),
                       "compiled_pass_sizes": list(runner.compiled_pass_sizes)}}


#: The round diagnostics (``Config.diagnostics``) as a release a private variant's ledger does
#: not cover (:meth:`PrivacyLedger.declare_uncovered`): ``(release, reason)``.
DIAGNOSTICS_UNCOVERED = (
    "diagnostic metrics num_sampled (the realised cohort size), train_loss and "
    "mean_update_norm of every round (history, progress.jsonl)",
    "computed from the agents' data without noise: not private "
    "(algorithm.diagnostics = false leaves them out)")


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
