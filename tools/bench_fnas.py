"""Benchmark DP-FNAS on the CPU: one DP search iteration for K parties vmapped vs a Python loop
over parties, and per-example gradients by ``vmap(grad)`` vs a loop over examples, in one run.

    .venv/bin/python tools/bench_fnas.py --out results/bench/fnas.json
    .venv/bin/python tools/bench_fnas.py --nodes 2 --cells 2 --parties 8   # smaller, faster

Reports steady-state times (best of ``--repeats`` after a warm-up call) and compile times
(``jit(...).lower(...).compile()``), with the network size, in JSON.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from bench_common import best_time, block, environment, write_json  # tools/, the script's folder

from fedjax_dp.algorithms.fnas import dp_fnas, steps  # noqa: E402
from fedjax_dp.core import from_ragged  # noqa: E402
from fedjax_dp.models import darts  # noqa: E402


def _compiled(fn, *args):
    start = time.perf_counter()
    out = jax.jit(fn).lower(*args).compile()
    return out, time.perf_counter() - start


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parties", type=int, default=8)
    ap.add_argument("--records", type=int, default=64, help="records per party (both halves)")
    ap.add_argument("--batch", type=int, default=16, help="expected Poisson batch per half")
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--channels", type=int, default=4)
    ap.add_argument("--cells", type=int, default=3)
    ap.add_argument("--image", type=int, default=8)
    ap.add_argument("--examples", type=int, default=32, help="examples of the per-example bench")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="results/bench/fnas.json")
    args = ap.parse_args(argv)

    shape = (args.image, args.image, 1)
    space = darts.SearchSpace(nodes=args.nodes, channels=args.channels, cells=args.cells)
    net = darts.search_network(space, shape, 10)
    rng = np.random.default_rng(0)
    agents = from_ragged([rng.random((args.records,) + shape, np.float32)
                          for _ in range(args.parties)],
                         [rng.integers(0, 10, args.records) for _ in range(args.parties)])
    data = dp_fnas.make_search_data(agents, args.batch)
    mech = steps.Mechanism(clip=1.0, noise=1.0)
    hyper = steps.SearchHyper(weights=mech, arch=mech, second=mech, order="first",
                              total_iterations=100)
    record = {"environment": environment(), "args": vars(args),
              "search_space": {"nodes": space.nodes, "channels": space.channels,
                               "cells": space.cells, "primitives": list(space.primitives)}}

    # --- one DP search iteration, K parties vmapped vs a Python loop over parties
    fv = steps.make_search(net, hyper)
    state = fv.init(jax.random.key(0))
    record["num_weights"] = int(sum(l.size for l in jax.tree.leaves(state.w)))
    key = jax.random.key(1)
    start = time.perf_counter()
    step_v = fv.step.lower(state, key, data).compile()
    record["compile_search_step_s"] = time.perf_counter() - start
    t_vmap = best_time(lambda: step_v(state, key, data), args.repeats)
    fl = steps.make_search(net, hyper, backend="loop")
    start = time.perf_counter()
    block(fl.step(state, key, data))                     # compiles the per-party functions
    record["compile_loop_parties_s"] = time.perf_counter() - start
    t_loop = best_time(lambda: fl.step(state, key, data), args.repeats)
    record["search_step"] = {"parties": args.parties, "vmap_s": t_vmap, "loop_s": t_loop,
                             "loop_over_vmap": t_loop / t_vmap}
    print(f"search step K={args.parties}: vmap {t_vmap:.3f}s, loop {t_loop:.3f}s "
          f"({t_loop / t_vmap:.2f}x)", flush=True)

    # --- per-example gradients of the search network: vmap(grad) vs a loop over examples
    alpha = state.alpha
    x = jnp.asarray(rng.random((args.examples,) + shape, np.float32))
    y = jnp.asarray(rng.integers(0, 10, args.examples))

    def loss(w, xi, yi):
        return steps.cross_entropy(net.apply(w, alpha, xi), yi)

    per_ex, c_vmap = _compiled(jax.vmap(jax.grad(loss), (None, 0, 0)), state.w, x, y)
    one, c_one = _compiled(jax.grad(loss), state.w, x[0], y[0])
    t_pe_vmap = best_time(lambda: per_ex(state.w, x, y), args.repeats)
    t_pe_loop = best_time(lambda: [one(state.w, x[i], y[i]) for i in range(args.examples)],
                          args.repeats)
    record["per_example_grads"] = {"examples": args.examples, "vmap_s": t_pe_vmap,
                                   "loop_s": t_pe_loop, "loop_over_vmap": t_pe_loop / t_pe_vmap,
                                   "compile_vmap_s": c_vmap, "compile_one_s": c_one}
    print(f"per-example grads B={args.examples}: vmap {t_pe_vmap:.3f}s, loop {t_pe_loop:.3f}s "
          f"({t_pe_loop / t_pe_vmap:.2f}x)", flush=True)
    write_json(args.out, record)
    return record


if __name__ == "__main__":
    main()
