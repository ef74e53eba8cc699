"""The one-run audit (Steinke, Nasr, Jagielski, "Privacy Auditing with One (1) Training Run",
NeurIPS 2023) of a real federated run: canary agents inserted into the population, each included
independently with probability 1/2, scored after ONE run; the scores' top guesses give an epsilon
lower bound to set beside the ledger's epsilon.

    m canaries, inclusion coins S_j ~ Bernoulli(1/2) i.i.d.; after the run, score s_j per canary;
    guess "in" for the k highest scores; with r correct guesses, (epsilon, delta)-DP (for the
    add/remove relation of one canary agent) implies P[r or more correct] <= p(epsilon, delta)
    (their Theorem 3.1 and Proposition 5.2); the bound is the largest epsilon that
    p(epsilon, delta) < significance rejects, maximised over k with a Bonferroni correction.

The p-value and the search over k are jax-privacy's (``auditing.CanaryScoreAuditor
.epsilon_one_run``); a family registers how its run takes canaries (:func:`register_run`), e.g.
``fedjax_dp.algorithms.averaging.run_audit`` for DP-FedAvg. docs/audit.md, "One run".
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

__all__ = ["CanaryScores", "RUN_AUDITS", "RUN_CHECKS", "register_run", "epsilon_lower_bound",
           "report"]


@dataclasses.dataclass(frozen=True)
class CanaryScores:
    """What a canary run returns: the scores of the included (``in_scores``) and left-out
    (``out_scores``) canaries, the ledger's epsilon for the run at ``delta``, and notes (unit,
    relation, how a canary is built)."""

    in_scores: np.ndarray
    out_scores: np.ndarray
    claimed_epsilon: float
    delta: float
    unit: str
    relation: str
    canary: str
    extras: dict = dataclasses.field(default_factory=dict)


#: algorithm name -> ``fn(key, data, model, config, *, canaries, canary_scale, delta,
#: accountant, weaken, chunk_size) -> CanaryScores`` (registered by the families)
RUN_AUDITS: dict[str, Callable[..., CanaryScores]] = {}
#: algorithm name -> ``check(config, *, canary_scale, weaken)``: refuses (``ValueError``; a
#: :class:`fedjax_dp.audit.harness.ParameterError` names the parameter) what the run would not
#: take, before any work
RUN_CHECKS: dict[str, Callable[..., object]] = {}


def register_run(algorithm: str, fn: Callable[..., CanaryScores],
                 check: Callable[..., object] | None = None) -> None:
    """Make ``algorithm``'s runs auditable with canaries (``fn``); ``check`` validates a request
    before any data is loaded (default: none)."""
    RUN_AUDITS[algorithm] = fn
    RUN_CHECKS[algorithm] = check or (lambda config, **kw: None)


def epsilon_lower_bound(in_scores, out_scores, *, significance: float, delta: float) -> float:
    """Steinke et al.'s one-run lower bound at confidence ``1 - significance`` (jax-privacy's
    ``CanaryScoreAuditor.epsilon_one_run``, Bonferroni over the number of guesses)."""
    from jax_privacy import auditing
    if not 0 < significance < 1:
        raise ValueError(f"significance must be in (0, 1), got {significance!r}")
    auditor = auditing.CanaryScoreAuditor(np.asarray(in_scores, np.float64),
                                          np.asarray(out_scores, np.float64))
    return float(auditor.epsilon_one_run(significance, delta))


def report(scores: CanaryScores, *, significance: float) -> dict:
    """The audit's JSON: the lower bound beside the claim, and what was measured."""
    lb = epsilon_lower_bound(scores.in_scores, scores.out_scores, significance=significance,
                             delta=scores.delta)
    ins, outs = np.asarray(scores.in_scores), np.asarray(scores.out_scores)
    return {"method": "one-run (Steinke, Nasr, Jagielski 2023; jax-privacy)",
            "unit": scores.unit, "relation": scores.relation, "canary": scores.canary,
            "canaries": int(ins.size + outs.size), "included": int(ins.size),
            "delta": scores.delta, "significance": significance,
            "epsilon_lower_bound": lb, "claimed_epsilon": scores.claimed_epsilon,
            "consistent": bool(lb <= scores.claimed_epsilon + 1e-9),
            "mean_in_score": float(ins.mean()), "mean_out_score": float(outs.mean()),
            **scores.extras}
