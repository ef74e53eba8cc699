"""Argument checks that fail early with a message naming the parameter and its allowed range.

Every public entry point validates its inputs with these helpers *before* any JAX work, so a user
sees ``ValueError: sigma must be >= 0, got -1.0`` rather than a traceback from inside XLA."""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np


class ConfigError(ValueError):
    """An invalid config: the message names the offending key."""


def _fmt(value: Any) -> str:
    return repr(value)


def check_number(name: str, value: Any) -> float:
    """Return ``value`` as a float; reject non-numbers, NaN and booleans."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a number, got {_fmt(value)}")
    value = float(value)
    if math.isnan(value):
        raise ValueError(f"{name} must be a number, got NaN")
    return value


def check_nonnegative(name: str, value: Any, *, finite: bool = False) -> float:
    """``value >= 0`` (infinity allowed unless ``finite``)."""
    v = check_number(name, value)
    if v < 0 or (finite and math.isinf(v)):
        bound = "a finite number >= 0" if finite else ">= 0"
        raise ValueError(f"{name} must be {bound}, got {_fmt(value)}")
    return v


def check_positive(name: str, value: Any, *, finite: bool = False) -> float:
    """``value > 0`` (infinity allowed unless ``finite``)."""
    v = check_number(name, value)
    if not v > 0:
        raise ValueError(f"{name} must be > 0, got {_fmt(value)}")
    if finite and math.isinf(v):
        raise ValueError(f"{name} must be finite, got {_fmt(value)}")
    return v


def check_open_unit(name: str, value: Any) -> float:
    """``0 < value < 1`` (e.g. delta)."""
    v = check_number(name, value)
    if not 0.0 < v < 1.0:
        raise ValueError(f"{name} must be in the open interval (0, 1), got {_fmt(value)}")
    return v


def check_probability(name: str, value: Any, *, allow_zero: bool = False) -> float:
    """``0 < value <= 1`` (``0 <= value <= 1`` with ``allow_zero``), e.g. a sampling rate."""
    v = check_number(name, value)
    lo_ok = v >= 0.0 if allow_zero else v > 0.0
    if not (lo_ok and v <= 1.0):
        interval = "[0, 1]" if allow_zero else "(0, 1]"
        raise ValueError(f"{name} must be in {interval}, got {_fmt(value)}")
    return v


def check_int(name: str, value: Any, *, minimum: int | None = None,
              maximum: int | None = None, exact: bool = False) -> int:
    """An integer in ``[minimum, maximum]`` (either bound optional); an integral float (2.0) is
    converted unless ``exact``."""
    given = value
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        if not exact and isinstance(value, (float, np.floating)) and float(value).is_integer():
            value = int(value)
        else:
            raise ValueError(f"{name} must be an integer, got {_fmt(value)}")
    value = int(value)
    if minimum is not None and value < minimum:
        bound = (f">= {minimum}" if maximum is None or maximum == INT_MAX
                 else f"in [{minimum}, {maximum}]")
        raise ValueError(f"{name} must be {bound}, got {value}")
    if maximum is not None and value > maximum:
        bound = f"<= {maximum}" if minimum is None else f"in [{minimum}, {maximum}]"
        raise ValueError(f"{name} must be {bound}, got {_fmt(given)}")
    return value


def check_orders(name: str, orders: Any, *, minimum: float = 1.0, strict: bool = True,
                 integer: bool = False) -> np.ndarray:
    """A non-empty 1-D float64 grid of finite orders ``> minimum`` (``>= minimum`` unless
    ``strict``), integral if ``integer``: RDP orders (alpha > 1) or moment orders (l >= 1)."""
    arr = np.asarray(orders, dtype=np.float64)
    ok = arr.ndim <= 1 and arr.size > 0 and bool(np.all(np.isfinite(arr)))
    ok = ok and bool(np.all(arr > minimum if strict else arr >= minimum))
    if not ok or (integer and np.any(arr != np.round(arr))):
        kind = "integer" if integer else "finite"
        raise ValueError(f"{name} must be a non-empty 1-D list of {kind} orders "
                         f"{'>' if strict else '>='} {minimum:g}, got {arr.tolist()}")
    return arr.reshape(-1)


def check_keys(name: str, table: dict, options, accepts: str) -> None:
    """Refuse a table's keys outside ``options``, naming each as ``<name>.<key>`` and saying what
    ``name`` accepts (``accepts``)."""
    unknown = sorted(set(table) - set(options))
    if unknown:
        raise ValueError(f"unknown key(s) {[f'{name}.{k}' for k in unknown]}; {name} accepts "
                         f"{accepts}")


def options_table(name: str, value: Any, options: dict[str, str], *, off: Any, cls: type,
                  accepts: str, kinds: tuple | None = None) -> Any:
    """The common part of an option table's parser (``algorithm.adaptive_clip``, ``.noise``,
    ``.distributed_noise``): None for None and for the ``off`` word, the value itself for an
    instance of ``cls``; else a table (``name`` must be ``accepts``) of ``options``' keys
    (``{key: meaning}``, listed on refusal) whose ``kind``, with ``kinds``, is one of them. A
    table comes back as the dict for the caller to read its values."""
    if value is None or value is off or (isinstance(value, str) and value == off):
        return None
    if isinstance(value, cls):
        return value
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be {accepts}, got {_fmt(value)}")
    check_keys(name, value, options, "; ".join(f"{k}: {v}" for k, v in options.items()))
    if kinds is not None:
        check_choice(f"{name}.kind", value.get("kind"), kinds)
    return value


def check_choice(name: str, value: Any, choices: tuple | list) -> Any:
    if value not in choices:
        raise ValueError(f"{name} must be one of {sorted(map(str, choices))}, got {_fmt(value)}")
    return value


def check_finite_array(name: str, array: Any) -> np.ndarray:
    """A numeric array with no NaN or infinity (checked on the host, before tracing)."""
    arr = np.asarray(array)
    if arr.dtype.kind not in "biuf":
        raise ValueError(f"{name} must be a numeric array, got dtype {arr.dtype}")
    if arr.dtype.kind == "f" and not np.all(np.isfinite(arr)):
        bad = int(np.size(arr) - np.count_nonzero(np.isfinite(arr)))
        raise ValueError(f"{name} contains {bad} NaN or infinite value(s); features must be finite")
    return arr


def check_per_order(name: str, values: Any, num_orders: int, mismatch: str) -> np.ndarray:
    """A float64 vector with one entry ``>= 0`` (infinity allowed) per order of a grid.

    ``mismatch`` is the message when the length differs (it names both quantities)."""
    vec = np.asarray(values, dtype=np.float64).reshape(-1)
    if vec.size != num_orders:
        raise ValueError(mismatch)
    if np.any(np.isnan(vec)) or np.any(vec < 0):
        raise ValueError(f"{name} must be >= 0 at every order (infinity allowed), got "
                         f"{vec.tolist()}")
    return vec


def check_labels(name: str, labels: Any, num_classes: int) -> np.ndarray:
    """Integer labels in ``[0, num_classes)``."""
    arr = np.asarray(labels)
    if arr.dtype.kind not in "iu":
        if arr.dtype.kind == "f" and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
            arr = arr.astype(np.int64)
        else:
            raise ValueError(f"{name} must hold integer class labels, got dtype {arr.dtype}")
    if arr.size and (arr.min() < 0 or arr.max() >= num_classes):
        raise ValueError(
            f"{name} must be in [0, {num_classes - 1}] (num_classes={num_classes}), "
            f"got values in [{arr.min()}, {arr.max()}]")
    return arr


def check_same_length(names: tuple[str, str], a: Any, b: Any) -> None:
    la, lb = len(a), len(b)
    if la != lb:
        raise ValueError(f"{names[0]} and {names[1]} must have the same length, got {la} and {lb}")


# --------------------------------------------------------------------------- config fields
#
# Every config field (the TOML tables of ``fedjax_dp.experiments.config`` and the fields of every
# algorithm ``Config`` dataclass and of ``train.LocalTrainConfig``) is declared once with one of
# the specs below, checked by type and range by :func:`check_config` / :func:`check_value` before
# any work, and converted (an integral float 2.0 becomes the int 2). A spec also lists bad values
# of its own kind (:meth:`bad_values`), from which the tests generate the bad-input table.

#: The sane upper bound of every integer field (counts of rounds, steps, agents, ...).
INT_MAX = 2 ** 31 - 1
#: Batch sizes above this are memory-absurd (one batch of that many records on the device).
BATCH_MAX = 2 ** 20
#: Layer widths / channels / image sides above this are memory-absurd.
WIDTH_MAX = 2 ** 16
#: Numbers of layers (a model's depth, blocks per stage) above this are time-absurd.
DEPTH_MAX = 64
#: The longest list a config field may hold unless its spec states another bound.
LIST_MAX = 1024


def _interval(lo, hi, lo_open: bool, hi_open: bool) -> str:
    if lo is not None and hi is not None:
        return f"in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
    if lo is not None:
        return f"{'>' if lo_open else '>='} {lo:g}"
    if hi is not None:
        return f"{'<' if hi_open else '<='} {hi:g}"
    return ""


@dataclasses.dataclass(frozen=True)
class Int:
    """An integer in ``[minimum, maximum]`` (an integral float is converted; booleans and
    non-integral floats are refused). ``optional``: None is allowed too."""

    minimum: int | None = None
    maximum: int | None = INT_MAX
    optional: bool = False

    def __call__(self, name: str, value: Any) -> int | None:
        if value is None and self.optional:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, np.integer, float,
                                                             np.floating)) or (
                isinstance(value, (float, np.floating)) and not float(value).is_integer()):
            rng = _interval(self.minimum, self.maximum if self.maximum != INT_MAX or
                            self.minimum is None else None, False, False)
            none = " or None" if self.optional else ""
            raise ValueError(f"{name} must be an integer{' ' + rng if rng else ''}{none}, "
                             f"got {_fmt(value)}")
        return check_int(name, value, minimum=self.minimum, maximum=self.maximum)

    def good_value(self) -> int:
        """A value this spec accepts (for the generated bad lists of :class:`ListOf`)."""
        return self.minimum if self.minimum is not None else 0

    def bad_values(self) -> list:
        out = [2.5, True, "x", 1e30]
        if self.minimum is not None:
            out.append(self.minimum - 1)
        if self.maximum is not None and self.maximum < INT_MAX:
            out.append(self.maximum + 1)
        return out


@dataclasses.dataclass(frozen=True)
class Float:
    """A real number in the interval given by ``minimum`` / ``maximum`` (each open with
    ``low_open`` / ``high_open``); NaN and booleans are refused, and infinity too when ``finite``
    (the default). An int is converted to float. ``optional``: None is allowed too."""

    minimum: float | None = None
    maximum: float | None = None
    low_open: bool = False
    high_open: bool = False
    finite: bool = True
    optional: bool = False

    def describe(self) -> str:
        rng = _interval(self.minimum, self.maximum, self.low_open, self.high_open)
        bounded = self.minimum is not None and self.maximum is not None
        kind = "a finite number" if self.finite and not bounded else "a number"
        text = f"{kind} {rng}".strip() if not bounded else rng
        return text + (" or None" if self.optional else "")

    def __call__(self, name: str, value: Any) -> float | None:
        if value is None and self.optional:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer,
                                                             np.floating)):
            raise ValueError(f"{name} must be a number ({self.describe()}), got {_fmt(value)}")
        v = float(value)
        if math.isnan(v):
            raise ValueError(f"{name} must be a number ({self.describe()}), got NaN")
        ok = not (self.finite and math.isinf(v))
        if self.minimum is not None:
            ok = ok and (v > self.minimum if self.low_open else v >= self.minimum)
        if self.maximum is not None:
            ok = ok and (v < self.maximum if self.high_open else v <= self.maximum)
        if not ok:
            raise ValueError(f"{name} must be {self.describe()}, got {_fmt(value)}")
        return v

    def bad_values(self) -> list:
        out = ["x", True, math.nan]
        if self.finite or self.maximum is not None:
            out.append(math.inf)
        if self.minimum is not None:
            out.append(self.minimum if self.low_open else self.minimum - 1)
        if self.maximum is not None:
            out.append(self.maximum if self.high_open else self.maximum + 1)
        return out


@dataclasses.dataclass(frozen=True)
class Choice:
    """One of ``choices`` (strings)."""

    choices: tuple

    def __call__(self, name: str, value: Any) -> Any:
        if not isinstance(value, str) or value not in self.choices:
            raise ValueError(f"{name} must be one of {sorted(map(str, self.choices))}, "
                             f"got {_fmt(value)}")
        return value

    def good_value(self) -> str:
        """A value this spec accepts (for the generated bad lists of :class:`ListOf`)."""
        return self.choices[0]

    def bad_values(self) -> list:
        return ["no_such_choice", 3]


@dataclasses.dataclass(frozen=True)
class Bool:
    """``true`` or ``false`` (no number stands for a boolean)."""

    def __call__(self, name: str, value: Any) -> bool:
        if not isinstance(value, (bool, np.bool_)):
            raise ValueError(f"{name} must be true or false, got {_fmt(value)}")
        return bool(value)

    def bad_values(self) -> list:
        return [1, "yes"]


@dataclasses.dataclass(frozen=True)
class Text:
    """A string (``what`` says which, in the message); ``non_empty``: not blank."""

    what: str = "a string"
    non_empty: bool = False

    def __call__(self, name: str, value: Any) -> str:
        if not isinstance(value, str) or (self.non_empty and not value.strip()):
            raise ValueError(f"{name} must be {self.what}, got {_fmt(value)}")
        return value

    def bad_values(self) -> list:
        return [3, True] + (["", " "] if self.non_empty else [])


@dataclasses.dataclass(frozen=True)
class Table:
    """A TOML table (a dict; its keys are checked where they are used)."""

    def __call__(self, name: str, value: Any) -> dict:
        if not isinstance(value, dict):
            raise ValueError(f"{name} must be a table of options, e.g. {{}}, got {_fmt(value)}")
        return value

    def bad_values(self) -> list:
        return [3, "x"]


@dataclasses.dataclass(frozen=True)
class ListOf:
    """A list whose every item passes ``item`` (named ``name[]`` in the message); a list of at
    least ``min_length`` and at most ``max_length`` items (its length drives memory or time:
    every list has a stated bound, :data:`LIST_MAX` by default), ``distinct`` ones if set."""

    item: Any
    min_length: int = 0
    max_length: int = 0              # 0: LIST_MAX
    distinct: bool = False

    @property
    def longest(self) -> int:
        return self.max_length or LIST_MAX

    def __call__(self, name: str, value: Any) -> list:
        if not isinstance(value, (list, tuple)) or not \
                self.min_length <= len(value) <= self.longest:
            got = (f"{len(value)} items" if isinstance(value, (list, tuple)) and
                   len(value) > self.longest else _fmt(value))
            raise ValueError(f"{name} must be a list of {self.min_length} to {self.longest} "
                             f"item(s), got {got}")
        out = [self.item(f"{name}[]", v) for v in value]
        if self.distinct and len(set(map(repr, out))) != len(out):
            raise ValueError(f"{name} must not list an item twice, got {_fmt(list(value))}")
        return out

    def bad_values(self) -> list:
        good = self.item.good_value() if hasattr(self.item, "good_value") else None
        long = [] if good is None else [[good] * (self.longest + 1)]
        twice = [] if good is None or not self.distinct else [[good, good]]
        return [3, *([[b] for b in self.item.bad_values()]), *long, *twice]


@dataclasses.dataclass(frozen=True)
class Custom:
    """A field checked by ``check(name, value) -> converted value`` (e.g. a nested config)."""

    check: Any
    bad: tuple = ()            # bad values for the generated tests

    def __call__(self, name: str, value: Any) -> Any:
        return self.check(name, value)

    def bad_values(self) -> list:
        return list(self.bad)


@dataclasses.dataclass(frozen=True)
class Instance:
    """An instance of ``cls`` (e.g. the ``[train]`` table's ``LocalTrainConfig``, which checks
    its own fields); ``optional``: None is allowed too."""

    cls: type
    optional: bool = False

    def __call__(self, name: str, value: Any) -> Any:
        if not isinstance(value, self.cls) and not (value is None and self.optional):
            raise ValueError(f"{name} must be a {self.cls.__name__}"
                             f"{' or None' if self.optional else ''}, got {type(value).__name__}")
        return value

    def bad_values(self) -> list:
        return []


def field_specs(cls) -> dict[str, Any]:
    """The spec of every field of the dataclass ``cls``: the ``FIELDS`` tables of its classes,
    a subclass's entry overriding its base's. A field without a spec is a programming error."""
    specs: dict[str, Any] = {}
    for base in reversed(cls.__mro__):
        specs.update(base.__dict__.get("FIELDS", {}))
    missing = [f.name for f in dataclasses.fields(cls) if f.name not in specs]
    if missing:
        raise TypeError(f"{cls.__qualname__}: fields {missing} have no spec in a FIELDS table "
                        f"(fedjax_dp.core.validation)")
    return {f.name: specs[f.name] for f in dataclasses.fields(cls)}


def check_config(obj: Any, prefix: str) -> None:
    """Check every field of the (frozen) dataclass ``obj`` against :func:`field_specs`, in
    declaration order, naming ``<prefix>.<field>``; store the converted values (2.0 -> 2)."""
    for name, spec in field_specs(type(obj)).items():
        value = getattr(obj, name)
        converted = spec(f"{prefix}.{name}", value)
        if converted is not value:
            object.__setattr__(obj, name, converted)
