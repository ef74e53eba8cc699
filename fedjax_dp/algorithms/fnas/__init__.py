"""DP-FNAS (dp-fnas paper): federated, differentially private DARTS search, then retraining.

``steps``: pure update functions (search ``init`` / ``step``, retraining); ``privacy``: events,
ledgers and the paper's GDP bound; ``dp_fnas``: the algorithm protocol module (registered as
``dp_fnas``). The search space lives in :mod:`fedjax_dp.models.darts`.
"""
from fedjax_dp.algorithms import registry
from fedjax_dp.algorithms.fnas import dp_fnas, privacy, steps

registry.register("dp_fnas", dp_fnas)

__all__ = ["dp_fnas", "privacy", "steps"]
