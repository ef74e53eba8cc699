"""ISRL-DP Local SGD (FedAvg with private local steps) and non-private Local SGD.

Round r: every available silo runs K local steps from w_r,

    w^{k+1} = prox_{eta f1}( w^k - eta u(w^k) ),   k = 0..K-1,

each u an upload-equivalent noisy clipped minibatch gradient (:func:`uploads.gradient_upload`,
eq. (1)); the server averages the available silos' models, w_{r+1} = (1/M) sum_{i in S_r} w_i^K.
The final local model depends on every local noisy gradient, so every local step is a release:
a silo's ledger composes K * (rounds available) Poisson-sampled Gaussian mechanisms (the reference
code ignored them). ``LOCAL_SGD`` is the same code with no clipping and no noise.
"""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from fedjax_dp.algorithms.isrl import engine
from fedjax_dp.algorithms.isrl.protocol import Algorithm, Config as _Base, PrivateConfig
from fedjax_dp.core import validation


@dataclasses.dataclass(frozen=True)
class Rule(engine.UpdateRule):
    """``w_{r+1} = (1/M) sum_{i in S_r} w_i^K``: K local noisy prox-SGD steps per silo."""

    name: str = "local_sgd"
    kinds: tuple[str, ...] = ("local_step",)

    def spec_fields(self, config) -> dict:
        return dict(local_steps=config.local_steps)

    def planned(self, config) -> tuple[int, ...]:
        return (config.rounds * config.local_steps,)

    def update(self, r: engine.RoundTools, values: dict) -> engine.Update:
        local, st = r.local()
        return engine.Update(params=r.average(local), state={},
                             uploads=jnp.full((1,), r.spec.local_steps, jnp.int32), stats=st,
                             metrics={})


RULE = engine.register(Rule())


#: checked with the base's fields (validation.check_config)
_FIELDS = {"local_steps": validation.Int(1)}


@dataclasses.dataclass(frozen=True)
class Config(PrivateConfig):
    """ISRL-DP Local SGD. local_steps: K local noisy steps per round."""

    local_steps: int = 5

    FIELDS = _FIELDS


@dataclasses.dataclass(frozen=True)
class NonPrivateConfig(_Base):
    """Non-private Local SGD (FedAvg). local_steps: K local steps per round."""

    local_steps: int = 5

    FIELDS = _FIELDS


ISRL_LOCAL_SGD = Algorithm(
    name="isrl_local_sgd", Config=Config, method=RULE.name, private=True,
    DESCRIPTION="ISRL-DP Local SGD: K noisy local steps per round, all accounted (Lowy et al.)")
LOCAL_SGD = Algorithm(
    name="local_sgd", Config=NonPrivateConfig, method=RULE.name, private=False,
    DESCRIPTION="Local SGD (FedAvg with prox local steps), non-private baseline (ISRL family)")
