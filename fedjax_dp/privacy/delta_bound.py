"""The largest delta a guarantee may be stated at: ``delta < 1/N``, N the units it protects.

An (epsilon, delta) guarantee allows, with probability delta, anything at all. The mechanism
that publishes each of N units' data in the clear with probability delta is (0, delta)-DP, and
it releases ``delta N`` whole units in expectation: at ``delta >= 1/N`` a guarantee permits
publishing one unit outright (with 100 agents, ``delta = 0.02`` reports a small epsilon for a run
allowed to release two agents' data). So a guarantee is refused at ``delta >= 1/N`` (one line
naming the key, the bound and N) unless the caller overrides it (the config's
``privacy.allow_large_delta = true``; the account commands' ``--allow-large-delta``).

N counts what the unit protects (:data:`COUNTED`): agents for a whole agent's or party's data
(``agent``, ``party``), training records for one record (``instance``, ``example``,
``silo_record``, ``shuffle``: every record of every agent, since the guarantee covers the union of
their data). A unit not listed is counted as records, the larger count and so the tighter bound.
"""
from __future__ import annotations

import math
from collections.abc import Iterable

from fedjax_dp.core import validation

__all__ = ["COUNTED", "DeltaBoundError", "kind", "count", "check"]

#: unit of privacy -> what N counts for it (``"agents"`` or ``"records"``)
COUNTED: dict[str, str] = {"agent": "agents", "party": "agents", "instance": "records",
                           "example": "records", "silo_record": "records",
                           "shuffle": "records"}


class DeltaBoundError(validation.ConfigError):
    """A delta at or above 1/N for a unit protected by N (a ``ValueError``: one line)."""


def kind(unit: str) -> str:
    """What N counts for ``unit`` (a per-member unit such as ``"instance (party 2)"`` is its
    base unit's); a unit not in :data:`COUNTED` counts records."""
    return COUNTED.get(unit.split(" (")[0].strip(), "records")


def count(unit: str, *, agents: int | None, records: int | None) -> int | None:
    """N for ``unit``: ``agents`` or ``records`` (:func:`kind`); None where that is not known."""
    return agents if kind(unit) == "agents" else records


def check(delta: float, units: Iterable[str], *, agents: int | None = None,
          records: int | None = None, key: str = "privacy.delta",
          override: str = "set privacy.allow_large_delta = true", allow: bool = False) -> None:
    """Refuse ``delta >= 1/N`` for any of ``units`` whose N is known (``agents`` / ``records``
    None: not known yet, not checked); ``allow``: the caller overrode the bound. Raises
    :class:`DeltaBoundError` naming ``key``, the bound, N and ``override``."""
    if allow:
        return
    for unit in dict.fromkeys(units):
        n = count(unit, agents=agents, records=records)
        if n is None or n < 1 or delta < 1.0 / n:
            continue
        what = kind(unit)
        raise DeltaBoundError(
            f"{key} = {delta:g} must be below 1/N = {1.0 / n:.3g} for the {unit}-level guarantee "
            f"(N = {n} {what}): a delta >= 1/N permits releasing a whole "
            f"{'agent' if what == 'agents' else 'record'}'s data in the clear; lower {key} "
            f"(e.g. {_suggest(n):g}) or {override} to report it anyway")


def _suggest(n: int) -> float:
    """A customary delta for N units: the power of ten at or below ``1 / (10 N)``."""
    return 10.0 ** math.floor(math.log10(1.0 / (10.0 * n)))
