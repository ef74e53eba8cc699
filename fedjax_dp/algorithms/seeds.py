"""The seed driver: S runs of one algorithm that differ only in their root key (and the data it
partitioned), each step of all S runs as ONE compiled call over a seed axis.

Run s is exactly :func:`fedjax_dp.algorithms.api.run` ``(algorithm, keys[s], data[s], ...)``:
the same ``init``, the same step keys :func:`~fedjax_dp.algorithms.api.step_key`
``(keys[s], t)``; only the execution differs, so results agree to float tolerance (tested).
An algorithm opts in with one of its optional hooks (:class:`fedjax_dp.algorithms.api.
Algorithm`): ``seed_step`` (its step as a pure function, vmapped here over the seeds) or
``seeds_stepper`` (a batched step with host work per seed).
"""
from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import jax
import numpy as np

from fedjax_dp.algorithms import api
from fedjax_dp.algorithms.api import Algorithm, FederatedData, Output, Result, Runtime, State
from fedjax_dp.core import validation
from fedjax_dp.core.seed_axis import share_or_stack, stack_seeds
from fedjax_dp.models import Model

__all__ = ["can_vmap_seeds", "run_seeds"]


def can_vmap_seeds(algorithm: Algorithm) -> bool:
    """Whether ``algorithm`` can step several seeds together: it exposes its step as a pure
    function (``seed_step``) or a batched step over seeds (``seeds_stepper``)."""
    return api.hooks(algorithm).can_vmap_seeds


def run_seeds(algorithm: Algorithm, keys: Sequence[jax.Array], data: Sequence[FederatedData],
              model: Model, config: Any, *, runtime: Runtime = Runtime(),
              evaluate: Callable[[Output, int], dict] | None = None, eval_every: int = 0,
              on_step: Callable[[int, list[dict]], None] | None = None) -> list[Result] | None:
    """S runs of ``algorithm`` that differ only in their root key (and the data it partitioned),
    each step of all S runs as ONE vmapped, compiled call.

    Run s is exactly :func:`fedjax_dp.algorithms.api.run` ``(algorithm, keys[s], data[s], ...)``:
    the same ``init``, the same step keys ``step_key(keys[s], t)``; only the execution differs
    (``jax.vmap`` over the
    seed axis of the state, the keys and -- when the seeds' stacked data differ -- the data), so
    results agree to float tolerance (tested). Returns None, before any step, when the seeds
    cannot share one compiled step: the algorithm has no ``seed_step``, or the seeds' signatures
    or data shapes differ (the caller then runs them one by one). ``evaluate(output, s)`` and
    ``on_step(t + 1, records)`` as in :func:`~fedjax_dp.algorithms.api.run`, with one record per
    seed.
    """
    if not isinstance(config, algorithm.Config):
        raise ValueError(f"config must be a {algorithm.Config.__module__}.Config, got "
                         f"{type(config).__name__}")
    if len(keys) != len(data) or not keys:
        raise ValueError(f"keys and data must have one entry per seed (>= 1), got {len(keys)} "
                         f"keys and {len(data)} data")
    validation.check_int("eval_every", eval_every, minimum=0)
    h = api.hooks(algorithm)
    if not h.can_vmap_seeds:
        return None
    start = time.perf_counter()
    states = [algorithm.init(k, d, model, config, runtime) for k, d in zip(keys, data)]
    if h.seeds_stepper is not None:
        return _run_seeds_batched(algorithm, h.seeds_stepper, keys, states, config, evaluate,
                                  eval_every, on_step, start)
    parts = [h.seed_step(s) for s in states]
    if len({sig for _, _, sig in parts}) != 1:
        return None
    shared, data_axis = share_or_stack([d for _, d, _ in parts])
    shapes = {tuple((np.shape(x), str(getattr(x, "dtype", type(x)))) for x in jax.tree.leaves(s.values))
              for s in states}
    if shared is None or len(shapes) != 1:
        return None
    values = stack_seeds([s.values for s in states])
    fn = parts[0][0]
    batched = jax.jit(jax.vmap(fn, in_axes=(0, 0, data_axis)))
    step_keys = jax.jit(jax.vmap(api.step_key, in_axes=(0, None)))
    root = jax.numpy.stack(list(keys))
    total = algorithm.num_steps(config)
    histories: list[list[dict]] = [[] for _ in states]

    def seed_state(s: int, t: int) -> State:
        return State(step=t, values=jax.tree.map(lambda x: x[s], values),
                     context=states[s].context)

    for t in range(states[0].step, total):
        values, metrics = batched(step_keys(root, t), values, shared)
        host = jax.device_get(metrics)
        records = []
        for s in range(len(states)):
            record = {"round": t + 1, **{k: api.host_value(v[s]) for k, v in host.items()}}
            if evaluate is not None and eval_every and ((t + 1) % eval_every == 0
                                                        or t + 1 == total):
                record.update(evaluate(algorithm.output(seed_state(s, t + 1)), s))
            histories[s].append(record)
            records.append(record)
        if on_step is not None:
            on_step(t + 1, records)
    wall = time.perf_counter() - start
    return [Result(state=seed_state(s, total), history=histories[s], wall_time_s=wall)
            for s in range(len(states))]


def _run_seeds_batched(algorithm, seeds_stepper, keys, states, config, evaluate, eval_every,
                       on_step, start) -> list[Result] | None:
    """:func:`run_seeds` through the algorithm's ``seeds_stepper`` (host work per seed, compiled
    calls vmapped over the seeds)."""
    batch = seeds_stepper(states)
    if batch is None:
        return None
    total = algorithm.num_steps(config)
    histories: list[list[dict]] = [[] for _ in states]
    for t in range(states[0].step, total):
        states, metrics = batch(states, [api.step_key(k, t) for k in keys])
        metrics = jax.device_get(metrics)
        records = []
        for s, (state, m) in enumerate(zip(states, metrics)):
            record = {"round": t + 1, **{k: api.host_value(v) for k, v in m.items()}}
            if evaluate is not None and eval_every and ((t + 1) % eval_every == 0
                                                        or t + 1 == total):
                record.update(evaluate(algorithm.output(state), s))
            histories[s].append(record)
            records.append(record)
        if on_step is not None:
            on_step(t + 1, records)
    wall = time.perf_counter() - start
    return [Result(state=state, history=h, wall_time_s=wall) for state, h in zip(states, histories)]
