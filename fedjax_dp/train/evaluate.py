"""Evaluation: accuracy of one model, or of every agent's model, on a labelled set.

The accuracy is the model's task's (:mod:`fedjax_dp.models.tasks`): the fraction of examples
classified correctly, or for a next-token task the fraction of real tokens (``y != pad``) predicted
correctly, counted over all examples and positions."""
from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.core import for_each_agent
from fedjax_dp.models import Model
from fedjax_dp.models import tasks

Params = Any

#: A next-token model's prediction batch holds at most this many logits (``B T V`` floats:
#: 64 MiB), e.g. 335 sequences of StackOverflow's T = 20, V = 10004.
LOGITS_PER_BATCH = 1 << 24


def predict(model: Model, params: Params, x: jax.Array, batch_size: int = 1024) -> jax.Array:
    """Predicted class per example, ``x [M, ...] -> [M]`` (a host array; a next-token task: the
    predicted token at every position, ``x [M, T] -> [M, T]``), batched to bound memory (a
    next-token model's batch is cut to :data:`LOGITS_PER_BATCH` logits) and compiled: one
    program for every batch, the last padded."""
    task = tasks.of(model)
    if isinstance(task, tasks.NextToken):
        per_example = model.num_classes * math.prod(model.feature_shape)     # T V logits
        size = max(1, min(batch_size, LOGITS_PER_BATCH // max(1, per_example), x.shape[0]))
        step = token_predictor(model)
        outs = []
        for start in range(0, x.shape[0], size):     # host batching over examples
            xb = jnp.asarray(x[start:start + size])
            n = xb.shape[0]
            if n < size:                              # pad: the same compiled shape
                xb = jnp.pad(xb, ((0, size - n), (0, 0)), constant_values=task.pad_id)
            outs.append(step(params, xb)[:n])
        return jnp.concatenate(outs) if outs else jnp.zeros((0,) + tuple(x.shape[1:]), jnp.int32)
    # host batching over examples (not agents), every batch in one compiled shape (the last
    # padded with zeros and cut): one compilation per model and batch size, none per batch
    x = np.asarray(x)
    size = max(1, min(batch_size, x.shape[0]))
    step = token_predictor(model)
    outs = []
    for start in range(0, x.shape[0], size):
        xb = x[start:start + size]
        n = xb.shape[0]
        if n < size:
            xb = np.concatenate([xb, np.zeros((size - n,) + xb.shape[1:], xb.dtype)])
        outs.append(np.asarray(step(params, jax.device_put(xb)))[:n])
    return np.concatenate(outs) if outs else np.zeros((0,), np.int32)


@functools.lru_cache(maxsize=32)
def token_predictor(model: Model):
    """``(params, x [B, ...]) -> argmax logits [B] ([B, T] for a next-token model)``, compiled
    once per model (and batch shape)."""
    return jax.jit(lambda params, x: jnp.argmax(model.logits(params, x), -1))


def accuracy(model: Model, params: Params, x, y, batch_size: int = 1024) -> float:
    """Fraction of ``x`` classified as ``y`` (0..1); a next-token task: the per-token accuracy
    over the real tokens (:meth:`fedjax_dp.models.tasks.NextToken.metrics`)."""
    if np.shape(y)[0] == 0:
        raise ValueError("accuracy needs at least one labelled example, got an empty set")
    task = tasks.of(model)
    if isinstance(task, tasks.NextToken):
        return task.accuracy(predict(model, params, jnp.asarray(x), batch_size), jnp.asarray(y))
    return float(np.mean(predict(model, params, x, batch_size) == np.asarray(y)))


def per_agent_accuracy(model: Model, stacked_params: Params, x, y, *,
                       chunk_size: int | None = None) -> np.ndarray:
    """Accuracy of every agent's model on the same set: ``[N]`` (vmapped over agents); a
    next-token task: per-token over ``y != pad``."""
    x, y = jnp.asarray(x), jnp.asarray(y)
    task = tasks.of(model)

    if isinstance(task, tasks.NextToken):
        real = (y != task.pad_id).astype(jnp.float32)                           # [M, T]

        def one(params):
            hit = (jnp.argmax(model.logits(params, x), -1) == y).astype(jnp.float32)
            return jnp.sum(hit * real) / jnp.maximum(jnp.sum(real), 1.0)
    else:
        def one(params):
            return jnp.mean(jnp.argmax(model.logits(params, x), -1) == y)

    return np.asarray(jax.jit(for_each_agent(one, chunk_size=chunk_size))(stacked_params))
