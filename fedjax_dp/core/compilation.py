"""Where a run's time goes to compilation, and JAX's persistent compilation cache for the CLI.

:class:`CompileLog` listens to JAX's monitoring events while a run is active: every XLA
compilation (with the jitted function's name) and whether it was served from the persistent
cache. Compilations of at least :data:`LISTED_S` seconds are listed one by one; the rest are
counted. The runner writes the list into ``progress.jsonl`` and ``result.json`` (``timing``).

:func:`enable_cache` turns on JAX's persistent compilation cache (``run.compilation_cache``:
``"user"``, :func:`default_cache_dir`; ``"off"``; or a folder). It changes how fast a run
starts, never what it computes.

:func:`release_compiled` keeps a long-lived process clear of the kernel's limit on memory
mappings: XLA:CPU maps every compiled kernel as pages of its own, JAX keeps every compiled
program while its function lives, and past ``/proc/sys/vm/max_map_count`` mappings the next
compilation dies in native code (``LLVM compilation error: Cannot allocate memory``, then
SIGSEGV / SIGABRT; docs/runs.md). Entering the outermost :class:`CompileLog` calls it.
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import jax

#: compilations at least this long are listed one by one in progress.jsonl / result.json
LISTED_S = 0.05
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_HIT_EVENT = "/jax/compilation_cache/cache_hits"
_MISS_EVENT = "/jax/compilation_cache/cache_misses"

_active: list["CompileLog"] = []          # logs listening now (innermost last)
_local = threading.local()                # per thread: was the compilation in flight a hit?
_registered = False
_lock = threading.Lock()


def _on_event(event: str, **_: Any) -> None:
    if event == _HIT_EVENT:
        _local.hit = True
    elif event == _MISS_EVENT:
        _local.hit = False


def _on_duration(event: str, duration: float, **kwargs: Any) -> None:
    if event != _COMPILE_EVENT or not _active:
        return
    hit = bool(getattr(_local, "hit", False))
    _local.hit = False
    for log in list(_active):
        log._record(str(kwargs.get("fun_name", "?")), float(duration), hit)


def _register() -> None:
    global _registered
    with _lock:
        if not _registered:
            jax.monitoring.register_event_listener(_on_event)
            jax.monitoring.register_event_duration_secs_listener(_on_duration)
            _registered = True


class CompileLog:
    """Compilations while active (``with CompileLog() as log:``).

    ``log.step`` is the step being dispatched (set by the runner), so every listed compilation
    names the round it delayed; :meth:`take` returns (and forgets) the listed compilations made
    since the last call; :meth:`summary` gives the totals."""

    def __init__(self):
        self.step = 0
        self.last_step: int | None = None      # the run's last step (set by the runner)
        self.listed: list[dict] = []           # every compilation >= LISTED_S, in order
        self.by_step: dict[int, int] = {}      # step being dispatched -> compilations
        self.count = 0
        self.seconds = 0.0
        self.hits = 0
        self._new: list[dict] = []
        self._lock = threading.Lock()

    def _record(self, what: str, seconds: float, hit: bool) -> None:
        with self._lock:
            self.count += 1
            self.by_step[self.step] = self.by_step.get(self.step, 0) + 1
            self.seconds += seconds
            self.hits += hit
            if seconds >= LISTED_S:
                entry = {"what": what, "seconds": round(seconds, 4), "cache_hit": hit,
                         "step": self.step}
                self.listed.append(entry)
                self._new.append(entry)

    def take(self) -> list[dict]:
        with self._lock:
            new, self._new = self._new, []
        return new

    def after_first_call(self) -> int:
        """Compilations while steps after the first dispatched one ran, up to ``last_step``."""
        steps = sorted(s for s in self.by_step if s >= 1 and
                       (self.last_step is None or s <= self.last_step))
        return sum(self.by_step[s] for s in steps[1:])

    def summary(self) -> dict:
        return {"compilations": self.count, "compile_s": round(self.seconds, 4),
                "cache_hits": self.hits,
                "compilations_after_first_call": self.after_first_call(),
                "listed": list(self.listed)}

    def __enter__(self) -> "CompileLog":
        _register()
        if not _active:                    # a run starting: nothing of another run in flight
            release_compiled()
        _active.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _active.remove(self)


class RoundClock:
    """Wall seconds per step as seen by the host: the time between consecutive finished steps
    (the first from :meth:`start`). With steps dispatched ahead of their records, this is each
    step's share of the run's time in steady state."""

    def __init__(self):
        self._last: float | None = None

    def start(self) -> None:
        if self._last is None:
            self._last = time.perf_counter()

    def lap(self) -> float:
        now = time.perf_counter()
        last = now if self._last is None else self._last
        self._last = now
        return now - last


def default_cache_dir() -> Path:
    """``$FEDJAX_DP_CACHE_DIR``, else JAX's own ``$JAX_COMPILATION_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/fedjax_dp/jax``, else ``~/.cache/fedjax_dp/jax``."""
    for var in ("FEDJAX_DP_CACHE_DIR", "JAX_COMPILATION_CACHE_DIR"):
        if os.environ.get(var):
            return Path(os.environ[var]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "fedjax_dp" / "jax"


def cache_dir(setting: str) -> Path | None:
    """The folder of ``run.compilation_cache`` (``"user"``, ``"off"`` or a folder), or None."""
    if not isinstance(setting, str) or not setting.strip():
        raise ValueError(f"compilation cache must be \"user\", \"off\" or a folder, got "
                         f"{setting!r}")
    if setting == "off":
        return None
    return default_cache_dir() if setting == "user" else Path(setting).expanduser().absolute()


def enable_cache(setting: str) -> Path | None:
    """Turn on JAX's persistent compilation cache in ``cache_dir(setting)`` for this process
    (every compilation cached, however short); returns the folder (None: ``"off"``). A folder
    that cannot be created leaves the cache off (a run never fails for its cache)."""
    folder = cache_dir(setting)
    if folder is None:
        return None
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return folder


#: a process holding more than this share of the kernel's memory-mapping limit releases JAX's
#: compiled programs (:func:`release_compiled`); the rest is headroom for the run that starts
MAP_SHARE = 0.5


def memory_maps() -> tuple[int, int] | None:
    """``(mappings this process holds, the kernel's limit vm.max_map_count)``; None where the
    system has no such files (not Linux)."""
    try:
        with open("/proc/sys/vm/max_map_count", "rb") as f:
            limit = int(f.read())
        with open("/proc/self/maps", "rb") as f:
            held = f.read().count(b"\n")
    except (OSError, ValueError):
        return None
    return held, limit


def release_compiled(share: float | None = None) -> bool:
    """Drop JAX's in-memory compiled programs (``jax.clear_caches()``) when this process holds
    more than ``share`` (default :data:`MAP_SHARE`) of the kernel's memory-mapping limit (module
    doc); returns whether it did. Results never change. Call it between runs, never while a run
    computes on another thread."""
    maps = memory_maps()
    if maps is None or maps[0] <= (MAP_SHARE if share is None else share) * maps[1]:
        return False
    import gc
    jax.clear_caches()
    gc.collect()
    return True
