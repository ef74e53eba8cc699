"""Per-silo privacy: the events a silo's transcript composes, and noise calibrated to a target.

Unit ``'silo_record'``: one record of one silo. Relation: add/remove one record of one silo
(:data:`RELATION`); the silo's whole transcript (every message it sends, in every round it is
available) must be (eps, delta)-DP under it, whatever the server and the other silos do.

A silo i sends uploads of a few kinds u (gradient, difference, local step), each a
Poisson-sampled Gaussian mechanism with record rate p_iu and noise multiplier z (std / sensitivity,
sensitivity C for gradients, tau for differences). Its transcript is

    Composed_u SelfComposed(PoissonSampled(p_iu, Gaussian(z)), c_iu)                          (1)

with c_iu the number of uploads of kind u it sent. Silo availability is NOT used for
amplification (an observer sees who speaks); the silo's own record sampling is. The datasets of
the silos are disjoint, so the run's guarantee is the worst silo's (parallel composition).

Calibration (:func:`calibrate`), per silo: the smallest z_i such that (1) with silo i's own rates
and the planned count of each kind (every round: availability is known only afterwards) meets
the target (:func:`fedjax_dp.privacy.calibration.calibrate_noise_multiplier`, once per distinct
set of rates). ``calibrate_per_silo = false``: one z, for the largest rate of each kind.

The paper's closed form (Abadi et al.'s moments bound; Lowy et al. Thm 2.1 proof / Appendix H)
``sigma^2 = 8 C^2 R log(2/delta) / (n^2 eps^2)`` for the std of a silo's mean gradient over K of n
records for R rounds is :func:`paper_sigma`: a test of the calibration, not the method.
"""
from __future__ import annotations

import functools
import math
from typing import Sequence

import dp_accounting

from fedjax_dp.core import validation
from fedjax_dp.privacy import accounting
from fedjax_dp.privacy import calibration as calib_lib

UNIT = "silo_record"
RELATION = "add/remove one record of one silo (inter-silo record-level DP)"


def silo_event(noise_multiplier: float, releases: Sequence[tuple[float, int]]
               ) -> dp_accounting.DpEvent:
    """Eq. (1): ``releases`` = ``[(rate, count), ...]``, one pair per kind of upload; each kind
    is ``count`` releases of the private-gradient primitive
    (:func:`fedjax_dp.privacy.accounting.sampled_gaussian_event`)."""
    parts = [accounting.sampled_gaussian_event(noise_multiplier, float(p), int(c))
             for p, c in releases if int(c) > 0]
    if not parts:
        return dp_accounting.NoOpDpEvent()
    return parts[0] if len(parts) == 1 else dp_accounting.ComposedDpEvent(parts)


@functools.lru_cache(maxsize=256)
def _calibrate(target_epsilon: float, delta: float, releases: tuple, accountant: str) -> float:
    return calib_lib.calibrate_noise_multiplier(
        target_epsilon, delta, lambda z: silo_event(z, releases), accountant)


def calibrate(target_epsilon: float, delta: float, releases: Sequence[tuple[float, int]],
              accountant: str = "rdp") -> float:
    """Smallest noise multiplier z with ``eps(silo_event(z, releases), delta) <= target``."""
    target = validation.check_positive("algorithm.target_epsilon", target_epsilon, finite=True)
    delta = validation.check_open_unit("algorithm.delta", delta)
    validation.check_choice("algorithm.accountant", accountant, accounting.ACCOUNTANTS)
    key = tuple((float(p), int(c)) for p, c in releases if int(c) > 0)
    if not key:
        raise ValueError("releases must hold at least one kind of upload with count >= 1")
    try:
        return _calibrate(target, delta, key, accountant)
    except ValueError as e:           # the privacy layer names its bracket; a run, its config key
        if "unreachable" not in str(e):
            raise
        largest = calib_lib.DEFAULT_BRACKET[1]
        eps = accounting.epsilon(silo_event(largest, key), delta, accountant)
        raise ValueError(f"algorithm.target_epsilon={target:g} is unreachable: even noise "
                         f"multiplier {largest:g} gives a silo epsilon of {eps:.6g} at delta="
                         f"{delta:g} ({accountant}); raise algorithm.target_epsilon") from None


def paper_sigma(clip_norm: float, rounds: int, num_records: int, epsilon: float,
                delta: float) -> float:
    """``sqrt(8 C^2 R log(2/delta)) / (n eps)``: the paper's std of a silo's noisy mean gradient."""
    return math.sqrt(8.0 * clip_norm ** 2 * rounds * math.log(2.0 / delta)) / (num_records
                                                                              * epsilon)


def reference_calibrate(target_epsilon: float, delta: float,
                        releases: Sequence[tuple[float, int]], accountant: str = "rdp") -> float:
    """The noise multiplier the ISRL reference code uses (``DP_FL2.py``, ``spider``): EACH kind
    of upload sized alone for the full budget,

        z_ref = max_u calibrate(target, delta, [(p_u, c_u)])

    so the silo's whole transcript (eq. (1), all kinds composed) does NOT meet the target. Only
    to reproduce the authors' runs (:mod:`.spider`); :func:`calibrate` is the correct one."""
    kinds = [(float(p), int(c)) for p, c in releases if int(c) > 0]
    if not kinds:
        raise ValueError("releases must hold at least one kind of upload with count >= 1")
    return max(calibrate(target_epsilon, delta, [kind], accountant) for kind in kinds)
