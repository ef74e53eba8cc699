"""Local training of one model per agent, for all agents at once.

``make_local_update`` builds a pure one-agent function

    local_update(key, params, x [n_max, ...], y [n_max, ...], count []) -> (params, mean_loss)

running ``steps`` optax steps on minibatches of the agent's *real* records (``batching``):
``"replacement"`` draws them uniformly with replacement, indices in ``[0, count)`` for all steps at
once (:func:`batch_indices`); ``"stored"`` takes the records in stored order, cycling
(:func:`stored_indices`). Every row is weighted by its mask, so padded rows never contribute.
``train_agents`` lifts it over the agent axis with :func:`fedjax_dp.core.for_each_agent`."""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_dp.core import StackedData, for_each_agent, validation
from fedjax_dp.core import memory
from fedjax_dp.core.lift import resolve_chunk_size, training_bytes
from fedjax_dp.models import Model
from fedjax_dp.models import tasks
from fedjax_dp.train import optimizers

Params = Any


BATCHINGS = ("replacement", "stored")


@dataclasses.dataclass(frozen=True)
class LocalTrainConfig:
    """Local optimisation: ``steps`` minibatch steps of ``optimizer``.

    ``optimizer`` (:mod:`fedjax_dp.train.optimizers`): a name with rate ``learning_rate``
    (``"sgd"``, ``"momentum"`` = sgd with momentum 0.9, ``"adam"``, or any other optax name), a
    table ``{name = "adamw", learning_rate = 1e-3, weight_decay = 1e-4}`` (any optax optimizer
    and its keyword arguments; ``learning_rate`` is then the table's), or from Python any
    ``optax.GradientTransformation``. ``weight_decay > 0`` chains
    ``add_decayed_weights(weight_decay)`` before any of them."""

    steps: int = 50
    batch_size: int = 32
    learning_rate: float = 0.1
    optimizer: Any = "sgd"          # a name, a table {name, ...}, an optax transformation
    weight_decay: float = 0.0
    prox_mu: float = 0.0            # FedProx: adds mu/2 ||w - w_start||^2 to the local objective
    batching: str = "replacement"   # replacement (uniform draws) | stored (stored order, cycled)

    FIELDS = {"steps": validation.Int(0), "batch_size": validation.Int(1, validation.BATCH_MAX),
              "learning_rate": validation.Float(0.0, low_open=True),
              "optimizer": validation.Custom(
                  optimizers.parse, bad=(3, "adamx", {"learning_rate": 0.1},
                                         {"name": "adam", "learning_rate": 0.1, "b3": 0.9},
                                         {"name": "adam", "learning_rate": "fast"},
                                         {"name": "sgd", "learning_rate": 0.1,
                                          "nesterov": 1})),
              "weight_decay": validation.Float(0.0), "prox_mu": validation.Float(0.0),
              "batching": validation.Choice(BATCHINGS)}

    def __post_init__(self):
        validation.check_config(self, "train")
        if not isinstance(self.optimizer, str) and \
                self.learning_rate != LocalTrainConfig.learning_rate:
            raise ValueError(f"train.learning_rate = {self.learning_rate:g} is not read with "
                             f"train.optimizer = {optimizers.describe(self.optimizer)} (its "
                             f"learning_rate is the rate): leave train.learning_rate out")

    def make_optimizer(self) -> optax.GradientTransformation:
        """The clients' transformation (:func:`fedjax_dp.train.optimizers.resolve`)."""
        opt = optimizers.resolve(self.optimizer, self.learning_rate)
        if self.weight_decay:
            opt = optax.chain(optax.add_decayed_weights(self.weight_decay), opt)
        return opt


def cross_entropy(model: Model) -> Callable[[Params, jax.Array, jax.Array], jax.Array]:
    """Per-example loss ``l(params, x, y)`` (scalar) of the model's task
    (:func:`fedjax_dp.models.tasks.of`): ``-log softmax(f(x))_y`` for classification; for a
    next-token task the mean of the per-token cross-entropies over the sequence's real tokens
    ``y_t != pad`` (:meth:`fedjax_dp.models.tasks.NextToken.example_loss`, eq. (1))."""
    example_loss = tasks.of(model).example_loss

    def loss(params, x, y):
        return example_loss(model.apply(params, x), y)
    return loss


def minibatch_loss(model: Model):
    """Mask-weighted mean loss over a minibatch: ``sum_b w_b l_b / max(1, sum_b w_b)`` (every
    record weighted equally; a sequence's ``l_b`` is already its per-token mean)."""
    per_example = jax.vmap(cross_entropy(model), in_axes=(None, 0, 0))

    def loss(params, xb, yb, wb):      # xb [B, ...], yb [B], wb [B]
        losses = per_example(params, xb, yb)
        return jnp.sum(wb * losses) / jnp.maximum(jnp.sum(wb), 1.0)
    return loss


def batch_indices(key: jax.Array, count: jax.Array, steps: int, batch_size: int) -> jax.Array:
    """``[steps, batch_size]`` int32 row indices, uniform with replacement over ``[0, count)``:
    every minibatch of an agent's local training drawn in one call (hoisted out of the step
    loop: one random-number kernel per agent instead of a split and a draw per step, ~10% of a
    small MLP's local training on the CPU)."""
    return jax.random.randint(key, (steps, batch_size), 0, jnp.maximum(count, 1))


def stored_indices(count: jax.Array, steps: int, batch_size: int) -> jax.Array:
    """``[steps, batch_size]`` int32 row indices in stored order, cycling over ``[0, count)``:
    step t's minibatch is the rows ``(t B + b) mod count``, b < B (fedjax's
    ``shuffle_repeat_batch(skip_shuffle=True)``; with ``steps * B = count`` exactly one epoch, as
    in the peers' timing workload). No randomness: the key is not read."""
    positions = jnp.arange(steps * batch_size, dtype=jnp.int32).reshape(steps, batch_size)
    return positions % jnp.maximum(count, 1).astype(jnp.int32)


def minibatch_rows(config: LocalTrainConfig, key: jax.Array, count: jax.Array) -> jax.Array:
    """The ``[steps, batch_size]`` rows of an agent's local training under ``config.batching``."""
    if config.batching == "stored":
        return stored_indices(count, config.steps, config.batch_size)
    return batch_indices(key, count, config.steps, config.batch_size)


def make_local_step(model: Model, config: LocalTrainConfig):
    """One optimiser step of one agent: ``step(params, opt_state, idx, x, y, mask, count)``.

    With ``config.prox_mu > 0`` and an ``anchor`` (optional last argument) the step also follows
    the FedProx proximal term ``mu/2 ||params - anchor||^2`` (Li et al. 2020, eq. 2); the
    returned loss is the data loss.

    Returns ``(step, optimizer)``; ``step`` gives ``(params, opt_state, loss)``. The minibatch is
    the rows ``idx [batch_size]`` of the agent's records (a row of :func:`batch_indices`), each
    weighted by its mask."""
    opt = config.make_optimizer()
    grad_fn = jax.value_and_grad(minibatch_loss(model))

    def step(params, opt_state, idx, x, y, mask, count, anchor=None):
        xb, yb, wb = x[idx], y[idx], mask[idx].astype(jnp.float32)
        loss, g = grad_fn(params, xb, yb, wb)
        if config.prox_mu and anchor is not None:   # FedProx: grad of mu/2 ||p - anchor||^2
            g = jax.tree.map(lambda gi, p, a: gi + config.prox_mu * (p - a), g, params, anchor)
        updates, opt_state = opt.update(g, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step, opt


def make_local_update(model: Model, config: LocalTrainConfig):
    """One agent's local training (pure; lift with ``for_each_agent`` / ``train_agents``).

    Step t trains on the rows ``minibatch_rows(config, key, count)[t]``. With ``config.prox_mu > 0``
    the proximal term is anchored at the starting ``params`` (FedProx local training)."""
    step, opt = make_local_step(model, config)

    anchored = bool(config.prox_mu)   # FedProx anchors the proximal term at the start point

    def local_update(key, params, x, y, mask, count):
        start = params if anchored else None

        def body(carry, idx):
            p, s = carry
            p, s, loss = step(p, s, idx, x, y, mask, count, start)
            return (p, s), loss

        rows = minibatch_rows(config, key, count)                          # [steps, B]
        (params, _), losses = jax.lax.scan(body, (params, opt.init(params)), rows)
        return params, jnp.mean(losses) if config.steps else jnp.zeros(())

    return local_update


def check_trainable(data: StackedData) -> None:
    """Reject stacked data with empty agents before any compilation (on the host: no compiled
    op runs for the check)."""
    counts = np.asarray(data.counts)
    if int(counts.min()) < 1:
        empty = [int(i) for i in np.flatnonzero(counts < 1)[:10]]
        raise ValueError(f"agents {empty} have no records; every agent needs at least one to train")


def train_agents(key: jax.Array, params: Params, data: StackedData, model: Model,
                 config: LocalTrainConfig, *, shared_init: bool = True,
                 chunk_size: int | str | None = "auto", mesh=None, backend: str = "vmap"):
    """Train one model per agent, all agents in one computation.

    Args:
      key: root key; agent i trains with ``split(key, N)[i]`` (independent minibatch streams).
      params: the starting parameters: one pytree shared by all agents (``shared_init=True``), or a
        stacked pytree with leading axis N.
      chunk_size: agents per chunk (identical results, bounded memory); ``"auto"``:
        :mod:`fedjax_dp.core.defaults`; None: all agents at once.
    Returns:
      (stacked params [N, ...], mean training loss per agent [N]).
    """
    check_trainable(data)
    keys = jax.random.split(key, data.num_agents)
    n = data.num_agents
    chunk_size = resolve_chunk_size(chunk_size, bytes_per_agent=training_bytes(params, n),
                                    num_agents=n)
    lifted = lifted_update(model, config, shared_init, chunk_size, mesh, backend)
    return lifted(keys, params, data.x, data.y, data.mask, data.counts)


@functools.lru_cache(maxsize=64)
def lifted_update(model: Model, config: LocalTrainConfig, shared_init: bool, chunk_size: int | None,
                  mesh: Any, backend: str) -> Callable:
    """The local update of every agent, ``(keys [N], params, x, y, mask, counts) -> (stacked
    params [N, ...], mean loss [N])`` (:func:`make_local_update` lifted over agents by
    :func:`fedjax_dp.core.for_each_agent`; ``params`` shared when ``shared_init``, else stacked).
    Compiled once per (model, config, execution plan) and shared by every caller
    (:func:`train_agents`, FedKT's learners)."""
    update = make_local_update(model, config)
    lifted = for_each_agent(update, (0, None if shared_init else 0, 0, 0, 0, 0),
                            chunk_size=chunk_size, mesh=mesh, backend=backend)
    if backend == "loop":
        return lifted
    # refused before its first run per shape if it cannot fit (fedjax_dp.core.memory)
    return memory.checked(
        jax.jit(lifted), what=lambda keys, *_: f"local training of {keys.shape[0]} agents",
        drivers=lambda: {"train.batch_size": config.batch_size,
                         "run.chunk_size": memory.chunk_driver(chunk_size, chunk_size),
                         **memory.model_driver(model)})
