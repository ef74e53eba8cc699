"""The MPC noisy-argmax vote and its accounting (voting-dpfl Algorithms 2-3, Theorems 5 and 7).

The mechanism only (no training; the algorithms: docs/voting_dpfl.md). For Q public queries and
N agents with ballots ``b_i(x_t)`` of length C (``ballot="one_hot"``: AE-DPFL's prediction;
``"neighbour_counts"``: kNN-DPFL's labels of k records counted and divided by k)::

    label of query t = argmax_c  sum_i ( b_i(x_t)_c + z_{i,t,c} ),   z_{i,t} ~ N(0, sigma^2/N I_C)

Noise (``noise=``): ``"per_agent"`` (default) simulates every agent's share, hashed from
``(i, t)`` under the agents' noise key (:func:`agent_query_noise`: independent across agents and
queries, identical however the work is chunked); ``"aggregate"`` (C draws per query, not N C)
draws the secure sum's ``sigma N(0, I_C)`` per query from ``fold_in(fold_in(key, 2^32 - 1), t)``
(one virtual party: agent indices stay below 2^32 - 1). N independent ``N(0, sigma^2/N)``
shares sum to ``N(0, sigma^2)``: the released labels' distribution and guarantee are the same.

:func:`mpc_vote` returns only the argmax per query (what the talliers of MPC-vote, Dery et al.
2019, reveal, and what licenses the data-dependent GNMax analysis); :func:`vote_sums` computes
the noise-free sums for the privacy *analysis* only, never an input to training. Ballots
``ballot_fn(agents_chunk, queries_chunk) -> [a, q, C]`` are evaluated on chunks of
``agent_chunk`` x ``query_chunk`` (a ``lax.scan`` over agent chunks inside a ``lax.map`` over
query chunks): memory is one chunk, the result that of one chunk up to float summation order.

Accounting (Theorem 5): ``GaussianDpEvent(sigma / Delta)`` self-composed Q times, RDP
``Q alpha Delta^2 / (2 sigma^2)``, with ``Delta`` the vote sum's L2 sensitivity per query
(:func:`vote_sensitivity`):

=========  ================  ===========  ========================================================
unit       ballot            Delta        why
=========  ================  ===========  ========================================================
agent      both              1            add/remove one agent removes its ballot (L2 norm <= 1)
instance   one_hot           sqrt(2)      one record can change the agent's one-hot vote
instance   neighbour_counts  sqrt(2) / k  one record changes <= 1 neighbour of one agent: 1/k in
                                          two coordinates (derived; ``rule="derived"``)
instance   neighbour_counts  sqrt(2 / k)  the voting-dpfl paper's looser value (``rule="paper"``)
=========  ================  ===========  ========================================================
"""
from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

from fedjax_dp.core import rng, validation
from fedjax_dp.core.lift import AGENTS, chunked, pad_rows
from fedjax_dp.privacy import PrivacyLedger, accounting, secagg, secagg_shares
from fedjax_dp.privacy.gnmax import PATE_ORDERS, gnmax_total_rdp

__all__ = ["RELATIONS", "NOISE_MODES", "BallotFn", "vote_sensitivity", "vote_event", "vote_ledger",
           "agent_query_noise", "aggregate_noise", "mpc_vote", "mpc_vote_and_sums", "run_vote",
           "vote_sums", "check_vote_args", "BALLOTS"]

#: How the vote's noise is simulated (see the module docstring).
NOISE_MODES = ("per_agent", "aggregate")
_AGGREGATE_PARTY = 2 ** 32 - 1     # the index of the virtual party that draws the total noise
_AGENTS_NOISE = 2 ** 32 - 2        # fold_in index of the key the agents' noise is hashed under

#: The neighbouring relation of each unit of privacy.
RELATIONS: dict[str, str] = {
    "agent": "add/remove one agent's entire local dataset",
    "instance": "add/remove one training instance of one agent",
}

#: The ballot kinds :func:`vote_sensitivity` knows.
BALLOTS = ("one_hot", "neighbour_counts")

BallotFn = Callable[[Any, jax.Array], jax.Array]   # (agents [a, ...], queries [q, ...]) -> [a,q,C]


# --------------------------------------------------------------------------- accounting

def vote_sensitivity(unit: str, ballot: str = "one_hot", k: int | None = None,
                     rule: str = "derived") -> float:
    """L2 sensitivity of the vote sum per query for ``unit`` (the module's table).

    ``'neighbour_counts'`` needs ``k``; ``rule='paper'`` (the paper's ``sqrt(2/k)``) is kept only
    to reproduce its tables."""
    validation.check_choice("unit", unit, tuple(RELATIONS))
    validation.check_choice("ballot", ballot, BALLOTS)
    validation.check_choice("rule", rule, ("derived", "paper"))
    if ballot == "neighbour_counts":
        if k is None:
            raise ValueError("k must be given (an integer >= 1) for ballot 'neighbour_counts'")
        k = validation.check_int("k", k, minimum=1)
    if unit == "agent":
        return 1.0
    if ballot == "one_hot":
        return math.sqrt(2.0)
    return math.sqrt(2.0) / k if rule == "derived" else math.sqrt(2.0 / k)


def vote_event(sigma: float, num_queries: int, sensitivity: float):
    """``SelfComposed(GaussianDpEvent(sigma / Delta), Q)``: Q Gaussian votes (Theorem 5)."""
    sigma = validation.check_positive("sigma", sigma)
    sensitivity = validation.check_positive("sensitivity", sensitivity)
    return accounting.gaussian_event(sigma / sensitivity,
                                     validation.check_int("num_queries", num_queries, minimum=0))


def vote_ledger(sigma: float, num_queries: int, sensitivities: Mapping[str, float], *,
                clean_vote_sums: np.ndarray | None = None, note: str = "") -> PrivacyLedger:
    """The ledger of Q MPC votes: a data-independent entry per unit of ``sensitivities``
    (``{unit: Delta}``, units of :data:`RELATIONS`); with ``clean_vote_sums`` (the noise-free
    ``[Q, C]`` sums, in the units of ``Delta``) also ``'<unit>_data_dependent'``: the GNMax RDP
    (PATE 2018 Theorem 6, :func:`fedjax_dp.privacy.gnmax.gnmax_total_rdp`) summed over queries
    on :data:`PATE_ORDERS` (``add_rdp``, reported with ``data_dependent: true``)."""
    ledger = PrivacyLedger()
    for unit, sens in sensitivities.items():
        validation.check_choice("unit", unit, tuple(RELATIONS))
        ledger.add_event(unit, vote_event(sigma, num_queries, sens), relation=RELATIONS[unit],
                         sensitivity=sens,
                         note=f"Gaussian vote, sigma={sigma:g}, Delta={sens:g}, Q={num_queries}"
                              + (f"; {note}" if note else ""))
    if clean_vote_sums is not None:
        for unit, sens in sensitivities.items():
            orders, dd, _ = gnmax_total_rdp(clean_vote_sums, sigma, sens, PATE_ORDERS)
            ledger.add_rdp(f"{unit}_data_dependent", orders, dd, relation=RELATIONS[unit],
                           note="GNMax data-dependent RDP (PATE 2018 Thm 6), sigma_eff="
                                f"{sigma * math.sqrt(2) / sens:g}; depends on the private votes")
    return ledger


# --------------------------------------------------------------------------- the vote

def agent_query_noise(key: jax.Array, agent_ids: jax.Array, query_ids: jax.Array, std,
                      num_classes: int) -> jax.Array:
    """Agent i's noise on query t: ``std * N(0, I_C)``, the counter-mode normals
    (:func:`fedjax_dp.core.rng.counter_normals`) of the counters ``(i, t ceil(C/2) + j)`` under
    ``fold_in(key, 2^32 - 2)`` (a key of their own: counters hashed under ``key`` itself would be
    the words of ``fold_in(key, .)``'s children). ``agent_ids [a]``, ``query_ids [q]`` (global
    indices) -> ``[a, q, C]``; a function of (key, i, t) only, so chunking never changes it."""
    a, q = agent_ids.shape[0], query_ids.shape[0]
    hi = jnp.broadcast_to(agent_ids[:, None], (a, q)).reshape(-1)
    lo = jnp.broadcast_to(query_ids[None, :], (a, q)).reshape(-1)
    noise_key = jax.random.fold_in(key, jnp.uint32(_AGENTS_NOISE))
    z = rng.counter_normals(noise_key, hi, lo, num_classes)                # [a q, C]
    return jnp.asarray(std, jnp.float32) * z.reshape(a, q, num_classes)


def aggregate_noise(key: jax.Array, query_ids: jax.Array, sigma, num_classes: int) -> jax.Array:
    """The secure sum's noise drawn at once: ``sigma * N(0, I_C)`` per query ``[q, C]``, query t
    from ``fold_in(fold_in(key, 2^32 - 1), t)`` (independent of the query count and chunking)."""
    party = jax.random.fold_in(key, jnp.uint32(_AGGREGATE_PARTY))

    def one(t):
        return jax.random.normal(jax.random.fold_in(party, t), (num_classes,), jnp.float32)

    return jnp.asarray(sigma, jnp.float32) * jax.vmap(one)(query_ids)


def _add_aggregate_noise(key: jax.Array, clean: jax.Array, sigma) -> jax.Array:
    """``clean [Q, C]`` noise-free sums + :func:`aggregate_noise` for queries ``0..Q-1``."""
    q, c = clean.shape
    return clean + aggregate_noise(key, jnp.arange(q), sigma, c)


def _local_tally(key, agents, ids, valid, queries, std, *, ballot_fn: BallotFn, num_classes: int,
                 agent_chunk: int | None, query_chunk: int | None, noisy: bool) -> jax.Array:
    """Sum over the given agents of (ballot + own noise): ``[Q, C]``. ``ids [n]``: global agent
    indices (they pick the noise), ``valid [n]``: real agents (padding contributes nothing)."""
    n = jax.tree.leaves(agents)[0].shape[0]
    q = queries.shape[0]
    ac = n if agent_chunk is None else min(agent_chunk, n)
    qc = q if query_chunk is None else min(query_chunk, q)
    a_chunks = chunked((agents, ids, valid), ac)
    q_chunks = chunked((queries, jnp.arange(q)), qc)

    def per_query_chunk(qchunk):
        qx, qids = qchunk                                                 # [qc, ...], [qc]

        def body(acc, achunk):
            data, aids, ok = achunk                                       # [ac, ...], [ac], [ac]
            b = ballot_fn(data, qx).astype(jnp.float32)                   # [ac, qc, C]
            if noisy:
                b = b + agent_query_noise(key, aids, qids, std, num_classes)
            b = jnp.where(ok[:, None, None], b, 0.0)                      # padded agents: nothing
            return acc + jnp.sum(b, axis=0), None                         # secure sum

        acc, _ = jax.lax.scan(body, jnp.zeros((qc, num_classes), jnp.float32), a_chunks)
        return acc

    tallies = jax.lax.map(per_query_chunk, q_chunks)                       # [Q/qc, qc, C]
    return tallies.reshape(-1, num_classes)[:q]


def noisy_tally(key, agents, queries, sigma, *, ballot_fn: BallotFn, num_classes: int,
                agent_chunk: int | None, query_chunk: int | None, noisy: bool,
                mesh: Mesh | None = None, noise: str = "per_agent") -> jax.Array:
    """Sum over agents of (ballot + own noise): ``[Q, C]``, the talliers' secret (:func:`mpc_vote`
    releases only its argmax); public for tests, audits and benchmarks. With ``mesh`` every
    device tallies its slice of the agents (padded with invalid agents), the partial tallies
    ``psum``-ed: the same noise (keyed by global agent index), the same result up to rounding."""
    if noisy and noise == "aggregate":
        clean = noisy_tally(None, agents, queries, 0.0, ballot_fn=ballot_fn,
                            num_classes=num_classes, agent_chunk=agent_chunk,
                            query_chunk=query_chunk, noisy=False, mesh=mesh)
        return _add_aggregate_noise(key, clean, sigma)
    n = jax.tree.leaves(agents)[0].shape[0]
    std = sigma / math.sqrt(n) if noisy else 0.0
    ids, valid = jnp.arange(n), jnp.ones((n,), bool)
    kw = dict(ballot_fn=ballot_fn, num_classes=num_classes, agent_chunk=agent_chunk,
              query_chunk=query_chunk, noisy=noisy)
    if mesh is None:
        return _local_tally(key, agents, ids, valid, queries, std, **kw)
    agents, valid = pad_rows((agents, valid), mesh.shape[AGENTS])      # padding: invalid agents
    ids = jnp.arange(valid.shape[0])

    def shard(key, agents, ids, valid, queries):
        part = _local_tally(key, agents, ids, valid, queries, std, **kw)
        return jax.lax.psum(part, AGENTS)                                  # cross-device sum

    if key is None:
        key = jax.random.key(0)                                            # unused (noisy=False)
    return jax.shard_map(shard, mesh=mesh, in_specs=(P(), P(AGENTS), P(AGENTS), P(AGENTS), P()),
                         out_specs=P(), check_vma=False)(key, agents, ids, valid, queries)


@functools.partial(jax.jit, static_argnames=("ballot_fn", "num_classes", "agent_chunk",
                                             "query_chunk", "mesh", "noise"))
def _release(key, agents, queries, sigma, *, ballot_fn, num_classes, agent_chunk, query_chunk,
             mesh=None, noise="per_agent"):
    tally = noisy_tally(key, agents, queries, sigma, ballot_fn=ballot_fn, num_classes=num_classes,
                        agent_chunk=agent_chunk, query_chunk=query_chunk, noisy=True, mesh=mesh,
                        noise=noise)
    return jnp.argmax(tally, axis=-1).astype(jnp.int32)                   # only this leaves


@functools.partial(jax.jit, static_argnames=("ballot_fn", "num_classes", "agent_chunk",
                                             "query_chunk", "mesh"))
def _clean(agents, queries, *, ballot_fn, num_classes, agent_chunk, query_chunk, mesh=None):
    return noisy_tally(None, agents, queries, 0.0, ballot_fn=ballot_fn, num_classes=num_classes,
                       agent_chunk=agent_chunk, query_chunk=query_chunk, noisy=False, mesh=mesh)


def check_vote_args(sigma, num_agents: int, num_queries: int, num_classes: int,
                    agent_chunk: int | None, query_chunk: int | None,
                    noise: str = "per_agent") -> None:
    """Host-side checks of a vote's arguments (before any JAX work)."""
    validation.check_choice("noise", noise, NOISE_MODES)
    validation.check_positive("sigma", sigma, finite=True)
    validation.check_int("num_agents", num_agents, minimum=1)
    validation.check_int("num_queries", num_queries, minimum=1)
    validation.check_int("num_classes", num_classes, minimum=2)
    if num_queries * -(-num_classes // 2) >= _AGGREGATE_PARTY:
        # agent_query_noise's counters (i, t ceil(C/2) + j) must not wrap around 2^32
        raise ValueError(f"num_queries x ceil(num_classes / 2) must be below 2^32 - 1, got "
                         f"{num_queries} x {-(-num_classes // 2)}")
    if agent_chunk is not None:
        validation.check_int("agent_chunk", agent_chunk, minimum=1)
    if query_chunk is not None:
        validation.check_int("query_chunk", query_chunk, minimum=1)


def _sizes(agents, queries) -> tuple[int, int]:
    sizes = {leaf.shape[0] for leaf in jax.tree.leaves(agents)}
    if len(sizes) != 1:
        raise ValueError(f"agents' leaves disagree on the number of agents: {sorted(sizes)}")
    queries = jnp.asarray(queries)
    if queries.ndim < 1:
        raise ValueError(f"queries must have shape [num_queries, ...], got {queries.shape}")
    return sizes.pop(), int(queries.shape[0])


def mpc_vote(key: jax.Array, ballot_fn: BallotFn, agents: Any, queries: jax.Array, sigma, *,
             num_classes: int, agent_chunk: int | None = None,
             query_chunk: int | None = None, mesh: Mesh | None = None,
             noise: str = "per_agent") -> jax.Array:
    """The MPC noisy-argmax vote (the module docstring): released labels ``int32 [Q]`` only.
    ``agents``: a pytree with leading axis N; ``queries [Q, ...]``; ``ballot_fn`` hashable (built
    once per model / k, the compiled vote is reused). ``agent_chunk`` / ``query_chunk`` (None:
    all at once) and ``mesh`` (agents split over devices) never change the result."""
    n, q = _sizes(agents, queries)
    check_vote_args(sigma, n, q, num_classes, agent_chunk, query_chunk, noise)
    return _release(key, agents, jnp.asarray(queries), jnp.float32(sigma), ballot_fn=ballot_fn,
                    num_classes=int(num_classes), agent_chunk=agent_chunk,
                    query_chunk=query_chunk, mesh=mesh, noise=noise)


@functools.partial(jax.jit, static_argnames=("ballot_fn", "num_classes", "agent_chunk",
                                             "query_chunk", "mesh"))
def _release_and_clean(key, agents, queries, sigma, *, ballot_fn, num_classes, agent_chunk,
                       query_chunk, mesh=None):
    clean = noisy_tally(None, agents, queries, 0.0, ballot_fn=ballot_fn, num_classes=num_classes,
                        agent_chunk=agent_chunk, query_chunk=query_chunk, noisy=False, mesh=mesh)
    noisy = _add_aggregate_noise(key, clean, sigma)
    return jnp.argmax(noisy, axis=-1).astype(jnp.int32), clean


def mpc_vote_and_sums(key: jax.Array, ballot_fn: BallotFn, agents: Any, queries: jax.Array,
                      sigma, *, num_classes: int, agent_chunk: int | None = None,
                      query_chunk: int | None = None,
                      mesh: Mesh | None = None) -> tuple[jax.Array, np.ndarray]:
    """``(mpc_vote(..., noise="aggregate"), vote_sums(...))``, exactly, from ONE evaluation of the
    ballots (per-agent shares would need them twice: the shares never meet the clean sums)."""
    n, q = _sizes(agents, queries)
    check_vote_args(sigma, n, q, num_classes, agent_chunk, query_chunk, "aggregate")
    labels, clean = _release_and_clean(key, agents, jnp.asarray(queries), jnp.float32(sigma),
                                       ballot_fn=ballot_fn, num_classes=int(num_classes),
                                       agent_chunk=agent_chunk, query_chunk=query_chunk,
                                       mesh=mesh)
    return labels, np.asarray(clean, dtype=np.float64)


def run_vote(key: jax.Array, ballot_fn: BallotFn, agents: Any, queries: jax.Array, sigma, *,
             num_classes: int, agent_chunk: int | None = None, query_chunk: int | None = None,
             noise: str = "per_agent", data_dependent: bool = False,
             mesh: Mesh | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """A run's vote: ``(released labels [Q], noise-free sums [Q, C] or None)``, the sums only
    when ``data_dependent`` (:func:`mpc_vote_and_sums` with ``noise="aggregate"``, else
    :func:`mpc_vote` and :func:`vote_sums`); the labels are :func:`mpc_vote`'s with the key."""
    kw = dict(num_classes=num_classes, agent_chunk=agent_chunk, query_chunk=query_chunk,
              mesh=mesh)
    if data_dependent and noise == "aggregate":
        labels, clean = mpc_vote_and_sums(key, ballot_fn, agents, queries, sigma, **kw)
        return np.asarray(labels), clean
    labels = np.asarray(mpc_vote(key, ballot_fn, agents, queries, sigma, noise=noise, **kw))
    clean = vote_sums(ballot_fn, agents, queries, **kw) if data_dependent else None
    return labels, clean


def vote_sums(ballot_fn: BallotFn, agents: Any, queries: jax.Array, *, num_classes: int,
              agent_chunk: int | None = None, query_chunk: int | None = None,
              mesh: Mesh | None = None) -> np.ndarray:
    """Noise-free vote sums ``[Q, C]`` (float64, host) for the data-dependent GNMax analysis
    ONLY (a deployment would compute it inside the MPC); never an input to training."""
    n, q = _sizes(agents, queries)
    check_vote_args(1.0, n, q, num_classes, agent_chunk, query_chunk)
    out = _clean(agents, jnp.asarray(queries), ballot_fn=ballot_fn, num_classes=int(num_classes),
                 agent_chunk=agent_chunk, query_chunk=query_chunk, mesh=mesh)
    return np.asarray(out, dtype=np.float64)


# --------------------------------------------------------------------------- the streamed tally
# The same secure sum accumulated as chunks of agents arrive on the host's schedule, released once.

class Tally(NamedTuple):
    """The secure sum of a streamed vote (never released). ``counts [Q, C]`` int32: noise-free
    ballot counts (exact: independent of the chunking). ``noise [Q, C]`` float32: the agents'
    noise shares (``"per_agent"``) added in agent order (a ``lax.scan``), so the rounding is the
    same for every chunking and for host- or device-resident data."""

    counts: jax.Array
    noise: jax.Array
    shares: jax.Array | None = None     # [J, Q, C] uint32: the talliers' sums (secagg only)


def tally_init(num_queries: int, num_classes: int) -> Tally:
    """The empty tally (host zeros: the compiled adds take them as they are)."""
    return Tally(np.zeros((num_queries, num_classes), np.int32),
                 np.zeros((num_queries, num_classes), np.float32))


@functools.partial(jax.jit, static_argnames=("num_classes", "per_agent", "summed"))
def tally_add(tally: Tally, key: jax.Array, ballots: jax.Array, agent_ids: jax.Array,
              valid: jax.Array, std, *, num_classes: int, per_agent: bool,
              summed: bool = False) -> Tally:
    """Add a chunk of agents' ballots (and, ``per_agent``, their noise shares) to ``tally``.

    ``ballots``: ``[a, Q]`` class indices (AE-DPFL; -1 = abstain, the zero ballot) or ``[a, Q, C]``
    integer label counts (kNN-DPFL, the ballot times k); ``summed``: ``[Q, C]``, the chunk's
    counts already summed over its valid agents (kNN-DPFL with ``runtime.mesh``: a ``psum`` of
    the devices' sums, exact integers). ``agent_ids [a]`` global indices (they pick the noise,
    :func:`agent_query_noise`), ``valid [a]`` False for padding."""
    if summed:
        chunk = ballots.astype(jnp.int32)                                         # [Q, C]
    else:
        if ballots.ndim == 2:
            ballots = jax.nn.one_hot(ballots.astype(jnp.int32), num_classes, dtype=jnp.int32)
        ballots = jnp.where(valid[:, None, None], ballots.astype(jnp.int32), 0)   # [a, Q, C]
        chunk = jnp.sum(ballots, axis=0)
    counts = tally.counts + chunk
    noise = tally.noise
    if per_agent:
        q = counts.shape[0]
        z = agent_query_noise(key, agent_ids, jnp.arange(q), std, num_classes)
        z = jnp.where(valid[:, None, None], z, 0.0)                               # [a, Q, C]
        noise, _ = jax.lax.scan(lambda acc, zi: (acc + zi, None), noise, z)      # agent order
    return Tally(counts, noise)


@functools.partial(jax.jit, static_argnames=("noise",))
def tally_release(tally: Tally, key: jax.Array, sigma, divisor, *, noise: str) -> jax.Array:
    """``argmax_c counts / divisor + noise``: the released labels ``int32 [Q]`` and nothing else.
    ``divisor``: 1 (one-hot ballots) or k (kNN label counts). ``noise="aggregate"``:
    :func:`aggregate_noise` with the key and query indices :func:`mpc_vote` uses."""
    return _release_tally(tally, key, sigma, divisor, noise)


def _release_tally(tally: Tally, key: jax.Array, sigma, divisor, noise: str) -> jax.Array:
    clean = tally.counts.astype(jnp.float32) / divisor
    q, c = clean.shape
    if noise == "aggregate":
        noisy = clean + aggregate_noise(key, jnp.arange(q), sigma, c)
    else:
        noisy = clean + tally.noise
    return jnp.argmax(noisy, axis=-1).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("num_classes", "per_agent", "noise", "summed"))
def tally_step(tally: Tally, key: jax.Array, ballots: jax.Array, agent_ids: jax.Array,
               valid: jax.Array, std, sigma, divisor, last, *, num_classes: int,
               per_agent: bool, noise: str, summed: bool = False) -> tuple[Tally, jax.Array]:
    """:func:`tally_add` of a chunk (``summed``: its ballots already summed, ``[Q, C]``), then,
    when ``last`` (traced bool: the stream's last chunk), :func:`tally_release` of the whole
    tally (else ``-1`` labels, never read): the streamed vote's ONE compiled call. The labels
    equal ``tally_release`` after the adds. Given global arrays over a mesh (the summed counts
    of kNN-DPFL's sharded chunks, replicated) every output is replicated over it."""
    tally = tally_add(tally, key, ballots, agent_ids, valid, std, num_classes=num_classes,
                      per_agent=per_agent, summed=summed)
    q = tally.counts.shape[0]
    labels = jax.lax.cond(last, lambda t: _release_tally(t, key, sigma, divisor, noise),
                          lambda t: jnp.full((q,), -1, jnp.int32), tally)
    return tally, labels


@functools.lru_cache(maxsize=32)
def tally_step_fn(num_classes: int, per_agent: bool, noise: str, batched: bool,
                  summed: bool = False):
    """``step(tally, key, ballots, ids, valid, std, sigma, divisor, last) -> (tally, labels)``:
    :func:`tally_step` (``summed``: each chunk's ballots arrive summed, ``[Q, C]``);
    ``batched``: vmapped over a leading seed axis of the tally, the vote key and the ballots
    (the other arguments shared)."""
    def step(tally, key, ballots, ids, valid, std, sigma, divisor, last):
        return tally_step(tally, key, ballots, ids, valid, std, sigma, divisor, last,
                          num_classes=num_classes, per_agent=per_agent, noise=noise,
                          summed=summed)

    if not batched:
        return step
    return jax.jit(jax.vmap(step, in_axes=(0, 0, 0) + (None,) * 6))


@functools.partial(jax.jit, static_argnames=("num_classes", "per_agent", "frac_bits"))
def secagg_tally_add(tally: Tally, key: jax.Array, share_key: jax.Array, ballots: jax.Array,
                     agent_ids: jax.Array, valid: jax.Array, alive: jax.Array, std, divisor, *,
                     num_classes: int, per_agent: bool, frac_bits: int) -> Tally:
    """Secure-aggregation :func:`tally_add`: agent i's ``b_i / divisor + z_i`` (``z_i`` its noise
    share if ``per_agent``, else 0) is shared among the talliers
    (:func:`fedjax_dp.privacy.secagg_shares.tally_add`) by the ``valid`` agents still ``alive``
    (``[N]``, indexed by ``agent_ids``); ``counts`` (analysis only) counts the same agents."""
    if ballots.ndim == 2:
        ballots = jax.nn.one_hot(ballots.astype(jnp.int32), num_classes, dtype=jnp.int32)
    contrib = valid & jnp.take(alive, agent_ids, mode="fill", fill_value=False)   # [a]
    ballots = ballots.astype(jnp.int32)                                           # [a, Q, C]
    counts = tally.counts + jnp.sum(jnp.where(contrib[:, None, None], ballots, 0), axis=0)
    values = ballots.astype(jnp.float32) / divisor
    if per_agent:
        q = ballots.shape[1]
        values = values + agent_query_noise(key, agent_ids, jnp.arange(q), std,
                                                     num_classes)
    shares = secagg_shares.tally_add(tally.shares, share_key, values, agent_ids, contrib,
                                     frac_bits=frac_bits)
    return Tally(counts, tally.noise, shares)


def top_up_noise(key: jax.Array, num_queries: int, num_classes: int, sigma: float,
                 num_agents: int, num_survivors: int) -> jax.Array:
    """The talliers' top-up ``[Q, C]``: ``N(0, sigma^2 (N - M)/N)`` per coordinate
    (:func:`fedjax_dp.privacy.secagg.top_up_std`), drawn as :func:`aggregate_noise` from ``key``."""
    std = secagg.top_up_std(sigma, num_agents, num_survivors)
    return aggregate_noise(key, jnp.arange(num_queries), jnp.float32(std), num_classes)
