"""Calibrate one config key so that a run's headline epsilon meets a target, before training.

    value = calibrate(config, key, target_epsilon)     # e.g. key = "algorithm.noise_multiplier"

The headline epsilon is the one :func:`fedjax_dp.experiments.records.headline` reads from a
finished run (the first data-independent unit of the algorithm's ledger, the first accountant of
``privacy.accountants``, at ``privacy.delta``). Before any training it is computed from the
**planned ledger** of the run (:func:`planned_ledgers`), which the algorithm gives through its
``planned_ledger`` hook (:class:`fedjax_dp.algorithms.api.Algorithm`; an algorithm whose
``private`` hook is False has nothing to calibrate):

by default the algorithm's own ledger of the initial state (guarantees fixed by the config and
the data sizes); DP-FedSGD replays each agent's participation from the run's own sampling keys
(calibrated per seed); FedKT-L1/L2 use the data-independent Laplace composition (the LNMax bound
needs the votes); the ISRL-DP / shuffle-DP family calibrates its own noise per silo, so the key
must be ``algorithm.target_epsilon`` and the value is the target itself.

The search: epsilon is monotone in the key; the direction is read from two evaluations, the
bracket grows geometrically from the config's own value, and bisection on log(value) stops when
epsilon is within ``rtol`` (1e-4) below the target. The value returned always has ``epsilon <=
target``.
"""
from __future__ import annotations

import copy
import math
from typing import Callable

from fedjax_dp.experiments import config as config_lib
from fedjax_dp.experiments import records

__all__ = ["calibrate", "planned_epsilon", "planned_ledgers", "set_key", "get_key"]

_SELF_CALIBRATED = "algorithm.target_epsilon"


def get_key(config: dict, key: str):
    node = config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            raise config_lib.ConfigError(f"--calibrate key {key!r} is not in the config "
                                         f"(resolved config has no {part!r} there)")
        node = node[part]
    return node


def set_key(config: dict, key: str, value) -> dict:
    """A copy of ``config`` with the dotted ``key`` set to ``value``."""
    out = copy.deepcopy(config)
    node = out
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return out


class _Planner:
    """The planned ledger(s) of one config family, with the expensive set-up (data, init, the
    algorithm's ``planned_ledger`` preparation) done once and re-used for every value of the key."""

    def __init__(self, config: dict):
        from fedjax_dp.algorithms import api
        from fedjax_dp.experiments import runner
        self.config = config
        p = runner.plan(config)
        self.name = config["algorithm"]["name"]
        hooks = api.hooks(p.entry)
        if not hooks.private:
            raise config_lib.ConfigError(f"algorithm {self.name!r} gives no privacy guarantee: "
                                         f"nothing to calibrate")
        s = runner.setup(config)
        runtime = api.Runtime(chunk_size=config["run"]["chunk_size"] or None)
        state = p.entry.init(s.key, s.fed, s.model, p.algorithm_config, runtime)
        try:
            self._planned = hooks.planned_ledger(p.algorithm_config, state, s.key)
        except ValueError as e:            # the config leaves nothing to calibrate
            raise config_lib.ConfigError(str(e)) from None

    def ledgers(self, config: dict) -> tuple:
        from fedjax_dp.experiments import runner
        from fedjax_dp.privacy import PrivacyLedger
        out = self._planned(runner.plan(config).algorithm_config)
        return (out,) if isinstance(out, PrivacyLedger) else tuple(out)

    def epsilon(self, config: dict, unit: str | None = None) -> float:
        delta = config["privacy"]["delta"]
        accountants = tuple(config["privacy"]["accountants"])
        ledgers = self.ledgers(config)
        eps = None
        # the headline reads the first accountant that applies to its unit: try it alone first
        # (a PLD report of a long composition costs seconds), all of them if it does not apply
        for tried in ((accountants[0],), accountants):
            privacy = []
            try:
                for ledger in ledgers:
                    privacy += ledger.report(delta, accountants=tried)
            except ValueError:
                continue
            eps, _, _ = records.headline(privacy, accountants, unit)
            if eps is not None:
                break
        if eps is None:
            units = sorted({g["unit"] for g in privacy if not g.get("data_dependent")})
            what = f"for unit {unit!r} (its units: {units})" if unit else ""
            raise config_lib.ConfigError(f"algorithm {self.name!r} with this config gives no "
                                         f"data-independent guarantee {what}: nothing to "
                                         f"calibrate")
        return eps


def planned_ledgers(config: dict) -> tuple:
    """The ledger(s) a run of ``config`` will report (see the module docstring)."""
    return _Planner(config).ledgers(config)


def planned_epsilon(config: dict, unit: str | None = None) -> float:
    """The headline epsilon (or ``unit``'s) a run of ``config`` will report, before training."""
    return _Planner(config).epsilon(config, unit)


def check_key(config: dict, key: str, plan=None) -> bool:
    """Refuse a key :func:`calibrate` cannot set (before any run: a sweep's expansion calls it):
    not a real number, or another key than ``algorithm.target_epsilon`` for a family that
    calibrates its own noise; returns whether the family does (the target is then the value).
    ``plan``: the config's ``runner.plan``, when the caller has it."""
    v0 = get_key(config, key)
    if isinstance(v0, bool) or not isinstance(v0, (int, float)):
        raise config_lib.ConfigError(f"--calibrate key {key!r} must hold a number, got {v0!r}")
    from fedjax_dp.experiments import runner
    plan = runner.plan(config) if plan is None else plan
    if "target_epsilon" in plan.algorithm_config.__dataclass_fields__:
        if key != _SELF_CALIBRATED:                  # the ISRL-DP / SDP family
            raise config_lib.ConfigError(
                f"algorithm {config['algorithm']['name']!r} calibrates its own noise per "
                f"silo: use --calibrate {_SELF_CALIBRATED} (got {key!r})")
        return True
    if isinstance(v0, int):
        raise config_lib.ConfigError(f"--calibrate key {key!r} holds an integer ({v0}); "
                                     f"calibrate a real-valued key such as a noise multiplier")
    return False


def calibrate(config: dict, key: str, target_epsilon: float, *, unit: str | None = None,
              rtol: float = 1e-4, max_evaluations: int = 200) -> float:
    """The value of ``key`` (a numeric config key) whose run meets ``target_epsilon``: headline
    epsilon (of ``unit`` when given, e.g. ``"instance"`` for kNN-DPFL, whose first unit is the
    agent) in ``[target (1 - rtol), target]``. Raises ``ValueError`` naming the key when the
    target cannot be met (epsilon does not depend on the key, or no positive value reaches it)."""
    target = float(target_epsilon)
    if not (target > 0 and math.isfinite(target)):
        raise config_lib.ConfigError(f"--target-epsilon values must be positive and finite, "
                                     f"got {target_epsilon!r}")
    if check_key(config, key):
        return target
    v0 = get_key(config, key)
    planner = _Planner(config)
    count = [0]

    def eps_of(v: float) -> float:
        count[0] += 1
        if count[0] > max_evaluations:
            raise config_lib.ConfigError(f"calibrating {key!r} to epsilon {target} did not "
                                         f"converge in {max_evaluations} evaluations")
        try:
            return planner.epsilon(set_key(config, key, float(v)), unit)
        except ValueError as e:          # a value the algorithm refuses (e.g. a rate above 1)
            raise config_lib.ConfigError(f"calibrating {key!r}: value {v:.6g} is refused: {e}"
                                         ) from None

    return _solve(eps_of, target, float(v0) if v0 > 0 else 1.0, key, rtol)


def _solve(eps_of: Callable[[float], float], target: float, v0: float, key: str,
           rtol: float) -> float:
    """Bisection on log(v) for ``eps_of(v) in [target (1 - rtol), target]``."""
    e0 = eps_of(v0)
    e1 = eps_of(v0 * 2.0)
    if e1 == e0:
        raise config_lib.ConfigError(f"epsilon does not depend on --calibrate key {key!r} "
                                     f"(epsilon {e0:.6g} at {v0:.6g} and at {2 * v0:.6g})")
    decreasing = e1 < e0           # e.g. more noise, less epsilon
    # bracket: lo_v has eps > target side, hi_v has eps <= target side (in "privacy" order)
    v, e = v0, e0
    factor = 2.0 if (e > target) == decreasing else 0.5
    private_v, private_e = (v, e) if e <= target else (None, None)
    other_v = v if e > target else None
    for _ in range(80):
        if private_v is not None and other_v is not None:
            break
        v = v * factor
        e = eps_of(v)
        if e <= target:
            private_v, private_e = v, e
        else:
            other_v = v
    else:
        raise config_lib.ConfigError(f"no positive value of {key!r} reaches epsilon {target} "
                                     f"(epsilon {e:.6g} at {v:.6g})")
    if private_e >= target * (1 - rtol):
        return private_v
    for _ in range(200):
        mid = math.sqrt(private_v * other_v)
        e = eps_of(mid)
        if e <= target:
            private_v, private_e = mid, e
            if e >= target * (1 - rtol):
                break
        else:
            other_v = mid
        if abs(math.log(private_v / other_v)) < 1e-12:
            break
    return private_v
