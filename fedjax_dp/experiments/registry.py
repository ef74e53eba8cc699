"""The algorithms the experiment runner knows: a map from names to algorithm modules.

Every entry is a module on the protocol of :mod:`fedjax_dp.algorithms.api` (``Config``,
``DESCRIPTION``, ``USES_LOCAL_TRAIN``, ``init``, ``num_steps``, ``step``, ``ledger``, ``output``);
the runner drives it with :func:`fedjax_dp.algorithms.api.run`. Every algorithm also runs from
plain Python without this layer. Adding an algorithm is one line in :data:`ALGORITHMS`.
"""
from __future__ import annotations

from types import ModuleType

from fedjax_dp.algorithms import ae_dpfl, dp_fedavg, dp_fedsgd, fedavg, fedkt, knn_dpfl

ALGORITHMS: dict[str, ModuleType] = {
    "fedavg": fedavg,
    "dp_fedavg": dp_fedavg,
    "dp_fedsgd": dp_fedsgd,
    "ae_dpfl": ae_dpfl,
    "knn_dpfl": knn_dpfl,
    "fedkt": fedkt,
}


def get(name: str) -> ModuleType:
    if name not in ALGORITHMS:
        raise ValueError(f"algorithm.name must be one of {sorted(ALGORITHMS)}, got {name!r}")
    return ALGORITHMS[name]
