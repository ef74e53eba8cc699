"""Benchmark: N agents each training an MLP for E local steps, vmapped vs a per-agent loop.

    python tools/bench_local_training.py --agents 1000 --steps 20 \
        --out runs/bench_local_training.json

A thin call of the ``local_training`` part of ``fedjax-dp bench``
(:mod:`fedjax_dp.bench.local_training`: ``vmap`` = ``train_agents``; ``loop_agent`` = a jitted
E-step update per agent; ``loop_step`` = the same jitted step per agent and step), at the sizes
given here, written in this script's historical key layout (best-of-repeats seconds), plus
``--chunk-size``: the vectorised path with that explicit chunk size.
"""
from __future__ import annotations

import argparse

import jax

from bench_common import best_time, matmul_gflops, write_json  # tools/

from fedjax_dp.bench import local_training


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
    ap.add_argument("--loop-max", type=int, default=0,
                    help="time the loops on this many agents and scale (0: all agents)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="runs/bench_local_training.json")
    args = ap.parse_args(argv)
    sizes = dict(agents=args.agents, local_size=args.local_size, features=args.features,
                 hidden=args.hidden, classes=args.classes, steps=args.steps,
                 batch_size=args.batch_size, loop_max=args.loop_max or args.agents,
                 loop_repeats=args.repeats)
    rec = local_training.measure(sizes, args.repeats)
    t = {k: v["min_s"] for k, v in rec["times"].items()}
    t_chunk = None
    if args.chunk_size:
        t_chunk = best_time(local_training.train_vmapped(sizes, args.chunk_size), args.repeats)
    ref = matmul_gflops()
    flops = rec["sizes"]["model_gflop"] * 1e9
    record = {"benchmark": "local_training", **{k: sizes[k] for k in (
                  "agents", "local_size", "features", "hidden", "classes", "steps",
                  "batch_size")},
              "vmap_s": t["vmap"], "loop_step_s": t["loop_step"], "loop_agent_s": t["loop_agent"],
              "speedup_vs_loop_step": t["loop_step"] / t["vmap"],
              "speedup_vs_loop_agent": t["loop_agent"] / t["vmap"],
              "results_agree": rec["checks"]["results_agree"],
              "chunk_size": args.chunk_size or None, "chunked_s": t_chunk,
              "model_gflop": flops / 1e9, "vmap_gflops": flops / t["vmap"] / 1e9,
              "matmul_gflops": ref, "fraction_of_matmul": flops / t["vmap"] / 1e9 / ref,
              "bench_record": rec, "env": {"jax": jax.__version__}}
    print(f"N={args.agents} agents x E={args.steps}: vmapped {t['vmap']:.3f} s, loop over "
          f"agents and steps {t['loop_step']:.3f} s ({record['speedup_vs_loop_step']:.1f}x), "
          f"loop over agents {t['loop_agent']:.3f} s ({record['speedup_vs_loop_agent']:.1f}x); "
          f"paths agree: {record['results_agree']}")
    write_json(args.out, record)
    return record


if __name__ == "__main__":
    main()
