"""Noise calibration: the smallest noise multiplier that meets a target ``(epsilon, delta)``.

A thin wrapper on ``dp_accounting.calibrate_dp_mechanism`` (Brent's method on ``gap(z) =
eps(make_event(z), delta) - target_epsilon`` in an explicit bracket, with a fallback bisection that
guarantees ``gap(z) <= 0``). The result ``z`` satisfies ``eps(make_event(z)) <= target_epsilon`` and
is within ``tol`` of the smallest such ``z``, provided epsilon decreases as the noise multiplier
grows (true for the events built in :mod:`fedjax_dp.privacy.accounting`)."""
from __future__ import annotations

import math
from typing import Callable

import dp_accounting
import numpy as np
from dp_accounting import dp_event

from fedjax_dp.core import validation
from fedjax_dp.privacy import accounting

__all__ = ["DEFAULT_BRACKET", "calibrate_noise_multiplier", "calibrate_sampled_gaussian",
           "worst_members"]

#: Default search interval for the noise multiplier.
DEFAULT_BRACKET: tuple[float, float] = (0.0, 500.0)


def calibrate_noise_multiplier(target_epsilon: float, delta: float,
                               make_event: Callable[[float], dp_event.DpEvent],
                               accountant: str = "rdp", *,
                               bracket: tuple[float, float] = DEFAULT_BRACKET,
                               tol: float = 1e-3) -> float:
    """Smallest noise multiplier ``z`` in ``bracket`` (to within ``tol``) with
    ``epsilon(make_event(z), delta, accountant) <= target_epsilon``.

    Raises ``ValueError`` if the target is unreachable in the bracket (even the upper end gives a
    larger epsilon) or already met at its lower end (the answer lies below the bracket)."""
    target = validation.check_positive("target_epsilon", target_epsilon, finite=True)
    delta = validation.check_open_unit("delta", delta)
    validation.check_choice("accountant", accountant, accounting.ACCOUNTANTS)
    if not callable(make_event):
        raise ValueError(f"make_event must be callable (noise_multiplier -> DpEvent), got "
                         f"{type(make_event).__name__}")
    if not (isinstance(bracket, (tuple, list)) and len(bracket) == 2):
        raise ValueError(f"bracket must be a pair (low, high), got {bracket!r}")
    lo = validation.check_nonnegative("bracket[0]", bracket[0])
    hi = validation.check_positive("bracket[1]", bracket[1])
    if not (math.isfinite(hi) and lo < hi):
        raise ValueError(f"bracket must satisfy 0 <= low < high < inf, got {tuple(bracket)!r}")
    tol = validation.check_positive("tol", tol)

    def eps_at(z: float) -> float:
        return accounting.epsilon(make_event(z), delta, accountant)

    eps_hi = eps_at(hi)
    if eps_hi > target:
        raise ValueError(
            f"target_epsilon={target:g} is unreachable in bracket {tuple(bracket)}: the largest "
            f"noise multiplier {hi:g} gives epsilon={eps_hi:.6g} at delta={delta:g} "
            f"({accountant}); raise bracket[1] or the target")
    eps_lo = eps_at(lo)
    if eps_lo <= target:
        raise ValueError(
            f"target_epsilon={target:g} is already met at the bracket's lower end: noise "
            f"multiplier {lo:g} gives epsilon={eps_lo:.6g} at delta={delta:g} ({accountant}); "
            f"lower bracket[0]")
    z = dp_accounting.calibrate_dp_mechanism(
        make_fresh_accountant=lambda: _Composing(accountant),
        make_event_from_param=make_event,
        target_epsilon=target, target_delta=delta,
        bracket_interval=dp_accounting.ExplicitBracketInterval(lo, hi),
        discrete=False, tol=tol)
    return float(z)


class _Composing:
    """The fresh accountant ``dp_accounting.calibrate_dp_mechanism`` asks for, composing through
    :func:`accounting.composed_accountant` as every epsilon here does (noise multipliers moved
    into the accountable range, the PLD grid fitted to the probe's noise, the relation an event
    needs)."""

    def __init__(self, kind: str):
        self.kind, self.ledger, self._acc = kind, dp_accounting.NoOpDpEvent(), None

    def compose(self, event) -> "_Composing":
        self._acc = accounting.composed_accountant(event, self.kind)
        return self

    def get_epsilon(self, delta: float) -> float:
        return self._acc.get_epsilon(delta)


def calibrate_sampled_gaussian(target_epsilon: float, delta: float, sampling_rate: float,
                               steps: int, accountant: str = "rdp", *,
                               bracket: tuple[float, float] = DEFAULT_BRACKET,
                               tol: float = 1e-3) -> float:
    """Noise multiplier for DP-SGD / DP-FedAvg: ``steps`` rounds of Poisson sampling at
    ``sampling_rate`` with the Gaussian mechanism (:func:`accounting.sampled_gaussian_event`)."""
    q = validation.check_probability("sampling_rate", sampling_rate)
    steps = validation.check_int("steps", steps, minimum=1)
    return calibrate_noise_multiplier(
        target_epsilon, delta, lambda z: accounting.sampled_gaussian_event(z, q, steps),
        accountant, bracket=bracket, tol=tol)


def worst_members(rates: np.ndarray, counts: np.ndarray, noise_multipliers=None) -> np.ndarray:
    """Indices of the members (silos, agents) that can be the worst: not dominated in every
    (rate, count, z).

    ``rates``, ``counts``: ``[N, U]``; ``noise_multipliers``: ``[N]`` or None. Epsilon of a
    sampled Gaussian composition (ISRL's eq. (1), DP-FedSGD's eq. (3)) grows with every rate and
    every count and shrinks with z, so a member with all rates and counts no larger and z no
    smaller than another's never has the larger epsilon. One member per distinct row.
    """
    rates = np.asarray(rates, np.float64)
    if noise_multipliers is not None:          # -z as one more "larger is worse" column
        rates = np.concatenate([rates, -np.asarray(noise_multipliers, np.float64)[:, None]], 1)
    rows: dict[tuple, int] = {}
    for i, row in enumerate(zip(map(tuple, rates.tolist()),
                                map(tuple, np.asarray(counts, np.int64).tolist()))):
        rows.setdefault(row, i)
    keys = list(rows)

    def dominated(a, b):          # b dominates a
        return a != b and all(x <= y for x, y in zip(a[0], b[0])) and \
            all(x <= y for x, y in zip(a[1], b[1]))

    keep = [rows[a] for a in keys if not any(dominated(a, b) for b in keys)]
    return np.asarray(sorted(keep), np.int64)
