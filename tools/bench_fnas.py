"""Benchmark DP-FNAS on the CPU: one DP search iteration for K parties vmapped vs a Python loop
over parties (a thin call of the ``dp_fnas_search_step`` part of ``fedjax-dp bench``,
:mod:`fedjax_dp.bench.fnas`), and per-example gradients by ``vmap(grad)`` vs a loop over
examples, in one run.

    .venv/bin/python tools/bench_fnas.py --out results/bench/fnas.json
    .venv/bin/python tools/bench_fnas.py --nodes 2 --cells 2 --parties 8   # smaller, faster

Reports steady-state times (best of ``--repeats`` after a warm-up call) with the network size,
in JSON.
"""
from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from bench_common import best_time, environment, write_json  # tools/, the script's folder

from fedjax_dp.algorithms.fnas import steps  # noqa: E402
from fedjax_dp.bench import fnas  # noqa: E402
from fedjax_dp.models import darts  # noqa: E402


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
    sizes = dict(parties=args.parties, records=args.records, batch=args.batch, nodes=args.nodes,
                 channels=args.channels, cells=args.cells, image=args.image)
    rec = fnas.measure(sizes, args.repeats)
    t_vmap, t_loop = rec["times"]["vmap"]["min_s"], rec["times"]["loop"]["min_s"]
    record = {"environment": environment(), "args": vars(args),
              "num_weights": rec["sizes"]["num_weights"], "bench_record": rec,
              "search_step": {"parties": args.parties, "vmap_s": t_vmap, "loop_s": t_loop,
                              "loop_over_vmap": t_loop / t_vmap}}
    print(f"search step K={args.parties}: vmap {t_vmap:.3f}s, loop {t_loop:.3f}s "
          f"({t_loop / t_vmap:.2f}x)", flush=True)

    # --- per-example gradients of the search network: vmap(grad) vs a loop over examples
    shape = (args.image, args.image, 1)
    space = darts.SearchSpace(nodes=args.nodes, channels=args.channels, cells=args.cells)
    net = darts.search_network(space, shape, 10)
    state = steps.make_search(net, steps.SearchHyper(
        weights=steps.Mechanism(clip=1.0, noise=1.0), arch=steps.Mechanism(clip=1.0, noise=1.0),
        second=steps.Mechanism(clip=1.0, noise=1.0), order="first", total_iterations=100)).init(
        jax.random.key(0))
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.random((args.examples,) + shape, np.float32))
    y = jnp.asarray(rng.integers(0, 10, args.examples))

    def loss(w, xi, yi):
        return steps.cross_entropy(net.apply(w, state.alpha, xi), yi)

    per_ex = jax.jit(jax.vmap(jax.grad(loss), (None, 0, 0)))
    one = jax.jit(jax.grad(loss))
    t_pe_vmap = best_time(lambda: per_ex(state.w, x, y), args.repeats)
    t_pe_loop = best_time(lambda: [one(state.w, x[i], y[i]) for i in range(args.examples)],
                          args.repeats)
    record["per_example_grads"] = {"examples": args.examples, "vmap_s": t_pe_vmap,
                                   "loop_s": t_pe_loop, "loop_over_vmap": t_pe_loop / t_pe_vmap}
    print(f"per-example grads B={args.examples}: vmap {t_pe_vmap:.3f}s, loop {t_pe_loop:.3f}s "
          f"({t_pe_loop / t_pe_vmap:.2f}x)", flush=True)
    write_json(args.out, record)
    return record


if __name__ == "__main__":
    main()
