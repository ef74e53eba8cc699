"""DP-FNAS experiment on offline data: the shape of the paper's Tables 1 and 2.
As sweep files: ``configs/experiments/fnas_*.toml`` (``fedjax-dp sweep FILE``; docs/sweeps.md).

    PYTHONPATH=. python tools/exp_fnas.py --out results/fnas            # small search space
    PYTHONPATH=. python tools/exp_fnas.py --full --out results/fnas     # configs/fnas sizes

1. Table 1: test accuracy of the retrained derived network vs the number of parties
   K in {1, 2, 4, 8}, with (DP-FNAS) and without (FNAS) privacy; search time, epsilon.
2. Table 2: error vs noise multiplier (sigma = tau) for K = 4 (the test split stands in for the
   paper's validation error: the parties' validation halves are private).
3. The searched genotype (DP, K = 4) vs random genotypes of the same size, each retrained with
   the same DP retraining over ``--seeds`` seeds.

Writes ``results.json``, ``table.md`` and ``plot.png`` (matplotlib) under ``--out``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from fedjax_dp.experiments import config as config_lib
from fedjax_dp.experiments import runner
from fedjax_dp.models import darts

#: The default (quick) sizes: compile time dominates on a CPU (~2 min per search program of
#: this size on the loaded 2-core machine), and every K, privacy setting and noise level is a
#: program of its own.
QUICK = {"nodes": 2, "channels": 4, "cells": 3, "stem_multiplier": 1,
         "primitives": ["none", "max_pool_3x3", "skip_connect", "sep_conv_3x3"],
         "search_epochs": 4, "batch_size": 64, "retrain_epochs": 6, "retrain_batch_size": 64}


def _base(args) -> dict:
    path = Path(__file__).resolve().parent.parent / "configs" / "fnas" / "digits_dp.toml"
    cfg = config_lib.load(path)
    if not args.full:
        cfg["algorithm"].update(QUICK)
    cfg["run"]["progress"] = False
    return cfg


def _run(base: dict, **changes) -> dict:
    cfg = json.loads(json.dumps(base))
    for dotted, value in changes.items():
        table, key = dotted.split("__")
        if table == "seed":
            cfg["seed"] = value
        else:
            cfg[table][key] = value
    start = time.perf_counter()
    res = runner.run(cfg)
    worst = {r["accountant"]: r["epsilon"] for r in res["privacy"] if r["unit"] == "instance"}
    out = {"test_accuracy": res["test_accuracy"], "epsilon_pld": worst.get("pld"),
           "epsilon_rdp": worst.get("rdp"), "search_time_s": res["search_time_s"],
           "retrain_time_s": res["retrain_time_s"], "wall_time_s": time.perf_counter() - start,
           "genotype": res["genotype"],
           "paper_gdp_epsilon": (res["paper_gdp"] or {}).get("worst_epsilon")}
    print(json.dumps({k: v for k, v in {**changes, **out}.items() if k != "genotype"}),
          flush=True)
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/fnas")
    ap.add_argument("--full", action="store_true", help="configs/fnas sizes (slow on a CPU)")
    ap.add_argument("--parties", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--noises", type=float, nargs="+", default=[0.5, 1.0, 2.0, 4.0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="override algorithm fields of the base config (JSON values)")
    ap.add_argument("--resume", action="store_true", help="keep the runs already in "
                    "OUT/results.json (same base config) and run only the missing ones")
    args = ap.parse_args(argv)
    base = _base(args)
    for item in args.set:
        key, value = item.split("=", 1)
        base["algorithm"][key] = json.loads(value)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    record = {"algorithm": dict(base["algorithm"]), "dataset": base["data"]["dataset"],
              "table1": [], "table2": [], "random_vs_searched": {}}
    if args.resume and (out_dir / "results.json").exists():
        saved = json.loads((out_dir / "results.json").read_text())
        same = json.loads(json.dumps(record["algorithm"]))
        if saved["algorithm"] != same or saved["dataset"] != record["dataset"]:
            raise SystemExit(f"--resume: {out_dir / 'results.json'} was made with another base "
                             "config")
        record = saved
    done1 = {(r["parties"], r["private"]) for r in record["table1"]}
    done2 = {r["noise"] for r in record["table2"]}

    def save():                       # after every run: partial results survive a stop
        (out_dir / "results.json").write_text(json.dumps(record, indent=2))
        (out_dir / "table.md").write_text(_table(record))

    for private in (True, False):                                   # Table 1
        for k in args.parties:
            if (k, private) in done1:
                continue
            r = _run(base, data__num_agents=k, algorithm__private=private)
            record["table1"].append({"parties": k, "private": private, **r})
            record["table1"].sort(key=lambda r: (not r["private"], r["parties"]))
            save()
    searched = next(r for r in record["table1"] if r["parties"] == 4 and r["private"]) \
        if 4 in args.parties else None
    if searched is not None and not all(                            # searched vs random
            len(record["random_vs_searched"].get(n, {}).get("runs", [])) >= args.seeds
            for n in ("searched", "random")):
        nodes = base["algorithm"]["nodes"]
        prims = base["algorithm"].get("primitives", list(darts.PRIMITIVES))
        rows = {"searched": [], "random": []}
        for seed in range(1, args.seeds + 1):
            for name, geno in (("searched", searched["genotype"]),
                               ("random", darts.random_genotype(seed, nodes, prims).to_json())):
                r = _run(base, seed__seed=seed, data__num_agents=4,
                         algorithm__fixed_genotype=json.dumps(geno))
                rows[name].append({"seed": seed, "genotype": geno,
                                   "test_accuracy": r["test_accuracy"]})
            for name, rs in rows.items():
                accs = [r["test_accuracy"] for r in rs]
                record["random_vs_searched"][name] = {
                    "runs": rs, "mean": statistics.mean(accs),
                    "std": statistics.stdev(accs) if len(accs) > 1 else 0.0}
            save()
    for noise in args.noises:                                       # Table 2
        if noise in done2:
            continue
        if noise == base["algorithm"]["noise_weights"] and searched is not None:
            r = searched
        else:
            r = _run(base, data__num_agents=4, algorithm__noise_weights=noise,
                     algorithm__noise_arch=noise)
        record["table2"].append({"noise": noise, "error": 1.0 - r["test_accuracy"],
                                 "epsilon_pld": r["epsilon_pld"]})
        save()
    (out_dir / "results.json").write_text(json.dumps(record, indent=2))
    (out_dir / "table.md").write_text(_table(record))
    _plot(record, out_dir / "plot.png")
    print((out_dir / "table.md").read_text())
    return record


def _table(rec: dict) -> str:
    lines = ["Table 1: test accuracy of the retrained network vs parties K", "",
             "| K | private | test acc. | eps (PLD, delta 1e-5) | paper GDP eps | search s | "
             "retrain s |", "|---|---|---|---|---|---|---|"]
    for r in rec["table1"]:
        eps = "-" if r["epsilon_pld"] is None else f"{r['epsilon_pld']:.2f}"
        gdp = "-" if r["paper_gdp_epsilon"] is None else f"{r['paper_gdp_epsilon']:.2f}"
        lines.append(f"| {r['parties']} | {r['private']} | {r['test_accuracy']:.3f} | {eps} | "
                     f"{gdp} | {r['search_time_s']:.0f} | {r['retrain_time_s']:.0f} |")
    lines += ["", "Table 2: test error vs noise multiplier (K = 4)", "",
              "| noise sigma = tau | error | eps (PLD) |", "|---|---|---|"]
    for r in rec["table2"]:
        lines.append(f"| {r['noise']} | {r['error']:.3f} | {r['epsilon_pld']:.2f} |")
    rv = rec["random_vs_searched"]
    if rv:
        lines += ["", "Searched (DP, K = 4) vs random genotypes, same DP retraining", "",
                  "| genotype | mean test acc. | std | seeds |", "|---|---|---|---|"]
        for name, v in rv.items():
            lines.append(f"| {name} | {v['mean']:.3f} | {v['std']:.3f} | {len(v['runs'])} |")
    return "\n".join(lines) + "\n"


def _plot(rec: dict, path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
        return
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for private, style in ((True, "o-"), (False, "s--")):
        rows = [r for r in rec["table1"] if r["private"] == private]
        axes[0].plot([r["parties"] for r in rows], [r["test_accuracy"] for r in rows], style,
                     label="DP-FNAS" if private else "FNAS")
    axes[0].set_xscale("log", base=2)
    axes[0].set_xlabel("parties K")
    axes[0].set_ylabel("test accuracy")
    axes[0].legend()
    axes[1].plot([r["noise"] for r in rec["table2"]], [r["error"] for r in rec["table2"]], "o-")
    axes[1].set_xlabel("noise multiplier")
    axes[1].set_ylabel("test error (K = 4)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
