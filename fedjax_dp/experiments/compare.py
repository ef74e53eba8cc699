"""Sweeps compared: validation-chosen cells side by side, and the arms of one grid key tested.

Two reports, each written as ``STEM.md`` and ``STEM.json`` (and ``STEM.png`` for arms):

* :func:`selected_table` -- several sweeps' ``selected.json`` (``fedjax-dp sweep --select``)
  lined up: one row per value of the row keys, one column per sweep, the cell ``mean ± std`` of
  the test accuracy over the seeds, the best mean of each row in bold; optionally a ceiling
  sweep (no privacy) as a reference line. A sweep whose ``selected.json`` holds several
  (base, algorithm) pairs gives a column each. Under the table, every two cells of a row with
  3 or more seeds are tested (:func:`difference`: Welch's t-test and a bootstrap interval), from
  the per-seed accuracies in the sweep's ``results.jsonl[.gz]``.
* :func:`arms` -- the runs of one sweep split by the values of one grid key (the *arms*).
  Within an arm a *unit* (default the run's ``seed``) may have several runs; the unit's mean is
  the observation. Per arm: pooled, between-unit and mean within-unit statistics; between
  every two arms, :func:`difference` of the unit means (Welch's two-sided t-test and a
  bootstrap interval).

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
_RESULT_KEYS = {"base", "algorithm", "selected", "at_edge", "n_candidates", "val_accuracy_mean",
                "n", "test_accuracy_mean", "test_accuracy_std", "epsilon_mean", "epsilon_std",
                "epsilon_unit", "calibrated_value"}
#: the fewest seeds a cell needs before two cells are tested against each other
MIN_SEEDS = 3


def difference(a: Sequence[float], b: Sequence[float], *, resamples: int = 10_000,
               level: float = 0.95, seed: int = 0) -> dict:
    """Two samples' difference of means ``mean(a) - mean(b)``, tested two ways:

    * Welch's two-sided t-test (unequal variances; ``p_value`` NaN when both samples are
      constant), and
    * the percentile bootstrap interval at ``level``: ``resamples`` times, each sample is drawn
      again with replacement from itself (numpy's generator seeded with ``seed``, so a table is
      reproducible) and the difference of the two means is taken; the interval is the
      (1 - level) / 2 and (1 + level) / 2 quantiles of those differences.

    ``excludes_zero``: the interval lies on one side of 0 (the sign is settled at ``level``)."""
    from scipy import stats
    a, b = np.asarray(a, float), np.asarray(b, float)
    if min(a.size, b.size) < 2:
        raise ValueError(f"difference: each sample needs 2 or more values, got {a.size} and "
                         f"{b.size}")
    if a.std() == 0 and b.std() == 0:
        t, p = (math.nan, math.nan) if a.mean() == b.mean() else (math.copysign(
            math.inf, a.mean() - b.mean()), 0.0)
    else:
        t, p = stats.ttest_ind(a, b, equal_var=False)
    rng = np.random.default_rng(seed)
    boot = (rng.choice(a, (resamples, a.size)).mean(1)
            - rng.choice(b, (resamples, b.size)).mean(1))              # [resamples]
    lo, hi = np.quantile(boot, [(1 - level) / 2, (1 + level) / 2])
    return {"difference": float(a.mean() - b.mean()), "t": float(t), "p_value": float(p),
            "interval": [float(lo), float(hi)], "level": level, "resamples": resamples,
            "excludes_zero": bool(lo > 0 or hi < 0), "n": [int(a.size), int(b.size)]}


def _columns(sweeps: Sequence[str | Path]) -> list[dict]:
    """A column per (sweep, base, algorithm) in the sweeps' ``selected.json``, in order; each
    with its rows and, where a ``results.jsonl[.gz]`` lies beside, every row's per-seed test
    accuracies (``runs``)."""
    cols: list[dict] = []
    for s in sweeps:
        rows = records_lib.read_selected([s])
        folder = Path(s)
        runs = None
        if any((folder / n).is_file() for n in ("results.jsonl", "results.jsonl.gz")):
            runs = records_lib.read([folder])
        own: dict[tuple, dict] = {}
        for r in rows:
            col = own.setdefault((r["base"], r["algorithm"]), {
                "sweep": str(s), "base": r["base"], "algorithm": r["algorithm"], "rows": [],
                "records": runs or []})
            seeds = None
            if runs is not None:
                seeds = [x["test_accuracy"] for x in records_lib.selected_records(runs, [r])]
            col["rows"].append({**r, "runs": seeds})
        cols += own.values()
    return cols


def _default_names(cols: list[dict]) -> list[str]:
    names = [c["algorithm"] for c in cols]
    return [f"{n} ({str(c['base']).split('/')[-1]})" if names.count(n) > 1 else n
            for n, c in zip(names, cols)]


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
                   title: str = "", resamples: int = 10_000,
                   tuning: bool = False) -> tuple[str, dict]:
    """``(markdown, json)`` of the sweeps' chosen cells side by side (module docstring), and, in
    each row, every two cells with :data:`MIN_SEEDS` or more seeds each tested
    (:func:`difference` on their per-seed test accuracies, read from the sweeps' records);
    ``tuning``: also each chosen cell's :func:`tuning_cost`."""
    cols = _columns(sweeps)
    names = list(names) if names else _default_names(cols)
    if len(names) != len(cols):
        raise ValueError(f"names: {len(names)} names for {len(cols)} columns "
                         f"({', '.join(_default_names(cols))})")
    if len(set(names)) != len(names):
        raise ValueError(f"names: {names} repeat a name; give --names")
    keys = list(rows) if rows else sorted({k for c in cols for r in c["rows"] for k in r
                                           if k not in _RESULT_KEYS and k != "runs"},
                                          key=lambda k: (k == "target_epsilon", k))
    grouped: dict[tuple, dict] = {}
    for name, col in zip(names, cols):
        for rec in col["rows"]:
            grouped.setdefault(tuple(json.dumps(rec.get(k)) for k in keys), {})[name] = rec
    top = None
    if ceiling is not None:
        top = max(records_lib.read_selected([ceiling]), key=lambda r: r["test_accuracy_mean"])
    lines = [f"# {title or 'Chosen cells side by side'}", "",
             "Sources: " + ", ".join(f"`{s}`" for s in sweeps) + ". Test accuracy mean ± std "
             "over the seeds of the cell chosen on validation (its chosen values, and the "
             "reported epsilon, in brackets); the best mean of each row in bold.", ""]
    if top is not None:
        lines += [f"Ceiling without privacy (`{ceiling}`): {_cell(top, False)}.", ""]
    lines += ["| " + " | ".join(keys + names) + " |", "|" + "---|" * (len(keys) + len(names))]
    out_rows, test_lines, cost_lines = [], [], []
    by_name = dict(zip(names, cols))

    def order(k: tuple) -> list:
        return [(v is None, v if isinstance(v, (int, float)) else str(v))
                for v in map(json.loads, k)]

    for rk in sorted(grouped, key=order):
        cells = grouped[rk]
        label = ", ".join(f"{k.split('.')[-1]}={json.loads(v)}" for k, v in zip(keys, rk))
        best = max(c["test_accuracy_mean"] for c in cells.values())
        winners = [n for n in names if n in cells and cells[n]["test_accuracy_mean"] == best]
        lines.append("| " + " | ".join([str(json.loads(x)) for x in rk] +
                                        [_cell(cells.get(n), n in winners) for n in names])
                     + " |")
        tests = {}
        for x, y in itertools.combinations([n for n in names if n in cells], 2):
            rx, ry = cells[x].get("runs") or [], cells[y].get("runs") or []
            if min(len(rx), len(ry)) >= MIN_SEEDS:
                d = tests[f"{x} vs {y}"] = difference(rx, ry, resamples=resamples)
                test_lines.append(_test_line(label, f"{x} vs {y}", d))
        costs = {}
        for n in (names if tuning else []):
            cost = n in cells and tuning_cost(by_name[n]["records"], cells[n])
            if cost:
                costs[n] = cost
                one = cost["epsilon_one"]
                cost_lines.append(f"| {label} | {n} | {cost['candidates']} | "
                                  f"{'-' if one is None else f'{one:.3g}'} | "
                                  f"{cost['epsilon_all']:.3g} |")
        out_rows.append({"row": dict(zip(keys, map(json.loads, rk))),
                         "cells": {n: cells.get(n) for n in names}, "best": winners,
                         "tests": tests, **({"tuning_cost": costs} if tuning else {})})
    if test_lines:
        lines += ["", f"Every two cells of a row with {MIN_SEEDS} or more seeds each: the "
                  "difference of their mean test accuracies, its 95% percentile bootstrap "
                  f"interval ({resamples:,} resamples of each cell's seeds) and Welch's "
                  "two-sided t-test on the seeds; * where p < 0.05 and the interval excludes "
                  "0. With few seeds the bootstrap interval is narrow (it resamples the same "
                  "few values: about sqrt((n - 1) / n) of the spread): read the verdict from "
                  "Welch's p.", "",
                  "| row | comparison | difference | 95% interval | Welch p |",
                  "|---|---|---:|---:|---:|"] + test_lines
    if cost_lines:
        lines += ["", "What the tuning would cost: the chosen cell's epsilon beside the epsilon "
                  "of all its candidates' runs composed (dp-accounting's RDP accountant, first "
                  "seed's events, the same delta). The validation scores that chose among them "
                  "are not private and are in neither figure (docs/reproducibility.md).", "",
                  "| row | column | candidates | epsilon, chosen cell | epsilon, all "
                  "candidates |", "|---|---|---:|---:|---:|"] + cost_lines
    return "\n".join(lines) + "\n", {"sources": [str(s) for s in sweeps], "names": names,
                                     "row_keys": keys, "ceiling": top, "rows": out_rows}


def tuning_cost(runs: Sequence[dict], row: dict, accountant: str = "rdp") -> dict | None:
    """What releasing every candidate of a chosen cell would cost: the K candidates of ``row``
    (a ``selected.json`` row: the runs of the same base, algorithm, target epsilon and other grid
    values that differ only in the chosen keys) each give their first seed's events for the
    row's privacy unit (:func:`fedjax_dp.experiments.records.candidate_of`), and
    dp-accounting's ``accountant`` composes all K (``ComposedDpEvent``,
    :func:`fedjax_dp.privacy.accounting.epsilon`) at the row's delta; where the ledger composes
    the unit's members in parallel (each agent's own records), each member's K events are
    composed and the worst member's epsilon is reported.

    This is the cost of the candidate *models*; choosing among them on validation data adds the
    scores' own release, which here is not private (docs/reproducibility.md, "Tuning"): the
    composed epsilon is what a private tuning would pay at least, by plain composition (Papernot
    and Steinke, ICLR 2022, pay less with a random number of candidates and private scores).
    None where a candidate's events are not dp-accounting's (e.g. the shuffle analysis)."""
    from dp_accounting import dp_event

    from fedjax_dp.privacy import accounting
    chosen = row.get("selected") or {}
    cands: dict[str, dict] = {}
    for r in sorted(runs, key=lambda r: r.get("seed", 0)):
        if records_lib.candidate_of(r, row):
            p = r.get("params") or {}
            cands.setdefault(json.dumps({k: p.get(k) for k in chosen}, sort_keys=True), r)
    # per member of the unit (one member unless the ledger composes members in parallel, e.g.
    # every agent's own records): its events in each candidate
    members: dict[int, list] = {}
    delta = None
    for r in cands.values():
        entry = next((g for g in r.get("privacy") or [] if g.get("accountant") == accountant
                      and g.get("unit") == row.get("epsilon_unit")), None)
        if entry is None or len(entry.get("parallel") or [None]) != 1:
            return None
        own = ({0: entry["events"]} if not entry.get("parallel") else
               {m: [d["event"]] for d in entry["parallel"][0]["distinct_members"]
                for m in d["members"]})
        if members and set(own) != set(members):
            return None
        for m, evs in own.items():
            members.setdefault(m, []).extend(evs)
        delta = entry["delta"]
    if not members:
        return None
    eps = 0.0
    for evs in {json.dumps(v, sort_keys=True): v for v in members.values()}.values():
        try:
            composed = dp_event.ComposedDpEvent([accounting.event_from_json(e) for e in evs])
        except ValueError:
            return None
        eps = max(eps, accounting.epsilon(composed, delta, accountant))
    return {"candidates": len(cands), "accountant": accountant, "delta": delta,
            "epsilon_one": row.get("epsilon_mean"), "epsilon_all": float(eps),
            "members": len(members)}


def _test_line(row: str, comparison: str, d: dict) -> str:
    lo, hi = d["interval"]
    p = "-" if math.isnan(d["p_value"]) else f"{d['p_value']:.3g}"
    star = " *" if d["excludes_zero"] and d["p_value"] < 0.05 else ""
    return (f"| {row} | {comparison} | {d['difference']:+.3f}{star} | [{lo:+.3f}, {hi:+.3f}] "
            f"| {p} |")


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
    if labels is not None and (len(set(labels)) != len(labels) or not all(map(str.strip, labels))):
        raise ValueError(f"labels: the arms' names must be distinct and non-empty, got "
                         f"{list(labels)}")
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
            tests[f"{x} vs {y}"] = difference(mx, my)
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
        lines += ["", "Welch's t-test on the unit means (two-sided) and the 95% percentile "
                  "bootstrap interval of the difference (unit means resampled):", "",
                  "| comparison | difference | 95% interval | t | p |",
                  "|---|---:|---:|---:|---:|"]
        for name, t in s["tests"].items():
            lo, hi = t["interval"]
            lines.append(f"| {name} | {t['difference']:+.3f} | [{lo:+.3f}, {hi:+.3f}] | "
                         f"{t['t']:.2f} | {t['p_value']:.3g} |")
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
    from fedjax_dp.core import files                 # atomic: a reader sees a whole file
    files.write_text(stem.with_suffix(".md"), markdown)
    files.write_text(stem.with_suffix(".json"), json.dumps(data, indent=1, allow_nan=True) + "\n")
    return [str(stem.with_suffix(".md")), str(stem.with_suffix(".json"))]
