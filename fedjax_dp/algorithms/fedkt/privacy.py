"""FedKT's privacy analysis: units, neighbouring relations, sensitivities, moments and ledgers.

Laplace noise of scale 1/gamma on every count (LNMax); per unit and level:

* L1, party level (Theorem 1): replacing one party's data changes its s students, so the server
  histogram moves by at most 2s in L1 norm; each server query is (2 s gamma, 0)-DP.
* L1, example level (Theorem 8): replacing one record changes one teacher per partition of one
  party; a student can change only if some query it learnt from had a top-2 teacher vote gap
  <= 2 (one changed vote plus argmax tie-breaking by index; the paper's ``<= 1`` misses the tie,
  kept as ``gap_threshold=1`` under the name ``paper``). With z the largest number of such
  partitions in any party, consistent voting moves the histogram by 0 (z = 0), s (0 < z < s: a
  party's contribution s e_c appears or vanishes) or 2s (z = s): k = 0, s/2 or s
  (:func:`example_k`). The paper's Theorem 8 uses k = z, which is too small when z < s/2 (kept
  as :func:`paper_example_k`).
* L2, example level (Theorem 3): each local query is (2 gamma, 0)-DP; the s*Q queries of one
  party compose; parties hold disjoint data, so the guarantee is the worst party's (Theorem 4;
  taken order by order on the RDP curve, valid for every delta).
* L2, party level (Theorem 9/10): each local query is (2 t gamma, 0)-DP, worst party.

Data-dependent moments per query: :mod:`fedjax_dp.privacy.lnmax` (recorded as RDP,
``alpha(l) = l * RDP(l + 1)``); data-independent: ``LaplaceDpEvent`` composition through
dp-accounting (RDP and PLD). Both go in :class:`~fedjax_dp.privacy.PrivacyLedger` objects
(:func:`ledgers_from_votes` of given histograms; :func:`account` without a run).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from fedjax_dp.algorithms.fedkt.config import Config
from fedjax_dp.core import validation
from fedjax_dp.privacy import PrivacyLedger, accounting, lnmax

PARTY_RELATION = "replace one party's entire local dataset"
EXAMPLE_RELATION = "replace one training example of one party"


def example_k(z: int, s: int) -> float:
    """Sensitivity multiplier k (query is (2 k gamma, 0)-DP) at L1, example level, consistent
    voting: 0 if z = 0, s/2 if 0 < z < s (one party's s votes appear or vanish), s if z = s."""
    z = validation.check_int("z", z, minimum=0, maximum=s)
    return 0.0 if z == 0 else (s / 2.0 if z < s else float(s))


def paper_example_k(z: int, s: int) -> float:
    """The paper's Theorem 8 multiplier k = z (too small under consistent voting if z < s/2)."""
    return float(validation.check_int("z", z, minimum=0, maximum=s))


def _moments(votes, gamma: float, k: float, orders) -> np.ndarray:
    """Summed log moments of LNMax queries with histograms ``votes [..., Q, C]`` -> ``[..., L]``."""
    q = lnmax.lnmax_q(votes, gamma)                                        # [..., Q]
    return lnmax.lnmax_log_moments(q, gamma, z=k, k=k, orders=orders).sum(axis=-2)


def log_moments(level: str, gamma: float, *, server_votes=None, teacher_votes=None,
                num_partitions: int = 2, num_teachers: int = 5, z: int | None = None,
                orders=lnmax.DEFAULT_MOMENT_ORDERS, example_rule: str = "consistent"
                ) -> dict[str, np.ndarray]:
    """Data-dependent total log moments per unit (``{'party': [L], 'example': [L]}``).

    L1: ``server_votes [Q, C]`` (noiseless consistent-voting histograms); party k = s;
    example k from ``z`` (largest number of at-risk partitions of a party; default s, the worst
    case) by :func:`example_k` (``example_rule='paper'``: :func:`paper_example_k`).
    L2: ``teacher_votes [n, s, Q, C]`` (or ``[s, Q, C]``; ``[Q, C]``: the same histograms in
    each partition); example k = 1, party k = t; worst party (per order).
    """
    validation.check_choice("level", level, ("L1", "L2"))
    validation.check_choice("example_rule", example_rule, ("consistent", "paper"))
    s = validation.check_int("num_partitions", num_partitions, minimum=1)
    t = validation.check_int("num_teachers", num_teachers, minimum=1)
    if level == "L1":
        if server_votes is None:
            raise ValueError("server_votes [Q, C] are required at level L1")
        v = np.asarray(server_votes)
        if v.ndim != 2:
            raise ValueError(f"server_votes must have shape [Q, C], got {v.shape}")
        z = s if z is None else validation.check_int("z", z, minimum=0, maximum=s)
        kx = example_k(z, s) if example_rule == "consistent" else paper_example_k(z, s)
        return {"party": _moments(v, gamma, s, orders), "example": _moments(v, gamma, kx, orders)}
    if teacher_votes is None:
        raise ValueError("teacher_votes [n, s, Q, C] are required at level L2")
    v = np.asarray(teacher_votes)
    if v.ndim < 2 or v.ndim > 4:
        raise ValueError(f"teacher_votes must have shape [n, s, Q, C], got {v.shape}")
    if v.ndim == 2:                     # the same histograms in each of the s partitions
        v = np.broadcast_to(v, (s,) + v.shape)
    v = v.reshape((1,) * (4 - v.ndim) + v.shape)                           # [n, s, Q, C]
    if v.shape[1] != s:
        raise ValueError(f"teacher_votes must have num_partitions={s} partitions on axis -3, "
                         f"got shape {v.shape}")
    per_party = {u: _moments(v, gamma, kk, orders).sum(axis=1)              # [n, L]
                 for u, kk in (("example", 1.0), ("party", float(t)))}
    return {u: m.max(axis=0) for u, m in per_party.items()}                 # worst party


def num_noisy_queries(level: str, *, server_queries: int = 0, party_queries: int = 0,
                      num_partitions: int = 2) -> int:
    """Queries one unit's data enters: Qs at L1; s * Qp per party at L2."""
    return server_queries if level == "L1" else num_partitions * party_queries


def data_independent_events(level: str, gamma: float, num_queries: int, *,
                            num_partitions: int, num_teachers: int) -> dict:
    """``{unit: DpEvent}``: composition of pure ``(2 k gamma, 0)``-DP LNMax queries (worst case).

    A query with L1 sensitivity 2k and Laplace scale 1/gamma is ``LaplaceDpEvent(1/(2 k gamma))``.
    L1: k = s for both units (one record can flip all s students). L2: per party s*Q queries,
    k = 1 (example) / t (party); parties are disjoint and identical, so one party's composition
    is the guarantee.
    """
    s, t = num_partitions, num_teachers
    ks = {"party": s, "example": s} if level == "L1" else {"party": t, "example": 1}
    return {u: accounting.laplace_event(1.0 / (2.0 * kk * gamma), num_queries)
            for u, kk in ks.items()}


def ledgers_from_votes(config: Config, *, server_votes=None, teacher_votes=None, z=None,
                    num_server_queries: int | None = None, num_party_queries: int | None = None
                    ) -> tuple[PrivacyLedger, PrivacyLedger]:
    """``(data_dependent, data_independent)`` ledgers with units ``'party'`` and ``'example'``.

    The data-dependent one holds the summed log moments as RDP (``add_rdp`` on orders l + 1,
    ``RDP(l + 1) = alpha(l) / l``); the other the ``LaplaceDpEvent`` compositions (RDP and PLD
    apply). L0 adds no noise: both are empty.
    """
    dd, di = PrivacyLedger(), PrivacyLedger()
    if config.level == "L0":
        return dd, di
    s, t, g = config.num_partitions, config.num_teachers, config.gamma
    moments = log_moments(config.level, g, server_votes=server_votes,
                          teacher_votes=teacher_votes, num_partitions=s, num_teachers=t,
                          z=None if z is None else int(np.max(z)), orders=config.orders)
    if config.level == "L1":
        nq = int(np.asarray(server_votes).shape[0]) if num_server_queries is None \
            else num_server_queries
    else:
        nq_party = int(np.asarray(teacher_votes).shape[-2]) if num_party_queries is None \
            else num_party_queries
        nq = num_noisy_queries("L2", party_queries=nq_party, num_partitions=s)
    events = data_independent_events(config.level, g, nq, num_partitions=s, num_teachers=t)
    for unit, relation in (("party", PARTY_RELATION), ("example", EXAMPLE_RELATION)):
        orders, rdp = lnmax.log_moments_to_rdp(moments[unit], config.orders)
        note = (f"FedKT-{config.level} data-dependent LNMax moments (gamma={g}, s={s}, t={t}, "
                f"{nq} noisy queries per unit); alpha(l) = l * RDP(l+1)")
        dd.add_rdp(unit, orders, rdp, relation=relation, note=note)
        di.add_event(unit, events[unit], relation=relation,
                     note=f"FedKT-{config.level} data-independent: {nq} pure-DP LNMax queries")
    return dd, di


def privacy_summary(config: Config, values: dict, delta: float) -> dict:
    """Per unit: the paper's ``moments_epsilon``, the RDP conversion of the same moments, and
    the data-independent epsilon (RDP and PLD); plus z and query counts, for the state
    ``values`` of a finished run (``teacher_votes``, ``z``, ``server_votes``)."""
    cfg = config
    out: dict[str, Any] = {"level": cfg.level, "gamma": cfg.gamma,
                           "query_fraction": cfg.query_fraction,
                           "noisy_queries": 0, "units": {}}
    if cfg.level == "L0":
        return out
    tv, sv, z = values["teacher_votes"], values["server_votes"], np.asarray(values["z"])
    moments = log_moments(cfg.level, cfg.gamma, server_votes=sv, teacher_votes=tv,
                          num_partitions=cfg.num_partitions, num_teachers=cfg.num_teachers,
                          z=int(z.max()), orders=cfg.orders)
    dd, di = ledgers_from_votes(cfg, server_votes=sv, teacher_votes=tv, z=z)
    out["noisy_queries"] = int(np.shape(sv)[0] if cfg.level == "L1" else np.shape(tv)[-2])
    out["z"] = int(z.max())
    for unit in ("party", "example"):
        row = {"moments_epsilon": lnmax.moments_epsilon(moments[unit], delta, cfg.orders),
               "data_dependent_rdp_epsilon": _unit_epsilon(dd, unit, delta, "rdp"),
               "data_independent_rdp_epsilon": _unit_epsilon(di, unit, delta, "rdp"),
               "data_independent_pld_epsilon": _unit_epsilon(di, unit, delta, "pld")}
        out["units"][unit] = row
    return out


def _unit_epsilon(ledger: PrivacyLedger, unit: str, delta: float, accountant: str) -> float:
    return next(r["epsilon"] for r in ledger.report(delta, (accountant,)) if r["unit"] == unit)


def account(votes, *, level: str, gamma: float, delta: float, num_partitions: int = 2,
            num_teachers: int = 5, z: int | None = None, units=("party", "example"),
            moment_orders: int = 8, example_rule: str = "consistent",
            accountants=("rdp", "pld")) -> dict:
    """Epsilon of FedKT-L1/L2 for given noiseless vote histograms, without training.

    ``votes``: L1: the server's consistent-voting histograms ``[Q, C]``; L2: the teachers'
    histograms ``[n, s, Q, C]`` (or ``[s, Q, C]``, ``[Q, C]``). Per unit as
    :func:`privacy_summary`.
    """
    validation.check_choice("level", level, ("L1", "L2"))
    delta = validation.check_open_unit("delta", delta)
    for u in units:
        validation.check_choice("unit", u, ("party", "example"))
    cfg = Config(num_partitions=num_partitions, num_teachers=num_teachers, level=level,
                 gamma=gamma, moment_orders=moment_orders)
    v = np.asarray(votes)
    kw = {"server_votes": v} if level == "L1" else {"teacher_votes": v}
    moments = log_moments(level, gamma, num_partitions=num_partitions,
                          num_teachers=num_teachers, z=z, orders=cfg.orders,
                          example_rule=example_rule, **kw)
    dd, di = ledgers_from_votes(cfg, z=z, **kw)
    nq = v.shape[0] if level == "L1" else num_partitions * v.shape[-2]
    out = {"mechanism": "fedkt", "level": level, "gamma": gamma, "delta": delta,
           "num_partitions": num_partitions, "num_teachers": num_teachers,
           "z": None if level == "L2" else (num_partitions if z is None else int(z)),
           "example_rule": example_rule, "noisy_queries_per_unit": int(nq), "units": {}}
    if example_rule == "paper":   # ledgers follow the correct rule; report the paper's epsilon
        out["note"] = "example_rule='paper' affects moments_epsilon only"
    for unit in units:
        out["units"][unit] = {
            "relation": PARTY_RELATION if unit == "party" else EXAMPLE_RELATION,
            "moments_epsilon": lnmax.moments_epsilon(moments[unit], delta, cfg.orders),
            "data_dependent": {"rdp": _unit_epsilon(dd, unit, delta, "rdp")},
            "data_independent": {a: _unit_epsilon(di, unit, delta, a) for a in accountants},
            "data_independent_event": accounting.event_to_json(
                next(e.event for e in di.entries if e.unit == unit)),
        }
    return out


def planned_ledger(config: Config, *, num_server_queries: int, num_party_queries: int
                   ) -> PrivacyLedger:
    """The data-independent ledger of ``config`` planned before training (calibration): per unit
    (party, example) the composition of :func:`data_independent_events` over the noisy
    queries one unit's data enters (:func:`num_noisy_queries`: Qs at L1, s Qp at L2)."""
    validation.check_choice("algorithm.level", config.level, ("L1", "L2"))
    nq = num_noisy_queries(config.level, server_queries=num_server_queries,
                           party_queries=num_party_queries,
                           num_partitions=config.num_partitions)
    events = data_independent_events(config.level, config.gamma, nq,
                                      num_partitions=config.num_partitions,
                                      num_teachers=config.num_teachers)
    led = PrivacyLedger()
    for unit, relation in (("party", PARTY_RELATION), ("example", EXAMPLE_RELATION)):
        led.add_event(unit, events[unit], relation=relation)
    return led
