"""ISRL-DP MB-SGD = Noisy Prox-SGD (Lowy et al., Alg. E.1 / Thm 2.1), and non-private MB-SGD.

Round r: M available silos each send the noisy mean of clipped per-record gradients at w_r over a
Poisson minibatch of expected size K (:func:`uploads.gradient_upload`, eq. (1)); the server sets

    w_{r+1} = prox_{eta f1}( w_r - eta (1/M) sum_{i in S_r} u_i ).

With f1 = 0 this is (ISRL-DP) minibatch SGD. Privacy per silo: one Poisson-sampled Gaussian
mechanism (rate min(1, K / n_i), noise multiplier z, sensitivity C) per round it is available.
``MB_SGD`` is the same code with no clipping and no noise.
"""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from fedjax_dp.algorithms.isrl import engine, estimators
from fedjax_dp.algorithms.isrl.protocol import Algorithm, Config as _Base, PrivateConfig


@dataclasses.dataclass(frozen=True)
class Rule(engine.UpdateRule):
    """``w_{r+1} = prox_{eta f1}(w_r - eta avg)``, avg the gradient uploads' average."""

    name: str = "mb_sgd"
    kinds: tuple[str, ...] = ("gradient",)
    shuffle: bool = True

    def update(self, r: engine.RoundTools, values: dict) -> engine.Update:
        v, st = r.gradients(0)()
        return engine.Update(params=estimators.prox_step(r.prox, r.w, v, r.lr), state={},
                             uploads=jnp.ones((1,), jnp.int32), stats=st, metrics={})


RULE = engine.register(Rule())


@dataclasses.dataclass(frozen=True)
class Config(PrivateConfig):
    """ISRL-DP MB-SGD / Noisy Prox-SGD (fields: :class:`protocol.PrivateConfig`)."""


@dataclasses.dataclass(frozen=True)
class NonPrivateConfig(_Base):
    """Non-private MB-SGD (fields: :class:`protocol.Config`)."""


ISRL_MB_SGD = Algorithm(
    name="isrl_mb_sgd", Config=Config, method=RULE.name, private=True,
    DESCRIPTION="ISRL-DP MB-SGD / Noisy Prox-SGD, per-silo record-level DP (Lowy et al. 2023)")
MB_SGD = Algorithm(
    name="mb_sgd", Config=NonPrivateConfig, method=RULE.name, private=False,
    DESCRIPTION="Minibatch SGD (prox), non-private baseline of the ISRL-DP family")
