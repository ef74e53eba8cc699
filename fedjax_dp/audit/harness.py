"""What an auditable mechanism is, the registry of them, and checks shared by every family.

A family's harness (``fedjax_dp/algorithms/<family>/audit.py``: it calls :func:`register` when
imported; this module imports no algorithm) builds an :class:`Auditable`: ``one_trial(key,
neighbour)``, ONE run of the library's mechanism on D (``neighbour=False``: where the statistic
tends to be larger) or D' as a float32 scalar (Gaussian mechanisms: the release projected on the
unit vector along ``f(D) - f(D')``, Neyman-Pearson optimal); ``trials`` (in one compiled call);
``claimed_epsilon(delta)``, the library's ledger for that one release. Worst cases, weakened
variants (``weaken=``, audited against the ORIGINAL claim) and their reasons: docs/audit.md.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from fedjax_dp.core import validation

__all__ = ["WEAKENINGS", "ACCOUNTANTS", "DEFAULT_CHUNK", "Auditable", "Spec", "MECHANISMS",
           "ParameterError", "register", "resolve", "build", "unit_vector", "flat", "direction",
           "canary_worlds", "canary_projection", "check_accountant",
           "check_scale", "check_gaussian_params"]

#: The weakened variants any mechanism may offer (each entry lists those it supports).
WEAKENINGS = ("halve-noise", "no-clip")
ACCOUNTANTS = ("rdp", "pld")
#: Trials per vmapped chunk inside one compiled call (bounds memory, not the result).
DEFAULT_CHUNK = 1 << 18


@dataclasses.dataclass(frozen=True)
class Auditable:
    """A mechanism ready to audit (see the module docstring)."""

    name: str
    params: dict                                   # resolved parameters (JSON-able)
    weaken: str | None
    unit: str
    relation: str
    one: Callable[..., jax.Array]                  # one(key, inputs) -> scalar statistic
    inputs: dict                                   # {neighbour: pytree of arrays}
    claimed: Callable[[float], float]
    structure: tuple = ()                          # what the compiled code depends on
    chunk: int = DEFAULT_CHUNK

    def one_trial(self, key: jax.Array, neighbour: bool) -> jax.Array:
        """One run of the mechanism in world D (``neighbour=False``) or D' -> scalar statistic."""
        return self.one(key, self.inputs[bool(neighbour)])

    def trials(self, key: jax.Array, num_trials: int, neighbour: bool) -> jax.Array:
        """``[num_trials]`` float32: ``one_trial`` over ``split(key, num_trials)`` in one compiled
        call (the world's arrays are arguments, not constants for XLA to fold)."""
        num_trials = validation.check_int("trials", num_trials, minimum=1)
        sig = (self.name, self.structure or id(self), num_trials, self.chunk)
        fn = _COMPILED.get(sig)
        if fn is None:
            chunk = min(self.chunk, num_trials)

            def run(key, inputs):
                keys = jax.random.split(key, num_trials)                  # [T] trial keys
                one = functools.partial(self.one, inputs=inputs)
                if num_trials <= chunk:
                    return jax.vmap(one)(keys)                            # [T]
                return jax.lax.map(one, keys, batch_size=chunk)           # [T], chunked

            fn = _COMPILED[sig] = jax.jit(run)
        return fn(key, self.inputs[bool(neighbour)])

    def jitted_one_trial(self, key: jax.Array, neighbour: bool) -> jax.Array:
        """:meth:`one_trial`, compiled (once per structure): for loops over a few trials."""
        sig = (self.name, self.structure or id(self), "one")
        fn = _COMPILED.get(sig)
        if fn is None:
            fn = _COMPILED[sig] = jax.jit(self.one)
        return fn(key, self.inputs[bool(neighbour)])

    def claimed_epsilon(self, delta: float) -> float:
        """The library's accounting: epsilon at ``delta`` of the (unweakened) release."""
        return float(self.claimed(validation.check_open_unit("delta", delta)))


#: Compiled trial runners per (name, structure): variants differing in array inputs share one.
_COMPILED: dict = {}


class ParameterError(ValueError):
    """A parameter (or ``weaken``) the audit refuses: ``param`` its name, ``reason`` the rest of
    the message (``str``: ``"<param> <reason>"``), so the command line can name its flag."""

    def __init__(self, param: str, reason: str):
        super().__init__(f"{param} {reason}")
        self.param, self.reason = param, reason


@dataclasses.dataclass(frozen=True)
class Spec:
    """A registry entry; ``builder(weaken, **params) -> Auditable``. ``applies``: parameter name
    -> ``fn(weaken, params) -> None`` (it takes effect) or the reason it would not (``params``
    resolved); a parameter given where it would not take effect is refused (:func:`resolve`)."""

    description: str
    defaults: dict
    weakenings: tuple
    builder: Callable[..., Auditable]
    applies: dict = dataclasses.field(default_factory=dict)


#: Every auditable mechanism by name, as the imported families registered them.
MECHANISMS: dict[str, Spec] = {}


def register(name: str, spec: Spec) -> None:
    """Make ``spec`` auditable as ``name`` (a family's ``audit.py`` does, on import)."""
    MECHANISMS[name] = spec


def resolve(mechanism: str, weaken: str | None = None, **params) -> tuple[Spec, dict]:
    """Check the mechanism, the weakening and the parameter names; fill in the defaults. A
    parameter given (not None) where it would not take effect (:attr:`Spec.applies`) is refused
    (:class:`ParameterError`), as is a name the mechanism does not take."""
    if mechanism not in MECHANISMS:
        raise ValueError(f"mechanism must be one of {sorted(MECHANISMS)} (the harnesses of the "
                         f"imported algorithm families), got {mechanism!r}")
    spec = MECHANISMS[mechanism]
    if weaken is not None and weaken not in spec.weakenings:
        raise ParameterError("weaken", f"must be one of {list(spec.weakenings)} (or None) for "
                                       f"mechanism {mechanism!r}, got {weaken!r}")
    given = {k: v for k, v in params.items() if v is not None}
    unknown = sorted(set(given) - set(spec.defaults))
    if unknown:
        raise ParameterError(unknown[0], f"is not a parameter of mechanism {mechanism!r}; its "
                                         f"parameters are {sorted(spec.defaults)}")
    full = {**spec.defaults, **given}
    for name in sorted(given):
        why = spec.applies[name](weaken, full) if name in spec.applies else None
        if why:
            raise ParameterError(name, f"does not apply to mechanism {mechanism!r} here: {why}")
    return spec, full


@functools.lru_cache(maxsize=64)
def _build_cached(mechanism: str, weaken: str | None, items: tuple) -> Auditable:
    return MECHANISMS[mechanism].builder(weaken, **dict(items))


def build(mechanism: str, weaken: str | None = None, **params) -> Auditable:
    """The :class:`Auditable` of ``mechanism`` with ``params`` (defaults from the registry);
    cached per (mechanism, weaken, parameters), so its compiled trials are shared."""
    _, full = resolve(mechanism, weaken, **params)
    return _build_cached(mechanism, weaken, tuple(sorted(full.items())))


def unit_vector(diff: np.ndarray, what: str) -> np.ndarray:
    """``diff / ||diff||`` (float32, host); ``ValueError`` naming ``what`` if ``diff = 0``."""
    n = float(np.linalg.norm(diff))
    if not n > 0:
        raise ValueError(f"{what}: the neighbouring worlds do not differ (zero difference)")
    return (diff / n).astype(np.float32)


def flat(tree) -> jax.Array:
    """The pytree's leaves raveled into one vector (``ravel_pytree``)."""
    return ravel_pytree(tree)[0]


def direction(tree) -> jax.Array:
    """The unit vector along a pytree (flattened), traced: ``v / ||v||``."""
    v = flat(tree)
    return v / jnp.linalg.norm(v)


def canary_worlds(n: int) -> dict[bool, jax.Array]:
    """The worlds' masks over ``n`` records (or agents): D (``False``) all present; D'
    (``True``) the canary, index 0, removed."""
    mask = jnp.ones((n,), bool)
    return {False: mask, True: mask.at[0].set(False)}


def canary_projection(loss_fn, release):
    """The statistic ``one(key, inputs) = <release(key, inputs), u>``: ``u`` the unit direction
    of the canary's (record 0's) gradient of ``loss_fn`` at ``inputs["params"]``, along which
    the worlds' noise-free releases differ (a clipped gradient is parallel to its raw one)."""
    def one(key, inputs):
        u = direction(jax.grad(loss_fn)(inputs["params"], inputs["x"][0], inputs["y"][0]))
        return jnp.dot(release(key, inputs), u)
    return one


def check_accountant(accountant: str) -> str:
    """``accountant`` in :data:`ACCOUNTANTS` (``ValueError`` naming ``accountant``)."""
    return validation.check_choice("accountant", accountant, ACCOUNTANTS)


def check_scale(canary_scale) -> float:
    """``canary_scale`` in ``[1, 1e6)``: the canary's gradient norm over the clip."""
    scale = validation.check_number("canary_scale", canary_scale)
    if not 1.0 <= scale < 1e6:
        raise ValueError(f"canary_scale must be in [1, 1e6), got {canary_scale!r}")
    return scale


def check_gaussian_params(noise_multiplier, clip_norm, canary_scale, accountant
                          ) -> tuple[float, float, float]:
    """``(z, C, canary_scale)`` of a clipped-Gaussian harness checked (``z, C`` finite ``> 0``),
    and the accountant's name; errors name each one."""
    z = validation.check_positive("noise_multiplier", noise_multiplier, finite=True)
    clip = validation.check_positive("clip_norm", clip_norm, finite=True)
    scale = check_scale(canary_scale)
    check_accountant(accountant)
    return z, clip, scale
