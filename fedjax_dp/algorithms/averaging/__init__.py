"""The averaging family: FedAvg, DP-FedAvg (agent level), DP-FedSGD (instance level)."""
from fedjax_dp.algorithms import registry
from fedjax_dp.algorithms.averaging import audit, dp_fedavg, dp_fedsgd, fedavg, run_audit

registry.register("fedavg", fedavg)
registry.register("dp_fedavg", dp_fedavg)
registry.register("dp_fedsgd", dp_fedsgd)
