"""Audit harness of the FedKT family: the LNMax vote of one partition on one query.

Registers ``fedkt-laplace`` with :mod:`fedjax_dp.audit.harness` (what an :class:`Auditable` is
and how it is run) when the family is imported.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from fedjax_dp.algorithms.fedkt import privacy as fedkt_privacy
from fedjax_dp.algorithms.fedkt import votes as fedkt_votes
from fedjax_dp.audit.harness import Auditable, Spec, check_accountant, register
from fedjax_dp.core import validation
from fedjax_dp.privacy import PrivacyLedger

__all__ = ["fedkt_laplace_harness"]


def fedkt_laplace_harness(weaken, *, gamma, num_teachers, gap, num_classes,
                          accountant) -> Auditable:
    """FedKT's LNMax vote (FedKT Alg. 1, Thm 3; L2 example level), one query of one partition.

    ``t`` teachers vote on one public point (:func:`.votes.vote_counts`) and the label is
    released by :func:`.votes.noisy_labels` (``argmax(counts + Lap(1/gamma))``). Neighbours
    (replace one training example, which changes one teacher's vote): in D' the top-2 gap is
    ``gap`` (class 0 ahead); in D teacher 0 votes class 1 instead (gap ``gap - 2``). Statistic:
    the released label is class 1 (0/1). Claimed: ``LaplaceDpEvent(1 / (2 gamma))`` (L1
    sensitivity 2), :func:`.privacy.data_independent_events`.
    """
    gamma = validation.Float(0.0, 1e12, low_open=True)("gamma", gamma)    # float32 on the device
    t = validation.check_int("num_teachers", num_teachers, minimum=2)
    c = validation.check_int("num_classes", num_classes, minimum=2)
    gap = validation.check_int("gap", gap, minimum=0, maximum=t)
    if (t + gap) % 2:
        raise ValueError(f"gap must have the parity of num_teachers ({t}) so the votes split "
                         f"into integers, got {gap}")
    check_accountant(accountant)
    a = (t + gap) // 2                                            # class-0 votes in D'
    if a < 1:
        raise ValueError(f"gap must leave teacher 0 a class-0 vote to change, got {gap}")
    preds_dp = np.asarray([0] * a + [1] * (t - a), np.int32)      # teacher 0 votes class 0
    preds_d = preds_dp.copy()
    preds_d[0] = 1                                                # ... or class 1
    worlds = {False: jnp.asarray(preds_d)[None, :, None],         # [G=1, t, Q=1]
              True: jnp.asarray(preds_dp)[None, :, None]}
    run_gamma = 2 * gamma if weaken == "halve-noise" else gamma

    def one(key, inputs):
        w = inputs
        counts = fedkt_votes.vote_counts(w["preds"], c)                 # [1, 1, C]
        label = fedkt_votes.noisy_labels(key[None], counts, w["gamma"])   # [1, 1]
        return (label[0, 0] == 1).astype(jnp.float32)

    inputs = {nb: {"preds": p, "gamma": jnp.float32(run_gamma)} for nb, p in worlds.items()}

    def claimed(delta):
        event = fedkt_privacy.data_independent_events("L2", gamma, 1, num_partitions=1,
                                                      num_teachers=t)["example"]
        ledger = PrivacyLedger().add_event("example", event,
                                           relation=fedkt_privacy.EXAMPLE_RELATION,
                                           sensitivity=2.0)
        return ledger.epsilon("example", delta, accountant)

    params = dict(gamma=gamma, num_teachers=t, gap=gap, num_classes=c, accountant=accountant)
    return Auditable("fedkt-laplace", params, weaken, "example", fedkt_privacy.EXAMPLE_RELATION,
                     one, inputs, claimed, structure=(t, c))


register("fedkt-laplace", Spec(
    "FedKT LNMax vote (algorithms/fedkt/votes.py noisy_labels), one query, released label",
    dict(gamma=0.5, num_teachers=10, gap=4, num_classes=2, accountant="pld"),
    ("halve-noise",), fedkt_laplace_harness,
    applies={"num_teachers": lambda weaken, p: None if p["num_classes"] > 2 else
             "with num_classes=2 the released label depends on the gap between the two counts "
             "only (num_teachers matters with num_classes > 2, whose zero counts compete)"}))
