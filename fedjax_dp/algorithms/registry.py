"""The algorithms by name: each family package under :mod:`fedjax_dp.algorithms` registers its own
(``registry.register("dp_fedavg", dp_fedavg)`` in its ``__init__``); the first :func:`get`,
:func:`names` or :func:`algorithms` imports every family package, found on disk, not listed here.

An entry is a module (or a protocol object, like the ISRL family's) on the protocol of
:mod:`fedjax_dp.algorithms.api`; drivers read its hooks through :func:`api.hooks`, never its
name. Adding an algorithm is one module and one :func:`register` line (docs/protocol.md).
"""
from __future__ import annotations

import importlib
import pkgutil
from typing import Any

ALGORITHMS: dict[str, Any] = {}
_found = False


def register(name: str, entry: Any) -> None:
    """Make ``entry`` runnable as ``algorithm.name = name`` (registering it again changes nothing)."""
    ALGORITHMS[name] = entry


def algorithms() -> dict[str, Any]:
    """``{name: entry}`` of every family (their packages imported on the first call)."""
    global _found
    if not _found:
        package = importlib.import_module(__package__)
        for info in pkgutil.iter_modules(package.__path__):
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
