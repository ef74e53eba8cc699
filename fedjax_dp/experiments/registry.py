"""The algorithms the experiment runner knows: a map from names to algorithm modules.

Algorithms on the protocol of :mod:`fedjax_dp.algorithms.api` (``Config``, ``init``, ``step``,
``num_steps``, ``ledger``, ``output``) are registered as the module itself. Entries not yet ported
are :class:`AlgorithmEntry` adapters: ``execute(ctx) -> Outcome`` receives everything already built and validated (dataset, stacked
agents, model, local-training config, the algorithm's own config) and returns the final model
parameters, a per-round history and the privacy ledger. Every algorithm also runs from plain
Python without this layer; this only adapts it to configs and the CLI.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax

from fedjax_dp.algorithms import dp_fedavg, fedavg
from fedjax_dp.core import StackedData
from fedjax_dp.data import Dataset
from fedjax_dp.models import Model
from fedjax_dp.privacy import PrivacyLedger
from fedjax_dp.train import LocalTrainConfig


@dataclasses.dataclass
class Context:
    key: jax.Array
    dataset: Dataset
    agents: StackedData
    model: Model
    local: LocalTrainConfig
    config: Any                                   # the algorithm's Config dataclass
    eval_every: int = 0
    chunk_size: int | str | None = "auto"
    on_round: Callable[[int, dict], None] | None = None


@dataclasses.dataclass
class Outcome:
    params: Any
    history: list[dict]
    ledger: PrivacyLedger
    model: Model
    # Optional: predicts classes for x [M, ...] when the final model is not a JAX model (trees);
    # the runner then uses it for test accuracy instead of ``model`` / ``params``.
    predict: Callable[[Any], Any] | None = None
    # Optional: further ledgers reported beside ``ledger`` (e.g. a data-independent guarantee
    # next to a data-dependent one for the same unit; they are NOT composed with ``ledger``).
    extra_ledgers: tuple = ()


@dataclasses.dataclass(frozen=True)
class AlgorithmEntry:
    name: str
    config_cls: type
    execute: Callable[[Context], Outcome]
    description: str
    uses_local_train: bool = True                # the config's [train] table feeds ``local``


def _evaluator(ctx: Context):
    from fedjax_dp.train import accuracy
    x, y = ctx.dataset.x_test, ctx.dataset.y_test
    return lambda params: {"test_accuracy": accuracy(ctx.model, params, x, y)}


# Algorithms on the protocol of fedjax_dp.algorithms.api: the registry holds the module itself.
ALGORITHMS: dict[str, Any] = {
    "fedavg": fedavg,
    "dp_fedavg": dp_fedavg,
}


def is_protocol(entry) -> bool:
    """True for a module on the init / step / ledger / output protocol (not a legacy entry)."""
    return not isinstance(entry, AlgorithmEntry)


def description(entry) -> str:
    return entry.DESCRIPTION if is_protocol(entry) else entry.description


def config_class(entry) -> type:
    return entry.Config if is_protocol(entry) else entry.config_cls


def uses_local_train(entry) -> bool:
    return entry.USES_LOCAL_TRAIN if is_protocol(entry) else entry.uses_local_train


# DP-FedSGD (instance level): its ledger needs the local sizes and each agent's participation.
from fedjax_dp.algorithms import dp_fedsgd  # noqa: E402


def _dp_fedsgd(ctx: Context) -> Outcome:
    history = dp_fedsgd.run(ctx.key, ctx.agents, ctx.model, ctx.config,
                            evaluate=_evaluator(ctx), eval_every=ctx.eval_every,
                            on_round=ctx.on_round, chunk_size=ctx.chunk_size)
    ledger = dp_fedsgd.privacy_ledger(ctx.config, ctx.agents.counts, history.participation)
    return Outcome(params=history.params, history=history.rounds, ledger=ledger, model=ctx.model)


ALGORITHMS["dp_fedsgd"] = AlgorithmEntry(
    "dp_fedsgd", dp_fedsgd.Config, _dp_fedsgd,
    "DP-FedSGD, instance-level DP: DP-SGD in every agent (Truex et al. 2019)")


# Voting-based DPFL (voting-dpfl paper): AE-DPFL and kNN-DPFL. The vote's noise-free sums feed
# only the data-dependent (GNMax) part of the ledger; history holds one summary record.
from fedjax_dp.algorithms import ae_dpfl, knn_dpfl  # noqa: E402


def _vote_summary(ctx: Context, result, extra: dict) -> list[dict]:
    """One diagnostic record: vote accuracy on the queries (y_public: diagnostics only)."""
    import numpy as np
    truth = np.asarray(ctx.dataset.y_public)[result.query_indices]
    return [{"round": 1, "num_queries": int(len(result.labels)),
             "vote_accuracy": float(np.mean(result.labels == truth)),
             "wall_time_s": float(result.wall_time_s), **extra}]


def _ae_dpfl(ctx: Context) -> Outcome:
    result = ae_dpfl.run(ctx.key, ctx.agents, ctx.model, ctx.config, ctx.dataset.x_public,
                         chunk_size=ctx.chunk_size)
    extra = {"mean_agent_loss": float(result.agent_losses.mean())}
    history = _vote_summary(ctx, result, extra)
    if ctx.on_round is not None:
        ctx.on_round(1, history[0])
    ledger = ae_dpfl.privacy_ledger(ctx.config, ctx.agents.num_agents, result.clean_vote_sums)
    return Outcome(params=result.params, history=history, ledger=ledger, model=ctx.model)


def _knn_dpfl(ctx: Context) -> Outcome:
    result = knn_dpfl.run(ctx.key, ctx.agents, ctx.model, ctx.config, ctx.dataset.x_public)
    history = _vote_summary(ctx, result, {"k": ctx.config.k})
    if ctx.on_round is not None:
        ctx.on_round(1, history[0])
    ledger = knn_dpfl.privacy_ledger(ctx.config, ctx.agents.num_agents, result.clean_vote_sums)
    return Outcome(params=result.params, history=history, ledger=ledger, model=ctx.model)


ALGORITHMS["ae_dpfl"] = AlgorithmEntry(
    "ae_dpfl", ae_dpfl.Config, _ae_dpfl,
    "AE-DPFL: MPC vote of all agents' models on public queries, agent/instance DP (voting-dpfl)")
ALGORITHMS["knn_dpfl"] = AlgorithmEntry(
    "knn_dpfl", knn_dpfl.Config, _knn_dpfl,
    "kNN-DPFL: MPC vote of every agent's k nearest neighbours, instance/agent DP (voting-dpfl)",
    uses_local_train=False)


# FedKT (one-shot two-tier knowledge transfer): the final model may be a tree ensemble, so the
# outcome carries a ``predict``; the data-independent guarantee is an extra ledger.
from fedjax_dp.algorithms import fedkt  # noqa: E402
from fedjax_dp.algorithms.learners import is_jax as _is_jax_learner  # noqa: E402


def _fedkt(ctx: Context) -> Outcome:
    import numpy as np
    ds, cfg = ctx.dataset, ctx.config
    teacher, student, final = fedkt.make_learners(
        cfg, model=ctx.model, feature_shape=ds.feature_shape, num_classes=ds.num_classes,
        chunk_size=ctx.chunk_size)
    result = fedkt.run(ctx.key, ctx.agents, ds.x_public, cfg, num_classes=ds.num_classes,
                       teacher=teacher, student=student, final=final)
    dd, di = fedkt.privacy_ledgers(cfg, server_votes=result.server_votes,
                                   teacher_votes=result.teacher_votes, z=result.z)
    truth = np.asarray(ds.y_public)                  # diagnostics only
    record = {"round": 1, **{k: float(v) for k, v in result.timings.items()},
              "server_label_accuracy": float(np.mean(
                  (result.server_labels == truth[result.server_queries])[result.server_mask])),
              "num_server_queries": int(len(result.server_queries)),
              "num_party_queries": int(len(result.party_queries)),
              "z": int(result.z.max())}
    if ctx.on_round is not None:
        ctx.on_round(1, record)
    if _is_jax_learner(final):
        params = jax.tree.map(lambda l: l[0], result.final)
        return Outcome(params=params, history=[record], ledger=dd, model=final.model,
                       extra_ledgers=(di,))
    return Outcome(params=None, history=[record], ledger=dd, model=ctx.model,
                   predict=result.predict, extra_ledgers=(di,))


ALGORITHMS["fedkt"] = AlgorithmEntry(
    "fedkt", fedkt.Config, _fedkt,
    "FedKT: one-shot two-tier knowledge transfer, L0/L1/L2 privacy, any classifier (Li et al. 2021)")


# DP-FNAS (dp-fnas paper): federated DP DARTS search, then DP retraining (protocol module).
from fedjax_dp.algorithms.fnas import dp_fnas as _dp_fnas  # noqa: E402

ALGORITHMS["dp_fnas"] = _dp_fnas


def get(name: str):
    if name not in ALGORITHMS:
        raise ValueError(f"algorithm.name must be one of {sorted(ALGORITHMS)}, got {name!r}")
    return ALGORITHMS[name]
