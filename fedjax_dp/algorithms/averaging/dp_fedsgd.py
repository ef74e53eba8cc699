"""DP-FedSGD (Truex et al. 2019): DP-SGD inside every agent, server averaging; instance-level DP.

The voting-dpfl paper's instance-level gradient baseline (spec "Baselines"). Round t:

    S_t           Poisson sampling of agents with rate q (q = 1: every agent), or a uniform
                  subset of exactly C agents (``sampling = "fixed"``)
    theta_i^0     = theta_t                                      for every i in S_t (one vmap)
    for s = 1..E  (E = local.steps DP-SGD steps of agent i, on its own records only):
        b_i^s     ~ Bernoulli(p_i) per real record (a mask over the padded rows; padding never)
        g_i^s     = ( sum_j b_ij^s clip(grad l(theta_i^{s-1}; x_ij, y_ij), C)
                      + N(0, (z C)^2 I) ) / (p_i n_i)                                     (1)
        theta_i^s = OptStep(theta_i^{s-1}, g_i^s)        (optax; plain SGD: - eta g_i^s)
    Delta_i       = theta_i^E - theta_t
    theta_{t+1}   = theta_t + eta_s * sum_{i in S_t} Delta_i / max(1, |S_t|)                (2)

(with ``server_optimizer``, (2)'s mean is the pseudo-gradient of Reddi et al. 2021, Algorithm 1:
``theta_{t+1} = theta_t + opt.update(-mean, s_t, theta_t)``, post-processing; see
:mod:`fedjax_dp.algorithms.averaging.fedavg`)

Only the sampled agents train (:class:`fedjax_dp.algorithms.rounds.RoundRunner`) and only the
sampled records' gradients are computed (padded passes planned for :func:`expected_batch`).
``clip`` uses the global L2 norm over all parameters (:mod:`fedjax_dp.privacy.clipping`). The sum
is divided by the *expected* batch size ``p_i n_i`` (Abadi et al.'s fixed "lot size"), never by
the realised batch size, which would leak it.

Record sampling rate p_i: ``record_sampling_rate = p`` for every agent, or (None, the default)
``p_i = min(1, B / n_i)`` with B = ``local.batch_size``: smaller agents pay more privacy.

Privacy. Unit: one instance (record) of one agent. Neighbouring relation: add or remove one
record of one agent. Sensitivity: one record changes one agent's clipped gradient sum (1) by at
most C (L2) in each step in which it is sampled; the noise std is z C, i.e. noise multiplier z;
records are Poisson-sampled with rate p_i. Agent i's records are touched only by agent i's own
E steps in each round it takes part in, so agent i's records get

    SelfComposed(PoissonSampled(p_i, Gaussian(z)), E * T_i)                                (3)

with T_i the number of rounds agent i took part in (T when not given: an upper bound). The rest
(optimiser, average (2), later rounds) is post-processing; the agent sampling is independent of
the data. By parallel composition over the disjoint datasets the run's guarantee is the worst
agent's (3), even against a server that sees every update. The local sizes n_i are public (as
in DP-SGD): p_i and p_i n_i are the same on neighbouring datasets. No agent-level guarantee.

``State.values = {"params", "participation"}``, the latter the rounds each agent took part in
(``int32 [N]``), T_i in (3).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_dp.algorithms import api, rounds
from fedjax_dp.algorithms.averaging import fedavg
# step: one round (make_round), adding one to the participants' counts (on the device where the
# round is fused, from the host cohort otherwise); seed_step vmaps the fused round
from fedjax_dp.algorithms.rounds_protocol import (  # noqa: F401  (the protocol hooks)
    artifacts, multi_step, output, prefetch, rounds_per_call, seed_step, step)
from fedjax_dp.core import StackedData, validation
from fedjax_dp.core.lift import resolve_chunk_size
from fedjax_dp.models import Model
from fedjax_dp.privacy import (PrivacyLedger, accounting, batch_selection, calibration, noise,
                               private_grad)
from fedjax_dp.privacy.clipping import clipped_sum
from fedjax_dp.stages import Chain, Setup, aggregation, clipping, updates
from fedjax_dp.stages import noise as stage_noise
from fedjax_dp.train import check_trainable, cross_entropy

Params = Any

DESCRIPTION = "DP-FedSGD, instance-level DP: DP-SGD in every agent (Truex et al. 2019)"
USES_LOCAL_TRAIN = True

UNIT = "instance"
RELATION = "add/remove one record of one agent"


@dataclasses.dataclass(frozen=True)
class Config(fedavg.Config):
    """DP-FedSGD: ``rounds`` rounds of E = ``local.steps`` DP-SGD steps in every (sampled) agent.

    clip_norm: C, per-example gradient clip (global L2 norm).
    noise_multiplier: z; each agent's noisy clipped gradient sum carries N(0, (z C)^2).
    record_sampling_rate: p, the Poisson rate of records in each local step, the same for every
      agent; None (default): ``p_i = min(1, local.batch_size / n_i)`` per agent.
    sampling_rate: q, Poisson rate of agents per round (1: every agent every round).
    The optimiser, learning rate and weight decay come from ``local`` (``local.batch_size`` is the
    expected batch size when ``record_sampling_rate`` is None, and unused otherwise).
    diagnostics: off by default (the round metrics are computed without noise; ``true``
      reports them and every guarantee then says ``covers_all_releases: false``).
    """

    clip_norm: float = 1.0
    noise_multiplier: float = 1.0
    record_sampling_rate: float | None = None
    diagnostics: bool = False       # the non-private round metrics: an explicit opt-in

    FIELDS = {"clip_norm": validation.Float(0.0, low_open=True),
              "noise_multiplier": validation.Float(0.0, accounting.GAUSSIAN_NOISE_RANGE[1]),
              "record_sampling_rate": validation.Float(0.0, 1.0, low_open=True, optional=True)}

    def __post_init__(self):
        super().__post_init__()            # checks every field (validation.check_config)
        if self.local.batching != "replacement":   # the accounting assumes Poisson batches
            raise ValueError(f"train.batching = {self.local.batching!r} is not used by DP-FedSGD: "
                             "its local batches are Poisson samples of the records (the privacy "
                             "analysis needs them); leave train.batching = 'replacement'")


# --------------------------------------------------------------------------- host-side plan

def _counts(counts) -> np.ndarray:
    c = np.asarray(counts).reshape(-1)
    if c.size == 0 or c.dtype.kind not in "iu" or np.any(c < 1):
        raise ValueError(f"counts must be a non-empty array of local sizes >= 1, got {c.tolist()}")
    return c.astype(np.int64)


def record_sampling_rates(config: Config, counts) -> np.ndarray:
    """Per-agent record sampling rate p_i, ``[N]`` float64 (see the module docstring)."""
    c = _counts(counts)
    if config.record_sampling_rate is not None:
        return np.full(c.shape, float(config.record_sampling_rate))
    return np.minimum(1.0, config.local.batch_size / c.astype(np.float64))


def expected_batch_sizes(config: Config, counts) -> np.ndarray:
    """The fixed denominator of (1): ``p_i n_i``, ``[N]`` float64."""
    return record_sampling_rates(config, counts) * _counts(counts)


# --------------------------------------------------------------------------- one agent

#: Poisson minibatch of one agent: weights ``[n_max]`` in {0., 1.}, ``Bernoulli(rate) & mask``
#: (:func:`fedjax_dp.privacy.batch_selection.poisson_weights`; padded rows never).
sample_records = batch_selection.poisson_weights


def noisy_gradient(key: jax.Array, loss_fn: Callable, params: Params, x: jax.Array,
                   y: jax.Array, weights: jax.Array, clip_norm: float, noise_std: float,
                   denominator, plan: batch_selection.RowPlan | None = None) -> tuple[Params, dict]:
    """Equation (1) for given minibatch weights: ``(clipped sum + N(0, std^2)) / denominator``.

    ``x [n_max, ...]``, ``y [n_max]``, ``weights [n_max]`` (the Poisson mask). The private-gradient
    primitive (:mod:`fedjax_dp.privacy.private_grad`): only the selected records' gradients are
    computed, in the padded passes of ``plan`` (None: one pass over all rows); the noise is drawn
    per leaf from ``key``. Returns the noisy gradient pytree and ``{"count", "clipped", "aux"}``
    (``clipped``: selected records whose norm exceeded the clip).
    """
    summed, stats = clipped_sum(private_grad.gradient_fn(loss_fn, params), (x, y), weights,
                                clip_norm, plan)
    grad = noise.release(key, summed, noise_std, denominator, per_leaf=True)
    return grad, stats


def expected_batch(config: Config, num_rows: int) -> float:
    """The largest expected batch ``p_i n_i`` of an agent with ``num_rows`` padded rows: B
    (``p_i = min(1, B / n_i)``) or ``p n_max`` (plans the gathered passes of (1))."""
    if config.record_sampling_rate is None:
        return float(config.local.batch_size)
    return float(config.record_sampling_rate) * num_rows


def make_local_dp_sgd(model: Model, config: Config) -> Callable:
    """One agent's E DP-SGD steps (pure; lift with ``for_each_agent``).

    ``local(key, params, x [n_max, ...], y [n_max], mask [n_max], rate [], denominator [])
    -> (params, metrics)``. Step s uses ``k_s = split(key, E)[s]``, split into a minibatch key and
    a noise key: no key is used twice.
    """
    loss_fn = cross_entropy(model)
    opt = config.local.make_optimizer()
    noise_std = config.noise_multiplier * config.clip_norm
    clip = config.clip_norm
    steps = config.local.steps

    def local(key, params, x, y, mask, rate, denominator):
        plan = batch_selection.RowPlan.for_expected(expected_batch(config, x.shape[0]), x.shape[0])

        def body(carry, step_key):
            p, s = carry
            k_batch, k_noise = jax.random.split(step_key)
            w = sample_records(k_batch, mask, rate)                              # [n_max]
            g, stats = noisy_gradient(k_noise, loss_fn, p, x, y, w, clip, noise_std,
                                      denominator, plan)
            updates, s = opt.update(g, s, p)
            return (optax.apply_updates(p, updates), s), (jnp.sum(w), stats["clipped"])

        keys = jax.random.split(key, steps)
        (params, _), (sizes, clipped) = jax.lax.scan(body, (params, opt.init(params)), keys)
        w_real = mask.astype(jnp.float32)
        losses = jax.vmap(loss_fn, in_axes=(None, 0, 0))(params, x, y)               # [n_max]
        metrics = {"batch_size": jnp.mean(sizes) if steps else jnp.zeros(()),
                   "clipped_fraction": jnp.sum(clipped) / jnp.maximum(jnp.sum(sizes), 1.0),
                   # diagnostic only (not private): the local loss after the E steps
                   "train_loss": jnp.sum(w_real * losses) / jnp.maximum(jnp.sum(w_real), 1.0)}
        return params, metrics

    return local


# --------------------------------------------------------------------------- all agents

@functools.lru_cache(maxsize=32)
def agent_update(model: Model, config: Config) -> Callable:
    """The cohort round's agent update (:func:`fedjax_dp.algorithms.rounds.make_round_parts`):
    ``(key, params, x, y, mask, count, extras) -> (params, metrics)`` with ``extras = {"rate":
    p_i, "denominator": p_i n_i}``. Cached per (model, round fields of ``config``)."""
    local = make_local_dp_sgd(model, config)

    def agent(key, params, x, y, mask, count, extras):
        return local(key, params, x, y, mask, extras["rate"], extras["denominator"])

    return agent


def chain(config: Config, model: Model | None = None) -> Chain:
    """DP-FedSGD's round: the config's participation, DP-SGD inside each agent (the
    instance-level mechanism), no server clipping or noise, the plain sum, the server's step
    over the realised cohort (``model`` None: the chain checked without a client)."""
    one_round = dataclasses.replace(config, rounds=1)
    client = updates.LocalDpSgd(None if model is None else agent_update(model, one_round))
    return Chain(participation=fedavg.participation_stage(config), client_update=client,
                 clipping=clipping.NoClip(), aggregation=aggregation.PlainSum(),
                 noise=stage_noise.NoNoise(), server_update=fedavg.server_stage(config, "sampled"))


def make_round(model: Model, config: Config, data: StackedData, rates, denominators, *,
               chunk_size: int | None = None, mesh=None, cohort: str = "gather",
               pass_size: int | None = None,
               rounds_per_call: int | str = "auto") -> rounds.RoundRunner:
    """The round as a :class:`rounds.RoundRunner`: ``runner(key, view) -> (view, metrics)``
    (``view = {"params", "stages"}``), ``runner.last_indices`` the agents that took part."""
    return rounds.RoundRunner(chain(config, model), Setup(data.num_agents, config.rounds), data,
                              chunk_size=chunk_size, mesh=mesh, cohort=cohort,
                              pass_size=pass_size,
                              extras={"rate": rates, "denominator": denominators},
                              participation=True, rounds_per_call=rounds_per_call,
                              diagnostics=config.diagnostics)


# --------------------------------------------------------------------------- privacy

def _steps(config: Config, n: int, participation) -> np.ndarray:
    if participation is None:
        return np.full(n, config.rounds * config.local.steps, np.int64)
    part = np.asarray(participation).reshape(-1)
    if part.shape != (n,) or part.dtype.kind not in "iu" or np.any(part < 0) \
            or np.any(part > config.rounds):
        raise ValueError(f"participation must hold {n} integers in [0, {config.rounds}] (rounds "
                         f"each agent took part in), got {part.tolist()[:10]}")
    return part.astype(np.int64) * config.local.steps


def dp_events(config: Config, counts, participation=None) -> list:
    """Equation (3) for every agent: ``SelfComposed(PoissonSampled(p_i, Gaussian(z)), E T_i)``."""
    rates = record_sampling_rates(config, counts)
    steps = _steps(config, len(rates), participation)
    return [accounting.sampled_gaussian_event(config.noise_multiplier, float(p), int(s))
            for p, s in zip(rates, steps)]


def worst_agents(config: Config, counts, participation=None) -> np.ndarray:
    """Indices of the agents that can be the worst: not dominated in (p_i, steps_i).

    Epsilon of (3) grows with the sampling rate and with the number of steps, so an agent with
    both no larger than another's can never be the worst; one agent per distinct (p, steps) pair
    (:func:`fedjax_dp.privacy.calibration.worst_members` with one unit).
    """
    rates = record_sampling_rates(config, counts)
    steps = _steps(config, len(rates), participation)
    return calibration.worst_members(rates[:, None], np.asarray(steps)[:, None])


def instance_ledger(config: Config, counts, participation=None) -> PrivacyLedger:
    """Instance-level guarantee: parallel composition over agents (worst agent), from the local
    sizes ``counts [N]`` and the rounds each agent took part in, ``participation [N]`` (None:
    every round, an upper bound). Only the agents that can be the worst (:func:`worst_agents`)
    are recorded as members; their indices are in the entry's note.
    """
    events = dp_events(config, counts, participation)
    keep = worst_agents(config, counts, participation)
    note = (f"DP-SGD in each of {len(events)} agents; parallel composition over disjoint local "
            f"data; members = agents {keep.tolist()[:20]}{' ...' if len(keep) > 20 else ''} "
            "(the others are dominated in sampling rate and steps)")
    return PrivacyLedger().add_parallel(UNIT, [events[i] for i in keep], relation=RELATION,
                                        sensitivity=config.clip_norm, note=note)


# --------------------------------------------------------------------------- the protocol

@dataclasses.dataclass(frozen=True)
class Context:
    """The static part of a DP-FedSGD run's state."""

    agents: StackedData
    model: Model
    round_fn: rounds.RoundRunner
    rates: jax.Array                   # [N] p_i
    denominators: jax.Array            # [N] p_i n_i


def init(key: jax.Array, data: api.FederatedData, model: Model, config: Config,
         runtime: api.Runtime = api.Runtime()) -> api.State:
    """``values = {"params": model.init(split(key)[0]), "stages": the chain's states,
    "participation": zeros [N]}``."""
    api.check_init(config, Config)
    agents = data.agents
    check_trainable(agents)
    counts = np.asarray(agents.counts)
    rates = jnp.asarray(record_sampling_rates(config, counts), jnp.float32)
    denominators = jnp.asarray(expected_batch_sizes(config, counts), jnp.float32)
    state = rounds.init_rounds(
        key, data, model, chain(config, model), config.rounds, runtime, local=config.local,
        extras={"rate": rates, "denominator": denominators}, participation=True,
        diagnostics=config.diagnostics,
        bytes_per_agent=lambda p: private_grad.per_example_bytes(p, agents.max_size))
    ctx = Context(agents=agents, model=model, round_fn=state.context.round_fn, rates=rates,
                  denominators=denominators)
    return dataclasses.replace(state, context=ctx)


num_steps = fedavg.num_steps


#: the ``seed_dependent_ledger`` hook: :func:`planned_ledger` replays the run's own sampling
#: keys, so a sweep calibrates every seed on its own
seed_dependent_ledger = True


def planned_ledger(config: Config, state: api.State,
                   key: jax.Array) -> Callable[[Config], PrivacyLedger]:
    """The ``planned_ledger`` hook (:class:`fedjax_dp.algorithms.api.Algorithm`): the
    :func:`instance_ledger` the run of root ``key`` will report, before any training. Agent i's
    participation ``T_i = sum_t m_t[i]`` is replayed from the run's own cohort draws
    (the participation stage's coins of ``round_keys(step_key(key, t))[0]``),
    so a calibrated run's epsilon is the target, not an upper bound; the function returned
    takes a config differing only in its noise."""
    counts = np.asarray(state.context.agents.counts)
    n = state.context.agents.num_agents
    stage = state.context.round_fn.chain.participation
    turn_state = state.values["stages"][0]
    participation = np.zeros(n, np.int64)
    for t in range(config.rounds):        # host draws, one per round, as the run makes them
        k_sample = fedavg.round_keys(api.step_key(key, t))[0]
        participation += np.asarray(stage.coins(k_sample, n, turn_state)).astype(np.int64)
        turn_state = stage.advance(turn_state)
    return lambda candidate: instance_ledger(candidate, counts, participation)


def privacy_units(config: Config) -> tuple[str, ...]:
    """The ``privacy_units`` hook (:class:`fedjax_dp.algorithms.api.Algorithm`): ``instance``."""
    return (UNIT,)


def ledger(config: Config, state: api.State) -> PrivacyLedger:
    """:func:`instance_ledger` of the run: local sizes from the data, T_i from
    ``values["participation"]`` (the rounds done so far)."""
    if state is None:
        raise ValueError("dp_fedsgd.ledger needs the run's state (local sizes and participation)"
                         "; without a run use instance_ledger(config, counts)")
    part = np.asarray(state.values["participation"]).astype(np.int64)
    out = instance_ledger(config, np.asarray(state.context.agents.counts), part)
    if config.diagnostics:        # the realised cohort size is covered: agents are sampled
        out.declare_uncovered(    # independently of their records (the unit is a record)
            "diagnostic metrics train_loss, batch_size (the realised Poisson batch sizes), "
            "clipped_fraction and mean_update_norm of every round (history, progress.jsonl)",
            "computed from the agents' records without noise: not private "
            "(algorithm.diagnostics = false leaves them out)")
    return out
