"""Benchmark: all teachers of a FedKT run in ONE compiled call vs the same teachers one at a time.

    python tools/bench_fedkt_teachers.py --out results/fedkt/bench_teachers.json
    python tools/bench_fedkt_teachers.py --dataset synthetic --parties 50 --hidden 32 \
        --out results/fedkt/bench_teachers_tabular.json

FedKT's 10 parties x 2 partitions x 5 teachers (100 teachers) on mnist5k with a Dirichlet(0.5)
split, MLP 100-100 (the paper's MNIST model), Adam lr 1e-3, batch 32:

* ``vectorised``: ``JaxLearner.fit`` -> ``train_agents``: one jitted call trains all n*s*t
  teachers (vmap over the combined party/partition/teacher axis; ``chunk_size="auto"`` runs it
  in cache-sized chunks on the CPU, ``None`` all at once). The script counts the XLA
  compilations and Python-level dispatches of the timed call.
* ``loop``: a Python loop over the 100 teachers, each calling the same jitted one-teacher
  training (an E-step ``lax.scan``; only n*s*t dispatches, the strongest loop), with the same
  keys and initialisations (``for_each_agent(backend="loop")``); the script reports how far the
  parameters drift apart (Adam amplifies float round-off in near-zero gradients over hundreds
  of steps) and how often the teachers' predictions on the public set agree.

The second command is the paper's tabular setting (Adult / cod-rna: 50 parties, so 500
teachers) on an Adult-like synthetic task: 14 features, two classes.
"""
from __future__ import annotations

import argparse
import time

import jax
import numpy as np
from bench_common import best_time, block, environment, matmul_gflops, write_json

from fedjax_dp import data
from fedjax_dp.algorithms.fedkt import learners, partition
from fedjax_dp.core import from_partition
from fedjax_dp.models import forward_flops, make_model
from fedjax_dp.train import LocalTrainConfig


def count_compiles(fn):
    """Run ``fn`` and count XLA backend compilations during it (jax.monitoring events)."""
    events = []

    def listener(name, *args, **kwargs):
        if name == "/jax/core/compile/backend_compile_duration":
            events.append(name)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        out = block(fn())
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    return out, len(events)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", default="mnist5k", choices=("mnist5k", "synthetic"),
                    help="synthetic: an Adult-like tabular task (--features, --num-train)")
    ap.add_argument("--features", type=int, default=14)
    ap.add_argument("--num-train", type=int, default=10000)
    ap.add_argument("--parties", type=int, default=10)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--teachers", type=int, default=5)
    ap.add_argument("--model", default="mlp", choices=("logistic", "mlp", "cnn"))
    ap.add_argument("--hidden", type=int, nargs="*", default=[100, 100])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="results/fedkt/bench_teachers.json")
    args = ap.parse_args(argv)

    if args.dataset == "synthetic":
        ds = data.synthetic(num_train=args.num_train, num_public=1000, num_test=10,
                            num_features=args.features, num_classes=2, seed=0)
    else:
        ds = data.load_dataset("mnist5k")
    idx = data.partition("dirichlet", ds.y_train, args.parties, 0, beta=0.5)
    parties = from_partition(ds.x_train, ds.y_train, idx)
    td = partition.teacher_data(jax.random.key(0), parties, args.partitions, args.teachers)
    num = td.num_agents
    model = make_model(args.model, ds.feature_shape, ds.num_classes, hidden=tuple(args.hidden))
    train = LocalTrainConfig(steps=args.steps, batch_size=args.batch_size, learning_rate=1e-3,
                             optimizer="adam", weight_decay=1e-5)
    key = jax.random.key(1)
    runs = {
        "vectorised_auto_chunk": learners.JaxLearner(model, train, chunk_size="auto"),
        "vectorised_no_chunk": learners.JaxLearner(model, train, chunk_size=None),
        "loop": learners.JaxLearner(model, train, backend="loop"),
    }
    times, compiles, params = {}, {}, {}
    for name, lrn in runs.items():
        params[name] = block(lrn.fit(key, td))                         # warm-up: compiles
        _, compiles[name] = count_compiles(lambda: lrn.fit(key, td))
        times[name] = best_time(lambda: lrn.fit(key, td), args.repeats)
        print(f"{name:<24} {times[name]:8.3f} s  (compilations in a warm call: "
              f"{compiles[name]})", flush=True)
    preds = {name: np.asarray(lrn.predict(params[name], ds.x_public))
             for name, lrn in runs.items()}
    agreement = {name: float(np.mean(p == preds["vectorised_no_chunk"]))
                 for name, p in preds.items()}
    flops = 3 * forward_flops(model, jax.tree.map(lambda l: l[0], params["loop"])) \
        * args.batch_size * args.steps * num if args.model != "cnn" else None
    gflops = {name: flops / t / 1e9 for name, t in times.items()} if flops else None
    matmul = matmul_gflops()
    diffs = {name: float(max(np.max(np.abs(np.asarray(a) - np.asarray(b))) for a, b in zip(
        jax.tree.leaves(params["vectorised_no_chunk"]), jax.tree.leaves(p))))
        for name, p in params.items()}
    best_vec = min(times["vectorised_auto_chunk"], times["vectorised_no_chunk"])
    record = {
        "benchmark": "fedkt_teachers",
        "teachers": num, "parties": args.parties, "partitions": args.partitions,
        "teachers_per_partition": args.teachers, "model": args.model, "hidden": args.hidden,
        "params_per_teacher": model.num_params(jax.tree.map(lambda l: l[0],
                                                            params["loop"])),
        "max_records_per_teacher": td.max_size, "steps": args.steps,
        "batch_size": args.batch_size,
        "seconds": times, "compilations_in_warm_call": compiles,
        "python_dispatches": {"vectorised_auto_chunk": 1, "vectorised_no_chunk": 1,
                              "loop": num},
        "speedup_vs_loop": {"vectorised_auto_chunk": times["loop"] / times[
            "vectorised_auto_chunk"], "vectorised_no_chunk": times["loop"] / times[
                "vectorised_no_chunk"], "best": times["loop"] / best_vec},
        "max_abs_param_diff_vs_no_chunk": diffs,
        "public_prediction_agreement_vs_no_chunk": agreement,
        "achieved_gflops": gflops, "matmul_gflops_same_run": matmul,
        "dataset": args.dataset,
        "environment": environment(),
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    print(f"speed-up of one compiled call over the loop: {record['speedup_vs_loop']['best']:.2f}x"
          f" (max |param diff| loop vs vectorised: {diffs['loop']:.2e}; public predictions "
          f"agree on {agreement['loop']:.4f}); achieved GFLOP/s {gflops}, float32 matmul "
          f"{matmul:.1f} GFLOP/s")
    write_json(args.out, record)
    return record


if __name__ == "__main__":
    main()
