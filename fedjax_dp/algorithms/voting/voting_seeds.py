"""Several seeds of a voting run (AE-DPFL, kNN-DPFL) stepped together: the ``seeds_stepper`` hook
of :mod:`fedjax_dp.algorithms.api`.

A voting phase is a host loop over chunks of agents calling compiled functions (local training,
ballots or kNN counts, the tally's add, the release, the student's training), so the seeds of a
sweep cannot share one pure ``seed_step``. Here the host loops over the chunks ONCE for all S
seeds and every compiled call of a chunk is the single-seed call ``jax.vmap``-ed over a leading
seed axis:

* what differs between the seeds carries that axis: their named key streams (init, train,
  queries, feature map, vote, student), their queries, and -- when the partition depends on the
  seed -- their agents' data (each seed's chunk stacked on the seed axis);
* what they share does not (the agents' data when equal, a PCA feature map, the agent ids and
  padding of a chunk, sigma).

Seed s computes exactly what its own :func:`fedjax_dp.algorithms.api.run` computes, with the same
keys, so its labels, clean sums (exact integer counts), ledger and student equal its separate
run's to float tolerance (``tests/test_voting_seeds.py``). Host-only work that is not a compiled
call (the per-seed metrics, the self-training's confidence selection) stays per seed.

:func:`plan` returns None -- the caller runs the seeds one by one -- where the seeds cannot share
compiled calls: ``runtime.mesh`` (the sharded vote), secure aggregation (per-seed share streams
and dropouts, not vmapped), different configs, models or runtimes, host- and device-resident
agents mixed, or data of different shapes (agents, records per agent, public set).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, Iterable, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.core import agent_stream
from fedjax_dp.algorithms import api
from fedjax_dp.algorithms.voting import voting_dpfl
from fedjax_dp.train import student as student_lib
from fedjax_dp.core import StackedData, is_on_host

__all__ = ["Plan", "plan", "stepper", "stack_or_share", "seed_chunks", "streamed_vote",
           "student_phase"]

#: ``phase(plan, states) -> [(values, metrics)] per seed``: one phase of S seeds.
PhaseFn = Callable[["Plan", list], list]


@dataclasses.dataclass(frozen=True)
class Plan:
    """How S seeds of one voting configuration share their compiled calls.

    ``agents_axis``: None when every seed has the same agents (one chunk stream, data not
    batched), 0 when they differ (each chunk stacked on a leading seed axis).
    """

    num_seeds: int
    agents_axis: int | None


def _contexts(states: Sequence[api.State]) -> list[voting_dpfl.Context]:
    return [s.context for s in states]


def _leaf_specs(tree) -> tuple:
    return tuple((tuple(np.shape(l)), str(getattr(l, "dtype", type(l))))
                 for l in jax.tree.leaves(tree))


def _same_agents(datas: Sequence[StackedData]) -> bool:
    """Whether every seed holds the same agents: the same object, or (device-resident data)
    equal arrays. Host data (possibly a memory map) is never read whole to compare."""
    first = datas[0]
    if all(d is first for d in datas[1:]):
        return True
    if is_on_host(first):
        return False
    ref = [np.asarray(l) for l in jax.tree.leaves(first)]
    return all(all(np.array_equal(a, np.asarray(b)) for a, b in zip(ref, jax.tree.leaves(d)))
               for d in datas[1:])


def plan(states: Sequence[api.State]) -> Plan | None:
    """The :class:`Plan` of S seeds' states (fresh from ``init``), or None where they cannot
    share compiled calls (see the module docstring)."""
    states = list(states)
    if not states:
        return None
    ctxs = _contexts(states)
    c0 = ctxs[0]
    if any(s.step != states[0].step for s in states):
        return None
    if any(c.config != c0.config or c.model != c0.model or c.runtime != c0.runtime
           for c in ctxs[1:]):
        return None
    if c0.runtime.mesh is not None or c0.config.secagg is not None:
        return None
    datas = [c.data.agents for c in ctxs]
    if len({is_on_host(d) for d in datas}) != 1:
        return None
    if len({_leaf_specs(d) for d in datas}) != 1:
        return None
    if len({(np.shape(c.x_public), len(c.query_indices)) for c in ctxs}) != 1:
        return None
    return Plan(num_seeds=len(states), agents_axis=None if _same_agents(datas) else 0)


def stepper(states: Sequence[api.State], phases: tuple[str, ...],
            run_phase: dict[str, PhaseFn], *, extra_check: Callable | None = None):
    """The ``seeds_stepper`` of a voting algorithm: ``batch(states, keys) -> (states, metrics)``
    running the next phase of S seeds together (``run_phase[name](plan, states)`` gives each
    seed's ``(values, metrics)``), or None (:func:`plan`, or ``extra_check(states)`` False).
    ``keys`` are unused: each phase draws from the seeds' named streams, as ``step`` does."""
    p = plan(states)
    if p is None or (extra_check is not None and not extra_check(states)):
        return None

    def batch(states, keys=None):
        states = list(states)
        if len(states) != p.num_seeds or any(s.step != states[0].step for s in states):
            raise ValueError(f"the seeds' states must be {p.num_seeds} states at one step, got "
                             f"steps {[s.step for s in states]}")
        phase = voting_dpfl.check_step(states[0], phases)
        outs = run_phase[phase](p, states)
        pairs = [voting_dpfl.advance(st, values, phase, metrics)
                 for st, (values, metrics) in zip(states, outs)]
        return [st for st, _ in pairs], [m for _, m in pairs]

    return batch


def stack_or_share(arrays: Sequence[Any]) -> tuple[Any, int | None]:
    """``(array, axis)``: the first seed's (axis None) when all seeds' are equal (or all None),
    else the seeds' stacked on a leading axis (axis 0)."""
    first = arrays[0]
    if first is None:
        return None, None
    ref = np.asarray(first)
    if all(np.array_equal(ref, np.asarray(a)) for a in arrays[1:]):
        return jnp.asarray(first), None
    return jnp.stack([jnp.asarray(a) for a in arrays]), 0


def seed_chunks(datas: Sequence[StackedData], axis: int | None, size: int, *,
                extras: Sequence[tuple] = ()) -> Iterator[agent_stream.Chunk]:
    """The agents of S seeds in chunks of ``size`` (:func:`agent_stream.chunks`, host data
    double-buffered): ``chunk.agents`` is the shared chunk (``axis`` None) or the seeds' chunks
    stacked ``[S, size, ...]`` (``axis`` 0); ``extras[s]`` holds seed s's per-agent host arrays
    ``[N, ...]``, returned as ``chunk.extra`` stacked ``[S, size, ...]``. ``start``,
    ``num_real`` and ``valid`` are the seeds' (equal numbers of agents)."""
    extras = [tuple(e) for e in extras] or [() for _ in datas]
    if axis is None:
        joint = tuple(np.stack([e[j] for e in extras], axis=1)          # [N, S, ...]
                      for j in range(len(extras[0])))
        for chunk in agent_stream.chunks(datas[0], size, extra=joint):
            yield dataclasses.replace(chunk, extra=tuple(jnp.moveaxis(e, 1, 0)
                                                         for e in chunk.extra))
        return
    streams = [agent_stream.chunks(d, size, extra=e) for d, e in zip(datas, extras)]
    for parts in zip(*streams):
        agents = jax.tree.map(lambda *ls: jnp.stack(ls), *[c.agents for c in parts])
        extra = tuple(jnp.stack(ls) for ls in zip(*[c.extra for c in parts]))
        yield dataclasses.replace(parts[0], agents=agents, extra=extra)


# --------------------------------------------------------------------------- the vote

@functools.lru_cache(maxsize=32)
def _tally_add_fn(num_classes: int, per_agent: bool):
    """:func:`voting_dpfl.tally_add` over a leading seed axis of the tally, the vote key and the
    ballots (agent ids, padding and the noise share's std shared)."""
    def one(tally, key, ballots, ids, valid, std):
        return voting_dpfl.tally_add(tally, key, ballots, ids, valid, std,
                                     num_classes=num_classes, per_agent=per_agent)
    return jax.jit(jax.vmap(one, in_axes=(0, 0, 0, None, None, None)))


@functools.lru_cache(maxsize=32)
def _tally_release_fn(noise: str):
    """:func:`voting_dpfl.tally_release` over a leading seed axis of the tally and the key."""
    def one(tally, key, sigma, divisor):
        return voting_dpfl.tally_release(tally, key, sigma, divisor, noise=noise)
    return jax.jit(jax.vmap(one, in_axes=(0, 0, None, None)))


def streamed_vote(states: Sequence[api.State], blocks: Iterable[tuple], total: int, *,
                  divisor: float = 1.0) -> list[tuple[dict, dict]]:
    """:func:`voting_dpfl.streamed_vote_phase` of S seeds (no secure aggregation):
    ``blocks`` yields ``(ballots [S, a, ...], agent ids [a], valid [a])`` per chunk of agents,
    every seed's tally grows in one vmapped :func:`voting_dpfl.tally_add` per chunk (seed s's
    noise shares from its own ``vote`` key) and one vmapped :func:`voting_dpfl.tally_release`
    releases all seeds' labels. Returns each seed's ``(values, metrics)``."""
    ctxs = _contexts(states)
    c0 = ctxs[0]
    cfg = c0.config
    n, c = c0.data.num_agents, c0.model.num_classes
    q = len(c0.query_indices)
    per_agent = cfg.vote_noise == "per_agent"
    std = jnp.float32(cfg.sigma / math.sqrt(n))
    keys = jnp.stack([ctx.keys["vote"] for ctx in ctxs])                          # [S]
    zero = voting_dpfl.tally_init(q, c)
    tally = jax.tree.map(lambda l: jnp.broadcast_to(l, (len(ctxs),) + l.shape), zero)
    add = _tally_add_fn(c, per_agent)
    with c0.runtime.progress.task("vote", total=total, unit="chunk") as task:
        for ballots, ids, valid in blocks:
            tally = add(tally, keys, ballots, ids, valid, std)
            task.update(1)
    labels = np.asarray(_tally_release_fn(cfg.vote_noise)(
        tally, keys, jnp.float32(cfg.sigma), jnp.float32(divisor)))                 # [S, Q]
    counts = np.asarray(tally.counts) if cfg.data_dependent else None
    outs = []
    for s, (state, ctx) in enumerate(zip(states, ctxs)):
        values = {**state.values, "labels": labels[s]}
        if counts is not None:
            values["clean_vote_sums"] = np.asarray(counts[s], np.float64) / divisor
        outs.append((values, voting_dpfl.vote_metrics(ctx, labels[s])))
    return outs


# --------------------------------------------------------------------------- the student

def student_phase(plan: Plan, states: Sequence[api.State]) -> list[tuple[dict, dict]]:
    """:func:`voting_dpfl.student_phase` of S seeds: every training of the S students (the
    supervised one, each self-training round) is one compiled call over the S students
    (:func:`fedjax_dp.train.student.train_students`)."""
    ctxs = _contexts(states)
    c0 = ctxs[0]
    cfg = c0.config
    semi = cfg.semi_supervised
    with c0.runtime.progress.task("student", total=student_lib.num_trainings(semi),
                                  unit="model" if semi is None else "round") as task:
        params = student_lib.train_students(
            [ctx.keys["student"] for ctx in ctxs], c0.model, [ctx.x_public for ctx in ctxs],
            [ctx.query_indices for ctx in ctxs], [st.values["labels"] for st in states],
            cfg.student, semi, on_round=task.update)
    return [({**st.values, "params": p}, {}) for st, p in zip(states, params)]
