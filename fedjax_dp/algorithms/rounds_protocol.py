"""The protocol hooks of the averaging round engine (:mod:`fedjax_dp.algorithms.rounds`), shared
by FedAvg, DP-FedAvg and DP-FedSGD: one round, K rounds fused, the seed driver's pure step,
prefetch, output and the ``result.json`` artifacts of a state whose context holds a
:class:`~fedjax_dp.algorithms.rounds.RoundRunner` (``state.context.round_fn``)."""
from __future__ import annotations

from typing import Any, Callable, Hashable

import jax

from fedjax_dp.algorithms import api

__all__ = ["step", "seed_step", "rounds_per_call", "multi_step", "prefetch", "output",
           "artifacts"]


def step(state: api.State, key: jax.Array) -> tuple[api.State, dict]:
    """One round (:meth:`RoundRunner.one`) with round key ``key``."""
    values, metrics = state.context.round_fn.one(dict(state.values), key)
    return api.State(step=state.step + 1, values=values, context=state.context), metrics


def seed_step(state: api.State) -> tuple[Callable, Any, Hashable] | None:
    """The ``seed_step`` hook: the fused round as a pure function the seed driver vmaps
    (:meth:`RoundRunner.seed_step`; None on the host driver)."""
    return state.context.round_fn.seed_step()


def rounds_per_call(state: api.State) -> int:
    """The ``rounds_per_call`` hook: the capacity K of a fused call, 0 where the rounds run on
    the host (host-resident agents, a mesh)."""
    runner = state.context.round_fn
    return runner.capacity if runner.fusable else 0


def multi_step(state: api.State, key: jax.Array, start: int, count: int
               ) -> tuple[api.State, dict]:
    """The ``multi_step`` hook: rounds ``start .. start + count - 1`` of the run with root
    ``key`` in one compiled call (:meth:`RoundRunner.run_rounds`); equal to ``count`` calls of
    :func:`step` with keys ``api.step_key(key, t)``. Metrics ``[K]``, first ``count`` filled."""
    if state.step != start:
        raise ValueError(f"multi_step: the state is after round {state.step}, not {start}")
    values, metrics = state.context.round_fn.run_rounds(dict(state.values), key, start, count)
    return api.State(step=start + count, values=values, context=state.context), metrics


def prefetch(state: api.State, key: jax.Array) -> None:
    """Start gathering round ``key``'s cohort while the current round computes (host path)."""
    state.context.round_fn.prefetch(key)


def output(state: api.State) -> api.Output:
    return api.Output(model=state.context.model, params=state.values["params"])


def artifacts(state: api.State, out_dir=None, run_config: dict | None = None) -> dict:
    """Extra ``result.json`` fields: how the rounds ran (``cohort``: execution, ``fused`` (on
    the device) or not, chunk / bucket sizes, the fused call's capacity, host pass sizes run)."""
    runner = state.context.round_fn
    return {"cohort": {"execution": runner.mode, "fused": runner.fusable,
                       "pass_size": runner.plan.pass_size,
                       "rounds_per_call_capacity": runner.capacity,
                       "buckets": list(runner.plan.buckets),
                       "compiled_pass_sizes": list(runner.compiled_pass_sizes)}}
