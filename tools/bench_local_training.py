"""Benchmark: N agents each training an MLP for E local steps, vmapped vs a per-agent loop.

    python tools/bench_local_training.py --agents 1000 --steps 20 --out runs/bench_local_training.json

Both paths run the *same* jitted one-agent update (``fedjax_dp.train.make_local_update``): the
vectorised path lifts it over the stacked agent axis in one call (``train_agents``), the loop path
calls it once per agent from Python (what a simulator without an agent axis does). Printed and
written: wall times, their ratio, achieved GFLOP/s of the vectorised path (model FLOPs: forward +
backward = 3 x forward, per example) next to a large float32 matmul measured in the same run.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import best_time, block, environment, matmul_gflops, write_json  # noqa: E402

from fedjax_dp.core import from_ragged
from fedjax_dp.data import synthetic
from fedjax_dp.models import forward_flops, make_model
from fedjax_dp.train import LocalTrainConfig, make_local_update, train_agents


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--agents", type=int, default=1000)
    ap.add_argument("--local-size", type=int, default=64, help="records per agent")
    ap.add_argument("--features", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--steps", type=int, default=20, help="local steps E")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--chunk-size", type=int, default=0, help="also time a chunked run (0: skip)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="runs/bench_local_training.json")
    args = ap.parse_args(argv)

    n, m = args.agents, args.local_size
    ds = synthetic(num_train=n * m, num_public=10, num_test=10, num_features=args.features,
                   num_classes=args.classes, seed=0)
    x = ds.x_train.reshape(n, m, -1)
    y = ds.y_train.reshape(n, m)
    data = from_ragged(list(x), list(y))
    model = make_model("mlp", (args.features,), args.classes, hidden=(args.hidden,))
    params = model.init(jax.random.key(0))
    cfg = LocalTrainConfig(steps=args.steps, batch_size=args.batch_size, learning_rate=0.05)
    key = jax.random.key(1)

    t_vmap = best_time(lambda: train_agents(key, params, data, model, cfg), args.repeats)

    update = jax.jit(make_local_update(model, cfg))
    keys = jax.random.split(key, n)

    def loop():
        return [update(keys[i], params, data.x[i], data.y[i], data.mask[i], data.counts[i])
                for i in range(n)]

    block(loop()[0])                           # compile once
    t = time.perf_counter()
    block(loop())
    t_loop = time.perf_counter() - t

    t_chunk = None
    if args.chunk_size:
        t_chunk = best_time(lambda: train_agents(key, params, data, model, cfg,
                                                 chunk_size=args.chunk_size), args.repeats)

    flops = 3 * forward_flops(model, params) * args.batch_size * args.steps * n
    gflops = flops / t_vmap / 1e9
    ref = matmul_gflops()
    record = {
        "benchmark": "local_training", "agents": n, "local_size": m, "features": args.features,
        "hidden": args.hidden, "classes": args.classes, "steps": args.steps,
        "batch_size": args.batch_size, "vmap_s": t_vmap, "loop_s": t_loop,
        "speedup_vmap_over_loop": t_loop / t_vmap, "chunk_size": args.chunk_size or None,
        "chunked_s": t_chunk, "model_gflop": flops / 1e9, "vmap_gflops": gflops,
        "matmul_gflops": ref, "fraction_of_matmul": gflops / ref, "env": environment(),
    }
    print(f"N={n} agents x E={args.steps} steps (MLP {args.features}-{args.hidden}-"
          f"{args.classes}, batch {args.batch_size})")
    print(f"  vmapped: {t_vmap:.3f} s   per-agent loop: {t_loop:.3f} s   "
          f"speed-up: {t_loop / t_vmap:.1f}x")
    if t_chunk is not None:
        print(f"  chunked ({args.chunk_size} agents/chunk): {t_chunk:.3f} s")
    print(f"  achieved {gflops:.1f} GFLOP/s vs float32 matmul {ref:.1f} GFLOP/s "
          f"({100 * gflops / ref:.1f}%)")
    write_json(args.out, record)
    return record


if __name__ == "__main__":
    main()
