"""Optimizers by name: the one place a config's optimizer becomes an optax transformation.

Both sides of a round read it: the clients' ``train.optimizer``
(:class:`fedjax_dp.train.LocalTrainConfig`) and the server's ``algorithm.server_optimizer``
(FedAvg, DP-FedAvg, DP-FedSGD; :mod:`fedjax_dp.algorithms.rounds`). Three forms:

* a name (``"adam"``): the optax function of that name with ``learning_rate`` = the side's
  shorthand rate (``train.learning_rate``, ``algorithm.server_lr``); ``"momentum"`` is
  ``sgd(rate, momentum=0.9)``;
* a table ``{name = "adamw", learning_rate = 1e-3, weight_decay = 1e-4}``: any function in the
  ``optax`` namespace that returns a ``GradientTransformation``, called with the table's other
  keys as keyword arguments, each checked against the function's signature (a known parameter,
  a value of its annotated type: number, boolean or string) before any work;
* from Python, any ``optax.GradientTransformation``, used as it is.

:func:`parse` checks a value and returns its hashable form (a name, an :class:`Named`, or the
transformation); :func:`resolve` builds the transformation. A refusal is one ``ValueError``
naming the key (``train.optimizer.name``, ``train.optimizer.weight_decay``).
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import typing
from typing import Any

import jax
import jax.numpy as jnp
import optax

__all__ = ["Named", "parse", "resolve", "names", "SHORTHANDS", "describe"]

#: the names a bare string has always meant (the rate is the side's shorthand rate)
SHORTHANDS = ("adam", "momentum", "sgd")


@dataclasses.dataclass(frozen=True)
class Named:
    """``optax.<name>(**kwargs)``: a table's optimizer, hashable (``kwargs`` a sorted tuple of
    ``(key, value)`` pairs of numbers, booleans and strings)."""

    name: str
    kwargs: tuple = ()

    def make(self) -> optax.GradientTransformation:
        return getattr(optax, self.name)(**dict(self.kwargs))

    def table(self) -> dict:
        return {"name": self.name, **dict(self.kwargs)}


def _returns_transformation(fn: Any) -> bool:
    if not callable(fn) or inspect.isclass(fn):
        return False
    try:
        ret = inspect.signature(fn).return_annotation
    except (TypeError, ValueError):
        return False
    return inspect.isclass(ret) and issubclass(ret, optax.GradientTransformation)


@functools.lru_cache(maxsize=1)
def names() -> tuple[str, ...]:
    """Every optimizer name a config may give: the public functions of ``optax`` annotated to
    return a ``GradientTransformation`` (and ``"momentum"``)."""
    found = {k for k, v in vars(optax).items()
             if not k.startswith("_") and _returns_transformation(v)}
    return tuple(sorted(found | {"momentum"}))


def _leaf_types(annotation: Any) -> set:
    """The classes an annotation admits (a Union's arguments, recursively)."""
    args = typing.get_args(annotation)
    if not args:
        return {annotation} if inspect.isclass(annotation) else set()
    out = set()
    for a in args:
        out |= _leaf_types(a)
    return out


def _kinds(param: inspect.Parameter) -> tuple[str, ...]:
    """What a config may give for ``param``: ``"number"``, ``"boolean"``, ``"string"``."""
    ann = param.annotation
    if ann is inspect.Parameter.empty:
        d = param.default
        return (("boolean",) if isinstance(d, bool) else ("number",)
                if isinstance(d, (int, float)) else ("string",) if isinstance(d, str) else ())
    if ann is bool:
        return ("boolean",)
    leaves = _leaf_types(ann)
    kinds = ()
    if leaves & {int, float}:
        kinds += ("number",)
    if str in leaves:
        kinds += ("string",)
    return kinds


def _is_kind(value: Any, kind: str) -> bool:
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, str)


def _check_name(key: str, name: Any) -> str:
    if isinstance(name, str) and name in names():
        return name
    close = difflib.get_close_matches(name, names(), n=3) if isinstance(name, str) else []
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise ValueError(f"{key} must name an optax optimizer (a function of optax returning a "
                     f"GradientTransformation, e.g. sgd, adam, adamw, adagrad, yogi, lamb, "
                     f"rmsprop){hint}, got {name!r}")


def _check_kwargs(key: str, name: str, kwargs: dict) -> None:
    params = inspect.signature(getattr(optax, name)).parameters
    keyword = {k: p for k, p in params.items()
               if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    for k, v in kwargs.items():
        if k not in keyword:
            raise ValueError(f"unknown key {key}.{k}: optax.{name} takes "
                             f"{sorted(keyword) or 'no arguments'}")
        kinds = _kinds(keyword[k])
        if not kinds:
            raise ValueError(f"{key}.{k} cannot be set from a config (optax.{name}'s {k} is "
                             f"not a number, boolean or string); pass an "
                             f"optax.GradientTransformation from Python")
        if not any(_is_kind(v, kind) for kind in kinds):
            raise ValueError(f"{key}.{k} must be a {' or '.join(kinds)} (optax.{name}), "
                             f"got {v!r}")
    missing = [k for k, p in keyword.items() if p.default is p.empty and k not in kwargs]
    if missing:
        raise ValueError(f"{key}.{missing[0]} is required by optax.{name} (give "
                         f"{key} = {{name = \"{name}\", {missing[0]} = ...}})")


@functools.lru_cache(maxsize=256)
def _trial(key: str, spec: Named) -> None:
    """Build the transformation and trace one step on a tiny pytree (no compilation): a value
    optax refuses, or an optimizer whose update needs more than ``(updates, state, params)``
    (lbfgs's value and value_fn), is refused here, before any work."""
    try:
        opt = spec.make()
        params = {"w": jnp.zeros((2,), jnp.float32)}
        jax.eval_shape(lambda p: opt.update(p, opt.init(p), p), params)
    except Exception as e:          # noqa: BLE001 (optax's own message, on one line)
        text = " ".join(str(e).split()) or type(e).__name__
        raise ValueError(f"{key} = {spec.table()!r} does not run as a round's optimizer: "
                         f"{text[:300]}") from None


def parse(key: str, value: Any) -> Any:
    """``value`` checked as ``key`` (``train.optimizer``, ``algorithm.server_optimizer``): a name
    (returned as it is), a table (returned as a :class:`Named`), a :class:`Named`, or an
    ``optax.GradientTransformation`` (as it is). One-line ``ValueError`` naming the key."""
    if isinstance(value, optax.GradientTransformation):
        return value
    if isinstance(value, str):
        name = _check_name(key, value)
        if name not in SHORTHANDS:
            _check_kwargs(key, name, {"learning_rate": 1.0})
            _trial(key, Named(name, (("learning_rate", 1.0),)))
        return name
    if isinstance(value, Named):
        value = value.table()
    if not isinstance(value, dict):
        raise ValueError(f"{key} must be an optimizer name (e.g. \"adam\"), a table "
                         f"{{name = \"adamw\", learning_rate = 0.001, ...}} or, from Python, an "
                         f"optax.GradientTransformation, got {value!r}")
    if "name" not in value:
        raise ValueError(f"{key}.name is missing: a table names its optax optimizer, e.g. "
                         f"{{name = \"adam\", learning_rate = 0.01}}")
    name = _check_name(f"{key}.name", value["name"])
    if name == "momentum":
        raise ValueError(f"{key}.name = \"momentum\" is a shorthand of the string form; a table "
                         f"gives {{name = \"sgd\", learning_rate = ..., momentum = 0.9}}")
    kwargs = {k: v for k, v in value.items() if k != "name"}
    _check_kwargs(key, name, kwargs)
    spec = Named(name, tuple(sorted(kwargs.items())))
    _trial(key, spec)
    return spec


def resolve(value: Any, learning_rate: float) -> optax.GradientTransformation:
    """The transformation of a parsed ``value`` (:func:`parse`): a name with ``learning_rate``
    (``"sgd"``: ``sgd(lr)``, ``"momentum"``: ``sgd(lr, momentum=0.9)``, ``"adam"``:
    ``adam(lr)``, any other optax name ``optax.<name>(learning_rate=lr)``), a table's
    ``optax.<name>(**kwargs)``, or the transformation itself."""
    if isinstance(value, optax.GradientTransformation):
        return value
    if isinstance(value, Named):
        return value.make()
    if value == "momentum":
        return optax.sgd(learning_rate, momentum=0.9)
    return getattr(optax, value)(learning_rate)


def describe(value: Any) -> str:
    """A short text of a parsed optimizer (a name, ``optax.adamw(learning_rate=0.001, ...)``,
    or ``a GradientTransformation``)."""
    if isinstance(value, Named):
        args = ", ".join(f"{k}={v!r}" for k, v in value.kwargs)
        return f"optax.{value.name}({args})"
    if isinstance(value, str):
        return value
    return "an optax.GradientTransformation"
