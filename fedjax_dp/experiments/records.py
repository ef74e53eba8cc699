"""Run records: the one flat shape that sweeps write and plots read.

A *record* is one finished run as one JSON object (a line of a sweep's ``results.jsonl``, or a
``result.json`` read through :func:`from_result`)::

    algorithm, dataset, num_agents, seed        what ran
    params            {dotted config key: value}: the sweep's grid point (plus a calibrated key)
    target_epsilon    the epsilon a noise parameter was calibrated to, or None
    calibrated        {"key": dotted key, "value": v} or None
    test_accuracy     float
    val_accuracy      float on the held-out training records (data.validation_fraction), or None
    epsilon           the headline guarantee (:func:`headline`), or None without one
    epsilon_unit, epsilon_accountant, delta
    privacy           every guarantee, as in result.json
    history           one dict per round / phase
    wall_time_s, config (resolved), run_id, sweep

Field look-up for plots and tables (:func:`field`) accepts a top-level name, a grid key
(``algorithm.sigma`` is found in ``params`` first, then in ``config``), or any dotted path.

Files are read as data (:mod:`fedjax_dp.core.files`): a regular file of bounded size (a symlink
found in a folder must stay inside it), JSON of bounded depth, every record a JSON object whose
``params`` / ``config`` are objects and ``privacy`` / ``history`` lists; anything else is a
one-line ValueError naming the file (and line)."""
from __future__ import annotations

import gzip
import io
import os
from pathlib import Path
from typing import Any, Iterable, Sequence

__all__ = ["headline", "from_result", "field", "read", "read_jsonl", "read_selected"]

#: a results file (results.jsonl, its .gz once decompressed, result.json) is at most this long
MAX_RESULTS_BYTES = 4 << 30
#: selected.json is at most this long
MAX_SELECTED_BYTES = 256 << 20
#: the types a record's fields must have where present
_FIELD_TYPES = {"params": dict, "config": dict, "privacy": list, "history": list,
                "calibrated": (dict, type(None)), "extras": dict}


def headline(privacy: list[dict], accountants: Iterable[str] = ("rdp", "pld"),
             unit: str | None = None) -> tuple[float | None, str | None, str | None]:
    """``(epsilon, unit, accountant)`` of a run's headline guarantee.

    The first unit in the ledger's order that is not data-dependent (the algorithm's primary
    unit: an algorithm lists it first), read with the first of ``accountants`` that applies to it.
    ``(None, None, None)`` when the run gives no data-independent guarantee (e.g. FedAvg). An
    infinite epsilon is written ``None`` in JSON and stays ``None`` here.
    """
    rows = [g for g in privacy if not g.get("data_dependent")]
    if unit is not None:                     # a named unit (e.g. kNN-DPFL's "instance")
        rows = [g for g in rows if g["unit"] == unit]
    if not rows:
        return None, None, None
    unit = rows[0]["unit"]
    of_unit = [g for g in rows if g["unit"] == unit]
    order = list(accountants)
    of_unit.sort(key=lambda g: order.index(g["accountant"]) if g["accountant"] in order
                 else len(order))
    g = of_unit[0]
    eps = g["epsilon"]
    return (None if eps is None else float(eps)), unit, g["accountant"]


#: ``result.json`` fields a record carries as they are, or leaves out (the rest, e.g. an
#: algorithm's ``artifacts`` such as DP-FNAS's genotype, go to the record's ``extras``).
_RESULT_FIELDS = {"algorithm", "dataset", "num_agents", "seed", "test_accuracy", "val_accuracy",
                  "privacy", "history", "wall_time_s", "config", "versions", "devices"}


def from_result(result: dict, unit: str | None = None, **extra) -> dict:
    """The record of a ``result.json`` (``extra`` sets ``params``, ``target_epsilon``, ...);
    ``unit`` picks the headline unit (default: the algorithm's first). Fields of the result beyond
    the common ones (an algorithm's artifacts, timings, other metrics) are kept under ``extras``."""
    config = result.get("config", {})
    accountants = config.get("privacy", {}).get("accountants", ("rdp", "pld"))
    eps, unit, acc = headline(result.get("privacy", []), accountants, unit)
    delta = config.get("privacy", {}).get("delta")
    rec = {"algorithm": result.get("algorithm"), "dataset": result.get("dataset"),
           "num_agents": result.get("num_agents"), "seed": result.get("seed"),
           "params": {}, "target_epsilon": None, "calibrated": None,
           "test_accuracy": result.get("test_accuracy"),
           "val_accuracy": result.get("val_accuracy"), "epsilon": eps,
           "epsilon_unit": unit, "epsilon_accountant": acc, "delta": delta,
           "privacy": result.get("privacy", []), "history": result.get("history", []),
           "wall_time_s": result.get("wall_time_s"), "config": config,
           "extras": {k: v for k, v in result.items() if k not in _RESULT_FIELDS}}
    rec.update(extra)
    return rec


def field(record: dict, name: str) -> Any:
    """``record[name]``; else ``params[name]``; else the dotted path ``name`` in the record, then
    in its ``config``; else, for ``a+b`` (e.g. ``algorithm+target_epsilon``, a line per method
    and epsilon), the fields' values joined as ``"va, vb"``. ``KeyError`` names the field when
    none has it."""
    if name in record:
        return record[name]
    if name in record.get("params", {}):
        return record["params"][name]
    if "+" in name:
        return ", ".join(str(field(record, part)) for part in name.split("+"))
    for root in (record, record.get("config", {})):
        node: Any = root
        for part in name.split("."):
            if isinstance(node, dict) and part in node:
                node = node[part]
            else:
                break
        else:
            return node
    raise KeyError(f"field {name!r} is in neither the record, its params nor its config")


def check_record(rec: Any, where: str) -> dict:
    """``rec`` if it has a record's shape (a JSON object; ``params`` / ``config`` objects,
    ``privacy`` / ``history`` lists where present), else a one-line ValueError at ``where``."""
    from fedjax_dp.core import files     # here: importing this module stays jax-free
    if not isinstance(rec, dict):
        raise files.UntrustedFileError(f"{where} is a JSON {type(rec).__name__}, not a record "
                                       f"(a JSON object)")
    for key, kind in _FIELD_TYPES.items():
        if key in rec and not isinstance(rec[key], kind):
            raise files.UntrustedFileError(f"{where}: the record's {key!r} is a JSON "
                                           f"{type(rec[key]).__name__}, not a record's")
    return rec


def _gunzip(data: bytes, path: Path) -> bytes:
    """``data`` decompressed, at most :data:`MAX_RESULTS_BYTES` (a bomb is refused)."""
    from fedjax_dp.core import files
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as f:
            out = f.read(MAX_RESULTS_BYTES + 1)
    except (OSError, EOFError) as e:
        raise files.UntrustedFileError(f"results file {str(path)!r} is not gzip data "
                                       f"({e})") from None
    if len(out) > MAX_RESULTS_BYTES:
        raise files.UntrustedFileError(f"results file {str(path)!r} decompresses to more than "
                                       f"{MAX_RESULTS_BYTES:,} bytes; refusing to read it")
    return out


def read_jsonl(path: str | Path, *, root: str | Path | None = None,
               drop_partial: bool = False) -> list[dict]:
    """The records of a ``.jsonl`` (or ``.jsonl.gz``) file, one JSON object a line, read as
    data (bounded; a symlink only inside ``root``, default the file's folder). A last line
    without its newline is what a killed append leaves: ``drop_partial`` cuts it off the file
    (a sweep's resume: its run runs again); otherwise it is read like any line (a cut record
    is refused, naming the line)."""
    from fedjax_dp.core import files
    path = Path(path)
    data = files.read_bytes(path, max_bytes=MAX_RESULTS_BYTES,
                            root=path.parent if root is None else root, what="results file")
    if path.suffix == ".gz":
        data = _gunzip(data, path)
    elif drop_partial and data and not data.endswith(b"\n"):
        keep = data.rfind(b"\n") + 1
        try:
            os.truncate(path, keep)
        except OSError as e:
            raise files.WriteError(e.errno, f"cannot cut the partial last line of "
                                            f"{str(path)!r}: {e.strerror or e}") from None
        data = data[:keep]
    out = []
    for i, line in enumerate(data.split(b"\n")):
        if line.strip():
            where = f"results file {str(path)!r} line {i + 1}"
            out.append(check_record(files.parse_json(line, what=where), where))
    return out


def read(paths: Iterable[str | Path]) -> list[dict]:
    """Records from ``results.jsonl`` files (a sweep's; or ``results.jsonl.gz``, as large
    committed sweeps are stored), ``result.json`` files (one run's) or folders holding either.
    A file named is read where it points; one found in a named folder must be inside it."""
    from fedjax_dp.core import files
    out: list[dict] = []
    for p in map(Path, paths):
        root: Any = "/"                       # a file named: a symlink is the user's own
        if p.is_dir():
            found = [p / n for n in ("results.jsonl", "results.jsonl.gz", "result.json")
                     if os.path.lexists(p / n)]
            if not found:
                raise ValueError(f"{str(p)!r} holds neither results.jsonl(.gz) nor result.json")
            p, root = found[0], p
        if not p.is_file():
            raise ValueError(f"results file {str(p)!r} does not exist")
        if p.name.endswith(".jsonl.gz") or p.suffix == ".jsonl":
            out += read_jsonl(p, root=root)
        else:
            result = files.read_json(p, max_bytes=MAX_RESULTS_BYTES, root=root,
                                     what="results file", expect=dict)
            where = f"results file {str(p)!r}"
            if not isinstance(result.get("config", {}), dict) or not isinstance(
                    result.get("privacy", []), list):
                raise files.UntrustedFileError(f"{where} is not a run's result.json (its "
                                               f"config must be an object, privacy a list)")
            out.append(check_record(from_result(result), where))
    return out


def read_selected(paths: Iterable[str | Path]) -> list[dict]:
    """The rows of every ``selected.json`` (``fedjax-dp sweep --select``) in the sweep folders
    ``paths`` (or beside their ``results.jsonl``); a ValueError if none holds one."""
    from fedjax_dp.core import files
    rows: list[dict] = []
    for p in map(Path, paths):
        folder = p if p.is_dir() else p.parent
        f = folder / "selected.json"
        if os.path.lexists(f):
            got = files.read_json(f, max_bytes=MAX_SELECTED_BYTES, root=folder,
                                  what="selected.json", expect=list)
            for i, row in enumerate(got):
                if not (isinstance(row, dict) and isinstance(row.get("selected"), dict)
                        and all(k in row for k in ("base", "algorithm", "target_epsilon"))):
                    raise files.UntrustedFileError(
                        f"selected.json {str(f)!r} row {i + 1} is not a selection (an object "
                        f"with base, algorithm, target_epsilon and selected)")
            rows += got
    if not rows:
        raise ValueError(f"selected: no selected.json in {[str(p) for p in paths]} (run the "
                         f"sweep with --select val_accuracy)")
    return rows


def candidate_of(record: dict, row: dict) -> bool:
    """Whether ``record`` ran one of the candidates a ``selected.json`` ``row`` chose among: the
    same base, algorithm and target epsilon, and the row's values of every grid key but the
    chosen ones (``row["selected"]``)."""
    p = record.get("params") or {}
    chosen = row.get("selected") or {}
    return ((record.get("base"), record.get("algorithm"), record.get("target_epsilon"))
            == (row["base"], row["algorithm"], row["target_epsilon"])
            and all(row.get(k) == v for k, v in p.items() if k not in chosen))


def selected_records(records: Iterable[dict], rows: Sequence[dict]) -> list[dict]:
    """The runs of each selected cell (:func:`fedjax_dp.experiments.sweep.select`'s ``rows``),
    with ``setting``: the algorithm (and dataset, when the runs hold several) and the other grid
    keys' values, so that each selected row is one line of :func:`plot_xy` with ``hue =
    "setting"``; its points are the rows' test accuracy mean +- std."""
    records = list(records)
    datasets = {r.get("dataset") for r in records}
    out = []
    for row in rows:
        chosen = row["selected"]
        for r in records:
            p = r.get("params") or {}
            if candidate_of(r, row) and all(p.get(k) == v for k, v in chosen.items()):
                rest = [f"{k.split('.')[-1]}={v}" for k, v in p.items() if k not in chosen]
                where = f" ({r.get('dataset')})" if len(datasets) > 1 else ""
                out.append({**r, "setting": " ".join([f"{r['algorithm']}{where}"] + rest)})
    return out
