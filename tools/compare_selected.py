"""Several sweeps' selected cells side by side: one markdown table and one JSON.

Each sweep's ``selected.json`` (written by ``fedjax-dp sweep --select val_accuracy``) holds, per
(algorithm, target epsilon, every grid key not selected over), the validation-chosen cell and its
test accuracy mean and standard deviation over the seeds. This tool lines them up: one row per
value of ``--rows`` keys (default: the non-selected grid keys and ``target_epsilon``), one column
per sweep (named by its algorithm, or ``--names``), the cell ``mean +- std (n)`` and the chosen
hyper-parameters; the best mean of each row in bold. ``--ceiling DIR`` adds a sweep without
privacy as a reference line (its best selected mean).

    python tools/compare_selected.py results/sweeps/voting_fair_controls_{dp_fedavg,dp_fedsgd,knn_dpfl,ae_dpfl} \
        --out results/voting_dpfl/fair_controls
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

SKIP = {"base", "algorithm", "selected", "n_candidates", "val_accuracy_mean", "n",
        "test_accuracy_mean", "test_accuracy_std", "epsilon_mean", "epsilon_std", "epsilon_unit",
        "calibrated_value"}


def load(folder: Path) -> list[dict]:
    path = folder / "selected.json"
    if not path.is_file():
        raise SystemExit(f"{folder}: no selected.json (run the sweep with --select val_accuracy)")
    return json.loads(path.read_text())


def row_key(rec: dict, keys: list[str]) -> tuple:
    return tuple(json.dumps(rec.get(k)) for k in keys)


def fmt(rec: dict | None, bold: bool) -> str:
    if rec is None:
        return "-"
    m, s = rec["test_accuracy_mean"], rec.get("test_accuracy_std") or 0.0
    text = f"{m:.3f} ± {s:.3f}" if not math.isnan(s) else f"{m:.3f}"
    text = f"**{text}**" if bold else text
    chosen = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in rec.get("selected", {}).items())
    eps = rec.get("epsilon_mean")
    extra = f"; eps {eps:.3g}" if isinstance(eps, (int, float)) else ""
    return f"{text} ({chosen}{extra})" if chosen or extra else text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("sweeps", nargs="+", type=Path, help="sweep output folders")
    p.add_argument("--names", default="", help="column names, comma-separated (default: the "
                   "algorithm of each sweep)")
    p.add_argument("--rows", default="", help="row keys, comma-separated (default: every key "
                   "the sweeps' selected cells are grouped by)")
    p.add_argument("--ceiling", type=Path, default=None,
                   help="a sweep without privacy whose best selected test accuracy is the ceiling")
    p.add_argument("--title", default="")
    p.add_argument("--out", type=Path, required=True, help="writes OUT.md and OUT.json")
    a = p.parse_args(argv)
    tables = [load(s) for s in a.sweeps]
    names = a.names.split(",") if a.names else [t[0]["algorithm"] for t in tables]
    if len(names) != len(tables):
        raise SystemExit(f"--names has {len(names)} names for {len(tables)} sweeps")
    keys = a.rows.split(",") if a.rows else sorted(
        {k for t in tables for r in t for k in r if k not in SKIP},
        key=lambda k: (k == "target_epsilon", k))
    rows: dict[tuple, dict] = {}
    for name, table in zip(names, tables):
        for rec in table:
            rows.setdefault(row_key(rec, keys), {})[name] = rec
    ceiling = None
    if a.ceiling is not None:
        ceiling = max(load(a.ceiling), key=lambda r: r["test_accuracy_mean"])
    lines = [f"# {a.title}" if a.title else "# Selected cells side by side", "",
             "Sources: " + ", ".join(f"`{s}`" for s in a.sweeps) + ". Test accuracy mean ± std "
             "over the seeds of the validation-chosen cell (its chosen values in brackets); the "
             "best mean of each row in bold.", ""]
    if ceiling is not None:
        lines += [f"Ceiling (no privacy, `{a.ceiling}`): {ceiling['test_accuracy_mean']:.3f} ± "
                  f"{ceiling.get('test_accuracy_std') or 0.0:.3f} "
                  f"({', '.join(f'{k}={v}' for k, v in ceiling.get('selected', {}).items())}).", ""]
    lines += ["| " + " | ".join(keys + names) + " |", "|" + "---|" * (len(keys) + len(names))]
    out_rows = []
    for rk in sorted(rows, key=lambda r: [json.loads(x) if json.loads(x) is not None else -1
                                           for x in r]):
        cells = rows[rk]
        best = max((c["test_accuracy_mean"] for c in cells.values()), default=None)
        lines.append("| " + " | ".join([str(json.loads(x)) for x in rk] +
                                        [fmt(cells.get(n), cells.get(n) is not None and
                                             cells[n]["test_accuracy_mean"] == best)
                                         for n in names]) + " |")
        out_rows.append({"row": dict(zip(keys, (json.loads(x) for x in rk))),
                         "cells": {n: cells.get(n) for n in names},
                         "best": [n for n in names if cells.get(n) is not None
                                  and cells[n]["test_accuracy_mean"] == best]})
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    a.out.with_suffix(".json").write_text(json.dumps(
        {"sources": [str(s) for s in a.sweeps], "names": names, "row_keys": keys,
         "ceiling": ceiling, "rows": out_rows}, indent=1) + "\n")
    print(a.out.with_suffix(".md"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
