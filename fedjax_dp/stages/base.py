"""What every stage of a round is: a small frozen value with a kind, a name, its options, its
requirements on the other stages of its chain, and the registry ``fedjax-dp list`` reads.

A round chains six kinds of stage, in this order (:data:`KINDS`), as optax chains gradient
transformations: *participation* (who takes part), *client_update* (the agents' local work),
*clipping* (each agent's update bounded), *aggregation* (the updates summed), *noise* (the sum
noised), *server_update* (the server's step). A stage states what it needs of the others as
:class:`Requirement` values; :func:`check_chain` refuses a chain that breaks one, in one line
naming both stages and the reason, so no pair of stages is ever refused by hand.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar, Mapping, Sequence

__all__ = ["KINDS", "Stage", "Requirement", "requires", "StageConflict", "check_chain",
           "register", "registered", "stage_kinds"]

#: The kinds of stage, in the order a round runs them (a chain holds one of each).
KINDS = ("participation", "client_update", "clipping", "aggregation", "noise", "server_update")


@dataclasses.dataclass(frozen=True)
class Requirement:
    """What a stage needs of the stage of ``kind`` in its chain: ``holds(chain) -> bool`` (the
    chain: a mapping kind -> stage), and ``reason``, the sentence a refusal gives."""

    kind: str
    holds: Callable[[Mapping[str, "Stage"]], bool]
    reason: str


def requires(kind: str, holds: Callable[[Mapping[str, "Stage"]], bool],
             reason: str) -> Requirement:
    """A :class:`Requirement` (``kind`` checked against :data:`KINDS`)."""
    if kind not in KINDS:
        raise ValueError(f"a requirement's kind must be one of {list(KINDS)}, got {kind!r}")
    return Requirement(kind, holds, reason)


class Stage:
    """The stage protocol (mixed into frozen dataclasses).

    ``KIND`` (one of :data:`KINDS`), ``NAME`` (its option in ``fedjax-dp list``), ``CONFIG``
    (the config keys that select it),
    ``OPTIONS`` (its keys and their meaning), ``SUMMARY`` (one line). :meth:`requirements` says
    what it needs of the other stages; a stage with state has ``init`` (see each kind's module).
    """

    KIND: ClassVar[str] = ""
    NAME: ClassVar[str] = ""
    SUMMARY: ClassVar[str] = ""
    CONFIG: ClassVar[str] = ""          # the config keys that select it (fedjax-dp list)
    OPTIONS: ClassVar[Mapping[str, str]] = {}

    def requirements(self) -> Sequence[Requirement]:
        """What this stage needs of the others (default: nothing)."""
        return ()

    @property
    def label(self) -> str:
        """``kind "name"``: how a refusal names the stage."""
        return f'{self.KIND} "{self.NAME}"'


class StageConflict(ValueError):
    """A chain whose stages break a stated requirement (one line, naming both stages)."""


def check_chain(chain: Mapping[str, Stage]) -> None:
    """Refuse a chain (kind -> stage) that breaks any stage's requirement, naming both stages:
    ``noise "ddg" with aggregation "plain": <reason>``. Every refusal of a combination comes
    from here; the first broken requirement (stages in :data:`KINDS` order) is reported."""
    for kind in KINDS:
        stage = chain[kind]
        for req in stage.requirements():
            if not req.holds(chain):
                raise StageConflict(f"{stage.label} with {chain[req.kind].label}: {req.reason}")


def conflict(chain: Mapping[str, Stage]) -> str | None:
    """The refusal :func:`check_chain` would give, or None (the docs table reads this)."""
    try:
        check_chain(chain)
    except StageConflict as e:
        return str(e)
    return None


_REGISTRY: dict[str, dict[str, type]] = {kind: {} for kind in KINDS}


def register(cls: type) -> type:
    """Class decorator: list a stage class under its ``KIND`` and ``NAME`` (``fedjax-dp list``,
    the docs' table). A name is registered once."""
    if cls.KIND not in KINDS or not cls.NAME:
        raise ValueError(f"{cls.__name__}: KIND must be one of {list(KINDS)} and NAME set")
    if cls.NAME in _REGISTRY[cls.KIND] and _REGISTRY[cls.KIND][cls.NAME] is not cls:
        raise ValueError(f"{cls.KIND} stage {cls.NAME!r} is registered twice")
    _REGISTRY[cls.KIND][cls.NAME] = cls
    return cls


def registered(kind: str) -> dict[str, type]:
    """The stage classes of ``kind``, by name."""
    return dict(_REGISTRY[kind])


def stage_kinds() -> dict[str, list[dict[str, Any]]]:
    """Every registered stage, by kind: ``{"name", "summary", "config", "options"}``
    (``fedjax-dp list``)."""
    return {kind: [{"name": name, "summary": cls.SUMMARY, "config": cls.CONFIG,
                    "options": dict(cls.OPTIONS)}
                   for name, cls in sorted(_REGISTRY[kind].items())] for kind in KINDS}
