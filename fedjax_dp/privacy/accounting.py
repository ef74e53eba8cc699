"""Thin wrappers on Google's ``dp_accounting``: event builders, accountants, epsilon/delta, JSON.

Privacy is data: an algorithm describes what it ran as a ``dp_accounting.DpEvent`` (built here),
and an accountant turns the event into ``(epsilon, delta)``. Two accountants:

* ``'rdp'``: ``dp_accounting.rdp.RdpAccountant`` on :data:`DEFAULT_RDP_ORDERS`; epsilon from the
  RDP curve by ``compute_epsilon`` (Canonne-Kamath-Steinke / Asoodeh et al. conversion,
  ``eps = min_a rdp(a) + log1p(-1/a) - log(delta * a) / (a - 1)``).
* ``'pld'``: ``dp_accounting.pld.PLDAccountant`` (privacy loss distributions, pessimistic
  discretisation) with ``value_discretization_interval =``
  :data:`DEFAULT_PLD_DISCRETIZATION` (1e-4): tighter than RDP, slower.

All accountants run under ``dp_accounting``'s default ``ADD_OR_REMOVE_ONE`` relation. The Gaussian
and Laplace events are stated in terms of the sensitivity under *the caller's* relation
(``noise_multiplier = std / sensitivity``), so a replace-one relation is expressed by its (larger)
sensitivity; Poisson subsampling is analysed for add/remove only. The one exception: an event
containing ``SampledWithoutReplacementDpEvent`` (fixed-size sampling) is analysed by the RDP
accountant under ``REPLACE_ONE`` (Wang et al. 2019; the only relation dp-accounting supports for it,
:func:`uses_replace_one`); the PLD accountant does not support it."""
from __future__ import annotations

import collections.abc
import contextlib
import functools
import logging
import typing
from collections.abc import Mapping, Sequence
from typing import Any

import attr
import dp_accounting
import numpy as np
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant

from fedjax_dp.core import validation

__all__ = [
    "ACCOUNTANTS", "DEFAULT_RDP_ORDERS", "DEFAULT_PLD_DISCRETIZATION", "make_accountant",
    "epsilon", "delta_for_epsilon", "event_rdp", "epsilon_from_rdp", "sampled_gaussian_event",
    "fixed_size_event", "gaussian_event", "laplace_event", "sampled_gaussian_epsilon",
    "event_to_json", "event_from_json", "check_event", "composed_accountant",
]

ACCOUNTANTS = ("rdp", "pld")

#: RDP orders: fine steps near 1 (small epsilon, large delta, heavy composition), then integer
#: and large orders (little composition, small noise). 1 < order; all data-dependent RDP vectors
#: in this library live on this grid unless told otherwise.
DEFAULT_RDP_ORDERS: tuple[float, ...] = tuple(
    [1.1, 1.25, 1.5, 1.75]
    + [2.0 + 0.25 * i for i in range(32)]          # 2, 2.25, ..., 9.75
    + [10.0 + 0.5 * i for i in range(21)]          # 10, 10.5, ..., 20
    + [float(a) for a in range(21, 64)]            # 21, ..., 63
    + [64.0, 80.0, 96.0, 128.0, 160.0, 192.0, 256.0, 384.0, 512.0, 768.0, 1024.0])

#: PLD discretisation of the privacy loss (the PLD accountant's ``value_discretization_interval``):
#: the reported epsilon is an upper bound that is loose by about this much per composition.
DEFAULT_PLD_DISCRETIZATION = 1e-4


# --------------------------------------------------------------------------- accountants

def make_accountant(kind: str = "rdp", orders: Sequence[float] | None = None, *,
                    value_discretization_interval: float = DEFAULT_PLD_DISCRETIZATION
                    ) -> dp_accounting.PrivacyAccountant:
    """A fresh, empty accountant: ``'rdp'`` (on ``orders``, default :data:`DEFAULT_RDP_ORDERS`)
    or ``'pld'`` (with ``value_discretization_interval``)."""
    validation.check_choice("accountant", kind, ACCOUNTANTS)
    if kind == "rdp":
        grid = validation.check_orders("orders", DEFAULT_RDP_ORDERS if orders is None else orders)
        return dp_accounting.rdp.RdpAccountant(orders=grid.tolist())
    if orders is not None:
        raise ValueError("orders applies to the 'rdp' accountant only, got accountant='pld'")
    interval = validation.check_positive("value_discretization_interval",
                                         value_discretization_interval)
    return dp_accounting.pld.PLDAccountant(value_discretization_interval=interval)


def check_event(name: str, event: Any) -> dp_event.DpEvent:
    """``event`` must be a ``dp_accounting.DpEvent``."""
    if not isinstance(event, dp_event.DpEvent):
        raise ValueError(f"{name} must be a dp_accounting DpEvent, got {type(event).__name__}")
    return event


def _contains(event: dp_event.DpEvent, kind: type) -> bool:
    if isinstance(event, kind):
        return True
    if isinstance(event, dp_event.ComposedDpEvent):
        return any(_contains(e, kind) for e in event.events)
    inner = getattr(event, "event", None)
    return isinstance(inner, dp_event.DpEvent) and _contains(inner, kind)


def _leaves(event: dp_event.DpEvent):
    """The mechanisms inside ``event`` (through composition and sampling wrappers)."""
    if isinstance(event, dp_event.ComposedDpEvent):
        for e in event.events:
            yield from _leaves(e)
        return
    inner = getattr(event, "event", None)
    if isinstance(inner, dp_event.DpEvent):
        yield from _leaves(inner)
    else:
        yield event


#: Gaussian noise multipliers dp-accounting computes reliably; outside, :func:`_accountable`
#: moves them to the bound on the side of less noise
GAUSSIAN_NOISE_RANGE = (1e-6, 1e12)


def _accountable(event: dp_event.DpEvent) -> dp_event.DpEvent:
    """``event`` with every Gaussian noise multiplier ``z`` inside :data:`GAUSSIAN_NOISE_RANGE`,
    always moved toward less noise, so that the epsilon stays an upper bound: ``0 < z < 1e-6``
    counts as ``z = 0`` (no guarantee, epsilon inf; below about 1e-150 dp-accounting's RDP of the
    sampled Gaussian underflows to a wrong epsilon of 0, or divides by zero), ``z > 1e12`` as
    ``1e12`` (epsilon 0 at double precision already; above about 1e150 the RDP overflows). A
    Laplace parameter ``b`` likewise: below 1e-6 non-private, above 1e12 as 1e12."""
    low, high = GAUSSIAN_NOISE_RANGE
    if isinstance(event, dp_event.GaussianDpEvent):
        z = event.noise_multiplier
        if 0 < z < low or z > high:
            return dp_accounting.GaussianDpEvent(0.0 if z < low else high)
        return event
    if isinstance(event, dp_event.LaplaceDpEvent):      # the same range (PLD: 1/b overflowed)
        b = event.noise_multiplier
        if b < low:
            return dp_accounting.NonPrivateDpEvent()
        return dp_accounting.LaplaceDpEvent(high) if b > high else event
    if isinstance(event, dp_event.ComposedDpEvent):
        events = [_accountable(e) for e in event.events]
        same = all(a is b for a, b in zip(events, event.events))
        return event if same else dp_accounting.ComposedDpEvent(events)
    inner = getattr(event, "event", None)
    if isinstance(inner, dp_event.DpEvent):
        new = _accountable(inner)
        if isinstance(new, dp_event.NonPrivateDpEvent):      # sampled or repeated: still none
            return new
        return event if new is inner else attr.evolve(event, event=new)
    return event


def pld_interval(event: dp_event.DpEvent) -> float:
    """The PLD discretisation for ``event``: :data:`DEFAULT_PLD_DISCRETIZATION`, coarsened for a
    small noise so that the grid stays small. A Gaussian of multiplier ``z`` has privacy losses
    over a range of about ``1/z^2``, a Laplace of parameter ``b`` over ``2/b``, so the default grid
    grows as ``1e4/z^2`` points (z = 0.1, 10 compositions: 19 s; z = 0.01: 75 GiB); the interval
    is ``max(1e-4, 1e-5/z^2, 1e-6/b)`` over the event's mechanisms (z = 0.1: 1e-3, 1.6 s), so it
    changes only below z = 0.32 and b = 0.01, where one application alone costs an epsilon above
    5. The PLD stays pessimistic (an upper bound): 10 compositions at z = 0.02-0.3 come out within
    0.05% above the exact Gaussian epsilon (``dp_accounting.get_epsilon_gaussian``), as at 1e-4."""
    interval = DEFAULT_PLD_DISCRETIZATION
    for leaf in _leaves(_accountable(event)):
        if isinstance(leaf, dp_event.GaussianDpEvent) and leaf.noise_multiplier > 0:
            interval = max(interval, 1e-5 / leaf.noise_multiplier ** 2)
        elif isinstance(leaf, dp_event.LaplaceDpEvent) and leaf.noise_multiplier > 0:
            interval = max(interval, 1e-6 / leaf.noise_multiplier)
    return interval


def uses_replace_one(event: dp_event.DpEvent) -> bool:
    """True if ``event`` contains fixed-size sampling (``SampledWithoutReplacementDpEvent``),
    which dp-accounting analyses under the replace-one relation only."""
    return _contains(event, dp_event.SampledWithoutReplacementDpEvent)


def uses_replace_special(event: dp_event.DpEvent) -> bool:
    """True if ``event`` contains tree aggregation (``SingleEpochTreeAggregationDpEvent``),
    which dp-accounting's RDP accountant analyses under its replace-special relation only: one
    record replaced by a zero (the agent's contribution present or absent, its slot kept)."""
    return _contains(event, dp_event.SingleEpochTreeAggregationDpEvent)


def composed_accountant(event: dp_event.DpEvent, accountant: str = "rdp",
                        orders: Sequence[float] | None = None
                        ) -> dp_accounting.PrivacyAccountant:
    """A fresh accountant (:func:`make_accountant`) that has composed ``event`` once.

    Raises ``ValueError`` if the accountant does not support the event."""
    check_event("event", event)
    event = _accountable(event)
    acc = (make_accountant(accountant, orders) if accountant != "pld" else
           make_accountant("pld", orders, value_discretization_interval=pld_interval(event)))
    special = uses_replace_special(event)
    if accountant == "rdp" and (uses_replace_one(event) or special):
        rel = dp_accounting.NeighboringRelation
        grid = validation.check_orders("orders", DEFAULT_RDP_ORDERS if orders is None else orders)
        acc = dp_accounting.rdp.RdpAccountant(
            orders=grid.tolist(),
            neighboring_relation=rel.REPLACE_SPECIAL if special else rel.REPLACE_ONE)
    if not acc.supports(event):
        raise ValueError(f"the {accountant!r} accountant does not support "
                         f"{type(event).__name__} (event: {event})")
    with _summarised_convergence_warnings():
        acc.compose(event)
    return acc


_EXCLUDED_ORDERS: set[str] = set()
_LOG = logging.getLogger("fedjax_dp.privacy")


class _ConvergenceFilter(logging.Filter):
    """Drops dp-accounting's per-order "failed to converge ... Excluding this order" warnings
    (printed at low fractional RDP orders of a subsampled Gaussian, on every run) and collects
    them, so they are summarised once per distinct (q, sigma) at INFO level instead. Excluding
    an order is safe: epsilon is a minimum over the remaining orders, still an upper bound."""

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "failed to converge" in message:
            self.seen.append(message)
            return False
        return True


@contextlib.contextmanager
def _summarised_convergence_warnings():
    absl_logger = logging.getLogger("absl")
    flt = _ConvergenceFilter()
    absl_logger.addFilter(flt)
    try:
        yield
    finally:
        absl_logger.removeFilter(flt)
        if flt.seen:
            params = sorted({m.split(" with ", 1)[-1].split(", alpha=")[0] for m in flt.seen})
            for p in params:
                if p not in _EXCLUDED_ORDERS:
                    _EXCLUDED_ORDERS.add(p)
                    _LOG.info("dp-accounting could not evaluate some low RDP orders (%s); they "
                              "are excluded and epsilon uses the others (still an upper bound)",
                              p)


# dp-accounting's RDP of the Poisson-subsampled Gaussian (a series per order, about 1 ms each) is
# a pure function of (q, noise_multiplier, orders) whose arguments recur (a calibration's probes in
# every cell of a sweep, the same config run twice): memoised per process, keyed on each argument's
# type and value, a hit returning a copy of the very array that call computed (bit for bit).
_SAMPLED_GAUSSIAN_RDP = getattr(rdp_privacy_accountant._compute_rdp_poisson_subsampled_gaussian,
                                "__wrapped__",             # a reloaded module wraps the original
                                rdp_privacy_accountant._compute_rdp_poisson_subsampled_gaussian)


@functools.lru_cache(maxsize=4096)
def _sampled_gaussian_rdp_of(key: tuple) -> np.ndarray:
    q, noise_multiplier, *orders = (value for _, value in key)
    return _SAMPLED_GAUSSIAN_RDP(q, noise_multiplier, orders)


def _memoised_sampled_gaussian_rdp(q, noise_multiplier, orders):
    try:
        key = tuple((type(v), v) for v in (q, noise_multiplier, *orders))
        hash(key)
    except TypeError:                        # unhashable: computed, not memoised
        return _SAMPLED_GAUSSIAN_RDP(q, noise_multiplier, orders)
    return np.array(_sampled_gaussian_rdp_of(key), copy=True)


_memoised_sampled_gaussian_rdp.__wrapped__ = _SAMPLED_GAUSSIAN_RDP
rdp_privacy_accountant._compute_rdp_poisson_subsampled_gaussian = _memoised_sampled_gaussian_rdp


def epsilon(event: dp_event.DpEvent, delta: float, accountant: str = "rdp", *,
            orders: Sequence[float] | None = None) -> float:
    """Smallest epsilon such that ``event`` is ``(epsilon, delta)``-DP, by the named accountant."""
    delta = validation.check_open_unit("delta", delta)
    return float(composed_accountant(event, accountant, orders).get_epsilon(delta))


def delta_for_epsilon(event: dp_event.DpEvent, epsilon: float, accountant: str = "rdp", *,
                      orders: Sequence[float] | None = None) -> float:
    """Smallest delta such that ``event`` is ``(epsilon, delta)``-DP, by the named accountant."""
    epsilon = validation.check_nonnegative("epsilon", epsilon)
    return float(composed_accountant(event, accountant, orders).get_delta(epsilon))


def event_rdp(event: dp_event.DpEvent, orders: Sequence[float] | None = None) -> np.ndarray:
    """The RDP curve ``rdp(alpha)`` of ``event`` at ``orders`` (default: DEFAULT_RDP_ORDERS)."""
    return np.asarray(composed_accountant(event, "rdp", orders).rdp, dtype=np.float64)


def epsilon_from_rdp(orders: Sequence[float], rdp: Sequence[float], delta: float
                     ) -> tuple[float, float]:
    """``(epsilon, optimal_order)`` from a per-order RDP vector (e.g. a data-dependent PATE bound).

    Uses ``dp_accounting.rdp.rdp_privacy_accountant.compute_epsilon``: ``eps = min_a [rdp(a) +
    log1p(-1/a) - log(delta * a) / (a - 1)]`` (clipped at 0)."""
    delta = validation.check_open_unit("delta", delta)
    grid = validation.check_orders("orders", orders)
    vec = validation.check_per_order(
        "rdp", rdp, grid.size, f"orders and rdp must have the same length, got {grid.size} and "
        f"{np.size(rdp)}")
    eps, order = rdp_privacy_accountant.compute_epsilon(grid.tolist(), vec.tolist(), delta)
    return float(eps), float(order)


# --------------------------------------------------------------------------- event builders

def _repeat(event: dp_event.DpEvent, count: int) -> dp_event.DpEvent:
    if count == 0:
        return dp_accounting.NoOpDpEvent()          # nothing ran (dp_accounting rejects count 0)
    return event if count == 1 else dp_accounting.SelfComposedDpEvent(event, count)

def gaussian_event(noise_multiplier: float, count: int = 1) -> dp_event.DpEvent:
    """``count`` adaptive applications of the Gaussian mechanism with std ``z * sensitivity``.

    ``GaussianDpEvent(z)`` (``count == 1``) or ``SelfComposedDpEvent(GaussianDpEvent(z), count)``;
    RDP ``count * alpha / (2 z^2)``. ``count == 0`` gives ``NoOpDpEvent()``."""
    z = validation.check_nonnegative("noise_multiplier", noise_multiplier)
    count = validation.check_int("count", count, minimum=0)
    return _repeat(dp_accounting.GaussianDpEvent(z), count)


def laplace_event(noise_multiplier: float, count: int = 1) -> dp_event.DpEvent:
    """``count`` applications of the Laplace mechanism, ``noise_multiplier = b / l1_sensitivity``.

    With scale ``b`` and L1 sensitivity ``Delta``, one application is ``(Delta / b, 0)``-DP, i.e.
    ``epsilon = 1 / noise_multiplier``. ``LaplaceDpEvent(noise_multiplier)``, self-composed if
    ``count != 1``. ``noise_multiplier > 0``."""
    b = validation.check_positive("noise_multiplier", noise_multiplier)
    count = validation.check_int("count", count, minimum=0)
    return _repeat(dp_accounting.LaplaceDpEvent(b), count)


def sampled_gaussian_event(noise_multiplier: float, sampling_rate: float,
                           steps: int) -> dp_event.DpEvent:
    """DP-SGD / DP-FedAvg: ``SelfComposedDpEvent(PoissonSampledDpEvent(q, GaussianDpEvent(z)), T)``.

    Each of ``T = steps`` rounds includes every unit independently with probability
    ``q = sampling_rate`` and releases the sum of their clipped contributions plus
    ``N(0, (z * S)^2)`` (``S`` the clip norm, ``z = noise_multiplier``). With ``q == 1`` there is
    no sampling and the Poisson wrapper is dropped; ``steps == 0`` gives ``NoOpDpEvent()``.
    Relation: add/remove one unit.
    """
    z = validation.check_nonnegative("noise_multiplier", noise_multiplier)
    q = validation.check_probability("sampling_rate", sampling_rate)
    steps = validation.check_int("steps", steps, minimum=0)
    event: dp_event.DpEvent = dp_accounting.GaussianDpEvent(z)
    if q < 1.0:
        event = dp_accounting.PoissonSampledDpEvent(q, event)
    if steps == 0:
        return dp_accounting.NoOpDpEvent()
    return dp_accounting.SelfComposedDpEvent(event, steps)


def fixed_size_event(noise_multiplier: float, num_records: int, size: int, steps: int = 1):
    """``SelfComposed(SampledWithoutReplacement(n, m, Gaussian(z)), steps)``: fixed-size
    selection of ``m`` of ``n`` records. Relation: replace one record (dp-accounting's relation
    for this event; a replaced record moves the clipped sum by up to 2C, so ``z`` is the noise
    std over 2C)."""
    event = dp_accounting.SampledWithoutReplacementDpEvent(
        int(num_records), int(size), dp_accounting.GaussianDpEvent(float(noise_multiplier)))
    return event if steps == 1 else dp_accounting.SelfComposedDpEvent(event, int(steps))


def sampled_gaussian_epsilon(noise_multiplier: float, sampling_rate: float, steps: int,
                             delta: float, accountant: str = "rdp") -> float:
    """Epsilon of :func:`sampled_gaussian_event` at ``delta``."""
    return epsilon(sampled_gaussian_event(noise_multiplier, sampling_rate, steps), delta,
                   accountant)


# --------------------------------------------------------------------------- JSON

def _to_jsonable(value: Any) -> Any:
    if isinstance(value, dp_event.DpEventNamedTuple):
        out = {"class_name": value.class_name, "module_name": value.module_name}
        for field in value._fields:
            if field not in ("class_name", "module_name"):
                out[field] = _to_jsonable(getattr(value, field))
        return out
    if isinstance(value, Mapping):
        return {str(k): _to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise ValueError(f"cannot convert {type(value).__name__} in a DpEvent to JSON: {value!r}")


def event_to_json(event: dp_event.DpEvent) -> dict:
    """A DpEvent as nested JSON-able dicts, from ``event.to_named_tuple()``.

    Each event becomes ``{"class_name": ..., "module_name": ..., <field>: <value>, ...}``; nested
    events (``event``) and lists of events (``events``) are converted recursively. Floats may be
    ``inf`` (``json.dumps`` writes ``Infinity``)."""
    check_event("event", event)
    return _to_jsonable(event.to_named_tuple())


#: The DpEvent classes a JSON event may name, by exact class name: dp-accounting's own
#: (``dp_accounting.dp_event``), listed here, never looked up by a name read from a file.
EVENT_CLASSES: dict[str, type] = {
    name: cls for name, cls in vars(dp_event).items()
    if isinstance(cls, type) and issubclass(cls, dp_event.DpEvent) and cls is not dp_event.DpEvent
    and cls.__module__ == dp_event.__name__ and cls.__name__ == name and attr.has(cls)}
#: the module names an event's JSON may carry (``to_named_tuple``'s, or the package's)
_EVENT_MODULES = ("dp_accounting.dp_event", "dp_accounting")
#: events nest (composed, sampled) at most this deep in a JSON event
MAX_EVENT_DEPTH = 64


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _typed(value: Any, kind: Any) -> bool:
    """Whether a field's value (events already built) has the field's annotated type."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is float:
        return _number(value)
    if kind is int:
        return _number(value) and float(value).is_integer()
    if isinstance(kind, type) and issubclass(kind, dp_event.DpEvent):
        return isinstance(value, dp_event.DpEvent)
    if origin is typing.Union:
        return any(_typed(value, a) for a in args)
    if origin in (list, tuple, Sequence, collections.abc.Sequence):
        return isinstance(value, list) and all(_typed(v, args[0] if args else float)
                                               for v in value)
    return value is None or _number(value)


def _event_from_jsonable(value: Mapping, where: str, depth: int) -> dp_event.DpEvent:
    name = value["class_name"]
    module_name = value.get("module_name", "dp_accounting.dp_event")
    cls = EVENT_CLASSES.get(name) if isinstance(name, str) else None
    if cls is None or module_name not in _EVENT_MODULES:
        shown = (f"{module_name}.{name}" if isinstance(module_name, str) else name) \
            if isinstance(name, str) else name
        raise ValueError(f"{where}: unknown DpEvent class {shown!r}; an event names one of "
                         f"dp_accounting.dp_event's classes ({', '.join(sorted(EVENT_CLASSES))})")
    fields = {f.name: f for f in attr.fields(cls)}
    given = {k: v for k, v in value.items() if k not in ("class_name", "module_name")}
    unknown = sorted(set(given) - set(fields))
    missing = sorted(k for k, f in fields.items()
                     if k not in given and f.default is attr.NOTHING)
    if unknown or missing:
        raise ValueError(f"{where}: {name} takes the fields {sorted(fields)}"
                         + (f"; unknown {unknown}" if unknown else "")
                         + (f"; missing {missing}" if missing else ""))
    built = {k: _from_jsonable(v, f"{where}.{k}", depth + 1) for k, v in given.items()}
    for k, v in built.items():
        if not _typed(v, fields[k].type):
            kind = fields[k].type
            shown = kind.__name__ if isinstance(kind, type) else str(kind).replace(
                "dp_accounting.dp_event.", "").replace("typing.", "")
            raise ValueError(f"{where}: {name}.{k} = {v!r} is not a {shown}")
    try:
        return cls(**built)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: {name} refuses its fields ({e})") from None


def _from_jsonable(value: Any, where: str = "event", depth: int = 0) -> Any:
    """A JSON value as events: a mapping with ``class_name`` is looked up in
    :data:`EVENT_CLASSES` (nothing is imported), its fields checked against the class's."""
    if depth > MAX_EVENT_DEPTH:
        raise ValueError(f"{where}: events nested deeper than {MAX_EVENT_DEPTH} levels")
    if isinstance(value, Mapping) and "class_name" in value:
        return _event_from_jsonable(value, where, depth)
    if isinstance(value, list):
        return [_from_jsonable(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        return {k: _from_jsonable(v, f"{where}.{k}", depth + 1) for k, v in value.items()}
    return value


def event_from_json(data: Mapping | str) -> dp_event.DpEvent:
    """Inverse of :func:`event_to_json` (accepts the dict or its ``json.dumps`` string). Data,
    never code: a class is one of :data:`EVENT_CLASSES` by its exact name (a ``module_name``
    other than dp_accounting's, or a class outside dp_event, is refused with a ValueError), and
    its fields must be the class's own with their types."""
    if isinstance(data, (str, bytes)):
        from fedjax_dp.core import files
        data = files.parse_json(data, what="a DpEvent's JSON", max_depth=2 * MAX_EVENT_DEPTH)
    if not isinstance(data, Mapping) or "class_name" not in data:
        raise ValueError(f"a DpEvent's JSON must be an object with a class_name, got "
                         f"{type(data).__name__}")
    event = _from_jsonable(data)
    return check_event("data", event)

