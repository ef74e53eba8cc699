"""What AE-DPFL and kNN-DPFL (voting-dpfl Algorithms 2 and 3) share on the protocol of
:mod:`fedjax_dp.algorithms.api`: config and input checks, the server's query selection, the vote
phase and the student phase, and the diagnostics they report (see docs/voting_dpfl.md).

Both are one-shot: ``init`` draws the Q queries, then ``step`` runs one phase at a time
(``PHASES`` of each module), so a run can be checkpointed after local training or the vote. Every
phase draws from a named stream of the run key (:func:`fedjax_dp.core.stream`: ``init``,
``train``, ``queries``, ``feature_map``, ``vote``, ``student``), derived once in ``init``; the
step keys of :func:`fedjax_dp.algorithms.api.run` are not used.

The vote. Both vote through :func:`streamed_vote_phase`: ballots arrive chunk by chunk and are
added to :class:`fedjax_dp.privacy.vote.Tally` (exact integer counts; the agents' noise shares
``N(0, sigma^2/N I_C)`` from ``fold_in(fold_in(vote, i), t)`` summed in agent order), so labels
and clean sums are bitwise the same for every chunking, for host- or device-resident data and
with or without ``runtime.mesh``.

``runtime.mesh`` (an ``agents`` mesh, possibly spanning several processes under
``jax.distributed``): the agents are streamed by :func:`fedjax_dp.core.agent_stream.chunks`
with ``mesh=`` (host- or device-resident alike; the chunk size rounded up to a multiple of the
mesh's device count, :func:`mesh_chunk`), so every chunk is a global array split over the
devices and each process reads only its own devices' rows; each agent's work (AE-DPFL's local
training and ballots, kNN-DPFL's features and neighbour counts) runs in a ``shard_map`` on
exactly one device, its keys computed from its global index as without a mesh. AE-DPFL gathers
the ballots to every process (:func:`to_host`, the stored ``agent_ballots``) and votes on them
as without a mesh; kNN-DPFL's chunk sums are ``psum``-ed across the devices (exact integers) and
added to the same tally, on every process. ``State.values["agents_per_process"]`` counts the real
agents each process worked on (:class:`AgentCount`; ``[N]`` without a mesh: this process did
them all). Secure aggregation (``config.aggregation = "secagg"``, not with ``runtime.mesh``) shares
each noisy ballot among ``secagg_talliers`` talliers (shares from the ``secagg`` stream,
:mod:`fedjax_dp.privacy.secagg_shares`); labels equal the plain vote's unless two noisy sums are
within the fixed-point error ``N 2^-(f+1)``.

Privacy: ``SelfComposed(Gaussian(sigma / Delta), Q)`` (units and Delta: each algorithm's
module). With dropouts (``secagg_dropout = p``: independent coins from ``fold_in(k_drop, i)``,
the talliers' top-up restoring the noise to sigma^2) the same ledger is an upper bound, nothing
added to delta: docs/secagg.md, "Dropouts and their privacy effect".

``State.values``: ``labels [Q]`` (released by the vote), ``clean_vote_sums [Q, C]`` (noise-free,
for the data-dependent analysis ONLY; present when ``config.data_dependent``) and ``params`` (the
student). :func:`batched_phase` steps S seeds together, seed s equal to its own run.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from fedjax_dp.core import agent_stream
from fedjax_dp.core.stacked import check_agents
from fedjax_dp.algorithms import api
from fedjax_dp.privacy.secagg import SecAggFields
from fedjax_dp.train import student as student_lib
from fedjax_dp.core import StackedData, is_on_host, rng, seed_axis, validation
from fedjax_dp.core.lift import AGENTS, resolve_chunk_size
from fedjax_dp.models import Model
from fedjax_dp.privacy import PrivacyLedger, accounting, secagg, secagg_shares
from fedjax_dp.privacy import vote as vote_lib
from fedjax_dp.train import check_trainable

from fedjax_dp.algorithms.voting.mesh_chunks import AgentCount, mesh_chunk, to_host  # noqa: F401

#: The named key streams of a voting run (one per random draw, never reused).
STREAMS = ("init", "train", "queries", "feature_map", "vote", "student", "secagg")


#: Types and ranges of the vote fields shared by the AE-DPFL and kNN-DPFL Configs.
VOTE_FIELDS = {"sigma": validation.Float(0.0, accounting.GAUSSIAN_NOISE_RANGE[1],
                                         low_open=True),
               "num_queries": validation.Int(1),
               "agent_chunk": validation.Int(1, optional=True),
               "query_chunk": validation.Int(1, optional=True),
               "data_dependent": validation.Bool(),
               "vote_noise": validation.Choice(vote_lib.NOISE_MODES)}


@dataclasses.dataclass(frozen=True)
class VoteConfig(student_lib.StudentSettings, SecAggFields):
    """The fields AE-DPFL and kNN-DPFL share: the vote's, the student's and secure aggregation's
    (each Config re-declares ``sigma``, whose default differs).

    ``data_dependent`` (default false) also reports the GNMax data-dependent epsilons (units
    ``<unit>_data_dependent``). They are computed from the noise-free vote sums and released
    without noise, so a run that reports them declares them uncovered (every guarantee says
    ``covers_all_releases: false``); the default run's guarantees cover every release."""

    sigma: float = 1.0                  # std of the total noise on the vote sum
    num_queries: int = 500              # Q public queries labelled by the vote
    # agents per streamed chunk; None: agent_stream.DEFAULT_CHUNK. Results do not depend on it.
    agent_chunk: int | None = None
    query_chunk: int | None = None      # queries per block of the ballots (None: all at once)
    # also report the GNMax data-dependent epsilon: an explicit opt-in (computed from the
    # noise-free vote sums, it is itself not private: every guarantee then says
    # covers_all_releases: false)
    data_dependent: bool = False
    # the vote's noise: every agent's share ("per_agent") or the secure sum's at once
    # ("aggregate": same distribution of the released labels; Q C draws instead of N Q C)
    vote_noise: str = "per_agent"

    FIELDS = VOTE_FIELDS

    def __post_init__(self):
        """Validate every field (:func:`validation.check_config`: names the field, converts
        2.0 -> 2), the secure aggregation settings and the student's."""
        validation.check_config(self, "algorithm")
        self.check_aggregation()
        self.student  # validates the student_* fields
        self.semi_supervised


def select_queries(key: jax.Array, num_public: int, num_queries: int) -> np.ndarray:
    """Q distinct indices of the public set, uniformly at random (independent of private data)."""
    num_queries = validation.check_int("algorithm.num_queries", num_queries, minimum=1)
    if num_queries > num_public:
        raise ValueError(f"algorithm.num_queries must be <= the number of public records "
                         f"({num_public}), got {num_queries}")
    return np.sort(np.asarray(_first_of_permutation(key, num_public, num_queries)))


@functools.partial(jax.jit, static_argnums=(1, 2))
def _first_of_permutation(key: jax.Array, n: int, k: int) -> jax.Array:
    """``jax.random.permutation(key, n)[:k]`` as one compiled call (eagerly: four)."""
    return jax.random.permutation(key, n)[:k]


def check_run_args(data: api.FederatedData, model: Model) -> np.ndarray:
    """Host-side checks shared by the voting algorithms; returns ``x_public`` as an array."""
    agents = data.agents
    check_trainable(agents)
    x_public = data.public_array("the server's unlabelled public data (the queries come from it)")
    if tuple(model.feature_shape) != agents.feature_shape:
        raise ValueError(f"model feature shape {model.feature_shape} must equal the agents' "
                         f"{agents.feature_shape}")
    return x_public


@dataclasses.dataclass(frozen=True)
class Context:
    """The static part of a voting run's state; ``extra``: kNN-DPFL's feature map."""

    data: api.FederatedData
    model: Model
    config: Any
    runtime: api.Runtime
    x_public: np.ndarray               # [P, ...] the server's unlabelled data
    query_indices: np.ndarray          # [Q] indices into x_public
    keys: dict                         # {stream name: key}
    extra: Any = None


def init_context(key: jax.Array, data: api.FederatedData, model: Model, config,
                 runtime: api.Runtime, *, extra_checks: Callable | None = None) -> Context:
    """Checks (before any work; the caller's :func:`api.check_init` checks the types), the
    named key streams and the Q queries of a voting run."""
    x_public = check_run_args(data, model)
    check_agents(data.agents)          # host data: finite features, read in slices
    if extra_checks is not None:
        extra_checks(data)
    vote_lib.check_vote_args(config.sigma, data.num_agents, config.num_queries,
                             model.num_classes, config.agent_chunk, config.query_chunk,
                             config.vote_noise)
    check_secagg_vote(config, data.num_agents, runtime)
    keys = {name: rng.stream(key, name) for name in STREAMS}
    qidx = select_queries(keys["queries"], len(x_public), config.num_queries)
    return Context(data=data, model=model, config=config, runtime=runtime, x_public=x_public,
                   query_indices=qidx, keys=keys)


def check_secagg_vote(config, num_agents: int, runtime: api.Runtime) -> None:
    """Secure-aggregation checks before any work: not with ``runtime.mesh``; the vote sum must
    fit the ring. Per coordinate ``0 <= sum_i b_i <= N`` (every ballot has L1 norm <= 1) and the
    noise sum is ``N(0, sigma^2)``, bounded by ``10 sigma`` except with probability < 2e-23 per
    coordinate: ``N + 10 sigma < 2^(31-f) - N 2^-(f+1)``."""
    sa = config.secagg
    if sa is None:
        return
    if runtime.mesh is not None:
        raise ValueError("algorithm.aggregation = 'secagg' is simulated without runtime.mesh; "
                         "leave runtime.mesh unset (the sharded chunks have no "
                         "secure-aggregation path)")
    n = int(num_agents)
    secagg.check_range("the vote sum bound N + 10 sigma", n + 10.0 * float(config.sigma),
                       sa.frac_bits, n + 1)


def vote_ledger(config, clean_vote_sums: np.ndarray | None, sigma: float | None,
                sensitivities: dict[str, float], note: str) -> PrivacyLedger:
    """The guarantees of Q votes of an AE-DPFL / kNN-DPFL ``config`` at the per-unit
    ``sensitivities`` (+ the data-dependent ones given the noise-free sums ``[Q, C]``).
    ``sigma``: the noise std accounted (default ``config.sigma``, also with dropouts)."""
    sigma = config.sigma if sigma is None else sigma
    return vote_lib.vote_ledger(sigma, config.num_queries, sensitivities,
                                clean_vote_sums=clean_vote_sums,
                                note=note + secagg_note(config))


def agent_chunk(config, num_agents: int) -> int:
    """Agents per streamed chunk: ``config.agent_chunk``, or :data:`agent_stream.DEFAULT_CHUNK`
    when None, at most ``num_agents``."""
    return resolve_chunk_size(config.agent_chunk, num_agents=num_agents,
                              default=agent_stream.DEFAULT_CHUNK, capped=True)


def secagg_note(config) -> str:
    """The ledger note's secure-aggregation part ('' for the plain sum)."""
    sa = config.secagg
    if sa is None:
        return ""
    out = f"; secure aggregation: {sa.talliers} talliers, {sa.frac_bits} fraction bits"
    if sa.dropout:
        out += (f", independent dropouts p={sa.dropout:g} with the noise topped up to sigma by "
                f"the talliers (same bound as without dropouts)")
    return out


# --------------------------------------------------------------------------- the streamed vote

def streamed_vote_phase(state: api.State, blocks: Iterable[tuple], total: int, *,
                        divisor: float = 1.0, summed: bool = False) -> tuple[dict, dict]:
    """The MPC vote over ballots that arrive in chunks: ``(values, metrics)`` with the released
    ``labels [Q]`` and, if ``config.data_dependent``, the noise-free ``clean_vote_sums [Q, C]``
    (analysis only). Metrics: ``num_queries`` and, with ``data.y_public``, ``vote_accuracy``
    (:func:`vote_metrics`).

    ``blocks`` yields ``(ballots, agent_ids [a], valid [a])`` per chunk of agents (see
    :func:`fedjax_dp.privacy.vote.tally_add`; ``summed``: the ballots already summed over the
    chunk's valid agents, ``[Q, C]``, e.g. a ``psum`` over ``runtime.mesh``, replicated);
    ``total`` is the number of chunks (progress). Noise: ``per_agent`` shares or the sum's at
    once (``aggregate``); clean sums ``counts / divisor`` (float64, analysis only). Every process
    computes the same tally and labels. The S = 1 case of :func:`streamed_vote_seeds`.
    """
    if state.context.config.secagg is not None:
        return _secagg_vote(state, blocks, total, divisor)
    return _streamed_vote([state], blocks, total, divisor, batched=False, summed=summed)[0]


def streamed_vote_seeds(states: Sequence[api.State], blocks: Iterable[tuple], total: int, *,
                        divisor: float = 1.0) -> list[tuple[dict, dict]]:
    """:func:`streamed_vote_phase` of S seeds (no secure aggregation): ``blocks`` yields
    ``(ballots [S, a, ...], agent ids [a], valid [a])``; one vmapped :func:`tally_add` per chunk
    (seed s's noise from its own ``vote`` key), one vmapped :func:`tally_release`."""
    return _streamed_vote(list(states), blocks, total, divisor, batched=True)


def _streamed_vote(states: list, blocks: Iterable[tuple], total: int, divisor: float, *,
                   batched: bool, summed: bool = False) -> list[tuple[dict, dict]]:
    """The streamed vote of S seeds' states (``batched``: every array with a leading seed axis;
    else S = 1 and the single-seed calls, unbatched; ``summed``: :func:`streamed_vote_phase`)."""
    ctxs: list[Context] = [st.context for st in states]
    c0 = ctxs[0]
    cfg = c0.config
    n, c = c0.data.num_agents, c0.model.num_classes
    q = len(c0.query_indices)
    std = np.float32(cfg.sigma / math.sqrt(n))
    step = vote_lib.tally_step_fn(c, cfg.vote_noise == "per_agent", cfg.vote_noise, batched,
                                  summed)
    if batched:
        keys = jnp.stack([ctx.keys["vote"] for ctx in ctxs])                        # [S]
        tally = jax.tree.map(lambda l: np.broadcast_to(l, (len(ctxs),) + l.shape),
                             vote_lib.tally_init(q, c))
    else:
        keys, tally = c0.keys["vote"], vote_lib.tally_init(q, c)
    labels, sigma, div = None, np.float32(cfg.sigma), np.float32(divisor)
    with c0.runtime.progress.task("vote", total=total, unit="chunk") as task:
        for i, (ballots, ids, valid) in enumerate(blocks):
            tally, labels = step(tally, keys, ballots, ids, valid, std, sigma, div,
                                 np.bool_(i == total - 1))
            task.update(1)
    if labels is None or to_host(labels).min() < 0:
        raise RuntimeError(f"the vote's stream gave fewer chunks than its {total}")
    labels = to_host(labels)
    counts = to_host(tally.counts) if cfg.data_dependent else None
    if not batched:
        labels, counts = labels[None], None if counts is None else counts[None]
    outs = []
    for s, (state, ctx) in enumerate(zip(states, ctxs)):
        values = {**state.values, "labels": labels[s]}
        if counts is not None:
            values["clean_vote_sums"] = np.asarray(counts[s], np.float64) / divisor
        outs.append((values, vote_metrics(ctx, labels[s])))
    return outs


def secagg_keys(ctx: Context) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(share key, dropout key, top-up key)``: the three draws of the ``secagg`` stream (the
    agents' shares, their dropout coins, the talliers' top-up noise)."""
    k_share, k_drop, k_top = jax.random.split(ctx.keys["secagg"], 3)
    return k_share, k_drop, k_top


def _secagg_vote(state: api.State, blocks: Iterable[tuple], total: int, divisor: float
                 ) -> tuple[dict, dict]:
    """:func:`streamed_vote_phase` with secure aggregation (see the module docstring)."""
    ctx: Context = state.context
    cfg = ctx.config
    sa = cfg.secagg
    n, c = ctx.data.num_agents, ctx.model.num_classes
    q = len(ctx.query_indices)
    per_agent = cfg.vote_noise == "per_agent"
    key = ctx.keys["vote"]
    k_share, k_drop, k_top = secagg_keys(ctx)
    alive = secagg.survivors(k_drop, n, sa.dropout)                                # [N] host
    alive_d = jnp.asarray(alive)
    std, div = jnp.float32(cfg.sigma / math.sqrt(n)), jnp.float32(divisor)
    tally = vote_lib.tally_init(q, c)._replace(shares=secagg_shares.tally_init(sa.talliers, (q, c)))
    with ctx.runtime.progress.task("vote", total=total, unit="chunk") as task:
        for ballots, ids, valid in blocks:
            tally = vote_lib.secagg_tally_add(tally, key, k_share, ballots, ids, valid, alive_d, std, div,
                                     num_classes=c, per_agent=per_agent,
                                     frac_bits=sa.frac_bits)
            task.update(1)
    extra = None
    if not per_agent:        # the talliers draw the total noise jointly
        extra = vote_lib.aggregate_noise(key, jnp.arange(q), cfg.sigma, c)
    elif not alive.all():    # the talliers top the dropped agents' noise shares up jointly
        extra = vote_lib.top_up_noise(k_top, q, c, cfg.sigma, n, int(alive.sum()))
    labels = np.asarray(secagg_shares.release_labels(tally.shares, extra,
                                                     frac_bits=sa.frac_bits))
    values = {**state.values, "labels": labels}
    if cfg.data_dependent:
        values["clean_vote_sums"] = np.asarray(tally.counts, np.float64) / divisor
    metrics = vote_metrics(ctx, labels)
    # public: the dropout coins are drawn from the secagg key, independently of every record
    metrics["secagg_survivors"] = int(alive.sum())
    return values, metrics


def vote_metrics(ctx: Context, labels: np.ndarray) -> dict:
    """The vote's metrics: ``num_queries`` and, given ``data.y_public``, ``vote_accuracy``.

    Both are covered by the vote's guarantee: ``num_queries`` is the config's Q, and
    ``vote_accuracy`` compares the released (noisy) labels with the labels of the PUBLIC set,
    post-processing of the release with public data only."""
    metrics: dict = {"num_queries": int(len(labels))}
    if ctx.data.y_public is not None:                      # diagnostics only
        truth = np.asarray(ctx.data.y_public)[ctx.query_indices]
        metrics["vote_accuracy"] = float(np.mean(np.asarray(labels) == truth))
    return metrics


def student_phase(state: api.State) -> tuple[dict, dict]:
    """The global model on the released labels (supervised, or self-trained on the rest of the
    public data; post-processing of the release, :mod:`fedjax_dp.train.student`)."""
    ctx: Context = state.context
    cfg = ctx.config
    semi = cfg.semi_supervised
    # supervised: one compiled training; self-training: 1 + rounds of them, one unit each
    with ctx.runtime.progress.task("student", total=student_lib.num_trainings(semi),
                                   unit="model" if semi is None else "round") as task:
        params = student_lib.train_student(ctx.keys["student"], ctx.model, ctx.x_public,
                                           ctx.query_indices, state.values["labels"],
                                           cfg.student, semi, on_round=task.update)
    return {**state.values, "params": params}, {}


def advance(state: api.State, values: dict, phase: str, metrics: dict
            ) -> tuple[api.State, dict]:
    """The next state and the phase's metrics (``phase`` names the step in the record)."""
    return (api.State(step=state.step + 1, values=values, context=state.context),
            {"phase": phase, **metrics})


def check_step(state: api.State, phases: tuple[str, ...]) -> str:
    """The name of the phase ``state`` is at; an error past the last one."""
    if not 0 <= state.step < len(phases):
        raise ValueError(f"state.step must be in [0, {len(phases)}) (phases {list(phases)}), "
                         f"got {state.step}")
    return phases[state.step]


def output(state: api.State) -> api.Output:
    """The student; available once the last phase has run."""
    if "params" not in state.values:
        raise ValueError(f"output needs the finished run (the student is trained in the last "
                         f"phase); state.step is {state.step}")
    return api.Output(model=state.context.model, params=state.values["params"])


def clean_sums(state: api.State | None):
    """The noise-free vote sums of a run (None before the vote or without ``data_dependent``)."""
    return None if state is None else state.values.get("clean_vote_sums")


# --------------------------------------------------------------------------- seeds together
# A voting phase is a host loop over chunks calling compiled functions, so the seeds cannot
# share one pure ``seed_step``: the host loops over the chunks ONCE for all S seeds, every
# compiled call vmapped over a leading seed axis carried only by what differs between the seeds
# (:func:`fedjax_dp.core.seed_axis.share_or_stack`); seed s equals its separate run.

#: ``phase(plan, states) -> [(values, metrics)] per seed``: one phase of S seeds.
PhaseFn = Callable[["SeedPlan", list], list]


@dataclasses.dataclass(frozen=True)
class SeedPlan:
    """How S seeds of one voting configuration share their compiled calls.

    ``agents_axis``: None when every seed has the same agents (one chunk stream, data not
    batched), 0 when they differ (each chunk stacked on a leading seed axis).
    """

    num_seeds: int
    agents_axis: int | None


def _same_agents(datas: Sequence[StackedData]) -> bool:
    """Whether every seed holds the same agents: the same object, or (device-resident data)
    equal arrays. Host data (possibly a memory map) is never read whole to compare."""
    if all(d is datas[0] for d in datas[1:]):
        return True
    if is_on_host(datas[0]):
        return False
    ref = [np.asarray(l) for l in jax.tree.leaves(datas[0])]
    return all(all(np.array_equal(a, np.asarray(b)) for a, b in zip(ref, jax.tree.leaves(d)))
               for d in datas[1:])


def seed_plan(states: Sequence[api.State]) -> SeedPlan | None:
    """The :class:`SeedPlan` of S seeds' states (fresh from ``init``), or None -- the caller runs
    the seeds one by one -- where they cannot share compiled calls: ``runtime.mesh`` (the
    chunks split over it), secure aggregation (per-seed share streams and dropouts, not vmapped),
    different configs, models or runtimes, host- and device-resident agents mixed, or data of
    different shapes (agents, records per agent, public set)."""
    states = list(states)
    if not states or any(s.step != states[0].step for s in states):
        return None
    ctxs: list[Context] = [s.context for s in states]
    c0 = ctxs[0]
    if any(c.config != c0.config or c.model != c0.model or c.runtime != c0.runtime
           for c in ctxs[1:]):
        return None
    if c0.runtime.mesh is not None or c0.config.secagg is not None:
        return None
    datas = [c.data.agents for c in ctxs]
    if len({is_on_host(d) for d in datas}) != 1 or not seed_axis.same_layout(datas):
        return None
    if len({(np.shape(c.x_public), len(c.query_indices)) for c in ctxs}) != 1:
        return None
    return SeedPlan(num_seeds=len(states), agents_axis=None if _same_agents(datas) else 0)


def batched_phase(phases: tuple[str, ...], run_phase: dict[str, PhaseFn], plan: SeedPlan,
                  states: Sequence[api.State], keys=None) -> tuple[list, list[dict]]:
    """The batched step of a voting algorithm (``phases`` and ``run_phase`` bound; ``plan`` from
    :func:`seed_plan`): the next phase of S seeds, ``run_phase[name](plan, states)``. ``keys``
    are unused: each phase draws from the seeds' named streams."""
    states = list(states)
    if len(states) != plan.num_seeds or any(s.step != states[0].step for s in states):
        raise ValueError(f"the seeds' states must be {plan.num_seeds} states at one step, got "
                         f"steps {[s.step for s in states]}")
    phase = check_step(states[0], phases)
    pairs = [advance(st, values, phase, metrics)
             for st, (values, metrics) in zip(states, run_phase[phase](plan, states))]
    return [st for st, _ in pairs], [m for _, m in pairs]


def student_phase_seeds(plan: SeedPlan, states: Sequence[api.State]
                        ) -> list[tuple[dict, dict]]:
    """:func:`student_phase` of S seeds: every training of the S students (the supervised one,
    each self-training round) is one compiled call over the S students
    (:func:`fedjax_dp.train.student.train_students`)."""
    ctxs: list[Context] = [s.context for s in states]
    c0 = ctxs[0]
    semi = c0.config.semi_supervised
    with c0.runtime.progress.task("student", total=student_lib.num_trainings(semi),
                                  unit="model" if semi is None else "round") as task:
        params = student_lib.train_students(
            [ctx.keys["student"] for ctx in ctxs], c0.model, [ctx.x_public for ctx in ctxs],
            [ctx.query_indices for ctx in ctxs], [st.values["labels"] for st in states],
            c0.config.student, semi, on_round=task.update)
    return [({**st.values, "params": p}, {}) for st, p in zip(states, params)]
