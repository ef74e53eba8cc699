"""The voting family: AE-DPFL and kNN-DPFL (private votes of the agents on public queries)."""
from fedjax_dp.algorithms import registry
from fedjax_dp.algorithms.voting import ae_dpfl, audit, knn_dpfl

registry.register("ae_dpfl", ae_dpfl)
registry.register("knn_dpfl", knn_dpfl)
