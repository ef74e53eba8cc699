"""PATE-style data-dependent privacy accounting (re-exports).

* GNMax (Gaussian noisy argmax; PATE 2018 Theorem 6) for the voting-based DPFL algorithms:
  ``gnmax_logq``, ``gnmax_rdp``, ``gnmax_epsilon`` (module :mod:`fedjax_dp.privacy.gnmax`).
* LNMax (Laplace noisy argmax; PATE 2017 moments accountant) for FedKT:
  ``lnmax_q``, ``lnmax_log_moments``, ``moments_epsilon`` (module :mod:`fedjax_dp.privacy.lnmax`).
"""
