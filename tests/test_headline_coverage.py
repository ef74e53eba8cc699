"""Every shipped run config's headline guarantee covers every release its run makes, unless the
config opts in to a release no guarantee covers (issue 50 item 3).

The opt-ins are explicit config fields, off by default (:data:`OPT_INS`): the non-private round /
phase metrics (``algorithm.diagnostics``, ISRL-DP's ``algorithm.report_objective``), the
data-dependent epsilons and their inputs (``algorithm.data_dependent``: voting, FedKT), DP-FNAS's
non-private retraining (``private_retrain = false``) and DP-FedAvg's realised-cohort denominator
(``denominator = "sampled"``). The runner marks every guarantee of a run with the releases any of
its ledgers declares (``runner._result``), so "the headline covers every release" is "no ledger
of the run declares an uncovered release".

Fast: nothing trains. Each config's ledgers are built from the config (``runner.plan``) and, where
a family's ledger reads the run's state, a stand-in for it: the voting families' noise-free vote
sums and FedKT's votes (small arrays, present only where the run would keep them: with
``data_dependent``), DP-FedSGD's local sizes and participation, DP-FNAS's sampling rates (from the
family's own data preparation of a tiny population), and for ISRL-DP / shuffle-DP one ``init``
on a tiny population per algorithm, shared by its configs (the ledger reads the config it is
given). DP-FedAvg's declarations are its ``declare_uncovered`` (the last step of its ledger,
whose events need seconds of strategy optimisation for banded MF, or the run's N for
distributed noise). Whether a run releases exactly what its ledger declares is a run: one tiny
config per family, both ways (:func:`test_a_tiny_run_releases_what_its_ledger_declares`; AE-DPFL,
the cheapest, in the default suite, the others under ``-m sweep``).
"""
from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from types import SimpleNamespace

import jax
import numpy as np
import pytest

from fedjax_dp.algorithms import api, registry
from fedjax_dp.algorithms.averaging import dp_fedavg
from fedjax_dp.algorithms.fnas import data as fnas_data
from fedjax_dp.core import from_ragged
from fedjax_dp.experiments import config as config_lib
from fedjax_dp.experiments import runner, shipped
from fedjax_dp.models import make_model
from fedjax_dp.privacy import PrivacyLedger

ROOT = Path(__file__).resolve().parents[1]

_ISRL_PRIVATE = ("isrl_mb_sgd", "isrl_prox_svrg", "isrl_prox_pl_svrg", "isrl_spider",
                 "isrl_local_sgd", "sdp_mb_sgd", "sdp_spider")

#: Per private algorithm: the config fields (and the value) that opt in to a release its
#: guarantees do not cover. Every default is the other value.
OPT_INS: dict[str, dict] = {
    "dp_fedavg": {"diagnostics": True, "denominator": "sampled"},
    "dp_fedsgd": {"diagnostics": True},
    "ae_dpfl": {"diagnostics": True, "data_dependent": True},
    "knn_dpfl": {"data_dependent": True},
    "fedkt": {"data_dependent": True},
    "dp_fnas": {"diagnostics": True, "private_retrain": False},
    **{name: {"diagnostics": True, "report_objective": True} for name in _ISRL_PRIVATE},
}


def _run_configs() -> list[str]:
    """The shipped run configs: ``configs/*/*.toml`` but ``experiments/`` and ``benchmarks/``."""
    return [n for n in shipped.names()
            if "/" in n and n.split("/")[0] not in ("experiments", "benchmarks")]


def opted_in(name: str, cfg) -> list[str]:
    """The opt-ins ``cfg`` (an algorithm's Config) sets."""
    return [f for f, v in OPT_INS.get(name, {}).items() if getattr(cfg, f) == v]


# ------------------------------------------------------------------ the stand-in states

@functools.lru_cache(maxsize=None)
def _isrl_state(name: str) -> api.State:
    """One ``init`` of ISRL-DP / SDP algorithm ``name`` on 3 silos of 8 records (noise given:
    no calibration), shared by every config of it."""
    module = registry.get(name)
    r = np.random.default_rng(0)
    xs = [r.normal(size=(8, 4)).astype(np.float32) for _ in range(3)]
    fed = api.FederatedData(agents=from_ragged(xs, [np.arange(8) % 2] * 3), num_classes=2)
    cfg = module.Config()
    tiny = dict(rounds=1, batch_size=2)
    tiny.update(noise_trials=1024) if hasattr(cfg, "noise_trials") else \
        tiny.update(noise_multiplier=1.0)
    return module.init(jax.random.key(0), fed, make_model("logistic", (4,), 2),
                       dataclasses.replace(cfg, **tiny))


def _votes(num_queries: int) -> np.ndarray:
    """Noise-free vote sums ``[Q, 2]`` (3 of 4 ballots for class 0)."""
    return np.tile(np.array([3.0, 1.0]), (num_queries, 1))


def ledgers(plan: runner.Plan) -> tuple[PrivacyLedger, ...]:
    """The ledgers a run of ``plan`` reports, from the config and a stand-in state where the
    family's ledger reads one (module docstring)."""
    name, cfg, module = plan.config["algorithm"]["name"], plan.algorithm_config, plan.entry
    if name == "dp_fedavg":
        return (dp_fedavg.declare_uncovered(cfg, PrivacyLedger()),)
    if name == "dp_fedsgd":
        state = SimpleNamespace(values={"participation": np.full(2, 3)},
                                context=SimpleNamespace(agents=SimpleNamespace(
                                    counts=np.array([8, 12]))))
        return api.ledgers(module, cfg, state)
    if name in ("ae_dpfl", "knn_dpfl"):
        values = {"clean_vote_sums": _votes(cfg.num_queries)} if cfg.data_dependent else {}
        return api.ledgers(module, cfg, api.State(step=len(module.PHASES), values=values,
                                                  context=None))
    if name == "fedkt":
        s, t = cfg.num_partitions, cfg.num_teachers
        votes = np.zeros((2, s, 4, 2))
        votes[..., 0] = t
        values = {"teacher_votes": votes, "z": np.zeros(2, np.int64),
                  "server_votes": np.tile([2.0 * s, 0.0], (4, 1))}
        return api.ledgers(module, cfg, api.State(step=len(module.PHASES), values=values,
                                                  context=None))
    if name == "dp_fnas":
        r = np.random.default_rng(0)
        agents = from_ragged([r.normal(size=(n, 4, 4, 1)).astype(np.float32) for n in (8, 12)],
                             [np.arange(n) % 2 for n in (8, 12)])
        n_train, _ = fnas_data.split_halves(np.asarray(agents.counts))
        ctx = SimpleNamespace(
            search_data=fnas_data.make_search_data(agents, cfg.batch_size),
            retrain_data=fnas_data.make_retrain_data(agents, cfg.retrain_batch_size),
            search_iterations=fnas_data.iterations_per_epoch(n_train, cfg.batch_size),
            retrain_iterations=fnas_data.iterations_per_epoch(np.asarray(agents.counts),
                                                              cfg.retrain_batch_size),
            rates=fnas_data.host_rates(agents, cfg.batch_size, cfg.retrain_batch_size))
        return api.ledgers(module, cfg, api.State(step=0, values={}, context=ctx))
    if name in _ISRL_PRIVATE:
        return api.ledgers(module, cfg, _isrl_state(name))
    return api.ledgers(module, cfg, None)         # non-private: no guarantee, nothing to cover


def uncovered(plan: runner.Plan) -> list:
    """Every release the run's ledgers declare uncovered (all of them mark every guarantee)."""
    return [u for lg in ledgers(plan) for u in lg.uncovered]


# ------------------------------------------------------------------ the shipped configs

@pytest.mark.parametrize("name", _run_configs())
def test_every_shipped_config_covers_every_release_unless_it_opts_in(name):
    plan = runner.plan(config_lib.load(shipped.path_of(name)))
    algorithm, cfg = plan.config["algorithm"]["name"], plan.algorithm_config
    found = ledgers(plan)
    units = [u for lg in found for u in lg.units() if not lg.data_dependent(u)]
    if not api.hooks(plan.entry).private or not units:
        # no guarantee (FedAvg, the non-private ISRL baselines, DP-FNAS without privacy, FedKT
        # L0): nothing for a headline to cover
        assert algorithm not in OPT_INS or not units
        return
    assert algorithm in OPT_INS, f"{algorithm}: add its opt-in fields to OPT_INS"
    opted, declared = opted_in(algorithm, cfg), uncovered(plan)
    if opted:                          # a config that opts in is told so: the release declared
        assert declared, f"{name} sets {opted} but declares no uncovered release"
    else:
        assert declared == [], f"{name}: headline does not cover {[str(u) for u in declared]}"


def _first_private(algorithm: str) -> str:
    return next(n for n in _run_configs() if config_lib.load(shipped.path_of(n))
                ["algorithm"]["name"] == algorithm)


@pytest.mark.parametrize("algorithm", ["dp_fedavg", "dp_fedsgd", "ae_dpfl", "knn_dpfl", "fedkt",
                                       "dp_fnas", "isrl_spider", "sdp_mb_sgd"])
def test_each_opt_in_is_declared_by_the_ledger(algorithm):
    """Turned on one at a time in a shipped config of the family, every opt-in adds a declared
    uncovered release (so a config that opts in cannot be reported as covering its run)."""
    name = _first_private(algorithm)
    base = config_lib.load(shipped.path_of(name))
    if algorithm == "fedkt" and base["algorithm"].get("level", "L0") == "L0":
        base["algorithm"]["level"] = "L1"
    assert uncovered(runner.plan(config_lib.resolve(base))) == []
    for field, value in OPT_INS[algorithm].items():
        cfg = config_lib.resolve({**base, "algorithm": {**base["algorithm"], field: value}})
        assert uncovered(runner.plan(cfg)), f"{name} with algorithm.{field} = {value!r}"


# ------------------------------------------------------------------ one tiny run per family

#: Per family: a shipped config, tiny overrides, its opt-ins as ``--set`` lines, and the metrics
#: a run reports without an opt-in (each public: from the config, the public set's labels, the
#: released iterates, or data-independent randomness; timings and the step index).
RUNS = {
    "isrl": ("isrl/wbcd_isrl_mb_sgd",
             ["algorithm.rounds=2", "algorithm.noise_multiplier=1.0", "run.eval_every=0"],
             ["algorithm.diagnostics=true", "algorithm.report_objective=true"],
             # f1: the regulariser at the released iterate (reported with the objective)
             {"round", "num_available", "update_norm", "f1"}),
    "ae_dpfl": ("ae_dpfl/mnist5k",
                ["data.num_agents=10", "train.steps=3", "model.hidden=[8]",
                 "algorithm.num_queries=20", "algorithm.student_steps=5"],
                ["algorithm.diagnostics=true", "algorithm.data_dependent=true"],
                {"round", "phase", "agent_chunk", "num_queries", "vote_accuracy"}),
    "knn_dpfl": ("knn_dpfl/mnist5k",
                 ["data.num_agents=10", "algorithm.num_queries=20", "algorithm.student_steps=5",
                  "model.hidden=[8]", "algorithm.feature_dim=8"],
                 ["algorithm.data_dependent=true"],
                 {"round", "phase", "agent_chunk", "num_queries", "vote_accuracy", "k"}),
    "fedkt": ("fedkt/digits",
              ["train.steps=5", "algorithm.student_steps=5", "algorithm.final_steps=5",
               'model.name="logistic"', "data.num_agents=3"],
              ["algorithm.data_dependent=true"],
              {"round", "phase", "teachers_s", "students_s", "final_s", "party_chunk",
               "num_party_queries", "num_server_queries", "server_label_accuracy"}),
    "dp_fnas": ("fnas/digits_dp",
                ["data.num_agents=2", "data.image_size=4", "algorithm.nodes=1",
                 "algorithm.channels=2", "algorithm.cells=1",
                 'algorithm.primitives=["none","skip_connect"]', "algorithm.stem_multiplier=1",
                 "algorithm.search_epochs=1", "algorithm.batch_size=64",
                 "algorithm.retrain_epochs=1", "algorithm.retrain_batch_size=128"],
                ["algorithm.diagnostics=true"],
                {"round", "phase", "search_time_s", "retrain_time_s"}),
}


@pytest.mark.parametrize("family", [pytest.param(f, marks=() if f == "ae_dpfl" else
                                                 pytest.mark.sweep) for f in RUNS])
def test_a_tiny_run_releases_what_its_ledger_declares(family, tmp_path, capsys):
    """Without an opt-in the run reports only :data:`RUNS`' public metrics and every guarantee
    covers every release; with the family's opt-ins every further metric is named in
    ``not_covered``, and the printed summary line says so once, in under 160 characters."""
    name, tiny, opt_ins, public = RUNS[family]
    sets = tiny + ['privacy.accountants=["rdp"]', "run.progress=false"]
    lines, results = {}, {}
    for arm, extra in (("default", []), ("opted", opt_ins)):
        cfg = config_lib.load(shipped.path_of(name), sets + extra)
        results[arm] = runner.run(cfg, tmp_path / arm, progress=True)
        lines[arm] = capsys.readouterr().err.strip().splitlines()[-1]
    default, opted = results["default"], results["opted"]
    keys = lambda r: set().union(*(set(h) for h in r["history"]))          # noqa: E731
    assert keys(default) <= public, keys(default) - public
    assert default["privacy"] and all(g["covers_all_releases"] for g in default["privacy"])
    assert lines["default"].endswith(f"; covers every release; run folder {tmp_path / 'default'}")
    head = runner.headline_row(opted)
    assert head["covers_all_releases"] is False
    for metric in keys(opted) - public:                   # every gated metric is declared
        assert metric in head["not_covered"], metric
    line = lines["opted"]
    assert line.count("NOT covering") == 1 and line.count("every release") == 1
    assert line.endswith(f"; NOT covering every release: fedjax-dp show {tmp_path / 'opted'}")
    # short with the README's run folder (the line ends with the folder, whose length is the
    # user's: runs/<config name>/<UTC time> by default, here the test's tmp_path)
    folder = "runs/mnist5k/20261202-000000"
    for arm in lines:
        short = lines[arm].replace(str(tmp_path / arm), folder)
        assert len(short) < 160, (len(short), short)
    assert opted["test_accuracy"] == default["test_accuracy"]      # only the metrics differ
    shared = {(g["unit"], g["accountant"]): g["epsilon"] for g in opted["privacy"]}
    for g in default["privacy"]:
        assert shared[g["unit"], g["accountant"]] == g["epsilon"]
