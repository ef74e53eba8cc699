"""The two stages that train: the agents' *client update* and the *server update*.

Client update: one agent's local work from the round's model, ``agent_update(key, params, x, y,
mask, count, extras) -> (params, metrics)`` (``local_steps``: E optax steps,
:func:`fedjax_dp.train.make_local_update`, any optax transformation by ``train.optimizer``;
``dp_sgd``: DP-SGD inside the agent, DP-FedSGD's instance-level mechanism).

Server update: the server's step from the released (clipped, noised) sum and its divisor
(:func:`server_step`): ``sgd`` is ``theta + eta_s sum / denominator``; ``optax``
applies any optax transformation to the pseudo-gradient ``-sum / denominator`` (Reddi et al.,
"Adaptive Federated Optimization", ICLR 2021, Algorithm 1: FedAvgM, FedAdam, FedYogi,
FedAdagrad), its state the stage's. Both read only the release: post-processing, no event.
``denominator``: ``"expected"`` (the fixed qN or C; needed for the sampled-Gaussian analysis) or
``"sampled"`` (the realised cohort; the ledger declares that release uncovered).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar

import jax
import jax.numpy as jnp
import optax

from fedjax_dp.stages.base import Stage, register
from fedjax_dp.train import optimizers

__all__ = ["ClientUpdate", "LocalSteps", "LocalDpSgd", "ServerUpdate", "PlainStep",
           "OptaxStep", "server_step"]


class ClientUpdate(Stage):
    KIND: ClassVar[str] = "client_update"
    agent_update: Callable | None = None


@register
@dataclasses.dataclass(frozen=True)
class LocalSteps(ClientUpdate):
    NAME: ClassVar[str] = "local_steps"
    CONFIG: ClassVar[str] = 'train.* (fedavg, dp_fedavg)'
    SUMMARY: ClassVar[str] = "E local steps of any optax optimizer (train.*)"
    OPTIONS: ClassVar[dict] = {"train.optimizer": "a shorthand, or {name = <optax name>, ...}",
                               "train.steps": "E local steps", "train.batch_size": "B"}
    agent_update: Callable | None = None


@register
@dataclasses.dataclass(frozen=True)
class LocalDpSgd(ClientUpdate):
    NAME: ClassVar[str] = "dp_sgd"
    CONFIG: ClassVar[str] = 'algorithm.name = "dp_fedsgd"'
    SUMMARY: ClassVar[str] = "DP-SGD inside each agent (instance-level; DP-FedSGD)"
    OPTIONS: ClassVar[dict] = {"clip_norm": "per-example C", "noise_multiplier": "z",
                               "record_sampling_rate": "p or none (B / n_i)"}
    agent_update: Callable | None = None


class ServerUpdate(Stage):
    """``init(params)`` -> state; ``update(params, state, total, denom, released)``."""

    KIND: ClassVar[str] = "server_update"
    denominator: str = "expected"

    def transformation(self) -> optax.GradientTransformation | None:
        return None

    def init(self, params: Any) -> Any:
        opt = self.transformation()
        return () if opt is None else opt.init(params)

    def update(self, params, state, total, denom, released=None):
        """``(params, state)`` after the step (an aborted round moves neither)."""
        opt = self.transformation()
        new, opt_state = server_step(getattr(self, "learning_rate", 1.0), opt, params,
                                     None if opt is None else state, total, denom, released)
        return new, (() if opt is None else opt_state)


def server_step(server_lr: float, opt: optax.GradientTransformation | None, params: Any,
                opt_state: Any, total: Any, denom, released=None) -> tuple[Any, Any]:
    """The server's step from the round's (clipped, noised) sum ``total`` and its divisor:
    ``(params, opt_state)``. Without ``opt``: ``theta + server_lr * total / denom`` (state None).
    With it, Reddi et al., "Adaptive Federated Optimization" (ICLR 2021), Algorithm 1: the mean
    update ``Delta_t = total / denom`` is a pseudo-gradient ``g_t = -Delta_t``,
    ``(u_t, s_{t+1}) = opt.update(g_t, s_t, theta_t)``, ``theta_{t+1} = theta_t + u_t``
    (``sgd(1)`` is the plain step with rate 1, bit for bit). ``released`` (distributed noise,
    bool): an aborted round moves neither the params nor the state."""
    if opt is None:
        return jax.tree.map(lambda g, s: g + server_lr * s / denom, params, total), None
    pseudo_grad = jax.tree.map(lambda s: -(s / denom), total)
    updates, new_state = opt.update(pseudo_grad, opt_state, params)
    new_params = optax.apply_updates(params, updates)
    if released is not None:
        new_params, new_state = jax.tree.map(lambda new, old: jnp.where(released, new, old),
                                             (new_params, new_state), (params, opt_state))
    return new_params, new_state


@register
@dataclasses.dataclass(frozen=True)
class PlainStep(ServerUpdate):
    NAME: ClassVar[str] = "sgd"
    CONFIG: ClassVar[str] = 'algorithm.server_lr (no algorithm.server_optimizer)'
    SUMMARY: ClassVar[str] = "theta + eta_s * sum / denominator (FedAvg's step)"
    OPTIONS: ClassVar[dict] = {"server_lr": "eta_s > 0",
                               "denominator": '"expected" (qN or C) or "sampled"'}
    learning_rate: float = 1.0
    denominator: str = "expected"


@register
@dataclasses.dataclass(frozen=True)
class OptaxStep(ServerUpdate):
    NAME: ClassVar[str] = "optax"
    CONFIG: ClassVar[str] = 'algorithm.server_optimizer = {name = "adam", learning_rate = 0.01, ...}'
    SUMMARY: ClassVar[str] = ("any optax transformation on the pseudo-gradient (FedAvgM, "
                              "FedAdam, FedYogi, FedAdagrad)")
    OPTIONS: ClassVar[dict] = {"server_optimizer": "an optax name, {name = ..., kwargs}, or an "
                                                   "optax.GradientTransformation",
                               "denominator": '"expected" (qN or C) or "sampled"'}
    optimizer: Any = "adam"
    learning_rate: float = 1.0
    denominator: str = "expected"

    def transformation(self) -> optax.GradientTransformation:
        return optimizers.resolve(self.optimizer, self.learning_rate)

    @property
    def label(self) -> str:
        return f'{self.KIND} "{optimizers.describe(self.optimizer)}"'
