"""The algorithms the experiment runner knows, each as a config class and an ``execute`` function.

``execute(ctx) -> Outcome`` receives everything already built and validated (dataset, stacked
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


def _averaging(module) -> Callable[[Context], Outcome]:
    def execute(ctx: Context) -> Outcome:
        history = module.run(ctx.key, ctx.agents, ctx.model, ctx.config,
                             evaluate=_evaluator(ctx), eval_every=ctx.eval_every,
                             on_round=ctx.on_round, chunk_size=ctx.chunk_size)
        return Outcome(params=history.params, history=history.rounds,
                       ledger=module.privacy_ledger(ctx.config, ctx.agents.num_agents),
                       model=ctx.model)
    return execute


ALGORITHMS: dict[str, AlgorithmEntry] = {
    "fedavg": AlgorithmEntry("fedavg", fedavg.Config, _averaging(fedavg),
                             "FedAvg, non-private (McMahan et al. 2017)"),
    "dp_fedavg": AlgorithmEntry("dp_fedavg", dp_fedavg.Config, _averaging(dp_fedavg),
                                "DP-FedAvg, agent-level DP (McMahan et al. 2018)"),
}


def get(name: str) -> AlgorithmEntry:
    if name not in ALGORITHMS:
        raise ValueError(f"algorithm.name must be one of {sorted(ALGORITHMS)}, got {name!r}")
    return ALGORITHMS[name]
