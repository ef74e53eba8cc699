"""The server's step of an averaging round (FedAvg, DP-FedAvg, DP-FedSGD;
:mod:`fedjax_dp.algorithms.rounds`): the plain ``server_lr`` step, or any optax transformation
on the round's pseudo-gradient (Reddi et al., "Adaptive Federated Optimization", ICLR 2021,
Algorithm 1), whose state is the run's ``values["server_opt_state"]``. It reads only the
released (clipped, noised) update: post-processing, no privacy event of its own."""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from fedjax_dp.train import optimizers

Params = Any

__all__ = ["optimizer", "update"]


def optimizer(spec) -> optax.GradientTransformation | None:
    """The transformation of a round's ``spec.server_optimizer`` (a name takes ``server_lr`` as
    its rate; :func:`fedjax_dp.train.optimizers.resolve`), or None for the plain step."""
    if spec.server_optimizer is None:
        return None
    return optimizers.resolve(spec.server_optimizer, spec.server_lr)


def update(server_lr: float, opt: optax.GradientTransformation | None, params: Params,
           opt_state: Any, total: Params, denom, released=None) -> tuple[Params, Any]:
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
