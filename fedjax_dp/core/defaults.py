"""Device-aware defaults: the ONE place that reads the platform and the device memory.

Every device-dependent choice is decided by :func:`defaults` from two facts, the platform
(``"cpu"``, ``"gpu"`` or ``"tpu"``) and the memory of one device (``memory_stats()["bytes_limit"]``;
None where the device does not report it, as the CPU). The choices and their values per
platform are the table of docs/devices.md ("Device-aware defaults"); it does not list
``cohort_search``: ``"scan"`` on the CPU (searchsorted: a loop of log2 N steps),
``"scan_unrolled"`` on a GPU / TPU (no device loop: no host round trips). Where the device
memory is unreported, ``chunk_budget_bytes`` is None (never chunk) and ``placement_host_bytes``
64 MiB (:data:`AUTO_HOST_BYTES`); on the CPU the chunk budget is the cache,
:data:`CPU_CACHE_BUDGET_BYTES`.

Formulas: a chunk of agents holds ``max(minimum, chunk_budget_bytes // bytes_per_agent)`` agents
(:func:`fedjax_dp.core.auto_chunk_size`), no chunking when fewer than ``min_chunks`` chunks (or
one) would result; ``run.agents_on = "auto"`` keeps agents on the host when their bytes exceed
``placement_host_bytes`` (:func:`fedjax_dp.core.auto_placement`).

Results do not depend on any of these choices (up to float rounding): they only move time and
memory. ``fedjax-dp devices`` prints them (docs/devices.md). No other module calls
``jax.default_backend()``, reads a device's ``.platform`` or calls ``memory_stats()``.

XLA flags (workarounds of compiler defects) are decided here too, BEFORE any JAX backend starts
(XLA reads ``XLA_FLAGS`` once, when the first backend is created): :func:`planned_platform`
reads, without starting JAX, whether a GPU backend may start; :func:`xla_flags` is the pure
decision; :func:`apply_xla_flags` runs once, when this module is first imported, and records
what it did in :data:`XLA_FLAGS_STATE`.

The flags, the platforms they are set on and why: docs/devices.md ("XLA flags"); today one,
``--xla_gpu_enable_triton_gemm=false`` on CUDA and ROCm GPUs (:data:`TRITON_GEMM_REASON`).

A flag whose name the user's own ``XLA_FLAGS`` already mention is never added: the user's value
wins."""
from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
import warnings
from typing import Any, Callable, Iterable, Mapping, MutableMapping

import jax

__all__ = ["Defaults", "PLATFORMS", "defaults", "read_device", "memory_stats",
           "CPU_CACHE_BUDGET_BYTES", "CHUNK_FRACTION", "SMALL_DEVICE_BYTES",
           "AUTO_HOST_FRACTION", "AUTO_HOST_BYTES", "TRITON_GEMM_FLAG", "TRITON_GEMM_REASON",
           "XLA_WORKAROUNDS", "PLANNED_PLATFORMS", "xla_flags", "planned_platform", "installed_plugins",
           "apply_xla_flags", "XLA_FLAGS_STATE"]

PLATFORMS = ("cpu", "gpu", "tpu")
#: CPU: the agents' working set of one chunk (the last-level cache of a small machine)
CPU_CACHE_BUDGET_BYTES = 8 * 2 ** 20
#: accelerators: a chunk's working set at most this fraction of the device memory (the rest is
#: left to the population, parameters, activations and XLA's temporaries)
CHUNK_FRACTION = 0.25
#: accelerators with less memory than this map the seed axis instead of vmapping it
SMALL_DEVICE_BYTES = 8 * 2 ** 30
#: ``agents_on = "auto"``: host-resident above this fraction of the device memory ...
AUTO_HOST_FRACTION = 0.25
#: ... or above this many bytes on a device that does not report its memory (the CPU)
AUTO_HOST_BYTES = 64 << 20


@dataclasses.dataclass(frozen=True)
class Defaults:
    """The platform-dependent choices (module docstring: the table, per platform)."""

    platform: str                    # "cpu" | "gpu" | "tpu"
    device_memory: int | None        # bytes of one device; None: not reported
    chunk_budget_bytes: int | None   # agents' working set per chunk; None: never chunk
    min_chunks: int                  # fewer chunks than this: no chunking
    seed_axis: str                   # "map" | "vmap": how *_seeds run S seeds in one call
    knn_method: str                  # "threshold" | "top_k": kNN-DPFL's exact neighbour search
    prefetch: bool                   # prepare the next chunk / cohort in a background thread
    prefetch_threads: int            # threads of a cohort feeder's pool
    placement_host_bytes: int        # agents_on="auto": host when the agents exceed this
    compute_dtype: str = "float32"   # every compiled step (jax_enable_x64 is never set)
    accounting_dtype: str = "float64"   # privacy accounting: NumPy/SciPy on the host only
    #: the fused rounds' cohort chunks (algorithms/rounds.py): the jnp.searchsorted method,
    #: "scan" (a loop of log2 N steps) on the CPU, "scan_unrolled" on accelerators (a loop there
    #: costs a host round trip per step)
    cohort_search: str = "scan"

    @property
    def accelerator(self) -> bool:
        return self.platform != "cpu"

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _normalise(platform: str) -> str:
    """jax's platform name -> one of :data:`PLATFORMS` (CUDA / ROCm / other plugins: "gpu")."""
    p = str(platform).lower()
    return p if p in PLATFORMS else "gpu"


def memory_stats(device: Any = None) -> dict | None:
    """``device.memory_stats()`` (default: the first local device); None where the platform
    does not report it (the CPU returns None; some backends raise)."""
    device = jax.local_devices()[0] if device is None else device
    try:
        stats = device.memory_stats()
    except Exception:                 # not implemented on this platform
        return None
    return dict(stats) if stats else None


def read_device(device: Any = None) -> tuple[str, int | None]:
    """``(platform, bytes_limit or None)`` of ``device`` (default: the first local device, the
    platform of ``jax.default_backend()``)."""
    if device is None:
        platform = jax.default_backend()
        device = jax.local_devices()[0]
    else:
        platform = getattr(device, "platform", "cpu")
    limit = (memory_stats(device) or {}).get("bytes_limit")
    return _normalise(platform), (int(limit) if limit else None)


def defaults(platform: str | None = None, device_memory: int | None = None, *,
             device: Any = None) -> Defaults:
    """The defaults of ``platform`` with ``device_memory`` bytes per device.

    ``platform`` None: both are read from ``device`` (default: the first local device; its
    memory None where it reports none). Given a ``platform``, nothing is read (tests fake any
    device this way): ``device_memory`` None means "not reported".
    """
    if platform is None:
        platform, read_memory = read_device(device)
        device_memory = read_memory if device_memory is None else device_memory
    elif platform not in PLATFORMS:
        raise ValueError(f"platform must be one of {PLATFORMS}, got {platform!r}")
    if device_memory is not None:
        if int(device_memory) <= 0:
            raise ValueError(f"device_memory must be a positive number of bytes or None, "
                             f"got {device_memory!r}")
        device_memory = int(device_memory)
    placement = (int(AUTO_HOST_FRACTION * device_memory) if device_memory
                 else AUTO_HOST_BYTES)
    if platform == "cpu":
        return Defaults(platform="cpu", device_memory=device_memory,
                        chunk_budget_bytes=CPU_CACHE_BUDGET_BYTES, min_chunks=4,
                        seed_axis="map", knn_method="threshold", prefetch=True,
                        prefetch_threads=1, placement_host_bytes=placement)
    small = device_memory is not None and device_memory < SMALL_DEVICE_BYTES
    return Defaults(platform=platform, device_memory=device_memory,
                    chunk_budget_bytes=(int(CHUNK_FRACTION * device_memory)
                                        if device_memory else None),
                    min_chunks=1, seed_axis="map" if small else "vmap", knn_method="top_k",
                    cohort_search="scan_unrolled",
                    prefetch=True, prefetch_threads=1, placement_host_bytes=placement)


def describe() -> dict[str, Any]:
    """What ``fedjax-dp devices`` prints: JAX's version, the platform, every device JAX sees
    (with its memory where reported), this machine's :func:`defaults` and ``xla_workarounds``
    (:data:`XLA_FLAGS_STATE`)."""
    local = jax.local_devices()
    devices = []
    for dv in jax.devices():
        entry = {"id": int(dv.id), "kind": str(getattr(dv, "device_kind", "")),
                 "process": int(getattr(dv, "process_index", 0)), "repr": str(dv)}
        if dv in local:
            limit = (memory_stats(dv) or {}).get("bytes_limit")
            entry["memory_bytes"] = int(limit) if limit else None
        devices.append(entry)
    return {"jax": jax.__version__, "platform": read_device()[0],
            "process_count": int(jax.process_count()), "devices": devices,
            "defaults": defaults().as_dict(),
            "xla_workarounds": {k: v for k, v in XLA_FLAGS_STATE.items()}}


# ----------------------------------------------------------------------------- XLA flags

#: Triton GEMM off on GPUs (the reason: :data:`TRITON_GEMM_REASON`)
TRITON_GEMM_FLAG = "--xla_gpu_enable_triton_gemm=false"
TRITON_GEMM_REASON = (
    "XLA's GPU compiler aborts the process while tiling a dot of the DARTS search (DP-FNAS: "
    "fedjax-dp run configs/fnas/digits_dp.toml, bench part dp_fnas_search_step) for its Triton "
    "GEMM emitter: 'triton_tiling_propagation.cc:703 Check failed: subdim_size_accumulator == "
    "dim_size (16 vs. 8)', exit 134; seen with jax 0.11.2 / jaxlib 0.11.2 (the XLA bundled with "
    "jaxlib 0.11.2, CUDA 13 plugin) on an NVIDIA H100, 2026-11-27. With the Triton GEMM off XLA "
    "uses cuBLAS for every dot: every shipped config runs, and the float32 2048^3 matmul went "
    "from 57 to 107 TFLOP/s on that H100 (shared/measurements/h100-2026-11-27)")
#: platform -> the workaround flags set for it (flag, reason); no other platform gets any
XLA_WORKAROUNDS: dict[str, tuple[tuple[str, str], ...]] = {
    "gpu": ((TRITON_GEMM_FLAG, TRITON_GEMM_REASON),),
}
#: what :func:`planned_platform` may return: a platform of :data:`PLATFORMS`, or "other" (a
#: backend from another plugin: Intel's oneapi, Apple's METAL, ...), which gets no XLA flag
#: (such a plugin carries its own XLA, whose flag parser may not know a CUDA workaround's flag
#: and would then abort)
PLANNED_PLATFORMS = PLATFORMS + ("other",)
#: a JAX platform name (``JAX_PLATFORMS`` entries) -> one of :data:`PLANNED_PLATFORMS`
_PLATFORM_NAMES = {"cpu": "cpu", "gpu": "gpu", "cuda": "gpu", "rocm": "gpu", "tpu": "tpu"}
#: top-level modules of JAX's GPU builds besides the ``jax_plugins.xla_*`` PJRT modules
_GPU_MODULES = ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm60_plugin",
                "jax_rocm7_plugin")


def _flag_name(token: str) -> str:
    """``--xla_gpu_x=false`` -> ``xla_gpu_x`` (the name XLA's flag parser matches)."""
    return token.lstrip("-").split("=", 1)[0].strip()


def xla_flags(platform: str, current: str = "") -> str:
    """The ``XLA_FLAGS`` a process on ``platform`` should start with, given the user's
    ``current`` ``XLA_FLAGS``: ``current`` followed by each workaround flag of the platform
    (:data:`XLA_WORKAROUNDS`) whose name ``current`` does not already mention (the user's flags
    win)."""
    if platform not in PLANNED_PLATFORMS:
        raise ValueError(f"platform must be one of {PLANNED_PLATFORMS}, got {platform!r}")
    if not isinstance(current, str):
        raise ValueError(f"current (the XLA_FLAGS value) must be a string, got {current!r}")
    named = {_flag_name(t) for t in current.split()}
    added = [flag for flag, _ in XLA_WORKAROUNDS.get(platform, ())
             if _flag_name(flag) not in named]
    return " ".join([current.strip()] + added).strip() if added else current


def installed_plugins() -> list[str]:
    """Names of the JAX PJRT plugins installed, found as JAX finds them but without importing
    them (the ``jax_plugins`` namespace package and entry points), plus JAX's GPU kernel
    packages (``jax_cuda12_plugin``, ...) and ``libtpu``."""
    import importlib.metadata
    import pkgutil
    names: set[str] = set()
    try:
        spec = importlib.util.find_spec("jax_plugins")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        names |= {m.name for m in pkgutil.iter_modules(list(spec.submodule_search_locations))}
    try:
        names |= {ep.value.split(":")[0].rsplit(".", 1)[-1]
                  for ep in importlib.metadata.entry_points(group="jax_plugins")}
    except Exception:                  # a broken distribution's metadata: plugins as found so far
        pass
    for module in _GPU_MODULES + ("libtpu",):
        try:
            if importlib.util.find_spec(module) is not None:
                names.add(module)
        except (ImportError, ValueError):
            pass
    return sorted(names)


def _plugin_platform(name: str) -> str | None:
    name = name.lower()
    if "cuda" in name or "rocm" in name:
        return "gpu"
    if "tpu" in name:
        return "tpu"
    return None


def planned_platform(environ: Mapping[str, str] | None = None,
                     plugins: Iterable[str] | None = None,
                     configured: str | None = None) -> str:
    """The platform of the backends JAX will start, read without starting one: "gpu" when a
    CUDA or ROCm backend may start (the XLA flags of a GPU are then needed), else "tpu", "cpu"
    or "other" (:data:`PLANNED_PLATFORMS`).

    In JAX's order: ``configured`` (``jax.config.jax_platforms`` when JAX is imported) or
    ``JAX_PLATFORMS`` restricts the backends to those listed; otherwise every installed plugin
    starts (``plugins``, default :func:`installed_plugins`). ``JAX_PLATFORM_NAME`` (deprecated)
    only names the default backend, so it adds a GPU when it names one and takes none away."""
    environ = os.environ if environ is None else environ
    listed = configured if configured else environ.get("JAX_PLATFORMS", "")
    names = [p.strip().lower() for p in str(listed).split(",") if p.strip()]
    if names:
        kinds = [_PLATFORM_NAMES.get(p, "other") for p in names]
        return "gpu" if "gpu" in kinds else kinds[0]
    found = {_plugin_platform(p) for p in (installed_plugins() if plugins is None else plugins)}
    default = _PLATFORM_NAMES.get(environ.get("JAX_PLATFORM_NAME", "").strip().lower())
    if "gpu" in found or default == "gpu":
        return "gpu"
    if "tpu" in found or default == "tpu":
        return "tpu"
    return "cpu"


def _backend_started() -> bool | None:
    """Whether a JAX backend exists in this process (then XLA has read ``XLA_FLAGS`` already);
    False while JAX is not even imported; None where this JAX does not tell."""
    bridge = sys.modules.get("jax._src.xla_bridge")
    if bridge is None:
        return False
    try:
        return bool(bridge.backends_are_initialized())
    except Exception:                 # a JAX without the function: unknown
        return None


def _configured_platforms() -> str | None:
    """``jax.config.jax_platforms`` when JAX is imported (a program may have set it), else None."""
    if "jax" not in sys.modules:
        return None
    try:
        return sys.modules["jax"].config.jax_platforms or None
    except Exception:
        return None


def apply_xla_flags(environ: MutableMapping[str, str] | None = None, *,
                    platform: str | None = None,
                    backend_started: Callable[[], bool | None] = _backend_started) -> dict:
    """Set ``environ["XLA_FLAGS"]`` (default ``os.environ``) to :func:`xla_flags` of the
    :func:`planned_platform`, unless a backend has already started (XLA has read its flags:
    setting them now would claim a workaround that is not in effect; a warning says what to do).
    Returns the record of what was decided: ``platform``, ``xla_flags`` (the value now in
    ``environ``), ``backend_started_before`` (True / False / None: unknown) and, per workaround
    flag, its ``status`` ("applied", "user": the user's XLA_FLAGS name it, "too_late": a
    backend had already started) and whether it is ``in_effect``."""
    environ = os.environ if environ is None else environ
    platform = planned_platform(environ, configured=_configured_platforms()) \
        if platform is None else platform
    current = environ.get("XLA_FLAGS", "")
    started = backend_started()
    wanted = xla_flags(platform, current)
    users = {_flag_name(t): t for t in current.split()}      # the last of a name counts
    flags = []
    for flag, reason in XLA_WORKAROUNDS.get(platform, ()):
        if _flag_name(flag) in users:            # in effect only if the user chose our value
            status, in_effect = "user", users[_flag_name(flag)].lower() == flag.lower()
        else:
            status, in_effect = ("too_late", False) if started else ("applied", True)
        flags.append({"flag": flag, "status": status, "in_effect": in_effect,
                      "reason": reason})
    late = [f["flag"] for f in flags if f["status"] == "too_late"]
    if late:
        warnings.warn(f"fedjax_dp was imported after a JAX backend started, so the XLA flags "
                      f"this {platform} needs ({' '.join(late)}) are NOT in effect; start the "
                      f"process with XLA_FLAGS='{wanted}' or import fedjax_dp before computing "
                      f"with JAX (docs/devices.md)", RuntimeWarning, stacklevel=2)
    elif wanted != current:
        environ["XLA_FLAGS"] = wanted
    return {"platform": platform, "xla_flags": environ.get("XLA_FLAGS", ""),
            "backend_started_before": started, "flags": flags}


#: what :func:`apply_xla_flags` did when this module was first imported (``fedjax-dp devices``)
XLA_FLAGS_STATE: dict[str, Any] = apply_xla_flags()
