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

import jax
import jax.numpy as jnp

from fedjax_dp.algorithms.isrl import engine, estimators
from fedjax_dp.algorithms.isrl.protocol import SPIDER_FIELDS, Algorithm, PrivateConfig


@dataclasses.dataclass(frozen=True)
class Rule(engine.UpdateRule):
    """The SPIDER round of the module docstring (state: ``v`` and the previous iterate)."""

    name: str = "spider"
    kinds: tuple[str, ...] = ("refresh", "difference")
    shuffle: bool = True
    differences: bool = True

    def batch_sizes(self, config) -> tuple[int, ...]:
        return (config.batch_size, config.diff_batch_size or config.batch_size)

    def spec_fields(self, config) -> dict:
        return dict(period=config.phase_length, smoothness=config.smoothness)

    def planned(self, config) -> tuple[int, ...]:
        return estimators.refresh_counts(config.rounds, config.phase_length)

    def init_state(self, spec, params) -> dict:
        return dict(prev_params=params, v=jax.tree.map(jnp.zeros_like, params))

    def update(self, r: engine.RoundTools, values: dict) -> engine.Update:
        spec = r.spec
        refresh = estimators.is_refresh(r.t, spec.period)
        tau = estimators.difference_clip(r.w, values["prev_params"], r.clip, spec.smoothness)
        avg, st = jax.lax.cond(refresh, r.gradients(0), r.differences(values["prev_params"], tau))
        v = estimators.spider_update(values["v"], avg, refresh)
        return engine.Update(
            params=estimators.prox_step(r.prox, r.w, v, r.lr), state=dict(prev_params=r.w, v=v),
            uploads=jnp.stack([refresh, ~refresh]).astype(jnp.int32), stats=st,
            metrics={"difference_clip": jnp.where(refresh, jnp.nan, tau)})


RULE = engine.register(Rule())


@dataclasses.dataclass(frozen=True)
class Config(PrivateConfig):
    """FedProx-SPIDER. phase_length: q. batch_size: K1 (refresh); diff_batch_size: K2
    (difference; None: K1). smoothness: beta_hat of the difference clip (None: clip at 2C)."""

    phase_length: int = 2
    diff_batch_size: int | None = None
    smoothness: float | None = None

    FIELDS = SPIDER_FIELDS


ISRL_SPIDER = Algorithm(
    name="isrl_spider", Config=Config, method=RULE.name, private=True,
    DESCRIPTION="ISRL-DP FedProx-SPIDER, phase length q, smoothness-based difference clip "
                "(Lowy et al. 2023, Alg. 3)")
