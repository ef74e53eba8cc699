"""AE-DPFL (voting-dpfl Algorithm 2): private aggregation of all agents' predictions by MPC vote.

1. Every agent i trains a local model f_i on its own data D_i, each from its own initialisation,
   in chunks of ``agent_chunk`` agents streamed to the device.
2. The server draws Q queries x_1..x_Q from its unlabelled public data D_G (data-independent).
3. Agent i's ballot for x_t is ``onehot(argmax f_i(x_t))`` (or, with ``abstain_below = tau``,
   the zero vector where ``max softmax f_i(x_t) < tau``: :func:`ballot_fn`); it adds
   ``N(0, sigma^2/N I_C)``; the secure sum carries ``N(0, sigma^2 I_C)`` and only
   ``y_t = argmax`` is released (:func:`fedjax_dp.privacy.vote.mpc_vote`).
4. The server trains the global ("student") model on ``(x_t, y_t)``, t = 1..Q (optionally
   self-trained on the rest of D_G, :mod:`fedjax_dp.train.student`): post-processing.

Privacy (Theorem 5). Gaussian mechanism on the vote sum, noise std ``sigma``, Q queries composed:

* unit ``agent``, relation add/remove one agent's entire local dataset: the agent's one-hot
  ballot disappears, Delta = 1: ``SelfComposed(Gaussian(sigma), Q)``, RDP ``Q alpha/(2 sigma^2)``;
* unit ``instance``, relation add/remove one training record of one agent: that agent's
  prediction may flip from one class to another, Delta = sqrt(2):
  ``SelfComposed(Gaussian(sigma/sqrt(2)), Q)``, RDP ``Q alpha / sigma^2``.

Both hold with abstention: every ballot is still one-hot or zero, so the ledger is the same for
every ``abstain_below``. Data-dependent (Theorem 7 / PATE 2018 Thm 6): only the argmax is
released, so each query's RDP is bounded by GNMax's on the noise-free vote sums; reported under
``<unit>_data_dependent`` with ``data_dependent: true``.

Protocol: ``init`` checks the inputs and draws the queries; three phases, ``local_training``
(``agent_ballots [N, Q]`` int8, -1 where the agent abstains; ``agent_losses [N]``; ``agent_params
[N, ...]`` when kept; ``agents_per_process [P]``, the agents each process trained), ``vote``
(``labels [Q]``, ``clean_vote_sums [Q, C]``) and ``student``
(``params``). Keys, seeds and the streamed vote: :mod:`.voting_dpfl`.

Scale. Each chunk of ``agent_chunk`` agents trains and votes in ONE compiled call
(:func:`_chunk_fn`), agent i with ``split(init, N)[i]`` / ``split(train, N)[i]`` whatever the
chunking. ``agent_ballots`` are private (each agent's noise-free vote); only the vote's argmax
is released.

With ``runtime.mesh`` (host- or device-resident agents) each chunk is split over the mesh's
devices, possibly of several processes: every agent trains and casts its ballots on exactly one
device, each process reading only its own agents' rows; the ballots are gathered to every
process and the vote is the same streamed vote over them, so ballots, counts and labels equal
those without a mesh exactly, the parameters up to float rounding (:mod:`.voting_dpfl`).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from fedjax_dp.core import agent_stream
from fedjax_dp.algorithms import api
from fedjax_dp.algorithms.voting import voting_dpfl
from fedjax_dp.core import for_each_agent, is_on_host, rng, seed_axis
from fedjax_dp.core.lift import (AGENTS, agent_bytes, chunked, num_chunks, resolve_chunk_size,
                                 training_bytes)
from fedjax_dp.core import memory
from fedjax_dp.core import validation
from fedjax_dp.models import Model
from fedjax_dp.privacy import PrivacyLedger
from fedjax_dp.privacy import vote as vote_lib
from fedjax_dp.train import LocalTrainConfig, make_local_update

DESCRIPTION = ("AE-DPFL: MPC vote of all agents' models on public queries, agent/instance DP "
               "(voting-dpfl)")
USES_LOCAL_TRAIN = True
PHASES = ("local_training", "vote", "student")


@dataclasses.dataclass(frozen=True)
class Config(voting_dpfl.VoteConfig):
    """AE-DPFL. ``local`` trains the agents; the ``student_*`` fields train the global model;
    the vote, student and secure aggregation fields: :class:`voting_dpfl.VoteConfig`.

    ``diagnostics`` (default false): the local-training phase also reports ``mean_agent_loss``
    and ``abstain_rate``, computed from the agents' models and data without noise, so the
    ledger then declares them uncovered (an explicit opt-in, as DP-FedAvg's)."""

    sigma: float = 25.0                 # std of the total noise on the vote sum
    # abstention: an agent whose max softmax on a query is < this casts the zero ballot
    # (None: never abstain, the paper's rule). Sensitivities unchanged (see ``ballot_fn``).
    abstain_below: float | None = None
    local: LocalTrainConfig = LocalTrainConfig()
    diagnostics: bool = False           # the non-private local-phase metrics: an explicit opt-in

    FIELDS = {"abstain_below": validation.Float(0.0, 1.0, low_open=True, optional=True),
              "local": validation.Instance(LocalTrainConfig),
              "diagnostics": validation.Bool()}

    def __post_init__(self):
        super().__post_init__()         # every field, secure aggregation, the student
        check_abstain_below("algorithm.abstain_below", self.abstain_below)
        if not isinstance(self.local, LocalTrainConfig):
            raise ValueError("local must be a LocalTrainConfig")


def check_abstain_below(name: str, value) -> float | None:
    """``None`` or a number in ``(0, 1]`` (NaN, booleans and strings rejected); returns a float."""
    if value is None:
        return None
    ok = not isinstance(value, bool) and isinstance(value, (int, float, np.integer, np.floating))
    if not (ok and 0.0 < float(value) <= 1.0):     # NaN fails the comparison
        raise ValueError(f"{name} must be None (never abstain) or a number in (0, 1] (an agent "
                         f"abstains where its max softmax is below it), got {value!r}")
    return float(value)


def ballot_fn(model: Model, abstain_below: float | None = None):
    """``(agent params [a, ...], queries [q, ...]) -> ballots [a, q, C]``.

    ``abstain_below = None`` (the paper's rule): ``onehot(argmax f_i(x))``; ``tau`` in
    ``(0, 1]``: that one-hot if ``max softmax f_i(x) >= tau``, else zero (``tau <= 1/C`` never
    abstains).

    Every ballot is one-hot or zero, so the vote sum's sensitivity is unchanged by abstention:
    Delta = 1 (add/remove one agent) and sqrt(2) (add/remove one record of one agent: the ballot
    moves between ``e_c``, ``e_c'`` and ``0``). Cached per (model, abstain_below).
    """
    return _ballot_fn(model, check_abstain_below("abstain_below", abstain_below))


@functools.lru_cache(maxsize=32)
def _ballot_fn(model: Model, abstain_below: float | None):
    def ballots(params, queries):
        logits = jax.vmap(model.logits, in_axes=(0, None))(params, queries)   # [a, q, C]
        onehot = jax.nn.one_hot(jnp.argmax(logits, -1), model.num_classes, dtype=jnp.float32)
        if abstain_below is None:
            return onehot
        confident = jnp.max(jax.nn.softmax(logits.astype(jnp.float32), -1), -1) >= abstain_below
        return jnp.where(confident[..., None], onehot, 0.0)                   # zero: abstain
    return ballots


def sensitivities() -> dict[str, float]:
    """``{'agent': 1, 'instance': sqrt(2)}`` (Theorem 5)."""
    return {unit: vote_lib.vote_sensitivity(unit, "one_hot") for unit in ("agent", "instance")}


def vote_ledger(config: Config, clean_vote_sums: np.ndarray | None = None,
                sigma: float | None = None) -> PrivacyLedger:
    """Agent- and instance-level guarantees of Q votes at :func:`sensitivities`
    (:func:`voting_dpfl.vote_ledger`)."""
    return voting_dpfl.vote_ledger(config, clean_vote_sums, sigma, sensitivities(), "AE-DPFL")


# --------------------------------------------------------------------------- the protocol

def init(key: jax.Array, data: api.FederatedData, model: Model, config: Config,
         runtime: api.Runtime = api.Runtime()) -> api.State:
    """Checks, key streams and the Q queries (:func:`voting_dpfl.init_context`); no training."""
    api.check_init(config, Config, data)
    ctx = voting_dpfl.init_context(key, data, model, config, runtime)
    return api.State(step=0, values={}, context=ctx)


num_steps = api.phase_steps(PHASES)


def step(state: api.State, key: jax.Array | None = None) -> tuple[api.State, dict]:
    """Run the next phase (``key`` unused: each phase has its named stream, see the module)."""
    phase = voting_dpfl.check_step(state, PHASES)
    ctx: voting_dpfl.Context = state.context
    cfg = ctx.config
    if phase == "local_training":
        values, metrics = _local_training(state)
    elif phase == "vote":            # the stored ballots, with or without runtime.mesh
        ballots = state.values["agent_ballots"]                                     # [N, Q]
        size = voting_dpfl.agent_chunk(cfg, ctx.data.agents.num_agents)
        values, metrics = voting_dpfl.streamed_vote_phase(
            state, ballot_blocks([ballots], size, batched=False), num_chunks(len(ballots), size))
    else:
        values, metrics = voting_dpfl.student_phase(state)
    return voting_dpfl.advance(state, values, phase, metrics)


def ballot_dtype(num_classes: int):
    """The compact integer type of a stored ballot (class index, -1 = abstain)."""
    return np.int8 if num_classes <= 127 else np.int16 if num_classes <= 32767 else np.int32


def _local_training(state: api.State) -> tuple[dict, dict]:
    """Train the agents chunk by chunk and keep each agent's ballot per query (not its model).

    Chunk c (agents ``[c S, (c + 1) S)``, padded to S) trains as :func:`_chunk_fn` says and
    stores each agent's class index per query (-1: abstention) as ``agent_ballots [N, Q]`` in
    :func:`ballot_dtype`; device-resident agents within :data:`KEEP_PARAMS_BYTES` also keep
    ``agent_params [N, ...]``. With ``runtime.mesh`` each agent trains on one device of one
    process (:func:`_train_and_vote`). The S = 1 case of :func:`_train_and_vote`.
    """
    return _train_and_vote([state], None)[0]


def _train_and_vote(states: list[api.State], plan: voting_dpfl.SeedPlan | None
                    ) -> list[tuple[dict, dict]]:
    """:func:`_local_training` of S seeds (``plan``; None: one seed, unbatched call): one host
    loop over the chunks, each chunk trained and made to vote for all seeds in ONE compiled call
    (:func:`_chunk_fn`), the agents' keys computed inside it from their global indices, so a run
    compiles this one function whatever N.

    With ``runtime.mesh`` (one seed: :func:`voting_dpfl.seed_plan` gives no plan then) every
    chunk is split over the mesh (:func:`_training_calls`), each agent trained on one device of
    one process, and the chunk's ballots and losses are gathered to every process
    (:func:`voting_dpfl.to_host`); the kept parameters stay global arrays split over the mesh.
    ``agents_per_process``: :class:`voting_dpfl.AgentCount`."""
    c0: voting_dpfl.Context = states[0].context
    num, n, q = len(states), c0.data.agents.num_agents, len(c0.query_indices)
    calls = _training_calls(states, plan)
    fn, keys, queries, size = calls["fn"], calls["keys"], calls["queries"], calls["size"]
    ballots = np.empty((num, n, q), calls["dtype"])                               # [S, N, Q]
    losses = np.empty((num, n), np.float32)                                       # [S, N]
    kept, count = [], voting_dpfl.AgentCount(c0.runtime.mesh)

    def collect(pending):
        chunk, idx, loss = pending
        stop = chunk.start + chunk.num_real
        idx, loss = voting_dpfl.to_host(idx), voting_dpfl.to_host(loss)
        if plan is None:
            idx, loss = idx[None], loss[None]
        ballots[:, chunk.start:stop] = idx[:, :chunk.num_real]
        losses[:, chunk.start:stop] = loss[:, :chunk.num_real]

    pending = None
    with c0.runtime.progress.task("local training", total=num_chunks(n, size),
                                  unit="chunk") as task:
        for chunk in count.counted(calls["chunks"]):
            a = chunk.agents
            args = (*keys, chunk.ids, a.x, a.y, a.mask, a.counts, queries)
            if plan is None:
                memory.check_call(fn, *args, drivers=calls["drivers"],
                                  what=f"local training and ballots of a chunk of {size} "
                                       f"agents on {q} queries")
            out = fn(*args)                                       # ([S,] size, Q), ([S,] size)
            if calls["keep_params"]:
                kept.append(out[2] if plan is None else seed_axis.unstack_seeds(out[2], num))
            if pending is not None:          # fetch the previous chunk while this one computes
                collect(pending)
                task.update(1)
            pending = (chunk, out[0], out[1])
        if pending is not None:
            collect(pending)
            task.update(1)
    return _training_outputs(c0.config, ballots, losses, kept if calls["keep_params"] else None,
                             plan, size, n, count.per_process())


def _training_calls(states: list[api.State], plan: voting_dpfl.SeedPlan | None) -> dict:
    """What :func:`_train_and_vote` loops with: the compiled call ``fn`` (:func:`_chunk_fn`), its
    ``keys`` and ``queries``, the ``chunks`` stream, the chunk ``size``, ``keep_params``, the
    ballots' ``dtype`` and the memory ``drivers``. With ``runtime.mesh`` the chunks are global
    arrays split over it (``size`` rounded up to a multiple of its devices,
    :func:`voting_dpfl.mesh_chunk`; ``inner`` per device), the queries a host array
    (replicated), and ``fn`` a ``shard_map`` over the agent axis."""
    ctxs: list[voting_dpfl.Context] = [st.context for st in states]
    c0 = ctxs[0]
    cfg, model, mesh = c0.config, c0.model, c0.runtime.mesh
    datas = [c.data.agents for c in ctxs]
    n = datas[0].num_agents
    size = voting_dpfl.mesh_chunk(voting_dpfl.agent_chunk(cfg, n), mesh)
    per_device = size if mesh is None else size // mesh.shape[AGENTS]
    keep_params = _keeps_params(datas[0], model, c0.runtime)
    inner = resolve_chunk_size(c0.runtime.chunk_size, num_agents=per_device, capped=True,
                               bytes_per_agent=training_bytes(_param_shapes(model)))
    dtype = np.dtype(ballot_dtype(model.num_classes)).name
    queries = [np.asarray(c.x_public[c.query_indices]) for c in ctxs]
    if mesh is None:
        queries = [jax.device_put(x) for x in queries]
    gather = plan is None and mesh is None and not is_on_host(datas[0])
    fn = _chunk_fn(model, cfg.local, inner, cfg.abstain_below, cfg.query_chunk, dtype, n,
                   keep_params, "single" if plan is None else plan.agents_axis, gather, mesh)
    if plan is None:
        keys = (c0.keys["init"], c0.keys["train"])
        # device-resident agents: every call reads its chunk's rows itself (no slicing program)
        chunks = agent_stream.chunks(datas[0], size, take=not gather, mesh=mesh)
        queries = queries[0]
    else:
        keys = tuple(jnp.stack([c.keys[s] for c in ctxs]) for s in ("init", "train"))  # [S]
        chunks = agent_stream.chunks(datas if plan.agents_axis == 0 else datas[0], size,
                                     stack=plan.agents_axis == 0)
        queries = jnp.stack(queries)                                             # [S, Q, ...]
    return dict(fn=fn, keys=keys, queries=queries, chunks=chunks, size=size, dtype=dtype,
                keep_params=keep_params,
                drivers=_memory_drivers(cfg, c0.runtime.chunk_size, inner, size, model))


def _training_outputs(cfg: Config, ballots: np.ndarray, losses: np.ndarray, kept: list | None,
                      plan: voting_dpfl.SeedPlan | None, size: int, n: int,
                      per_process: np.ndarray) -> list[tuple[dict, dict]]:
    """Each seed's ``(values, metrics)`` of the local-training phase (:func:`_local_training`)."""
    outs = []
    for s in range(len(ballots)):
        values = {"agent_ballots": ballots[s], "agent_losses": losses[s],
                  "agents_per_process": per_process}
        if kept is not None:
            mine = kept if plan is None else [p[s] for p in kept]
            values["agent_params"] = (mine[0] if len(mine) == 1 and size == n
                                      else _concat_agents(mine, n))
        # public: the config's chunk, at most N (also with a mesh, whose chunks are rounded up
        # to its devices: the record is the run's without one)
        metrics = {"agent_chunk": voting_dpfl.agent_chunk(cfg, n)}
        if cfg.diagnostics:                      # not private: declared by ``ledger``
            abstained = (float(np.mean(ballots[s] < 0)) if cfg.abstain_below is not None
                         else 0.0)
            metrics.update(mean_agent_loss=float(losses[s].mean()), abstain_rate=abstained)
        outs.append((values, metrics))
    return outs


#: device-resident agents keep their trained parameters (``agent_params``) when all N of them
#: take at most this many bytes (with ``runtime.mesh`` too: then split over the mesh).
KEEP_PARAMS_BYTES = 256 << 20


def _keeps_params(data, model: Model, runtime: api.Runtime) -> bool:
    """Whether the local-training phase keeps ``agent_params`` (:data:`KEEP_PARAMS_BYTES`)."""
    if is_on_host(data):
        return False
    return data.num_agents * agent_bytes(_param_shapes(model)) <= KEEP_PARAMS_BYTES


@functools.lru_cache(maxsize=32)
def _param_shapes(model: Model):
    """One agent's parameter shapes (traced abstractly: nothing runs or compiles)."""
    return jax.eval_shape(model.init, jax.eval_shape(lambda: jax.random.key(0)))


@functools.partial(jax.jit, static_argnums=1)
def _concat_agents(chunks: list, n: int):
    """The kept parameters of the chunks ``[size, ...]`` each, concatenated and cut to N."""
    return jax.tree.map(lambda *ls: jnp.concatenate(ls)[:n], *chunks)


def _memory_drivers(cfg: Config, chunk_size, inner: int | None, size: int, model: Model):
    """The config keys (-> values) named when a chunk's training and ballots cannot fit in
    memory (:mod:`fedjax_dp.core.memory`), computed on refusal only."""
    return lambda: {"algorithm.agent_chunk": cfg.agent_chunk or f"default -> {size}",
                    "run.chunk_size": memory.chunk_driver(chunk_size, inner),
                    "train.batch_size": cfg.local.batch_size,
                    "algorithm.query_chunk": cfg.query_chunk or "none: all at once",
                    **memory.model_driver(model)}


def ballot_blocks(ballots: Sequence[np.ndarray], size: int, *, batched: bool = True):
    """``(ballots [(S,) size, Q], agent ids [size], valid [size])`` per chunk of S seeds' stored
    ballots ``[N, Q]`` each (padding: -1, the zero ballot); ``batched`` False: one seed, no seed
    axis. Ids and ``valid`` are host arrays (no per-chunk compilation)."""
    for chunk in agent_stream.chunks(tuple(ballots), size, fill=-1):
        block = seed_axis.stack_seeds(chunk.agents) if batched else chunk.agents[0]
        yield block, chunk.ids, chunk.valid


def _ballot_indices(model: Model, abstain_below: float | None, query_chunk: int | None,
                    dtype: str):
    """``(params [S, ...], queries [Q, ...]) -> int [S, Q]``: each agent's voted class (-1 =
    abstain), :func:`ballot_fn` in blocks of ``query_chunk`` queries (None: all at once)."""
    cast = _ballot_fn(model, abstain_below)

    def index(params, queries):
        b = cast(params, queries)                                               # [S, q, C]
        return jnp.where(jnp.sum(b, -1) > 0, jnp.argmax(b, -1), -1).astype(dtype)

    def fn(params, queries):
        q = queries.shape[0]
        qc = q if query_chunk is None else min(query_chunk, q)
        if qc == q:
            return index(params, queries)
        blocks = jax.lax.map(lambda qb: index(params, qb), chunked(queries, qc))  # [B, S, qc]
        return jnp.moveaxis(blocks, 0, 1).reshape(blocks.shape[1], -1)[:, :q]

    return fn


@functools.lru_cache(maxsize=32)
def _chunk_fn(model: Model, local: LocalTrainConfig, inner: int | None,
              abstain_below: float | None, query_chunk: int | None, dtype: str,
              num_agents: int, keep_params: bool, agents_axis: int | None | str = "single",
              gather: bool = False, mesh=None):
    """The one compiled call of a chunk: ``(init key, train key, agent ids [size], x, y, mask,
    counts, queries [Q, ...]) -> (ballot indices [size, Q], mean losses [size] (, params))``.

    Agent i (``ids``) starts from ``model.init(split(init, N)[i])`` and trains with
    ``split(train, N)[i]`` (:func:`fedjax_dp.core.rng.agent_keys`), ``inner`` agents at a time,
    then casts its ballots (:func:`ballot_fn`, as indices in ``dtype``). ``agents_axis`` None
    or 0: vmapped over a leading seed axis of the keys and queries (and, with 0, of the agents'
    data); ``"single"``: one seed, unbatched.
    ``gather``: ``x, y, mask, counts`` are the whole (device-resident) population and the call
    takes the rows ``ids`` (rows past N: empty agents). ``mesh`` (``"single"`` only, not with
    ``gather``): a ``shard_map`` over the agent axis of ``ids, x, y, mask, counts`` and of every
    output (keys and queries replicated), each device training and casting the ballots of its
    own slice of the chunk, ``inner`` agents at a time."""
    update = for_each_agent(make_local_update(model, local), 0, chunk_size=inner)
    indices = _ballot_indices(model, abstain_below, query_chunk, dtype)

    def fn(init_key, train_key, ids, x, y, mask, counts, queries):
        if gather:
            x, y, mask, counts = (jnp.take(a, ids, axis=0, mode="fill", fill_value=0)
                                  for a in (x, y, mask, counts))
        params = jax.vmap(model.init)(rng.agent_keys(init_key, ids, num_agents))
        params, loss = update(rng.agent_keys(train_key, ids, num_agents), params, x, y, mask,
                              counts)
        out = (indices(params, queries), loss)
        return out + (params,) if keep_params else out

    if agents_axis == "single" and mesh is None:
        return jax.jit(fn)
    if agents_axis == "single":
        split = P(AGENTS)
        return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=(P(), P()) + (split,) * 5 + (P(),),
                                     out_specs=split, check_vma=False))
    ax = agents_axis
    return jax.jit(jax.vmap(fn, in_axes=(0, 0, None, ax, ax, ax, ax, 0)))


# --------------------------------------------------------------------------- seeds together

batch_plan = voting_dpfl.seed_plan     # None: runtime.mesh, secure aggregation, other shapes


def batched_step(plan: voting_dpfl.SeedPlan, states: list[api.State], keys=None):
    """Step S seeds of AE-DPFL together (:func:`voting_dpfl.batched_phase`); seed s equals its
    own run."""
    phases = {"local_training": lambda p, st: _train_and_vote(st, p), "vote": _vote_seeds,
              "student": voting_dpfl.student_phase_seeds}
    return voting_dpfl.batched_phase(PHASES, phases, plan, states)


def _vote_seeds(plan: voting_dpfl.SeedPlan, states: list[api.State]
                ) -> list[tuple[dict, dict]]:
    """The streamed vote of S seeds over their stored ballots
    (:func:`voting_dpfl.streamed_vote_seeds`: each chunk's ballots stacked ``[S, size, Q]``, one
    vmapped tally add per chunk)."""
    c0: voting_dpfl.Context = states[0].context
    stored = [st.values["agent_ballots"] for st in states]                        # [N, Q] each
    size = voting_dpfl.agent_chunk(c0.config, c0.data.agents.num_agents)
    return voting_dpfl.streamed_vote_seeds(states, ballot_blocks(stored, size),
                                           num_chunks(len(stored[0]), size))


output = voting_dpfl.output


#: The local-training phase's diagnostics (``Config.diagnostics``) as a release the ledger does
#: not cover (:meth:`PrivacyLedger.declare_uncovered`): ``(release, reason)``.
DIAGNOSTICS_UNCOVERED = (
    "diagnostic metrics mean_agent_loss and abstain_rate of the local-training phase "
    "(history, progress.jsonl)",
    "computed from the agents' models and data without noise: not private "
    "(algorithm.diagnostics = false leaves them out)")


def ledger(config: Config, state: api.State | None = None) -> PrivacyLedger:
    """:func:`vote_ledger` with the run's noise-free sums (data-independent part only without a
    state, before the vote, or without ``config.data_dependent``). With ``config.diagnostics``
    the local-training phase's metrics are declared as releases it does not cover."""
    out = vote_ledger(config, voting_dpfl.clean_sums(state))
    if config.diagnostics:
        out.declare_uncovered(*DIAGNOSTICS_UNCOVERED)
    return out
