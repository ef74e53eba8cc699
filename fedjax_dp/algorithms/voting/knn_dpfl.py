"""kNN-DPFL (voting-dpfl Algorithm 3): every agent votes with its k nearest local neighbours.

1. A data-independent feature map phi (:func:`fit_feature_map`): ``identity`` (flattened
   features), ``random_projection`` (a Gaussian matrix drawn from a key), or ``pca`` fitted on the
   server's *public unlabelled* data only -- never on private data.
2. For query x_t agent i finds the k nearest neighbours of phi(x_t) among its real records
   phi(D_i) (Euclidean; padded rows are never chosen) and votes
   ``b_i(x_t) = (1/k) sum_{j in kNN_i(x_t)} onehot(y_j)``.
3. Noise, secure sum and release of the argmax only, as in AE-DPFL; the student is trained on the
   Q released labels (:mod:`fedjax_dp.train.student`, post-processing).

Two exact searches (``method``, identical ballots, ties: lower index first; ``"auto"`` takes
:func:`fedjax_dp.core.defaults.defaults`): ``"threshold"`` (CPU, :mod:`fedjax_dp.ops.knn_search`,
no sort) and ``"top_k"`` (GPU / TPU: one GEMM per chunk of agents and ``lax.top_k``).

**Normalisation by k.** The ballot is always divided by k, also for an agent with fewer than k
records (its ballot then sums to ``n_i / k < 1``): normalising by ``min(k, n_i)`` would let one
record move a ballot by up to 1 and break the sensitivity below. :func:`init` rejects ``k``
larger than the smallest agent's record count (almost always a configuration mistake);
:func:`knn_ballots` itself is defined for any sizes, which the brute-force sensitivity test uses.

Privacy (Theorem 5 and appendix C.1), Gaussian mechanism on the vote sum, Q queries:

* unit ``instance``, relation add/remove one record of one agent: per query, the k-NN set of
  that one agent changes by at most one element (one neighbour replaced, or one added/removed
  when the agent has <= k records), so its ballot moves by 1/k in at most two coordinates:
  Delta = sqrt(2)/k (derived; RDP ``Q alpha / (k^2 sigma^2)``). The paper states
  ``Q alpha / (k sigma^2)`` (Delta = sqrt(2/k)): looser, kept as ``instance_sensitivity="paper"``
  to reproduce its tables.
* unit ``agent``, relation add/remove one agent's dataset: the ballot has L1 (hence L2) norm <= 1,
  Delta = 1.

Protocol: ``init`` checks the inputs, draws the queries and fits the feature map; two steps,
``vote`` (``labels [Q]``, ``clean_vote_sums [Q, C]``) and ``student`` (``params``). The kNN
search, noise and secure sum are one phase, so the noise-free ballots never enter the state.
With ``runtime.mesh`` every agent's features and neighbour counts are computed on one device of
one process and each chunk's counts ``psum``-ed: the labels and sums equal those without a mesh
(:func:`_vote`). Keys, streaming, seeds and ``runtime.mesh``:
:mod:`fedjax_dp.algorithms.voting.voting_dpfl`.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Iterable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from fedjax_dp.core import agent_stream
from fedjax_dp.algorithms import api
from fedjax_dp.algorithms.voting import voting_dpfl
from fedjax_dp.core import StackedData, seed_axis, validation
from fedjax_dp.core import defaults as defaults_lib
from fedjax_dp.core import memory
from fedjax_dp.core.lift import AGENTS, num_chunks
from fedjax_dp.data.features import FEATURE_MAPS, FeatureMap, fit_feature_map  # re-exported
from fedjax_dp.models import Model
from fedjax_dp.ops import knn_search
from fedjax_dp.privacy import PrivacyLedger
from fedjax_dp.privacy import vote as vote_lib

DESCRIPTION = ("kNN-DPFL: MPC vote of every agent's k nearest neighbours, instance/agent DP "
               "(voting-dpfl)")
USES_LOCAL_TRAIN = False
PHASES = ("vote", "student")
KNN_METHODS = ("auto", "threshold", "top_k")


@dataclasses.dataclass(frozen=True)
class Config(voting_dpfl.VoteConfig):
    """kNN-DPFL. No local training: the ``student_*`` fields train the global model; the vote,
    student and secure aggregation fields (as AE-DPFL's): :class:`voting_dpfl.VoteConfig`.
    ``query_chunk`` is not used (the search blocks the queries itself, :func:`knn_counts`)."""

    k: int = 10                          # neighbours per agent (paper: 5% of the local size)
    sigma: float = 1.0                   # std of the total noise on the vote sum
    feature_map: str = "pca"             # identity | random_projection | pca (public data only)
    feature_dim: int = 64                # output dimension of random_projection / pca
    instance_sensitivity: str = "derived"   # derived: sqrt(2)/k; paper: sqrt(2/k)
    knn_method: str = "auto"             # auto (the device's) | threshold | top_k (lax.top_k)

    FIELDS = {"k": validation.Int(1),
              "feature_map": validation.Choice(FEATURE_MAPS),
              "feature_dim": validation.Int(1, validation.WIDTH_MAX),
              "instance_sensitivity": validation.Choice(("derived", "paper")),
              "knn_method": validation.Choice(KNN_METHODS)}


# --------------------------------------------------------------------------- ballots

def knn_ballots(x: jax.Array, y: jax.Array, mask: jax.Array, queries: jax.Array, k: int,
                num_classes: int, method: str = "auto") -> jax.Array:
    """kNN ballots of a chunk of agents: ``[a, q, C]``, ``(1/k) sum_{j in kNN} onehot(y_j)``.

    ``x [a, n, d]`` (features), ``y [a, n]``, ``mask [a, n]`` (real rows), ``queries [q, d]``.
    Padded rows are never chosen (an agent with fewer than k real rows votes with all of them,
    still divided by k). ``method``: ``"threshold"`` (threshold search,
    :func:`fedjax_dp.ops.knn_search.neighbour_label_counts`), ``"top_k"`` (``lax.top_k``) or
    ``"auto"`` (:func:`resolve_method`); all give the same neighbour sets.
    """
    return knn_counts(x, y, mask, queries, k, num_classes, method) / k


def knn_counts(x: jax.Array, y: jax.Array, mask: jax.Array, queries: jax.Array, k: int,
               num_classes: int, method: str = "auto") -> jax.Array:
    """``k`` times :func:`knn_ballots`: how many of each agent's k nearest records carry each
    label, ``[a, q, C]`` float32 holding small integers."""
    method = resolve_method(method)
    if method == "threshold":
        return knn_search.neighbour_label_counts(x, y, mask, queries, k, num_classes)
    if method != "top_k":
        raise ValueError(f"method must be one of {KNN_METHODS}, got {method!r}")
    a, n, d = x.shape
    q = queries.shape[0]
    flat = x.reshape(a * n, d)                                            # [a n, d]
    sq = jnp.sum(flat * flat, axis=-1)                                    # [a n]  ||b||^2
    ab = queries @ flat.T                                                 # [q, a n]  one GEMM
    dist = jnp.where(mask.reshape(1, a * n), sq[None, :] - 2.0 * ab, jnp.inf)
    dist = dist.reshape(q, a, n)                                          # ||a||^2 left out
    kk = min(k, n)
    _, idx = jax.lax.top_k(-dist, kk)                                     # [q, a, kk]
    yb = jnp.broadcast_to(y[None], (q, a, n))
    mb = jnp.broadcast_to(mask[None], (q, a, n))
    lab = jnp.take_along_axis(yb, idx, axis=-1)                           # [q, a, kk]
    real = jnp.take_along_axis(mb, idx, axis=-1).astype(jnp.float32)      # [q, a, kk]
    counts = jnp.sum(jax.nn.one_hot(lab, num_classes, dtype=jnp.float32) * real[..., None],
                     axis=-2)                                             # [q, a, C]
    return jnp.transpose(counts, (1, 0, 2))                               # [a, q, C]


def resolve_method(method: str) -> str:
    """``"threshold"`` or ``"top_k"``: ``method`` itself, or for ``"auto"`` the device's
    ``knn_method`` (:func:`fedjax_dp.core.defaults.defaults`)."""
    validation.check_choice("method", method, KNN_METHODS)
    return defaults_lib.defaults().knn_method if method == "auto" else method


@functools.lru_cache(maxsize=64)
def ballot_fn(k: int, num_classes: int, method: str = "auto"):
    """``((x, y, mask) [a, ...], queries [q, d]) -> [a, q, C]`` for :func:`vote_lib.mpc_vote`."""
    validation.check_choice("method", method, KNN_METHODS)

    def ballots(agents, queries):
        x, y, mask = agents
        return knn_ballots(x, y, mask, queries, k, num_classes, method)
    return ballots


def agent_features(phi: FeatureMap, data: StackedData) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(phi(x) [N, n_max, m], y [N, n_max], mask [N, n_max])`` for :func:`ballot_fn`."""
    return phi.apply(data.x, lead=2), data.y, data.mask


# --------------------------------------------------------------------------- protocol

def check_k(k: int, data: StackedData) -> int:
    """``1 <= k <= the smallest agent's number of records`` (ValueError naming the agent)."""
    k = validation.check_int("algorithm.k", k, minimum=1)
    counts = np.asarray(data.counts)
    smallest = int(counts.min())
    if k > smallest:
        raise ValueError(f"algorithm.k must be in [1, {smallest}] (agent {int(counts.argmin())} "
                         f"holds only {smallest} records), got {k}")
    return k


def sensitivities(config: Config) -> dict[str, float]:
    """``{'agent': 1, 'instance': sqrt(2)/k}`` (or the paper's ``sqrt(2/k)``)."""
    return {"agent": vote_lib.vote_sensitivity("agent", "neighbour_counts", config.k),
            "instance": vote_lib.vote_sensitivity("instance", "neighbour_counts", config.k,
                                                  rule=config.instance_sensitivity)}


def vote_ledger(config: Config, clean_vote_sums: np.ndarray | None = None,
                sigma: float | None = None) -> PrivacyLedger:
    """Instance- and agent-level guarantees of Q votes at :func:`sensitivities`
    (:func:`voting_dpfl.vote_ledger`)."""
    note = f"kNN-DPFL, k={config.k}, instance sensitivity rule '{config.instance_sensitivity}'"
    return voting_dpfl.vote_ledger(config, clean_vote_sums, sigma, sensitivities(config), note)


# --------------------------------------------------------------------------- the protocol

def init(key: jax.Array, data: api.FederatedData, model: Model, config: Config,
         runtime: api.Runtime = api.Runtime()) -> api.State:
    """Checks (``k`` against the smallest agent), key streams, the Q queries and the feature
    map fitted on the public data (stream ``feature_map``)."""
    api.check_init(config, Config, data)
    ctx = voting_dpfl.init_context(key, data, model, config, runtime,
                                   extra_checks=lambda d: check_k(config.k, d.agents))
    phi = fit_feature_map(config.feature_map, ctx.keys["feature_map"], ctx.x_public,
                          config.feature_dim)
    return api.State(step=0, values={}, context=dataclasses.replace(ctx, extra=phi))


num_steps = api.phase_steps(PHASES)


def step(state: api.State, key: jax.Array | None = None) -> tuple[api.State, dict]:
    """Run the next phase (``key`` unused: each phase has its named stream, see the module)."""
    phase = voting_dpfl.check_step(state, PHASES)
    if phase == "vote":
        values, metrics = _vote(state)
    else:
        values, metrics = voting_dpfl.student_phase(state)
    return voting_dpfl.advance(state, values, phase, metrics)


def _vote(state: api.State) -> tuple[dict, dict]:
    """The vote phase: the agents streamed in chunks (:func:`_count_blocks`), their label counts
    added to the streamed tally (:func:`voting_dpfl.streamed_vote_phase`).

    With ``runtime.mesh`` (host- or device-resident agents) every chunk is split over the mesh
    (its size rounded up to a multiple of the devices), each agent's features and neighbour
    counts computed on one device of one process, and the chunk's counts summed by a ``psum``
    (exact integers, replicated): the tally, labels and clean sums equal those without a mesh.
    ``values["agents_per_process"]``: :class:`voting_dpfl.AgentCount`."""
    ctx: voting_dpfl.Context = state.context
    cfg, phi, mesh = ctx.config, ctx.extra, ctx.runtime.mesh
    data = ctx.data.agents
    size = voting_dpfl.mesh_chunk(voting_dpfl.agent_chunk(cfg, data.num_agents), mesh)
    queries = phi.apply(ctx.x_public[ctx.query_indices], lead=1)                  # [Q, m]
    fn = _chunk_counts_fn(cfg.k, ctx.model.num_classes, cfg.knn_method, mesh)
    mean = None if phi.mean is None else np.asarray(phi.mean, np.float32)
    matrix = None if phi.matrix is None else np.asarray(phi.matrix, np.float32)
    if mesh is None:                                    # on the device once, not per call
        mean, matrix = jax.tree.map(jnp.asarray, (mean, matrix))
    else:                                               # host arrays: replicated over the mesh
        queries = np.asarray(queries)
    drivers = {"algorithm.agent_chunk": size, "algorithm.num_queries": int(queries.shape[0])}
    count = voting_dpfl.AgentCount(mesh)
    chunks = count.counted(agent_stream.chunks(data, size, mesh=mesh))
    values, metrics = voting_dpfl.streamed_vote_phase(
        state, _count_blocks(fn, mean, matrix, chunks, queries, size, drivers=drivers,
                             summed=mesh is not None),
        num_chunks(data.num_agents, size), divisor=float(cfg.k), summed=mesh is not None)
    values = {**values, "agents_per_process": count.per_process()}
    # the config's chunk (not the mesh's rounded one): the record is the run's without a mesh
    return values, {**metrics, "k": cfg.k,
                    "agent_chunk": voting_dpfl.agent_chunk(cfg, data.num_agents)}


def _count_blocks(fn: Callable, mean, matrix, chunks: Iterable[agent_stream.Chunk],
                  queries: jax.Array, size: int, *, drivers: dict | None = None,
                  summed: bool = False):
    """``(label counts [(S,) size, Q, C] int32, agent ids [size], valid [size])`` per streamed
    chunk: the feature map and the kNN search of one chunk of agents in one compiled call
    (:func:`_chunk_counts_fn`, or vmapped over S seeds: :func:`_seeds_counts_fn`); with
    ``drivers``, each call is first checked against the memory budget. ``summed``
    (``runtime.mesh``): ``fn`` also takes the chunk's ``valid`` mask and gives the counts summed
    over its valid agents, ``[Q, C]``."""
    seeds = queries.shape[0] if queries.ndim == 3 else 1                   # [S, Q, m] or [Q, m]
    for chunk in chunks:
        a = chunk.agents
        args = (mean, matrix, a.x, a.y, a.mask, queries) + ((chunk.valid,) if summed else ())
        if drivers is not None:
            memory.check_call(fn, *args, drivers=drivers,
                              what=f"the kNN search of a chunk of {size} agents "
                              f"({a.mask.shape[-1]} records each) for {queries.shape[-2]} queries"
                              + (f", {seeds} seeds vmapped together" if seeds > 1 else ""))
        yield fn(*args), chunk.ids, chunk.valid


@functools.lru_cache(maxsize=64)
def _chunk_counts_fn(k: int, num_classes: int, method: str, mesh=None):
    """``(mean, matrix, x, y, mask, queries) -> counts [size, Q, C] int32``: the feature map and
    :func:`knn_counts` of a chunk. ``mesh``: ``(..., queries, valid) -> [Q, C]``, a
    ``shard_map`` over the agent axis of ``x, y, mask, valid`` (one device per agent), the
    devices' sums over their valid agents ``psum``-ed (exact integers, replicated)."""
    def fn(mean, matrix, x, y, mask, queries):
        feats = FeatureMap("chunk", mean, matrix).apply(x, lead=2)              # [S, n, m]
        counts = knn_counts(feats, y, mask, queries, k, num_classes, method)     # [S, Q, C]
        return jnp.round(counts).astype(jnp.int32)

    if mesh is None:
        return jax.jit(fn)

    def local_sum(mean, matrix, x, y, mask, queries, valid):
        counts = jnp.where(valid[:, None, None], fn(mean, matrix, x, y, mask, queries), 0)
        return jax.lax.psum(jnp.sum(counts, axis=0), AGENTS)                   # [Q, C]

    split = P(AGENTS)
    return jax.jit(jax.shard_map(local_sum, mesh=mesh,
                                 in_specs=(P(), P(), split, split, split, P(), split),
                                 out_specs=P(), check_vma=False))


# --------------------------------------------------------------------------- seeds together

def batch_plan(states: list[api.State]) -> voting_dpfl.SeedPlan | None:
    """:func:`voting_dpfl.seed_plan`, and None for feature maps of different shapes."""
    phis = [st.context.extra for st in states]
    if len({(phi.kind, np.shape(phi.mean), np.shape(phi.matrix)) for phi in phis}) != 1:
        return None
    return voting_dpfl.seed_plan(states)


def batched_step(plan: voting_dpfl.SeedPlan, states: list[api.State], keys=None):
    """Step S seeds of kNN-DPFL together (:func:`voting_dpfl.batched_phase`); seed s equals its
    own run."""
    return voting_dpfl.batched_phase(PHASES, {"vote": _vote_seeds,
                                              "student": voting_dpfl.student_phase_seeds},
                                     plan, states)


@functools.lru_cache(maxsize=64)
def _seeds_counts_fn(k: int, num_classes: int, method: str, mean_axis: int | None,
                     matrix_axis: int | None, agents_axis: int | None):
    """:func:`_chunk_counts_fn` vmapped over a leading seed axis of the queries (and of the
    feature map's mean / matrix and the agents' data where they differ between seeds)."""
    ax = agents_axis
    return jax.jit(jax.vmap(_chunk_counts_fn(k, num_classes, method),
                            in_axes=(mean_axis, matrix_axis, ax, ax, ax, 0)))


def _vote_seeds(plan: voting_dpfl.SeedPlan, states: list[api.State]) -> list[tuple[dict, dict]]:
    """The streamed vote of S seeds: each chunk's kNN label counts ``[S, size, Q, C]`` in one
    vmapped call, added to the tallies by :func:`voting_dpfl.streamed_vote_seeds`."""
    ctxs: list[voting_dpfl.Context] = [st.context for st in states]
    c0 = ctxs[0]
    cfg = c0.config
    datas = [c.data.agents for c in ctxs]
    size = voting_dpfl.agent_chunk(cfg, datas[0].num_agents)
    phis: list[FeatureMap] = [c.extra for c in ctxs]
    mean, mean_axis = seed_axis.share_or_stack(
        [None if phi.mean is None else jnp.asarray(phi.mean, jnp.float32) for phi in phis])
    matrix, matrix_axis = seed_axis.share_or_stack(
        [None if phi.matrix is None else jnp.asarray(phi.matrix, jnp.float32) for phi in phis])
    queries = jnp.stack([phi.apply(c.x_public[c.query_indices], lead=1)
                         for phi, c in zip(phis, ctxs)])                             # [S, Q, m]
    fn = _seeds_counts_fn(cfg.k, c0.model.num_classes, cfg.knn_method, mean_axis, matrix_axis,
                          plan.agents_axis)

    chunks = agent_stream.chunks(datas if plan.agents_axis == 0 else datas[0], size,
                                 stack=plan.agents_axis == 0)
    # the seeds' calls are budgeted as the single seed's (a vmapped call holds S chunks' label
    # counts: unchecked, 3 seeds at N = 3,000, Q = 10,000 were killed at 23.5 GB)
    drivers = {"algorithm.agent_chunk": size, "algorithm.num_queries": int(queries.shape[1]),
               "seeds vmapped together": len(states)}
    blocks = _count_blocks(fn, mean, matrix, chunks, queries, size, drivers=drivers)
    outs = voting_dpfl.streamed_vote_seeds(states, blocks, num_chunks(datas[0].num_agents, size),
                                           divisor=float(cfg.k))
    every = np.asarray([datas[0].num_agents], np.int64)           # no mesh: this process, all
    return [({**values, "agents_per_process": every}, {**metrics, "k": cfg.k, "agent_chunk": size})
            for values, metrics in outs]


output = voting_dpfl.output


def ledger(config: Config, state: api.State | None = None) -> PrivacyLedger:
    """:func:`vote_ledger` with the run's noise-free sums (data-independent part only without a
    state, before the vote, or without ``config.data_dependent``). kNN-DPFL declares nothing
    else: its metrics are public (``k``, ``agent_chunk`` and ``num_queries`` from the config,
    ``vote_accuracy`` from the released labels and the public set's labels)."""
    return vote_ledger(config, voting_dpfl.clean_sums(state))
