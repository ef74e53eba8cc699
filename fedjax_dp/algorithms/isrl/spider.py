"""ISRL-DP FedProx-SPIDER (Lowy et al., Alg. 3), general phase length q.

Round r (one upload per available silo):

    r mod q == 0:  u_i = noisy mean clipped gradient at w_r over ~K1 records          (refresh)
                   v_r = (1/M) sum_{i in S_r} u_i
    otherwise:     u_i = noisy mean over ~K2 records of
                         clip_tau( clip_C(g(w_r, x)) - clip_C(g(w_{r-1}, x)) )        (difference)
                   v_r = v_{r-1} + (1/M) sum_{i in S_r} u_i
    w_{r+1} = prox_{eta f1}(w_r - eta v_r)

tau_r = min(2C, beta_hat ||w_r - w_{r-1}||) (public: both iterates are broadcast), or 2C with no
``smoothness``; the noise of a difference upload scales with tau_r (same multiplier z). The server
keeps v, so partial participation works. q = 2 (alternate refresh and difference rounds) is the
authors' run; q = 1 is MB-SGD.

Privacy per silo: refresh uploads (rate min(1, K1/n_i), sensitivity C) and difference uploads
(rate min(1, K2/n_i), sensitivity tau_r) are both Poisson-sampled Gaussian mechanisms with
multiplier z, composed over the rounds the silo was available (the reference code calibrated each
of its two uploads per round to the whole budget).
"""
from __future__ import annotations

import dataclasses

from fedjax_dp.algorithms.isrl.protocol import SPIDER_FIELDS, Algorithm, PrivateConfig


@dataclasses.dataclass(frozen=True)
class Config(PrivateConfig):
    """FedProx-SPIDER. phase_length: q. batch_size: K1 (refresh); diff_batch_size: K2
    (difference; None: K1). smoothness: beta_hat of the difference clip (None: clip at 2C)."""

    phase_length: int = 2
    diff_batch_size: int | None = None
    smoothness: float | None = None

    FIELDS = SPIDER_FIELDS


ISRL_SPIDER = Algorithm(
    name="isrl_spider", Config=Config, method="spider", private=True,
    DESCRIPTION="ISRL-DP FedProx-SPIDER, phase length q, smoothness-based difference clip "
                "(Lowy et al. 2023, Alg. 3)")
