"""Plots of run records: a metric against a parameter, and training curves.

Records are the flat run records of :mod:`fedjax_dp.experiments.records` (a sweep's
``results.jsonl``, or one run's ``result.json`` through :func:`records.from_result`). Fields are
looked up with :func:`records.field`: a top-level key (``epsilon``, ``test_accuracy``,
``algorithm``), a grid key in ``params`` (``algorithm.noise_multiplier``) or a dotted config path.

:func:`summarize` / :func:`plot_xy`: mean and standard deviation of y per (hue, x) group
(usually the seeds); :func:`summarize_curves` / :func:`plot_curves`: the same for a per-round
history metric; :func:`plot_run`: a single run's training curve (``fedjax-dp run --plot``).

matplotlib is imported only when a figure is drawn; figures are made with
:class:`matplotlib.figure.Figure` (no display, pyplot's global state untouched)."""
from __future__ import annotations

import json
import math
import numbers
import warnings
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from fedjax_dp.experiments import records as records_lib

__all__ = ["summarize", "summarize_curves", "plot_xy", "plot_curves", "plot_run",
           "history_metrics", "default_curve_metric", "LOG_X_FIELDS"]

#: x fields drawn on a log scale unless ``logx=False``.
LOG_X_FIELDS = ("epsilon", "target_epsilon")

_MISSING = object()


# --------------------------------------------------------------------------- field look-up

def _available(records: Sequence[dict]) -> str:
    top = sorted({k for r in records for k in r})
    params = sorted({k for r in records for k in r.get("params") or {}})
    return (f"records have top-level keys {top}" + (f" and params {params}" if params else
                                                     " and no params")
            + "; a dotted config path (e.g. algorithm.rounds) also works")


def _values(records: Sequence[dict], name: str, param: str) -> list[Any]:
    """``field(r, name)`` of every record; ``None`` where a record lacks it. ``ValueError`` naming
    ``param`` when no record has it."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"{param} must be a field name, got {name!r}")
    out = []
    for r in records:
        try:
            out.append(records_lib.field(r, name))
        except KeyError:
            out.append(_MISSING)
    if all(v is _MISSING for v in out):
        raise ValueError(f"{param}: unknown field {name!r}; {_available(records)}")
    return [None if v is _MISSING else v for v in out]


def _is_number(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _hashable(v: Any) -> Any:
    """A group key: lists / dicts (e.g. ``model.hidden``) as their JSON text."""
    if isinstance(v, (list, dict, tuple)):
        return json.dumps(v, sort_keys=True)
    if _is_number(v) and not isinstance(v, int):
        return float(v)
    return v


def _sort_key(v: Any) -> tuple:
    """Numbers first (numerically), then text, then ``None``."""
    if _is_number(v):
        return (0, float(v), "")
    if v is None:
        return (2, 0.0, "")
    return (1, 0.0, str(v))


def _check_records(records: Iterable[dict]) -> list[dict]:
    records = list(records)
    if not records:
        raise ValueError("records: no records to plot (an empty results file?)")
    for i, r in enumerate(records):
        if not isinstance(r, dict):
            raise ValueError(f"records[{i}] is not a record (a dict), got {type(r).__name__}")
    return records


def _stats(values: Sequence[float]) -> tuple[float, float]:
    a = np.asarray(values, dtype=float)
    return float(np.mean(a)), float(np.std(a, ddof=1)) if a.size > 1 else 0.0


# --------------------------------------------------------------------------- summaries

def _group_rows(groups: dict[tuple, list[float]], key: str) -> list[dict]:
    """Rows ``{hue, <key>, mean, std, n}`` of ``{(hue, key value): values}``, sorted by both."""
    rows = []
    for (hv, kv) in sorted(groups, key=lambda k: (_sort_key(k[0]), _sort_key(k[1]))):
        mean, std = _stats(groups[(hv, kv)])
        rows.append({"hue": hv, key: kv, "mean": mean, "std": std, "n": len(groups[(hv, kv)])})
    return rows


def summarize(records: Iterable[dict], x: str, y: str, hue: str | None = None) -> list[dict]:
    """Rows ``{hue, x, mean, std, n}``: mean and standard deviation (``ddof=1`` when ``n > 1``,
    else 0) of ``y`` over the records sharing a (hue value, x value) — usually the seeds.

    Records whose x or y is ``None`` (no epsilon, a failed metric) are dropped with one warning that
    counts them. Rows are sorted by hue value, then x value (numbers numerically, then text, then
    ``None``). ``hue=None`` puts every record in one group (``hue`` is ``None`` in the rows). A list
    or dict value (``model.hidden``) is grouped by its JSON text."""
    records = _check_records(records)
    xs = _values(records, x, "x")
    ys = _values(records, y, "y")
    hs = _values(records, hue, "hue") if hue is not None else [None] * len(records)
    groups: dict[tuple, list[float]] = {}
    dropped = 0
    for r, xv, yv, hv in zip(records, xs, ys, hs):
        if xv is None or yv is None:
            dropped += 1
            continue
        if not _is_number(yv):
            raise ValueError(f"y: field {y!r} is not numeric (got {yv!r} of type "
                             f"{type(yv).__name__})")
        groups.setdefault((_hashable(hv), _hashable(xv)), []).append(float(yv))
    if dropped:
        warnings.warn(f"{dropped} of {len(records)} records have no {x!r} or no {y!r} "
                      f"and are left out", stacklevel=2)
    if not groups:
        raise ValueError(f"x, y: no record has both {x!r} and {y!r}")
    return _group_rows(groups, "x")


def history_metrics(records: Iterable[dict]) -> list[str]:
    """The numeric history metrics of the records (not ``round``), in first-seen order."""
    names: dict[str, None] = {}
    for r in records:
        for h in r.get("history") or []:
            for k, v in h.items():
                if k != "round" and _is_number(v):
                    names.setdefault(k, None)
    return list(names)


def default_curve_metric(records: Iterable[dict]) -> str:
    """``test_accuracy`` when the history has it (``run.eval_every``), else the first numeric
    history metric (e.g. ``loss``). ``ValueError`` when the history has no numeric metric."""
    names = history_metrics(records)
    if not names:
        raise ValueError("y: the records' history has no numeric metric to plot")
    return "test_accuracy" if "test_accuracy" in names else names[0]


def summarize_curves(records: Iterable[dict], y: str, hue: str | None = None) -> list[dict]:
    """Rows ``{hue, round, mean, std, n}``: ``y`` of the history, per round, mean and std
    (``ddof=1`` when ``n > 1``) over the group's records that have ``y`` at that round (curves
    of different lengths, or metrics logged every few rounds, just give smaller ``n``)."""
    records = _check_records(records)
    hs = _values(records, hue, "hue") if hue is not None else [None] * len(records)
    groups: dict[tuple, list[float]] = {}
    seen = False
    for r, hv in zip(records, hs):
        history = r.get("history") or []
        if not isinstance(history, list):
            raise ValueError(f"records: history must be a list of per-round dicts, "
                             f"got {type(history).__name__}")
        for i, h in enumerate(history):
            if y not in h or h[y] is None:
                continue
            v = h[y]
            if not _is_number(v):
                raise ValueError(f"y: history metric {y!r} is not numeric (got {v!r} of type "
                                 f"{type(v).__name__})")
            seen = True
            t = h.get("round", i + 1)
            groups.setdefault((_hashable(hv), t), []).append(float(v))
    if not seen:
        raise ValueError(f"y: no record's history has the metric {y!r}; the history has "
                         f"{history_metrics(records)}")
    return _group_rows(groups, "round")


# --------------------------------------------------------------------------- drawing

def _figure():
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ValueError("plotting needs matplotlib: pip install 'fedjax-dp[plot]'") from None
    fig = Figure(figsize=(6.4, 4.4), layout="constrained")
    return fig, fig.add_subplot()


def _save(fig, out_stem: str | Path) -> list[str]:
    stem = Path(out_stem)
    if stem.suffix in (".png", ".svg"):
        stem = stem.with_suffix("")
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [Path(f"{stem}.png"), Path(f"{stem}.svg")]
    fig.savefig(paths[0], dpi=150)
    fig.savefig(paths[1], metadata={"Date": None})     # no time stamp: reproducible files
    return [str(p) for p in paths]


def _unique(records: Sequence[dict], key: str) -> Any:
    vals = {json.dumps(r.get(key), sort_keys=True) for r in records}
    return records[0].get(key) if len(vals) == 1 else None


def _x_label(records: Sequence[dict], x: str) -> str:
    if x == "epsilon":               # the headline guarantee's unit and accountant, when shared
        unit, acc = _unique(records, "epsilon_unit"), _unique(records, "epsilon_accountant")
        what = ", ".join(str(v) for v in (unit, acc) if v)
        return f"epsilon ({what})" if what else x
    return x


def _title(records: Sequence[dict], title: str | None, default: str) -> str:
    if title is not None:
        return title
    dataset = _unique(records, "dataset")
    return f"{dataset}: {default}" if dataset else default


def _legend(ax, hue: str | None, n_lines: int) -> None:
    if hue is not None and n_lines:
        ax.legend(title=hue, fontsize="small")


def _label(v: Any) -> str:
    return "None" if v is None else str(v)


def split_reference(records: Sequence[dict], reference: tuple[str, str]
                    ) -> tuple[list[dict], list[dict]]:
    """``(others, matching)``: the records whose field ``reference[0]`` reads ``reference[1]``
    (compared as text; a table by its JSON) apart. ValueError naming ``reference`` when none or
    all match."""
    key, value = reference
    vals = _values(records, key, "reference")
    text = [None if v is None else (v if isinstance(v, str) else json.dumps(v, sort_keys=True))
            for v in vals]
    matching = [r for r, t in zip(records, text) if t == value]
    if not matching or len(matching) == len(records):
        raise ValueError(f"reference: {'no' if not matching else 'every'} record has "
                         f"{key} = {value!r}; the reference must pick some of them")
    return [r for r, t in zip(records, text) if t != value], matching


def plot_xy(records: Iterable[dict], x: str, y: str, hue: str | None, out_stem: str | Path,
            title: str | None = None, logx: bool | None = None,
            reference: tuple[str, str] | None = None) -> list[str]:
    """Mean +- std of ``y`` against ``x``, one line with error bars per ``hue`` value
    (:func:`summarize`); writes ``out_stem.png`` and ``out_stem.svg`` and returns their paths.

    ``logx=None`` draws epsilon (:data:`LOG_X_FIELDS`) on a log scale and anything else linearly.
    Non-numeric x values (e.g. ``x="algorithm"``) are drawn as categories. ``reference = (key,
    value)``: the records with ``key = value`` (e.g. a baseline arm that has no x) are drawn as
    a horizontal band, their mean +- std of ``y``, instead of a line."""
    records = _check_records(records)
    ref = None
    if reference is not None:
        records, matching = split_reference(records, reference)
        ref = _stats([float(v) for v in _values(matching, y, "y") if v is not None])
    rows = summarize(records, x, y, hue)
    numeric = all(_is_number(r["x"]) for r in rows)
    if logx is None:
        logx = x in LOG_X_FIELDS and numeric
    if logx:
        if not numeric:
            raise ValueError(f"logx: x field {x!r} has non-numeric values; a log scale needs "
                             f"positive numbers")
        if any(r["x"] <= 0 for r in rows):
            raise ValueError(f"logx: x field {x!r} has values <= 0; use logx=False "
                             f"(--no-logx)")
    categories = [] if numeric else sorted({r["x"] for r in rows}, key=_sort_key)
    fig, ax = _figure()
    hues = sorted({r["hue"] for r in rows}, key=_sort_key)
    for i, hv in enumerate(hues):
        sel = [r for r in rows if r["hue"] == hv]
        # categories: no line between them, and the hues side by side rather than on top
        xs = [r["x"] if numeric else
              categories.index(r["x"]) + 0.08 * (i - (len(hues) - 1) / 2) for r in sel]
        ax.errorbar(xs, [r["mean"] for r in sel], yerr=[r["std"] for r in sel], marker="o",
                    markersize=4, capsize=3, linewidth=1.5, linestyle="-" if numeric else "none",
                    label=_label(hv) if hue is not None else None)
    if ref is not None:
        mean, std = ref
        ax.axhline(mean, color="0.3", linestyle="--", linewidth=1.2,
                   label=f"{reference[0]} = {reference[1]}")
        ax.axhspan(mean - std, mean + std, color="0.5", alpha=0.15)
    if logx:
        from matplotlib import ticker
        ax.set_xscale("log")
        plain = ticker.FuncFormatter(lambda v, _: f"{v:g}")          # 0.5, 1, 2, not 2x10^0
        ax.xaxis.set_major_formatter(plain)
        lo, hi = min(r["x"] for r in rows), max(r["x"] for r in rows)
        # within about a decade the minor ticks (2, 3, 4, ...) are labelled too
        ax.xaxis.set_minor_formatter(plain if hi / lo < 30 else ticker.NullFormatter())
    if categories:
        ax.set_xticks(range(len(categories)), [_label(c) for c in categories])
        ax.set_xlim(-0.5, len(categories) - 0.5)
    n = sorted({r["n"] for r in rows})
    runs = f"{n[0]}" if len(n) == 1 else f"{n[0]}-{n[-1]}"
    ax.set_xlabel(_x_label(records, x))
    ax.set_ylabel(f"{y} (mean ± std over {runs} run{'s' if n[-1] > 1 else ''})")
    ax.set_title(_title(records, title, f"{y} vs {x}"))
    ax.grid(True, alpha=0.3)
    _legend(ax, hue, len(hues) + (ref is not None))
    return _save(fig, out_stem)


def plot_curves(records: Iterable[dict], y: str = "test_accuracy", hue: str | None = None,
                out_stem: str | Path = "training_curve", title: str | None = None
                ) -> list[str]:
    """Training curves: the history metric ``y`` against the round, one line (the mean) and a
    band (mean +- std) per ``hue`` value over the group's records (:func:`summarize_curves`);
    writes ``out_stem.png`` and ``out_stem.svg`` and returns their paths."""
    records = _check_records(records)
    rows = summarize_curves(records, y, hue)
    fig, ax = _figure()
    hues = sorted({r["hue"] for r in rows}, key=_sort_key)
    for hv in hues:
        sel = [r for r in rows if r["hue"] == hv]
        t = np.asarray([r["round"] for r in sel], dtype=float)
        m = np.asarray([r["mean"] for r in sel])
        s = np.asarray([r["std"] for r in sel])
        (line,) = ax.plot(t, m, marker="o" if len(t) < 30 else None, markersize=3,
                          linewidth=1.5, label=_label(hv) if hue is not None else None)
        if np.any(s > 0):
            ax.fill_between(t, m - s, m + s, color=line.get_color(), alpha=0.2, linewidth=0)
    multi = max(r["n"] for r in rows) > 1
    from matplotlib import ticker
    ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    ax.set_xlabel("round")
    ax.set_ylabel(f"{y} (mean ± std)" if multi else y)
    ax.set_title(_title(records, title, f"{y} by round"))
    ax.grid(True, alpha=0.3)
    _legend(ax, hue, len(hues))
    return _save(fig, out_stem)


def plot_run(result: dict, out_dir: str | Path, y: str | None = None) -> list[str]:
    """A finished run's training curve, ``out_dir/training_curve.{png,svg}``
    (``fedjax-dp run --plot``): ``y``, by default ``test_accuracy`` when ``run.eval_every``
    put it in the history, else its first numeric metric (e.g. ``loss``)."""
    rec = records_lib.from_result(result)
    metric = y if y is not None else default_curve_metric([rec])
    name = rec.get("algorithm") or "run"
    title = f"{name} on {rec['dataset']}" if rec.get("dataset") else name
    if rec.get("epsilon") is not None and math.isfinite(rec["epsilon"]):
        title += (f" (epsilon {rec['epsilon']:.3g}, {rec['epsilon_unit']} level, "
                  f"{rec['epsilon_accountant']})")
    return plot_curves([rec], y=metric, hue=None, out_stem=Path(out_dir) / "training_curve",
                       title=title)
