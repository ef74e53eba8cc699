"""FedKT (one-shot knowledge transfer) and its SOLO baseline (every party alone, Table 1)."""
from fedjax_dp.algorithms import registry
from fedjax_dp.algorithms.fedkt import audit, fedkt, solo

registry.register("fedkt", fedkt)
registry.register("fedkt_solo", solo)
