"""The private gradient of ONE party (a DP-FedSGD agent's local step, an ISRL silo's upload, a
DP-FNAS party's half), composed from the parts, as jax_privacy keeps batch selection apart from
``clipped_grad``:

    b       = poisson_weights(k_batch, mask, q)                        (:mod:`.batch_selection`)
    S       = sum_j b_j clip_C(grad loss(w; x_j, y_j))                           (:mod:`.clipping`)
    release = (S + N(0, (z C)^2 I)) / D,  D = q n FIXED                             (:mod:`.noise`)
    event   = PoissonSampled(q, Gaussian(z))      (:mod:`.accounting`: sampled_gaussian_event;
              fixed size: fixed_size_event)

``D`` never depends on the realised batch size ``|b|``, which would leak it.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from fedjax_dp.privacy.batch_selection import RowPlan, poisson_weights
from fedjax_dp.privacy.clipping import clipped_sum
from fedjax_dp.privacy.noise import release

Params = Any

__all__ = ["per_example_bytes", "gradient_fn", "private_gradient"]


def per_example_bytes(params: Params, max_records: int) -> int:
    """One agent's working set in a private-gradient step, for sizing chunks of agents
    (:func:`fedjax_dp.core.lift.resolve_chunk_size`): its per-example gradients (``max_records``
    copies of the parameters) plus parameters, gradient and update (3 copies)."""
    from fedjax_dp.core.lift import agent_bytes
    return (max_records + 3) * agent_bytes(params)


def gradient_fn(loss_fn: Callable, params: Params) -> Callable:
    """``v(x, y) = (grad_w loss_fn(params, x, y), 0)``: the per-example gradient of the whole
    parameter pytree, in the ``per_example_fn`` form of :func:`clipped_sum`."""
    grad = jax.grad(loss_fn)
    return lambda x, y: (grad(params, x, y), jnp.zeros(()))


def private_gradient(key: jax.Array, loss_fn: Callable, params: Params, x: jax.Array,
                     y: jax.Array, mask: jax.Array, rate, denominator, clip, noise_std, *,
                     plan: RowPlan | None, private: bool = True,
                     per_leaf_noise: bool = False) -> tuple[Params, dict]:
    """One DP-SGD gradient release of one party (the whole primitive):

        k_batch, k_noise = split(key)
        b = poisson_weights(k_batch, mask, rate)                                     [n]
        g = ( sum_j b_j clip_C(grad loss(params; x_j, y_j)) + N(0, std^2 I) ) / D

    ``x [n, ...]``, ``y [n]`` (sequences: ``[n, T]``), ``mask [n]``; ``private=False``: no
    clipping and no noise.
    Event (one release): ``accounting.sampled_gaussian_event(std / C, rate, 1)``.
    Returns ``(g, {"count", "clipped", "aux"})``."""
    k_batch, k_noise = jax.random.split(key)
    weights = poisson_weights(k_batch, mask, rate)                                # [n]
    total, stats = clipped_sum(gradient_fn(loss_fn, params), (x, y), weights,
                               clip if private else jnp.inf, plan)
    if not private:
        stats = {**stats, "clipped": jnp.zeros(())}
    return release(k_noise, total, noise_std, denominator, noise=private,
                   per_leaf=per_leaf_noise), stats
