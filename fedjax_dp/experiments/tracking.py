"""Experiment tracking: TensorBoard event files (tensorboardX) and Weights & Biases.

``run.log = ["tensorboard", "wandb"]`` (default ``[]``: neither) makes :func:`runner.run
<fedjax_dp.experiments.runner.run>` and the sweep log, per finished round ``t`` (the step),
every metric of the round's ``progress.jsonl`` record (:func:`scalars`) and the epsilon spent by
rounds 1..t; once, the resolved config; at the end, the scalars of ``result.json``
(:func:`final_scalars`). Tags, names and when each is logged: docs/tracking.md ("What is
logged"; "Resume").

Where: ``<run folder>/tensorboard/`` (a sweep's runs: ``OUT/runs/<label>/tensorboard/``). A new
run removes the event files its folder already holds. A run resumed from its checkpoint of round
k opens a new file that starts with TensorBoard's purge marker at step k + 1 (no step twice, none
lost); a resumed W&B run continues the same W&B run (its id is kept in
``<run folder>/tracking.json``). The W&B backend imports ``wandb`` only when asked for."""
from __future__ import annotations

import json
import math
import re
import secrets
import struct
from pathlib import Path
from typing import Any, Iterable, Protocol

from fedjax_dp.experiments import config as config_lib

#: the backends ``run.log`` may name, and the extra that installs each
EXTRAS = {"tensorboard": "tensorboard", "wandb": "wandb"}
_MODULES = {"tensorboard": "tensorboardX", "wandb": "wandb"}
FOLDER = "tensorboard"          # a run folder's event folder
STATE_FILE = "tracking.json"    # the W&B run id, so a resumed run continues it
_LIST_MAX = 16                  # lists of up to this many numbers are logged element by element


def check_available(backends: list[str]) -> None:
    """Raise :class:`~fedjax_dp.experiments.config.ConfigError` naming the extra to install when a
    backend of ``run.log`` is missing (checked before any work)."""
    import importlib
    for b in backends:
        try:
            importlib.import_module(_MODULES[b])
        except ImportError:
            raise config_lib.ConfigError(
                f"run.log asks for {b!r} but {_MODULES[b]} is not installed: "
                f"pip install 'fedjax-dp[{EXTRAS[b]}]' (or remove {b!r} from run.log)") from None


# ----------------------------------------------------------------------------- what is logged

def _number(v: Any) -> float | None:
    if hasattr(v, "item") and getattr(v, "ndim", 1) == 0:
        v = v.item()
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return float(v)
    return None


def scalars(record: dict, prefix: str = "") -> dict[str, float]:
    """The loggable numbers of a ``progress.jsonl`` record, by tag (``round`` is the step, not a
    scalar). Numbers and booleans as floats (NaN / inf kept: ``progress.jsonl`` writes them as
    null); a dict as ``key/sub``; a list of at most 16 numbers as ``key/i``; ``compilations`` (a
    list of ``{"what", "seconds", ...}``) as ``compilations/count`` and ``compilations/seconds``."""
    out: dict[str, float] = {}
    for k, v in record.items():
        if not prefix and k == "round":
            continue
        tag = f"{prefix}{k}"
        x = _number(v)
        if x is not None:
            out[tag] = x
        elif isinstance(v, dict):
            out.update(scalars(v, prefix=f"{tag}/"))
        elif k == "compilations" and isinstance(v, list):
            out[f"{tag}/count"] = float(len(v))
            out[f"{tag}/seconds"] = float(sum(c.get("seconds", 0.0) for c in v
                                              if isinstance(c, dict)))
        elif isinstance(v, (list, tuple)) and len(v) <= _LIST_MAX:
            nums = [_number(u) for u in v]
            if all(n is not None for n in nums):
                out.update({f"{tag}/{i}": n for i, n in enumerate(nums)})
    return out


def final_scalars(result: dict) -> dict[str, float]:
    """The scalars of a ``result.json`` record: every top-level number but ``seed``
    (``final/test_accuracy``, ``final/val_accuracy``, ``final/wall_time_s``, ...), the numbers of
    ``timing`` (``final/timing/setup_s``, ...) and ``final/epsilon/<unit>/<accountant>`` per
    guarantee (inf where ``result.json`` has null)."""
    out = {}
    for k, v in result.items():
        x = _number(v)
        if x is not None and k != "seed":
            out[f"final/{k}"] = x
    for k, v in (result.get("timing") or {}).items():
        x = _number(v)
        if x is not None:
            out[f"final/timing/{k}"] = x
    return epsilon_scalars(result.get("privacy", []), "final/epsilon", out)


def epsilon_scalars(rows: Iterable[dict], prefix: str = "epsilon",
                    out: dict[str, float] | None = None) -> dict[str, float]:
    """``out`` (default ``{}``) plus ``<prefix>/<unit>/<accountant>: epsilon`` per guarantee row
    (inf for None); a tag met again (side-by-side ledgers with one unit) gets a ``_1``, ``_2``,
    ... suffix."""
    out = {} if out is None else out
    for g in rows:
        base = f"{prefix}/{g['unit']}/{g['accountant']}"
        tag, i = base, 1
        while tag in out:
            tag, i = f"{base}_{i}", i + 1
        eps = g.get("epsilon")
        out[tag] = math.inf if eps is None else float(eps)
    return out


def flat_config(config: dict, prefix: str = "") -> dict[str, str | float | bool]:
    """The resolved config as dotted keys (``algorithm.rounds``) -> a number, a boolean or a
    string (lists and empty tables as their JSON): TensorBoard's hparams."""
    out: dict[str, str | float | bool] = {}
    for k, v in config.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flat_config(v, prefix=f"{key}."))
        elif isinstance(v, (bool, str)):
            out[key] = v
        elif isinstance(v, (int, float)):
            out[key] = float(v)
        else:
            out[key] = json.dumps(v)
    return out


# ----------------------------------------------------------------------------- backends

class Tracker(Protocol):
    """Where a run's metrics go. ``enabled``: False for ``Trackers([])`` (the runner then
    computes nothing extra, such as the per-round epsilon)."""

    enabled: bool

    def start(self, config: dict) -> None:
        """The resolved config (once, before the first round)."""

    def log(self, step: int, metrics: dict[str, float], *, restored: bool = False) -> None:
        """Round ``step``'s scalars; ``restored``: a round of the checkpoint a resumed run
        starts from (already logged by the interrupted process)."""

    def finish(self, step: int, metrics: dict[str, float]) -> None:
        """The final scalars (:func:`final_scalars`) at the last round's step."""

    def close(self) -> None:
        """Flush and release files / connections (also after an error)."""


class TensorBoardTracker:
    """TensorBoard event files in ``folder`` through tensorboardX's ``SummaryWriter`` (flushed
    after every round).

    ``purge_step=None`` (a new run): event files already in ``folder`` are removed.
    ``purge_step=k + 1`` (a run resumed from its checkpoint of round k): the new file starts with
    TensorBoard's purge marker (module docstring); the checkpoint's rounds (``restored``) are
    logged again only if the folder held no events."""

    enabled = True

    def __init__(self, folder: str | Path, *, purge_step: int | None = None):
        from tensorboardX import SummaryWriter
        self.folder = Path(folder)
        old = sorted(self.folder.glob("events.out.tfevents.*")) if self.folder.is_dir() else []
        if purge_step is None:
            for f in old:
                f.unlink()
            old = []
        self._continuing = bool(old)
        self._config: dict = {}
        # file names are events.out.tfevents.<unix second>.<host><suffix>, read in name order:
        # the suffix keeps a file opened within the same second as the last apart, and after it
        self._writer = SummaryWriter(str(self.folder), purge_step=purge_step if old else None,
                                     flush_secs=10, filename_suffix=f".{len(old):04d}")

    def start(self, config: dict) -> None:
        self._config = config
        if self._continuing:
            return                               # the interrupted process logged it
        text = json.dumps(config, indent=2, sort_keys=True, default=str)
        # markdown: an indented block shows the JSON verbatim
        self._writer.add_text("config", "\n".join("    " + line for line in text.splitlines()),
                              global_step=0)
        self._writer.flush()

    def log(self, step: int, metrics: dict[str, float], *, restored: bool = False) -> None:
        if restored and self._continuing:
            return
        for tag, value in metrics.items():
            self._writer.add_scalar(tag, value, global_step=step)
        self._writer.flush()

    def finish(self, step: int, metrics: dict[str, float]) -> None:
        from tensorboardX.summary import hparams
        for tag, value in metrics.items():
            self._writer.add_scalar(tag, value, global_step=step)
        # the hparams plugin: this run's flat config beside its final scalars (in this folder)
        exp, ssi, sei = hparams(flat_config(self._config),
                                {k: v for k, v in metrics.items() if math.isfinite(v)})
        for summary in (exp, ssi, sei):
            self._writer.file_writer.add_summary(summary, global_step=step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


#: tracking.json holds a run id: at most this long
MAX_STATE_BYTES = 1 << 16


def read_state(folder: str | Path) -> dict:
    """``folder/tracking.json`` (``{}`` when there is none), read as data: a regular file inside
    ``folder``, a small JSON object whose ``wandb_id`` (when present) is a W&B run id (letters,
    digits, ``-`` and ``_``); anything else is refused with one line naming the file."""
    from fedjax_dp.core import files
    path = Path(folder) / STATE_FILE
    if not path.exists() and not path.is_symlink():
        return {}
    state = files.read_json(path, max_bytes=MAX_STATE_BYTES, max_depth=4, root=folder,
                            what="tracking.json", expect=dict)
    rid = state.get("wandb_id")
    if rid is not None and not (isinstance(rid, str) and re.fullmatch(r"[A-Za-z0-9_-]{1,128}",
                                                                      rid)):
        raise files.UntrustedFileError(f"tracking.json {str(path)!r}: wandb_id {rid!r} is not "
                                       f"a W&B run id")
    return state


class WandbTracker:
    """A Weights & Biases run (``wandb.init(project=run.wandb_project, config=resolved config,
    dir=folder, name=..., group=..., id=..., resume="allow")``), scalars logged with
    ``step=round``. The run id is kept in ``folder/tracking.json``; ``resume=True`` continues
    that run (W&B keeps only increasing steps, so the rounds of the checkpoint are not sent
    again). ``wandb`` is imported here, not when this module is."""

    enabled = True

    def __init__(self, folder: str | Path, *, project: str, name: str | None = None,
                 group: str | None = None, resume: bool = False):
        import wandb
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        state = read_state(self.folder)
        run_id = state.get("wandb_id") if resume else None
        self._continuing = run_id is not None
        if run_id is None:
            from fedjax_dp.core import files
            run_id = secrets.token_hex(8)
            files.write_json(self.folder / STATE_FILE, {**state, "wandb_id": run_id},
                             indent=None)
        self._wandb = wandb
        self._init = dict(project=project, dir=str(self.folder), name=name, group=group,
                          id=run_id, resume="allow")
        self._run = None

    def start(self, config: dict) -> None:
        self._run = self._wandb.init(config=config, **self._init)

    def log(self, step: int, metrics: dict[str, float], *, restored: bool = False) -> None:
        if not (restored and self._continuing):       # W&B has the checkpoint's rounds
            self._run.log(dict(metrics), step=step)

    def finish(self, step: int, metrics: dict[str, float]) -> None:
        self._run.log(dict(metrics), step=step)
        self._run.summary.update(dict(metrics))

    def close(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None


class Trackers:
    """Several trackers as one (each call goes to every one, in order); ``Trackers([])`` logs
    nothing (``run.log = []``), ``enabled`` False."""

    def __init__(self, trackers: list):
        self.trackers = list(trackers)
        self.enabled = any(t.enabled for t in self.trackers)

    def start(self, config: dict) -> None:
        for t in self.trackers:
            t.start(config)

    def log(self, step: int, metrics: dict[str, float], *, restored: bool = False) -> None:
        for t in self.trackers:
            t.log(step, metrics, restored=restored)

    def finish(self, step: int, metrics: dict[str, float]) -> None:
        for t in self.trackers:
            t.finish(step, metrics)

    def close(self) -> None:
        errors = []
        for t in self.trackers:
            try:
                t.close()
            except Exception as e:          # close the others all the same
                errors.append(e)
        if errors:
            raise errors[0]


def open_run(config: dict, folder: str | Path | None, *, restart_step: int | None = None,
             name: str | None = None, group: str | None = None) -> Tracker:
    """The tracker ``config["run"]["log"]`` asks for, writing under the run folder ``folder``
    (events in ``folder/tensorboard``, W&B's files in ``folder``); ``Trackers([])`` when
    ``run.log`` is empty. ``restart_step=k``: the run resumes from its checkpoint of round k
    (TensorBoard purges from k + 1; the W&B run kept in ``folder`` is continued)."""
    backends = config["run"].get("log", [])
    if not backends:
        return Trackers([])
    if folder is None:
        raise config_lib.ConfigError(f"run.log = {backends!r} needs the run's folder "
                                     f"(--out DIR; runner.run(config, out_dir))")
    check_available(backends)
    folder = Path(folder)
    out = []
    try:
        for b in backends:
            if b == "tensorboard":
                out.append(TensorBoardTracker(
                    folder / FOLDER, purge_step=None if restart_step is None else
                    restart_step + 1))
            else:
                out.append(WandbTracker(folder, project=config["run"]["wandb_project"],
                                        name=name or folder.name, group=group,
                                        resume=restart_step is not None))
    except BaseException:
        Trackers(out).close()
        raise
    return Trackers(out)


def remove(folder: str | Path) -> None:
    """Remove what :func:`open_run` wrote in a run folder (a run that failed before its first
    round leaves nothing behind): the event folder and the W&B run id."""
    import shutil
    folder = Path(folder)
    shutil.rmtree(folder / FOLDER, ignore_errors=True)
    (folder / STATE_FILE).unlink(missing_ok=True)


def log_result(tracker: Tracker, config: dict, result: dict) -> None:
    """Log a finished run's ``result.json`` record after the fact (a sweep's vmapped seeds):
    the config, every history record (with its round's seconds where the result has
    ``timing.round_s``) and the final scalars. The per-round epsilon is not logged this way (it
    needs each round's state)."""
    tracker.start(config)
    seconds = (result.get("timing") or {}).get("round_s") or []
    step = 0
    for i, record in enumerate(result.get("history", [])):
        step = int(record.get("round", i + 1))
        line = dict(record, seconds=seconds[i]) if i < len(seconds) else record
        tracker.log(step, scalars(line))
    tracker.finish(step, final_scalars(result))


_LABEL_BAD = re.compile(r"[^A-Za-z0-9._=+-]+")


def label(*parts: Any, limit: int = 120) -> str:
    """A folder / run name from ``parts`` (characters other than letters, digits and ``._=+-``
    become ``_``; at most ``limit`` characters)."""
    text = "-".join(_LABEL_BAD.sub("_", str(p)).strip("_") for p in parts if p not in ("", None))
    return text[:limit] or "run"


# ----------------------------------------------------------------------------- reading back

def read_events(folder: str | Path) -> list:
    """Every ``Event`` proto of the event files in ``folder`` (file name order = write order),
    read from the TFRecord framing (u64 length, masked CRC-32C of it, data, masked CRC-32C of
    the data; a record whose CRC does not match raises ``ValueError``)."""
    from tensorboardX.proto.event_pb2 import Event
    from tensorboardX.record_writer import masked_crc32c
    events = []
    for path in sorted(Path(folder).glob("events.out.tfevents.*")):
        raw = path.read_bytes()
        pos = 0
        while pos + 12 <= len(raw):
            header = raw[pos:pos + 8]
            (n,) = struct.unpack("<Q", header)
            (crc,) = struct.unpack("<I", raw[pos + 8:pos + 12])
            data = raw[pos + 12:pos + 12 + n]
            if crc != masked_crc32c(header) or len(data) < n or \
                    struct.unpack("<I", raw[pos + 12 + n:pos + 16 + n])[0] != masked_crc32c(data):
                raise ValueError(f"{path}: a damaged record at byte {pos}")
            events.append(Event.FromString(data))
            pos += 16 + n
    return events


def read_scalars(folder: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Tag -> ``[(step, value), ...]`` of the scalars in ``folder``'s event files, as TensorBoard
    reads them: a session-start (purge) marker at step s drops the earlier values at steps >= s."""
    from tensorboardX.proto.event_pb2 import SessionLog
    out: dict[str, list[tuple[int, float]]] = {}
    for e in read_events(folder):
        if e.HasField("session_log") and e.session_log.status == SessionLog.START:
            out = {k: [(s, v) for s, v in vals if s < e.step] for k, vals in out.items()}
            continue
        if e.HasField("summary"):
            for v in e.summary.value:
                if v.HasField("simple_value"):
                    out.setdefault(v.tag, []).append((int(e.step), float(v.simple_value)))
    return out


def read_texts(folder: str | Path) -> dict[str, list[str]]:
    """Tag -> the text summaries (``add_text``) in ``folder``'s event files."""
    out: dict[str, list[str]] = {}
    for e in read_events(folder):
        if e.HasField("summary"):
            for v in e.summary.value:
                if v.metadata.plugin_data.plugin_name == "text":
                    out.setdefault(v.tag.split("/")[0], []).append(
                        b"".join(v.tensor.string_val).decode())
    return out
