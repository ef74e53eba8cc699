"""Flax classifiers: logistic regression, MLP and a LeNet-style CNN.

Every model is exposed as a :class:`Model`, a pair of pure functions

    init(key) -> params
    apply(params, x) -> logits        x: [*feature_shape] (ONE example), logits: [num_classes]

so per-example gradients are ``jax.vmap(jax.grad(loss), (None, 0, 0))`` and all agents' models are
one params pytree with a leading agent axis (``jax.vmap(model.init)(keys)``).
"""
from __future__ import annotations

import functools
import math
from typing import Any, Callable, NamedTuple, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_dp.core import validation

Params = Any


class Model(NamedTuple):
    """A pure ``init``/``apply`` pair for one example, plus what it was built from."""

    init: Callable[[jax.Array], Params]
    apply: Callable[[Params, jax.Array], jax.Array]
    name: str
    feature_shape: tuple[int, ...]
    num_classes: int
    #: the learning task (:mod:`fedjax_dp.train.tasks`; None: classification), set by
    #: ``tasks.attach`` from the data: it defines the per-example loss and the accuracy
    task: Any = None

    def logits(self, params: Params, x: jax.Array) -> jax.Array:
        """Batched apply: ``x [B, *feature_shape] -> [B, num_classes]``."""
        return jax.vmap(self.apply, in_axes=(None, 0))(params, x)

    def num_params(self, params: Params) -> int:
        return sum(int(l.size) for l in jax.tree.leaves(params))


class Logistic(nn.Module):
    """Multinomial logistic regression: ``W x + b``."""
    num_classes: int

    @nn.compact
    def __call__(self, x):                    # x [B, *feature_shape]
        x = x.reshape((x.shape[0], -1))
        return nn.Dense(self.num_classes)(x)  # [B, C]


class MLP(nn.Module):
    """Fully connected ReLU network with the given hidden widths."""
    num_classes: int
    hidden: Sequence[int] = (200,)

    @nn.compact
    def __call__(self, x):                    # x [B, *feature_shape]
        x = x.reshape((x.shape[0], -1))
        for width in self.hidden:
            x = nn.relu(nn.Dense(width)(x))
        return nn.Dense(self.num_classes)(x)  # [B, C]


class LeNet(nn.Module):
    """LeNet-style CNN (FedKT's MNIST model): conv 6, conv 16 (5x5, max-pool 2), FC 120, 84."""
    num_classes: int

    @nn.compact
    def __call__(self, x):                    # x [B, H, W, channels]
        x = nn.relu(nn.Conv(6, (5, 5), padding="SAME")(x))
        x = nn.max_pool(x, (2, 2), strides=(2, 2), padding="SAME")
        x = nn.relu(nn.Conv(16, (5, 5), padding="SAME")(x))
        x = nn.max_pool(x, (2, 2), strides=(2, 2), padding="SAME")
        x = x.reshape((x.shape[0], -1))
        x = nn.relu(nn.Dense(120)(x))
        x = nn.relu(nn.Dense(84)(x))
        return nn.Dense(self.num_classes)(x)  # [B, C]


def _wrap(module: nn.Module, name: str, feature_shape: tuple[int, ...], num_classes: int
          ) -> Model:
    dummy = jnp.zeros((1,) + tuple(feature_shape), jnp.float32)

    def init(key: jax.Array) -> Params:
        return module.init(key, dummy)

    def apply(params: Params, x: jax.Array) -> jax.Array:
        return module.apply(params, x[None])[0]

    return Model(init=init, apply=apply, name=name, feature_shape=tuple(feature_shape),
                 num_classes=num_classes)


MODELS = ("logistic", "mlp", "cnn")


def make_model(name: str, feature_shape: Sequence[int], num_classes: int, *,
               hidden: Sequence[int] = (200,)) -> Model:
    """Build a registered model by name (``logistic``, ``mlp``, ``cnn``).

    The same arguments give the same :class:`Model` object, so every compiled function keyed on
    the model (local training, rounds, votes, evaluation) is compiled once per process, however
    many runs build it."""
    validation.check_choice("model.name", name, MODELS)
    validation.check_int("num_classes", num_classes, minimum=2)
    feature_shape = tuple(int(s) for s in feature_shape)
    if not feature_shape or any(s < 1 for s in feature_shape):
        raise ValueError(f"feature_shape must be a non-empty tuple of positive sizes, "
                         f"got {feature_shape}")
    if name == "mlp":
        hidden = tuple(validation.check_int("model.hidden[]", h, minimum=1) for h in hidden)
    else:
        hidden = ()
    return _make_model(name, feature_shape, int(num_classes), hidden)


@functools.lru_cache(maxsize=128)
def _make_model(name: str, feature_shape: tuple[int, ...], num_classes: int,
                hidden: tuple[int, ...]) -> Model:
    if name == "logistic":
        module = Logistic(num_classes)
    elif name == "mlp":
        module = MLP(num_classes, hidden)
    else:
        if len(feature_shape) != 3:
            raise ValueError(f"model 'cnn' needs image features [H, W, channels], got feature "
                             f"shape {feature_shape} (use 'mlp' or 'logistic' for flat features)")
        module = LeNet(num_classes)
    return _wrap(module, name, feature_shape, num_classes)


def forward_flops(model: Model, params: Params) -> int:
    """Approximate multiply-add FLOPs (2 per MAC) of one forward pass of a dense model.

    Exact for ``logistic`` and ``mlp`` (sum over Dense kernels of 2 * fan_in * fan_out); for the CNN
    use XLA's cost analysis instead.
    """
    return sum(2 * math.prod(l.shape) for l in jax.tree.leaves(params) if l.ndim == 2)
