"""Accuracy-vs-epsilon plots of sweep folders (``fedjax-dp sweep --out DIR``), PNG and SVG.

    .venv/bin/python tools/plot_sweep.py DIR [DIR ...] [--out STEM] [--hue FIELD] [--title T]

Writes ``STEM.png/.svg`` (default ``DIR/accuracy_vs_epsilon``): every private run of
``results.jsonl``, test accuracy mean +- std per ``--hue`` value (default ``algorithm``) and
epsilon -- the target epsilon when the runs were calibrated to one, else the run's own. With a
``selected.json`` (``--select val_accuracy``) also ``STEM_selected.png/.svg``: per selected row
(one line per algorithm and remaining grid point), the chosen grid point's test accuracy mean
+- std over its seeds -- the numbers of ``selected.md``. Several folders are pooled (e.g.
AE-DPFL's and DP-FedAvg's sweeps in one figure). Drawn by :mod:`fedjax_dp.experiments.plots`.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from fedjax_dp.experiments import plots, records as records_lib


def _x(recs: list[dict]) -> str:
    return "target_epsilon" if all(r.get("target_epsilon") for r in recs) else "epsilon"


def selected_records(recs: list[dict], rows: list[dict]) -> list[dict]:
    """The runs of each selected cell, with ``setting``: algorithm (dataset) and the other grid
    keys' values, so that each selected row is one line."""
    datasets = {r.get("dataset") for r in recs}
    out = []
    for row in rows:
        chosen = row["selected"]
        for r in recs:
            p = r.get("params") or {}
            if ((r.get("base"), r.get("algorithm"), r.get("target_epsilon"))
                    == (row["base"], row["algorithm"], row["target_epsilon"])
                    and all(p.get(k) == v for k, v in chosen.items())
                    and all(row.get(k) == v for k, v in p.items() if k not in chosen)):
                rest = [f"{k.split('.')[-1]}={v}" for k, v in p.items() if k not in chosen]
                where = f" ({r.get('dataset')})" if len(datasets) > 1 else ""
                out.append({**r, "setting": " ".join([f"{r['algorithm']}{where}"] + rest)})
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweeps", nargs="+", help="sweep output folders (results.jsonl)")
    ap.add_argument("--out", help="output stem (default DIR/accuracy_vs_epsilon, first DIR)")
    ap.add_argument("--hue", default="algorithm", help="one line per value of this field")
    ap.add_argument("--title", default=None)
    a = ap.parse_args(argv)
    dirs = [Path(d) for d in a.sweeps]
    recs = records_lib.read([d / "results.jsonl" for d in dirs])
    private = [r for r in recs if r.get("epsilon") is not None]
    if not private:
        raise SystemExit("plot_sweep: no run has an epsilon (a non-private sweep): nothing to "
                         "plot against epsilon; use fedjax-dp plot --x FIELD")
    stem = Path(a.out) if a.out else dirs[0] / "accuracy_vs_epsilon"
    written = {"all_runs": plots.plot_xy(private, _x(private), "test_accuracy", a.hue, stem,
                                         title=a.title)}
    rows = [row for d in dirs if (d / "selected.json").is_file()
            for row in json.loads((d / "selected.json").read_text())]
    chosen = [r for r in selected_records(recs, rows) if r.get("epsilon") is not None]
    if chosen:
        title = a.title or "selected on val_accuracy: test accuracy (mean ± std over seeds)"
        written["selected"] = plots.plot_xy(chosen, _x(chosen), "test_accuracy", "setting",
                                            f"{stem}_selected", title=title)
    print(json.dumps(written, indent=2))
    return written


if __name__ == "__main__":
    main()
