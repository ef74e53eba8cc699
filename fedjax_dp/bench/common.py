"""Shared parts of ``fedjax-dp bench``: timing, the matmul reference, the device description.

:func:`time_fn`: one warm-up call (which compiles), then ``repeats`` timed calls, each ended by
``block_until_ready`` on every output leaf; it records the minimum and the median. The roofline
proxy is a large float32 matmul (:func:`matmul`, ``2 n^3`` FLOPs over its median time).
"""
from __future__ import annotations

import os
import platform
import statistics
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp


def block(tree: Any) -> Any:
    """Wait for every array leaf of ``tree`` (asynchronous dispatch ends here)."""
    return jax.tree.map(lambda l: l.block_until_ready() if hasattr(l, "block_until_ready")
                        else l, tree)


def time_fn(fn: Callable[[], Any], repeats: int, *, warmup: int = 1) -> dict:
    """``{"min_s", "median_s", "all_s", "first_s"}`` of ``fn()``: ``warmup`` untimed-for-the-
    statistics calls (the first compiles; ``first_s`` is its wall time), then ``repeats`` timed
    calls."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    first = None
    for _ in range(warmup):
        t = time.perf_counter()
        block(fn())
        first = time.perf_counter() - t if first is None else first
    walls = []
    for _ in range(repeats):
        t = time.perf_counter()
        block(fn())
        walls.append(time.perf_counter() - t)
    return {"min_s": min(walls), "median_s": statistics.median(walls), "all_s": walls,
            "first_s": first}


def scaled(timing: dict, factor: float) -> dict:
    """A timing of a part of the work scaled to the whole (``factor`` = whole / part), for loops
    timed on a prefix of identical, independent calls."""
    return {**timing, "min_s": timing["min_s"] * factor,
            "median_s": timing["median_s"] * factor,
            "all_s": [w * factor for w in timing["all_s"]], "scaled_by": factor}


def matmul(n: int, repeats: int) -> dict:
    """A float32 ``[n, n] @ [n, n]`` on the default device: its timing and
    ``gflops = 2 n^3 / median / 1e9`` (the same-run roofline proxy)."""
    k1, k2 = jax.random.split(jax.random.key(0))
    a = jax.random.normal(k1, (n, n), jnp.float32)
    b = jax.random.normal(k2, (n, n), jnp.float32)
    f = jax.jit(lambda a, b: a @ b)
    t = time_fn(lambda: f(a, b), repeats)
    return {"n": n, **t, "gflops": 2.0 * n ** 3 / t["median_s"] / 1e9}


def load_average() -> list[float] | None:
    """The 1/5/15-minute load averages (other processes sharing the machine), None if unknown."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo (Linux), else ``platform.processor()``."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def device_description() -> dict:
    """Platform, device kind, count and memory, CPU count and model, jax version, load average,
    and the device-aware defaults in force (:func:`fedjax_dp.core.defaults.describe`)."""
    from fedjax_dp.core import defaults
    info = defaults.describe()
    first = info["devices"][0]
    return {"platform": info["platform"], "device_kind": first["kind"],
            "device_count": len(info["devices"]), "device_memory_bytes": first.get("memory_bytes"),
            "process_count": info["process_count"], "cpu_count": os.cpu_count(),
            "cpu_model": cpu_model(), "machine": platform.machine(),
            "python": platform.python_version(), "jax": info["jax"],
            "load_average": load_average(), "defaults": info["defaults"]}


def ratios(times: dict, pairs: dict[str, tuple[str, str]], stat: str = "median_s") -> dict:
    """``{name: times[num][stat] / times[den][stat]}`` for ``pairs = {name: (num, den)}``."""
    return {name: times[num][stat] / times[den][stat] for name, (num, den) in pairs.items()}


def num_params(params: Any) -> int:
    return int(sum(l.size for l in jax.tree.leaves(params)))


def time_rounds(step: Callable[[Any, int], Any], state: Any, rounds: int, *,
                warmup: int = 2) -> tuple[dict, Any]:
    """Time a stateful loop ``state = step(state, t)``: ``warmup`` rounds (compilation), then
    ``rounds`` timed rounds; returns (the :func:`time_fn`-style timing, the last state)."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    walls, first = [], None
    for t in range(warmup + rounds):
        start = time.perf_counter()
        state = block(step(state, t))
        wall = time.perf_counter() - start
        if t >= warmup:
            walls.append(wall)
        elif first is None:
            first = wall
    return {"min_s": min(walls), "median_s": statistics.median(walls), "all_s": walls,
            "first_s": first}, state
