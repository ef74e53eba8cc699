"""What AE-DPFL and kNN-DPFL (voting-dpfl Algorithms 2 and 3) share on the protocol of
:mod:`fedjax_dp.algorithms.api`: config and input checks, the server's query selection, the vote
phase and the student phase, and the diagnostics they report.

Both are one-shot: ``init`` draws the Q queries, then ``step`` runs one phase at a time
(``PHASES`` of each module). Every phase draws from a named stream of the run key
(:func:`fedjax_dp.core.stream`: ``init``, ``train``, ``queries``, ``feature_map``, ``vote``,
``student``), derived once in ``init`` -- the key derivation of the plain-Python ``run`` before
the protocol, so the same key gives the same labels, student and ledger; the step keys of
:func:`fedjax_dp.algorithms.api.run` are not used. Phases are separate steps so that a run can be
checkpointed after the (expensive) local training or vote, or composed from outside (another
student on the same released labels).

``State.values`` collects the phases' arrays: ``labels [Q]`` (released by the vote),
``clean_vote_sums [Q, C]`` (noise-free, for the data-dependent privacy analysis ONLY; present when
``config.data_dependent``) and ``params`` (the student).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import jax
import numpy as np

from fedjax_dp.algorithms import api
from fedjax_dp.algorithms import student as student_lib
from fedjax_dp.core import StackedData, rng, validation
from fedjax_dp.models import Model
from fedjax_dp.privacy import vote as vote_lib
from fedjax_dp.train import check_trainable

#: The named key streams of a voting run (one per random draw, never reused).
STREAMS = ("init", "train", "queries", "feature_map", "vote", "student")


def check_vote_config(config) -> None:
    """Validate the vote fields shared by the AE-DPFL and kNN-DPFL Configs (names the field)."""
    s = validation.check_positive("algorithm.sigma", config.sigma)
    if not math.isfinite(s):
        raise ValueError(f"algorithm.sigma must be finite, got {config.sigma!r}")
    validation.check_int("algorithm.num_queries", config.num_queries, minimum=1)
    for name in ("agent_chunk", "query_chunk"):
        if getattr(config, name) is not None:
            validation.check_int(f"algorithm.{name}", getattr(config, name), minimum=1)
    if not isinstance(config.data_dependent, bool):
        raise ValueError(f"algorithm.data_dependent must be true or false, "
                         f"got {config.data_dependent!r}")
    validation.check_choice("algorithm.vote_noise", config.vote_noise, vote_lib.NOISE_MODES)


def select_queries(key: jax.Array, num_public: int, num_queries: int) -> np.ndarray:
    """Q distinct indices of the public set, uniformly at random (independent of private data)."""
    num_queries = validation.check_int("algorithm.num_queries", num_queries, minimum=1)
    if num_queries > num_public:
        raise ValueError(f"algorithm.num_queries must be <= the number of public records "
                         f"({num_public}), got {num_queries}")
    return np.sort(np.asarray(jax.random.permutation(key, num_public)[:num_queries]))


def check_run_args(agents: StackedData, model: Model, x_public) -> np.ndarray:
    """Host-side checks shared by the voting algorithms; returns ``x_public`` as an array."""
    if not isinstance(agents, StackedData):
        raise ValueError(f"agents must be a StackedData, got {type(agents).__name__}")
    check_trainable(agents)
    if x_public is None:
        raise ValueError("data.x_public must hold the server's unlabelled public data (the "
                         "queries come from it), got None")
    x_public = validation.check_finite_array("x_public", x_public)
    if tuple(x_public.shape[1:]) != agents.feature_shape:
        raise ValueError(f"x_public must have feature shape {agents.feature_shape} (the agents'), "
                         f"got {tuple(x_public.shape[1:])}")
    if tuple(model.feature_shape) != agents.feature_shape:
        raise ValueError(f"model feature shape {model.feature_shape} must equal the agents' "
                         f"{agents.feature_shape}")
    return x_public


@dataclasses.dataclass(frozen=True)
class Context:
    """The static part of a voting run's state.

    ``extra`` holds what one algorithm adds (kNN-DPFL: its feature map).
    """

    data: api.FederatedData
    model: Model
    config: Any
    runtime: api.Runtime
    x_public: np.ndarray               # [P, ...] the server's unlabelled data
    query_indices: np.ndarray          # [Q] indices into x_public
    keys: dict                         # {stream name: key}
    extra: Any = None


def init_context(key: jax.Array, data: api.FederatedData, model: Model, config,
                 runtime: api.Runtime, *, extra_checks: Callable | None = None) -> Context:
    """Checks (before any work), the named key streams and the Q queries of a voting run."""
    if not isinstance(data, api.FederatedData):
        raise ValueError(f"data must be an api.FederatedData, got {type(data).__name__}")
    x_public = check_run_args(data.agents, model, data.x_public)
    if extra_checks is not None:
        extra_checks(data)
    vote_lib.check_vote_args(config.sigma, data.num_agents, config.num_queries,
                             model.num_classes, config.agent_chunk, config.query_chunk,
                             config.vote_noise)
    keys = {name: rng.stream(key, name) for name in STREAMS}
    qidx = select_queries(keys["queries"], len(x_public), config.num_queries)
    return Context(data=data, model=model, config=config, runtime=runtime, x_public=x_public,
                   query_indices=qidx, keys=keys)


def vote_phase(state: api.State, ballot_fn: vote_lib.BallotFn, agents: Any, queries
               ) -> tuple[dict, dict]:
    """The MPC vote on the queries: ``(values, metrics)`` with the released ``labels [Q]`` and,
    if ``config.data_dependent``, the noise-free ``clean_vote_sums [Q, C]`` (analysis only).

    Metrics: ``num_queries`` and, when ``data.y_public`` is given, ``vote_accuracy`` -- the
    fraction of released labels equal to the true public labels (a diagnostic; never used).
    """
    ctx: Context = state.context
    cfg = ctx.config
    labels, clean = vote_lib.run_vote(ctx.keys["vote"], ballot_fn, agents, queries, cfg.sigma,
                                      num_classes=ctx.model.num_classes,
                                      agent_chunk=cfg.agent_chunk, query_chunk=cfg.query_chunk,
                                      noise=cfg.vote_noise, data_dependent=cfg.data_dependent,
                                      mesh=ctx.runtime.mesh)
    values = {**state.values, "labels": np.asarray(labels)}
    if clean is not None:
        values["clean_vote_sums"] = clean
    metrics: dict = {"num_queries": int(len(labels))}
    if ctx.data.y_public is not None:                      # diagnostics only
        truth = np.asarray(ctx.data.y_public)[ctx.query_indices]
        metrics["vote_accuracy"] = float(np.mean(np.asarray(labels) == truth))
    return values, metrics


def student_phase(state: api.State) -> tuple[dict, dict]:
    """The global model on the released labels (supervised, or self-trained on the rest of the
    public data; post-processing of the release, :mod:`fedjax_dp.algorithms.student`)."""
    ctx: Context = state.context
    cfg = ctx.config
    params = student_lib.train_student(ctx.keys["student"], ctx.model, ctx.x_public,
                                       ctx.query_indices, state.values["labels"], cfg.student,
                                       cfg.semi_supervised)
    return {**state.values, "params": params}, {}


def advance(state: api.State, values: dict, phase: str, metrics: dict
            ) -> tuple[api.State, dict]:
    """The next state and the phase's metrics (``phase`` names the step in the record)."""
    return (api.State(step=state.step + 1, values=values, context=state.context),
            {"phase": phase, **metrics})


def check_step(state: api.State, phases: tuple[str, ...]) -> str:
    """The name of the phase ``state`` is at; an error past the last one."""
    if not 0 <= state.step < len(phases):
        raise ValueError(f"state.step must be in [0, {len(phases)}) (phases {list(phases)}), "
                         f"got {state.step}")
    return phases[state.step]


def output(state: api.State) -> api.Output:
    """The student; available once the last phase has run."""
    if "params" not in state.values:
        raise ValueError(f"output needs the finished run (the student is trained in the last "
                         f"phase); state.step is {state.step}")
    return api.Output(model=state.context.model, params=state.values["params"])


def clean_sums(state: api.State | None):
    """The noise-free vote sums of a run (None before the vote or without ``data_dependent``)."""
    return None if state is None else state.values.get("clean_vote_sums")
