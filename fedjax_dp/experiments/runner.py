"""Run one experiment from a resolved config and write ``result.json``.

Order of work: validate everything (config tables, dataset and partition names, algorithm fields,
the output folder) -> load data -> partition -> stack -> train -> evaluate -> account -> write.

The output folder of a run holds ``config.json`` (the resolved config, written first),
``progress.jsonl`` (one line per finished round, appended as it completes), ``checkpoints/``
(every ``run.checkpoint_every`` rounds of a round-based algorithm,
:mod:`fedjax_dp.experiments.checkpoint`) and, at the end, ``result.json``. A folder that already
holds a run is never written over: :func:`run` refuses it, and ``resume=True`` continues the run it
holds from its last checkpoint (the same parameters, history and ledger as an uninterrupted run).
"""
from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from fedjax_dp import data as data_lib
from fedjax_dp.algorithms import api, registry
from fedjax_dp.algorithms import seeds as seeds_lib
from fedjax_dp.algorithms.api import FederatedData
from fedjax_dp.core import compilation
from fedjax_dp.core import files, rng, stop, validation
from fedjax_dp.core import progress as progress_lib
from fedjax_dp.data import population
from fedjax_dp.experiments import checkpoint as checkpoint_lib
from fedjax_dp.experiments import config as config_lib
from fedjax_dp.experiments import processes
from fedjax_dp.experiments import tracking as tracking_lib
from fedjax_dp.models import make_model
from fedjax_dp.train import LocalTrainConfig
from fedjax_dp.models import tasks

#: every installed library that can change a result (result.json's ``versions``): each is
#: listed, ``not installed`` when absent
_PACKAGES = ("fedjax-dp", "jax", "jaxlib", "flax", "optax", "chex", "numpy", "scipy",
             "dp-accounting", "jax-privacy", "scikit-learn", "ml-dtypes")
#: JAX's accelerator plugins: listed only when installed (the one the run's device used)
_PLUGINS = ("jax-cuda12-plugin", "jax-cuda12-pjrt", "jax-cuda13-plugin", "jax-cuda13-pjrt",
            "libtpu")


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in _PACKAGES + _PLUGINS:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            if name in _PACKAGES:
                out[name] = "not installed"
    return out


@dataclasses.dataclass
class Plan:
    """Everything validated from a resolved config, before any data is loaded or trained on."""

    config: dict
    entry: Any                                   # an algorithm module (fedjax_dp.algorithms.api)
    algorithm_config: Any
    local: LocalTrainConfig
    #: where the config came from (cli: a file, a shipped config, a run folder), result.json's
    #: ``config_source``; None from Python (not recorded)
    config_source: dict | None = None


def build_dataclass(cls, table: dict, prefix: str, **extra):
    """Instantiate a config dataclass from a table, naming unknown fields (validation runs in it)."""
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(table) - fields)
    if unknown:
        raise config_lib.ConfigError(f"unknown key(s) {[f'{prefix}.{k}' for k in unknown]}; "
                          f"{prefix} accepts {sorted(fields - set(extra))}")
    try:
        return cls(**table, **extra)
    except TypeError as e:
        raise config_lib.ConfigError(f"{prefix}: {e}") from None


def plan(config: dict) -> Plan:
    """Validate a resolved config completely; raise ``ValueError`` naming the bad key."""
    d = config["data"]
    if d["dataset"] not in data_lib.DATASETS:
        raise config_lib.ConfigError(f"data.dataset must be one of {sorted(data_lib.DATASETS)}, "
                                     f"got {d['dataset']!r}")
    if d["partition"] not in data_lib.PARTITIONS:
        raise config_lib.ConfigError(f"data.partition must be one of "
                                     f"{sorted(data_lib.PARTITIONS)}, got {d['partition']!r}")
    from fedjax_dp.models import MODELS
    if config["model"]["name"] not in MODELS:
        raise config_lib.ConfigError(f"model.name must be one of {list(MODELS)}, "
                                     f"got {config['model']['name']!r}")
    hidden = config["model"]["hidden"]
    if not isinstance(hidden, list):
        raise config_lib.ConfigError(f"model.hidden must be a list of layer widths, e.g. [200], "
                                     f"got {hidden!r}")
    for h in hidden:
        validation.check_int("model.hidden[]", h, minimum=1)
    from fedjax_dp.models import model_options
    try:                                    # model.options: the model's size options
        model_options(config["model"]["name"], config["model"].get("options") or {})
    except ValueError as e:
        raise config_lib.ConfigError(str(e)) from None
    tracking_lib.check_available(config["run"].get("log", []))   # its extra is installed
    server = d.get("server_dataset", "")
    if server and server not in data_lib.DATASETS:
        raise config_lib.ConfigError(f"data.server_dataset must be \"\" or one of "
                                     f"{sorted(data_lib.DATASETS)}, got {server!r}")
    population.check_options(d)          # an option a source or partition does not take
    algo = dict(config["algorithm"])
    entry = registry.get(algo.pop("name"))
    local = build_dataclass(LocalTrainConfig, config["train"], "train")
    extra = {"local": local} if entry.USES_LOCAL_TRAIN else {}
    algo_fields = {f.name for f in dataclasses.fields(entry.Config)}
    if "delta" in algo_fields and "delta" not in algo:
        algo["delta"] = config["privacy"]["delta"]      # a target delta defaults to [privacy]'s
    algorithm_config = build_dataclass(entry.Config, algo, "algorithm", **extra)
    for k, v in config["algorithm"].items():     # the checked values (2.0 -> 2) as the run uses
        checked = getattr(algorithm_config, k, v)
        if type(checked) in (int, float) and type(v) in (int, float) and checked == v:
            config["algorithm"][k] = checked
    return Plan(config=config, entry=entry, algorithm_config=algorithm_config, local=local)


def check_delta(p: Plan, *, agents: int | None = None, records: int | None = None) -> None:
    """``privacy.delta`` (and an ``algorithm.delta`` set on its own) below 1/N for every unit
    the run reports (its ``privacy_units`` hook; :mod:`fedjax_dp.privacy.delta_bound`): N the
    ``agents`` for a whole agent's or party's data, the training ``records`` for one record
    (None: not known yet). ``privacy.allow_large_delta = true`` lifts the bound."""
    from fedjax_dp.privacy import delta_bound
    hooks = api.hooks(p.entry)
    if not hooks.private:
        return
    units = hooks.privacy_units(p.algorithm_config)
    allow = p.config["privacy"].get("allow_large_delta", False)
    targets = [("privacy.delta", p.config["privacy"]["delta"])]
    if "delta" in p.config["algorithm"]:               # a target delta of its own
        targets.append(("algorithm.delta", p.algorithm_config.delta))
    for key, delta in targets:
        delta_bound.check(delta, units, agents=agents, records=records, key=key, allow=allow)


def jsonable(x):
    """``x`` (nested dicts, lists, tuples, numpy / JAX scalars) as strict-JSON values: scalars
    as Python numbers, tuples as lists, a non-finite float as None."""
    if isinstance(x, dict):
        return {k: jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if hasattr(x, "item") and getattr(x, "ndim", 1) == 0:
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None          # strict JSON: an infinite epsilon (no guarantee) is written as null
    return x


def guarantee_line(g: dict) -> str:
    """One printed guarantee: unit, epsilon at delta, accountant, and whether it depends on the
    data (a data-dependent epsilon is itself not private to release). An infinite epsilon
    (``None`` in ``result.json``) prints as ``inf``. A guarantee that does not cover everything
    the run releases (``covers_all_releases: false``) ends with ``[NOT covering: <what: why>]``
    (its ``not_covered``)."""
    kind = ", data-dependent" if g.get("data_dependent") else ""
    eps = g["epsilon"]
    eps = "inf" if eps is None or not math.isfinite(eps) else f"{eps:.4g}"
    line = f"{g['unit']}: eps={eps} at delta={g['delta']:.3g} ({g['accountant']}{kind})"
    if g.get("covers_all_releases") is False:
        line += f" [NOT covering: {g.get('not_covered') or 'releases the ledger does not list'}]"
    return line


def headline_row(result: dict) -> dict | None:
    """The guarantee of ``result["privacy"]`` a run is quoted by
    (:func:`fedjax_dp.experiments.records.headline`: the algorithm's first data-independent unit,
    read with the first of ``privacy.accountants`` that applies), the first guarantee when none
    is data-independent, None without any."""
    from fedjax_dp.experiments import records
    rows = result.get("privacy") or []
    accountants = ((result.get("config") or {}).get("privacy") or {}).get(
        "accountants", ("rdp", "pld"))
    _, unit, acc = records.headline(rows, accountants)
    for g in rows:
        if g["unit"] == unit and g["accountant"] == acc and not g.get("data_dependent"):
            return g
    return rows[0] if rows else None


def coverage_note(g: dict, out: Path | None) -> str:
    """Whether guarantee ``g`` covers every release of its run, in a few words, ending with
    the run's folder: ``covers every release; run folder DIR``, ``NOT covering every release:
    fedjax-dp show DIR`` (what and why: its ``not_covered``, which :func:`report_lines`
    prints); without a coverage field (a record from before it) only the folder."""
    where = f"run folder {out}" if out is not None else ""
    if "covers_all_releases" not in g:
        return where
    if g["covers_all_releases"]:
        return "; ".join(x for x in ("covers every release", where) if x)
    if out is None:
        return "NOT covering every release (see its not_covered)"
    return f"NOT covering every release: fedjax-dp show {out}"


def summary_line(name: str, result: dict, out: Path | None) -> str:
    """The line printed at the end of a run, one short line: test accuracy, the headline
    guarantee (:func:`headline_row`, with the number of other guarantees), whether it covers
    every release the run makes (:func:`coverage_note`) and the run's folder. The full report
    is ``result.json``, printed by ``fedjax-dp show DIR`` (:func:`report_lines`)."""
    g = headline_row(result)
    if g is None:
        eps = "no privacy guarantee"
        where = f"; run folder {out}" if out is not None else ""
    else:
        eps = guarantee_line({k: v for k, v in g.items() if k != "covers_all_releases"})
        more = len(result["privacy"]) - 1
        if more:
            eps = eps[:-1] + f", +{more} more)"
        note = coverage_note(g, out)
        where = f"; {note}" if note else ""
    bad = result.get("non_finite")
    diverged = (f"; NON-FINITE from round {bad['round']} ({bad['what']})" if bad else "")
    return f"[{name}] test accuracy {result['test_accuracy']:.4f}{diverged}; {eps}{where}"


def report_lines(result: dict, out: Path | None = None) -> list[str]:
    """The full report of a finished run (``fedjax-dp show DIR``): what ran, its test
    accuracy, every guarantee (:func:`guarantee_line`, without the coverage note), and once,
    whether they cover every release the run makes, each release they do not cover with why."""
    lines = [f"run folder: {out}"] if out is not None else []
    lines += [f"algorithm: {result.get('algorithm')}  dataset: {result.get('dataset')}  "
              f"agents: {result.get('num_agents')}  seed: {result.get('seed')}",
              f"test accuracy: {result['test_accuracy']:.4f}"]
    if "val_accuracy" in result:
        lines.append(f"validation accuracy: {result['val_accuracy']:.4f}")
    bad = result.get("non_finite")
    if bad:
        lines.append(f"NON-FINITE from round {bad['round']} ({bad['what']})")
    rows = result.get("privacy") or []
    lines.append("privacy:" if rows else "privacy: no privacy guarantee")
    head = headline_row(result)
    for g in rows:
        mark = "  (headline)" if g is head else ""
        lines.append("  " + guarantee_line({k: v for k, v in g.items()
                                            if k != "covers_all_releases"}) + mark)
    if head is not None and "covers_all_releases" in head:
        if head["covers_all_releases"]:
            lines.append("every guarantee covers every release the run makes")
        else:
            lines.append("NOT covered by any guarantee (release: why): "
                         f"{head.get('not_covered') or 'releases the ledger does not list'}")
    lines.append(f"history: {len(result.get('history') or [])} entries; "
                 f"wall time {result.get('wall_time_s') or 0:.1f} s")
    return lines


#: files that mark a folder as holding a run
RUN_FILES = ("config.json", "progress.jsonl", "result.json", checkpoint_lib.FOLDER)


def holds_run(out: Path) -> list[str]:
    """The run files already in ``out`` (empty: free to use)."""
    return [name for name in RUN_FILES if (out / name).exists()]


def claim_out(out: Path, *, resume: bool = False) -> files.FolderLock:
    """Check the output folder before any work and hold it for this process: a folder (made if
    missing), writable, not held by another live process (:class:`files.FolderLock`), and
    (unless resuming) holding no run. Returns the held lock.

    Raises ``ValueError`` naming ``--out`` / ``--resume`` (a run's results are never
    overwritten; a live run's folder is never shared)."""
    flag = "--resume" if resume else "--out"
    if out.exists() and not out.is_dir():
        raise config_lib.ConfigError(f"{flag} {str(out)!r} is a file, not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write_test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise config_lib.ConfigError(f"{flag} {str(out)!r} is not a writable folder "
                                     f"({e.strerror or e})") from None
    had_lock = (out / files.LOCK_NAME).exists()
    lock = files.FolderLock(out, what=flag)
    try:
        if not resume:
            found = holds_run(out)
            if found:
                raise config_lib.ConfigError(
                    f"--out {str(out)!r} already holds a run ({', '.join(found)}); choose a new "
                    f"folder (or omit --out for a fresh one), or continue it with --resume")
        files.remove_temporaries(out)            # what a killed write left behind
    except BaseException:
        lock.release(remove=not had_lock)        # a refused folder is left as it was
        raise
    return lock


def prepare_out(out: Path, *, resume: bool = False) -> None:
    """:func:`claim_out` for a check only (the folder is released at once)."""
    claim_out(out, resume=resume).release()


def finished_result(out: Path) -> dict | None:
    """The run's ``result.json`` if it holds a finished run's record (None: no file); a file
    that is not one (a damaged copy) is moved aside to ``result.json.damaged`` so the run can
    be resumed, with a warning."""
    path = out / "result.json"
    if not path.exists() and not path.is_symlink():
        return None
    try:
        result = files.read_json(path, what="result", expect=dict)
        if not {"test_accuracy", "privacy", "config"} <= set(result):
            raise files.UntrustedFileError(f"result {str(path)!r} is not a run's record")
        return result
    except files.UntrustedFileError as e:
        os.replace(path, out / "result.json.damaged")
        print(f"fedjax-dp: warning: {e}; moved to result.json.damaged, resuming the run",
              file=sys.stderr)
        return None


def read_config(out: Path) -> dict:
    """A run folder's ``config.json`` as data (:func:`files.read_json`)."""
    return files.read_json(out / "config.json", max_bytes=64 * 2**20, what="run config",
                           expect=dict)


def fresh_out(base: str | Path, name: str) -> Path:
    """A new folder ``base/name/<UTC time>[-k]`` for a run without ``--out`` (never an earlier
    run's)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    root = Path(base) / name
    out, k = root / stamp, 1
    while out.exists():
        out, k = root / f"{stamp}-{k}", k + 1
    return out


def append_progress(out: Path, record: dict) -> None:
    """One line of ``out/progress.jsonl``: a finished step's record (strict JSON), appended
    whole or not at all (:func:`files.append_line`)."""
    with stop.deferred():
        files.append_line(out / "progress.jsonl", json.dumps(jsonable(record)))


def write_progress(out: Path, records: list[dict]) -> None:
    """``out/progress.jsonl`` replaced atomically by ``records`` (a resume's restored rounds)."""
    with stop.deferred():
        files.write_text(out / "progress.jsonl",
                         "".join(json.dumps(jsonable(r)) + "\n" for r in records))


def run(config: dict, out_dir: str | Path | None = None, *, progress: bool | None = None,
        resume: bool = False, tracker: tracking_lib.Tracker | None = None,
        config_source: dict | None = None, group: processes.Group | None = None) -> dict:
    """Run a resolved config; return the result record (also written to ``out_dir``).

    ``resume=True``: continue the run held in ``out_dir`` (same config, except the execution keys
    :data:`checkpoint.EXECUTION_KEYS`) from its last checkpoint; without one it starts over; a
    folder that holds no run yet starts one; a finished run's record is returned as it is.
    ``tracker``: where the rounds are logged instead of the trackers ``run.log`` opens in
    ``out_dir`` (:mod:`fedjax_dp.experiments.tracking`; a sweep's per-run folder); the caller closes
    it. The folder is held by this process for the run's life (a second run on it is refused);
    SIGINT / SIGTERM stop the run at any moment (:mod:`fedjax_dp.core.stop`). ``config_source``:
    recorded as result.json's ``config_source`` (``fedjax-dp run``: a file or a shipped config,
    :func:`fedjax_dp.experiments.shipped.resolve`). ``group``: the processes of a multi-process
    run (:mod:`fedjax_dp.experiments.processes`): process 0 holds ``out_dir`` and writes; the
    others write nothing and learn from process 0 whether to start, resume (the checkpoint is
    broadcast) or stop."""
    with stop.handling():
        p = dataclasses.replace(plan(config), config_source=config_source)
        out = Path(out_dir) if out_dir is not None else None
        if group is not None and not group.is_writer:
            return _follow(p, config, group)
        if resume and out is None:
            raise config_lib.ConfigError("resume needs the run's folder (--resume DIR)")
        if tracker is None and out is None and config["run"].get("log"):
            raise config_lib.ConfigError(f"run.log = {config['run']['log']!r} needs the run's "
                                         f"folder (--out DIR; runner.run(config, out_dir))")
        if out is None:
            return _run_in(p, config, None, progress, False, tracker, created=False,
                           group=group)
        created = not out.exists()
        try:
            lock = claim_out(out, resume=resume)
        except Exception as e:
            processes.tell(group, {"error": str(e)})      # the others stop with the same line
            raise
        try:
            return _run_in(p, config, out, progress, resume, tracker, created=created,
                           group=group)
        finally:
            lock.release(remove=created and out.is_dir() and
                         [q.name for q in out.iterdir()] == [files.LOCK_NAME])
            if created and out.is_dir() and not any(out.iterdir()):
                out.rmdir()


def _follow(p: Plan, config: dict, group: processes.Group) -> dict:
    """:func:`run` on a process other than 0: what process 0 found in the run folder (an
    error, a finished run, a checkpoint to resume from), then the same run, writing nothing."""
    import tempfile
    message, blob = processes.hear(group)
    if "error" in message:
        raise config_lib.ConfigError(f"process 0: {message['error']}")
    if "result" in message:
        return message["result"]
    with tempfile.TemporaryDirectory(prefix="fedjax_dp_restart_") as tmp:
        restart = processes.unpack_folder(blob, tmp) if blob else None
        return _run(p, config, None, False, restart, _Live(), tracking_lib.Trackers([]),
                    group=group)


def _run_in(p: Plan, config: dict, out: Path | None, progress: bool | None, resume: bool,
            tracker: tracking_lib.Tracker | None, *, created: bool,
            group: processes.Group | None = None) -> dict:
    """:func:`run` in a held folder (or none); with ``group``, what it found is told to the
    other processes (:func:`_follow`)."""
    show = config["run"]["progress"] if progress is None else progress
    try:
        fresh, restart, done = _prepare_folder(config, out, resume, show)
    except Exception as e:
        processes.tell(group, {"error": str(e)})
        raise
    if done is not None:
        processes.tell(group, {"result": done})
        return done
    processes.tell(group, {"start": True},       # the checkpoint's own files, nothing else
                   processes.pack_folder(restart, checkpoint_lib.files_of(restart))
                   if restart is not None and group is not None else b"")
    live = _Live()
    live.total = p.entry.num_steps(p.algorithm_config)
    own_tracker = tracker is None
    try:
        if own_tracker:
            tracker = tracking_lib.open_run(
                config, out, restart_step=None if restart is None else
                checkpoint_lib.read_meta(restart)["step"])
        return _run(p, config, out, show, restart, live, tracker, group=group)
    except BaseException as e:
        with stop.ignored():                     # already stopping: report, then stop
            if _stopped(e, p, config, out, fresh, live) and own_tracker and \
                    tracker is not None and tracker.enabled:
                tracker.close()                  # and what it began: events, the W&B run id
                tracker = None
                tracking_lib.remove(out)
        raise
    finally:
        if own_tracker and tracker is not None:
            tracker.close()


def _prepare_folder(config: dict, out: Path | None, resume: bool, show: bool):
    """A held run folder checked and started: ``(fresh, restart, done)`` -- nothing of this run
    in it yet, the checkpoint a resume starts from (or None), a finished run's record (or
    None)."""
    restart = None                               # the checkpoint a resumed run starts from
    fresh = True                                 # nothing of this run is in the folder yet
    if out is not None:
        if resume and (out / "config.json").exists():
            fresh = False
            done = finished_result(out)
            if done is not None:
                if checkpoint_lib.fingerprint(done["config"]) != checkpoint_lib.fingerprint(config):
                    raise checkpoint_lib.CheckpointError(
                        f"--resume {str(out)!r} holds a finished run of a different config")
                if show:
                    print(summary_line(config["algorithm"]["name"], done, out) +
                          " (finished earlier)", file=sys.stderr)
                return fresh, None, done
            restart = checkpoint_lib.latest(out)
            if restart is not None:
                checkpoint_lib.check_config(restart, config)
            elif checkpoint_lib.fingerprint(read_config(out)) != checkpoint_lib.fingerprint(config):
                raise checkpoint_lib.CheckpointError(
                    f"--resume {str(out)!r} holds a run of a different config")
        with stop.deferred():
            files.write_json(out / "config.json", jsonable(config))
            if fresh:
                files.write_text(out / "progress.jsonl", "")
    return fresh, restart, None


def _stopped(e: BaseException, p: Plan, config: dict, out: Path | None, fresh: bool,
             live: _Live) -> bool:
    """What a run that raised ``e`` leaves: a fresh run that *failed* before its first round
    (bad data, k above a record count, ...) leaves no run behind, so the same --out can be used
    once the input is fixed; a run stopped by a signal, or after a round, keeps its folder and
    gets its one-line report (``e.fedjax_dp_stop``, also a note). True: the run's files were
    removed."""
    if isinstance(e, KeyboardInterrupt):
        stop.clear()                              # taken: it propagates from here
    if out is None or isinstance(e, checkpoint_lib.CheckpointError):
        return False                 # a refused checkpoint: one line, the folder as it was
    progress_file = out / "progress.jsonl"
    began = checkpoint_lib.latest(out) is not None or (
        progress_file.exists() and progress_file.read_text().strip())
    if fresh and not began and not isinstance(e, KeyboardInterrupt):
        for name in ("config.json", "progress.jsonl"):
            (out / name).unlink(missing_ok=True)
        return True
    try:
        report = (f"rounds 1-{len(live.history)} kept in {out}" if
                  isinstance(e, NonFiniteError) else stop_report(p, config, out, live))
    except Exception:                # the report must never hide the original error
        report = f"what it wrote is kept in {out}; resume with: fedjax-dp run --resume {out}"
    e.fedjax_dp_stop = report        # the command line prints it as its one line
    e.add_note(report)
    return False


class _Live:
    """What a running :func:`_run` has done so far (read when it stops early)."""

    def __init__(self):
        self.history: list[dict] = []
        self.state: api.State | None = None       # the state after the last finished step
        self.total = 0
        self.non_finite: dict | None = None       # the first step with a non-finite loss/params


def stop_report(p: Plan, config: dict, out: Path, live: _Live) -> str:
    """The one line of a run that stopped after it started: the last finished and the last saved
    round, the epsilon spent by the finished rounds, and the command that resumes it."""
    last = len(live.history)
    saved = checkpoint_lib.latest(out)
    saved_step = checkpoint_lib.read_meta(saved)["step"] if saved is not None else 0
    parts = [f"stopped after round {last} of {live.total}"]
    parts.append(f"last checkpoint at round {saved_step}" if saved_step else
                 "no checkpoint yet (a resume starts over)")
    spent = _spent_config(p, last)
    if live.state is not None and spent is not None:
        eps = []
        for ledger in api.ledgers(p.entry, spent, live.state):
            for g in ledger.report(config["privacy"]["delta"], accountants=("rdp",)):
                e = g["epsilon"]
                e = "inf" if e is None or not math.isfinite(e) else f"{e:.4g}"
                eps.append(f"{g['unit']} eps={e}")
        if eps:
            parts.append(f"privacy spent by rounds 1-{last}: {', '.join(eps)} "
                         f"(RDP, delta={config['privacy']['delta']:.3g})")
    parts.append(f"progress kept in {out}; resume with: fedjax-dp run --resume {out}")
    return "; ".join(parts)


def epsilon_spent(p: Plan, config: dict, finished: int, state: api.State) -> dict[str, float]:
    """``{"epsilon/<unit>/<accountant>": epsilon}`` spent by the rounds 1..``finished`` of a
    round-based run whose state after them is ``state`` (each ledger reported at
    ``privacy.delta`` with RDP, or PLD where RDP does not apply, e.g. shuffle units); ``{}``
    where the steps are not rounds (:func:`_spent_config`). Side-by-side ledgers with one unit
    get ``_1``, ``_2``, ... suffixes."""
    spent = _spent_config(p, finished)
    if spent is None:
        return {}
    delta = config["privacy"]["delta"]
    rows = []
    for ledger in api.ledgers(p.entry, spent, state):
        try:
            rows += ledger.report(delta, accountants=("rdp",))
        except ValueError:                           # a unit only PLD applies to
            rows += ledger.report(delta, accountants=("pld",))
    return tracking_lib.epsilon_scalars(rows)


def _spent_config(p: Plan, finished: int):
    """The algorithm config whose ledger covers only the ``finished`` steps: a round-based
    algorithm's ``rounds`` cut to them (its ledger is a function of the rounds run); None where
    the steps are not rounds (a one-shot method releases nothing before its last phase)."""
    cfg = p.algorithm_config
    if finished < 1 or not hasattr(cfg, "rounds") or p.entry.num_steps(cfg) != cfg.rounds:
        return None
    try:
        return dataclasses.replace(cfg, rounds=finished)
    except (TypeError, ValueError):
        return None


@dataclasses.dataclass
class Setup:
    """A run's inputs, built from its resolved config: the data (partitioned and stacked, with the
    server's public split), the model, and the root key the algorithm is driven with."""

    dataset: data_lib.Dataset
    fed: FederatedData
    model: Any
    key: jax.Array                  # rng.stream(seed's root, "algorithm")
    x_val: Any = None               # [n_val, ...] held-out training records (validation_fraction)
    y_val: Any = None               # [n_val]

    def evaluate(self, output: api.Output) -> dict:
        """``test_accuracy`` (and ``val_accuracy`` with a validation split) of a model.

        A next-token task (:mod:`fedjax_dp.models.tasks`): per-token accuracies, counted over
        all test sequences and positions, ``test_accuracy`` over the real tokens (y != pad),
        ``test_accuracy_no_oov`` without the OOV ids, ``test_accuracy_no_oov_or_eos`` without
        OOV and EOS (TFF's StackOverflow metrics), and ``test_num_tokens``; ``val_`` likewise."""
        task = tasks.of(self.model)
        if isinstance(task, tasks.Classification) or output.accuracy is not None:
            out = {"test_accuracy": output.score(self.dataset.x_test, self.dataset.y_test)}
            if self.x_val is not None:
                out["val_accuracy"] = output.score(self.x_val, self.y_val)
            return out
        out = {}
        for split, x, y in (("test", self.dataset.x_test, self.dataset.y_test),
                            ("val", self.x_val, self.y_val)):
            if x is not None:
                metrics = task.metrics(output.predict_labels(x), y)
                out.update({f"{split}_{k}": v for k, v in metrics.items()})
        return out


def setup(config: dict, *, agents_on: str | None = None) -> Setup:
    """Load, partition and stack the data (:func:`population.build`) and build the model of a
    resolved config (the seed's root key drives the partition and the algorithm's key).
    ``agents_on``: in place of ``run.agents_on`` (:func:`agents_placement`)."""
    root = rng.as_key(config["seed"])
    if agents_on is not None and agents_on != config["run"]["agents_on"]:
        config = {**config, "run": {**config["run"], "agents_on": agents_on}}
    pop = population.build(config)     # streamed into the stacked agents, placed by agents_on
    check_delta(plan(config), agents=pop.agents.num_agents,   # N known, nothing trained yet
                records=int(np.asarray(pop.agents.counts).sum()))
    dataset = pop.dataset
    model = make_model(config["model"]["name"], tuple(dataset.feature_shape),
                       dataset.num_classes, hidden=tuple(config["model"]["hidden"]),
                       options=config["model"].get("options") or None)
    model = tasks.attach(model, getattr(dataset, "task", None))   # the data's task (loss, accuracy)
    fed = FederatedData(agents=pop.agents, num_classes=dataset.num_classes,
                        x_public=dataset.x_public, y_public=dataset.y_public)
    return Setup(dataset=dataset, fed=fed, model=model, key=rng.stream(root, "algorithm"),
                 x_val=pop.x_val, y_val=pop.y_val)


def _run(p: Plan, config: dict, out: Path | None, show: bool, restart: Path | None,
         live: _Live, tracker: tracking_lib.Tracker,
         group: processes.Group | None = None) -> dict:
    start = time.perf_counter()
    mesh = run_mesh(config, group)
    with compilation.CompileLog() as compiles:
        placed = agents_placement(config, mesh)
        s = setup(config) if placed == config["run"]["agents_on"] else \
            setup(config, agents_on=placed)
        stop.safe_point()            # a signal a callback swallowed during set-up stops here
        setup_s = time.perf_counter() - start
        done, history_so_far, seconds = _steps(p, config, out, show, restart, live, s, compiles,
                                               tracker, group=group, mesh=mesh)
        timing = {"setup_s": round(setup_s, 4), "round_s": seconds, **compiles.summary()}
        result = result_record(p, config, s, done.state, history_so_far, out,
                               time.perf_counter() - start, timing=timing,
                               non_finite=live.non_finite,
                               extra=processes_record(group, mesh, done.state))
    if tracker.enabled:
        tracker.finish(len(history_so_far), tracking_lib.final_scalars(result))
    if show:
        print(summary_line(config["algorithm"]["name"], result, out), file=sys.stderr)
    return result


def _steps(p: Plan, config: dict, out: Path | None, show: bool, restart: Path | None,
           live: _Live, s: "Setup", compiles: compilation.CompileLog,
           tracker: tracking_lib.Tracker | None = None, *,
           group: processes.Group | None = None, mesh=None):
    """Drive the algorithm's steps: progress, checkpoints, per-round seconds and compilations,
    the non-finite check, the tracker (every progress.jsonl record's scalars and the epsilon spent
    so far, :func:`epsilon_spent`). Returns ``(api.Result, history, seconds per round)``."""
    tracker = tracker if tracker is not None else tracking_lib.Trackers([])
    model, fed, key = s.model, s.fed, s.key
    steps_total = p.entry.num_steps(p.algorithm_config)
    live.total = steps_total
    compiles.last_step = steps_total
    hooks = api.hooks(p.entry)
    phases = hooks.PHASES                                 # one-shot: the steps are phases
    name = config["algorithm"]["name"]
    on_nonfinite = config["run"]["on_nonfinite"]

    reporter = progress_lib.bar(show)         # a live bar on a terminal, silent otherwise
    bar_task = None

    every = config["run"]["checkpoint_every"] if not phases else 0   # round-based runs only
    history_so_far = live.history
    seconds: list[float] = []
    clock = compilation.RoundClock()
    tracking = _Tracking(p.entry, compiles, clock, check_finite=not phases)

    def on_round(t: int, record: dict) -> None:
        stop.safe_point()            # a signal stops here, at a round (every process at once)
        state = tracking.state_at(t)
        live.state = state
        record_s = tracking.round_seconds(t, clock)
        seconds.append(round(record_s, 6))
        history_so_far.append(jsonable(record))
        bad = _non_finite(record, tracking.finite_at(t))
        if bad and live.non_finite is None:
            live.non_finite = {"round": t, "what": bad}
        if out is not None or tracker.enabled:
            line = dict(record, seconds=round(record_s, 6))
            new = compiles.take()
            if new:
                line["compilations"] = new
        if out is not None:
            append_progress(out, line)
        if every and t % every == 0 and t < steps_total and not bad and \
                (out is not None or group is not None):
            _checkpoint(p, config, out, state, history_so_far, group)
        if tracker.enabled:
            eps_every = config["run"].get("log_epsilon_every", 1)
            eps = (epsilon_spent(p, config, t, state) if eps_every and
                   (t % eps_every == 0 or t == steps_total) else {})
            tracker.log(t, {**tracking_lib.scalars(line), **eps})
        if bad and on_nonfinite == "stop":
            raise NonFiniteError(divergence_message(config, t, bad))
        if bar_task is not None:
            bar_task.set(**{k: v for k, v in record.items()
                            if k != "round" and isinstance(v, float)})
            bar_task.update(1)
        elif show:
            shown = " ".join(f"{k}={v:.4g}" for k, v in record.items()
                             if k != "round" and isinstance(v, float))
            what = hooks.step_label(p.algorithm_config, t)   # e.g. "phase 2/3 vote"
            print(f"[{name}] {what} {shown}", file=sys.stderr, flush=True)

    chunk = config["run"]["chunk_size"] or None          # 0 -> all agents at once
    evaluate = s.evaluate

    # run.eval_every evaluates the model between rounds; a one-shot method's phases before the
    # last have no model yet, so it is evaluated once, at the end
    eval_every = 0 if phases else config["run"]["eval_every"]
    with reporter.task(name, total=steps_total, unit="phase" if phases else "round") as bar_task:
        if not reporter.enabled:
            bar_task = None
        runtime = api.Runtime(chunk_size=chunk, progress=reporter, mesh=mesh,
                              rounds_per_call=config["run"].get("rounds_per_call", "auto"))
        start_state = None
        if tracker.enabled:
            tracker.start(jsonable(config))
        if restart is None and out is not None and (out / "progress.jsonl").exists() and \
                (out / "progress.jsonl").read_text():
            write_progress(out, [])                  # a resume without a checkpoint: over
        if restart is not None:
            fresh = p.entry.init(key, fed, model, p.algorithm_config, runtime)
            start_state, meta = checkpoint_lib.restore(restart, fresh, config,
                                                       hooks.checkpoint_types)
            history_so_far.extend(meta["history"])
            live.state = start_state
            if out is not None:
                write_progress(out, meta["history"])     # the rounds the checkpoint holds
            for record in meta["history"]:
                if tracker.enabled:        # logged by the interrupted process, if it tracked
                    tracker.log(record["round"], tracking_lib.scalars(record), restored=True)
            if bar_task is not None:
                bar_task.update(start_state.step)
        done = api.run(tracking, key, fed, model, p.algorithm_config,
                       runtime=runtime, evaluate=evaluate, eval_every=eval_every,
                       on_step=on_round, state=start_state, boundaries=(every,))
    return done, history_so_far, seconds


def _checkpoint(p: Plan, config: dict, out: Path | None, state: api.State, history: list,
                group: processes.Group | None) -> None:
    """Round ``state.step``'s checkpoint, written by the process holding ``out``; with several
    processes every one takes part in gathering the state (arrays split over processes are
    all-gathered: the same collective on every process), and only process 0 writes."""
    if group is not None:
        state = dataclasses.replace(state, values=processes.host_values(state.values))
    if out is not None:
        checkpoint_lib.save(out, state, config=config, history=history,
                            ledgers=[lg.to_json() for lg in
                                     api.ledgers(p.entry, p.algorithm_config, state)])


def run_mesh(config: dict, group: processes.Group | None):
    """``run.mesh``'s ``agents`` mesh (:func:`fedjax_dp.core.agent_mesh`: every device of every
    process), or None: ``"auto"`` is all devices when the run has several processes."""
    choice = config["run"].get("mesh", "auto")
    if choice == "none" or (choice == "auto" and group is None):
        return None
    from fedjax_dp.core import agent_mesh
    return agent_mesh()


def agents_placement(config: dict, mesh) -> str:
    """``run.agents_on``, except over a mesh of several processes: host rows (numpy or memory
    mapped), of which each process reads and transfers only its own devices' agents."""
    on = config["run"]["agents_on"]
    if mesh is None or len({d.process_index for d in mesh.devices.flat}) == 1:
        return on
    if on == "device":
        raise config_lib.ConfigError(
            "run.agents_on = \"device\" holds every agent on each process's first device; with "
            "several processes use \"host\" or \"auto\" (each process then reads only its own "
            "devices' agents)")
    return "host"


def processes_record(group: processes.Group | None, mesh, state: api.State | None = None
                     ) -> dict:
    """result.json's ``processes``: the job's size, the mesh the agents were split over and,
    where the family counts them, how many agents each process trained (``agents_per_process``:
    each agent on exactly one process, so they sum to N)."""
    if group is None and mesh is None:
        return {}
    record = {"count": jax.process_count(), "local_devices": jax.local_device_count(),
              "mesh_devices": 0 if mesh is None else int(mesh.devices.size),
              "cluster": None if group is None else group.spec.cluster}
    values = state.values if state is not None and isinstance(state.values, dict) else {}
    for name in ("agents_per_process", "student_agents_per_process"):
        got = values.get(name, getattr(getattr(state, "context", None), name, None))
        if got is not None:
            record[name] = [int(c) for c in np.asarray(got).reshape(-1)]
    return {"processes": record}


class NonFiniteError(ValueError):
    """Training diverged: a loss or the parameters became NaN or infinite."""


def _non_finite(record: dict, params_finite: bool | None) -> str:
    """What is not finite in a finished step: its loss metrics and / or the parameters."""
    bad = [k for k, v in record.items() if "loss" in k and isinstance(v, float)
           and not math.isfinite(v)]
    if params_finite is False:
        bad.append("parameters")
    return ", ".join(bad)


def divergence_message(config: dict, t: int, what: str) -> str:
    """One line: the round where training diverged and the parameters that usually cause it."""
    tr, algo = config["train"], config["algorithm"]
    number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)   # noqa: E731
    opt = tr.get("optimizer")
    drivers = ([f"train.optimizer.learning_rate ({opt['learning_rate']:g})"]
               if isinstance(opt, dict) and number(opt.get("learning_rate")) else
               [f"train.learning_rate ({tr['learning_rate']:g})"])
    for k in ("server_lr", "learning_rate", "step_size"):
        if number(algo.get(k)):
            drivers.append(f"algorithm.{k} ({algo[k]:g})")
    server = algo.get("server_optimizer")
    if isinstance(server, dict) and number(server.get("learning_rate")):
        drivers.append(f"algorithm.server_optimizer.learning_rate ({server['learning_rate']:g})")
    return (f"training diverged at round {t}: {what} not finite; lower "
            f"{' or '.join(drivers)} (set run.on_nonfinite = \"continue\" to finish the run "
            f"anyway, marked non-finite)")


def result_record(p: Plan, config: dict, s: Setup, state: api.State, history: list[dict],
                  out: Path | None, wall_time_s: float, *, timing: dict | None = None,
                  non_finite: dict | None = None, extra: dict | None = None) -> dict:
    """The ``result.json`` record of a finished run (written to ``out`` when given): the final
    model's test accuracy, every ledger's guarantees, the history, versions."""
    output = p.entry.output(state)
    scores = s.evaluate(output)
    test_acc = scores["test_accuracy"]
    ledgers = api.ledgers(p.entry, p.algorithm_config, state)
    extra_fields = api.hooks(p.entry).artifacts(state, out, config) or {}   # extra files, fields
    delta = config["privacy"]["delta"]
    from fedjax_dp.privacy.ledger import coverage
    privacy = []
    for ledger in ledgers:                                  # reported side by side, not composed
        privacy += ledger.report(delta, accountants=tuple(config["privacy"]["accountants"]))
    # a release one ledger does not cover (e.g. a data-dependent epsilon) is in the same
    # result.json as every other ledger's guarantee: none of them covers it
    uncovered = [u for ledger in ledgers for u in ledger.uncovered]
    for g in privacy:
        g.update(coverage(uncovered))
    result = {
        "algorithm": config["algorithm"]["name"],
        "dataset": s.dataset.name,
        "num_agents": s.fed.num_agents,
        "test_accuracy": test_acc,
        **({"val_accuracy": scores["val_accuracy"]} if "val_accuracy" in scores else {}),
        # a next-token task's other per-token metrics (test_accuracy_no_oov, ...; none otherwise)
        **{k: v for k, v in scores.items() if k not in ("test_accuracy", "val_accuracy")},
        "privacy": privacy,
        "wall_time_s": wall_time_s,
        "seed": config["seed"],
        "config": config,
        **({"config_source": p.config_source} if p.config_source is not None else {}),
        "versions": versions(),
        "devices": [str(dv) for dv in jax.devices()],
        "history": history,
    }
    if non_finite is not None:        # run.on_nonfinite = "continue": finished, but diverged
        result["non_finite"] = non_finite
    if timing is not None:
        result["timing"] = timing
    result.update(extra or {})
    result.update({k: v for k, v in extra_fields.items() if k not in result})
    result = jsonable(result)
    if out is not None:
        stop.check()                 # a recorded signal stops the run before its result
        with stop.deferred():        # whole or not at all; a signal during it waits for it
            files.write_json(out / "result.json", result, allow_nan=False)
    return result


def run_seeds(configs: list[dict], *, progress: bool = False) -> list[dict] | None:
    """Runs of resolved configs that differ only in ``seed``, all seeds of each step in ONE
    vmapped compiled call (:func:`fedjax_dp.algorithms.seeds.run_seeds`); the result records equal :func:`run`'s for
    each config (to float tolerance; ``vmapped_seeds`` gives S, ``wall_time_s`` the batch's
    time / S). Returns None when the algorithm or the seeds' data do not allow it (run them one
    by one). Nothing is written: a sweep stores the records."""
    if not configs:
        raise ValueError("configs must hold at least one config")
    strip = [{k: v for k, v in c.items() if k != "seed"} for c in configs]
    if any(json.dumps(c, sort_keys=True) != json.dumps(strip[0], sort_keys=True)
           for c in strip[1:]):
        raise ValueError("run_seeds: the configs must differ only in seed")
    p = plan(configs[0])
    if not seeds_lib.can_vmap_seeds(p.entry):
        return None
    phases = api.hooks(p.entry).PHASES            # one-shot: evaluated once, at the end
    start = time.perf_counter()
    setups = [setup(c) for c in configs]
    config = configs[0]
    model = setups[0].model

    def evaluate(output, s):
        return setups[s].evaluate(output)

    reporter = progress_lib.bar(progress)
    steps_total = p.entry.num_steps(p.algorithm_config)
    name = config["algorithm"]["name"]
    with reporter.task(f"{name} x{len(configs)} seeds", total=steps_total, unit="phase" if phases else "round") as task:
        runtime = api.Runtime(chunk_size=config["run"]["chunk_size"] or None, progress=reporter)
        done = seeds_lib.run_seeds(p.entry, [s.key for s in setups], [s.fed for s in setups], model,
                             p.algorithm_config, runtime=runtime, evaluate=evaluate,
                             eval_every=0 if phases else config["run"]["eval_every"],
                             on_step=lambda t, records: task.update(1))
    if done is None:
        return None
    wall = (time.perf_counter() - start) / len(configs)
    results = []
    for c, s, r in zip(configs, setups, done):
        rec = result_record(p, c, s, r.state, [jsonable(h) for h in r.history], None, wall)
        rec["vmapped_seeds"] = len(configs)
        results.append(rec)
    return results


class _Tracking:
    """``algorithm`` whose ``step`` also keeps the states of the last two steps (the runner
    records step t once step t + 1 is dispatched, and checkpoints take step t's state), tells
    the compile log which step is being dispatched, and (``check_finite``) computes, without
    waiting for it, whether the new state's floating-point values are all finite."""

    def __init__(self, algorithm, compiles: compilation.CompileLog,
                 clock: compilation.RoundClock, check_finite: bool):
        self._algorithm, self._compiles, self._clock = algorithm, compiles, clock
        self._check_finite = check_finite
        self._states: dict[int, tuple[api.State, Any]] = {}     # call's last step -> state
        self._calls: dict[int, int] = {}         # call's last step -> its first step
        self._share = 0.0                        # seconds per step of the call being recorded
        if getattr(algorithm, "multi_step", None) is not None:
            self.multi_step = self._multi_step   # hooks() sees it only where the algorithm has it

    def __getattr__(self, name):
        return getattr(self._algorithm, name)

    def _keep(self, first: int, state) -> None:
        """The state after a call of steps ``first+1 .. state.step`` (1-based), and whether its
        parameters are finite (a device scalar, not waited for)."""
        finite = None
        if self._check_finite:                   # the model's parameters, when it has them
            params = getattr(self._algorithm.output(state), "params", None)
            finite = None if params is None else _all_finite(params)
        self._states[state.step] = (state, finite)
        self._calls[state.step] = first + 1
        for old in sorted(self._states)[:-2]:
            del self._states[old]
            del self._calls[old]

    def step(self, state, key):
        self._clock.start()
        self._compiles.step = state.step + 1
        first = state.step
        state, metrics = self._algorithm.step(state, key)
        self._keep(first, state)
        return state, metrics

    def _multi_step(self, state, key, start, count):
        self._clock.start()
        self._compiles.step = state.step + 1
        state, metrics = self._algorithm.multi_step(state, key, start, count)
        self._keep(start, state)
        return state, metrics

    def _end(self, t: int) -> int:
        """The last step of the call that ran step ``t``."""
        return min(end for end in self._states if end >= t)

    def state_at(self, t: int) -> api.State:
        """The state after step ``t`` where a call ended there (checkpoints and evaluations
        land on call boundaries), else after the call that ran it."""
        return self._states[self._end(t)][0]

    def finite_at(self, t: int) -> bool | None:
        """Whether the parameters after step ``t``'s call are finite (None: not checked, or
        ``t`` is not the call's last step)."""
        end = self._end(t)
        finite = self._states[end][1]
        return None if finite is None or end != t else bool(finite)

    def round_seconds(self, t: int, clock: compilation.RoundClock) -> float:
        """Step ``t``'s share of the wall time: the time since the previous call's records,
        spread evenly over the steps of ``t``'s call."""
        end = self._end(t)
        first = self._calls[end]
        if t == first:
            self._share = clock.lap() / (end - first + 1)
        return self._share


@jax.jit
def _all_finite_jit(leaves):
    import jax.numpy as jnp
    out = jnp.bool_(True)
    for x in leaves:
        out = out & jnp.all(jnp.isfinite(x))
    return out


def _all_finite(values) -> Any:
    """A device scalar: every floating-point array of ``values`` is finite (None: none)."""
    leaves = [x for x in jax.tree.leaves(values)
              if isinstance(x, jax.Array) and jax.numpy.issubdtype(x.dtype, jax.numpy.floating)]
    return _all_finite_jit(leaves) if leaves else None
