"""The ISRL-DP / shuffle-DP federated optimisation family (Lowy, Ghafelebashi, Razaviyayn 2023).

Building blocks: :mod:`prox` (f1 and its prox), :mod:`availability` (M of N silos per round),
:mod:`uploads` (what a silo sends), :mod:`estimators` (SPIDER / SVRG updates),
:mod:`calibration` (per-silo events and noise calibration), :mod:`engine` (the compiled round).
Algorithms (protocol objects of :mod:`protocol`): see :data:`ALGORITHMS`.
"""
from fedjax_dp.algorithms import registry
from fedjax_dp.algorithms.isrl import (audit, availability, calibration, engine, estimators,
                                       prox, protocol, sdp, uploads)
from fedjax_dp.algorithms.isrl.local_sgd import ISRL_LOCAL_SGD, LOCAL_SGD
from fedjax_dp.algorithms.isrl.mb_sgd import ISRL_MB_SGD, MB_SGD
from fedjax_dp.algorithms.isrl.sdp import SDP_MB_SGD, SDP_SPIDER
from fedjax_dp.algorithms.isrl.spider import ISRL_SPIDER
from fedjax_dp.algorithms.isrl.svrg import ISRL_PROX_PL_SVRG, ISRL_PROX_SVRG

#: name -> protocol object, each registered (:mod:`fedjax_dp.algorithms.registry`).
ALGORITHMS = {a.name: a for a in (ISRL_MB_SGD, ISRL_PROX_SVRG, ISRL_PROX_PL_SVRG, ISRL_SPIDER,
                                  ISRL_LOCAL_SGD, MB_SGD, LOCAL_SGD, SDP_MB_SGD, SDP_SPIDER)}
for _name, _entry in ALGORITHMS.items():
    registry.register(_name, _entry)

__all__ = ["availability", "calibration", "engine", "estimators", "prox", "protocol", "sdp",
           "uploads",
           "ALGORITHMS", "ISRL_MB_SGD", "MB_SGD", "ISRL_LOCAL_SGD", "LOCAL_SGD", "ISRL_SPIDER",
           "ISRL_PROX_SVRG", "ISRL_PROX_PL_SVRG", "SDP_MB_SGD", "SDP_SPIDER"]
