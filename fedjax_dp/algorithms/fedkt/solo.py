"""SOLO: every party trains one model on its own data alone (FedKT paper, Section 5, Table 1).

FedKT's lower baseline: no federation at all; the reported number is the mean over the n
parties of each party's test accuracy::

    f_i = train(D^i)                                            i = 1..n, one compiled call
    SOLO accuracy = (1/n) sum_i (1/M) sum_m [f_i(x_m) = y_m]    on the test set (x_m, y_m)

The n models are ONE learner call over the party axis (:meth:`.learners.JaxLearner.fit`), model
i from key ``model_keys(stream(key, "solo"), n)[.][i]`` (:func:`.learners.model_keys`). With
``runtime.mesh`` (JAX learners) the parties are one chunk split over the mesh
(:func:`fedjax_dp.core.agent_stream.chunks`, padded to a multiple of its devices): each party's
model trains on exactly one device of one process, which reads only its own parties' rows of
host-resident data, with the same keys, and the n models are then gathered onto every process's
default device (the same models as without a mesh, to float tolerance); ``State.values
["agents_per_process"]`` counts the real parties each process trained.
:func:`output` defines ``api.Output.accuracy`` (the mean above). No privacy guarantee
(:data:`private` is False, :func:`ledger` is empty).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

from fedjax_dp.algorithms import api
from fedjax_dp.algorithms.fedkt import config as config_lib
from fedjax_dp.algorithms.fedkt import learners as learners_lib
from fedjax_dp.algorithms.fedkt import mesh as mesh_lib
from fedjax_dp.core import agent_stream, rng, validation
from fedjax_dp.core.lift import AGENTS
from fedjax_dp.core.stacked import check_agents
from fedjax_dp.models import Model
from fedjax_dp.privacy import PrivacyLedger

__all__ = ["Config", "DESCRIPTION", "PHASES", "STREAMS", "USES_LOCAL_TRAIN", "fitted", "init",
           "ledger", "make_learner", "num_steps", "output", "party_accuracies", "private",
           "step"]

DESCRIPTION = ("SOLO (FedKT Table 1 baseline): every party trains alone on its own data; "
               "accuracy = mean over the parties (no privacy)")
USES_LOCAL_TRAIN = True
PHASES = ("train",)
STREAMS = ("solo",)
#: No privacy guarantee: the ledger is empty and nothing is calibrated.
private = False


@dataclasses.dataclass(frozen=True)
class Config(config_lib.LearnerOptions):
    """SOLO: each party's ``learner`` trained on its own records.

    learner: ``"model"`` (the experiment's [model] table), a JAX model (``logistic``, ``mlp``,
      ``cnn``; hidden layer 200) or a tree learner (``decision_tree``, ``random_forest``,
      ``gradient_boosting``, ``xgboost``), as FedKT's ``teacher`` / ``student``.
    tree_max_depth / tree_estimators: the tree learners' depth and number of trees.
    local: the JAX learners' local training (the [train] table; ``local.steps`` steps).
    """

    learner: str = "model"

    FIELDS = {"learner": validation.Choice(("model",) + learners_lib.LEARNERS)}


@dataclasses.dataclass(frozen=True)
class Context:
    """The static part of a SOLO run: the parties, the learner, the key; ``fitted`` holds tree
    models (not arrays, so not in ``State.values``)."""

    data: api.FederatedData
    model: Model
    config: Config
    learner: Any
    key: jax.Array                   # stream(run key, "solo")
    fitted: dict = dataclasses.field(default_factory=dict)
    mesh: Any = None                 # runtime.mesh: the parties split over its devices


def make_learner(config: Config, model: Model, *, feature_shape, num_classes: int,
                 runtime: api.Runtime = api.Runtime()):
    """The learner of ``config.learner``: ``"model"`` is ``model`` trained with ``config.local``
    (vmapped over the parties, ``runtime.chunk_size`` / ``backend``), else
    :func:`.learners.make_learner` of that name."""
    return config_lib.build_learner(config, config.learner, config.local, model=model,
                                    feature_shape=feature_shape, num_classes=num_classes,
                                    chunk_size=runtime.chunk_size, backend=runtime.backend)


def init(key: jax.Array, data: api.FederatedData, model: Model, config: Config,
         runtime: api.Runtime = api.Runtime(), *, learner=None) -> api.State:
    """Checks (every party holds at least one record, finite features) before any training;
    ``learner`` overrides :func:`make_learner` (any learner of :mod:`.learners`)."""
    api.check_init(config, Config, data)
    check_agents(data.agents, what="to train its own model")
    if learner is None:
        learner = make_learner(config, model, feature_shape=data.feature_shape,
                               num_classes=data.num_classes, runtime=runtime)
    ctx = Context(data=data, model=model, config=config, learner=learner,
                  key=rng.stream(rng.as_key(key), "solo"), mesh=runtime.mesh)
    return api.State(step=0, values={}, context=ctx)


num_steps = api.phase_steps(PHASES)


def step(state: api.State, key: jax.Array | None = None) -> tuple[api.State, dict]:
    """Train the n parties' models, each on its own records, in one learner call
    (``learner.fit(stream(run key, "solo"), parties)``). ``key`` is unused (the run key's stream
    ``"solo"``, derived in :func:`init`). With ``runtime.mesh`` (JAX learners) the parties are
    split over it, each party's model on one device (:func:`_fit_over_mesh`)."""
    if state.step >= len(PHASES):
        raise ValueError(f"SOLO has {len(PHASES)} step; state.step is {state.step}")
    ctx: Context = state.context
    values = dict(state.values)
    if learners_lib.is_jax(ctx.learner) and ctx.mesh is not None:
        values["params"], values["agents_per_process"] = _fit_over_mesh(ctx)
        return api.State(step=state.step + 1, values=values, context=ctx), {}
    fit = ctx.learner.fit(ctx.key, ctx.data.agents)
    if learners_lib.is_jax(ctx.learner):
        values["params"] = fit                              # [n, ...]
        values["agents_per_process"] = np.full(jax.process_count(), ctx.data.num_agents)
    else:
        ctx.fitted["params"] = fit                          # n tree models (host)
    return api.State(step=state.step + 1, values=values, context=ctx), {}


def _fit_over_mesh(ctx: Context):
    """The n parties' models with the parties split over ``ctx.mesh`` (one chunk, padded to a
    multiple of its devices; model i keyed ``model_keys(key, n)[.][i]`` as :meth:`fit`):
    ``(params [n, ...] gathered onto this process's default device, agents_per_process)``."""
    n, mesh, learner = ctx.data.num_agents, ctx.mesh, ctx.learner
    impl = jax.random.key_impl(ctx.key)
    keys = tuple(np.asarray(jax.random.key_data(k)) for k in learners_lib.model_keys(ctx.key, n))

    def fit(extra, parties):
        ik, tk = (jax.random.wrap_key_data(e, impl=impl) for e in extra)
        return learner.fit_keyed(ik, tk, parties)

    sharded = mesh_lib.over_mesh(fit, mesh, (P(AGENTS), P(AGENTS)), P(AGENTS))
    (chunk,) = agent_stream.chunks(ctx.data.agents, mesh_lib.chunk_size(n, mesh), extra=keys,
                                   mesh=mesh)
    params = mesh_lib.gathered(sharded(chunk.extra, chunk.agents), n, mesh, axis=0)
    placed = mesh_lib.parties_per_process(chunk, mesh)
    return params, mesh_lib.all_processes(placed, mesh)


def fitted(state: api.State):
    """The n parties' fitted models: stacked parameters ``[n, ...]`` (JAX) or a list (trees)."""
    if state.step < len(PHASES):
        raise ValueError(f"the parties' models are trained in phase 1 ('train'); state.step is "
                         f"{state.step}")
    ctx: Context = state.context
    return state.values["params"] if learners_lib.is_jax(ctx.learner) else ctx.fitted["params"]


def party_accuracies(learner, models, x, y) -> np.ndarray:
    """``[n]``: party i's accuracy ``(1/M) sum_m [f_i(x_m) = y_m]`` on ``(x [M, ...], y [M])``,
    every party's predictions from one ``learner.predict`` call (``[n, M]``)."""
    preds = np.asarray(learner.predict(models, x))                          # [n, M]
    return np.mean(preds == np.asarray(y)[None], axis=1)


def output(state: api.State) -> api.Output:
    """n models, not one: ``accuracy(x, y)`` is the mean over parties of
    :func:`party_accuracies` (the paper's SOLO number); ``predict`` refuses (there is no single
    model's prediction)."""
    ctx: Context = state.context
    models = fitted(state)

    def predict(x):
        raise ValueError("SOLO's result is n models, one per party, not one model: score it "
                         "with Output.score / Output.accuracy (the mean of the parties' "
                         "accuracies), or predict with solo.fitted(state)")

    return api.Output(model=ctx.model, predict=predict,
                      accuracy=lambda x, y: float(np.mean(party_accuracies(ctx.learner, models,
                                                                           x, y))))


def ledger(config: Config, state: api.State | None = None) -> PrivacyLedger:
    """SOLO gives no privacy guarantee: an empty ledger (as FedAvg's)."""
    return PrivacyLedger()
