"""The round engine of every averaging-style algorithm (FedAvg, DP-FedAvg, DP-FedSGD, and what
composes them): cohort sampling, the agents' clipped updates summed, the server's noise and step.

One round t with round key ``key_t = fold_in(split(root)[1], t)`` (:func:`api.step_key`)::

    (k_sample, k_train, k_noise) = split(key_t, 3)                       (round_keys)
    coins   = cohort_coins(k_sample, N, sampling)        [N] bool          (core.cohort)
    sums    = sum_{i: coins_i} clip(agent_update(fold_in(k_train, i), theta_t; D_i) - theta_t)
    theta_{t+1}, metrics = server(k_noise, theta_t, sums)      noise on the sum, divide, apply

Two drivers run it, with the same result for the same keys (see docs/scale.md, "Rounds that
cost the cohort"): fused on the device (:mod:`fedjax_dp.algorithms.fused_rounds`; device-resident
agents, no mesh; the cohort is trained in chunks of ``c`` agents, ``ceil(M / c)`` of them, so no
draw is truncated or resampled and the sampling law the ledger assumes is kept exactly), and on
the host (:meth:`RoundRunner.__call__`: host-resident agents or a mesh; the same coins, laid out
in padded passes). S seeds step together through :func:`fedjax_dp.algorithms.seeds.run_seeds`.

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
import optax
from jax.flatten_util import ravel_pytree
from jax.sharding import NamedSharding, PartitionSpec as P

from fedjax_dp.algorithms import api, round_values, secure_rounds, server_step
from fedjax_dp.algorithms.calls import resolve_capacity
from fedjax_dp.algorithms.fused_rounds import add_trees, make_fused_rounds
from fedjax_dp.core import (AGENTS, StackedData, for_each_agent, for_each_agent_sum, is_on_host,
                            validation)
from fedjax_dp.core import cohort as cohort_lib
from fedjax_dp.core import memory
from fedjax_dp.core.lift import resolve_chunk_size, training_bytes
from fedjax_dp.models import Model
from fedjax_dp.privacy import adaptive_clip as adaptive_lib
from fedjax_dp.privacy import clipping, mechanisms
from fedjax_dp.privacy import correlated_noise as correlated_lib
from fedjax_dp.privacy import distributed_dp as distributed_lib
from fedjax_dp.privacy import secagg as secagg_lib
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


@dataclasses.dataclass(frozen=True)
class RoundSpec:
    """What one federated-averaging round does with the agents' updates.

    sampling: how the round's participants are drawn (:class:`fedjax_dp.core.cohort.Sampling`).
    clip_norm: clip each agent's update to this global L2 norm S (None: no clipping).
    noise_multiplier: z; the Gaussian mechanism on the *sum* of updates adds N(0, (z S)^2 I)
      once per round (:func:`fedjax_dp.privacy.mechanisms.gaussian_mechanism`, sensitivity S;
      0: no noise). The private algorithms' ledgers read this spec (the mechanism's own object).
    noise_sensitivity: the S the noise is scaled to where it is not ``clip_norm`` (an audit's
      no-clip weakening keeps the noise of the clip it drops); None: ``clip_norm``.
    denominator: ``'sampled'`` divides the sum by the realised number of participants
      (FedAvg; the voting-dpfl paper's Algorithm 1), ``'expected'`` by the fixed q*N or C
      (McMahan et al. 2018's fixed-denominator estimator, needed for DP-FedAvg's guarantee).
    secagg: None (the plain sum) or secure aggregation of the clipped updates
      (:func:`fedjax_dp.privacy.secagg_masks.secure_tree_sum`); needs ``clip_norm`` (the range).
    adaptive: None (the clip is ``clip_norm`` every round) or adaptive clipping
      (:mod:`fedjax_dp.privacy.adaptive_clip`): ``clip_norm`` is C_0, the run's values carry C_t
      (``"clip_norm"``), the agents also sum their centred unclipped bits, and
      ``noise_multiplier`` is the round's combined z (the updates get z_Delta, the count sigma_b).
    correlated: None (fresh noise each round) or noise correlated across rounds
      (:mod:`fedjax_dp.privacy.correlated_noise`): round t adds ``z S (C^-1 Z)_t``, streamed from
      the run's values (``"noise_state"``), and Poisson-samples only the agents of group
      ``t mod b`` (``"cohort_group" [N]``, ``"round"``); fused device path only.
    weight_cap: None (every agent's update counts once) or w-hat: agent i's clipped update is
      weighted by ``w_i = min(n_i / w-hat, 1)`` (n_i its records; McMahan et al. 2018's capped
      weights), so the sensitivity stays S; the expected denominator is then q W with
      ``total_weight`` W = sum_i w_i over the population (set by ``init_rounds``).
    distributed: None (the server adds the noise) or distributed discrete noise under secure
      aggregation (:mod:`fedjax_dp.privacy.distributed_dp`; needs ``secagg`` and a fixed-size
      cohort): each agent scales, rotates, rounds and noises its update, the pass sums them mod
      2^b, and the server unwraps the modular sum; ``noise_multiplier`` is then the central
      equivalent z of the discrete noise (std z S in model units with n_min survivors).
    server_optimizer: None (``theta + server_lr * Delta_t``, Delta_t the divided sum) or an
      optimizer (:mod:`fedjax_dp.train.optimizers`: a name with rate ``server_lr``, a table's
      :class:`~fedjax_dp.train.optimizers.Named`, an optax transformation) applied to the
      pseudo-gradient ``-Delta_t`` (Reddi et al. 2021, Algorithm 1;
      :mod:`fedjax_dp.algorithms.server_step`); its state is the run's ``"server_opt_state"``.
    """

    sampling: cohort_lib.Sampling
    server_lr: float
    clip_norm: float | None = None
    noise_multiplier: float = 0.0
    noise_sensitivity: float | None = None
    denominator: str = "sampled"
    secagg: secagg_lib.SecAggConfig | None = None
    diagnostics: bool = True        # False: the server reports no metrics (see Config)
    adaptive: adaptive_lib.AdaptiveClip | None = None
    correlated: correlated_lib.CorrelatedNoise | None = None
    weight_cap: float | None = None
    total_weight: float | None = None
    distributed: distributed_lib.DistributedNoise | None = None
    server_optimizer: Any = None

    def expected_cohort(self, num_agents: int) -> float:
        """m: the expected cohort size, q N (or C), over b for cyclic groups (correlated)."""
        m = self.sampling.expected(num_agents)
        if self.weight_cap is not None:             # E[sum of the cohort's weights]: q W
            m = m * self.total_weight / num_agents
        return m / self.correlated.cycle if self.correlated else m

    def weight(self, count: jax.Array) -> jax.Array:
        """An agent's weight ``min(n_i / w-hat, 1)`` (1 without ``weight_cap``)."""
        if self.weight_cap is None:
            return jnp.float32(1.0)
        return jnp.minimum(count.astype(jnp.float32) / self.weight_cap, 1.0)

    def with_weights(self, counts) -> "RoundSpec":
        """The spec with ``total_weight`` W = sum_i min(n_i / w-hat, 1) of a population's
        record counts ``[N]`` (unchanged without ``weight_cap``)."""
        if self.weight_cap is None:
            return self
        w = np.minimum(np.asarray(counts, np.float64) / self.weight_cap, 1.0)
        return dataclasses.replace(self, total_weight=float(w.sum()))

    def sum_noise_multiplier(self, num_agents: int) -> float:
        """The updates' noise multiplier: z, or z_Delta = (z^-2 - (2 sigma_b)^-2)^-1/2 when
        adaptive (:func:`fedjax_dp.privacy.adaptive_clip.update_noise_multiplier`)."""
        if self.adaptive is None:
            return self.noise_multiplier
        return adaptive_lib.update_noise_multiplier(
            self.noise_multiplier, self.adaptive.count_std(self.expected_cohort(num_agents)))

    @property
    def l2_sensitivity(self) -> float | None:
        """S, the L2 sensitivity the noise is scaled to (``noise_sensitivity`` or ``clip_norm``)."""
        return self.clip_norm if self.noise_sensitivity is None else self.noise_sensitivity

    @property
    def noise_std(self) -> float:
        """The std of the noise on the sum, ``z S`` (0 without noise)."""
        return self.noise_multiplier * self.l2_sensitivity if self.noise_multiplier else 0.0


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
    ``fused``: both in one compiled call (the one-pass round). Cached per (update, spec, N, plan).
    """
    axes = (0, None, 0, 0, 0, 0, 0)
    adaptive = spec.adaptive
    z_sum = spec.sum_noise_multiplier(num_agents)
    count_std = adaptive.count_std(spec.expected_cohort(num_agents)) if adaptive else 0.0
    correlated = spec.correlated
    distributed = spec.distributed
    server_opt = server_step.optimizer(spec)

    def clipped_update(key, view, x, y, mask, count, extras):
        """One agent's contribution to the sum: its update Delta (clipped) and its metrics;
        adaptive: ``view["clip_norm"]`` is C_t and the contribution ``(Delta, b - 1/2)``."""
        params = round_values.params_of(spec, view)
        clip = view["clip_norm"] if adaptive else spec.clip_norm
        local_params, metrics = agent_update(key, params, x, y, mask, count, extras)
        delta = jax.tree.map(jnp.subtract, local_params, params)
        norm = optax.tree.norm(delta)
        metrics = {**metrics, "mean_update_norm": norm}
        if clip is not None:
            delta = clipping.clip_by_global_norm(delta, clip)[0]
        if spec.weight_cap is not None:           # capped record weight: norm still <= S
            w = spec.weight(count)
            delta = jax.tree.map(lambda d: d * w, delta)
        if adaptive:
            return (delta, adaptive_lib.centred_unclipped(norm, clip)), metrics
        return delta, metrics

    # the plain sum never holds the updates [B, ...]; secure aggregation needs them stacked
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
        total, alive = secure_rounds.pass_sum(spec, k_train, deltas, ids, valid)
        return (total, cohort_lib.masked_sum(metrics, alive),
                jnp.sum(alive.astype(jnp.float32)))

    def server(k_noise, view, sums, k_train=None):
        total, metric_sums, num_sampled = sums
        params = round_values.params_of(spec, view)
        clip = view["clip_norm"] if adaptive else spec.l2_sensitivity
        if adaptive:
            total, centred = total
        released = None
        if distributed:                       # unwrap the modular sum; abort if M < n_min
            total, released = secure_rounds.distributed_release(spec, k_train, params, total,
                                                                num_sampled)
        elif correlated:                      # z S (C^-1 Z)_t, streamed (correlated_noise)
            flat, unravel = ravel_pytree(total)
            noise, noise_state = correlated_lib.next_noise(correlated, k_noise,
                                                           view["noise_state"], flat.size)
            total = unravel(flat + (z_sum * clip) * noise)
        elif z_sum > 0:
            total = mechanisms.gaussian_mechanism(k_noise, total, clip, z_sum)
        if spec.denominator == "expected":
            denom = spec.expected_cohort(num_agents)
        else:
            denom = jnp.maximum(num_sampled, 1.0)
        opt_state = view["server_opt_state"] if server_opt is not None else None
        new_params, opt_state = server_step.update(spec.server_lr, server_opt, params, opt_state,
                                                   total, denom, released)
        seen = jnp.maximum(num_sampled, 1.0)
        metrics = {"num_sampled": num_sampled,
                   **{k: v / seen for k, v in metric_sums.items()}}    # means over the cohort
        if not spec.diagnostics:
            metrics = {}
        if distributed:                       # public: whether the round was released
            metrics = {**metrics, "released": released.astype(jnp.float32)}
        if adaptive:      # C_t and the noisy fraction are releases the ledger covers
            new_clip, fraction = adaptive_lib.next_clip_norm(k_noise, clip, centred, denom,
                                                             count_std, adaptive)
            metrics = {**metrics, "clip_norm": clip, "unclipped_fraction": fraction}
        if round_values.server_keys(spec) == ("params",):
            return new_params, metrics
        out = {"params": new_params}
        if adaptive:
            out["clip_norm"] = new_clip
        if correlated:
            out["noise_state"] = noise_state
        if server_opt is not None:
            out["server_opt_state"] = opt_state
        return out, metrics

    def fused(k_train, k_noise, params, source, rows, ids, valid, extras):
        return server(k_noise, params, train_sum(k_train, params, source, rows, ids, valid,
                                                 extras), k_train)

    return jax.jit(train_sum), jax.jit(server), jax.jit(fused)


check_secagg_range = secure_rounds.check_secagg_range


class RoundRunner:
    """Runs rounds on the gathered cohort (``cohort="gather"``) or on every agent with a
    participation mask (``"masked"``, the reference); both give the same result for a key.
    Device-resident agents without a mesh run fused on the device (:meth:`run_rounds`,
    :meth:`one`); otherwise the host driver (:meth:`__call__`) runs the cohort in padded passes
    (:class:`~fedjax_dp.core.cohort.CohortPlan`, :class:`~fedjax_dp.core.cohort.CohortFeeder`).

    ``participation``: the run's values carry ``"participation" [N] int32`` (DP-FedSGD's rounds
    per agent), increased by each round's cohort. ``rounds_per_call``: ``"auto"`` or an int,
    the capacity K of a fused call (:func:`resolve_capacity`).
    """

    def __init__(self, model: Model, local: LocalTrainConfig, spec: RoundSpec,
                 agents: StackedData, *, chunk_size: int | None = None, mesh=None,
                 cohort: str = "gather", pass_size: int | None = None,
                 agent_update: Callable | None = None, extras: Any = None,
                 memory_drivers: dict | None = None, participation: bool = False,
                 rounds_per_call: int | str = "auto"):
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
        if pass_size is None and spec.correlated:   # one group a round: q N / b expected
            mean = spec.sampling.expected(n) / spec.correlated.cycle
            q = spec.sampling.rate if spec.sampling.kind == "poisson" else 0.0
            pass_size = min(n, max(1, math.ceil(mean + 2.0 * math.sqrt(mean * (1.0 - q)))))
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
        self.participation = participation
        self.capacity = resolve_capacity(rounds_per_call)
        self.fusable = mesh is None and not is_on_host(agents)
        if spec.correlated and not self.fusable:
            raise ValueError("algorithm.noise (correlated across rounds) runs on the fused device "
                             "path: device-resident agents without a mesh (run.agents_on = "
                             "\"device\", one device)")
        train_sum, server, _ = self.parts
        self.fused = make_fused_rounds(train_sum, server, spec, n, self.plan.pass_size,
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
        args = (values, root, jnp.int32(start), jnp.int32(count), self.agents, self.extras)
        self._check_memory(self.fused.rounds, *args)
        return self.fused.rounds(*args)

    def one(self, values: dict, key: jax.Array) -> tuple[dict, dict]:
        """One round with round key ``key``: ``(values, metrics)``, fused on the device where
        the agents allow it, else on the host (participation counted from the cohort)."""
        if self.fusable:
            args = (values, key, self.agents, self.extras)
            self._check_memory(self.fused.one, *args)
            return self.fused.one(*args)
        view, metrics = self(key, round_values.view(self.spec, values))
        out = {**values, **round_values.unview(self.spec, view)}
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

    def __call__(self, key: jax.Array, params: Params) -> tuple[Params, dict]:
        """One round on the host driver: ``(params, metrics)`` (device arrays; ``params`` is the
        round's view, :meth:`RoundSpec.view`); one compiled call per pass, several passes' sums
        added before the server's step. Records the participants in ``last_indices``."""
        if self.mesh is not None:
            # replicated, as the round returns them, so round 2 compiles no second program
            params = jax.device_put(params, NamedSharding(self.mesh, P()))
        k_sample, k_train, k_noise = round_keys(key)
        if self.mode == "masked":
            if is_on_host(self.agents):
                raise ValueError("runtime.cohort='masked' trains every agent at once and needs "
                                 "device-resident agents; use cohort='gather' for host data")
            mask = sample_agents(k_sample, self.num_agents, self.spec.sampling)
            self.last_indices = np.flatnonzero(mask)
            passes = [cohort_lib.population_pass(self.agents, mask)]
        else:
            cohort = self.feeder.get(k_sample)
            self.last_indices, passes = cohort.indices, cohort.passes
        train_sum, server, fused = self.parts
        if len(passes) == 1:                  # the usual round: one pass, one compiled call
            return self._run_pass(fused, passes[0], k_train, k_noise, params)
        total = None                          # a draw larger than a pass: the passes' sums added
        for p in passes:
            sums = self._run_pass(train_sum, p, k_train, params)
            total = sums if total is None else add_trees(total, sums)
        return server(k_noise, params, total, k_train)

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


@functools.lru_cache(maxsize=64)
def _fused_step(one: Callable) -> Callable:
    """``fn(key, values, (agents, extras)) = one(values, key, agents, extras)`` for the fused
    round ``one`` (one function per round, so the seed driver's compiled call is shared)."""
    return lambda key, values, data: one(values, key, *data)


# --------------------------------------------------------------------------- the protocol
# shared by FedAvg, DP-FedAvg and DP-FedSGD: ``values = {"params", ["participation"]}``.

@dataclasses.dataclass(frozen=True)
class Context:
    """The static part of an averaging run's state."""

    agents: StackedData
    model: Model
    round_fn: RoundRunner


def init_rounds(key: jax.Array, data: api.FederatedData, model: Model, local: LocalTrainConfig,
                spec: RoundSpec, runtime: api.Runtime = api.Runtime(), *,
                agent_update: Callable | None = None, extras: Any = None) -> api.State:
    """State of a round-based averaging run: ``values = {"params": model.init(split(key)[0])}``
    (and :meth:`RoundSpec.init_values`'s). ``agent_update`` / ``extras``: as
    :class:`RoundRunner`'s (default: local SGD, none)."""
    check_trainable(data.agents)
    spec.sampling.check(data.num_agents)
    spec = spec.with_weights(data.agents.counts)
    params = model.init(api.init_key(key))
    secure_rounds.check_distributed_plan(spec, params)     # bits that cannot hold the sum
    expected = max(1, math.ceil(spec.expected_cohort(data.num_agents)))
    chunk_size = resolve_chunk_size(runtime.chunk_size, num_agents=expected,
                                    bytes_per_agent=training_bytes(params, expected))
    drivers = lambda: {"train.batch_size": local.batch_size,  # noqa: E731 (named on refusal)
                       "run.chunk_size": memory.chunk_driver(runtime.chunk_size, chunk_size),
                       **memory.model_driver(model, params)}
    round_fn = RoundRunner(model, local, spec, data.agents, chunk_size=chunk_size,
                           mesh=runtime.mesh, cohort=runtime.cohort, memory_drivers=drivers,
                           rounds_per_call=runtime.rounds_per_call, agent_update=agent_update,
                           extras=extras)
    return api.State(step=0, values=round_values.init_values(spec, params, key, data.num_agents),
                     context=Context(agents=data.agents, model=model, round_fn=round_fn))
