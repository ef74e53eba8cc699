"""Sweeps compared: validation-chosen cells side by side, and the arms of one grid key tested.

Two reports, each written as ``STEM.md`` and ``STEM.json`` (and ``STEM.png`` for arms):

* :func:`selected_table` -- several sweeps' ``selected.json`` (``fedjax-dp sweep --select``)
  lined up: one row per value of the row keys, one column per sweep, the cell ``mean ± std`` of
  the test accuracy over the seeds, the best mean of each row in bold; optionally a ceiling
  sweep (no privacy) as a reference line.
* :func:`arms` -- the runs of one sweep split by the values of one grid key (the *arms*).
  Within an arm a *unit* (default the run's ``seed``) may have several runs; the unit's mean is
  the observation. Per arm: pooled, between-unit and mean within-unit statistics; between
  every two arms, Welch's two-sided t-test on the unit means (``equal_var=False``).

``fedjax-dp compare selected ...`` and ``fedjax-dp compare arms ...`` are the command line."""
from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Sequence

import numpy as np

from fedjax_dp.experiments import records as records_lib

#: selected.json fields that are results, not the keys a chosen cell is grouped by
_RESULT_KEYS = {"base", "algorithm", "selected", "n_candidates", "val_accuracy_mean", "n",
                "test_accuracy_mean", "test_accuracy_std", "epsilon_mean", "epsilon_std",
                "epsilon_unit", "calibrated_value"}


def read_selected(folder: str | Path) -> list[dict]:
    path = Path(folder) / "selected.json"
    if not path.is_file():
        raise ValueError(f"{str(folder)!r} holds no selected.json (run the sweep with "
                         f"--select val_accuracy)")
    return json.loads(path.read_text())


def _cell(rec: dict | None, bold: bool) -> str:
    if rec is None:
        return "-"
    m, s = rec["test_accuracy_mean"], rec.get("test_accuracy_std")
    text = f"{m:.3f}" if s is None or math.isnan(s) else f"{m:.3f} ± {s:.3f}"
    text = f"**{text}**" if bold else text
    notes = [f"{k.split('.')[-1]}={v}" for k, v in (rec.get("selected") or {}).items()]
    eps = rec.get("epsilon_mean")
    if isinstance(eps, (int, float)) and not math.isnan(eps):
        notes.append(f"eps {eps:.3g}")
    return f"{text} ({', '.join(notes)})" if notes else text


def selected_table(sweeps: Sequence[str | Path], *, names: Sequence[str] | None = None,
                   rows: Sequence[str] | None = None, ceiling: str | Path | None = None,
                   title: str = "") -> tuple[str, dict]:
    """``(markdown, json)`` of the sweeps' chosen cells side by side (module docstring)."""
    tables = [read_selected(s) for s in sweeps]
    for s, t in zip(sweeps, tables):
        if not t:
            raise ValueError(f"{str(s)!r}: selected.json holds no chosen cell")
    names = list(names) if names else [t[0]["algorithm"] for t in tables]
    if len(names) != len(tables):
        raise ValueError(f"names: {len(names)} names for {len(tables)} sweeps")
    if len(set(names)) != len(names):
        raise ValueError(f"names: {names} repeat a name; give --names")
    keys = list(rows) if rows else sorted({k for t in tables for r in t if True for k in r
                                           if k not in _RESULT_KEYS},
                                          key=lambda k: (k == "target_epsilon", k))
    grouped: dict[tuple, dict] = {}
    for name, table in zip(names, tables):
        for rec in table:
            grouped.setdefault(tuple(json.dumps(rec.get(k)) for k in keys), {})[name] = rec
    top = None
    if ceiling is not None:
        top = max(read_selected(ceiling), key=lambda r: r["test_accuracy_mean"])
    lines = [f"# {title or 'Chosen cells side by side'}", "",
             "Sources: " + ", ".join(f"`{s}`" for s in sweeps) + ". Test accuracy mean ± std "
             "over the seeds of the cell chosen on validation (its chosen values, and the "
             "reported epsilon, in brackets); the best mean of each row in bold.", ""]
    if top is not None:
        lines += [f"Ceiling without privacy (`{ceiling}`): {_cell(top, False)}.", ""]
    lines += ["| " + " | ".join(keys + names) + " |", "|" + "---|" * (len(keys) + len(names))]
    out_rows = []

    def order(k: tuple) -> list:
        return [(v is None, v if isinstance(v, (int, float)) else str(v))
                for v in map(json.loads, k)]

    for rk in sorted(grouped, key=order):
        cells = grouped[rk]
        best = max(c["test_accuracy_mean"] for c in cells.values())
        winners = [n for n in names if n in cells and cells[n]["test_accuracy_mean"] == best]
        lines.append("| " + " | ".join([str(json.loads(x)) for x in rk] +
                                        [_cell(cells.get(n), n in winners) for n in names])
                     + " |")
        out_rows.append({"row": dict(zip(keys, map(json.loads, rk))),
                         "cells": {n: cells.get(n) for n in names}, "best": winners})
    return "\n".join(lines) + "\n", {"sources": [str(s) for s in sweeps], "names": names,
                                     "row_keys": keys, "ceiling": top, "rows": out_rows}


def _welch(a: Sequence[float], b: Sequence[float]) -> dict:
    from scipy import stats
    t, p = stats.ttest_ind(a, b, equal_var=False)
    return {"difference": float(np.mean(a) - np.mean(b)), "t": float(t), "p_value": float(p),
            "n": [len(a), len(b)]}


def _std(x: Sequence[float]) -> float:
    return float(np.std(x, ddof=1)) if len(x) > 1 else math.nan


def arms(recs: Sequence[dict], key: str, *, unit: str = "seed",
         labels: Sequence[str] | None = None, metric: str = "test_accuracy") -> dict:
    """Per arm (value of ``key``) the pooled and per-unit statistics of ``metric``, and Welch's
    test on unit means between every two arms (module docstring). ``labels`` name the arms in
    their order of first appearance."""
    if not recs:
        raise ValueError("arms: no records")
    groups: dict[str, dict[str, list[float]]] = {}
    for r in recs:
        try:
            arm, u = json.dumps(records_lib.field(r, key)), json.dumps(records_lib.field(r, unit))
        except KeyError as e:
            raise ValueError(f"arms: {e.args[0]}") from None
        value = r.get(metric)
        if value is None:
            raise ValueError(f"arms: a record has no {metric!r}")
        groups.setdefault(arm, {}).setdefault(u, []).append(float(value))
    if labels is not None and len(labels) != len(groups):
        raise ValueError(f"labels: {len(labels)} labels for {len(groups)} arms "
                         f"({', '.join(groups)})")
    names = list(labels) if labels is not None else list(groups)
    out: dict[str, dict] = {}
    for name, (value, units) in zip(names, groups.items()):
        runs = [x for v in units.values() for x in v]
        means = [float(np.mean(v)) for v in units.values()]
        within = [_std(v) for v in units.values() if len(v) > 1]
        out[name] = {"value": json.loads(value), "runs": len(runs), "units": len(means),
                     "runs_per_unit": sorted({len(v) for v in units.values()}),
                     "pooled_mean": float(np.mean(runs)), "pooled_std": _std(runs),
                     "unit_means": dict(zip(map(json.loads, units), means)),
                     "between_unit_mean": float(np.mean(means)),
                     "between_unit_std": _std(means),
                     "within_unit_std": float(np.mean(within)) if within else math.nan}
    tests = {}
    for x, y in itertools.combinations(names, 2):
        mx, my = list(out[x]["unit_means"].values()), list(out[y]["unit_means"].values())
        if min(len(mx), len(my)) > 1:
            tests[f"{x} vs {y}"] = _welch(mx, my)
    return {"key": key, "unit": unit, "metric": metric, "arms": out, "tests": tests}


def arms_markdown(s: dict, title: str = "", source: str = "") -> str:
    lines = [f"# {title or 'Arms of ' + s['key']}", "",
             (f"Source: `{source}`. " if source else "") + f"Arms: the values of `{s['key']}`; "
             f"unit: `{s['unit']}` (its runs averaged first); metric: `{s['metric']}`.", "",
             "| arm | runs | units | pooled mean ± std | unit means: mean ± std (between) | "
             "within-unit std | unit means |", "|---|---:|---:|---:|---:|---:|---|"]
    for name, a in s["arms"].items():
        lines.append(f"| {name} | {a['runs']} | {a['units']} | {a['pooled_mean']:.3f} ± "
                     f"{a['pooled_std']:.3f} | {a['between_unit_mean']:.3f} ± "
                     f"{a['between_unit_std']:.3f} | {a['within_unit_std']:.3f} | "
                     + ", ".join(f"{m:.3f}" for m in a["unit_means"].values()) + " |")
    if s["tests"]:
        lines += ["", "Welch's t-test on the unit means (two-sided):", "",
                  "| comparison | difference | t | p |", "|---|---:|---:|---:|"]
        for name, t in s["tests"].items():
            lines.append(f"| {name} | {t['difference']:+.3f} | {t['t']:.2f} | "
                         f"{t['p_value']:.3f} |")
    return "\n".join(lines) + "\n"


def arms_plot(s: dict, stem: str | Path, title: str = "") -> list[str]:
    """Bars: each arm's pooled mean ± std; dots: its unit means. Writes STEM.png and .svg."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = list(s["arms"])
    fig, ax = plt.subplots(figsize=(1.6 + 1.6 * len(names), 3.6))
    for i, n in enumerate(names):
        a = s["arms"][n]
        ax.bar(i, a["pooled_mean"], yerr=0.0 if math.isnan(a["pooled_std"]) else
               a["pooled_std"], capsize=6, color=f"C{i}", alpha=0.6)
        means = list(a["unit_means"].values())
        ax.scatter(i + np.linspace(-0.2, 0.2, len(means)), means, color="k", s=14, zorder=3)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel(f"{s['metric']} (bar: mean ± std of runs; dots: {s['unit']} means)",
                  fontsize=8)
    ax.set_title(title or s["key"], fontsize=9)
    fig.tight_layout()
    stem = Path(stem)
    written = [str(stem.with_suffix(".png")), str(stem.with_suffix(".svg"))]
    for w in written:
        fig.savefig(w, dpi=120)
    plt.close(fig)
    return written


def write(stem: str | Path, markdown: str, data: dict) -> list[str]:
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".md").write_text(markdown)
    stem.with_suffix(".json").write_text(json.dumps(data, indent=1, allow_nan=True) + "\n")
    return [str(stem.with_suffix(".md")), str(stem.with_suffix(".json"))]
