"""Progress of long computations (rounds, agent chunks, query blocks): a tiny reporting interface.

Algorithms report through the :class:`Progress` they are given (``api.Runtime.progress``); the
default, :data:`SILENT`, does nothing, so library code never prints. The command line passes
:func:`bar` (a tqdm bar with rate and ETA on a terminal; nothing under ``--quiet``, when standard
error is not a terminal, or when the ``CI`` environment variable is set)::

    with runtime.progress.task("local training", total=num_chunks, unit="chunk") as task:
        for chunk in ...:
            ...
            task.update(1)
"""
from __future__ import annotations

import contextlib
import os
import sys
from typing import Callable, Iterator


class Task:
    """One progress bar: ``update(n)`` after each unit of work, ``set(**metrics)`` to show values."""

    def update(self, n: int = 1) -> None:
        pass

    def set(self, **values) -> None:
        pass


class Progress:
    """Reports nothing (the library default)."""

    enabled = False

    @contextlib.contextmanager
    def task(self, name: str, total: int | None = None, unit: str = "it") -> Iterator[Task]:
        yield Task()


SILENT = Progress()


class _TqdmTask(Task):
    def __init__(self, bar):
        self._bar = bar

    def update(self, n: int = 1) -> None:
        self._bar.update(n)

    def set(self, **values) -> None:
        self._bar.set_postfix({k: (f"{v:.4g}" if isinstance(v, float) else v)
                               for k, v in values.items()}, refresh=False)


class TqdmProgress(Progress):
    """A tqdm bar per task on standard error (rate and ETA)."""

    enabled = True

    def __init__(self, mininterval: float = 0.1):
        self.mininterval = mininterval          # seconds between redraws

    @contextlib.contextmanager
    def task(self, name: str, total: int | None = None, unit: str = "it") -> Iterator[Task]:
        from tqdm.auto import tqdm
        bar = tqdm(total=total, desc=name, unit=unit, file=sys.stderr, leave=False,
                   dynamic_ncols=True, mininterval=self.mininterval)
        try:
            yield _TqdmTask(bar)
        finally:
            bar.close()


class RecordingProgress(Progress):
    """Keeps what was reported instead of showing it: ``tasks`` is a list of ``{"name", "total",
    "unit", "done"}`` (for tests, and for notebooks that plot a run's phases)."""

    enabled = True

    def __init__(self):
        self.tasks: list[dict] = []

    @contextlib.contextmanager
    def task(self, name: str, total: int | None = None, unit: str = "it") -> Iterator[Task]:
        record = {"name": name, "total": total, "unit": unit, "done": 0}
        self.tasks.append(record)

        class _Counting(Task):
            def update(self, n: int = 1) -> None:
                record["done"] += n

        yield _Counting()


def interactive() -> bool:
    """True on a terminal outside CI: where a live bar helps rather than floods a log."""
    return bool(sys.stderr.isatty()) and not os.environ.get("CI")


def bar(enabled: bool = True) -> Progress:
    """A tqdm progress reporter when ``enabled`` and :func:`interactive`, else :data:`SILENT`."""
    return TqdmProgress() if enabled and interactive() else SILENT


def print_progress(every: int = 1, *, file=None) -> Callable[[int, dict], None]:
    """An ``on_step`` callback for ``api.run`` that prints one line every ``every`` steps,
    ``step 3: loss 0.512, test_accuracy 0.81``, to ``file`` (default: standard output):
    ``api.run(..., on_step=api.print_progress(10))``; ``api.run`` prints nothing without it."""
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"every must be an integer >= 1 (steps between lines), got {every!r}")

    def on_step(t: int, record: dict) -> None:
        if t % every == 0:
            shown = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                              for k, v in record.items() if k != "round")
            print(f"step {t}: {shown}" if shown else f"step {t}", file=file or sys.stdout,
                  flush=True)

    return on_step
