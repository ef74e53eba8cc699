"""``audit(mechanism, ...)``: an empirical lower bound on a mechanism's epsilon, beside its claim.

The library's mechanism runs ``trials`` times on D and on its neighbour D' (:mod:`.harness`)
and the best threshold test between the two samples of its statistic becomes a one-sided lower
bound on epsilon at ``delta``, holding with probability ``>= confidence``
(:func:`.bounds.audit_threshold`). Keys: world D uses ``fold_in(key(seed), 0)``, world D'
``fold_in(key(seed), 1)`` (:func:`world_keys`), each world's trials ``split(world_key, trials)``.
A bound above the claim proves a privacy bug; one below it proves nothing (docs/audit.md).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from fedjax_dp.audit import bounds, harness
from fedjax_dp.core import validation

__all__ = ["AuditResult", "audit", "world_keys", "MAX_TRIALS"]

#: Upper limit on trials per world (memory of the host-side statistics, 8 bytes each).
MAX_TRIALS = 1 << 26


@dataclasses.dataclass(frozen=True)
class AuditResult:
    """What an audit found. ``fpr`` / ``fnr`` are observed on the evaluation half (``threshold``
    chosen on the other half); ``fpr_upper`` / ``fnr_upper`` their Clopper-Pearson upper bounds
    (``1 - (1 - confidence)/2`` each)."""

    epsilon_lower_bound: float
    claimed_epsilon: float
    trials: int
    delta: float
    confidence: float
    threshold: float
    fpr: float
    fnr: float
    mechanism: str
    params: dict
    weaken: str | None = None
    fpr_upper: float = float("nan")
    fnr_upper: float = float("nan")
    seed: int = 0
    unit: str = ""
    relation: str = ""

    @property
    def consistent(self) -> bool:
        """``epsilon_lower_bound <= claimed_epsilon``: the audit did not refute the claim."""
        return self.epsilon_lower_bound <= self.claimed_epsilon

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["consistent"] = self.consistent
        return out


def world_keys(seed: int) -> tuple[jax.Array, jax.Array]:
    """``(fold_in(key(seed), 0), fold_in(key(seed), 1))``: the keys of worlds D and D'."""
    root = jax.random.key(validation.check_int("seed", seed, minimum=0, maximum=2 ** 32 - 1))
    return jax.random.fold_in(root, 0), jax.random.fold_in(root, 1)


def statistics(mechanism: str, *, trials: int, seed: int, weaken: str | None = None,
               **params) -> tuple[np.ndarray, np.ndarray]:
    """The raw statistics ``(s_D [trials], s_D' [trials])`` of an audit (host float64)."""
    trials = validation.check_int("trials", trials, minimum=4, maximum=MAX_TRIALS)
    auditable = harness.build(mechanism, weaken, **params)
    k_d, k_dp = world_keys(seed)
    s_d = np.asarray(auditable.trials(k_d, trials, False), np.float64)
    s_dp = np.asarray(auditable.trials(k_dp, trials, True), np.float64)
    return s_d, s_dp


def audit(mechanism: str, *, trials: int = 100_000, delta: float = 1e-5, seed: int = 0,
          confidence: float = 0.95, weaken: str | None = None, **params) -> AuditResult:
    """Audit ``mechanism`` (a name of :data:`fedjax_dp.audit.harness.MECHANISMS`).

    ``trials`` runs per world (half choose the threshold, half bound the rates); ``delta`` and
    ``confidence`` in (0, 1); ``weaken``: None, ``"halve-noise"`` or ``"no-clip"`` (audited
    against the original claim); ``params``: the mechanism's (registry entry). Every argument is
    checked (``ValueError``, unknown names included) before any work.
    """
    trials = validation.check_int("trials", trials, minimum=4, maximum=MAX_TRIALS)
    delta = validation.check_open_unit("delta", delta)
    confidence = validation.check_open_unit("confidence", confidence)
    seed = validation.check_int("seed", seed, minimum=0, maximum=2 ** 32 - 1)
    auditable = harness.build(mechanism, weaken, **params)
    claimed = auditable.claimed_epsilon(delta)
    s_d, s_dp = statistics(mechanism, trials=trials, seed=seed, weaken=weaken, **params)
    b = bounds.audit_threshold(s_d, s_dp, delta, confidence)
    return AuditResult(epsilon_lower_bound=b.epsilon_lower_bound, claimed_epsilon=claimed,
                       trials=trials, delta=delta, confidence=confidence, threshold=b.threshold,
                       fpr=b.fpr, fnr=b.fnr, mechanism=mechanism, params=dict(auditable.params),
                       weaken=weaken, fpr_upper=b.fpr_upper, fnr_upper=b.fnr_upper, seed=seed,
                       unit=auditable.unit, relation=auditable.relation)
