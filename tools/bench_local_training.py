"""Benchmark: N agents each training an MLP for E local steps, vmapped vs a per-agent loop.

    python tools/bench_local_training.py --agents 1000 --steps 20 --out runs/bench_local_training.json

Three ways to run the same computation (same keys, same minibatches; the script checks that the
results agree):

* ``vmap``: ``train_agents``: one compiled call for all N agents x E steps (this library), with
  its default ``chunk_size="auto"`` (cache-sized chunks of agents on the CPU); also timed with
  no chunking (``vmap_unchunked``).
* ``loop_step``: a Python loop over agents and steps calling the *same jitted step*
  (``make_local_step``), the way a client-loop simulator (e.g. fedjax's ``for_each_client``) runs.
* ``loop_agent``: a Python loop over agents calling a jitted E-step scan per agent (the strongest
  loop: only N dispatches).

Printed and written: wall times, the ratios, achieved GFLOP/s of the vectorised path (model FLOPs:
forward + backward = 3 x forward, per example) next to a large float32 matmul in the same run.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from bench_common import best_time, block, environment, matmul_gflops, write_json  # tools/

from fedjax_dp.core import from_ragged
from fedjax_dp.data import synthetic
from fedjax_dp.models import forward_flops, make_model
from fedjax_dp.train import (LocalTrainConfig, batch_indices, make_local_step, make_local_update,
                             train_agents)
from fedjax_dp.train.local import resolve_chunk_size


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--agents", type=int, default=1000)
    ap.add_argument("--local-size", type=int, default=64, help="records per agent")
    ap.add_argument("--features", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--steps", type=int, default=20, help="local steps E")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--chunk-size", type=int, default=0,
                    help="also time this explicit chunk size (0: skip)")
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

    vm_params, _ = train_agents(key, params, data, model, cfg)
    t_vmap = best_time(lambda: train_agents(key, params, data, model, cfg), args.repeats)
    t_unchunked = best_time(lambda: train_agents(key, params, data, model, cfg, chunk_size=None),
                            args.repeats)
    auto_chunk = resolve_chunk_size("auto", params, n)

    update = jax.jit(make_local_update(model, cfg))
    step, opt = make_local_step(model, cfg)
    step = jax.jit(step)
    keys = jax.random.split(key, n)
    agent_rows = [(keys[i], data.x[i], data.y[i], data.mask[i], data.counts[i]) for i in range(n)]

    def loop_agent():
        return [update(k, params, x, y, mk, c) for k, x, y, mk, c in agent_rows]

    def loop_step():
        out = []
        for k, x, y, mk, c in agent_rows:
            p, s = params, opt.init(params)
            for idx in batch_indices(k, c, args.steps, cfg.batch_size):
                p, s, _ = step(p, s, idx, x, y, mk, c)
            out.append(p)
        return out

    block(loop_agent()[0])                     # compile once
    t = time.perf_counter()
    block(loop_agent())
    t_loop_agent = time.perf_counter() - t
    block(step(params, opt.init(params), jnp.zeros((cfg.batch_size,), jnp.int32),
               *agent_rows[0][1:]))
    t = time.perf_counter()
    ls = block(loop_step())
    t_loop_step = time.perf_counter() - t
    agree = all(np.allclose(np.asarray(a)[i], np.asarray(b), rtol=1e-4, atol=1e-5)
                for i in (0, n - 1)
                for a, b in zip(jax.tree.leaves(vm_params), jax.tree.leaves(ls[i])))

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
        "batch_size": args.batch_size, "vmap_s": t_vmap, "auto_chunk_size": auto_chunk,
        "vmap_unchunked_s": t_unchunked, "loop_step_s": t_loop_step,
        "loop_agent_s": t_loop_agent, "speedup_vs_loop_step": t_loop_step / t_vmap,
        "speedup_vs_loop_agent": t_loop_agent / t_vmap, "results_agree": bool(agree),
        "chunk_size": args.chunk_size or None, "chunked_s": t_chunk,
        "model_gflop": flops / 1e9, "vmap_gflops": gflops, "matmul_gflops": ref,
        "fraction_of_matmul": gflops / ref, "env": environment(),
    }
    print(f"N={n} agents x E={args.steps} steps (MLP {args.features}-{args.hidden}-"
          f"{args.classes}, batch {args.batch_size}); paths agree: {agree}")
    print(f"  vmapped: {t_vmap:.3f} s (auto chunks of {auto_chunk} agents); "
          f"unchunked: {t_unchunked:.3f} s")
    print(f"  loop over agents and steps (same jitted step): {t_loop_step:.3f} s  "
          f"-> vmapped is {t_loop_step / t_vmap:.1f}x faster")
    print(f"  loop over agents (jitted E-step scan each):   {t_loop_agent:.3f} s  "
          f"-> vmapped is {t_loop_agent / t_vmap:.1f}x faster")
    if t_chunk is not None:
        print(f"  chunked ({args.chunk_size} agents/chunk): {t_chunk:.3f} s")
    print(f"  achieved {gflops:.1f} GFLOP/s vs float32 matmul {ref:.1f} GFLOP/s "
          f"({100 * gflops / ref:.1f}%)")
    write_json(args.out, record)
    return record


if __name__ == "__main__":
    main()
