"""Refuse a compiled step that cannot fit in memory, before it runs, in one line.

A step's memory comes from XLA's own analysis of the compiled executable
(``jax.jit(f).lower(*args).compile().memory_analysis()``)::

    peak = arguments + outputs - aliased + temporaries + generated code          (bytes)

an upper bound of what the executable allocates (XLA's buffer assignment already reuses dead
buffers within the temporaries). The limit (:func:`memory_limit`):

* ``FEDJAX_DP_MEMORY_LIMIT`` (e.g. ``"2GB"``, ``"512MiB"``, ``"1e9"``; ``"off"`` disables the
  check): the whole peak, inputs included, must fit;
* otherwise the device's free memory, ``memory_stats()["bytes_limit"] - ["bytes_in_use"]``
  (GPU/TPU), or on the CPU the host's available memory (``MemAvailable`` of /proc/meminfo, else
  ``os.sysconf``): the inputs are already held there, so ``peak - arguments`` must fit.

:func:`checked` wraps a jitted function: at its first call per shape signature it compiles it and
raises :class:`MemoryBudgetError` naming the step, its estimate, the limit and the parameters that
drive it (``drivers``: config key -> value). :func:`explain_oom` turns an out-of-memory error that
still happens into the same kind of line."""
from __future__ import annotations

import dataclasses
import os
import re
import weakref
from typing import Any, Callable, Mapping

import jax

from fedjax_dp.core import defaults as defaults_lib

ENV = "FEDJAX_DP_MEMORY_LIMIT"

Drivers = Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None


class MemoryBudgetError(ValueError):
    """A compiled step whose estimated peak memory exceeds the limit (one line)."""


_UNITS = {"": 1, "b": 1, "k": 10 ** 3, "kb": 10 ** 3, "m": 10 ** 6, "mb": 10 ** 6,
          "g": 10 ** 9, "gb": 10 ** 9, "t": 10 ** 12, "tb": 10 ** 12, "kib": 2 ** 10,
          "mib": 2 ** 20, "gib": 2 ** 30, "tib": 2 ** 40}


def parse_bytes(text: str, name: str = ENV) -> int:
    """``"2GB"`` -> 2e9, ``"512MiB"`` -> 512 * 2**20, ``"1e9"`` -> 1e9 (case-insensitive)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*", str(text).lower())
    if m is None or m.group(2) not in _UNITS:
        raise ValueError(f"{name} must be a size such as '2GB', '512MiB' or '1e9' (or 'off'), "
                         f"got {text!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def format_bytes(n: float) -> str:
    """``25853536472`` -> ``'25.9 GB'`` (decimal units)."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} B"


@dataclasses.dataclass(frozen=True)
class Limit:
    """``bytes`` a step may use; ``counts_arguments``: whether its inputs count against it
    (False where they are already held in the memory the limit measures as free)."""

    bytes: int
    source: str
    counts_arguments: bool


def _host_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def memory_limit(device: jax.Device | None = None) -> Limit | None:
    """The memory a step may use now (module docstring); None: unknown or disabled."""
    text = os.environ.get(ENV, "").strip()
    if text.lower() in ("off", "none", "0"):
        return None
    if text:
        return Limit(parse_bytes(text), f"{ENV}={text}", True)
    device = jax.local_devices()[0] if device is None else device
    stats = defaults_lib.memory_stats(device)     # None where the platform reports none
    if stats and stats.get("bytes_limit"):
        free = int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
        platform = defaults_lib.read_device(device)[0]
        return Limit(free, f"free {platform.upper()} memory", False)
    avail = _host_available()
    return None if avail is None else Limit(avail, "available host memory", False)


@dataclasses.dataclass(frozen=True)
class Estimate:
    """XLA's memory analysis of one compiled executable (bytes, per device)."""

    arguments: int
    outputs: int
    aliased: int
    temporaries: int
    code: int

    @property
    def peak(self) -> int:
        return self.arguments + self.outputs - self.aliased + self.temporaries + self.code

    def describe(self, counts_arguments: bool = True) -> str:
        parts = [("arguments", self.arguments)] if counts_arguments else []
        parts += [("outputs", self.outputs - self.aliased), ("temporaries", self.temporaries)]
        return " + ".join(f"{name} {format_bytes(v)}" for name, v in parts if v)


def estimate(compiled) -> Estimate | None:
    """The memory of a ``jax.stages.Compiled`` (or a ``Lowered``, compiled here); None where the
    platform reports no memory analysis."""
    if hasattr(compiled, "compile") and not hasattr(compiled, "memory_analysis"):
        compiled = compiled.compile()
    try:
        ma = compiled.memory_analysis()
    except Exception:                       # not implemented on this backend
        return None
    if isinstance(ma, (list, tuple)):       # older jax: one per device
        ma = ma[0] if ma else None
    if ma is None:
        return None

    def size(field):
        v = getattr(ma, field, None)
        return int(v) if v is not None and v >= 0 else 0

    est = Estimate(size("argument_size_in_bytes"), size("output_size_in_bytes"),
                   size("alias_size_in_bytes"), size("temp_size_in_bytes"),
                   size("generated_code_size_in_bytes"))
    return est if est.peak > 0 else None


def _show(value) -> str:
    if isinstance(value, tuple):
        value = list(value)
    return value if isinstance(value, str) else repr(value)


def advice(drivers: Drivers) -> str:
    """``"lower train.batch_size (100000), run.chunk_size (auto -> none) or model.hidden
    ([200])"``; empty without drivers."""
    d = dict(drivers() if callable(drivers) else (drivers or {}))
    items = [f"{k} ({_show(v)})" for k, v in d.items()]
    if not items:
        return ""
    return "lower " + (items[0] if len(items) == 1 else
                       ", ".join(items[:-1]) + " or " + items[-1])


def check_fits(compiled, *, what: str | Callable[[], str], drivers: Drivers = None,
               limit: Limit | None = None) -> Estimate | None:
    """Raise :class:`MemoryBudgetError` if ``compiled`` (a ``Compiled`` or ``Lowered``) cannot
    fit the limit (default :func:`memory_limit`); returns its estimate (None: not reported).
    ``what`` names the step (a function: called on refusal only); ``drivers``: the config keys
    -> values that drive its size (a dict, or a function returning one)."""
    est = estimate(compiled)
    limit = memory_limit() if limit is None else limit
    if est is None or limit is None:
        return est
    need = est.peak if limit.counts_arguments else est.peak - est.arguments
    if need > limit.bytes:
        tip = advice(drivers)
        what = what() if callable(what) else what
        parts = est.describe(limit.counts_arguments)
        raise MemoryBudgetError(
            f"{what} needs about {format_bytes(need)} of memory ({parts}) but the limit is "
            f"{format_bytes(limit.bytes)} ({limit.source})"
            + (f"; {tip}" if tip else ""))
    return est


# --------------------------------------------------------------------------- checked jit

_SEEN: "weakref.WeakKeyDictionary[Any, set]" = weakref.WeakKeyDictionary()
_SEEN_STRONG: dict[int, set] = {}          # jitted functions that take no weak reference
_LAST: list = [None, None]                 # (what, drivers) of the last step checked


def _leaf_signature(leaf):
    if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
        return (tuple(leaf.shape), str(leaf.dtype))
    try:
        hash(leaf)
        return (type(leaf).__name__, leaf)
    except TypeError:
        return (type(leaf).__name__, id(leaf))


def _seen_for(fn) -> set:
    try:
        return _SEEN.setdefault(fn, set())
    except TypeError:
        return _SEEN_STRONG.setdefault(id(fn), set())


def check_call(jitted, *args, what: str | Callable[..., str], drivers: Drivers = None,
               **kwargs) -> None:
    """At the first call of ``jitted`` (a ``jax.jit`` function) per shape signature of
    ``(args, kwargs)``: lower and compile it (jax caches the executable) and :func:`check_fits`
    it. ``what`` may be a function of the arguments (called on refusal only). Inside a trace
    nothing is checked."""
    leaves, tree = jax.tree.flatten((args, kwargs))
    if any(isinstance(l, jax.core.Tracer) for l in leaves):
        return
    sig = (os.environ.get(ENV), tree, tuple(_leaf_signature(l) for l in leaves))
    seen = _seen_for(jitted)
    _LAST[:] = [what if isinstance(what, str) else None, drivers]
    if sig in seen:
        return
    limit = memory_limit()
    if limit is not None:
        check_fits(jitted.lower(*args, **kwargs).compile(), drivers=drivers, limit=limit,
                   what=what if isinstance(what, str) else (lambda: what(*args, **kwargs)))
    seen.add(sig)


def checked(jitted, *, what: str | Callable[..., str], drivers: Drivers = None) -> Callable:
    """``jitted`` (a ``jax.jit`` function) whose first call per shape signature is refused with
    :class:`MemoryBudgetError` if it cannot fit (:func:`check_call`)."""

    def call(*args, **kwargs):
        check_call(jitted, *args, what=what, drivers=drivers, **kwargs)
        return jitted(*args, **kwargs)

    call.__wrapped__ = jitted
    return call


def model_driver(model, params=None) -> dict:
    """``{"model.hidden": [200]}`` for an MLP (widths read from ``params`` or the model's
    initial parameters), else ``{"model.name": name}``."""
    if getattr(model, "name", None) != "mlp":
        return {"model.name": getattr(model, "name", "?")}
    if params is None:
        params = jax.eval_shape(model.init, jax.random.key(0))
    kernels = [l for l in jax.tree.leaves(params) if len(l.shape) >= 2]
    return {"model.hidden": [int(k.shape[-1]) for k in kernels[:-1]]}


def chunk_driver(requested, resolved) -> str:
    """How ``run.chunk_size`` was resolved: ``"auto -> 12"``, ``"auto -> none"``, ``"8"``,
    ``"none"`` (all agents at once)."""
    if requested == "auto":
        return f"auto -> {'none' if resolved is None else resolved}"
    return "none" if resolved is None else str(resolved)


# --------------------------------------------------------------------------- OOM that happens

_OOM = re.compile(r"RESOURCE_EXHAUSTED|out of memory", re.IGNORECASE)


def explain_oom(exc: BaseException) -> str | None:
    """One line for an out-of-memory error raised by XLA (``RESOURCE_EXHAUSTED`` / ``Out of
    memory``) or the host (``MemoryError``), naming what was allocated, the limit and the
    parameters of the last step checked; None for any other exception (a ``ValueError`` other
    than :class:`MemoryBudgetError` is a bad input, never an OOM)."""
    if isinstance(exc, MemoryBudgetError):
        return str(exc)
    msg = str(exc)
    if isinstance(exc, ValueError) or not (isinstance(exc, MemoryError) or _OOM.search(msg)):
        return None
    m = re.search(r"allocating\s+([0-9]+)\s+bytes", msg)
    tried = f" allocating {format_bytes(int(m.group(1)))}" if m else ""
    what, drivers = _LAST
    try:
        limit = memory_limit()
    except ValueError:
        limit = None
    line = f"out of memory{tried}" + (f" in {what}" if what else "")
    if limit is not None:
        line += f" (limit {format_bytes(limit.bytes)}, {limit.source})"
    tip = advice(drivers) or ("lower train.batch_size, run.chunk_size, algorithm.agent_chunk or "
                              "the model's size")
    return f"{line}; {tip}"
