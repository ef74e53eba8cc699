"""How a driver groups an algorithm's steps into compiled calls (``run.rounds_per_call``).

An algorithm with a ``multi_step`` hook (:class:`fedjax_dp.algorithms.api.Algorithm`) runs up
to ``K`` steps in one compiled call, ``K`` its capacity (:func:`resolve_capacity`);
:func:`run_calls` drives such calls, each sized by a :class:`CallSizer` and cut at the
boundaries where the caller must see the state (evaluations, checkpoints). Sizing never changes
a result: the steps and their keys are the same whatever the calls' sizes.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import jax
import numpy as np

from fedjax_dp.core import validation

#: ``rounds_per_call = "auto"``: the compiled loop holds up to this many rounds per call ...
AUTO_CAPACITY = 256
#: ... and the driver sizes each call to take about this long (progress lines, checkpoints and
#: Ctrl-C land on call boundaries; measured from the calls themselves)
AUTO_CALL_SECONDS = 0.5


class CallSizer:
    """How many rounds the next fused call runs (``run.rounds_per_call``).

    An int k: every call runs k rounds (fewer at a boundary). ``"auto"``: the first call runs 1
    round (it compiles), later calls double until a call's measured wall time per round is
    known, then ``round(AUTO_CALL_SECONDS / seconds_per_round)``, clipped to ``[1, capacity]``.
    Sizing never compiles (the count is a traced argument)."""

    def __init__(self, setting, capacity: int):
        self.fixed = None if setting == "auto" else int(setting)
        self.capacity = capacity
        self._next = 1
        self._calls = 0

    def next(self) -> int:
        if self.fixed is not None:
            return min(self.fixed, self.capacity)
        return self._next

    def observe(self, count: int, seconds: float) -> None:
        """A finished call of ``count`` rounds took ``seconds`` (host wall time between the
        finishes of consecutive calls); the first call (compilation) is not used."""
        self._calls += 1
        if self.fixed is not None:
            return
        if self._calls == 1 or seconds <= 0:
            self._next = min(self.capacity, max(2, 2 * self._next))
            return
        per_round = seconds / max(count, 1)
        want = int(round(AUTO_CALL_SECONDS / max(per_round, 1e-9)))
        self._next = max(1, min(self.capacity, want, 4 * max(count, 1)))


def resolve_capacity(setting) -> int:
    """K of ``run.rounds_per_call``: ``"auto"`` -> :data:`AUTO_CAPACITY`; an int k -> k."""
    if setting == "auto":
        return AUTO_CAPACITY
    validation.check_int("run.rounds_per_call", setting, minimum=1)
    return int(setting)


def run_calls(multi_step: Callable, capacity: int, key: jax.Array, state: Any, total: int,
              setting: int | str, boundaries: Sequence[int],
              finish: Callable[[int, Any, dict], None]) -> Any:
    """Steps ``state.step .. total - 1`` of a run with root ``key`` (``state``: an
    :class:`fedjax_dp.algorithms.api.State`) in calls of ``multi_step`` (at most ``capacity``
    steps each): each call's size from a :class:`CallSizer` (``setting``: ``"auto"`` or k), cut
    at the next multiple of every nonzero entry of ``boundaries`` and at ``total``; a call's
    records (``finish(t, state after the call, metrics of step t)``) are made once the next call
    has been dispatched. Returns the last state."""
    sizer = CallSizer(setting, capacity)
    every = [int(b) for b in boundaries if b]
    pending = None                       # (first step, count, state after the call, metrics)
    last = time.perf_counter()

    def flush(first: int, count: int, done: Any, metrics: dict) -> None:
        nonlocal last
        host = jax.device_get(metrics)
        now = time.perf_counter()
        sizer.observe(count, now - last)
        last = now
        for i in range(count):
            finish(first + i, done, {k: np.asarray(v)[i] for k, v in host.items()})

    t = state.step
    while t < total:
        count = min(sizer.next(), total - t)
        for b in every:
            count = min(count, b - t % b)
        state, metrics = multi_step(state, key, t, count)
        if pending is not None:          # the call is dispatched: now fetch the previous one's
            flush(*pending)
        pending = (t, count, state, metrics)
        t += count
    if pending is not None:
        flush(*pending)
    return state
