"""Sweeps: a grid of configs x target epsilons x seeds, one record per run in ``results.jsonl``.

The command, the sweep-file format (a TOML with a ``[sweep]`` table, ``configs/experiments/``)
and the output files: docs/sweeps.md. A grid key ``"k1+k2"`` ties its keys (:func:`assignments`),
so the grid is the product over the other keys only. Every run's config is validated
(:func:`runner.plan`) before any data is loaded; then, per (base, grid point, target) *cell*, the
key is calibrated (:mod:`fedjax_dp.experiments.calibrate`) and the cell's seeds run, as one
vmapped call where the algorithm allows it (:func:`fedjax_dp.algorithms.seeds.run_seeds`). Each
finished run is appended to ``OUT/results.jsonl`` at once, so ``--resume OUT`` runs only the
missing ones (a run is identified by the fingerprint of its resolved config).

The folder is data the sweep wrote, read back as data (:mod:`fedjax_dp.core.files`): every table
is written atomically, each record is one whole appended line (a kill leaves at most a last line
without its newline, dropped on ``--resume``: that run runs again), and one process holds the
folder at a time (:func:`hold`: a second sweep on a live folder is refused naming its pid)."""
from __future__ import annotations

import contextlib
import copy
import csv
import dataclasses
import io
import itertools
import json
import math
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Callable

from fedjax_dp.core import compilation, files, memory, stop
from fedjax_dp.core import validation
from fedjax_dp.experiments import calibrate as calibrate_lib
from fedjax_dp.experiments import config as config_lib
from fedjax_dp.experiments import records as records_lib
from fedjax_dp.experiments import tracking as tracking_lib

__all__ = ["Sweep", "Run", "load", "expand", "run", "run_folder", "summarize", "split_values",
           "grid_edges", "edge_points", "extend_edges", "summary_markdown", "tied_keys",
           "assignments", "hold"]

ConfigError = config_lib.ConfigError

#: The most runs one sweep may hold (configs x grid points x target epsilons x seeds; the
#: largest shipped sweep holds 1,008): refused above it before any run is expanded.
MAX_RUNS = 10_000


@dataclasses.dataclass
class Sweep:
    """What to run. ``bases``: (name, raw config table) pairs; ``grid``: dotted key -> values;
    ``calibrate``: algorithm name (or ``"*"``) -> dotted key."""

    bases: list[tuple[str, dict]]
    grid: dict[str, list] = dataclasses.field(default_factory=dict)
    seeds: list[int] = dataclasses.field(default_factory=lambda: [0])
    target_epsilon: list[float] = dataclasses.field(default_factory=list)
    calibrate: dict[str, str] = dataclasses.field(default_factory=dict)
    overrides: list[str] = dataclasses.field(default_factory=list)
    name: str = "sweep"
    select: str | None = None                  # e.g. "val_accuracy": choose grid points by it
    select_over: list[str] | None = None       # the grid keys chosen over (None: all)
    unit: str | None = None                    # the unit whose epsilon is calibrated / reported


@dataclasses.dataclass
class Run:
    """One run of a sweep: its cell (base, grid point, target) and seed, and its resolved config
    (before calibration)."""

    base: str
    params: dict
    target_epsilon: float | None
    seed: int
    config: dict
    calibrate_key: str | None

    @property
    def cell(self) -> str:
        return json.dumps([self.base, self.params, self.target_epsilon], sort_keys=True)


# ----------------------------------------------------------------------------- parsing

def split_values(text: str) -> list:
    """``"1,2.5,[100, 50],\\"a,b\\""`` -> ``[1, 2.5, [100, 50], "a,b"]``: commas at bracket depth
    0 outside quotes separate values; each is parsed as a TOML value (else a bare string)."""
    parts, depth, quote, cur = [], 0, None, []
    for ch in text:
        if quote:
            cur.append(ch)
            if ch == quote:
                quote = None
            continue
        if ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    parts.append("".join(cur))
    values = [config_lib.parse_value(p.strip()) for p in parts]
    if any(isinstance(v, str) and not v for v in values):
        raise ConfigError(f"empty value in {text!r} (values are separated by commas)")
    return values


def tied_keys(key: str) -> list[str]:
    """The dotted keys a grid key sets: ``"a.x+b.y"`` (tied) -> ``["a.x", "b.y"]``."""
    return [k.strip() for k in key.split("+")]


def assignments(key: str, value) -> list[tuple[str, object]]:
    """``(dotted key, value)`` pairs of one grid value: ``[(key, value)]`` for a plain key; for a
    tied key ``"k1+...+km"`` the value must be a list of m values, ``v_i`` going to ``k_i``."""
    keys = tied_keys(key)
    if len(keys) == 1:
        return [(key, value)]
    if not isinstance(value, list) or len(value) != len(keys):
        raise ConfigError(f"grid key {key!r} ties {len(keys)} keys: each of its values must be a "
                          f"list of {len(keys)} values (one per key), got {value!r}")
    return list(zip(keys, value))


def _check_grid(grid: dict[str, list]) -> None:
    """Every value of a tied key has one value per key, and no dotted key is set by two grid
    keys (``"a"`` beside ``"a+b"``)."""
    seen: dict[str, str] = {}
    for key, values in grid.items():
        if not values:
            raise ConfigError(f"--grid {key} has no values")
        for k in tied_keys(key):
            if not k or not all(k.split(".")):
                raise ConfigError(f"grid key {key!r}: {k!r} is not a dotted key like "
                                  f"algorithm.sigma")
            if k in seen:
                raise ConfigError(f"grid keys {seen[k]!r} and {key!r} both set {k!r}")
            seen[k] = key
        for i, v in enumerate(values):
            assignments(key, v)
            if any((type(v) is bool) == (type(w) is bool) and v == w for w in values[:i]):
                raise ConfigError(f"--grid {key} lists {v!r} twice: {values}")


def _grid_arg(assignment: str) -> tuple[str, list]:
    if "=" not in assignment:
        raise ConfigError(f"--grid expects KEY=V1,V2,..., got {assignment!r}")
    key, text = assignment.split("=", 1)
    key = key.strip()
    if not key or not all(key.split(".")):
        raise ConfigError(f"--grid key {key!r} is not a dotted key like algorithm.sigma")
    return key, split_values(text)


def _seeds_arg(value) -> list[int]:
    if isinstance(value, str):
        value = split_values(value)
        if len(value) == 1:
            value = value[0]
    if isinstance(value, bool):
        raise ConfigError(f"--seeds must be a count S >= 1 or a list of seeds, got {value!r}")
    if isinstance(value, int):
        validation.check_int("--seeds", value, minimum=1, maximum=MAX_RUNS)
        return list(range(value))
    if not isinstance(value, list) or not value:
        raise ConfigError(f"--seeds must be a count S >= 1 or a list of seeds, got {value!r}")
    if len(value) > MAX_RUNS:
        raise ConfigError(f"--seeds lists {len(value)} seeds; a sweep holds at most {MAX_RUNS} "
                          f"runs")
    for s in value:
        validation.check_int("--seeds[]", s, minimum=0)
    if len(set(value)) != len(value):
        raise ConfigError(f"--seeds lists a seed twice: {value}")
    return list(value)


def _targets_arg(value) -> list[float]:
    values = split_values(value) if isinstance(value, str) else list(value)
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (
                v > 0 and math.isfinite(v)):
            raise ConfigError(f"--target-epsilon values must be positive finite numbers, "
                              f"got {v!r}")
        out.append(float(v))
    return out


def _calibrate_arg(items) -> dict[str, str]:
    out = {}
    if isinstance(items, str):
        items = [items]
    if isinstance(items, dict):
        items = [f"{k}={v}" for k, v in items.items()]
    for item in items:
        if "=" in item:
            algo, key = (s.strip() for s in item.split("=", 1))
        else:
            algo, key = "*", item.strip()
        if not key or not all(key.split(".")):
            raise ConfigError(f"--calibrate expects KEY or ALGORITHM=KEY, got {item!r}")
        out[algo] = key
    return out


def _read_toml(path: Path) -> dict:
    return config_lib.read_toml(path)


def _base_name(path: Path) -> str:
    """``<folder>/<stem>`` (``dp_fedavg/mnist5k``): two algorithms' configs may share a stem."""
    return f"{path.resolve().parent.name}/{path.stem}"


_SWEEP_KEYS = {"configs", "grid", "seeds", "target_epsilon", "calibrate", "set", "name",
               "select", "select_over", "unit"}


def load(paths: list[str], *, grid: list[str] = (), seeds=None, target_epsilon=None,
         calibrate: list[str] = (), overrides: list[str] = (), select: str | None = None,
         select_over: str | list[str] | None = None, unit: str | None = None) -> Sweep:
    """A :class:`Sweep` from config / sweep files and command-line flags (validated)."""
    if not paths:
        raise ConfigError("CONFIG is required: a run config or a sweep file (configs/)")
    bases: list[tuple[str, dict]] = []
    sw = Sweep(bases=bases, name=Path(paths[0]).stem)
    for path in map(Path, paths):
        raw = _read_toml(path)
        table = raw.pop("sweep", None)
        if table is None:
            bases.append((_base_name(path), raw))
            continue
        unknown = sorted(set(table) - _SWEEP_KEYS)
        if unknown:
            raise ConfigError(f"unknown key(s) {['sweep.' + k for k in unknown]} in "
                              f"{str(path)!r}; sweep accepts {sorted(_SWEEP_KEYS)}")
        if "configs" in table:
            if raw:
                raise ConfigError(f"{str(path)!r}: a sweep file with sweep.configs holds no "
                                  f"config tables of its own (found {sorted(raw)})")
            for rel in table["configs"]:
                sub = path.parent / rel
                sub_raw = _read_toml(sub)
                sub_raw.pop("sweep", None)
                bases.append((_base_name(sub), sub_raw))
        else:
            bases.append((_base_name(path), raw))
        for k, v in table.get("grid", {}).items():
            sw.grid[k] = list(v) if isinstance(v, list) else [v]
        if "seeds" in table:
            sw.seeds = _seeds_arg(table["seeds"])
        if "target_epsilon" in table:
            sw.target_epsilon = _targets_arg(table["target_epsilon"])
        if "calibrate" in table:
            sw.calibrate.update(_calibrate_arg(table["calibrate"]))
        for k, v in table.get("set", {}).items():
            sw.overrides.append(f"{k}={_toml_value(v)}")
        sw.name = table.get("name", path.stem)
        sw.select = table.get("select", sw.select)
        sw.select_over = table.get("select_over", sw.select_over)
        sw.unit = table.get("unit", sw.unit)
    flagged: set[str] = set()
    for g in grid:                            # a flag's key replaces the file's grid key
        k, values = _grid_arg(g)
        if k in flagged:
            raise ConfigError(f"--grid {k} is given twice (list its values in one flag)")
        flagged.add(k)
        sw.grid[k] = values
    _check_grid(sw.grid)
    if seeds is not None:
        sw.seeds = _seeds_arg(seeds)
    if target_epsilon is not None:
        sw.target_epsilon = _targets_arg(target_epsilon)
    if calibrate:
        sw.calibrate.update(_calibrate_arg(list(calibrate)))
    gridded = {k for key in sw.grid for k in tied_keys(key)}
    both = sorted({o.split("=", 1)[0].strip() for o in overrides} & gridded)
    if both:             # a grid key's values win over every set: the --set would be ignored
        raise ConfigError(f"--set {both[0]} is also a grid key, whose values would replace it; "
                          f"to pin it, give --grid {both[0]}=VALUE")
    sw.overrides += list(overrides)
    if unit is not None:
        sw.unit = unit
    if sw.unit is not None and (not isinstance(sw.unit, str) or not sw.unit):
        raise ConfigError(f"--unit must be a unit of privacy such as agent or instance, got "
                          f"{sw.unit!r}")
    if select is not None:
        sw.select = select
    if select_over is not None:
        sw.select_over = ([k.strip() for k in select_over.split(",")]
                          if isinstance(select_over, str) else list(select_over))
    if sw.select is not None:
        if sw.select not in ("val_accuracy", "test_accuracy"):
            raise ConfigError(f"--select must be val_accuracy (test_accuracy only to reproduce a "
                              f"paper's protocol), got {sw.select!r}")
        over = sw.grid if sw.select_over is None else sw.select_over
        if not over:
            raise ConfigError("--select needs grid keys to choose over (--grid KEY=V1,V2)")
        for k in over:
            if k not in sw.grid:
                raise ConfigError(f"--select-over key {k!r} is not a --grid key "
                                  f"({sorted(sw.grid)})")
    elif sw.select_over is not None:
        raise ConfigError("--select-over needs --select val_accuracy")
    if sw.target_epsilon and not sw.calibrate:
        raise ConfigError("--target-epsilon needs --calibrate KEY (the config key set to meet "
                          "each target, e.g. algorithm.noise_multiplier)")
    if sw.calibrate and not sw.target_epsilon:
        raise ConfigError("--calibrate needs --target-epsilon E1,E2,...")
    check_size(sw)
    return sw


def _toml_value(v) -> str:
    """A value as TOML text for a ``--set`` override (a dict as an inline table)."""
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {_toml_value(x)}"
                               for k, x in v.items()) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return json.dumps(v)


def check_size(sw: Sweep) -> int:
    """The number of runs of ``sw`` (configs x grid points x target epsilons x seeds); more than
    :data:`MAX_RUNS` is refused in one line naming each factor."""
    factors = {"configs": len(sw.bases), **{f"--grid {k}": len(v) for k, v in sw.grid.items()},
               "--target-epsilon": len(sw.target_epsilon or [None]), "--seeds": len(sw.seeds)}
    total = math.prod(factors.values())
    if total > MAX_RUNS:
        shown = " x ".join(f"{n} ({k})" for k, n in factors.items() if n != 1)
        raise ConfigError(f"the sweep holds {total:,} runs ({shown}); at most {MAX_RUNS:,} "
                          f"runs: split it or shorten a grid")
    return total


def expand(sw: Sweep) -> list[Run]:
    """Every run of the sweep (at most :data:`MAX_RUNS`, :func:`check_size`), validated before
    any data is loaded or anything is trained."""
    from fedjax_dp.experiments import runner
    check_size(sw)
    keys = list(sw.grid)
    points = [dict(zip(keys, combo)) for combo in itertools.product(*sw.grid.values())]
    targets = sw.target_epsilon or [None]
    names = [n for n, _ in sw.bases]
    if len(set(names)) != len(names):
        raise ConfigError(f"a config is given twice: {names}")
    runs: list[Run] = []
    for (name, raw), point, target in itertools.product(sw.bases, points, targets):
        sets = list(sw.overrides) + [f"{k}={_toml_value(v)}" for key, value in point.items()
                                     for k, v in assignments(key, value)]
        base_cfg = config_lib.resolve(raw, sets)
        algo = base_cfg["algorithm"]["name"]
        key = None
        if target is not None:
            key = sw.calibrate.get(algo, sw.calibrate.get("*"))
            if key is None:
                raise ConfigError(f"--calibrate names no key for algorithm {algo!r} (config "
                                  f"{name!r}); give --calibrate {algo}=KEY")
        plan = runner.plan(base_cfg)
        if key is not None:
            calibrate_lib.check_key(base_cfg, key, plan)
        if sw.select == "val_accuracy" and not base_cfg["data"]["validation_fraction"]:
            raise ConfigError(f"--select val_accuracy needs a validation split: set "
                              f"data.validation_fraction (e.g. 0.1) in config {name!r}")
        for seed in sw.seeds:
            cfg = copy.deepcopy(base_cfg)
            cfg["seed"] = seed
            cfg["run"]["progress"] = False
            runs.append(Run(base=name, params=point, target_epsilon=target, seed=seed,
                            config=cfg, calibrate_key=key))
    return runs


def run_id(config: dict) -> str:
    from fedjax_dp.experiments import checkpoint
    return checkpoint.fingerprint(config)[:16]


# ----------------------------------------------------------------------------- the folder

#: sweep.json (the plans of every invocation) is at most this long
MAX_PLAN_BYTES = 64 << 20
#: the sweep folders this process holds (:func:`hold`), by real path
_HELD: dict[str, files.FolderLock] = {}


@contextlib.contextmanager
def hold(out: str | Path, *, what: str = "--out", resume: bool | None = None
         ) -> Iterator[None]:
    """Hold the sweep folder ``out`` for the block: an OS lock on ``out/.lock``
    (:class:`fedjax_dp.core.files.FolderLock`), so a second sweep on it, in another process, is
    refused with one line naming this one's pid; a killed sweep's lock goes with it, so its
    folder resumes as it is. Nested holds of one folder in this process are one lock. The
    folder is created when missing (``what`` names it in the refusal: ``--out`` /
    ``--resume``; ``resume`` given: the folder must hold a sweep, or none, before anything is
    created). The sweep's runs train in memory (``runner.run(config, None)``): nothing else
    locks inside the folder."""
    out = Path(out)
    key = os.path.realpath(out)
    if key in _HELD:
        yield
        return
    if resume is not None:
        _check_out(out, resume)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{what} {str(out)!r} is a file, not a folder")
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    lock = files.FolderLock(out, what=what)
    _HELD[key] = lock
    try:
        yield
    finally:
        del _HELD[key]
        if created:                 # refused before anything was written: no folder is left
            _remove_if_bare(out, lock)
        lock.release()


def _remove_if_bare(out: Path, lock: files.FolderLock) -> None:
    """Remove the folder ``out`` (which ``lock`` holds) if it holds nothing but its lock."""
    try:
        if {p.name for p in out.iterdir()} <= {files.LOCK_NAME}:
            lock.release(remove=True)
            out.rmdir()
    except OSError:
        pass


def _check_out(out: Path, resume: bool) -> None:
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {str(out)!r} is a file, not a folder")
    if not resume and os.path.lexists(out / "results.jsonl"):
        raise ConfigError(f"--out {str(out)!r} already holds a sweep (results.jsonl); choose a "
                          f"new folder, or continue it with --resume {str(out)!r}")
    if resume and not os.path.lexists(out / "results.jsonl"):
        raise ConfigError(f"--resume {str(out)!r} holds no sweep (no results.jsonl)")


def _read_plans(out: Path) -> list[dict]:
    """The invocations recorded in ``out/sweep.json`` (none when it is missing), read as data:
    a JSON object in the folder, whose ``invocations`` is a list of objects (an older file
    without it is one invocation); anything else is refused with one line naming the file."""
    path = out / "sweep.json"
    if not os.path.lexists(path):
        return []
    old = files.read_json(path, max_bytes=MAX_PLAN_BYTES, root=out, what="sweep.json",
                          expect=dict)
    plans = old.get("invocations")
    plans = [{k: v for k, v in old.items() if k != "invocations"}] if plans is None else plans
    if not isinstance(plans, list) or not all(isinstance(p, dict) for p in plans):
        raise files.UntrustedFileError(f"sweep.json {str(path)!r}: 'invocations' must be a list "
                                       f"of JSON objects (one per invocation)")
    for p in plans:
        refused = p.get("refused", [])
        if not isinstance(refused, list) or not all(
                isinstance(r, dict) and isinstance(r.get("params"), dict) for r in refused):
            raise files.UntrustedFileError(f"sweep.json {str(path)!r}: an invocation's "
                                           f"'refused' must be a list of objects with params")
    return plans


def _done_ids(out: Path) -> set[str]:
    """The run ids in ``out/results.jsonl``, read as data (``records.read_jsonl``). A last
    line without its newline (a kill cut the append; files.append_line writes a line whole
    otherwise) is cut off the file, so its run runs again and the next record starts on a line
    of its own; any other line that is not a record is refused with one line naming it."""
    path = out / "results.jsonl"
    if not os.path.lexists(path):
        return set()
    recs = records_lib.read_jsonl(path, root=out, drop_partial=True)
    ids = set()
    for i, rec in enumerate(recs):
        rid = rec.get("run_id")
        if not isinstance(rid, str):
            raise files.UntrustedFileError(
                f"results.jsonl {str(path)!r}: record {i + 1} has no run_id; it is not a "
                f"sweep's record (remove it to resume)")
        ids.add(rid)
    return ids


def _append(out: Path, record: dict) -> None:
    """One record, one whole line (``files.append_line``, fsynced), no signal in between."""
    with stop.deferred():
        files.append_line(out / "results.jsonl", json.dumps(record, allow_nan=False),
                          durable=True)


# ----------------------------------------------------------------------------- running


def run(sw: Sweep, out: str | Path, *, resume: bool = False, vmap_seeds: bool = True,
        progress: bool = False, log: Callable[[str], None] | None = None,
        group=None) -> list[dict]:
    """Run every run of ``sw`` not yet in ``out/results.jsonl`` and write the summaries; return
    all records (earlier and new). ``group`` (:mod:`fedjax_dp.experiments.processes`): this is
    process 0 of a multi-process sweep; it tells the others (:func:`follow`) which runs are
    done, and every run is computed by all the processes together, one at a time."""
    runs = expand(sw)                                   # every config checked before any work
    plan = {"name": sw.name, "bases": [n for n, _ in sw.bases], "grid": sw.grid,
            "seeds": sw.seeds, "target_epsilon": sw.target_epsilon, "calibrate": sw.calibrate,
            "overrides": sw.overrides, "runs": len(runs)}
    return _run_all(sw, runs, plan, out, resume=resume, vmap_seeds=vmap_seeds, log=log,
                    group=group)


def follow(sw: Sweep, group) -> None:
    """A multi-process sweep on a process other than 0: the runs process 0 has not done yet
    (it tells which), each computed with the others (``runner.run(..., group=group)``);
    nothing is written here."""
    from fedjax_dp.experiments import processes, runner
    message, _ = processes.hear(group)
    if "error" in message:
        raise ConfigError(f"process 0: {message['error']}")
    done = set(message["done"])
    cells: dict[str, list[Run]] = {}
    for r in expand(sw):
        cells.setdefault(r.cell, []).append(r)
    for cell_runs in cells.values():
        configs, _ = _calibrated(sw, cell_runs)
        for config in configs:
            if run_id(config) not in done:
                compilation.release_compiled()
                runner.run(config, None, progress=False, group=group)


def _run_all(sw: Sweep, runs: list[Run], plan: dict, out: str | Path, *, resume: bool,
             vmap_seeds: bool, log: Callable[[str], None] | None,
             refusable: Callable[[Run, ValueError], bool] | None = None,
             group=None) -> list[dict]:
    """Run ``runs`` (those not yet in ``out``), add ``plan`` to sweep.json's invocations, and
    write the summaries and the selection. A cell whose run raises a ValueError that
    ``refusable`` accepts (a value past a limit only the data shows) is skipped and listed in
    the plan's ``refused`` (its params and the message)."""
    out = Path(out)
    with hold(out, what="--resume" if resume else "--out", resume=resume):
        _check_out(out, resume)                  # (again) now that no other sweep can write
        return _run_held(sw, runs, plan, out, resume=resume, vmap_seeds=vmap_seeds, log=log,
                         refusable=refusable, group=group)


def _run_held(sw: Sweep, runs: list[Run], plan: dict, out: Path, *, resume: bool,
              vmap_seeds: bool, log: Callable[[str], None] | None,
              refusable: Callable[[Run, ValueError], bool] | None, group=None) -> list[dict]:
    """:func:`_run_all` in the folder this process holds."""
    from fedjax_dp.experiments import processes
    # sweep.json: this invocation's plan at the top, and every invocation that wrote into the
    # folder (a --resume with another grid adds arms) under "invocations", so it describes
    # every record the folder holds
    files.remove_temporaries(out)                # what a killed atomic write left
    earlier = _read_plans(out) if resume else []
    done = _done_ids(out)                        # both checked before anything is written
    if group is not None:
        processes.tell(group, {"done": sorted(done)})
        group.told = True
        vmap_seeds = False                       # every run over the job's mesh, one by one

    def write_plan():
        files.write_json(out / "sweep.json", {**plan, "invocations": earlier + [plan]})
    write_plan()
    log = log or (lambda msg: None)
    cells: dict[str, list[Run]] = {}
    for r in runs:
        cells.setdefault(r.cell, []).append(r)
    t0 = time.perf_counter()
    finished = 0
    for cell_runs in cells.values():
        first = cell_runs[0]
        try:                   # a refused value shows in the calibration (it sets up the data)
            configs, calibrated = _calibrated(sw, cell_runs)
            ids = [run_id(c) for c in configs]
            todo = [i for i, rid in enumerate(ids) if rid not in done]
            if todo:
                finished = _run_cell(sw, out, cell_runs, configs, ids, todo, calibrated,
                                     vmap_seeds, log, finished, len(runs), t0, group)
        except ValueError as e:
            if refusable is None or not refusable(first, e):
                raise
            plan.setdefault("refused", []).append({
                "base": first.base, "params": first.params,
                "target_epsilon": first.target_epsilon, "error": str(e)})
            write_plan()
            target = "" if first.target_epsilon is None else f" target={first.target_epsilon:g}"
            log(f"  refused: {first.params}{target}: {e}")
    records = records_lib.read([out / "results.jsonl"])
    write_summaries(records, out)
    if sw.select is not None:
        write_selection(records, out, sw.select, sw.select_over or list(sw.grid))
    return records


def _calibrated(sw: Sweep, cell_runs: list[Run]) -> tuple[list[dict], list | None]:
    """The cell's configs with the calibrated key set for its target epsilon (per seed where
    the planned ledger depends on the seed), and the calibrated values (None: no target)."""
    first = cell_runs[0]
    configs = [r.config for r in cell_runs]
    if first.target_epsilon is None:
        return configs, None
    per_seed = _seed_dependent_calibration(first.config)
    values = []
    for i, r in enumerate(cell_runs):
        if i == 0 or per_seed:
            v = calibrate_lib.calibrate(r.config, first.calibrate_key, r.target_epsilon,
                                        unit=sw.unit)
        values.append(v)
    return [calibrate_lib.set_key(c, first.calibrate_key, v)
            for c, v in zip(configs, values)], values


def _run_cell(sw: Sweep, out: Path, cell_runs: list[Run], configs: list[dict], ids: list[str],
              todo: list[int], calibrated, vmap_seeds: bool, log: Callable[[str], None],
              finished: int, total: int, t0: float, group=None) -> int:
    """Run one cell's missing seeds (``todo``), vmapped where they can share a call, appending
    each record; returns the count of finished runs."""
    from fedjax_dp.experiments import runner
    results = None
    compilation.release_compiled()     # one process runs every cell: stay below the map limit
    if vmap_seeds and len(todo) > 1 and not (calibrated and len(set(calibrated)) > 1):
        try:
            results = runner.run_seeds([configs[i] for i in todo], progress=False)
        except memory.MemoryBudgetError as e:  # refused before its work: one seed at a time
            log(f"  the cell's {len(todo)} seeds do not fit in memory together ({e}); "
                "running them one by one")
    if results is None:
        results = []
        for i in todo:
            tracker = _tracker(out, cell_runs[i], configs[i], ids[i], sw)
            try:
                results.append(runner.run(configs[i], None, progress=False,
                                          tracker=tracker, group=group))
            finally:
                tracker.close()
            _write(out, cell_runs[i], configs[i], ids[i], results[-1], calibrated, i, sw)
            finished += 1
            log(_line(cell_runs[i], results[-1], finished, total, t0, sw.unit))
    else:
        for i, res in zip(todo, results):
            tracker = _tracker(out, cell_runs[i], configs[i], ids[i], sw)
            try:                          # the vmapped seeds are logged once finished
                if tracker.enabled:
                    tracking_lib.log_result(tracker, configs[i], res)
            finally:
                tracker.close()
            _write(out, cell_runs[i], configs[i], ids[i], res, calibrated, i, sw)
            finished += 1
            log(_line(cell_runs[i], res, finished, total, t0, sw.unit))
    return finished


def _next_value(axis: list, side: str, limit: tuple, ints: bool | None = None
                ) -> int | float | None:
    """The value past ``axis``'s ``side`` end (``"low"`` / ``"high"``): one step of the ratio of
    the two values at that end (x3 with one value), rounded outward (not below 1) for integer
    keys and to 4 significant digits otherwise (``ints``: whether the key is an integer; by
    default, whether every tried value is), clamped to ``limit`` (lo, hi; None: open). None
    when the end is the limit or no value lies past it."""
    axis = sorted(axis)
    ints = all(isinstance(v, int) for v in axis) if ints is None else ints
    end, near = (axis[-1], axis[-2:][0]) if side == "high" else (axis[0], axis[:2][-1])
    if end <= 0 or near <= 0:
        return None
    ratio = max(end, near) / min(end, near)
    ratio = 3.0 if ratio <= 1 else ratio
    v = end * ratio if side == "high" else end / ratio
    if ints:       # below an integer end > 1 the next value is at least 1 (k = 3 -> 1, not none)
        v = math.ceil(v) if side == "high" else max(math.floor(v), 1)
    else:
        v = float(f"{v:.4g}")                           # 0.9, not 0.8999999999999998
    lo, hi = limit
    v = v if hi is None else min(v, hi)
    v = v if lo is None else max(v, lo)
    past = v > end if side == "high" else v < end
    return (int(v) if ints else float(v)) if past and (not ints or v >= 1) else None


def _mark(base: str, params: dict, target: float | None) -> str:
    """A grid point's identity (the target as a float: 1 and 1.0 are one target)."""
    return json.dumps([base, params, None if target is None else float(target)], sort_keys=True)


def edge_points(records: list[dict], metric: str, over: list[str],
                limits: dict[str, tuple] | None = None, refused: Sequence[dict] = ()
                ) -> list[tuple[str, dict, float, list]]:
    """(base, params, target epsilon, seeds) of the next grid point past each edge of each
    selected cell (:func:`select`'s ``at_edge``): along the edge key's axis through the chosen
    point, one step past the tried values (:func:`_next_value`; ``only``: both ways), the other
    keys at the chosen values, with the chosen cell's seeds. ``limits``: key -> (lo, hi), the
    hard limits (the whole batch, every public record) past which nothing is tried;
    ``refused``: points a run refused (a limit only the data shows, e.g. k above the fewest
    records an agent holds), ``{"base", "params", "target_epsilon"}``, not tried again."""
    points = []
    seen = {_mark(p.get("base"), p["params"], p.get("target_epsilon")) for p in refused}
    for row in select(records, metric, over):
        if not row["at_edge"]:
            continue
        cell = [r for r in records if r.get("base") == row["base"]
                and r.get("algorithm") == row["algorithm"]
                and r.get("target_epsilon") == row["target_epsilon"]
                and all(row.get(k) == v for k, v in r.get("params", {}).items() if k not in over)]
        first = next(r for r in cell
                     if all(r["params"].get(k) == v for k, v in row["selected"].items()))
        chosen = first["params"]
        seeds = sorted({r["seed"] for r in cell if r["params"] == chosen})
        for edge in row["at_edge"].split("; "):
            key, side = edge.split("=")
            axis = {r["params"][key] for r in cell
                    if all(r["params"].get(j) == chosen.get(j) for j in over if j != key)}
            # the resolved config's type says whether the key is an integer (1 given for a
            # learning rate is the float 1.0 there)
            try:
                typed = calibrate_lib.get_key(first.get("config") or {}, key)
                ints = isinstance(typed, int) and not isinstance(typed, bool)
            except ConfigError:                       # no resolved config: by the values
                ints = None
            for way in (("low", "high") if side == "only" else (side,)):
                v = _next_value(list(axis), way, (limits or {}).get(key, (None, None)), ints)
                point = {**chosen, key: v}
                mark = _mark(row["base"], point, row["target_epsilon"])
                if v is not None and mark not in seen:
                    seen.add(mark)
                    points.append((row["base"], point, row["target_epsilon"], seeds))
    return points


def extend_edges(sw: Sweep, out: str | Path, *, rounds: int, limits: dict | None = None,
                 vmap_seeds: bool = True, log: Callable[[str], None] | None = None
                 ) -> list[dict]:
    """Re-tune past the grid's edges: up to ``rounds`` times, run :func:`edge_points` of the
    selection in ``out`` (a finished sweep of ``sw``) and select again, until no selected cell
    is at an edge that can be extended. Each round is one invocation in sweep.json (its
    ``extend_edges`` points). A point whose run refuses the value it steps to (a ValueError
    naming that key, raised before any work, such as ``algorithm.k must be in [1, 54]``) is a
    hard limit the data sets: it is listed in the invocation's ``refused`` and not tried again.
    Returns every record."""
    if sw.select is None:
        raise ConfigError("--extend-edges needs --select val_accuracy (the file's or the flag)")
    out, log = Path(out), log or (lambda msg: None)
    over = sw.select_over or list(sw.grid)
    bases = dict(sw.bases)
    with hold(out, what="--resume", resume=True):
        _check_out(out, True)
        return _extend_held(sw, out, rounds=rounds, limits=limits, vmap_seeds=vmap_seeds,
                            log=log, over=over, bases=bases)


def _extend_held(sw: Sweep, out: Path, *, rounds: int, limits: dict | None, vmap_seeds: bool,
                 log: Callable[[str], None], over: list[str], bases: dict) -> list[dict]:
    """:func:`extend_edges` in the folder this process holds."""
    records = records_lib.read([out / "results.jsonl"])
    refused = [r for inv in _read_plans(out) for r in inv.get("refused", [])]
    for i in range(rounds):
        points = edge_points(records, sw.select, over, limits, refused)
        if not points:
            log(f"extend-edges: no selected cell at an extensible edge after {i} round(s)")
            break
        runs = []
        for base, point, target, seeds in points:
            if base not in bases:
                raise ConfigError(f"--extend-edges: the folder's base {base!r} is not a config "
                                  f"of this sweep ({sorted(bases)})")
            one = dataclasses.replace(sw, bases=[(base, bases[base])], seeds=seeds,
                                      grid={k: [v] for k, v in point.items()},
                                      target_epsilon=[] if target is None else [target])
            runs += expand(one)
        log(f"extend-edges round {i + 1}: {len(points)} point(s) past the edges")
        plan = {"name": sw.name, "extend_edges": i + 1, "overrides": sw.overrides,
                "runs": len(runs), "points": [{"base": b, "params": p, "target_epsilon": t,
                                               "seeds": s} for b, p, t, s in points]}
        def refusable(run: Run, e: ValueError) -> bool:
            """The run is one of this round's points and the error names a key it steps."""
            return any(b == run.base and p == run.params and t == run.target_epsilon
                       and any(str(e).startswith(f"{k} must") for k in p if k in over)
                       for b, p, t, _ in points)
        records = _run_all(sw, runs, plan, out, resume=True, vmap_seeds=vmap_seeds, log=log,
                           refusable=refusable)
        refused += plan.get("refused", [])
    return records


def run_folder(out: Path, r: Run, rid: str) -> Path:
    """``OUT/runs/<label>``: a sweep run's own folder (its ``tensorboard/`` events, W&B's files),
    labelled by base, grid point, target epsilon, seed and run id."""
    parts = [r.base.replace("/", "_"), *(f"{k}={v}" for k, v in r.params.items())]
    if r.target_epsilon is not None:
        parts.append(f"eps={r.target_epsilon:g}")
    return out / "runs" / tracking_lib.label(*parts, f"seed={r.seed}", rid[:8])


def _tracker(out: Path, r: Run, config: dict, rid: str, sw: Sweep) -> tracking_lib.Tracker:
    """The tracker ``run.log`` asks for, in :func:`run_folder` (a run done again starts over)."""
    if not config["run"].get("log"):
        return tracking_lib.Trackers([])
    folder = run_folder(out, r, rid)
    return tracking_lib.open_run(config, folder, name=folder.name, group=sw.name)


def _seed_dependent_calibration(config: dict) -> bool:
    """Whether the planned ledger depends on the run's key (``seed_dependent_ledger``, e.g.
    DP-FedSGD): then every seed is calibrated on its own."""
    from fedjax_dp.algorithms import api
    from fedjax_dp.experiments import runner
    return api.hooks(runner.plan(config).entry).seed_dependent_ledger


def _write(out: Path, r: Run, config: dict, rid: str, result: dict, calibrated, i: int,
           sw: Sweep) -> None:
    params = dict(r.params)
    cal = None
    if calibrated is not None:
        cal = {"key": r.calibrate_key, "value": calibrated[i]}
    rec = records_lib.from_result(result, sw.unit, params=params,
                                  target_epsilon=r.target_epsilon, calibrated=cal)
    rec.update(run_id=rid, sweep=sw.name, base=r.base,
               vmapped_seeds=int(result.get("vmapped_seeds", 1)))
    rec["config"] = config
    if "processes" in result:            # a multi-process run: its job and agents per process
        rec["processes"] = result["processes"]
    from fedjax_dp.experiments.runner import jsonable
    _append(out, jsonable(rec))


def _line(r: Run, result: dict, k: int, total: int, t0: float, unit: str | None) -> str:
    eps, unit, _ = records_lib.headline(result.get("privacy", []),
                                        result["config"]["privacy"]["accountants"], unit)
    shown = f"eps={eps:.4g} ({unit})" if eps is not None else "no guarantee"
    point = " ".join(f"{k}={v}" for k, v in r.params.items())
    target = f" target={r.target_epsilon:g}" if r.target_epsilon is not None else ""
    rate = (time.perf_counter() - t0) / k
    return (f"[sweep {k}/{total}] {r.base} {point}{target} seed={r.seed}: "
            f"acc={result['test_accuracy']:.4f} {shown}  (ETA {rate * (total - k):.0f} s)")


# ----------------------------------------------------------------------------- summaries

def _mean_std(xs: list[float]) -> tuple[float | None, float | None]:
    xs = [x for x in xs if x is not None]
    if not xs:
        return None, None
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return m, 0.0
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def summarize(records: list[dict]) -> list[dict]:
    """One row per cell (base, algorithm, grid point, target epsilon), in first-seen order:
    ``n`` seeds and the mean / sample standard deviation (ddof 1; 0 for one seed) of test
    accuracy and headline epsilon, the mean calibrated value and wall time."""
    return [_summary_row(recs) for recs in _cells(records)]


def _cells(records: list[dict]) -> list[list[dict]]:
    """The records grouped by cell (base, algorithm, grid point, target), first-seen order."""
    groups: dict[str, list[dict]] = {}
    for rec in records:
        k = json.dumps([rec.get("base"), rec.get("algorithm"), rec.get("params", {}),
                        rec.get("target_epsilon")], sort_keys=True)
        groups.setdefault(k, []).append(rec)
    return list(groups.values())


def _summary_row(recs: list[dict]) -> dict:
    """One cell's summary row (its seeds' records)."""
    r0 = recs[0]
    acc_m, acc_s = _mean_std([r.get("test_accuracy") for r in recs])
    eps_m, eps_s = _mean_std([r.get("epsilon") for r in recs])
    cal = [r["calibrated"]["value"] for r in recs if r.get("calibrated")]
    return {"base": r0.get("base"), "algorithm": r0.get("algorithm"),
            **r0.get("params", {}),
            "target_epsilon": r0.get("target_epsilon"),
            "calibrated_key": r0["calibrated"]["key"] if r0.get("calibrated") else None,
            "calibrated_value": sum(cal) / len(cal) if cal else None,
            "n": len(recs), "seeds": sorted(r.get("seed") for r in recs),
            "test_accuracy_mean": acc_m, "test_accuracy_std": acc_s,
            "epsilon_mean": eps_m, "epsilon_std": eps_s,
            "epsilon_unit": r0.get("epsilon_unit"),
            "wall_time_s_mean": _mean_std([r.get("wall_time_s") for r in recs])[0]}


def _fmt(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list):
        return " ".join(map(str, v))
    return str(v)


def summary_markdown(rows: list[dict]) -> str:
    if not rows:
        return ""
    cols = list(dict.fromkeys(k for r in rows for k in r))
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |")
    return "\n".join(lines) + "\n"


def _write_tables(out: Path, stem: str, rows: list[dict], *, join_lists: bool) -> None:
    """``<stem>.csv`` and ``<stem>.md`` of ``rows`` (a column per key, first-seen order);
    ``join_lists``: a list cell is written space-separated in the CSV (else its repr)."""
    cols = list(dict.fromkeys(k for r in rows for k in r))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=cols)
    writer.writeheader()
    for r in rows:
        writer.writerow({c: (_fmt(r.get(c)) if join_lists and isinstance(r.get(c), list)
                             else r.get(c)) for c in cols})
    files.write_text(out / f"{stem}.csv", buf.getvalue())
    files.write_text(out / f"{stem}.md", summary_markdown(rows))


def write_summaries(records: list[dict], out: Path) -> list[dict]:
    rows = summarize(records)
    _write_tables(out, "summary", rows, join_lists=True)
    return rows


def select(records: list[dict], metric: str, over: list[str]) -> list[dict]:
    """Per group of cells that differ only in the ``over`` grid keys: the cell with the best mean
    ``metric`` over its seeds (ties: the first), with its test accuracy. Rows: the group's keys,
    ``selected`` {key: value}, ``n_candidates``, ``<metric>_mean``, the cell's summary fields."""
    groups: dict[str, list[tuple[dict, list[dict]]]] = {}
    for recs in _cells(records):
        row = _summary_row(recs)
        rest = {k: v for k, v in recs[0].get("params", {}).items() if k not in over}
        g = json.dumps([row["base"], row["algorithm"], rest, row["target_epsilon"]],
                       sort_keys=True)
        groups.setdefault(g, []).append((row, recs))
    out = []
    for members in groups.values():
        scored = []
        for row, recs in members:
            m, _ = _mean_std([r.get(metric) for r in recs])
            if m is None:
                raise ConfigError(f"--select {metric}: the runs hold no {metric} (is "
                                  f"data.validation_fraction set?)")
            scored.append((m, row, recs))
        best_m, best, recs = max(scored, key=lambda t: t[0])
        params = recs[0].get("params", {})
        tried = [r[0].get("params", {}) for _, _, r in scored]
        out.append({"base": best["base"], "algorithm": best["algorithm"],
                    **{k: v for k, v in params.items() if k not in over},
                    "target_epsilon": best["target_epsilon"],
                    "selected": {k: params.get(k) for k in over},
                    "at_edge": grid_edges(params, tried, over),
                    "n_candidates": len(scored), f"{metric}_mean": best_m,
                    **{k: best[k] for k in ("n", "test_accuracy_mean", "test_accuracy_std",
                                            "epsilon_mean", "epsilon_std", "epsilon_unit",
                                            "calibrated_value")}})
    # by base, algorithm and target (stable: other grid keys keep their first-seen order)
    out.sort(key=lambda r: (str(r["base"]), str(r["algorithm"]),
                            -1.0 if r["target_epsilon"] is None else r["target_epsilon"]))
    return out


def grid_edges(chosen: dict, tried: list[dict], over: list[str]) -> str:
    """The numeric ``over`` keys at which ``chosen`` sits on an edge of the tried grid, as
    ``"key=low"`` / ``"key=high"`` / ``"key=only"`` joined by ``"; "`` (``""``: interior).

    Along each key's axis through the chosen point (the tried points equal to ``chosen`` in every
    other ``over`` key), the chosen value is interior when a smaller and a larger value were
    tried; ``only`` when it is the one value tried. Non-numeric keys (names, flags) have no
    order and are skipped. A selection at an edge may improve past it: widen the grid there."""
    def number(v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    edges = []
    for k in over:
        if not number(chosen.get(k)):
            continue
        axis = {p.get(k) for p in tried
                if number(p.get(k)) and all(p.get(j) == chosen.get(j) for j in over if j != k)}
        below = any(v < chosen[k] for v in axis)
        above = any(v > chosen[k] for v in axis)
        if not (below and above):
            side = "only" if not (below or above) else "low" if not below else "high"
            edges.append(f"{k}={side}")
    return "; ".join(edges)


def write_selection(records: list[dict], out: Path, metric: str, over: list[str]
                    ) -> list[dict]:
    """``selected.md`` / ``selected.csv`` / ``selected.json`` of :func:`select`."""
    rows = select(records, metric, over)
    flat = [{**{k: v for k, v in r.items() if k not in ("selected", "at_edge")},
             **{f"selected {k}": v for k, v in r["selected"].items()},
             "at_edge": r["at_edge"]} for r in rows]
    _write_tables(out, "selected", flat, join_lists=False)
    files.write_json(out / "selected.json", rows)
    return rows
