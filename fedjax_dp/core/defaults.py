"""Device-aware defaults: the ONE place that reads the platform and the device memory.

Every choice that was tuned for one kind of device is decided by :func:`defaults` from two
facts, the platform (``"cpu"``, ``"gpu"`` or ``"tpu"``) and the memory of one device
(``memory_stats()["bytes_limit"]``; None where the device does not report it, as the CPU):

=====================  ===============================  =======================================
choice                 CPU                              GPU / TPU
=====================  ===============================  =======================================
``chunk_budget_bytes`` 8 MiB (the cache,                 ``CHUNK_FRACTION`` (1/4) of the device
                       :data:`CPU_CACHE_BUDGET_BYTES`)   memory; None (never chunk) unreported
``min_chunks``         4 (fewer chunks: no gain)         1 (chunk only what does not fit)
``seed_axis``          ``"map"`` (one seed's program     ``"vmap"`` (one wide kernel); ``"map"``
                       in a loop: same speed, no extra   below ``SMALL_DEVICE_BYTES`` (8 GiB),
                       rounding)                         where S runs at once may not fit
``knn_method``         ``"threshold"`` (cache-blocked    ``"top_k"`` (``lax.top_k``: one wide
                       count passes, no sort)            kernel; the blocks' ``lax.map`` is serial)
``prefetch``           True (1 background thread)        True (1 background thread)
``placement_host_      64 MiB (:data:`AUTO_HOST_BYTES`)  ``AUTO_HOST_FRACTION`` (1/4) of the
bytes``                                                  device memory (64 MiB when unreported)
``compute_dtype``      float32                          float32 (never float64 in compiled code)
``accounting_dtype``   float64 (NumPy on the host)      float64 (NumPy on the host)
=====================  ===============================  =======================================

Formulas: a chunk of agents holds ``max(minimum, chunk_budget_bytes // bytes_per_agent)`` agents
(:func:`fedjax_dp.core.auto_chunk_size`), no chunking when fewer than ``min_chunks`` chunks (or
one) would result; ``run.agents_on = "auto"`` keeps agents on the host when their bytes exceed
``placement_host_bytes`` (:func:`fedjax_dp.core.auto_placement`).

Results do not depend on any of these choices (chunked, mapped and vmapped runs give the same
numbers up to float rounding; both kNN methods choose the same neighbours; prefetching changes
nothing): they only move time and memory. ``fedjax-dp devices`` prints them for this machine;
docs/devices.md is their page. No other module calls ``jax.default_backend()``, reads a device's
``.platform`` or calls ``memory_stats()`` (tests/test_device_defaults.py checks the source).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax

__all__ = ["Defaults", "PLATFORMS", "defaults", "read_device", "memory_stats",
           "CPU_CACHE_BUDGET_BYTES", "CHUNK_FRACTION", "SMALL_DEVICE_BYTES",
           "AUTO_HOST_FRACTION", "AUTO_HOST_BYTES"]

PLATFORMS = ("cpu", "gpu", "tpu")
#: CPU: the agents' working set of one chunk (the last-level cache a 2-core machine offers;
#: measured, 1000 agents x 20 steps of an MLP 64-128-10: 0.56 s plain, 0.35 s in chunks of 50)
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
                    prefetch=True, prefetch_threads=1, placement_host_bytes=placement)


def describe() -> dict[str, Any]:
    """What ``fedjax-dp devices`` prints: JAX's version, the platform, every device JAX sees
    (with its memory where reported) and this machine's :func:`defaults`."""
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
            "defaults": defaults().as_dict()}
