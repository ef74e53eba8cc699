"""Argument checks that fail early with a message naming the parameter and its allowed range.

Every public entry point validates its inputs with these helpers *before* any JAX work, so a
user sees ``ValueError: sigma must be >= 0, got -1.0`` rather than a traceback from inside XLA.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np


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


def check_positive(name: str, value: Any) -> float:
    """``value > 0`` (infinity allowed)."""
    v = check_number(name, value)
    if not v > 0:
        raise ValueError(f"{name} must be > 0, got {_fmt(value)}")
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
              maximum: int | None = None) -> int:
    """An integer in ``[minimum, maximum]`` (either bound optional)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        if isinstance(value, (float, np.floating)) and float(value).is_integer():
            value = int(value)
        else:
            raise ValueError(f"{name} must be an integer, got {_fmt(value)}")
    value = int(value)
    if minimum is not None and value < minimum:
        bound = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ValueError(f"{name} must be {bound}, got {value}")
    if maximum is not None and value > maximum:
        bound = f"<= {maximum}" if minimum is None else f"in [{minimum}, {maximum}]"
        raise ValueError(f"{name} must be {bound}, got {value}")
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

    ``mismatch`` is the message when the length differs (it names both quantities).
    """
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
