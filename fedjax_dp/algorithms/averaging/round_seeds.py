"""S seeds' federated-averaging rounds as ONE compiled call per round (FedAvg, DP-FedAvg,
DP-FedSGD): the ``seeds_stepper`` hook of :mod:`fedjax_dp.algorithms.api`.

A round of one seed (:class:`fedjax_dp.algorithms.averaging.fedavg.RoundRunner`) draws its cohort on the
host, pads it into passes of a few bucket sizes and runs the compiled ``train_sum`` / ``server``
(or ``fused``). Seeds draw cohorts of different sizes, so their rounds cannot share one call as
they are. Here, per round:

    (k_sample_s, k_train_s, k_noise_s) = round_keys(key_s)           s = 1..S (one vmapped call)
    cohort_s = sample_cohort(k_sample_s, N, sampling)                host, exactly as run s draws
    passes   = B_1, ..., B_P  common to all seeds: P the most passes any seed needs, B_j the
               smallest bucket of the plan holding every seed's rows of pass j
    (params_s, metrics_s) = server(k_noise_s, params_s,
                                   sum_j train_sum(k_train_s, params_s, ..., ids_sj, valid_sj))
                                                                    vmapped over s, ONE call

Why each seed's result is its separate run's: agent i trains with ``fold_in(k_train_s, i)``
whatever pass or padding it lands in; padding rows are selected away by ``valid`` (the sum, the
metric sums and the count ``num_sampled`` see only the cohort); a seed with fewer passes than P
adds all-padding passes, which add exact zeros. No cohort is ever truncated (a draw larger than
one pass runs as several passes, as in the separate run). Only float summation order differs, so
results agree to float tolerance. The ledgers read the config and the state exactly as before
(DP-FedSGD's ``participation`` counts are updated here from the same cohorts).

The seeds' agents (and per-agent ``extras``) are shared when equal and stacked on a seed axis
otherwise. :func:`stepper` returns None (the seeds then run one by one) for host-resident agents
(their cohorts are gathered and transferred by a feeder on the host), a mesh, secure aggregation
(its masking and dropouts depend on the pass size), or seeds whose rounds differ in anything but
the key and the data values (compiled pieces, plan, execution, data or parameter shapes).
``runtime.cohort = "masked"`` is supported: every seed's population pass with its own mask.

Each seed's runner records the pass sizes actually run (``compiled_pass_sizes`` in the run's
``artifacts``: the common sizes, which may exceed the seed's own buckets) and the round's
participants (``last_indices``).
"""
from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.algorithms import api
from fedjax_dp.algorithms.averaging import fedavg
from fedjax_dp.core import is_on_host
from fedjax_dp.core import cohort as cohort_lib
from fedjax_dp.core import memory

Params = Any


def stepper(states: Sequence[api.State], *, participation: bool = False) -> Callable | None:
    """The ``seeds_stepper`` of a round-based averaging algorithm whose ``state.context.round_fn``
    is a :class:`fedavg.RoundRunner` and whose ``state.values`` hold ``"params"`` (and, with
    ``participation``, DP-FedSGD's rounds-per-agent counts ``"participation" [N]``).

    Returns ``batch(states, keys) -> (states, metrics)`` with ``batch(...)[s]`` equal to the
    algorithm's ``step(states[s], keys[s])`` (to float tolerance), or None when these seeds
    cannot share compiled calls.
    """
    if not states or len({s.step for s in states}) != 1:
        return None
    runners = [getattr(s.context, "round_fn", None) for s in states]
    if not all(isinstance(r, fedavg.RoundRunner) for r in runners):
        return None
    rounds = SeedRounds.create(runners, [s.values["params"] for s in states])
    if rounds is None:
        return None

    def batch(states: Sequence[api.State], keys: Sequence[jax.Array]):
        if len(states) != len(runners) or any(s.context.round_fn is not r
                                              for s, r in zip(states, runners)):
            raise ValueError("seeds_stepper: batch() must get the states it was built for")
        counts = [s.values["participation"] for s in states] if participation else None
        params, metrics, counts = rounds([s.values["params"] for s in states], keys, counts)
        out = []
        for i, s in enumerate(states):
            values = {**s.values, "params": params[i]}
            if participation:
                values["participation"] = counts[i]
            out.append(api.State(step=s.step + 1, values=values, context=s.context))
        return out, metrics

    return batch


def _shapes(tree) -> tuple:
    return (jax.tree.structure(tree),
            tuple((tuple(np.shape(x)), str(getattr(x, "dtype", type(x))))
                  for x in jax.tree.leaves(tree)))


class SeedRounds:
    """The rounds of S seeds' :class:`fedavg.RoundRunner` stepped together
    (:meth:`create`, then ``rounds(params, keys, counts) -> (params, metrics, counts)``)."""

    def __init__(self, runners, source, source_axis, extras, extras_axis):
        self.runners = list(runners)
        r = self.runners[0]
        self.masked = r.mode == "masked"
        self.num_agents, self.sampling, self.plan = r.num_agents, r.spec.sampling, r.plan
        self.source, self.source_axis = source, source_axis
        self.extras, self.extras_axis = extras, extras_axis
        self.train_sum, self.server = r.parts[0], r.parts[1]

    @classmethod
    def create(cls, runners: Sequence[fedavg.RoundRunner],
               params: Sequence[Params]) -> "SeedRounds | None":
        """None where the seeds cannot share a compiled round (see the module docstring)."""
        r0 = runners[0]
        for r in runners:
            if (r.mesh is not None or r.spec.secagg is not None or is_on_host(r.agents)
                    or r.mode != r0.mode or r.parts is not r0.parts or r.plan != r0.plan
                    or r.spec != r0.spec or r.num_agents != r0.num_agents):
                return None
        if len({_shapes(p) for p in params}) != 1:
            return None
        source, source_axis = api.share_or_stack([r.agents for r in runners])
        extras, extras_axis = api.share_or_stack([r.extras for r in runners])
        if source is None or extras is None:
            return None
        return cls(runners, source, source_axis, extras, extras_axis)

    # ------------------------------------------------------------------ host: the cohorts

    def _cohorts(self, k_sample: jax.Array):
        """Every seed's cohort drawn as its own run draws it, laid out in common passes:
        ``(indices per seed, sizes (B_1..B_P), ids, valid)`` (ids ``[S, sum B]`` or, masked,
        the shared ``[N]``; valid ``[S, sum B]``)."""
        n, S = self.num_agents, len(self.runners)
        if self.masked:
            masks = np.stack([fedavg.sample_agents(k_sample[s], n, self.sampling)
                              for s in range(S)])
            indices = [np.flatnonzero(m) for m in masks]
            return indices, (n,), np.arange(n, dtype=np.int32), masks > 0
        indices = [cohort_lib.sample_cohort(k_sample[s], n, self.sampling) for s in range(S)]
        plan = self.plan
        num_passes = max(len(plan.passes(len(ix))) for ix in indices)
        sizes = tuple(plan.bucket(max(min(max(len(ix) - j * plan.pass_size, 0), plan.pass_size)
                                      for ix in indices)) for j in range(num_passes))
        total = sum(sizes)
        ids = np.zeros((S, total), np.int32)
        valid = np.zeros((S, total), bool)
        for s, ix in enumerate(indices):
            at = 0
            for j, b in enumerate(sizes):
                chunk = ix[j * plan.pass_size:j * plan.pass_size + b]
                # padding repeats a real agent (as cohort.CohortFeeder pads a pass)
                fill = chunk[-1] if len(chunk) else (ix[-1] if len(ix) else 0)
                ids[s, at:at + b] = fill
                ids[s, at:at + len(chunk)] = chunk
                valid[s, at:at + len(chunk)] = True
                at += b
        return indices, sizes, ids, valid

    # ------------------------------------------------------------------ one round, S seeds

    def __call__(self, params: Sequence[Params], keys: Sequence[jax.Array],
                 counts: Sequence[jax.Array] | None = None):
        """Round t of every seed: ``(params per seed, metrics per seed (host), counts per seed
        or None)``; ``counts`` (rounds per agent ``[N]``) gain one for each participant."""
        k_sample, k_train, k_noise = _round_keys(tuple(keys))
        indices, sizes, ids, valid = self._cohorts(k_sample)
        fns = _compiled(self.train_sum, self.server, self.source_axis, self.extras_axis,
                        not self.masked)
        params = tuple(params)
        counts = None if counts is None else tuple(counts)
        what = (f"a round's local training of {len(self.runners)} seeds ({max(sizes)} agents "
                "per pass)")
        drivers = self.runners[0].memory_drivers           # refused before its first run
        if len(sizes) == 1:                   # the usual round: one pass, one compiled call
            args = (k_train, k_noise, params, self.source, ids, valid, self.extras, counts)
            memory.check_call(fns.fused, *args, what=what, drivers=drivers)
            params, metrics, counts = fns.fused(*args)
        else:                                 # a draw larger than a pass: the passes' sums added
            stacked, total, at = fns.stack(params), None, 0
            for b in sizes:
                pass_ids, pass_valid = ids[:, at:at + b], valid[:, at:at + b]
                args = (k_train, stacked, self.source, pass_ids, pass_valid, self.extras)
                memory.check_call(fns.train, *args, what=what, drivers=drivers)
                sums = fns.train(*args)
                total = sums if total is None else fns.add(total, sums)
                if counts is not None:
                    counts = fns.count(counts, pass_ids, pass_valid)
                at += b
            params, metrics = fns.server(k_noise, stacked, total)
        for r, ix in zip(self.runners, indices):
            r.last_indices = ix
            if not self.masked:
                r.feeder.shapes_used.update(sizes)
        host = jax.device_get(metrics)
        per_seed = [{k: v[s] for k, v in host.items()} for s in range(len(self.runners))]
        return list(params), per_seed, None if counts is None else list(counts)


@jax.jit
def _round_keys(keys: tuple) -> tuple[jax.Array, jax.Array, jax.Array]:
    """:func:`fedavg.round_keys` of every seed's step key, ``[S]`` each (one call)."""
    return jax.vmap(fedavg.round_keys)(jnp.stack(keys))


def _add(a, b):
    return jax.tree.map(jnp.add, a, b)


def _count(counts: tuple, ids, valid) -> tuple:
    """Each seed's rounds-per-agent counts plus one for its pass's real rows (ids ``[S, B]``, or
    ``[B]`` shared by the seeds)."""
    return tuple(c.at[ids if ids.ndim == 1 else ids[s]].add(valid[s].astype(c.dtype))
                 for s, c in enumerate(counts))


@functools.lru_cache(maxsize=64)
def _compiled(train_sum: Callable, server: Callable, source_axis, extras_axis,
              gather: bool) -> SimpleNamespace:
    """The compiled pieces of :class:`fedavg.RoundRunner`'s round vmapped over the seeds (the
    seeds' params as a tuple of trees, unstacked inside the calls; ids ``[S, B]`` or, for the
    masked population pass, ``[N]`` shared; every other per-seed input ``[S]``):

    ``fused(k_train, k_noise, params, source, ids, valid, extras, counts | None) -> (params,
    metrics, counts)``: a one-pass round (train_sum + server + participation counts);
    ``stack(params)``, ``train(k_train, stacked, source, ids, valid, extras) -> sums``,
    ``add``, ``count(counts, ids, valid)``, ``server(k_noise, stacked, sums) -> (params,
    metrics)``: a round of several passes. One compilation per pass size B (few: the plan's
    buckets), as for one seed."""

    def one_train(k_train, params, source, ids, valid, extras):
        return train_sum(k_train, params, source, ids if gather else None, ids, valid, extras)

    def train(k_train, stacked, source, ids, valid, extras):
        ids_axis = None if ids.ndim == 1 else 0
        return jax.vmap(one_train, in_axes=(0, 0, source_axis, ids_axis, 0, extras_axis))(
            k_train, stacked, source, ids, valid, extras)

    def finish(k_noise, stacked, sums):
        new, metrics = jax.vmap(server)(k_noise, stacked, sums)
        return api.unstack_seeds(new, k_noise.shape[0]), metrics

    def fused(k_train, k_noise, params, source, ids, valid, extras, counts):
        stacked = api.stack_seeds(params)
        new, metrics = finish(k_noise, stacked,
                              train(k_train, stacked, source, ids, valid, extras))
        return new, metrics, None if counts is None else _count(counts, ids, valid)

    return SimpleNamespace(fused=jax.jit(fused), stack=jax.jit(api.stack_seeds), train=jax.jit(train),
                           add=jax.jit(_add), count=jax.jit(_count), server=jax.jit(finish))
