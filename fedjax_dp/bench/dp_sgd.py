"""Bench part: the cost of privacy, a DP-SGD step vs the same non-private step (docs/bench.md).

One SGD step on a batch of B examples, both jitted, same model, data and learning rate:

* ``non_private``: ``w <- w - lr grad_w (1/B) sum_b l(w; x_b, y_b)`` (one batched gradient);
* ``private``: ``w <- w - lr g`` with ``g`` from :func:`fedjax_dp.privacy.private_grad.
  private_gradient` (every row selected, rate 1): per-example gradients clipped to global L2
  norm C, summed, ``N(0, (z C)^2 I)`` added, divided by B (Abadi et al. 2016, Algorithm 1);
* ``per_example_norms``: every per-example gradient reduced to its global norm (the least any
  per-example clip computes).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_dp.bench import common

NAME = "dp_sgd_step"
TITLE = "a DP-SGD step with per-example clipping vs the same non-private step"


def measure(sizes: dict, repeats: int) -> dict:
    from fedjax_dp.models import make_model
    from fedjax_dp.train import cross_entropy
    from fedjax_dp.privacy.private_grad import private_gradient

    shape, b, lr = tuple(sizes["feature_shape"]), sizes["batch_size"], 0.1
    model = make_model(sizes["model"], shape, 10, hidden=tuple(sizes.get("hidden", (200,))))
    params = model.init(jax.random.key(0))
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((b,) + shape, dtype=np.float32))    # [B, *shape]
    y = jnp.asarray(rng.integers(0, 10, b).astype(np.int32))              # [B]
    mask = jnp.ones((b,), bool)
    loss = cross_entropy(model)

    @jax.jit
    def non_private(p, x, y):
        g = jax.grad(lambda q: jnp.mean(jax.vmap(loss, (None, 0, 0))(q, x, y)))(p)
        return jax.tree.map(lambda a, d: a - lr * d, p, g)

    @jax.jit
    def private(p, key, x, y):
        g, _ = private_gradient(key, loss, p, x, y, mask, 1.0, float(b), 1.0, 1.0, plan=None)
        return jax.tree.map(lambda a, d: a - lr * d, p, g)

    @jax.jit
    def per_example_norms(p, x, y):
        return jax.vmap(lambda a, c: optax.tree.norm(jax.grad(loss)(p, a, c)))(x, y)   # [B]

    key = jax.random.key(1)
    times = {"non_private": common.time_fn(lambda: non_private(params, x, y), repeats),
             "private": common.time_fn(lambda: private(params, key, x, y), repeats),
             "per_example_norms": common.time_fn(lambda: per_example_norms(params, x, y),
                                                 repeats)}
    return {"name": NAME, "title": TITLE,
            "sizes": {**sizes, "num_params": common.num_params(params)}, "times": times,
            "pairs": {"private_over_non_private": ("private", "non_private"),
                      "per_example_norms_over_non_private": ("per_example_norms",
                                                             "non_private"),
                      "private_over_per_example_norms": ("private", "per_example_norms")},
            "published": {"jax": 1.2, "pytorch_naive": [2.6, 8.0]}}
