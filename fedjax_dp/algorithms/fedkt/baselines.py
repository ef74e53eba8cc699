"""FedKT's Table 1 baselines, each in one round: SOLO, centralized PATE, FedAvg, FedProx.

* SOLO: every party trains on its own data only: the algorithm ``fedkt_solo`` (:mod:`.solo`).
* Centralized PATE: FedKT with one party holding all training data, the same s x t teachers,
  no noise: ``algorithm.centralized = true`` (:mod:`.fedkt`).
* FedAvg (McMahan et al. 2017) in one round: every party trains ``local.steps`` steps from one
  shared initialisation and the server averages once (:mod:`fedjax_dp.algorithms.rounds`).
* FedProx (Li et al. 2020) in one round: FedAvg whose local objective adds
  ``mu/2 ||w - w_global||^2`` (``LocalTrainConfig.prox_mu``).

None of these gives a privacy guarantee.
"""
from __future__ import annotations

import dataclasses

import jax

from fedjax_dp.algorithms import api, rounds, rounds_protocol
from fedjax_dp.core import StackedData, validation
from fedjax_dp.models import Model
from fedjax_dp.stages import Chain, aggregation, clipping, noise, participation, updates
from fedjax_dp.train import LocalTrainConfig, accuracy


def one_round(key: jax.Array, parties: StackedData, model: Model, local: LocalTrainConfig,
              x_test, y_test, *, prox_mu: float = 0.0,
              chunk_size: int | str | None = "auto") -> float:
    """Test accuracy after ONE round of FedAvg (``prox_mu = 0``) or FedProx (``prox_mu > 0``)."""
    validation.check_nonnegative("prox_mu", prox_mu)
    local = dataclasses.replace(local, prox_mu=prox_mu)
    chain = Chain(participation=participation.Poisson(1.0),
                  client_update=rounds.local_steps(model, local), clipping=clipping.NoClip(),
                  aggregation=aggregation.PlainSum(), noise=noise.NoNoise(),
                  server_update=updates.PlainStep(1.0, denominator="sampled"))
    data = api.FederatedData(agents=parties, num_classes=model.num_classes)
    state = rounds.init_rounds(key, data, model, chain, 1, api.Runtime(chunk_size=chunk_size),
                               local=local)
    state, _ = rounds_protocol.step(state, api.step_key(key, 0))                # the one round
    return accuracy(model, state.values["params"], x_test, y_test)
