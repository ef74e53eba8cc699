"""Rounds that cost the cohort, not the population: sample, gather, pad to a bucket, prefetch.

A round-based algorithm with agent sampling trains only the round's participants. Host-side::

    ids     = sample_cohort(k_sample, N, sampling)             sorted agent indices, |ids| = M
    passes  = plan.passes(M)                                    bucket sizes B_1, ..., B_p
    cohort  = gather(data, ids_padded)                          [B, n_max, ...] per pass
    (ids [B] int32, valid [B] bool)                             padding rows repeat a real agent
                                                                and are excluded by ``valid``

Sampling is ONE device function of the round's sampling key, :func:`cohort_coins` (a participation
mask ``[N]``), so the same key gives the same cohort on every path. Poisson sampling with rate q
draws N independent coins ``bits_i < floor(q 2^32)`` from 32 uniform random bits each, i.e.
Bernoulli(q') with ``q' = floor(q 2^32) / 2^32`` in ``(q - 2^-32, q]``: never above the rate the
ledger accounts (privacy amplification by subsampling is monotone in the rate), and q = 1 takes
every agent. Fixed-size sampling takes the first C of a uniformly random permutation
(:func:`jax.random.permutation`): a uniform C-subset.

Buckets (:class:`CohortPlan`) keep compilations few: a *pass* holds at most ``pass_size``
agents (``C`` for fixed-size sampling; ``ceil(qN + 2 sqrt(qN(1-q)))`` for Poisson, rounded up to
the alignment), and a pass with fewer agents is padded to the smallest of the buckets
``pass_size / 2^j`` (j = 0, 1, 2) that holds it. A Poisson draw larger than ``pass_size`` is never
truncated: it runs as several passes whose sums are added (so the privacy analysis, which
assumes every sampled agent contributes, stays exact). At most three shapes are compiled.

Host-resident data: only the cohort is copied to the device each round, and
:class:`CohortFeeder` prepares the next round's cohort in a background thread while the current
round computes. Device-resident data is gathered on the device.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.core import defaults as defaults_lib, validation
from fedjax_dp.core.stacked import StackedData, is_on_host, release_pages

SAMPLINGS = ("poisson", "fixed")
#: A Poisson-sampled run whose every round is empty with at least this probability is refused
#: (:meth:`Sampling.check`).
EMPTY_RUN_LIMIT = 0.5


@dataclasses.dataclass(frozen=True)
class Sampling:
    """How a round's participants are drawn.

    kind: ``"poisson"`` (each agent independently with probability ``rate``) or ``"fixed"`` (a
      uniformly random subset of exactly ``size`` agents).
    """

    kind: str = "poisson"
    rate: float = 1.0
    size: int = 0

    def __post_init__(self):
        validation.check_choice("sampling", self.kind, SAMPLINGS)
        if self.kind == "poisson":
            validation.check_probability("sampling_rate", self.rate, allow_zero=True)
        else:
            validation.check_int("cohort_size", self.size, minimum=1)

    def check(self, num_agents: int, rounds: int | None = None) -> None:
        """Refuse, before any work, a cohort that cannot be drawn or is (nearly) always empty.

        Fixed-size sampling needs ``cohort_size <= N``. Poisson sampling over ``rounds`` rounds
        (when given) is refused when every round's cohort is empty with probability at least
        :data:`EMPTY_RUN_LIMIT` (1/2): ``(1 - q')^(N T) >= 1/2``, q' the rate the coins realise
        (:func:`realised_rate`), i.e. the run most likely trains on nobody; the message names
        ``algorithm.sampling_rate`` and the smallest rate that passes."""
        if self.kind == "fixed" and self.size > num_agents:
            raise ValueError(f"algorithm.cohort_size must be in [1, {num_agents}] (the number of "
                             f"agents), got {self.size}")
        if self.kind != "poisson" or rounds is None:
            return
        draws = float(num_agents) * float(rounds)
        q = realised_rate(self.rate)
        log_empty = draws * math.log1p(-q) if q < 1.0 else -math.inf
        if log_empty >= math.log(EMPTY_RUN_LIMIT):
            least = -math.expm1(math.log(EMPTY_RUN_LIMIT) / draws)
            raise ValueError(
                f"algorithm.sampling_rate = {self.rate:g} with {num_agents} agents and {rounds} "
                f"round(s) expects {self.rate * num_agents:.3g} agents a round: every round's "
                f"cohort is empty with probability {math.exp(log_empty):.3g} (refused at >= "
                f"{EMPTY_RUN_LIMIT:g}); raise algorithm.sampling_rate above {least:.3g} (or "
                f"algorithm.rounds, or use algorithm.sampling = \"fixed\")")

    def expected(self, num_agents: int) -> float:
        """Expected cohort size (qN or C)."""
        return self.rate * num_agents if self.kind == "poisson" else float(self.size)


#: Poisson coins compare 32 random bits with ``floor(q 2^32)``: the realised rate's resolution
POISSON_BITS = 32


def poisson_threshold(rate: float) -> int:
    """``floor(q 2^32)``: agent i participates iff its 32 random bits are below it, so the
    realised rate ``floor(q 2^32) / 2^32`` is in ``(q - 2^-32, q]`` (q = 1: every agent, handled
    by :func:`cohort_coins` without bits)."""
    return int(math.floor(float(rate) * 2.0 ** POISSON_BITS))


def realised_rate(rate: float) -> float:
    """The Bernoulli rate :func:`cohort_coins` draws for a nominal rate q (at most q)."""
    return 1.0 if rate >= 1.0 else poisson_threshold(rate) / 2.0 ** POISSON_BITS


def cohort_coins(key: jax.Array, num_agents: int, sampling: Sampling) -> jax.Array:
    """The round's participation mask ``[N]`` bool, traceable (the fused rounds call it inside
    their compiled loop; :func:`sample_cohort` and :func:`sample_mask` fetch it to the host).

    Poisson(q): ``coin_i = bits_i < floor(q 2^32)`` with ``bits = random_bits(key, [N])``
    (q = 1: all True); fixed C: the first C entries of ``permutation(key, N)``."""
    if sampling.kind == "poisson":
        if sampling.rate >= 1.0:
            return jnp.ones((num_agents,), bool)
        bits = jax.random.bits(key, (num_agents,), jnp.uint32)
        return bits < jnp.uint32(poisson_threshold(sampling.rate))
    chosen = jax.random.permutation(key, num_agents)[:sampling.size]
    return jnp.zeros((num_agents,), bool).at[chosen].set(True)


_coins_jit = jax.jit(cohort_coins, static_argnums=(1, 2))


def sample_cohort(key: jax.Array, num_agents: int, sampling: Sampling) -> np.ndarray:
    """Sorted int64 indices of the round's participants (host array): the nonzeros of
    :func:`cohort_coins` (one compiled call per (N, sampling), then an O(N) fetch)."""
    coins = np.asarray(jax.device_get(_coins_jit(key, num_agents, sampling)))
    return np.flatnonzero(coins).astype(np.int64)


def sample_mask(key: jax.Array, num_agents: int, sampling: Sampling) -> np.ndarray:
    """The cohort of :func:`sample_cohort` as a float32 mask ``[N]`` (the masked reference path)."""
    return np.asarray(jax.device_get(_coins_jit(key, num_agents, sampling))).astype(np.float32)


def _round_up(value: int, multiple: int) -> int:
    return int(-(-int(value) // multiple) * multiple)


@dataclasses.dataclass(frozen=True)
class CohortPlan:
    """Bucket sizes of the padded cohort buffers (see the module docstring).

    pass_size: most agents one compiled pass trains (a multiple of ``align``).
    buckets: the sizes a pass may be padded to, ascending; the last is ``pass_size``.
    """

    pass_size: int
    buckets: tuple[int, ...]

    @classmethod
    def for_sampling(cls, sampling: Sampling, num_agents: int, *, align: int = 1,
                     pass_size: int | None = None) -> "CohortPlan":
        """The plan for ``sampling`` over N agents; ``align``: every bucket a multiple of it
        (the number of devices the cohort is sharded over)."""
        validation.check_int("align", align, minimum=1)
        if pass_size is None:
            if sampling.kind == "fixed":
                pass_size = sampling.size
            else:
                mean = sampling.rate * num_agents
                pass_size = math.ceil(mean + 2.0 * math.sqrt(mean * (1.0 - sampling.rate)))
            pass_size = min(max(1, pass_size), num_agents)
        validation.check_int("pass_size", pass_size, minimum=1)
        pass_size = _round_up(pass_size, align)
        if sampling.kind == "fixed":
            buckets = (pass_size,)
        else:
            buckets = tuple(sorted({_round_up(max(1, math.ceil(pass_size / 2 ** j)), align)
                                    for j in range(3)}))
        return cls(pass_size=pass_size, buckets=buckets)

    def bucket(self, m: int) -> int:
        """The smallest bucket holding ``m <= pass_size`` agents."""
        for b in self.buckets:
            if m <= b:
                return b
        raise ValueError(f"a pass holds at most {self.pass_size} agents, got {m}")

    def passes(self, m: int) -> list[tuple[int, int]]:
        """``[(start, bucket), ...]``: the cohort's rows ``[start, start + bucket)`` per pass.

        Every sampled agent is in exactly one pass; the last pass is padded to its bucket."""
        out = []
        start = 0
        while m - start > self.pass_size:
            out.append((start, self.pass_size))
            start += self.pass_size
        out.append((start, self.bucket(max(m - start, 0))))
        return out


@dataclasses.dataclass
class CohortPass:
    """One padded pass of a round's cohort (device arrays, ready for the compiled round).

    ids [B] int32: agent indices (padding repeats a real agent, or agent 0 for an empty cohort).
    valid [B] bool: True for the pass's real participants.
    data: the gathered agents ``[B, ...]`` (host-resident data), or None (device-resident data:
      the compiled round gathers ``ids`` from the population itself).
    """

    ids: jax.Array
    valid: jax.Array
    data: StackedData | None


@dataclasses.dataclass
class Cohort:
    """A round's participants: their indices (host) and the passes that train them."""

    indices: np.ndarray            # [M] sorted int64
    passes: list[CohortPass]

    @property
    def size(self) -> int:
        return int(self.indices.shape[0])


def pad_ids(indices: np.ndarray, start: int, bucket: int) -> tuple[np.ndarray, np.ndarray]:
    """``(ids [bucket] int32, valid [bucket] bool)`` for rows ``[start, start + bucket)`` of
    the cohort ``indices``: padding repeats the pass's last real agent (or the cohort's last,
    or agent 0 for an empty cohort) and is marked invalid."""
    chunk = indices[start:start + bucket]
    valid = np.zeros((bucket,), bool)
    valid[:len(chunk)] = True
    fill = chunk[-1] if len(chunk) else (indices[-1] if len(indices) else 0)
    ids = np.full((bucket,), fill, np.int64)
    ids[:len(chunk)] = chunk
    return ids.astype(np.int32), valid


def common_passes(plan: CohortPlan, cohorts: Sequence[np.ndarray]
                  ) -> list[tuple[np.ndarray, np.ndarray]]:
    """S >= 1 cohorts (each sorted agent indices ``[M_s]``) laid out in common passes:
    ``[(ids [S, B_j] int32, valid [S, B_j] bool), ...]``, j = 1..P, where

        P   = max_s len(plan.passes(M_s))                      the most passes any cohort needs
        B_j = plan.bucket(max_s min(max(M_s - (j-1) pass_size, 0), pass_size))

    and row s of pass j is ``pad_ids(cohort_s, (j-1) pass_size, B_j)``. A cohort with fewer
    passes than P gets all-padding passes (every row invalid). For S = 1 these are exactly the
    passes of :meth:`CohortPlan.passes` (the same starts and buckets)."""
    num_passes = max(len(plan.passes(len(ix))) for ix in cohorts)
    out = []
    for j in range(num_passes):
        start = j * plan.pass_size
        bucket = plan.bucket(max(min(max(len(ix) - start, 0), plan.pass_size)
                                 for ix in cohorts))
        rows = [pad_ids(ix, start, bucket) for ix in cohorts]
        out.append((np.stack([ids for ids, _ in rows]), np.stack([v for _, v in rows])))
    return out


def gather_host(data: StackedData, ids: np.ndarray) -> StackedData:
    """Rows ``ids`` of host-resident (numpy / memory-mapped) stacked data, as numpy arrays.

    A read-only memory map's pages are handed back after the copy
    (:func:`fedjax_dp.core.stacked.release_pages`), so a run's resident memory grows with the
    cohort, not with how many agents rounds have touched so far."""
    rows = jax.tree.map(lambda a: np.take(a, ids, axis=0), data)
    jax.tree.map(release_pages, data)
    return rows


class CohortFeeder:
    """Prepares rounds' cohorts: sample, plan passes, gather (host data) and transfer.

    ``get(k_sample)`` returns the round's :class:`Cohort`; ``prefetch(k_sample)`` starts preparing a
    later round's cohort in a background thread (double buffering: host gather and transfer overlap
    the current round's compute). Results are identical with or without prefetching. ``shapes_used``
    records the bucket sizes seen (each one compilation of the round)."""

    def __init__(self, data: StackedData, sampling: Sampling, plan: CohortPlan, *,
                 sharding: Any = None):
        self.data = data
        self.num_agents = data.num_agents
        self.sampling = sampling
        self.plan = plan
        self.on_host = is_on_host(data)
        self.sharding = sharding
        self.shapes_used: set[int] = set()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._pending: dict[bytes, concurrent.futures.Future] = {}

    @property
    def pending_rounds(self) -> int:
        """How many prefetched cohorts (:meth:`prefetch`) are not yet taken by :meth:`get`."""
        return len(self._pending)

    @staticmethod
    def _tag(key: jax.Array) -> bytes:
        return np.asarray(jax.random.key_data(key)).tobytes()

    def _sharded(self, rows: np.ndarray, source: np.ndarray) -> jax.Array:
        """``source[rows]`` as a global array with the agent axis split over the mesh: every
        process gathers and transfers only the rows of its own devices' shards (the same
        program runs unchanged on several hosts under ``jax.distributed``)."""
        shape = (len(rows),) + tuple(source.shape[1:])

        def shard(index):
            return np.take(source, rows[index[0]], axis=0)[(slice(None),) + tuple(index[1:])]

        return jax.make_array_from_callback(shape, self.sharding, shard)

    def prepare(self, key: jax.Array) -> Cohort:
        indices = sample_cohort(key, self.num_agents, self.sampling)
        passes = []
        for ids, valid in common_passes(self.plan, [indices]):        # one cohort: S = 1
            ids, valid = ids[0], valid[0]
            bucket = len(ids)
            if self.sharding is not None:
                positions = np.arange(bucket)
                ids_d, valid_d = self._sharded(positions, ids), self._sharded(positions, valid)
                chunk_d = jax.tree.map(lambda a: self._sharded(ids, a), self.data) \
                    if self.on_host else None
            else:
                chunk = gather_host(self.data, ids) if self.on_host else None
                ids_d, valid_d, chunk_d = jax.device_put((ids, valid, chunk))
            passes.append(CohortPass(ids=ids_d, valid=valid_d, data=chunk_d))
        return Cohort(indices=indices, passes=passes)

    def prefetch(self, key: jax.Array) -> None:
        """Start preparing the cohort of ``key`` in the background (no-op if already started,
        or where :func:`fedjax_dp.core.defaults.defaults` turns prefetching off)."""
        tag = self._tag(key)
        if tag in self._pending:
            return
        if self._pool is None:
            d = defaults_lib.defaults()
            if not d.prefetch:
                return
            self._pool = concurrent.futures.ThreadPoolExecutor(d.prefetch_threads,
                                                               thread_name_prefix="cohort")
        self._pending[tag] = self._pool.submit(self.prepare, key)

    def get(self, key: jax.Array) -> Cohort:
        future = self._pending.pop(self._tag(key), None) if self._pending else None
        cohort = future.result() if future is not None else self.prepare(key)
        self.shapes_used.update(int(p.ids.shape[0]) for p in cohort.passes)
        return cohort


def population_pass(data: StackedData, mask) -> CohortPass:
    """Every agent as one pass with ``valid = mask`` (the masked all-agent reference round);
    ``mask`` is ``[N]`` or, for S seeds sharing the pass, ``[S, N]`` (ids ``[N]`` shared)."""
    n = int(np.shape(mask)[-1])
    return CohortPass(ids=jnp.arange(n, dtype=jnp.int32), valid=jnp.asarray(mask) > 0,
                      data=data)


def take_rows(population: StackedData, ids: jax.Array) -> StackedData:
    """Inside a compiled round: the agents ``ids`` of device-resident data (a gather)."""
    return jax.tree.map(lambda a: _take0(a, ids), population)


def _take0(a: jax.Array, ids: jax.Array) -> jax.Array:
    """``jnp.take(a, ids, axis=0)``; typed PRNG keys through their key data (jax 0.6.1 has no
    gather fill value for a key dtype: "Unsupported dtype for gather fill_value key<fry>")."""
    if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
        return jax.random.wrap_key_data(jnp.take(jax.random.key_data(a), ids, axis=0),
                                        impl=jax.random.key_impl(a))
    return jnp.take(a, ids, axis=0)


def masked_sum(tree: Any, valid: jax.Array) -> Any:
    """``sum_b [valid_b] tree_b`` over the leading axis; padding rows are selected away (a NaN in
    a padding row cannot leak into the sum, unlike a multiply by 0)."""
    def one(leaf):
        v = valid.reshape(valid.shape + (1,) * (leaf.ndim - 1))
        return jnp.sum(jnp.where(v, leaf, jnp.zeros((), leaf.dtype)), axis=0)
    return jax.tree.map(one, tree)


def cohort_keys(key: jax.Array, ids: jax.Array) -> jax.Array:
    """One key per agent of the pass: ``fold_in(key, id)`` (agent i's key does not depend on
    which other agents were sampled, nor on the pass it lands in)."""
    return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, ids)
