"""PATE-style data-dependent privacy accounting (re-exports).

* GNMax (Gaussian noisy argmax; PATE 2018 Theorem 6) for the voting-based DPFL algorithms:
  ``gnmax_logq``, ``gnmax_rdp``, ``gnmax_epsilon`` (module :mod:`fedjax_dp.privacy.gnmax`).
* LNMax (Laplace noisy argmax; PATE 2017 moments accountant) for FedKT:
  ``lnmax_q``, ``lnmax_log_moments``, ``moments_epsilon`` (module :mod:`fedjax_dp.privacy.lnmax`).
"""
from fedjax_dp.privacy.lnmax import (  # noqa: E402,F401  (FedKT)
    DEFAULT_MOMENT_ORDERS, lnmax_log_moments, lnmax_q, log_moments_to_rdp, moments_epsilon)
from fedjax_dp.privacy.gnmax import (  # noqa: E402,F401  (voting-dpfl)
    PATE_ORDERS, gnmax_epsilon, gnmax_logq, gnmax_rdp, gnmax_total_rdp)
