"""Benchmark: one ISRL-DP FedProx-SPIDER round over N silos, vectorised vs a loop over silos,
and (``--cohort``) the gathered round (M available silos) vs the masked all-silo round.

    python tools/bench_isrl.py --silos 25,1000,10000 --out results/isrl/bench_isrl.json
    fedjax-dp bench --only isrl_spider_round    # the same round vs loop, in the one command
    python tools/bench_isrl.py --cohort --silos 1000,10000 --available 10,100 \
        --out results/isrl/bench_cohort.json

Default: for each N of ``--silos``, the ``isrl_spider_round`` part of ``fedjax-dp bench``
(:mod:`fedjax_dp.bench.isrl`: the compiled SPIDER round, refresh and difference, vs a loop over
silos calling the same one-silo upload functions), written in this script's keys with the ratios
loop / vectorised; the loop runs on at most ``--loop-max`` silos and is scaled
(``loop_extrapolated``); for N <= ``--check-silos-max`` the vmapped uploads are checked against
the loop's (``results_agree``).

``--cohort``: for each N and each M of ``--available`` (M available silos per round), the
library's SPIDER (``--method``) round with ``cohort="gather"`` (the M available silos' rows gathered inside the
compiled round: M uploads) and ``cohort="masked"`` (all N silos compute, a mask keeps M), both
with the library's chunking rule, timed for a refresh and a difference round; written with the
ratios masked / gathered and whether the two rounds' new parameters agree.

``--rates``: ONE upload of ``--available`` silos (vmapped, as in a round) of ``--local-size``
records each, at record-sampling rates p of ``--rate-list`` (expected batch K = p n): the
library's upload (:func:`uploads.gradient_upload` / :func:`uploads.difference_upload` planned for
K: only the sampled records' gradients, :mod:`fedjax_dp.privacy.private_grad`) and the all-records
upload (the same function with no plan: every record's gradient, the cost of the masked
computation), timed in the same run; written with the ratios t(p) / t(1) (expected ~ p) and
all-records / sampled at each p, and whether the two agree for the same key.

    python tools/bench_isrl.py --rates --local-size 10000 --available 4 \
        --out results/private_grad/bench_upload_rates.json
"""
from __future__ import annotations

import argparse
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from bench_common import best_time, block, environment, write_json

from fedjax_dp.core.lift import resolve_chunk_size
from fedjax_dp.privacy.private_grad import per_example_bytes
from fedjax_dp.algorithms.isrl import engine, uploads
from fedjax_dp.bench import isrl
from fedjax_dp.core import StackedData
from fedjax_dp.models import make_model


def _data(n: int, size: int, features: int, classes: int, seed: int) -> StackedData:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, size, features)).astype(np.float32)          # [N, n, f]
    y = rng.integers(0, classes, size=(n, size)).astype(np.int32)         # [N, n]
    return StackedData(x=jnp.asarray(x), y=jnp.asarray(y), mask=jnp.ones((n, size), bool),
                       counts=jnp.full((n,), size, jnp.int32))


def bench_one(n: int, args) -> dict:
    """The ``isrl_spider_round`` part of ``fedjax-dp bench`` at N = ``n``, in this script's keys."""
    rec = isrl.measure(dict(silos=n, local_size=args.local_size, features=args.features,
                            hidden=args.hidden, classes=args.classes, batch_size=args.batch_size,
                            loop_max=args.loop_max, loop_repeats=args.loop_repeats,
                            check=n <= args.check_silos_max), args.repeats)
    t = {k: v["min_s"] for k, v in rec["times"].items()}
    checks = rec["checks"]
    record = {"silos": n, "chunk_size": rec["sizes"]["chunk_size"],
              "compile_s": checks["first_call_s"], "loop_silos_timed": checks["loop_silos_timed"],
              "loop_extrapolated": checks["loop_silos_timed"] < n,
              **{f"{k}_s": v for k, v in t.items()},
              "speedup_refresh": t["loop_refresh"] / t["vectorised_refresh"],
              "speedup_difference": t["loop_difference"] / t["vectorised_difference"]}
    if "results_agree" in checks:
        record["results_agree"] = checks["results_agree"]
    return record


def bench_cohort(n: int, m: int, args, loss_fn, params) -> dict:
    """One round (``--method``: SPIDER or MB-SGD) over N silos with M available: gathered vs
    masked (same key, same data). MB-SGD's second round is a gradient round again."""
    agents = _data(n, args.local_size, args.features, args.classes, seed=n)
    kinds = len(engine.rule_for(args.method).kinds)
    sdata = engine.silo_data(agents, (args.batch_size,) * kinds)
    spec = engine.RoundSpec(method=args.method, num_silos=n, num_available=m,
                            period=2 if args.method == "spider" else 1, report_objective=False,
                            batch_sizes=(args.batch_size,) * kinds)
    chunk = resolve_chunk_size("auto", num_agents=agents.num_agents,
                               bytes_per_agent=per_example_bytes(params, agents.max_size))  # as protocol.init
    chunk = None if chunk is None else max(1, chunk // 2)
    values0 = engine.initial_values(spec, params, engine.hyper(0.1, 1.0, 1.0))
    key = jax.random.key(0)
    record = {"silos": n, "available": m, "chunk_size": chunk,
              # what the "refresh" / "difference" timings are: rounds 0 and 1 of the method
              "round_kinds": ["refresh", "difference"] if args.method == "spider" else
              ["gradient", "gradient"]}
    new = {}
    for cohort in engine.COHORTS:
        round_fn = engine.make_round(loss_fn, spec, chunk_size=chunk, cohort=cohort)
        t0 = time.perf_counter()
        values1, _ = block(round_fn(key, values0, sdata))                # round 0: refresh
        record[f"{cohort}_compile_s"] = time.perf_counter() - t0
        record[f"{cohort}_refresh_s"] = best_time(lambda: round_fn(key, values0, sdata),
                                                  args.repeats)
        record[f"{cohort}_difference_s"] = best_time(lambda: round_fn(key, values1, sdata),
                                                     args.repeats)          # round 1: difference
        new[cohort] = block(round_fn(key, values1, sdata))[0]
    for kind in ("refresh", "difference"):
        record[f"ratio_{kind}"] = record[f"masked_{kind}_s"] / record[f"gather_{kind}_s"]
    record["results_agree"] = bool(all(
        np.allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
        for a, b in zip(jax.tree.leaves(new["gather"]), jax.tree.leaves(new["masked"]))))
    return record


def main_cohort(args, model, loss_fn, params) -> dict:
    silos = [int(s) for s in args.silos.split(",") if s]
    available = [int(s) for s in args.available.split(",") if s]
    load_before = os.getloadavg()[0]
    runs = []
    for n in silos:
        for m in available:
            if m > n:
                continue
            rec = bench_cohort(n, m, args, loss_fn, params)
            runs.append(rec)
            print(f"N={n:>6} M={m:>4}: gathered refresh {rec['gather_refresh_s'] * 1e3:8.2f} ms, "
                  f"difference {rec['gather_difference_s'] * 1e3:8.2f} ms | masked refresh "
                  f"{rec['masked_refresh_s'] * 1e3:8.2f} ms, difference "
                  f"{rec['masked_difference_s'] * 1e3:8.2f} ms | masked / gathered "
                  f"{rec['ratio_refresh']:.1f}x / {rec['ratio_difference']:.1f}x", flush=True)
    record = {"benchmark": f"isrl_{args.method}_round_cohort", "model": f"mlp {args.features}-"
              f"{args.hidden}-{args.classes}", "num_params": int(sum(
                  np.size(l) for l in jax.tree.leaves(params))),
              "local_size": args.local_size, "batch_size": args.batch_size,
              "environment": environment(),
              "load_average_1m": [load_before, os.getloadavg()[0]],   # before / after: contention
              "runs": runs}
    if args.out:
        write_json(args.out, record)
    return record


def bench_rates(args, loss_fn, params) -> dict:
    """One gradient and one difference upload of M silos x n records at each rate p: sampled
    records only (planned for K = p n) vs every record (unplanned), same keys."""
    m, n = int(args.available.split(",")[0]), args.local_size
    agents = _data(m, n, args.features, args.classes, seed=n)
    rates = [float(r) for r in args.rate_list.split(",") if r]
    keys = jax.random.split(jax.random.key(0), m)
    ref = jax.tree.map(lambda l: l + 0.01, params)
    load_before = os.getloadavg()[0]
    runs = []
    for p in rates:
        k_exp = p * n
        rec = {"rate": p, "expected_batch": k_exp}
        out = {}
        for path, expected in (("sampled", k_exp), ("all_records", None)):
            grad = jax.jit(jax.vmap(uploads.gradient_upload(loss_fn, True, expected),
                                    in_axes=(0, None, 0, 0, 0, None, None, None, None)))
            diff = jax.jit(jax.vmap(uploads.difference_upload(loss_fn, True, expected),
                                    in_axes=(0, None, None, 0, 0, 0, None, None, None, None,
                                             None)))
            g_args = (keys, params, agents.x, agents.y, agents.mask, p, k_exp, 1.0, 1.0)
            d_args = (keys, params, ref, agents.x, agents.y, agents.mask, p, k_exp, 1.0, 2.0,
                      1.0)
            rec[f"{path}_gradient_s"] = best_time(lambda: grad(*g_args), args.repeats)
            rec[f"{path}_difference_s"] = best_time(lambda: diff(*d_args), args.repeats)
            out[path] = (block(grad(*g_args)), block(diff(*d_args)))
        rec["realised_batch_mean"] = float(jnp.mean(out["sampled"][0][1]["batch_size"]))
        rec["results_agree"] = bool(all(
            np.allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
            for a, b in zip(jax.tree.leaves(out["sampled"]), jax.tree.leaves(out["all_records"]))))
        for kind in ("gradient", "difference"):
            rec[f"all_records_over_sampled_{kind}"] = (rec[f"all_records_{kind}_s"]
                                                       / rec[f"sampled_{kind}_s"])
        runs.append(rec)
    full = next((r for r in runs if r["rate"] == 1.0), runs[-1])
    for rec in runs:
        for kind in ("gradient", "difference"):
            rec[f"sampled_{kind}_over_rate_1"] = (rec[f"sampled_{kind}_s"]
                                                  / full[f"sampled_{kind}_s"])
        print(f"p={rec['rate']:<5} K={rec['expected_batch']:>7.0f}: sampled gradient "
              f"{rec['sampled_gradient_s'] * 1e3:8.2f} ms "
              f"({rec['sampled_gradient_over_rate_1']:.3f} of p=1), difference "
              f"{rec['sampled_difference_s'] * 1e3:8.2f} ms "
              f"({rec['sampled_difference_over_rate_1']:.3f}) | all records "
              f"{rec['all_records_gradient_s'] * 1e3:8.2f} / "
              f"{rec['all_records_difference_s'] * 1e3:8.2f}"
              f" ms = {rec['all_records_over_sampled_gradient']:.1f}x / "
              f"{rec['all_records_over_sampled_difference']:.1f}x | agree {rec['results_agree']}",
              flush=True)
    record = {"benchmark": "isrl_upload_vs_sampling_rate", "model": f"mlp {args.features}-"
              f"{args.hidden}-{args.classes}", "num_params": int(sum(
                  np.size(l) for l in jax.tree.leaves(params))),
              "silos": m, "local_size": n, "environment": environment(),
              "load_average_1m": [load_before, os.getloadavg()[0]], "runs": runs}
    if args.out:
        write_json(args.out, record)
    return record


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--silos", default="25,1000,10000", help="comma-separated N values")
    ap.add_argument("--local-size", type=int, default=16, help="records per silo")
    ap.add_argument("--features", type=int, default=10)
    ap.add_argument("--hidden", type=int, default=16)
    ap.add_argument("--classes", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=8, help="K1 = K2 expected records")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--loop-repeats", type=int, default=1)
    ap.add_argument("--loop-max", type=int, default=1000,
                    help="time the loop on at most this many silos and scale linearly")
    ap.add_argument("--check-silos-max", type=int, default=25,
                    help="check vectorised == loop sums for N up to this")
    ap.add_argument("--cohort", action="store_true",
                    help="time the gathered round (M available silos) vs the masked round")
    ap.add_argument("--available", default="10,100",
                    help="with --cohort: comma-separated M values (available silos per round)")
    ap.add_argument("--method", default="spider", choices=("spider", "mb_sgd"),
                    help="with --cohort: the round timed")
    ap.add_argument("--rates", action="store_true",
                    help="time one upload at the record-sampling rates of --rate-list "
                         "(--available silos of --local-size records)")
    ap.add_argument("--rate-list", default="0.01,0.05,0.2,1.0",
                    help="with --rates: comma-separated record-sampling rates p")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    silos = [int(s) for s in args.silos.split(",") if s]
    model = make_model("mlp", (args.features,), args.classes, hidden=(args.hidden,))
    loss_fn = engine.loss_for(model)
    params = model.init(jax.random.key(0))
    if args.cohort:
        return main_cohort(args, model, loss_fn, params)
    if args.rates:
        return bench_rates(args, loss_fn, params)
    runs = []
    for n in silos:
        rec = bench_one(n, args)
        runs.append(rec)
        print(f"N={n:>6}: vectorised refresh {rec['vectorised_refresh_s'] * 1e3:8.2f} ms, "
              f"difference {rec['vectorised_difference_s'] * 1e3:8.2f} ms | loop refresh "
              f"{rec['loop_refresh_s'] * 1e3:9.1f} ms, difference "
              f"{rec['loop_difference_s'] * 1e3:9.1f} ms"
              f"{' (extrapolated)' if rec['loop_extrapolated'] else ''} | speed-up "
              f"{rec['speedup_refresh']:.1f}x / {rec['speedup_difference']:.1f}x", flush=True)
    record = {"benchmark": "isrl_spider_round", "model": f"mlp {args.features}-{args.hidden}-"
              f"{args.classes}", "num_params": int(sum(np.size(l) for l in
                                                        jax.tree.leaves(params))),
              "local_size": args.local_size, "batch_size": args.batch_size,
              "environment": environment(), "runs": runs}
    if args.out:
        write_json(args.out, record)
    return record


if __name__ == "__main__":
    main()
