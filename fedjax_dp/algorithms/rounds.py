"""The round engine of every averaging-style algorithm (FedAvg, DP-FedAvg, DP-FedSGD, and what
composes them): a chain of stages (:class:`fedjax_dp.stages.Chain`) run over the agents.

One round t with round key ``key_t = fold_in(split(root)[1], t)`` (:func:`api.step_key`)::

    (k_sample, k_train, k_noise) = split(key_t, 3)                       (round_keys)
    coins   = participation.coins(k_sample, N, state)     [N] bool
    sums    = aggregation of clipping.client(agent_update(fold_in(k_train, i), theta_t; D_i)
              - theta_t) over {i: coins_i}
    view_{t+1}, metrics = server(k_noise, view_t, sums)  noise, divide, server update

(:mod:`fedjax_dp.algorithms.round_parts`). Two drivers run it, with the same result for the same
keys (see docs/scale.md, "Rounds that cost the cohort"): fused on the device
(:mod:`fedjax_dp.algorithms.fused_rounds`; device-resident agents, no mesh; the cohort is trained
in chunks of ``c`` agents, ``ceil(M / c)`` of them, so no draw is truncated or resampled and the
sampling law the ledger assumes is kept exactly), and on the host (:meth:`RoundRunner.__call__`:
host-resident agents or a mesh; the same coins, laid out in padded passes). S seeds step together
through :func:`fedjax_dp.algorithms.seeds.run_seeds`.

Agent i trains with ``fold_in(k_train, i)`` whichever chunk or pass it lands in, so every path
equals the masked reference round (``runtime.cohort = "masked"``) up to float summation order.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, Hashable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from fedjax_dp.algorithms import api
from fedjax_dp.algorithms.calls import resolve_capacity
from fedjax_dp.algorithms.fused_rounds import add_trees, make_fused_rounds
from fedjax_dp.algorithms.round_parts import advance, make_round_parts, view_of
from fedjax_dp.core import AGENTS, StackedData, is_on_host, validation
from fedjax_dp.core import cohort as cohort_lib
from fedjax_dp.core import memory
from fedjax_dp.core.lift import replicate, resolve_chunk_size, training_bytes
from fedjax_dp.models import Model
from fedjax_dp.stages import Chain, Setup, setup_of
from fedjax_dp.stages import updates as updates_lib
from fedjax_dp.train import LocalTrainConfig, check_trainable, make_local_update

Params = Any


def sample_agents(key: jax.Array, num_agents: int, sampling: cohort_lib.Sampling) -> np.ndarray:
    """The round's participation mask ``[N]`` float32 in {0, 1} (host): the same draw as every
    round's cohort (:func:`fedjax_dp.core.cohort.cohort_coins`)."""
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


def local_steps(model: Model, local: LocalTrainConfig) -> updates_lib.LocalSteps:
    """The client-update stage of E local optax steps (:func:`local_sgd_update`)."""
    return updates_lib.LocalSteps(local_sgd_update(model, local))


class RoundRunner:
    """Runs a chain's rounds on the gathered cohort (``cohort="gather"``) or on every agent with
    a participation mask (``"masked"``, the reference); both give the same result for a key.
    Device-resident agents without a mesh run fused on the device (:meth:`run_rounds`,
    :meth:`one`); otherwise the host driver (:meth:`__call__`) runs the cohort in padded passes
    (:class:`~fedjax_dp.core.cohort.CohortPlan`, :class:`~fedjax_dp.core.cohort.CohortFeeder`).

    ``setup``: the run's :class:`~fedjax_dp.stages.Setup` (N, T, d, W). ``participation``: the
    run's values carry ``"participation" [N] int32`` (DP-FedSGD's rounds per agent), increased by
    each round's cohort. ``rounds_per_call``: ``"auto"`` or an int, the capacity K of a fused
    call (:func:`resolve_capacity`). ``diagnostics``: the server reports the cohort's metrics.
    """

    def __init__(self, chain: Chain, setup: Setup, agents: StackedData, *,
                 chunk_size: int | None = None, mesh=None, cohort: str = "gather",
                 pass_size: int | None = None, extras: Any = None,
                 memory_drivers: Callable | None = None, participation: bool = False,
                 rounds_per_call: int | str = "auto", diagnostics: bool = True):
        validation.check_choice("runtime.cohort", cohort, ("gather", "masked"))
        n = agents.num_agents
        chain.participation.check(n)
        self.agents, self.chain, self.setup, self.mode, self.mesh = \
            agents, chain, setup, cohort, mesh
        self.num_agents = n
        self.extras = jax.tree.map(jnp.asarray, {} if extras is None else extras)
        self.parts = make_round_parts(chain, setup, chunk_size=chunk_size, mesh=mesh,
                                      diagnostics=diagnostics)
        align = 1 if mesh is None else mesh.shape[AGENTS]
        if pass_size is None:
            pass_size = chain.participation.pass_size(n)
        sampling = chain.participation.sampling
        self.plan = cohort_lib.CohortPlan.for_sampling(sampling, n, align=align,
                                                       pass_size=pass_size)
        chain.aggregation.check_range(chain, n if cohort == "masked" else self.plan.pass_size)
        sharding = None if mesh is None else NamedSharding(mesh, P(AGENTS))
        self.feeder = cohort_lib.CohortFeeder(agents, sampling, self.plan, sharding=sharding)
        self.last_indices: np.ndarray | None = None
        self.memory_drivers = memory_drivers if memory_drivers is not None else (
            lambda: {"run.chunk_size": memory.chunk_driver(chunk_size, chunk_size)})
        self.participation = participation
        self.capacity = resolve_capacity(rounds_per_call)
        self.fusable = mesh is None and not is_on_host(agents)
        if chain.participation.min_sep > 1 and not self.fusable:
            raise ValueError(f"{chain.participation.label} (b-min-sep groups) runs on the fused "
                             f"device path: device-resident agents without a mesh "
                             f"(run.agents_on = \"device\", one device)")
        train_sum, server, _ = self.parts
        self.fused = make_fused_rounds(train_sum, server, chain, n, self.plan.pass_size,
                                       cohort == "masked", participation, self.capacity) \
            if self.fusable else None

    def _check_memory(self, fn, *args) -> None:
        """Refuse, before its first run, a fused call whose chunk cannot fit in memory."""
        rows = self.num_agents if self.mode == "masked" else self.plan.pass_size
        memory.check_call(fn, *args, what=f"a round's local training ({rows} agents per chunk)",
                          drivers=self.memory_drivers)

    def run_rounds(self, values: dict, root: jax.Array, start: int, count: int
                   ) -> tuple[dict, dict]:
        """Rounds ``start .. start + count - 1`` of the run with root key ``root``, fused in one
        compiled call (device-resident agents; ``count <= capacity``): ``(values, metrics)``,
        metrics ``[capacity]`` per metric with the first ``count`` rows filled."""
        if not 1 <= count <= self.capacity:
            raise ValueError(f"count must be in [1, {self.capacity}] (run.rounds_per_call), "
                             f"got {count}")
        keys = self.fused.run_keys(root, jnp.int32(start))
        return self._fused_call(values, keys, count)

    def _fused_call(self, values: dict, keys: jax.Array, count: int) -> tuple[dict, dict]:
        """The fused program on rounds ``keys[:count]`` (refused first if it cannot fit)."""
        args = (values, keys, jnp.int32(count), self.agents, self.extras)
        self._check_memory(self.fused.rounds, *args)
        return self.fused.rounds(*args)

    def one(self, values: dict, key: jax.Array) -> tuple[dict, dict]:
        """One round with round key ``key``: ``(values, metrics)``, fused on the device where
        the agents allow it (the K-round program with count 1), else on the host
        (participation counted from the cohort)."""
        if self.fusable:
            values, metrics = self._fused_call(values, self.fused.one_keys(key), 1)
            return values, _first_row(metrics)
        view, metrics = self(key, view_of(values))
        out = advance(self.chain, values, view)
        if self.participation:
            took_part = jnp.asarray(self.last_indices, jnp.int32)
            out["participation"] = jnp.asarray(values["participation"]).at[took_part].add(1)
        return out, metrics

    @property
    def compiled_pass_sizes(self) -> tuple[int, ...]:
        """The pass (bucket) sizes run so far: one compilation each."""
        return tuple(sorted(self.feeder.shapes_used))

    def prefetch(self, key: jax.Array) -> None:
        """Prepare round ``key``'s cohort in the background (host-resident agents only)."""
        if self.mode == "gather" and self.feeder.on_host:
            self.feeder.prefetch(round_keys(key)[0])

    def __call__(self, key: jax.Array, view: dict) -> tuple[dict, dict]:
        """One round on the host driver: ``(view, metrics)`` (device arrays; ``view`` the
        round's ``{"params", "stages"}``); one compiled call per pass, several passes' sums
        added before the server's step. Records the participants in ``last_indices``."""
        if self.mesh is not None:
            # replicated, as the round returns them, so round 2 compiles no second program
            view = replicate(view, self.mesh)
        k_sample, k_train, k_noise = round_keys(key)
        if self.mode == "masked":
            if is_on_host(self.agents):
                raise ValueError("runtime.cohort='masked' trains every agent at once and needs "
                                 "device-resident agents; use cohort='gather' for host data")
            mask = sample_agents(k_sample, self.num_agents, self.chain.participation.sampling)
            self.last_indices = np.flatnonzero(mask)
            passes = [cohort_lib.population_pass(self.agents, mask)]
        else:
            cohort = self.feeder.get(k_sample)
            self.last_indices, passes = cohort.indices, cohort.passes
        train_sum, server, fused = self.parts
        if len(passes) == 1:                  # the usual round: one pass, one compiled call
            return self._run_pass(fused, passes[0], k_train, k_noise, view)
        total = None                          # a draw larger than a pass: the passes' sums added
        for p in passes:
            sums = self._run_pass(train_sum, p, k_train, view)
            total = sums if total is None else add_trees(total, sums)
        return server(k_noise, view, total, k_train)

    def _run_pass(self, fn, p: cohort_lib.CohortPass, *head):
        """``fn(*head, source, rows, ids, valid, extras)`` on pass ``p`` (its gathered agents,
        or the population's rows ``ids`` gathered inside the call), refused before its first
        run per shape if it cannot fit in memory."""
        source, rows = (p.data, None) if p.data is not None else (self.agents, p.ids)
        args = (*head, source, rows, p.ids, p.valid, self.extras)
        memory.check_call(fn, *args, what=f"a round's local training "
                          f"({int(p.valid.shape[-1])} agents per pass)",
                          drivers=self.memory_drivers)
        return fn(*args)

    def seed_step(self) -> tuple[Callable, Any, Hashable] | None:
        """The round as a pure function for :func:`fedjax_dp.algorithms.seeds.run_seeds`:
        ``(fn, (agents, extras), fused.one)``, ``fn(key, values, (agents, extras))``; None on
        the host driver (the seeds then run one by one)."""
        if not self.fusable:
            return None
        return _fused_step(self.fused.one), (self.agents, self.extras), self.fused.one


@jax.jit
def _first_row(metrics: dict) -> dict:
    """Row 0 of each metric ``[K, ...]`` (one round's metrics out of a K-round call)."""
    return jax.tree.map(lambda m: m[0], metrics)


@functools.lru_cache(maxsize=64)
def _fused_step(one: Callable) -> Callable:
    """``fn(key, values, (agents, extras)) = one(values, key, agents, extras)`` for the fused
    round ``one`` (one function per round, so the seed driver's compiled call is shared)."""
    return lambda key, values, data: one(values, key, *data)


# --------------------------------------------------------------------------- the protocol
# shared by FedAvg, DP-FedAvg and DP-FedSGD: ``values = {"params", "stages", ["participation"]}``.

@dataclasses.dataclass(frozen=True)
class Context:
    """The static part of an averaging run's state."""

    agents: StackedData
    model: Model
    round_fn: RoundRunner


def init_rounds(key: jax.Array, data: api.FederatedData, model: Model, chain: Chain,
                rounds: int, runtime: api.Runtime = api.Runtime(), *,
                local: LocalTrainConfig | None = None, extras: Any = None,
                participation: bool = False, diagnostics: bool = True,
                bytes_per_agent: Callable | None = None) -> api.State:
    """State of a run of ``rounds`` rounds of ``chain``: ``values = {"params":
    model.init(split(key)[0]), "stages": chain.init_state(key, params, N)}`` (and, with
    ``participation``, each agent's rounds ``[N]``). ``local``: the client's train settings
    (named when a pass cannot fit in memory); ``extras``: per-agent arrays ``[N]`` the client
    update reads; ``bytes_per_agent(params)``: one agent's working memory (default: training)."""
    check_trainable(data.agents)
    chain.participation.check(data.num_agents, rounds)
    params = model.init(api.init_key(key))
    setup = setup_of(rounds, data.agents, params, chain.clipping)
    if chain.noise.encodes:                 # bits that cannot hold the sum
        chain.noise.check_plan(chain, setup.dim, chain.update_multiplier(setup))
    expected = max(1, math.ceil(chain.expected_cohort(setup)))
    per_agent = (bytes_per_agent(params) if bytes_per_agent is not None
                 else training_bytes(params, expected))
    chunk_size = resolve_chunk_size(runtime.chunk_size, num_agents=expected,
                                    bytes_per_agent=per_agent)
    batch = {} if local is None else {"train.batch_size": local.batch_size}
    drivers = lambda: {**batch,  # noqa: E731 (named on refusal)
                       "run.chunk_size": memory.chunk_driver(runtime.chunk_size, chunk_size),
                       **memory.model_driver(model, params)}
    round_fn = RoundRunner(chain, setup, data.agents, chunk_size=chunk_size, mesh=runtime.mesh,
                           cohort=runtime.cohort, memory_drivers=drivers,
                           rounds_per_call=runtime.rounds_per_call, extras=extras,
                           participation=participation, diagnostics=diagnostics)
    values = {"params": params, "stages": chain.init_state(key, params, data.num_agents)}
    if participation:
        values["participation"] = jnp.zeros((data.num_agents,), jnp.int32)
    return api.State(step=0, values=values,
                     context=Context(agents=data.agents, model=model, round_fn=round_fn))
