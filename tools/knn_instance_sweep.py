"""kNN-DPFL swept at INSTANCE-level target epsilons (``fedjax-dp sweep`` calibrates the headline
unit, which for kNN-DPFL is ``agent``; this wrapper calibrates the instance level instead).

    .venv/bin/python tools/knn_instance_sweep.py configs/experiments/voting_paper_scale/knn_dpfl.toml \
        --queries 100 500 2000 --k 30 --targets 1 2 4 8 --seeds 3 \
        --out results/voting_dpfl/paper_scale/knn_dpfl_n100 [--set data.num_agents=1000 ...]

Exact: a vote's ledger depends on sigma / Delta only (``SelfComposed(Gaussian(sigma / Delta),
Q)``), so with agent-level sigma_a calibrated to epsilon E (Delta_agent = 1), sigma = sigma_a *
Delta_instance (sqrt(2)/k, derived) gives instance-level epsilon E. Per (k, Q, E) one
``fedjax-dp sweep`` (3 seeds, ``--set algorithm.sigma``) into OUT/k{k}_q{Q}_e{E}; then per E the
(k, Q) with the best mean val_accuracy is selected; its test accuracy and its instance epsilon
(read from the runs' ledgers) go to OUT/selected.json in the format of the sweep's selection.
"""
from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np

from fedjax_dp.experiments import calibrate as cal, config as config_lib


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config")
    ap.add_argument("--queries", type=int, nargs="+", required=True)
    ap.add_argument("--k", type=int, nargs="+", required=True)
    ap.add_argument("--targets", type=float, nargs="+", required=True)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--set", action="append", default=[], dest="sets")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    out = Path(a.out)
    raw = tomllib.loads(Path(a.config).read_text())
    rows = []
    for e in a.targets:
        cells = []
        for k in a.k:
            for q in a.queries:
                sets = a.sets + [f"algorithm.k={k}", f"algorithm.num_queries={q}"]
                sigma_a = cal.calibrate(config_lib.resolve(raw, sets), "algorithm.sigma", e)
                sigma = sigma_a * math.sqrt(2) / k               # derived Delta_instance
                d = out / f"k{k}_q{q}_e{e:g}"
                cmd = [sys.executable, "-m", "fedjax_dp.experiments.cli", "sweep", a.config,
                       "--seeds", str(a.seeds), "--quiet", "--out", d,
                       *[x for s in sets + [f"algorithm.sigma={sigma!r}"] for x in ("--set", s)]]
                if (d / "results.jsonl").is_file():
                    cmd[cmd.index("--out")] = "--resume"
                subprocess.run([str(c) for c in cmd], check=True, stdout=subprocess.DEVNULL)
                recs = [json.loads(x) for x in (d / "results.jsonl").read_text().splitlines()]
                inst = [g["epsilon"] for r in recs for g in r["privacy"]
                        if g["unit"] == "instance" and g["accountant"] == "rdp"]
                cells.append(({"algorithm.k": k, "algorithm.num_queries": q}, sigma, recs, inst))
        sel, sigma, recs, inst = max(cells, key=lambda c: np.mean([r["val_accuracy"]
                                                                   for r in c[2]]))
        test = [r["test_accuracy"] for r in recs]
        rows.append({"base": "voting_paper_scale/knn_dpfl", "algorithm": "knn_dpfl",
                     "target_epsilon": e, "selected": sel, "n_candidates": len(cells),
                     "val_accuracy_mean": float(np.mean([r["val_accuracy"] for r in recs])),
                     "n": len(recs), "test_accuracy_mean": float(np.mean(test)),
                     "test_accuracy_std": float(np.std(test, ddof=1)) if len(test) > 1 else None,
                     "epsilon_mean": float(np.mean(inst)), "epsilon_std": float(np.std(inst)),
                     "epsilon_unit": "instance", "calibrated_value": round(sigma, 4)})
        print(json.dumps(rows[-1]), flush=True)
        (out / "selected.json").write_text(json.dumps(rows, indent=2))   # after every target


if __name__ == "__main__":
    main()
