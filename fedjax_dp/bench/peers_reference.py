"""The peers' DP-FedAvg timing workload and its plain-JAX reference round (benchmark reference).

Re-expressed from ``../shared/peers/workload.py`` and ``../shared/peers/jax_ref.py --engine map
--chunk 10`` (not shipped; ``tests/test_bench.py`` checks the data and initial weights against
them when present). Sizes are parameters (the published workload is :data:`WORKLOAD`).

Workload: ``clients`` x ``examples`` examples of dimension ``dim`` (class means N(0, 1), an
example is its class mean + N(0, 1) noise, uniform labels; seed 0), an MLP dim -> hidden (ReLU)
-> 10 with He-normal initial weights (seed 1), and the round: a cohort of C clients, each
``examples / batch`` steps of plain SGD (batch 16, lr 0.1, stored order) from the global model,
its delta clipped to L2 norm 1 over all parameters; server lr 1:

    w <- w + (sum_{c in C} clip_1(Delta_c) + N(0, z^2 I)) / |C|

A noiseless round of all 1,000 clients from the initial weights gives parameter L2 norm
14.735746 in every correct implementation (:data:`CHECK_PARAM_NORM`).
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class Workload:
    clients: int = 1000
    examples: int = 64
    dim: int = 64
    hidden: int = 100
    classes: int = 10
    batch: int = 16
    client_lr: float = 0.1
    server_lr: float = 1.0
    clip: float = 1.0
    noise_multiplier: float = 1.0
    data_seed: int = 0
    init_seed: int = 1

    @property
    def local_steps(self) -> int:
        return self.examples // self.batch


WORKLOAD = Workload()
CHECK_PARAM_NORM = 14.735746          # ../shared/peers/README.md: the noiseless all-client round


def make_data(w: Workload = WORKLOAD) -> tuple[np.ndarray, np.ndarray]:
    """``x [clients, examples, dim] float32``, ``y [clients, examples] int64`` (workload.py)."""
    rng = np.random.default_rng(w.data_seed)
    means = rng.normal(size=(w.classes, w.dim)).astype(np.float32)
    y = rng.integers(0, w.classes, size=(w.clients, w.examples))
    x = means[y] + rng.normal(size=(w.clients, w.examples, w.dim)).astype(np.float32)
    return x.astype(np.float32), y.astype(np.int64)


def init_params(w: Workload = WORKLOAD) -> dict:
    """He-normal ``w1 [dim, hidden]``, ``w2 [hidden, classes]``, zero biases (workload.py)."""
    rng = np.random.default_rng(w.init_seed)
    return {"w1": (rng.normal(size=(w.dim, w.hidden)) * np.sqrt(2.0 / w.dim)).astype(np.float32),
            "b1": np.zeros(w.hidden, np.float32),
            "w2": (rng.normal(size=(w.hidden, w.classes))
                   * np.sqrt(2.0 / w.hidden)).astype(np.float32),
            "b2": np.zeros(w.classes, np.float32)}


def param_norm(p: dict) -> float:
    return float(np.sqrt(sum(float((np.asarray(v, np.float64) ** 2).sum()) for v in p.values())))


def make_round(w: Workload = WORKLOAD, chunk: int = 10):
    """jax_ref.py's ``--engine map --chunk K`` round, jitted:
    ``round_fn(p, X, Y, idx [C] int32, key, noise_multiplier) -> p``."""

    def loss_fn(p, x, y):
        h = jax.nn.relu(x @ p["w1"] + p["b1"])
        logp = jax.nn.log_softmax(h @ p["w2"] + p["b2"])
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))

    def local_train(p, x, y):                        # x [examples, dim] -> clipped delta
        xb = x.reshape(w.local_steps, w.batch, w.dim)
        yb = y.reshape(w.local_steps, w.batch)

        def step(q, batch):
            g = jax.grad(loss_fn)(q, *batch)
            return jax.tree.map(lambda a, b: a - w.client_lr * b, q, g), None

        q, _ = jax.lax.scan(step, p, (xb, yb))
        delta = jax.tree.map(lambda a, b: a - b, q, p)
        norm = jnp.sqrt(sum(jnp.sum(d * d) for d in jax.tree.leaves(delta)))
        scale = jnp.minimum(1.0, w.clip / jnp.maximum(norm, 1e-12))
        return jax.tree.map(lambda d: d * scale, delta)

    @jax.jit
    def round_fn(p, X, Y, idx, key, noise_multiplier):
        x, y = X[idx], Y[idx]
        _, knoise = jax.random.split(key)
        deltas = jax.lax.map(lambda xy: local_train(p, *xy), (x, y), batch_size=chunk)
        total = jax.tree.map(lambda d: jnp.sum(d, axis=0), deltas)
        leaves, tdef = jax.tree.flatten(total)
        keys = jax.random.split(knoise, len(leaves))
        noised = [t + noise_multiplier * w.clip * jax.random.normal(k, t.shape, t.dtype)
                  for t, k in zip(leaves, keys)]
        mean = jax.tree.unflatten(tdef, noised)
        return jax.tree.map(lambda a, d: a + w.server_lr * d / idx.shape[0], p, mean)

    return round_fn
