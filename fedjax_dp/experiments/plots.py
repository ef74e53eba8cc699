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
import re
import numbers
import warnings
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from fedjax_dp.experiments import records as records_lib

__all__ = ["summarize", "summarize_curves", "plot_xy", "plot_curves", "plot_run",
           "history_metrics", "default_curve_metric", "display_name", "hue_text", "axis_label",
           "epsilon_qualifier", "LOG_X_FIELDS", "ALGORITHM_NAMES", "FIELD_NAMES"]

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


# --------------------------------------------------------------------------- display names

#: Display names of the registered algorithms (``fedjax-dp list``), as the papers write them.
ALGORITHM_NAMES = {
    "fedavg": "FedAvg", "dp_fedavg": "DP-FedAvg", "dp_fedsgd": "DP-FedSGD",
    "fedkt": "FedKT", "fedkt_solo": "SOLO", "dp_fnas": "DP-FNAS",
    "isrl_mb_sgd": "ISRL-DP MB-SGD", "isrl_prox_svrg": "ISRL-DP Prox-SVRG",
    "isrl_prox_pl_svrg": "ISRL-DP Prox-PL-SVRG", "isrl_spider": "ISRL-DP FedProx-SPIDER",
    "isrl_local_sgd": "ISRL-DP Local SGD", "mb_sgd": "MB-SGD", "local_sgd": "Local SGD",
    "sdp_mb_sgd": "SDP MB-SGD", "sdp_spider": "SDP FedProx-SPIDER",
    "ae_dpfl": "AE-DPFL", "knn_dpfl": "kNN-DPFL",
}

#: Display names of record fields, metrics and grid keys, for axis labels.
FIELD_NAMES = {
    "test_accuracy": "Test accuracy", "val_accuracy": "Validation accuracy",
    "train_accuracy": "Training accuracy", "accuracy": "Accuracy", "loss": "Training loss",
    "train_loss": "Training loss", "test_loss": "Test loss", "val_loss": "Validation loss",
    "epsilon": "ε", "target_epsilon": "Target ε", "delta": "δ", "round": "Round",
    "seed": "Seed", "num_agents": "Agents", "data.num_agents": "Agents",
    "wall_time_s": "Wall time (s)", "algorithm": "Algorithm", "setting": "Setting",
    "dataset": "Dataset", "algorithm.noise_multiplier": "Noise multiplier",
    "algorithm.clip_norm": "Clipping norm", "algorithm.rounds": "Rounds",
    "algorithm.sampling_rate": "Sampling rate", "train.learning_rate": "Learning rate",
    "train.steps": "Local steps", "algorithm.level": "Privacy level",
}

#: Short names for ``name = value`` in a legend entry (else the field's name, lower-cased).
LEGEND_NAMES = {"num_agents": "N", "data.num_agents": "N", "epsilon": "ε",
                "target_epsilon": "ε", "algorithm.noise_multiplier": "σ", "delta": "δ"}

#: The units of privacy as an epsilon axis names them.
UNIT_NAMES = {"silo_record": "silo record"}


def display_name(key: str, labels: dict[str, str] | None = None) -> str:
    """The display name of a field, metric or algorithm key: ``labels[key]`` (an override, e.g.
    ``fedjax-dp plot --label test_accuracy=Accuracy``), else :data:`ALGORITHM_NAMES` /
    :data:`FIELD_NAMES`, else a snake_case key in words (``mean_update_norm`` -> ``Mean update
    norm``), else ``key`` itself."""
    labels = labels or {}
    if key in labels:
        return labels[key]
    if key in ALGORITHM_NAMES or key in FIELD_NAMES:
        return ALGORITHM_NAMES.get(key, FIELD_NAMES.get(key))
    if re.fullmatch(r"[a-z][a-z0-9]*(_[a-z0-9]+)+", key):    # mean_update_norm: Mean update norm
        return key[0].upper() + key[1:].replace("_", " ")
    return key


def _fmt(v: Any) -> str:
    """A value as a legend writes it: 8.0 -> ``8``, 0.25 -> ``0.25``; text as it is."""
    if isinstance(v, str):
        try:
            f = float(v)
        except ValueError:
            return v
        return f"{f:g}" if math.isfinite(f) else v
    if _is_number(v):
        return f"{float(v):g}"
    return _label(v)


def _legend_name(key: str, labels: dict[str, str]) -> str:
    if key in labels:
        return labels[key]
    if key in LEGEND_NAMES:
        return LEGEND_NAMES[key]
    name = display_name(key)
    return name[0].lower() + name[1:] if len(name) > 1 and name[1].islower() else name


def _part_text(key: str, value: Any, labels: dict[str, str]) -> str:
    """One field's value in a legend entry: an algorithm by its display name, a number as
    ``name = value`` (``N = 100``), other text as it is (or its override)."""
    text = _label(value)
    if text in labels:
        return labels[text]
    if text[:1] == "{":                  # a table (a grid over optimizers): its name first
        try:
            table = json.loads(text)
        except ValueError:
            table = None
        if isinstance(table, dict):
            name = table.pop("name", None)
            rest = ", ".join(f"{k.replace('_', ' ')} {_fmt(v)}" for k, v in table.items())
            return f"{name} ({rest})" if name and rest else str(name or rest)
    if key == "algorithm" or text in ALGORITHM_NAMES:
        return ALGORITHM_NAMES.get(text, text)
    if _is_number(value) or _fmt(value) != text or key in ("seed",):
        return f"{_legend_name(key, labels)} = {_fmt(value)}"
    return text


def _setting_text(value: str, labels: dict[str, str]) -> str:
    """``records.selected_records``' setting ``"ae_dpfl (mnist5k) num_agents=100"`` as
    ``"AE-DPFL (mnist5k), N = 100"``."""
    head, *rest = re.split(r" (?=[A-Za-z0-9_.]+=)", value)
    algo, _, where = head.partition(" ")
    parts = [_part_text("algorithm", algo, labels) + (f" {where}" if where else "")]
    for item in rest:
        k, _, v = item.partition("=")
        parts.append(f"{_legend_name(k, labels)} = {_fmt(v)}")
    return ", ".join(parts)


def hue_text(hue: str | None, value: Any, labels: dict[str, str] | None = None) -> str:
    """A line's legend entry for ``value`` of the ``hue`` field: ``labels[value]`` when given
    (the value as text, e.g. ``dp_fedavg`` or a whole setting), else the algorithm's display
    name, ``name = value`` for a number (``σ = 1.5``), a ``+``-joined hue part by part
    (``DP-FedAvg, ε = 8``)."""
    labels = labels or {}
    text = _label(value)
    if text in labels:
        return labels[text]
    if hue == "setting" and isinstance(value, str):
        return _setting_text(value, labels)
    if hue and "+" in hue and isinstance(value, str):
        keys, vals = hue.split("+"), value.split(", ")
        if len(keys) == len(vals):
            return ", ".join(_part_text(k, v, labels) for k, v in zip(keys, vals))
    return _part_text(hue or "", value, labels)


# --------------------------------------------------------------------------- drawing

#: Okabe & Ito's colour-blind-safe palette (yellow last: faint on white), and a marker each.
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000",
           "#F0E442")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")

#: One column of a two-column paper: 3.3 x 2.4 inches, 8 pt text, lines that survive printing.
FIGSIZE = (3.3, 2.4)
STYLE = {
    "font.size": 8, "axes.titlesize": 9, "axes.labelsize": 8, "xtick.labelsize": 8,
    "ytick.labelsize": 8, "legend.fontsize": 8, "legend.title_fontsize": 8,
    "lines.linewidth": 1.6, "lines.markersize": 4.5, "errorbar.capsize": 2.5,
    "axes.linewidth": 0.8, "xtick.major.width": 0.8, "ytick.major.width": 0.8,
    "xtick.minor.width": 0.6, "grid.linewidth": 0.5, "legend.handlelength": 1.8,
    "legend.borderaxespad": 0.3, "legend.labelspacing": 0.3, "legend.framealpha": 0.85,
    "pdf.fonttype": 42, "ps.fonttype": 42,           # TrueType in the PDF, not Type 3
    "savefig.dpi": 300, "svg.hashsalt": "fedjax-dp",  # the SVG's ids fixed: the same file
}


def _style():
    try:
        import matplotlib
    except ImportError:
        raise ValueError("plotting needs matplotlib: pip install 'fedjax-dp[plot]'") from None
    return matplotlib.rc_context(STYLE)


def _figure():
    from matplotlib.figure import Figure
    fig = Figure(figsize=FIGSIZE, layout="constrained")
    return fig, fig.add_subplot()


def _save(fig, out_stem: str | Path) -> list[str]:
    """``STEM.png`` (300 dpi), ``STEM.svg`` and ``STEM.pdf``, without time stamps (the same
    figure gives the same files)."""
    stem = Path(out_stem)
    if stem.suffix in (".png", ".svg", ".pdf"):
        stem = stem.with_suffix("")
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [Path(f"{stem}.{ext}") for ext in ("png", "svg", "pdf")]
    fig.savefig(paths[0])
    fig.savefig(paths[1], metadata={"Date": None})
    fig.savefig(paths[2], metadata={"CreationDate": None})
    return [str(p) for p in paths]


def _unique(records: Sequence[dict], key: str) -> Any:
    vals = {json.dumps(r.get(key), sort_keys=True) for r in records}
    return records[0].get(key) if len(vals) == 1 else None


def _headline_delta(record: dict) -> float | None:
    """The delta of the record's headline guarantee (its ``privacy`` entry of the headline unit
    and accountant), else the config's ``delta``."""
    for g in record.get("privacy") or []:
        if (isinstance(g, dict) and g.get("unit") == record.get("epsilon_unit")
                and g.get("accountant") == record.get("epsilon_accountant")
                and _is_number(g.get("delta"))):
            return float(g["delta"])
    d = record.get("delta")
    return float(d) if _is_number(d) else None


def epsilon_qualifier(records: Sequence[dict]) -> str:
    """``"agent, δ = 1e-05"``: the headline guarantee's unit and delta shared by the records
    that have an epsilon (a range ``δ = 2.1e-05–6.9e-05`` when they differ); ``""`` if none."""
    private = [r for r in records if r.get("epsilon") is not None] or list(records)
    units = sorted({str(r["epsilon_unit"]) for r in private if r.get("epsilon_unit")})
    deltas = sorted({d for d in map(_headline_delta, private) if d is not None})
    parts = []
    if units:
        parts.append("/".join(UNIT_NAMES.get(u, u.replace("_", " ")) for u in units))
    if deltas:
        parts.append(f"δ = {deltas[0]:g}" if len(deltas) == 1 else
                     f"δ = {deltas[0]:g}–{deltas[-1]:g}")
    return ", ".join(parts)


def axis_label(records: Sequence[dict], key: str, labels: dict[str, str] | None = None) -> str:
    """An axis label: the field's display name; for epsilon and target epsilon the unit and
    delta too, from the records (``ε (agent, δ = 1e-05)``)."""
    name = display_name(key, labels)
    if key in ("epsilon", "target_epsilon"):
        what = epsilon_qualifier(records)
        return f"{name} ({what})" if what else name
    return name




def _statistic(records: Sequence[dict], rows: Sequence[dict], x: str,
               hue: str | None) -> str:
    """``"mean ± std over 5 seeds"`` (or ``3–5 seeds``; ``runs`` where a point pools records
    of one seed); ``""`` when every point is a single run."""
    n = sorted({r["n"] for r in rows})
    if n[-1] <= 1:
        return ""
    seeds: dict[tuple, set] = {}
    xs = _values(records, x, "x") if x != "round" else [None] * len(records)
    hs = _values(records, hue, "hue") if hue is not None else [None] * len(records)
    for r, xv, hv in zip(records, xs, hs):
        seeds.setdefault((_hashable(hv), _hashable(xv)), []).append(r.get("seed"))
    distinct = all(len(set(map(str, s))) == len(s) for s in seeds.values())
    what = "seeds" if distinct and any(r.get("seed") is not None for r in records) else "runs"
    count = f"{n[0]}" if len(n) == 1 else f"{n[0]}–{n[-1]}"
    return f"mean ± std over {count} {what}"


def _legend(fig, ax, title: str) -> None:
    """The legend above the axes, outside the data (a one-column figure has no room for a
    legend inside that hides no point), two entries a row, the statistic as its title."""
    import textwrap
    handles, texts = ax.get_legend_handles_labels()
    if handles:
        texts = [textwrap.fill(t, 44) for t in texts]     # a long entry on two lines, not cut
        ncols = 1 if len(handles) == 1 or max(map(len, texts)) > 22 else 2
        fig.legend(handles, texts, title=title or None, loc="outside upper center",
                   ncols=ncols, frameon=False, columnspacing=1.2)


def _log_ticks(ax, xs: Sequence[float]) -> None:
    """Few labelled ticks on a log x axis, written plainly (0.5, 1, 2, not 2x10^0): the x
    values themselves when they are a few round numbers (1, 2, 4, 8), else 1-2-5 steps (or
    finer on a short range); minor ticks unlabelled."""
    from matplotlib import ticker
    lo, hi = ax.get_xlim()
    span = math.log10(hi / lo)
    distinct = sorted(set(xs))
    round_ = all(float(f"{v:.2g}") == v for v in distinct)
    gaps = [math.log10(b / a) for a, b in zip(distinct, distinct[1:])]
    if 2 <= len(distinct) <= 6 and round_ and min(gaps) >= 0.06 * span:
        ticks = distinct
    else:
        ticks = []
        for subs in ((1,), (1, 2, 5), (1, 2, 3, 5), (1, 1.5, 2, 3, 4, 5, 6, 8)):
            ticks = [s * 10.0 ** k for k in range(math.floor(math.log10(lo)) - 1,
                                                 math.ceil(math.log10(hi)) + 1)
                     for s in subs if lo <= s * 10.0 ** k <= hi]
            if len(ticks) >= 3:
                break
    ax.xaxis.set_major_locator(ticker.FixedLocator(ticks))
    ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_locator(ticker.LogLocator(subs="auto"))
    ax.xaxis.set_minor_formatter(ticker.NullFormatter())
    ax.set_xlim(lo, hi)


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


def _check_labels(labels: dict[str, str] | None) -> dict[str, str]:
    if labels is None:
        return {}
    if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                               for k, v in labels.items()):
        raise ValueError(f"labels must map keys to display texts (str -> str), got {labels!r}")
    return dict(labels)


def plot_xy(records: Iterable[dict], x: str, y: str, hue: str | None, out_stem: str | Path,
            title: str | None = None, logx: bool | None = None,
            reference: tuple[str, str] | None = None,
            labels: dict[str, str] | None = None) -> list[str]:
    """Mean +- std of ``y`` against ``x``, one line with error bars per ``hue`` value
    (:func:`summarize`); writes ``out_stem.png``, ``.svg`` and ``.pdf`` and returns their paths.

    Drawn for one column of a two-column paper (:data:`FIGSIZE`, :data:`STYLE`, the colour-blind
    safe :data:`PALETTE` with a marker per line). Axes and legend entries are display names
    (:func:`axis_label`, :func:`hue_text`: ``DP-FedAvg``, ``Test accuracy``, ``ε (agent, δ =
    1e-05)``); ``labels`` overrides any of them by key (a field, an algorithm, a hue value). The
    statistic (``mean ± std over 5 seeds``) titles the legend, or the y axis without one.

    ``logx=None`` draws epsilon (:data:`LOG_X_FIELDS`) on a log scale and anything else linearly.
    Non-numeric x values (e.g. ``x="algorithm"``) are drawn as categories. ``reference = (key,
    value)``: the records with ``key = value`` (e.g. a baseline arm that has no x) are drawn as
    a horizontal band, their mean +- std of ``y``, instead of a line."""
    records = _check_records(records)
    labels = _check_labels(labels)
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
    hues = sorted({r["hue"] for r in rows}, key=_sort_key)
    plotted = [r for r, v in zip(records, _values(records, x, "x")) if v is not None]
    stat = _statistic(plotted, rows, x, hue)
    with _style():
        fig, ax = _figure()
        for i, hv in enumerate(hues):
            sel = [r for r in rows if r["hue"] == hv]
            # categories: no line between them, and the hues side by side rather than on top
            xs = [r["x"] if numeric else
                  categories.index(r["x"]) + 0.08 * (i - (len(hues) - 1) / 2) for r in sel]
            ax.errorbar(xs, [r["mean"] for r in sel], yerr=[r["std"] for r in sel],
                        color=PALETTE[i % len(PALETTE)], marker=MARKERS[i % len(MARKERS)],
                        linestyle="-" if numeric else "none",
                        label=hue_text(hue, hv, labels) if hue is not None else None)
        if ref is not None:
            mean, std = ref
            key, value = reference
            name = labels.get(f"{key}={value}", hue_text(key, value, labels))
            ax.axhline(mean, color="0.3", linestyle="--", linewidth=1.2, label=name)
            ax.axhspan(mean - std, mean + std, color="0.5", alpha=0.15, linewidth=0)
        if logx:
            ax.set_xscale("log")
            ax.margins(x=0.06)
            ax.autoscale_view()
            _log_ticks(ax, [r["x"] for r in rows])
        if categories:
            names = [hue_text(x, c, labels) for c in categories]
            ax.set_xticks(range(len(categories)), names,
                          rotation=30 if sum(map(len, names)) > 36 else 0,
                          ha="right" if sum(map(len, names)) > 36 else "center")
            ax.set_xlim(-0.5, len(categories) - 0.5)
        legend = hue is not None and hues or ref is not None
        ax.set_xlabel(axis_label(plotted, x, labels))
        return _finish(fig, ax, axis_label(plotted, y, labels), stat, legend, title, out_stem)


def _finish(fig, ax, ylabel: str, stat: str | None, legend, title: str | None,
            out_stem: str | Path) -> list[str]:
    """The y label (with the statistic when no legend names it), title, grid and legend of a
    figure, then its files (:func:`_save`)."""
    ax.set_ylabel(f"{ylabel}\n({stat})" if stat and not legend else ylabel)
    if title:
        ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if legend:
        _legend(fig, ax, stat)
    return _save(fig, out_stem)


def plot_curves(records: Iterable[dict], y: str = "test_accuracy", hue: str | None = None,
                out_stem: str | Path = "training_curve", title: str | None = None,
                labels: dict[str, str] | None = None) -> list[str]:
    """Training curves: the history metric ``y`` against the round, one line (the mean) and a
    band (mean +- std) per ``hue`` value over the group's records (:func:`summarize_curves`);
    writes ``out_stem.png``, ``.svg`` and ``.pdf`` and returns their paths. Style, display
    names and ``labels`` as in :func:`plot_xy`."""
    records = _check_records(records)
    labels = _check_labels(labels)
    rows = summarize_curves(records, y, hue)
    hues = sorted({r["hue"] for r in rows}, key=_sort_key)
    stat = _statistic(records, rows, "round", hue)
    with _style():
        fig, ax = _figure()
        for i, hv in enumerate(hues):
            sel = [r for r in rows if r["hue"] == hv]
            t = np.asarray([r["round"] for r in sel], dtype=float)
            m = np.asarray([r["mean"] for r in sel])
            s = np.asarray([r["std"] for r in sel])
            color = PALETTE[i % len(PALETTE)]
            ax.plot(t, m, color=color, marker=MARKERS[i % len(MARKERS)], markersize=3.5,
                    markevery=max(1, len(t) // 8),          # a marker per line, not per round
                    label=hue_text(hue, hv, labels) if hue is not None else None)
            if np.any(s > 0):
                ax.fill_between(t, m - s, m + s, color=color, alpha=0.2, linewidth=0)
        from matplotlib import ticker
        ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
        ax.set_xlabel(display_name("round", labels))
        legend = hue is not None and hues
        return _finish(fig, ax, display_name(y, labels), stat, legend, title, out_stem)


def plot_run(result: dict, out_dir: str | Path, y: str | None = None) -> list[str]:
    """A finished run's training curve, ``out_dir/training_curve.{png,svg,pdf}``
    (``fedjax-dp run --plot``): ``y``, by default ``test_accuracy`` when ``run.eval_every``
    put it in the history, else its first numeric metric (e.g. ``loss``)."""
    rec = records_lib.from_result(result)
    metric = y if y is not None else default_curve_metric([rec])
    name = ALGORITHM_NAMES.get(rec.get("algorithm"), rec.get("algorithm") or "run")
    title = f"{name} on {rec['dataset']}" if rec.get("dataset") else name
    if rec.get("epsilon") is not None and math.isfinite(rec["epsilon"]):
        title += f"\nε = {rec['epsilon']:.3g} ({epsilon_qualifier([rec])}, " \
                 f"{rec['epsilon_accountant']})"
    return plot_curves([rec], y=metric, hue=None, out_stem=Path(out_dir) / "training_curve",
                       title=title)
