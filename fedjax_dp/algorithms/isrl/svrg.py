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

import jax
import jax.numpy as jnp

from fedjax_dp.algorithms.isrl import engine, estimators
from fedjax_dp.algorithms.isrl.protocol import Algorithm, PrivateConfig
from fedjax_dp.core import validation


@dataclasses.dataclass(frozen=True)
class Rule(engine.UpdateRule):
    """The Prox-SVRG round of the module docstring (state: snapshot w~ and its gradient g~;
    with restarts also the kept candidate iterate of Prox-PL-SVRG)."""

    name: str = "svrg"
    kinds: tuple[str, ...] = ("snapshot", "difference")
    differences: bool = True

    def batch_sizes(self, config) -> tuple[int, ...]:
        return (config.batch_size, config.diff_batch_size or config.batch_size)

    def spec_fields(self, config) -> dict:
        return dict(period=config.epoch_length, smoothness=config.smoothness,
                    restart_every=getattr(config, "restart_every", 0))

    def planned(self, config) -> tuple[int, ...]:
        return estimators.refresh_counts(config.rounds, config.epoch_length)

    def init_state(self, spec, params) -> dict:
        state = dict(snapshot=params, snapshot_grad=jax.tree.map(jnp.zeros_like, params))
        if spec.restart_every:
            state["candidate"] = params
        return state

    def update(self, r: engine.RoundTools, values: dict) -> engine.Update:
        spec, w, t = r.spec, r.w, r.t
        snap = estimators.is_refresh(t, spec.period)
        tau = estimators.difference_clip(w, values["snapshot"], r.clip, spec.smoothness)
        avg, st = jax.lax.cond(snap, r.gradients(0), r.differences(values["snapshot"], tau))
        g, v = estimators.svrg_update(values["snapshot_grad"], avg, snap)
        new_w = estimators.prox_step(r.prox, w, v, r.lr)
        state = dict(snapshot=jax.tree.map(lambda s, x: jnp.where(snap, x, s),
                                           values["snapshot"], w), snapshot_grad=g)
        if spec.restart_every:
            # Prox-PL-SVRG (Alg. 2): the output of each restart is a uniformly random iterate
            # of it (reservoir sampling: iterate j of the restart replaces the kept one with
            # probability 1 / (j + 1)); the next restart starts from it.
            j = t % spec.restart_every
            keep_new = jax.random.uniform(r.k_extra) * (j + 1) < 1.0
            cand = jax.tree.map(lambda c, x: jnp.where(keep_new, x, c), values["candidate"],
                                new_w)
            end = (t + 1) % spec.restart_every == 0
            new_w = jax.tree.map(lambda c, x: jnp.where(end, c, x), cand, new_w)
            state["candidate"] = cand
        return engine.Update(params=new_w, state=state,
                             uploads=jnp.stack([snap, ~snap]).astype(jnp.int32), stats=st,
                             metrics={"difference_clip": jnp.where(snap, jnp.nan, tau)})


RULE = engine.register(Rule())


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
    name="isrl_prox_svrg", Config=Config, method=RULE.name, private=True,
    DESCRIPTION="ISRL-DP Prox-SVRG, snapshot + difference uploads (Lowy et al. 2023, Alg. 1)")
ISRL_PROX_PL_SVRG = Algorithm(
    name="isrl_prox_pl_svrg", Config=PLConfig, method=RULE.name, private=True,
    DESCRIPTION="ISRL-DP Prox-PL-SVRG: Prox-SVRG with restarts (Lowy et al. 2023, Alg. 2)")
