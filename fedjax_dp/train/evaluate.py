"""Evaluation: accuracy of one model, or of every agent's model, on a labelled set."""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.core import for_each_agent
from fedjax_dp.models import Model

Params = Any


def predict(model: Model, params: Params, x: jax.Array, batch_size: int = 1024) -> jax.Array:
    """Predicted class per example, ``x [M, ...] -> [M]`` (batched to bound memory)."""
    outs = []
    for start in range(0, x.shape[0], batch_size):   # host batching over examples, not agents
        outs.append(jnp.argmax(model.logits(params, x[start:start + batch_size]), -1))
    return jnp.concatenate(outs) if outs else jnp.zeros((0,), jnp.int32)


def accuracy(model: Model, params: Params, x, y, batch_size: int = 1024) -> float:
    """Fraction of ``x`` classified as ``y`` (0..1)."""
    y = jnp.asarray(y)
    if y.shape[0] == 0:
        raise ValueError("accuracy needs at least one labelled example, got an empty set")
    return float(jnp.mean(predict(model, params, jnp.asarray(x), batch_size) == y))


def per_agent_accuracy(model: Model, stacked_params: Params, x, y, *,
                       chunk_size: int | None = None) -> np.ndarray:
    """Accuracy of every agent's model on the same set: ``[N]`` (vmapped over agents)."""
    x, y = jnp.asarray(x), jnp.asarray(y)

    def one(params):
        return jnp.mean(jnp.argmax(model.logits(params, x), -1) == y)

    return np.asarray(jax.jit(for_each_agent(one, chunk_size=chunk_size))(stacked_params))
