"""The algorithms by name. Each family package under :mod:`fedjax_dp.algorithms` registers its own
in its ``__init__`` (``registry.register("dp_fedavg", dp_fedavg)``); the first :func:`get`,
:func:`names` or :func:`algorithms` imports every family package found on disk. An entry is a
module (or a protocol object) on the protocol of :mod:`fedjax_dp.algorithms.api`; adding an
algorithm is one module and one :func:`register` line (docs/protocol.md).
"""
from __future__ import annotations

import importlib
import pkgutil
from typing import Any

ALGORITHMS: dict[str, Any] = {}
_found = False


def register(name: str, entry: Any) -> None:
    """``algorithm.name = name`` runs ``entry`` (registering it again changes nothing)."""
    ALGORITHMS[name] = entry


def algorithms() -> dict[str, Any]:
    """``{name: entry}`` of every family (their packages imported on the first call)."""
    global _found
    if not _found:
        for info in pkgutil.iter_modules(importlib.import_module(__package__).__path__):
            if info.ispkg:
                importlib.import_module(f"{__package__}.{info.name}")
        _found = True
    return ALGORITHMS


def names() -> list[str]:
    return sorted(algorithms())


def get(name: str):
    if name not in algorithms():
        raise ValueError(f"algorithm.name must be one of {names()}, got {name!r}")
    return ALGORITHMS[name]
