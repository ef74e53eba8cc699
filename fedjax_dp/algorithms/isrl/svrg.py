"""ISRL-DP Prox-SVRG (Lowy et al., Alg. 1) and Prox-PL-SVRG (Alg. 2: restarts).

Epoch length m. Round t (one upload per available silo):

    t mod m == 0:  w~ = w_t;  u_i = noisy mean clipped gradient at w~ over ~K1 records   (snapshot)
                   g~ = (1/M) sum_{i in S_t} u_i;   v_t = g~
    otherwise:     u_i = noisy mean over ~K2 records of
                         clip_tau( clip_C(g(w_t, x)) - clip_C(g(w~, x)) )          (difference)
                   v_t = g~ + (1/M) sum_{i in S_t} u_i
    w_{t+1} = prox_{eta f1}(w_t - eta v_t)

tau = 2C (the difference's sensitivity; the mean's is 2C / K2), or min(2C, beta_hat ||w_t - w~||)
with ``smoothness``. Prox-PL-SVRG restarts every ``restart_every`` rounds (a multiple of m) from a
uniformly random iterate of the finished restart (Reddi et al. 2016's output rule; reservoir
sampling, post-processing). Privacy per silo: snapshot and difference uploads, each a
Poisson-sampled Gaussian mechanism with multiplier z, composed over the rounds it was available.
"""
from __future__ import annotations

import dataclasses

from fedjax_dp.algorithms.isrl.protocol import Algorithm, PrivateConfig
from fedjax_dp.core import validation


@dataclasses.dataclass(frozen=True)
class Config(PrivateConfig):
    """Prox-SVRG. epoch_length: m. batch_size: K1 (snapshot); diff_batch_size: K2 (None: K1).
    smoothness: beta_hat of the difference clip (None: 2C)."""

    epoch_length: int = 5
    diff_batch_size: int | None = None
    smoothness: float | None = None

    FIELDS = {"epoch_length": validation.Int(1),
              "diff_batch_size": validation.Int(1, validation.BATCH_MAX, optional=True),
              "smoothness": validation.Float(0.0, low_open=True, optional=True)}


@dataclasses.dataclass(frozen=True)
class PLConfig(Config):
    """Prox-PL-SVRG. restart_every: rounds per restart (a multiple of epoch_length)."""

    restart_every: int = 10

    FIELDS = {"restart_every": validation.Int(1)}

    def __post_init__(self):
        super().__post_init__()            # checks every field (validation.check_config)
        if self.restart_every < self.epoch_length or self.restart_every % self.epoch_length:
            raise ValueError(f"algorithm.restart_every must be a multiple of "
                             f"algorithm.epoch_length ({self.epoch_length}), got "
                             f"{self.restart_every}")


ISRL_PROX_SVRG = Algorithm(
    name="isrl_prox_svrg", Config=Config, method="svrg", private=True,
    DESCRIPTION="ISRL-DP Prox-SVRG, snapshot + difference uploads (Lowy et al. 2023, Alg. 1)")
ISRL_PROX_PL_SVRG = Algorithm(
    name="isrl_prox_pl_svrg", Config=PLConfig, method="svrg", private=True,
    DESCRIPTION="ISRL-DP Prox-PL-SVRG: Prox-SVRG with restarts (Lowy et al. 2023, Alg. 2)")
