"""FedAvg (McMahan et al. 2017), the non-private baseline; its round is shared with DP-FedAvg.

One round t (voting-dpfl paper, Algorithm 1 without lines 3-4 of NoisyUpdate):

    S_t ~ sampling: Poisson (agent i participates with probability q, independently) or a
          uniformly random subset of exactly C agents (``sampling = "fixed"``)
    Delta_i = LocalSGD_E(theta_t; D_i) - theta_t                    for i in S_t (one vmap)
    theta_{t+1} = theta_t + eta_s * sum_{i in S_t} Delta_i / max(1, |S_t|)

The round is run by :mod:`fedjax_dp.algorithms.rounds`; this module holds FedAvg's update rule
only: its :class:`Config` and its :func:`round_spec`.
"""
from __future__ import annotations

import dataclasses

import jax

from fedjax_dp.algorithms import api
from fedjax_dp.algorithms.rounds_protocol import (  # noqa: F401  (the protocol hooks)
    artifacts, multi_step, output, prefetch, rounds_per_call, seed_step, step)
from fedjax_dp.algorithms.rounds import (  # noqa: F401  (the engine's names, re-exported)
    RoundSpec, init_rounds, round_keys, sample_agents)
from fedjax_dp.core import cohort as cohort_lib
from fedjax_dp.core import validation
from fedjax_dp.models import Model
from fedjax_dp.privacy import PrivacyLedger
from fedjax_dp.train import LocalTrainConfig


@dataclasses.dataclass(frozen=True)
class Config:
    """FedAvg: ``rounds`` rounds; each round's participants are drawn by ``sampling``:
    ``"poisson"`` (every agent independently with rate ``sampling_rate`` q) or ``"fixed"`` (a
    uniformly random subset of exactly ``cohort_size`` agents). ``diagnostics``: report each
    round's ``num_sampled`` and the cohort's mean ``train_loss`` and ``mean_update_norm`` (not
    noised: a private variant's ledger declares them uncovered); false: nothing."""

    rounds: int = 20
    sampling_rate: float = 1.0
    server_lr: float = 1.0
    local: LocalTrainConfig = LocalTrainConfig()
    sampling: str = "poisson"
    cohort_size: int = 0
    diagnostics: bool = True

    FIELDS = {"rounds": validation.Int(1),
              "sampling_rate": validation.Float(0.0, 1.0, low_open=True),
              "server_lr": validation.Float(0.0, low_open=True),
              "local": validation.Instance(LocalTrainConfig),
              "sampling": validation.Choice(cohort_lib.SAMPLINGS),
              "cohort_size": validation.Int(0), "diagnostics": validation.Bool()}

    def __post_init__(self):
        validation.check_config(self, "algorithm")     # every field, subclasses' too
        if self.sampling == "fixed":
            validation.check_int("algorithm.cohort_size", self.cohort_size, minimum=1)

    @property
    def participation(self) -> cohort_lib.Sampling:
        return cohort_lib.Sampling(self.sampling, rate=self.sampling_rate,
                                   size=self.cohort_size)


# --------------------------------------------------------------------------- the protocol
# (the engine's; FedAvg and DP-FedAvg differ only in their RoundSpec)

DESCRIPTION = "FedAvg, non-private (McMahan et al. 2017)"
USES_LOCAL_TRAIN = True
#: the ``private`` hook (:class:`fedjax_dp.algorithms.api.Algorithm`): FedAvg gives no privacy
#: guarantee (its ledger is empty), so there is nothing to calibrate
private = False


def round_spec(config: Config) -> RoundSpec:
    return RoundSpec(sampling=config.participation, server_lr=config.server_lr,
                     diagnostics=config.diagnostics)


def init(key: jax.Array, data: api.FederatedData, model: Model, config: Config,
         runtime: api.Runtime = api.Runtime()) -> api.State:
    config.participation.check(data.num_agents, config.rounds)    # not every round empty
    return init_rounds(key, data, model, config.local, round_spec(config), runtime)


def num_steps(config: Config) -> int:
    return config.rounds


#: The round diagnostics (``Config.diagnostics``) as a release a private variant's ledger does
#: not cover (:meth:`PrivacyLedger.declare_uncovered`): ``(release, reason)``.
DIAGNOSTICS_UNCOVERED = (
    "diagnostic metrics num_sampled (the realised cohort size), train_loss and "
    "mean_update_norm of every round (history, progress.jsonl)",
    "computed from the agents' data without noise: not private "
    "(algorithm.diagnostics = false leaves them out)")


def ledger(config: Config, state: api.State | None = None) -> PrivacyLedger:
    """FedAvg gives no privacy guarantee: an empty ledger."""
    return PrivacyLedger()
