"""Shared helpers for the benchmarks in tools/: timing and a same-run matmul reference."""
from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp


def block(tree):
    return jax.tree.map(lambda l: l.block_until_ready() if hasattr(l, "block_until_ready") else l,
                        tree)


def best_time(fn: Callable[[], object], repeats: int = 3) -> float:
    """Best wall time of ``repeats`` calls (after one warm-up call that also compiles)."""
    block(fn())
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        block(fn())
        best = min(best, time.perf_counter() - t)
    return best


def matmul_gflops(n: int = 2048, repeats: int = 5) -> float:
    """Achieved GFLOP/s of a large float32 matmul on the default device (the roofline proxy)."""
    k1, k2 = jax.random.split(jax.random.key(0))
    a = jax.random.normal(k1, (n, n), jnp.float32)
    b = jax.random.normal(k2, (n, n), jnp.float32)
    f = jax.jit(lambda a, b: a @ b)
    return 2 * n ** 3 / best_time(lambda: f(a, b), repeats) / 1e9


def environment() -> dict:
    return {"jax": jax.__version__, "backend": jax.default_backend(),
            "devices": [str(d) for d in jax.devices()], "cpu_count": os.cpu_count(),
            "machine": platform.machine(), "python": platform.python_version()}


def write_json(path: str | Path, record: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2))
    print(f"wrote {path}")
