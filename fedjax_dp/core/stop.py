"""Ctrl-C and SIGTERM at any moment stop a run; never lost, never in the middle of a write.

Python runs a signal handler between two bytecodes of the main thread, wherever that is. The
default SIGINT handler raises ``KeyboardInterrupt`` there, and when "there" is a callback whose
exceptions Python swallows (JAX's garbage-collection callback, a ``__del__``, a weakref
finaliser), the exception is printed as ``Exception ignored in ...`` and the run goes on; the
default SIGTERM handler kills the process with nothing written. So, while :func:`handling` is
active (the command line's whole life; :func:`fedjax_dp.experiments.runner.run`'s):

* a signal is first *recorded* (:func:`pending`), then raised as :class:`Stopped` (a
  ``KeyboardInterrupt``) at once unless a :func:`deferred` block is running; where Python
  swallows it, ``sys.unraisablehook`` drops it silently (no ``Exception ignored`` on stderr);
* :func:`check`, called at the runner's safe points (after set-up, after every round, before
  the final write), raises :class:`Stopped` again for a recorded signal: one that a callback
  swallowed stops the run at the next safe point;
* inside :func:`deferred` (an atomic write, a checkpoint) the signal only waits; the block's end
  raises it, so a write is never cut.

The exit status is ``128 + signum``: 130 for SIGINT, 143 for SIGTERM (:func:`exit_status`).

Several processes of one job (:func:`set_agreement`; :mod:`fedjax_dp.experiments.processes`):
a process that stopped alone would leave the others waiting in a collective, so a first signal
is only recorded, and :func:`safe_point` -- the step boundaries every process reaches -- asks
the agreement (an all-gather of every process's recorded signal) and stops every process after
the same step. A second signal on a process stops it at once.
"""
from __future__ import annotations

import contextlib
import signal
import sys
import threading

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_NAMES = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated"}


class Stopped(KeyboardInterrupt):
    """A run stopped by a signal (``signum``); a ``KeyboardInterrupt``, so code that lets
    Ctrl-C through lets it through."""

    def __init__(self, signum: int = signal.SIGINT):
        super().__init__(_NAMES.get(signum, f"signal {signum}"))
        self.signum = signum


_state = {"pending": None, "defer": 0, "depth": 0, "agree": None, "count": 0}
_previous: dict = {}


def _handler(signum, frame) -> None:
    _state["count"] += 1
    if _state["pending"] is None:
        _state["pending"] = signum
    if _state["agree"] is not None and _state["count"] == 1:
        return                       # several processes: the next safe point stops them all
    if _state["defer"] == 0:
        raise Stopped(signum)


def pending() -> int | None:
    """The signal recorded and not yet taken (:func:`clear`), or None."""
    return _state["pending"]


def clear() -> None:
    _state["pending"] = None
    _state["count"] = 0


def check() -> None:
    """Raise :class:`Stopped` for a recorded signal (a safe point of a run; with an agreement
    set, only after a second signal: the first waits for :func:`safe_point`)."""
    signum = _state["pending"]
    if signum is not None and _state["defer"] == 0 and (
            _state["agree"] is None or _state["count"] > 1):
        raise Stopped(signum)


def set_agreement(agree) -> None:
    """Several processes: ``agree(pending) -> signum | None`` (called by every process at the
    same :func:`safe_point`) decides whether all stop; None: this process alone."""
    _state["agree"] = agree


def safe_point() -> None:
    """A step boundary every process of the run reaches: :func:`check`, or, with an agreement
    set, stop every process if any of them recorded a signal."""
    agree = _state["agree"]
    if agree is None:
        check()
        return
    signum = agree(_state["pending"])
    if signum is not None:
        _state["pending"] = signum
        raise Stopped(signum)


def exit_status(e: BaseException) -> int:
    """128 + the signal number (130 for Ctrl-C / a plain ``KeyboardInterrupt``)."""
    return 128 + int(getattr(e, "signum", signal.SIGINT))


def what(e: BaseException) -> str:
    """``interrupted`` (SIGINT, Ctrl-C) or ``terminated`` (SIGTERM)."""
    return _NAMES.get(getattr(e, "signum", signal.SIGINT), "interrupted")


def _unraisable(previous):
    """``sys.unraisablehook`` that drops a :class:`Stopped` raised where Python swallows
    exceptions (it stays recorded, :func:`check` raises it again) and passes the rest on."""
    def hook(unraisable):
        if not isinstance(unraisable.exc_value, Stopped):
            previous(unraisable)
    return hook


@contextlib.contextmanager
def handling(early: int | None = None):
    """Record and raise SIGINT / SIGTERM while active (main thread only; nested uses share the
    outermost's handlers). ``early``: a signal received before (while the library was being
    imported), recorded as pending. On leaving, the previous handlers come back."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if _state["depth"] == 0:
        clear()
        for sig in SIGNALS:
            _previous[sig] = signal.signal(sig, _handler)
        _previous["unraisable"] = sys.unraisablehook
        sys.unraisablehook = _unraisable(sys.unraisablehook)
        if early is not None:
            _state["pending"] = early
    _state["depth"] += 1
    try:
        yield
    finally:
        if _state["depth"] == 1:              # the previous handlers first: no raise after
            sys.unraisablehook = _previous.pop("unraisable")
            for sig, previous in _previous.items():
                signal.signal(sig, previous)
            _previous.clear()
        _state["depth"] -= 1


@contextlib.contextmanager
def deferred():
    """A block no signal cuts: a signal arriving inside it is raised when it ends (at once
    where no :func:`handling` is active: then Python's own handlers run, and SIGINT's
    ``KeyboardInterrupt`` waits for the block only where it is handling)."""
    _state["defer"] += 1
    try:
        yield
    finally:
        _state["defer"] -= 1
    if _state["defer"] == 0 and _state["depth"] > 0:
        check()


@contextlib.contextmanager
def ignored():
    """A block of a run that is already stopping (its stop report): a further signal is
    recorded, not raised, and the stop under way is not raised again."""
    _state["defer"] += 1
    try:
        yield
    finally:
        _state["defer"] -= 1
