"""Privacy as data: a ledger of what an algorithm ran, per unit of privacy.

Every private algorithm returns a :class:`PrivacyLedger`. Each entry names

* a **unit of privacy** (whose data one neighbouring pair differs in). Documented units
  (:data:`UNITS`; any non-empty string is accepted):

  - ``'agent'``: all data of one agent / client (user-level DP in FL);
  - ``'instance'``: one training instance (record) of one agent;
  - ``'party'``: all data of one party / silo in cross-silo FL (FedKT party level);
  - ``'example'``: one example of the (pooled or local) training data (DP-SGD example level);
  - ``'silo_record'``: one record of one silo, protected against everyone outside the silo
    (inter-silo record-level DP, ISRL-DP);
  - ``'shuffle'``: one report in a shuffled protocol (guarantee after shuffling).

* a **neighbouring relation**: free text saying how neighbours differ, e.g.
  ``'add/remove one agent'`` or ``'replace one instance'``. One unit has one relation; entries
  that disagree are rejected. Sensitivities in events are stated under this relation
  (``noise_multiplier = std / sensitivity``); the accountants run as ``ADD_OR_REMOVE_ONE``;
* what ran, as one of three kinds of entry:

  - ``'event'`` (:meth:`PrivacyLedger.add_event`): a ``dp_accounting.DpEvent``. Events of one
    unit compose sequentially (``ComposedDpEvent``), adaptively.
  - ``'parallel'`` (:meth:`PrivacyLedger.add_parallel`): one event per member of a *disjoint*
    partition of the data (each party / agent runs on its own data). By parallel composition
    the guarantee is the worst member's: ``max_i eps(others + member_i)``, evaluated at report
    time for the requested delta and accountant.
  - ``'rdp'`` (:meth:`PrivacyLedger.add_rdp`): a data-dependent per-order RDP vector (PATE-style
    analyses). Vectors of one unit add up on one fixed order grid; events of the same unit are
    converted to RDP on that grid and added too. Only the RDP accountant applies.
  - ``'shuffle'`` (:meth:`PrivacyLedger.add_shuffle`): a
    :class:`~fedjax_dp.privacy.shuffle_accounting.BinomialSumEvent` (releases of the shuffle-DP
    binomial vector sum, which ``dp_accounting`` has no event for). Only the PLD accountant applies
    (the binomial pair has infinite RDP): its exact PLD
    (:func:`fedjax_dp.privacy.shuffle_accounting.pld`) is composed with the PLD of the unit's
    other events. Such events may also be members of a ``'parallel'`` entry (worst member).

Epsilon for a delta is always computed from these data by ``dp_accounting``.

**What a guarantee does not cover.** A run may release quantities that none of its entries
accounts for (a denominator that is the realised cohort size, training losses or realised batch
sizes reported without noise, a data-dependent epsilon). An algorithm declares each with
:meth:`PrivacyLedger.declare_uncovered` (what is released and why it is not covered); a ledger with
data-dependent entries declares its data-dependent epsilons itself. Every guarantee of
:meth:`PrivacyLedger.report` then says ``covers_all_releases: false`` and lists them in
``not_covered``, so it cannot be mistaken for one that covers the whole run (``covers_all_releases:
true``)."""
from __future__ import annotations

import collections
import dataclasses
import itertools
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import dp_accounting
import numpy as np
from dp_accounting import dp_event

from fedjax_dp.core import validation
from fedjax_dp.privacy import accounting, shuffle_accounting
from fedjax_dp.privacy.shuffle_accounting import BinomialSumEvent

__all__ = ["UNITS", "LedgerEntry", "PrivacyLedger", "MAX_PARALLEL_COMBINATIONS", "Uncovered",
           "coverage"]

#: The documented units of privacy and what one neighbouring pair differs in.
UNITS: dict[str, str] = {
    "agent": "all data of one agent/client",
    "instance": "one training instance of one agent",
    "party": "all data of one party/silo",
    "example": "one training example",
    "silo_record": "one record of one silo (inter-silo record-level DP)",
    "shuffle": "one report in a shuffled protocol",
}

#: Worst-member search evaluates every combination of distinct members of the parallel entries
#: of one unit; more combinations than this is an error.
MAX_PARALLEL_COMBINATIONS = 4096

_KINDS = ("event", "parallel", "rdp", "shuffle")

#: What a ledger accepts besides DpEvents: the shuffle mechanism's event (PLD accountant only).
_SHUFFLE_EVENTS = (BinomialSumEvent,)


def _check_text(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    return value


def _compose(events: Sequence[dp_event.DpEvent]) -> dp_event.DpEvent:
    if not events:
        return dp_accounting.NoOpDpEvent()
    return events[0] if len(events) == 1 else dp_accounting.ComposedDpEvent(list(events))


def _is_shuffle(event: Any) -> bool:
    return isinstance(event, _SHUFFLE_EVENTS)


def _member_to_json(event: Any) -> dict:
    """A DpEvent (``accounting.event_to_json``) or a shuffle event (its ``to_json``) as JSON."""
    return event.to_json() if _is_shuffle(event) else accounting.event_to_json(event)


def _member_from_json(data: Mapping) -> Any:
    if isinstance(data, Mapping) and data.get("class_name") == BinomialSumEvent.CLASS_NAME:
        return BinomialSumEvent.from_json(data)
    return accounting.event_from_json(data)


def _check_member(name: str, event: Any) -> Any:
    if _is_shuffle(event):
        return event
    return accounting.check_event(name, event)


def _event_key(event: Any) -> str:
    return json.dumps(_member_to_json(event), sort_keys=True)


@dataclasses.dataclass(frozen=True)
class LedgerEntry:
    """One record of the ledger (immutable). ``kind``: ``'event'``, ``'parallel'``, ``'rdp'`` or
    ``'shuffle'``.

    ``event`` is set for ``'event'`` (a DpEvent) and ``'shuffle'`` (a ``BinomialSumEvent``),
    ``members`` (one DpEvent or ``BinomialSumEvent`` per member) for ``'parallel'``, ``orders`` and
    ``rdp`` for ``'rdp'`` (data-dependent). ``sensitivity`` is informational."""
    unit: str
    relation: str
    kind: str
    event: dp_event.DpEvent | None = None
    members: tuple[dp_event.DpEvent, ...] = ()
    orders: tuple[float, ...] = ()
    rdp: tuple[float, ...] = ()
    sensitivity: float | None = None
    note: str = ""
    dependent: bool = True          # an 'rdp' entry's curve depends on the data (PATE-style)

    def __post_init__(self):
        validation.check_choice("kind", self.kind, _KINDS)
        _check_text("unit", self.unit)
        _check_text("relation", self.relation)
        if self.kind == "event" and self.event is None:
            raise ValueError("event must be a DpEvent for an entry of kind 'event', got None")
        if self.kind == "shuffle" and not _is_shuffle(self.event):
            raise ValueError("event must be a BinomialSumEvent for an entry of kind "
                             f"'shuffle', got {type(self.event).__name__}")
        if self.kind == "parallel" and not self.members:
            raise ValueError("members must be non-empty for an entry of kind 'parallel'")
        if self.kind == "rdp" and (not self.orders or len(self.orders) != len(self.rdp)):
            raise ValueError("orders and rdp must be non-empty and of the same length for an "
                             "entry of kind 'rdp'")

    @property
    def data_dependent(self) -> bool:
        return self.kind == "rdp" and self.dependent

    def to_json(self) -> dict:
        out: dict[str, Any] = {"unit": self.unit, "relation": self.relation, "kind": self.kind}
        if self.kind in ("event", "shuffle"):
            out["event"] = _member_to_json(self.event)
        elif self.kind == "parallel":
            out["members"] = [_member_to_json(e) for e in self.members]
        else:
            out["orders"] = list(self.orders)
            out["rdp"] = list(self.rdp)
            if not self.dependent:
                out["data_dependent"] = False
        out["sensitivity"] = self.sensitivity
        out["note"] = self.note
        return out

    @classmethod
    def from_json(cls, data: Mapping) -> "LedgerEntry":
        """Inverse of :meth:`to_json`; anything else (a missing key, a value of the wrong type,
        an event outside the known classes) raises a one-line ValueError."""
        if not isinstance(data, Mapping):
            raise ValueError(f"a ledger entry must be a JSON object, got {type(data).__name__}")
        try:
            return cls._from_json(data)
        except (KeyError, TypeError, AttributeError) as e:
            what = f"no key {e}" if isinstance(e, KeyError) else str(e).splitlines()[0]
            raise ValueError(f"a ledger entry is malformed ({what})") from None

    @classmethod
    def _from_json(cls, data: Mapping) -> "LedgerEntry":
        kind = validation.check_choice("kind", data["kind"], _KINDS)
        return cls(unit=data["unit"], relation=data["relation"], kind=kind,
                   event=(_member_from_json(data["event"]) if kind in ("event", "shuffle")
                          else None),
                   members=tuple(_member_from_json(e) for e in data.get("members", ())),
                   orders=tuple(float(a) for a in data.get("orders", ())),
                   rdp=tuple(float(r) for r in data.get("rdp", ())),
                   sensitivity=data.get("sensitivity"), note=data.get("note", ""),
                   dependent=bool(data.get("data_dependent", True)))


@dataclasses.dataclass(frozen=True)
class Uncovered:
    """A quantity a run releases that its ledger does not account for, and why."""

    release: str        # what is released, e.g. "per-round train_loss in history"
    reason: str         # why the guarantee does not cover it

    def __post_init__(self):
        _check_text("release", self.release)
        _check_text("reason", self.reason)

    def __str__(self) -> str:
        return f"{self.release}: {self.reason}"

    def to_json(self) -> dict:
        return {"release": self.release, "reason": self.reason}


def coverage(uncovered: Sequence[Uncovered]) -> dict:
    """The coverage fields of a guarantee: ``covers_all_releases`` and ``not_covered`` (the
    uncovered releases with their reasons, ``"; "``-separated; ``""`` when covered)."""
    uncovered = list(dict.fromkeys(uncovered))
    return {"covers_all_releases": not uncovered,
            "not_covered": "; ".join(str(u) for u in uncovered)}


def _pld_epsilon(events: Sequence[Any], delta: float) -> float:
    """PLD epsilon of DpEvents and shuffle events composed (one discretisation interval).

    The DpEvents go through dp_accounting's PLD accountant; its PLD (the accountant's ``_pld``,
    which dp_accounting exposes no other way) is composed with each shuffle event's exact PLD. The
    two private fields read here are why pyproject.toml bounds dp-accounting (< 0.7)."""
    dp_events = [e for e in events if not _is_shuffle(e)]
    shuffles = [e for e in events if _is_shuffle(e)]
    total = None
    interval = accounting.DEFAULT_PLD_DISCRETIZATION
    if dp_events:
        interval = accounting.pld_interval(_compose(dp_events))    # the accountant's
        acc = accounting.composed_accountant(_compose(dp_events), "pld", None)
        if getattr(acc, "_contains_non_dp_event", False):     # e.g. a noiseless Gaussian
            return math.inf
        total = acc._pld
    for e in shuffles:
        one = shuffle_accounting.pld(e, value_discretization_interval=interval)
        total = one if total is None else total.compose(one)
    return float(total.get_epsilon_for_delta(delta))


_EPSILON_MEMO: "collections.OrderedDict[tuple, tuple]" = collections.OrderedDict()
_EPSILON_MEMO_SIZE = 512


def _events_epsilon(events: Sequence[Any], delta: float, accountant: str,
                    with_shuffle: bool) -> tuple[float, float | None]:
    """(epsilon, optimal RDP order or None) of ``events`` composed, by ``accountant`` (PLD with
    shuffle events). A pure function of the events' JSON, delta and the accountant, so it is
    memoised (LRU, 512 entries): the runs of a sweep that differ only in non-privacy keys
    (step size, clip-free settings) or in their seed report one ledger, computed once."""
    key = (tuple(_event_key(e) for e in events), float(delta), accountant, with_shuffle)
    if key in _EPSILON_MEMO:
        _EPSILON_MEMO.move_to_end(key)
        return _EPSILON_MEMO[key]
    if with_shuffle:
        out = (_pld_epsilon(events, delta), None)
    else:
        acc = accounting.composed_accountant(_compose(events), accountant, None)
        if accountant == "rdp":
            eps, order = acc.get_epsilon_and_optimal_order(delta)
            out = (float(eps), float(order))
        else:
            out = (float(acc.get_epsilon(delta)), None)
    _EPSILON_MEMO[key] = out
    if len(_EPSILON_MEMO) > _EPSILON_MEMO_SIZE:
        _EPSILON_MEMO.popitem(last=False)
    return out


@dataclasses.dataclass(frozen=True)
class _Evaluation:
    epsilon: float
    events: list                       # the events composed for the worst case (in entry order)
    worst_members: list                # per parallel entry: index of the worst member
    order: float | None = None         # optimal RDP order (RDP accountant only)


class PrivacyLedger:
    """What an algorithm ran, per unit of privacy; epsilon for any delta by RDP or PLD.

    ``add_*`` methods append an entry and return the ledger (so calls chain). Entries are immutable;
    :meth:`merged` returns a new ledger."""

    def __init__(self, entries: Sequence[LedgerEntry] = (), uncovered: Sequence[Uncovered] = ()):
        self._entries: list[LedgerEntry] = []
        self._uncovered: list[Uncovered] = []
        for entry in entries:
            self._append(entry)
        for u in uncovered:
            if not isinstance(u, Uncovered):
                raise ValueError(f"uncovered must hold Uncovered, got {type(u).__name__}")
            self.declare_uncovered(u.release, u.reason)

    # ------------------------------------------------------------------ building

    def _append(self, entry: LedgerEntry) -> "PrivacyLedger":
        if not isinstance(entry, LedgerEntry):
            raise ValueError(f"entries must be LedgerEntry, got {type(entry).__name__}")
        existing = self._entries_for(entry.unit, missing_ok=True)
        if existing and existing[0].relation != entry.relation:
            raise ValueError(
                f"relation for unit {entry.unit!r} must match its earlier entries "
                f"({existing[0].relation!r}), got {entry.relation!r}")
        if entry.kind == "rdp":
            grids = [e.orders for e in existing if e.kind == "rdp"]
            if grids and not np.array_equal(grids[0], entry.orders):
                raise ValueError(
                    f"orders for unit {entry.unit!r} must equal the grid of its earlier "
                    f"data-dependent entries ({len(grids[0])} orders), got a different grid "
                    f"({len(entry.orders)} orders)")
        self._entries.append(entry)
        return self

    @staticmethod
    def _common(unit: str, relation: str, sensitivity: float | None, note: str) -> dict:
        _check_text("unit", unit)
        _check_text("relation", relation)
        if sensitivity is not None:
            sensitivity = validation.check_positive("sensitivity", sensitivity)
        if not isinstance(note, str):
            raise ValueError(f"note must be a string, got {note!r}")
        return dict(unit=unit, relation=relation, sensitivity=sensitivity, note=note)

    def add_event(self, unit: str, event: dp_event.DpEvent, *, relation: str,
                  sensitivity: float | None = None, note: str = "") -> "PrivacyLedger":
        """Record that ``event`` ran on the data of ``unit`` (composes with the unit's others)."""
        accounting.check_event("event", event)
        return self._append(LedgerEntry(kind="event", event=event,
                                        **self._common(unit, relation, sensitivity, note)))

    def add_parallel(self, unit: str, events_per_member: Sequence[dp_event.DpEvent], *,
                     relation: str, sensitivity: float | None = None,
                     note: str = "") -> "PrivacyLedger":
        """Record one event per member of a disjoint partition (parallel composition).

        Each unit's data lies in exactly one member (e.g. each party's records only in that party's
        model), so the guarantee is that of the worst member, found at report time for the requested
        delta and accountant. Members may also be shuffle ``BinomialSumEvent`` s (the unit is then
        evaluated by the PLD accountant only)."""
        members = tuple(events_per_member)
        if not members:
            raise ValueError("events_per_member must hold at least one DpEvent, got none")
        for i, e in enumerate(members):
            _check_member(f"events_per_member[{i}]", e)
        return self._append(LedgerEntry(kind="parallel", members=members,
                                        **self._common(unit, relation, sensitivity, note)))

    def add_shuffle(self, unit: str, event: BinomialSumEvent, *, relation: str,
                    note: str = "") -> "PrivacyLedger":
        """Record releases of the shuffle-DP binomial vector sum (``make_event`` of
        :mod:`fedjax_dp.privacy.shuffle_accounting`).

        Composes with the unit's other entries by PLD composition (the PLD accountant only; the
        RDP accountant does not apply: the binomial pair has infinite Renyi divergence).
        ``relation`` should be the one ``event.sensitivity`` was computed under
        (``shuffle_accounting.RELATIONS``).
        """
        if not _is_shuffle(event):
            raise ValueError(f"event must be a BinomialSumEvent, got "
                             f"{type(event).__name__}")
        return self._append(LedgerEntry(kind="shuffle", event=event, **self._common(
            unit, relation, float(event.sensitivity), note)))

    def add_rdp(self, unit: str, orders: Sequence[float], rdp: Sequence[float], *,
                relation: str, note: str = "", data_dependent: bool = True,
                sensitivity: float | None = None) -> "PrivacyLedger":
        """Record an RDP vector ``rdp[i] = RDP at orders[i]``: data-dependent (PATE-style, the
        default) or, with ``data_dependent=False``, a data-independent bound no DpEvent expresses
        (e.g. distributed discrete noise, :mod:`fedjax_dp.privacy.distributed_accounting`).

        Vectors of one unit must share one order grid; they add up (RDP composition)."""
        grid = np.asarray(orders, dtype=np.float64).reshape(-1)
        vec = np.asarray(rdp, dtype=np.float64).reshape(-1)
        if grid.size == 0 or not np.all(np.isfinite(grid)) or np.any(grid <= 1):
            raise ValueError(f"orders must be a non-empty list of finite RDP orders > 1, "
                             f"got {grid.tolist()}")
        if vec.shape != grid.shape:
            raise ValueError(f"orders and rdp must have the same length, got {grid.size} and "
                             f"{vec.size}")
        if np.any(np.isnan(vec)) or np.any(vec < 0):
            raise ValueError(f"rdp must be >= 0 at every order, got {vec.tolist()}")
        return self._append(LedgerEntry(kind="rdp", orders=tuple(grid.tolist()),
                                        rdp=tuple(vec.tolist()), dependent=bool(data_dependent),
                                        **self._common(unit, relation, sensitivity, note)))

    def declare_uncovered(self, release: str, reason: str) -> "PrivacyLedger":
        """Declare that the run also releases ``release``, which no entry accounts for
        (``reason``: why). Every guarantee of :meth:`report` then has ``covers_all_releases:
        false`` and names it in ``not_covered``. Returns the ledger (calls chain)."""
        u = Uncovered(release, reason)
        if u not in self._uncovered:
            self._uncovered.append(u)
        return self

    @property
    def uncovered(self) -> tuple[Uncovered, ...]:
        """The declared uncovered releases, plus the data-dependent epsilons of data-dependent
        units (computed from the private data and released without noise)."""
        dependent = [u for u in self.units() if self.data_dependent(u)]
        auto = ([Uncovered(f"the data-dependent epsilon of {', '.join(dependent)}",
                           "computed from the private data without noise (no smooth "
                           "sensitivity or propose-test-release): releasing it is not private")]
                if dependent else [])
        return tuple(self._uncovered) + tuple(a for a in auto if a not in self._uncovered)

    def merged(self, other: "PrivacyLedger") -> "PrivacyLedger":
        """A new ledger with this ledger's entries, then ``other``'s (same units compose), and
        both ledgers' declared uncovered releases."""
        if not isinstance(other, PrivacyLedger):
            raise ValueError(f"other must be a PrivacyLedger, got {type(other).__name__}")
        return PrivacyLedger(self._entries + other._entries,
                             uncovered=self._uncovered + other._uncovered)

    # ------------------------------------------------------------------ reading

    @property
    def entries(self) -> tuple[LedgerEntry, ...]:
        return tuple(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        parts = ", ".join(f"{u}: {len(self._entries_for(u))} entries" for u in self.units())
        if self._uncovered:
            parts += f"; {len(self._uncovered)} uncovered release(s)"
        return f"PrivacyLedger({parts})"

    def units(self) -> list[str]:
        """Units with at least one entry, in the order first recorded."""
        return list(dict.fromkeys(e.unit for e in self._entries))

    def _entries_for(self, unit: str, *, missing_ok: bool = False) -> list[LedgerEntry]:
        found = [e for e in self._entries if e.unit == unit]
        if not found and not missing_ok:
            raise ValueError(f"unit must be one of the ledger's units {self.units()}, "
                             f"got {unit!r}")
        return found

    def relation(self, unit: str) -> str:
        return self._entries_for(unit)[0].relation

    def data_dependent(self, unit: str) -> bool:
        return any(e.data_dependent for e in self._entries_for(unit))

    def rdp(self, unit: str) -> tuple[np.ndarray, np.ndarray]:
        """``(orders, rdp)``: the unit's summed data-dependent RDP vector (only for such units)."""
        dd = [e for e in self._entries_for(unit) if e.kind == "rdp"]
        if not dd:
            raise ValueError(f"unit {unit!r} has no data-dependent RDP entries")
        return np.asarray(dd[0].orders), np.sum([e.rdp for e in dd], axis=0)

    def event(self, unit: str, *, delta: float | None = None,
              accountant: str = "rdp") -> dp_event.DpEvent:
        """The unit's composed ``DpEvent`` (a single event as is, several as ``ComposedDpEvent``).

        With parallel entries the worst member depends on the target: give ``delta`` (and the
        accountant) to get the worst-case composition. Data-dependent units, and units with
        shuffle (binomial sum) entries, have no DpEvent.
        """
        entries = self._entries_for(unit)
        if any(e.kind == "rdp" for e in entries):
            raise ValueError(f"unit {unit!r} has data-dependent RDP entries, which no DpEvent "
                             "describes; use rdp(unit) or epsilon(unit, delta)")
        if self.has_shuffle(unit):
            raise ValueError(f"unit {unit!r} has shuffle (binomial sum) entries, which no "
                             "dp_accounting DpEvent describes; use epsilon(unit, delta, 'pld')")
        if any(e.kind == "parallel" for e in entries):
            if delta is None:
                raise ValueError(f"unit {unit!r} has parallel entries: pass delta (and "
                                 "accountant) to pick the worst member")
            return _compose(self._evaluate(unit, delta, accountant).events)
        return _compose([e.event for e in entries])

    def has_shuffle(self, unit: str) -> bool:
        """Whether ``unit`` has shuffle (binomial sum) entries or parallel members (PLD only)."""
        return any(e.kind == "shuffle" or (e.kind == "parallel" and any(map(_is_shuffle,
                                                                             e.members)))
                   for e in self._entries_for(unit))

    def replace_one(self, unit: str) -> bool:
        """Whether ``unit`` has fixed-size (without-replacement) sampling or tree-aggregation
        events, which only the RDP accountant analyses (under replace-one or replace-special;
        :func:`accounting.uses_replace_one`, :func:`accounting.uses_replace_special`)."""
        return any(e.kind == "event" and (accounting.uses_replace_one(e.event) or
                                          accounting.uses_replace_special(e.event))
                   for e in self._entries_for(unit))

    def epsilon(self, unit: str, delta: float, accountant: str = "rdp") -> float:
        """Epsilon of ``unit`` at ``delta`` (``'rdp'`` or ``'pld'``; data-dependent: RDP only;
        with shuffle entries: PLD only)."""
        return self._evaluate(unit, delta, accountant).epsilon

    def _evaluate(self, unit: str, delta: float, accountant: str) -> _Evaluation:
        delta = validation.check_open_unit("delta", delta)
        validation.check_choice("accountant", accountant, accounting.ACCOUNTANTS)
        entries = self._entries_for(unit)
        dd = [e for e in entries if e.kind == "rdp"]
        if dd and accountant != "rdp":
            raise ValueError(
                f"accountant must be 'rdp' for unit {unit!r}: it has data-dependent RDP "
                f"entries, to which the {accountant!r} accountant does not apply")
        with_shuffle = self.has_shuffle(unit)
        if with_shuffle and accountant != "pld":
            raise ValueError(
                f"accountant must be 'pld' for unit {unit!r}: it has shuffle (binomial sum) "
                f"entries, whose Renyi divergences are infinite (the {accountant!r} accountant "
                "does not apply)")
        if with_shuffle and dd:
            raise ValueError(f"unit {unit!r} mixes data-dependent RDP and shuffle entries: no "
                             "accountant applies to both")
        parallel = [e for e in entries if e.kind == "parallel"]
        # Distinct members of each parallel entry (identical members are evaluated once).
        choices = []
        for e in parallel:
            distinct: dict[str, int] = {}
            for i, m in enumerate(e.members):
                distinct.setdefault(_event_key(m), i)
            choices.append(list(distinct.values()))
        combos = math.prod(len(c) for c in choices)
        if combos > MAX_PARALLEL_COMBINATIONS:
            raise ValueError(
                f"unit {unit!r} has {combos} combinations of distinct parallel members "
                f"(more than {MAX_PARALLEL_COMBINATIONS}); record fewer distinct members")
        dd_orders = list(dd[0].orders) if dd else None
        dd_sum = np.sum([e.rdp for e in dd], axis=0) if dd else None
        best: _Evaluation | None = None
        for combo in itertools.product(*choices):
            picks = iter(combo)
            events = []
            for e in entries:
                if e.kind in ("event", "shuffle"):
                    events.append(e.event)
                elif e.kind == "parallel":
                    events.append(e.members[next(picks)])
            if dd:
                total = dd_sum + (accounting.event_rdp(_compose(events), dd_orders)
                                  if events else 0.0)
                eps, order = accounting.epsilon_from_rdp(dd_orders, total, delta)
            else:
                eps, order = _events_epsilon(events, delta, accountant, with_shuffle)
            if best is None or eps > best.epsilon:
                best = _Evaluation(eps, events, list(combo), order)
        return best

    def report(self, delta: float, accountants: Sequence[str] = ("rdp", "pld")) -> list[dict]:
        """One JSON-able guarantee per unit and accountant (the ``privacy`` list of result.json).

        Keys: ``unit``, ``relation``, ``epsilon``, ``delta``, ``accountant``, ``data_dependent``,
        ``events`` (the composed events as :func:`~fedjax_dp.privacy.accounting.event_to_json`
        dicts, the worst member standing for each parallel entry; a data-dependent unit adds one
        ``{"orders": [...], "rdp": [...]}`` with its summed RDP vector), ``notes``, and where they
        apply ``rdp_order`` (the optimal order) and ``parallel`` (per parallel entry:
        ``num_members``, ``worst_member``, and ``distinct_members``, each
        ``{"members": [indices], "event": ...}``). PLD is skipped for data-dependent units, RDP for
        units with shuffle entries (whose events appear as ``BinomialSumEvent`` JSON objects); a
        unit none of the requested accountants applies to is an error. ``epsilon`` may be
        ``inf``. Every row also says whether it covers everything the run releases
        (``covers_all_releases``; ``not_covered``: the releases it does not cover and why, from
        :attr:`uncovered`; ``""`` when it covers all).
        """
        delta = validation.check_open_unit("delta", delta)
        if isinstance(accountants, str):
            accountants = (accountants,)
        for acc in accountants:
            validation.check_choice("accountants[]", acc, accounting.ACCOUNTANTS)
        rows = []
        cover = coverage(self.uncovered)
        for unit in self.units():
            entries = self._entries_for(unit)
            dependent = self.data_dependent(unit)
            with_shuffle = self.has_shuffle(unit)
            curves = any(e.kind == "rdp" for e in entries)     # RDP vectors: RDP only
            rdp_only = curves or self.replace_one(unit)
            usable = [a for a in accountants if not (rdp_only and a != "rdp")
                      and not (with_shuffle and a != "pld")]
            if not usable:
                why, need = (("shuffle entries", "pld") if with_shuffle else
                             ("data-dependent RDP", "rdp") if dependent else
                             ("RDP-curve entries", "rdp") if curves else
                             ("sampling without replacement or tree aggregation", "rdp"))
                raise ValueError(f"accountants {list(accountants)} do not apply to unit "
                                 f"{unit!r} ({why}): include {need!r}")
            for acc in usable:
                ev = self._evaluate(unit, delta, acc)
                events: list[dict] = [_member_to_json(e) for e in ev.events]
                if curves:
                    orders, rdp = self.rdp(unit)
                    events.append({"orders": [float(a) for a in orders],
                                   "rdp": [float(r) for r in rdp]})
                row = {"unit": unit, "relation": entries[0].relation,
                       "epsilon": float(ev.epsilon), "delta": delta, "accountant": acc,
                       "data_dependent": dependent, "events": events,
                       "notes": [e.note for e in entries if e.note], **cover}
                if ev.order is not None:
                    row["rdp_order"] = float(ev.order)
                parallel = [e for e in entries if e.kind == "parallel"]
                if parallel:
                    row["parallel"] = [self._parallel_summary(e, w)
                                       for e, w in zip(parallel, ev.worst_members)]
                rows.append(row)
        return rows

    @staticmethod
    def _parallel_summary(entry: LedgerEntry, worst: int) -> dict:
        groups: dict[str, dict] = {}
        for i, m in enumerate(entry.members):
            key = _event_key(m)
            if key not in groups:
                groups[key] = {"members": [], "event": _member_to_json(m)}
            groups[key]["members"].append(i)
        return {"num_members": len(entry.members), "worst_member": int(worst),
                "distinct_members": list(groups.values())}

    # ------------------------------------------------------------------ serialisation

    def to_json(self) -> dict:
        """All entries (and declared uncovered releases) as JSON-able dicts (``from_json``
        inverts it)."""
        return {"entries": [e.to_json() for e in self._entries],
                "uncovered": [u.to_json() for u in self._uncovered]}

    @classmethod
    def from_json(cls, data: Mapping | str) -> "PrivacyLedger":
        """Inverse of :meth:`to_json` (the dict or its JSON text), read as data: the events are
        dp-accounting's named classes (:func:`fedjax_dp.privacy.accounting.event_from_json`)
        or the shuffle event; anything malformed raises a one-line ValueError."""
        if isinstance(data, (str, bytes)):
            from fedjax_dp.core import files
            data = files.parse_json(data, what="a privacy ledger's JSON")
        if not isinstance(data, Mapping) or not isinstance(data.get("entries"), list):
            raise ValueError("a privacy ledger's JSON must be an object with a list 'entries'")
        uncovered = data.get("uncovered", [])
        if not isinstance(uncovered, list) or not all(
                isinstance(u, Mapping) and isinstance(u.get("release"), str)
                and isinstance(u.get("reason"), str) for u in uncovered):
            raise ValueError("a privacy ledger's 'uncovered' must be a list of {release, reason} "
                             "strings")
        return cls([LedgerEntry.from_json(e) for e in data["entries"]],
                   uncovered=[Uncovered(u["release"], u["reason"]) for u in uncovered])
