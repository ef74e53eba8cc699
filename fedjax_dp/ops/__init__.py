"""Numerical kernels below the algorithms: pure JAX functions on arrays (no training, no privacy).

Builds on :mod:`fedjax_dp.core` only. :mod:`fedjax_dp.ops.knn_search`: exact per-agent
k-nearest-neighbour label counts (kNN-DPFL's ballots)."""
