"""FedAvg (McMahan et al. 2017), the non-private baseline; its round is shared with DP-FedAvg.

One round t (voting-dpfl paper, Algorithm 1 without lines 3-4 of NoisyUpdate):

    S_t ~ sampling: Poisson (agent i participates with probability q, independently) or a
          uniformly random subset of exactly C agents (``sampling = "fixed"``)
    Delta_i = LocalSGD_E(theta_t; D_i) - theta_t                    for i in S_t (one vmap)
    theta_{t+1} = theta_t + eta_s * sum_{i in S_t} Delta_i / max(1, |S_t|)

A server optimizer (``server_optimizer``; Reddi et al., "Adaptive Federated Optimization", ICLR
2021, Algorithm 1) treats the round's mean update as a pseudo-gradient: with
``Delta_t = sum_{i in S_t} Delta_i / max(1, |S_t|)`` (DP-FedAvg: clipped, noised, over q N),

    g_t = -Delta_t;   (u_t, s_{t+1}) = opt.update(g_t, s_t, theta_t);   theta_{t+1} = theta_t + u_t

so ``sgd(learning_rate=1)`` is the plain step above with eta_s = 1, ``sgd(eta, momentum=0.9)`` is
FedAvgM, ``adam`` FedAdam, ``yogi`` FedYogi, ``adagrad`` FedAdagrad. The optimizer's state s_t is
part of the run's values (``"server_opt_state"``). It reads only the released update, so it is
post-processing: a private variant's ledger is the same with or without it.

The round is a chain of stages (:mod:`fedjax_dp.stages`) run by
:mod:`fedjax_dp.algorithms.rounds`; this module holds FedAvg's :class:`Config` and its
:func:`chain`: participation (Poisson, fixed-size or cyclic groups), E local optax steps, no
clipping, the plain sum, no noise, the server's step over the realised cohort.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax

from fedjax_dp.algorithms import api
from fedjax_dp.algorithms.rounds_protocol import (  # noqa: F401  (the protocol hooks)
    artifacts, multi_step, output, prefetch, rounds_per_call, seed_step, step)
from fedjax_dp.algorithms import rounds
from fedjax_dp.algorithms.rounds import (  # noqa: F401  (the engine's names, re-exported)
    init_rounds, round_keys, sample_agents)
from fedjax_dp.core import cohort as cohort_lib
from fedjax_dp.core import validation
from fedjax_dp.models import Model
from fedjax_dp.privacy import PrivacyLedger
from fedjax_dp.stages import Chain, aggregation, clipping, noise, participation, updates
from fedjax_dp.train import LocalTrainConfig, optimizers


def _server_optimizer(name: str, value: Any) -> Any:
    """``algorithm.server_optimizer``: None, or an optimizer (:func:`optimizers.parse`)."""
    return None if value is None else optimizers.parse(name, value)


@dataclasses.dataclass(frozen=True)
class Config:
    """FedAvg: ``rounds`` rounds; each round's participants are drawn by ``sampling``:
    ``"poisson"`` (every agent independently with rate ``sampling_rate`` q) or ``"fixed"`` (a
    uniformly random subset of exactly ``cohort_size`` agents). ``diagnostics``: report each
    round's ``num_sampled`` and the cohort's mean ``train_loss`` and ``mean_update_norm`` (not
    noised: a private variant's ledger declares them uncovered); false: nothing. On by default
    here (FedAvg releases its model without noise anyway); off by default in DP-FedAvg and
    DP-FedSGD, so that their epsilon covers every release unless a config opts in.

    ``server_optimizer`` (:mod:`fedjax_dp.train.optimizers`): None (the step ``theta + eta_s
    Delta_t`` with eta_s = ``server_lr``), an optax name with rate ``server_lr`` (``"momentum"``:
    sgd with momentum 0.9), a table ``{name = "adam", learning_rate = 0.01, eps = 1e-3}``, or
    from Python an ``optax.GradientTransformation``, applied to the pseudo-gradient
    ``-Delta_t`` (module docstring); a table or a transformation carries its own rate, so
    ``server_lr`` is then left at 1.

    ``min_sep`` (b): None or 1 (every round draws from all agents), or b >= 2 participation
    groups, round t drawing from group ``t mod b`` only (b-min-sep participation,
    :class:`fedjax_dp.stages.participation.Cyclic`; with correlated noise the default is the
    noise's b)."""

    rounds: int = 20
    sampling_rate: float = 1.0
    server_lr: float = 1.0
    local: LocalTrainConfig = LocalTrainConfig()
    sampling: str = "poisson"
    cohort_size: int = 0
    diagnostics: bool = True
    server_optimizer: Any = None
    min_sep: int | None = None

    FIELDS = {"min_sep": validation.Int(1, optional=True),
              "rounds": validation.Int(1),
              "sampling_rate": validation.Float(0.0, 1.0, low_open=True),
              "server_lr": validation.Float(0.0, low_open=True),
              "local": validation.Instance(LocalTrainConfig),
              "sampling": validation.Choice(cohort_lib.SAMPLINGS),
              "cohort_size": validation.Int(0), "diagnostics": validation.Bool(),
              "server_optimizer": validation.Custom(
                  _server_optimizer, bad=(3, "adamx", {"learning_rate": 0.01},
                                          {"name": "adam", "learning_rate": 0.01, "b3": 1.0},
                                          {"name": "adam", "learning_rate": [0.01]}))}

    def __post_init__(self):
        validation.check_config(self, "algorithm")     # every field, subclasses' too
        if self.server_optimizer is not None and not isinstance(self.server_optimizer, str) \
                and self.server_lr != 1.0:
            raise ValueError(f"algorithm.server_lr = {self.server_lr:g} is not read with "
                             f"algorithm.server_optimizer = "
                             f"{optimizers.describe(self.server_optimizer)} (its learning_rate "
                             f"is the server's rate): give one of them")
        if self.sampling == "fixed":
            validation.check_int("algorithm.cohort_size", self.cohort_size, minimum=1)

    @property
    def participation(self) -> cohort_lib.Sampling:
        """The draw within the round's pool (every agent, or the round's group)."""
        return cohort_lib.Sampling(self.sampling, rate=self.sampling_rate,
                                   size=self.cohort_size)


def participation_stage(config: Config, default_min_sep: int | None = None
                        ) -> participation.Participation:
    """The participation stage of ``config``: Poisson, fixed-size, or cyclic groups when
    ``min_sep`` (or the noise's ``default_min_sep``) is above 1."""
    b = config.min_sep if config.min_sep is not None else (default_min_sep or 1)
    if b > 1:
        return participation.Cyclic(min_sep=int(b), within=config.participation)
    if config.sampling == "fixed":
        return participation.Fixed(size=int(config.cohort_size))
    return participation.Poisson(rate=float(config.sampling_rate))


def server_stage(config: Config, denominator: str) -> updates.ServerUpdate:
    """The server-update stage: the plain step of rate ``server_lr``, or the optimizer."""
    if config.server_optimizer is None:
        return updates.PlainStep(learning_rate=float(config.server_lr), denominator=denominator)
    return updates.OptaxStep(optimizer=config.server_optimizer,
                             learning_rate=float(config.server_lr), denominator=denominator)


def chain(config: Config, model: Model | None = None) -> Chain:
    """FedAvg's round: participation, local steps, no clip, plain sum, no noise, the server's
    step over the realised cohort (``model`` None: the chain checked without a client)."""
    client = updates.LocalSteps(None if model is None
                                else rounds.local_sgd_update(model, config.local))
    return Chain(participation=participation_stage(config), client_update=client,
                 clipping=clipping.NoClip(), aggregation=aggregation.PlainSum(),
                 noise=noise.NoNoise(), server_update=server_stage(config, "sampled"))


# --------------------------------------------------------------------------- the protocol
# (the engine's; FedAvg and DP-FedAvg differ only in their chains)

DESCRIPTION = "FedAvg, non-private (McMahan et al. 2017)"
USES_LOCAL_TRAIN = True
#: the ``private`` hook (:class:`fedjax_dp.algorithms.api.Algorithm`): FedAvg gives no privacy
#: guarantee (its ledger is empty), so there is nothing to calibrate
private = False


def init(key: jax.Array, data: api.FederatedData, model: Model, config: Config,
         runtime: api.Runtime = api.Runtime()) -> api.State:
    return init_rounds(key, data, model, chain(config, model), config.rounds, runtime,
                       local=config.local, diagnostics=config.diagnostics)


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
