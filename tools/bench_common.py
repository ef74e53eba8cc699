"""Shared helpers for the benchmarks in tools/: thin calls of :mod:`fedjax_dp.bench.common`
(the timing, matmul reference and device description of ``fedjax-dp bench``)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from fedjax_dp.bench import common

block = common.block


def best_time(fn: Callable[[], object], repeats: int = 3) -> float:
    """Best wall time of ``repeats`` calls (after one warm-up call that also compiles)."""
    return common.time_fn(fn, repeats)["min_s"]


def matmul_gflops(n: int = 2048, repeats: int = 5) -> float:
    """Achieved GFLOP/s of a large float32 matmul on the default device (the roofline proxy)."""
    return common.matmul(n, repeats)["gflops"]


def environment() -> dict:
    return common.device_description()


def write_json(path: str | Path, record: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2))
    print(f"wrote {path}")
