"""The seed driver: S runs of one algorithm that differ only in their root key (and the data it
partitioned), each step of all S runs as ONE compiled call over a seed axis.

Run s is exactly :func:`fedjax_dp.algorithms.api.run` ``(algorithm, keys[s], data[s], ...)``:
the same ``init``, the same step keys :func:`~fedjax_dp.algorithms.api.step_key`
``(keys[s], t)``; only the execution differs, so results agree to float tolerance (tested).
An algorithm opts in with one of its optional hooks (:class:`fedjax_dp.algorithms.api.
Algorithm`): ``seed_step`` (a pure step, vmapped here over the seeds) or the batched step
``batch_plan`` / ``batched_step`` (host work per seed, compiled calls over the seeds).
"""
from __future__ import annotations

import functools
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

from fedjax_dp.algorithms import api
from fedjax_dp.algorithms.api import Algorithm, FederatedData, Output, Result, Runtime, State
from fedjax_dp.core import memory, validation
from fedjax_dp.core.seed_axis import same_layout, share_or_stack, stack_seeds, unstack_seeds
from fedjax_dp.models import Model

__all__ = ["can_vmap_seeds", "run_seeds", "seed_batch"]

#: ``batch(states, keys) -> (states, metrics per seed)``: step t of S seeds together
Batch = Callable[[Sequence[State], Sequence[jax.Array]], tuple[list[State], list[dict]]]


def can_vmap_seeds(algorithm: Algorithm) -> bool:
    """Whether ``algorithm`` can step several seeds together: it exposes its step as a pure
    function (``seed_step``) or a batched step over seeds (``batch_plan`` / ``batched_step``)."""
    return api.hooks(algorithm).can_vmap_seeds


@functools.lru_cache(maxsize=64)
def _vmapped(fn: Callable, data_axis: int | None) -> Callable:
    """``fn`` vmapped over the seeds, the seeds' values stacked and unstacked inside the one
    compiled call: ``(keys tuple, values tuple, data) -> (values tuple, metrics [S])``."""

    def call(keys, values, data):
        new, metrics = jax.vmap(fn, in_axes=(0, 0, data_axis))(jnp.stack(keys),
                                                               stack_seeds(values), data)
        return unstack_seeds(new, len(keys)), metrics

    return jax.jit(call)


def seed_batch(algorithm: Algorithm, states: Sequence[State]) -> Batch | None:
    """The step of S seeds' ``states`` (all at one step) as one batch: ``batch(states, keys) ->
    (states, metrics)`` with entry s equal to ``algorithm.step(states[s], keys[s])`` to float
    tolerance. The algorithm's batched step where it declares one, else its ``seed_step``
    vmapped over the seeds (data shared when equal, stacked otherwise). None, before any work,
    where the seeds cannot share compiled calls: no hook, the hook declines these states, or
    the seeds' signatures, data or value layouts differ (the caller runs them one by one)."""
    h = api.hooks(algorithm)
    states = list(states)
    if not states or len({s.step for s in states}) != 1:
        return None
    if h.batched_step is not None:
        plan = h.batch_plan(states)
        return None if plan is None else functools.partial(h.batched_step, plan)
    if h.seed_step is None:
        return None
    parts = [h.seed_step(s) for s in states]
    if any(p is None for p in parts) or len({sig for _, _, sig in parts}) != 1:
        return None
    shared, data_axis = share_or_stack([d for _, d, _ in parts])
    if shared is None or not same_layout([s.values for s in states]):
        return None
    call = _vmapped(parts[0][0], data_axis)

    def batch(states: Sequence[State], keys: Sequence[jax.Array]):
        args = (tuple(keys), tuple(s.values for s in states), shared)
        memory.check_call(call, *args, what=f"one step of {len(states)} seeds")
        values, metrics = call(*args)
        host = jax.device_get(metrics)
        return ([State(step=s.step + 1, values=v, context=s.context)
                 for s, v in zip(states, values)],
                [{k: v[i] for k, v in host.items()} for i in range(len(states))])

    return batch


def run_seeds(algorithm: Algorithm, keys: Sequence[jax.Array], data: Sequence[FederatedData],
              model: Model, config: Any, *, runtime: Runtime = Runtime(),
              evaluate: Callable[[Output, int], dict] | None = None, eval_every: int = 0,
              on_step: Callable[[int, list[dict]], None] | None = None) -> list[Result] | None:
    """S runs of ``algorithm`` that differ only in their root key (and the data it partitioned),
    each step of all S runs as one batch (:func:`seed_batch`).

    Returns None, before any step, when the seeds cannot share compiled calls
    (:func:`seed_batch`). ``evaluate(output, s)`` and ``on_step(t + 1, records)`` as in
    :func:`~fedjax_dp.algorithms.api.run`, with one record per seed.
    """
    api.check_init(config, algorithm.Config)
    if len(keys) != len(data) or not keys:
        raise ValueError(f"keys and data must have one entry per seed (>= 1), got {len(keys)} "
                         f"keys and {len(data)} data")
    validation.check_int("eval_every", eval_every, minimum=0)
    if not can_vmap_seeds(algorithm):
        return None
    start = time.perf_counter()
    states = [algorithm.init(k, d, model, config, runtime) for k, d in zip(keys, data)]
    batch = seed_batch(algorithm, states)
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
