"""The algorithms the experiment runner knows: a map from names to algorithm modules.

Every entry is a module (or a protocol object, like the ISRL family's) on the protocol of
:mod:`fedjax_dp.algorithms.api` (``Config``, ``DESCRIPTION``, ``USES_LOCAL_TRAIN``, ``init``,
``num_steps``, ``step``, ``ledger``, ``output``, and any optional hook of
:class:`fedjax_dp.algorithms.api.Algorithm`); the runner drives it with
:func:`fedjax_dp.algorithms.api.run` and reads its hooks through
:func:`fedjax_dp.algorithms.api.hooks`, never its name. Every algorithm also runs from plain
Python without this layer. Adding an algorithm is one module and one line in
:data:`ALGORITHMS` (docs/protocol.md's worked example).
"""
from __future__ import annotations

from typing import Any

from fedjax_dp.algorithms.voting import ae_dpfl, knn_dpfl
from fedjax_dp.algorithms.averaging import dp_fedavg, dp_fedsgd, fedavg
from fedjax_dp.algorithms.fedkt import fedkt, solo as fedkt_solo
from fedjax_dp.algorithms import isrl
from fedjax_dp.algorithms.fnas import dp_fnas

ALGORITHMS: dict[str, Any] = {
    "fedavg": fedavg,
    "dp_fedavg": dp_fedavg,
    "dp_fedsgd": dp_fedsgd,
    "ae_dpfl": ae_dpfl,
    "knn_dpfl": knn_dpfl,
    "fedkt": fedkt,
    "fedkt_solo": fedkt_solo,       # FedKT Table 1 baseline: every party alone
    # ISRL-DP / shuffle-DP federated optimisation (Lowy, Ghafelebashi, Razaviyayn 2023)
    "isrl_mb_sgd": isrl.ISRL_MB_SGD,
    "isrl_prox_svrg": isrl.ISRL_PROX_SVRG,
    "isrl_prox_pl_svrg": isrl.ISRL_PROX_PL_SVRG,
    "isrl_spider": isrl.ISRL_SPIDER,
    "isrl_local_sgd": isrl.ISRL_LOCAL_SGD,
    "mb_sgd": isrl.MB_SGD,
    "local_sgd": isrl.LOCAL_SGD,
    "sdp_mb_sgd": isrl.SDP_MB_SGD,
    "sdp_spider": isrl.SDP_SPIDER,
    # DP-FNAS (dp-fnas paper): federated DP DARTS search, then DP retraining
    "dp_fnas": dp_fnas,
}


def get(name: str):
    if name not in ALGORITHMS:
        raise ValueError(f"algorithm.name must be one of {sorted(ALGORITHMS)}, got {name!r}")
    return ALGORITHMS[name]
