"""DP-FNAS privacy: dp-accounting events per party and split, the ledger, the paper's GDP bound.

Unit of privacy: ``'instance'``, one record of one party. Neighbouring relation: add or remove one
record of one party. Each party splits its records deterministically into a training half (its
first ``ceil(n_k / 2)`` records) and a validation half (the rest), so a record lies in exactly one
(party, half); the mechanisms that read it (all Poisson-sampled Gaussian mechanisms, sensitivity =
their clip norm, see :mod:`fedjax_dp.algorithms.fnas.steps`) compose over the T iterations:

* training-half record of party k:
  ``SelfComposed(PoissonSampled(q^tr_k, Gaussian(sigma)), T)`` (weight gradient G_k), then, with
  the second-order step, ``SelfComposed(PoissonSampled(q^tr_k, Gaussian(sigma_c)), T)`` (mixed
  term C_k, a fresh sample), then retraining
  ``SelfComposed(PoissonSampled(q^re_k, Gaussian(sigma_re)), T_re)``;
* validation-half record of party k:
  ``SelfComposed(PoissonSampled(q^val_k, Gaussian(tau)), T)`` (architecture gradient [D_k, V_k],
  clipped jointly), then retraining as above (retraining reads all records).

Everything else (W', v, the optimiser updates, the genotype) is post-processing. Parallel
composition over the disjoint (party, half) members gives the worst record's guarantee
(:meth:`PrivacyLedger.add_parallel`); one ledger per party reports each party's own records.

The paper (Theorem 3.1, Bu et al. 2019's CLT) states ``mu = (B / N_k) sqrt(T (e^{1 / sigma^2}
- 1))``-GDP for the weight mechanism (tau for the architecture's; no second order, no
retraining): an asymptotic approximation, not a bound. :func:`paper_gdp` reports it with
``delta(eps) = Phi(-eps / mu + mu / 2) - e^eps Phi(-eps / mu - mu / 2)``.
"""
from __future__ import annotations

import json
import math
from typing import Sequence

import dp_accounting
from scipy import optimize, stats

from fedjax_dp.core import validation
from fedjax_dp.privacy import PrivacyLedger, accounting

UNIT = "instance"
RELATION = "add/remove one record of one party"


def _compose(events):
    events = [e for e in events if not isinstance(e, dp_accounting.NoOpDpEvent)]
    if not events:
        return dp_accounting.NoOpDpEvent()
    return events[0] if len(events) == 1 else dp_accounting.ComposedDpEvent(events)


def record_events(*, rate_train: float, rate_val: float, rate_retrain: float, iterations: int,
                  retrain_iterations: int, noise_weights: float, noise_arch: float,
                  noise_second: float | None, noise_retrain: float):
    """``(train_event, val_event)``: what a training-half / validation-half record of one party
    takes part in over the whole run (``noise_second=None``: first order, no mixed term)."""
    ev = accounting.sampled_gaussian_event
    retrain = ev(noise_retrain, rate_retrain, retrain_iterations)
    train = [ev(noise_weights, rate_train, iterations)]
    if noise_second is not None:
        train.append(ev(noise_second, rate_train, iterations))
    return _compose(train + [retrain]), _compose([ev(noise_arch, rate_val, iterations), retrain])


def ledgers(members: Sequence[tuple], *, note: str = "") -> tuple[PrivacyLedger, ...]:
    """``(all parties, party 0, ..., party K-1)`` from one ``(train_event, val_event)`` per party.

    The first ledger (unit ``'instance'``) is the worst record over all parties and halves; ledger
    ``1 + k`` (unit ``'instance (party k)'``) the worst record of party k. When every party has
    the same events, each party's guarantee IS the first ledger's and only it is returned.
    """
    keys = {json.dumps([accounting.event_to_json(e) for e in pair], sort_keys=True)
            for pair in members}
    if len(keys) == 1:
        return (PrivacyLedger().add_parallel(UNIT, list(members[0]), relation=RELATION,
                                             note=(note + "; " if note else "") +
                                             f"identical for all {len(members)} parties"),)
    overall = PrivacyLedger().add_parallel(UNIT, [e for pair in members for e in pair],
                                           relation=RELATION, note=note)
    per_party = tuple(PrivacyLedger().add_parallel(f"{UNIT} (party {k})", list(pair),
                                                   relation=RELATION, note=note)
                      for k, pair in enumerate(members))
    return (overall,) + per_party


# --------------------------------------------------------------------------- GDP (paper)

def paper_mu(rate: float, iterations: int, noise_multiplier: float) -> float:
    """Theorem 3.1 / Bu et al. 2019 (CLT): ``mu = q sqrt(T (e^{1 / sigma^2} - 1))``."""
    q = validation.check_probability("rate", rate)
    t = validation.check_int("iterations", iterations, minimum=0)
    sigma = validation.check_nonnegative("noise_multiplier", noise_multiplier)
    if sigma == 0:
        return math.inf
    return q * math.sqrt(t * math.expm1(1.0 / sigma ** 2))


def gdp_delta(epsilon: float, mu: float) -> float:
    """``delta(eps)`` of mu-GDP: ``Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)`` (exact)."""
    validation.check_nonnegative("epsilon", epsilon)
    validation.check_nonnegative("mu", mu)
    if mu == 0:
        return 0.0
    if math.isinf(mu):
        return 1.0
    # e^eps Phi(b) computed in log space (no overflow for large eps)
    a = stats.norm.cdf(-epsilon / mu + mu / 2)
    b = math.exp(epsilon + stats.norm.logcdf(-epsilon / mu - mu / 2))
    return float(max(a - b, 0.0))


def gdp_epsilon(mu: float, delta: float) -> float:
    """Smallest epsilon with ``gdp_delta(epsilon, mu) <= delta`` (inverse of :func:`gdp_delta`)."""
    validation.check_open_unit("delta", delta)
    validation.check_nonnegative("mu", mu)
    if math.isinf(mu):
        return math.inf
    if gdp_delta(0.0, mu) <= delta:
        return 0.0
    hi = 1.0
    while gdp_delta(hi, mu) > delta:
        hi *= 2.0
    return float(optimize.brentq(lambda e: gdp_delta(e, mu) - delta, 0.0, hi, xtol=1e-10,
                                 rtol=1e-12))


def paper_gdp(*, rates_train: Sequence[float], rates_val: Sequence[float], iterations: int,
              noise_weights: float, noise_arch: float, delta: float) -> dict:
    """The paper's Theorem 3.1 per party (GDP mu of the W and alpha mechanisms, each with its
    ``(epsilon, delta)``) and the worst party. An approximation, reported beside dp-accounting."""
    parties = []
    for k, (qt, qv) in enumerate(zip(rates_train, rates_val)):
        mu_w = paper_mu(float(qt), iterations, noise_weights)
        mu_a = paper_mu(float(qv), iterations, noise_arch)
        parties.append({"party": k, "mu_weights": mu_w, "mu_arch": mu_a,
                        "epsilon_weights": gdp_epsilon(mu_w, delta),
                        "epsilon_arch": gdp_epsilon(mu_a, delta)})
    worst = max(max(p["mu_weights"], p["mu_arch"]) for p in parties)
    return {"formula": "mu = (B / N_k) sqrt(T (exp(1 / sigma^2) - 1)) (Theorem 3.1, CLT "
                       "approximation; ignores the second-order term and retraining)",
            "delta": delta, "iterations": iterations, "per_party": parties, "worst_mu": worst,
            "worst_epsilon": gdp_epsilon(worst, delta)}

