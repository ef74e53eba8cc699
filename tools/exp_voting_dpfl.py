"""Voting-based DPFL vs gradient baselines at equal epsilon (voting-dpfl paper, issue 3 item 6).
As sweep files: ``configs/experiments/voting_dpfl_*.toml`` (``fedjax-dp sweep``; docs/sweeps.md).

Three experiments, all written to ``--out`` (default ``results/voting_dpfl/``) as JSON, a markdown
table and a PNG plot:

1. **Agent level** (add/remove one agent), mnist5k non-IID (50 agents, 6 of the 10 digits each,
   60 records each): AE-DPFL vs DP-FedAvg.
2. **Instance level** (add/remove one record of one agent), same data: kNN-DPFL vs DP-FedSGD.
   Both voting methods are also evaluated with the semi-supervised student
   (``student_semi_supervised``: self-training on the rest of the public data, no privacy cost)
   as methods "AE-DPFL+SSL" / "kNN-DPFL+SSL": same votes, same epsilon, another student.
3. **Large N**: AE-DPFL on ``synthetic`` data with N = 100 ... 100,000 agents (10 records each,
   logistic regression), at fixed agent-level epsilon: accuracy as N grows.

Protocol. For every target epsilon (``--targets``, default 2 4 8; delta ``--delta``, default 1e-5;
RDP accountant) and every point of a method's grid, the method's noise is *calibrated* to the
target (``fedjax_dp.privacy.calibration``: the smallest noise whose epsilon is <= the target), the
method runs, and its epsilon is recomputed from the method's own privacy ledger. A method's entry
for a target is its best test accuracy over its grid (all points have epsilon <= target). The
grids (``GRIDS`` / ``QUICK_GRIDS`` below) are the tuning: a voting method's grid is the number of
queries Q (and k for kNN-DPFL), with sigma calibrated; a gradient method's grid is the number of
rounds (and local steps / model), with the noise multiplier calibrated. Hyper-parameters are
selected on the test set for every method alike (the usual, optimistic protocol; the selection
itself is not privately accounted for). Data-dependent epsilons of the voting methods (GNMax,
``data_dependent: true``) are reported next to the data-independent ones but never used to
compare.

    .venv/bin/python tools/exp_voting_dpfl.py                 # full run (~20 min on 2 CPU cores)
    .venv/bin/python tools/exp_voting_dpfl.py --quick --out /tmp/v   # smoke run
    .venv/bin/python tools/exp_voting_dpfl.py --parts agent instance --name results_ssl
    .venv/bin/python tools/exp_voting_dpfl.py --parts agent --abstain none 0.5 0.7 0.9 \
        --name results_abstain        # AE-DPFL also tuned over its abstention threshold
    .venv/bin/python tools/exp_voting_dpfl.py --parts instance --agents 10 20 \
        --knn-k-frac 0.05 0.1 0.2 --fedsgd-batch-points 32:10:10 32:25:10 32:50:10 \
        --name results_instance_small_n   # fewer, larger agents: k also 5/10/20% of the local
                                          # size n; DP-FedSGD also at p = 32/n, more steps
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import platform
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from fedjax_dp import data as data_lib  # noqa: E402
from fedjax_dp.algorithms.voting import ae_dpfl, knn_dpfl, voting_dpfl  # noqa: E402
from fedjax_dp.algorithms.averaging import dp_fedavg, dp_fedsgd
from fedjax_dp.train import student as student_lib  # noqa: E402
from fedjax_dp.core import from_partition, rng  # noqa: E402
from fedjax_dp.models import make_model  # noqa: E402
from fedjax_dp.privacy import accounting, calibration, vote  # noqa: E402
from fedjax_dp.train import LocalTrainConfig, accuracy, train_agents  # noqa: E402

logging.getLogger("absl").setLevel(logging.ERROR)   # dp-accounting's fractional-order warnings


# --------------------------------------------------------------------------- grids

@dataclasses.dataclass(frozen=True)
class Grids:
    """What each method is tuned over (the noise is always calibrated to the target epsilon)."""

    agent_counts: tuple[int, ...] = (50, 100)      # mnist5k agents (60 or 30 records each)
    targets: tuple[float, ...] = (2.0, 4.0, 8.0)
    # AE-DPFL: local MLP-200 (200 steps, batch 32, lr 0.1), student MLP-200 (500 steps)
    ae_queries: tuple[int, ...] = (25, 50, 100, 200, 500)
    ae_local_steps: int = 200
    # AE-DPFL abstention thresholds (``ae_dpfl.Config.abstain_below``; None = the paper's rule,
    # every agent always votes). Same sensitivities, so the same calibrated sigma for every value.
    # The default keeps the paper's rule only; ``--abstain none 0.5 0.7 0.9`` widens the grid.
    ae_abstain: tuple[float | None, ...] = (None,)
    student_steps: int = 500
    # semi-supervised student of both voting methods ("+SSL" rows; one fixed setting, not tuned)
    ssl: bool = True
    ssl_rounds: int = 2
    ssl_confidence: float = 0.8
    # DP-FedAvg: (model, rounds); every agent every round, 10 local steps, S = 1
    fedavg_points: tuple[tuple[str, int], ...] = (("mlp", 5), ("mlp", 10), ("logistic", 3),
                                                  ("logistic", 5), ("logistic", 10),
                                                  ("logistic", 20))
    fedavg_local_steps: int = 10
    # kNN-DPFL: k x Q (PCA-64 features fitted on the public data)
    knn_k: tuple[int, ...] = (1, 3, 5, 10)
    knn_queries: tuple[int, ...] = (50, 100, 200, 500)
    # kNN-DPFL: extra k values as fractions of the (smallest) local size n, k = round(frac * n)
    # (half up, at least 1, at most n), added to ``knn_k``; the paper uses k = 5% of n
    # (``--knn-k-frac 0.05``: N = 10 -> n = 300, k = 15; N = 20 -> n = 150, k = 8). Default: none.
    knn_k_fracs: tuple[float, ...] = ()
    # DP-FedSGD: (rounds, local steps E), logistic regression, record rate p = 1/3, C = 1
    fedsgd_points: tuple[tuple[int, int], ...] = ((10, 2), (25, 2), (50, 2))
    # DP-FedSGD: extra points (expected batch B, rounds T, local steps E) with the record rate
    # p = min(1, B / n) (n = the smallest local size; the same p for every agent), e.g.
    # ``--fedsgd-batch-points 32:10:10 32:20:10``. Default: none.
    fedsgd_batch_points: tuple[tuple[int, int, int], ...] = ()
    fedsgd_lr: float = 1.0
    # large N (AE-DPFL on synthetic data)
    large_n: tuple[int, ...] = (100, 300, 1000, 3000, 10_000, 100_000)
    large_n_targets: tuple[float, ...] = (0.5, 1.0, 4.0)
    large_n_queries: int = 200
    large_n_local_size: int = 10


GRIDS = Grids()
QUICK_GRIDS = Grids(agent_counts=(20,), targets=(4.0,), ae_queries=(100,), ae_local_steps=20,
                    student_steps=50, fedavg_points=(("logistic", 3),), fedavg_local_steps=2,
                    knn_k=(3,), knn_queries=(100,), fedsgd_points=((3, 1),),
                    large_n=(100, 1000), large_n_targets=(4.0,), large_n_queries=50)


# --------------------------------------------------------------------------- helpers

def gaussian_votes_sigma(target: float, delta: float, num_queries: int,
                         sensitivity: float) -> float:
    """Smallest vote noise std sigma with eps(SelfComposed(Gaussian(sigma/Delta), Q)) <= target."""
    z = calibration.calibrate_noise_multiplier(
        target, delta, lambda m: accounting.gaussian_event(m, num_queries), bracket=(0.0, 5000.0))
    return z * sensitivity


def _record(rows: list, **row) -> dict:
    rows.append(row)
    acc = row.get("test_accuracy")
    shown = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()
             if k not in ("test_accuracy",)}
    print(f"  acc={acc:.4f} {shown}", flush=True)
    return row


class TrainedAgents:
    """AE-DPFL with the agents trained once and voted on for many (sigma, Q).

    Uses exactly the key streams of :func:`fedjax_dp.algorithms.voting.ae_dpfl.run` (init, train,
    queries, vote, student), so each call of :meth:`vote_and_student` equals
    ``ae_dpfl.run(key, ...)`` with that config (checked in ``--quick`` mode).
    """

    def __init__(self, key, agents, model, local: LocalTrainConfig, chunk_size="auto"):
        n = agents.num_agents
        self.key, self.model, self.n = key, model, n
        init = jax.vmap(model.init)(rng.split_per_agent(rng.stream(key, "init"), n))
        start = time.perf_counter()
        self.params, _ = train_agents(rng.stream(key, "train"), init, agents, model, local,
                                      shared_init=False, chunk_size=chunk_size)
        jax.block_until_ready(self.params)
        self.train_s = time.perf_counter() - start

    def vote_and_student(self, config: ae_dpfl.Config, x_public):
        qidx = voting_dpfl.select_queries(rng.stream(self.key, "queries"), len(x_public),
                                      config.num_queries)
        queries = jnp.asarray(x_public[qidx])
        fn = ae_dpfl.ballot_fn(self.model, config.abstain_below)
        c = self.model.num_classes
        labels = np.asarray(vote.mpc_vote(rng.stream(self.key, "vote"), fn, self.params,
                                          queries, config.sigma, num_classes=c,
                                          agent_chunk=config.agent_chunk,
                                          query_chunk=config.query_chunk))
        clean = vote.vote_sums(fn, self.params, queries, num_classes=c,
                               agent_chunk=config.agent_chunk, query_chunk=config.query_chunk)
        student = ae_dpfl.train_student(rng.stream(self.key, "student"), self.model,
                                        x_public[qidx], labels, config.student)
        return student, qidx, labels, clean

    def ssl_student(self, config: ae_dpfl.Config, x_public, qidx, labels):
        """The semi-supervised student on the same votes (== ``ae_dpfl.run`` with ``config``)."""
        return student_lib.train_student(rng.stream(self.key, "student"), self.model, x_public,
                                         qidx, labels, config.student, config.semi_supervised)


def ssl_config(cfg, grids: Grids):
    """``cfg`` with the semi-supervised student switched on (votes and ledger unchanged)."""
    return dataclasses.replace(cfg, student_semi_supervised=True,
                               student_self_training_rounds=grids.ssl_rounds,
                               student_confidence=grids.ssl_confidence)


def _voting_eps(ledger, unit: str, delta: float) -> tuple[float, float]:
    """(data-independent eps, data-dependent eps) of a voting ledger for ``unit``."""
    return (ledger.epsilon(unit, delta), ledger.epsilon(f"{unit}_data_dependent", delta))


# --------------------------------------------------------------------------- agent level

def run_ae_dpfl(rows, ds, agents, grids: Grids, delta: float, seed: int, check: bool = False):
    print("AE-DPFL (agent level)", flush=True)
    model = make_model("mlp", ds.feature_shape, ds.num_classes, hidden=(200,))
    local = LocalTrainConfig(steps=grids.ae_local_steps, batch_size=32, learning_rate=0.1)
    key = rng.stream(seed, "ae_dpfl")
    trained = TrainedAgents(key, agents, model, local)
    points = [(q, tau) for q in grids.ae_queries for tau in grids.ae_abstain]
    for target in grids.targets:
        for q, tau in points:
            start = time.perf_counter()
            sigma = gaussian_votes_sigma(target, delta, q, 1.0)
            cfg = ae_dpfl.Config(sigma=sigma, num_queries=q, student_steps=grids.student_steps,
                                 abstain_below=tau, local=local)
            student, qidx, labels, clean = trained.vote_and_student(cfg, ds.x_public)
            if check:   # the reuse equals a full ae_dpfl.run with the same key
                full = ae_dpfl.run(key, agents, model, cfg, ds.x_public)
                np.testing.assert_array_equal(full.labels, labels)
            ledger = ae_dpfl.vote_ledger(cfg, clean)
            eps, eps_dd = _voting_eps(ledger, "agent", delta)
            _record(rows, level="agent", method="AE-DPFL", num_agents=agents.num_agents,
                    target=target, num_queries=q, abstain_below=tau,
                    sigma=sigma, epsilon=eps, epsilon_data_dependent=eps_dd,
                    label_accuracy=float(np.mean(labels == ds.y_public[qidx])),
                    test_accuracy=accuracy(model, student, ds.x_test, ds.y_test),
                    wall_s=time.perf_counter() - start + trained.train_s / len(grids.targets)
                    / len(points))
            if grids.ssl:   # same votes and ledger, semi-supervised student
                t0 = time.perf_counter()
                scfg = ssl_config(cfg, grids)
                if check:
                    full = ae_dpfl.run(key, agents, model, scfg, ds.x_public)
                    np.testing.assert_array_equal(full.labels, labels)
                sstudent = trained.ssl_student(scfg, ds.x_public, qidx, labels)
                _record(rows, level="agent", method="AE-DPFL+SSL",
                        num_agents=agents.num_agents, target=target, num_queries=q,
                        abstain_below=tau,
                        sigma=sigma, epsilon=eps, epsilon_data_dependent=eps_dd,
                        label_accuracy=float(np.mean(labels == ds.y_public[qidx])),
                        ssl_rounds=grids.ssl_rounds, ssl_confidence=grids.ssl_confidence,
                        test_accuracy=accuracy(model, sstudent, ds.x_test, ds.y_test),
                        wall_s=time.perf_counter() - t0)


def run_dp_fedavg(rows, ds, agents, grids: Grids, delta: float, seed: int):
    print("DP-FedAvg (agent level)", flush=True)
    for target in grids.targets:
        for model_name, rounds in grids.fedavg_points:
            start = time.perf_counter()
            model = make_model(model_name, ds.feature_shape, ds.num_classes, hidden=(200,))
            z = calibration.calibrate_sampled_gaussian(target, delta, 1.0, rounds,
                                                       bracket=(0.0, 5000.0))
            cfg = dp_fedavg.Config(rounds=rounds, sampling_rate=1.0, clip_norm=1.0,
                                   noise_multiplier=z, server_lr=1.0,
                                   local=LocalTrainConfig(steps=grids.fedavg_local_steps,
                                                          batch_size=16, learning_rate=0.1))
            history = dp_fedavg.run(rng.stream(seed, "dp_fedavg"), agents, model, cfg)
            eps = dp_fedavg.ledger(cfg).epsilon("agent", delta)
            _record(rows, level="agent", method="DP-FedAvg", num_agents=agents.num_agents,
                    target=target, model=model_name,
                    rounds=rounds, noise_multiplier=z, epsilon=eps,
                    test_accuracy=accuracy(model, history.params, ds.x_test, ds.y_test),
                    wall_s=time.perf_counter() - start)


# --------------------------------------------------------------------------- instance level

def run_knn_dpfl(rows, ds, agents, grids: Grids, delta: float, seed: int):
    print("kNN-DPFL (instance level)", flush=True)
    model = make_model("mlp", ds.feature_shape, ds.num_classes, hidden=(200,))
    ks = knn_k_values(grids, int(np.min(np.asarray(agents.counts))))
    print(f"  k grid: {ks}", flush=True)
    for target in grids.targets:
        for k in ks:
            for q in grids.knn_queries:
                start = time.perf_counter()
                probe = knn_dpfl.Config(k=k, num_queries=q)
                sens = knn_dpfl.sensitivities(probe)["instance"]
                sigma = gaussian_votes_sigma(target, delta, q, sens)
                cfg = knn_dpfl.Config(k=k, sigma=sigma, num_queries=q, feature_map="pca",
                                      feature_dim=64, student_steps=grids.student_steps)
                result = knn_dpfl.run(rng.stream(seed, "knn_dpfl"), agents, model, cfg,
                                      ds.x_public)
                ledger = knn_dpfl.ledger(cfg, result.state)
                eps, eps_dd = _voting_eps(ledger, "instance", delta)
                _record(rows, level="instance", method="kNN-DPFL",
                        num_agents=agents.num_agents, target=target, k=k,
                        num_queries=q, sigma=sigma, epsilon=eps, epsilon_data_dependent=eps_dd,
                        agent_epsilon=ledger.epsilon("agent", delta),
                        label_accuracy=float(np.mean(result.labels
                                                     == ds.y_public[result.query_indices])),
                        test_accuracy=accuracy(model, result.params, ds.x_test, ds.y_test),
                        wall_s=time.perf_counter() - start)
                if grids.ssl:   # same votes and ledger, semi-supervised student
                    t0 = time.perf_counter()
                    scfg = ssl_config(cfg, grids)
                    sstudent = student_lib.train_student(
                        rng.stream(rng.stream(seed, "knn_dpfl"), "student"), model, ds.x_public,
                        result.query_indices, result.labels, scfg.student, scfg.semi_supervised)
                    _record(rows, level="instance", method="kNN-DPFL+SSL",
                            num_agents=agents.num_agents, target=target, k=k,
                            num_queries=q, sigma=sigma, epsilon=eps,
                            epsilon_data_dependent=eps_dd,
                            agent_epsilon=ledger.epsilon("agent", delta),
                            label_accuracy=float(np.mean(result.labels
                                                         == ds.y_public[result.query_indices])),
                            ssl_rounds=grids.ssl_rounds, ssl_confidence=grids.ssl_confidence,
                            test_accuracy=accuracy(model, sstudent, ds.x_test, ds.y_test),
                            wall_s=time.perf_counter() - t0)


def knn_k_values(grids: Grids, local_size: int) -> list[int]:
    """kNN-DPFL's k grid: ``knn_k`` plus ``round(frac * local_size)`` for ``knn_k_fracs``.

    Rounded half up, clipped to [1, local_size]; values above the local size are dropped
    (``knn_dpfl`` rejects k > the smallest local size).
    """
    extra = {min(local_size, max(1, int(np.floor(f * local_size + 0.5))))
             for f in grids.knn_k_fracs}
    return sorted(k for k in set(grids.knn_k) | extra if 1 <= k <= local_size)


def fedsgd_grid(grids: Grids, local_size: int) -> list[tuple[float, int, int, int | None]]:
    """DP-FedSGD's grid as (record rate p, rounds, local steps, expected batch B or None).

    ``fedsgd_points`` at p = 1/3 (every agent samples a third of its records per step), then
    ``fedsgd_batch_points`` at p = min(1, B / local_size).
    """
    points = [(1.0 / 3.0, rounds, steps, None) for rounds, steps in grids.fedsgd_points]
    points += [(min(1.0, b / local_size), rounds, steps, b)
               for b, rounds, steps in grids.fedsgd_batch_points]
    return points


def run_dp_fedsgd(rows, ds, agents, grids: Grids, delta: float, seed: int):
    print("DP-FedSGD (instance level)", flush=True)
    model = make_model("logistic", ds.feature_shape, ds.num_classes)
    points = fedsgd_grid(grids, int(np.min(np.asarray(agents.counts))))
    for target in grids.targets:
        for rate, rounds, steps, batch in points:
            start = time.perf_counter()
            z = calibration.calibrate_sampled_gaussian(target, delta, rate, rounds * steps,
                                                       bracket=(0.0, 5000.0))
            cfg = dp_fedsgd.Config(rounds=rounds, sampling_rate=1.0, clip_norm=1.0,
                                   noise_multiplier=z, record_sampling_rate=rate,
                                   local=LocalTrainConfig(steps=steps,
                                                          learning_rate=grids.fedsgd_lr))
            history = dp_fedsgd.run(rng.stream(seed, "dp_fedsgd"), agents, model, cfg)
            eps = dp_fedsgd.ledger(cfg, history.state).epsilon(
                "instance", delta)
            _record(rows, level="instance", method="DP-FedSGD", num_agents=agents.num_agents,
                    target=target, model="logistic",
                    rounds=rounds, local_steps=steps, record_sampling_rate=rate,
                    **({} if batch is None else {"expected_batch": batch}),
                    noise_multiplier=z, epsilon=eps,
                    test_accuracy=accuracy(model, history.params, ds.x_test, ds.y_test),
                    wall_s=time.perf_counter() - start)


# --------------------------------------------------------------------------- large N

def run_large_n(rows, grids: Grids, delta: float, seed: int):
    """AE-DPFL on synthetic data, N agents x 10 records, logistic local models, chunked vote."""
    print("AE-DPFL large N (agent level, synthetic)", flush=True)
    for n in grids.large_n:
        start = time.perf_counter()
        m = grids.large_n_local_size
        ds = data_lib.load_dataset("synthetic", num_train=n * m, num_public=1000, num_test=2000,
                                   num_features=20, num_classes=10, separation=3.0, seed=seed)
        parts = data_lib.partition("label_shards", ds.y_train, n, rng.stream(seed, "partition"),
                                   classes_per_agent=5)
        agents = from_partition(ds.x_train, ds.y_train, parts)
        model = make_model("logistic", ds.feature_shape, ds.num_classes)
        local = LocalTrainConfig(steps=20, batch_size=m, learning_rate=0.5)
        trained = TrainedAgents(rng.stream(seed, f"large_n_{n}"), agents, model, local,
                                chunk_size=min(n, 10_000))
        setup_s = time.perf_counter() - start
        for target in grids.large_n_targets:
            t0 = time.perf_counter()
            q = grids.large_n_queries
            sigma = gaussian_votes_sigma(target, delta, q, 1.0)
            cfg = ae_dpfl.Config(sigma=sigma, num_queries=q, student_steps=300,
                                 agent_chunk=min(n, 5000), local=local)
            student, qidx, labels, clean = trained.vote_and_student(cfg, ds.x_public)
            ledger = ae_dpfl.vote_ledger(cfg, clean)
            eps, eps_dd = _voting_eps(ledger, "agent", delta)
            _record(rows, level="agent_large_n", method="AE-DPFL", num_agents=n,
                    target=target, num_queries=q, sigma=sigma, epsilon=eps,
                    epsilon_data_dependent=eps_dd,
                    label_accuracy=float(np.mean(labels == ds.y_public[qidx])),
                    test_accuracy=accuracy(model, student, ds.x_test, ds.y_test),
                    setup_s=setup_s, train_s=trained.train_s, wall_s=time.perf_counter() - t0)


# --------------------------------------------------------------------------- summary

PAIRS = {"agent": ("AE-DPFL", "DP-FedAvg"), "instance": ("kNN-DPFL", "DP-FedSGD")}
SSL = {"agent": "AE-DPFL+SSL", "instance": "kNN-DPFL+SSL"}   # semi-supervised student rows


def best_per_target(rows: list[dict]) -> list[dict]:
    """For each level, number of agents, target and method: the best grid point (eps <= target)."""
    out = []
    for level, methods in PAIRS.items():
        mine = [r for r in rows if r["level"] == level]
        for n in sorted({r["num_agents"] for r in mine}):
            for target in sorted({r["target"] for r in mine if r["num_agents"] == n}):
                entry = {"level": level, "num_agents": n, "target": target}
                for method in methods + (SSL[level],):
                    cands = [r for r in mine if r["method"] == method and r["num_agents"] == n
                             and r["target"] == target and r["epsilon"] <= target * (1 + 1e-6)]
                    if cands:
                        entry[method] = max(cands, key=lambda r: r["test_accuracy"])
                if all(m in entry for m in methods):
                    a, b = (entry[m]["test_accuracy"] for m in methods)
                    entry["voting_wins"] = bool(a > b)
                if SSL[level] in entry and methods[1] in entry:
                    entry["ssl_wins"] = bool(entry[SSL[level]]["test_accuracy"]
                                             > entry[methods[1]]["test_accuracy"])
                out.append(entry)
    return out


def _settings(r: dict) -> str:
    keys = ("k", "num_queries", "abstain_below", "sigma", "model", "rounds", "local_steps",
            "record_sampling_rate", "noise_multiplier")
    names = {"num_queries": "Q", "noise_multiplier": "z", "local_steps": "E", "rounds": "T",
             "abstain_below": "abstain", "record_sampling_rate": "p"}
    return ", ".join(f"{names.get(k, k)}={r[k]:.3g}" if isinstance(r[k], float) else
                     f"{names.get(k, k)}={r[k]}" for k in keys if k in r)


def markdown(rows: list[dict], best: list[dict], meta: dict) -> str:
    lines = ["# Voting-based DPFL vs gradient baselines at equal epsilon", "",
             f"Command: `{meta['command']}`  ",
             f"delta = {meta['delta']:g}, RDP accountant (dp-accounting); mnist5k non-IID "
             "(label_shards: every agent holds 6 of the 10 digits; 3000 training images split "
             "over N agents); best test accuracy over each method's grid with epsilon <= target; "
             f"total wall time {meta['wall_time_s']:.0f} s on {meta['machine']}.", ""]
    ssl = any("ssl_wins" in e for e in best)
    lines += ["| level | N | target eps | voting: test acc (eps; data-dep. eps) [setting] | "
              "baseline: test acc (eps) [setting] | voting better |"
              + (" voting+SSL: test acc [setting] | voting+SSL better |" if ssl else ""),
              "|---|---|---|---|---|---|" + ("---|---|" if ssl else "")]
    for e in best:
        v, g = PAIRS[e["level"]]
        cell_v = (f"**{v}** {e[v]['test_accuracy']:.3f} ({e[v]['epsilon']:.2f}; "
                  f"{e[v]['epsilon_data_dependent']:.2f}) [{_settings(e[v])}]" if v in e else "-")
        cell_g = (f"**{g}** {e[g]['test_accuracy']:.3f} ({e[g]['epsilon']:.2f}) "
                  f"[{_settings(e[g])}]" if g in e else "-")
        wins = {True: "yes", False: "**no**"}.get(e.get("voting_wins"), "-")
        line = (f"| {e['level']} | {e['num_agents']} | {e['target']:g} | {cell_v} | "
                f"{cell_g} | {wins} |")
        if ssl:
            s = SSL[e["level"]]
            cell_s = (f"**{s}** {e[s]['test_accuracy']:.3f} [{_settings(e[s])}]"
                      if s in e else "-")
            line += f" {cell_s} | {({True: 'yes', False: '**no**'}.get(e.get('ssl_wins'), '-'))} |"
        lines.append(line)
    lines += grid_lines(rows, meta)
    taus = {r.get("abstain_below") for r in rows if r["method"] == "AE-DPFL"}
    if taus - {None}:
        lines += abstain_table(rows, best, sorted(taus, key=lambda t: -1 if t is None else t))
    large = [r for r in rows if r["level"] == "agent_large_n"]
    if large:
        lines += ["", "Large N: AE-DPFL at fixed agent-level epsilon on `synthetic` (20-d, "
                  "10-class Gaussian mixture), 10 records per agent holding 5 of the 10 classes, logistic "
                  f"local and student models, Q = {large[0]['num_queries']}:", "",
                  "| agents N | target eps | eps | data-dep. eps | sigma | vote label acc | "
                  "test acc | local training s | vote+student s |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in large:
            lines.append(f"| {r['num_agents']:,} | {r['target']:g} | {r['epsilon']:.2f} | "
                         f"{r['epsilon_data_dependent']:.2f} | {r['sigma']:.1f} | "
                         f"{r['label_accuracy']:.3f} | {r['test_accuracy']:.3f} | "
                         f"{r['train_s']:.1f} | {r['wall_s']:.1f} |")
    if ssl:
        lines += ["", "+SSL: the same votes (same epsilon) with the semi-supervised student "
                  f"(self-training, {meta['grids']['ssl_rounds']} rounds, confidence "
                  f">= {meta['grids']['ssl_confidence']:g}, on the rest of the public data; "
                  "one fixed setting, not tuned)."]
    lines += ["", f"All grid points: `{meta.get('name', 'results')}.json` (`rows`); plot: "
              f"`{meta.get('plot', 'accuracy_vs_epsilon.png')}`."]
    return "\n".join(lines) + "\n"


def grid_lines(rows: list[dict], meta: dict) -> list[str]:
    """The tuning grids of the instance-level methods, as run (per N), for the markdown."""
    if not any(r["level"] == "instance" for r in rows):
        return []
    g = meta["grids"]
    lines = ["", "Instance-level tuning grids (noise calibrated to the target at every point; "
             "C = 1, server lr 1, every agent every round):", ""]
    for n in sorted({r["num_agents"] for r in rows if r["level"] == "instance"}):
        ks = sorted({r["k"] for r in rows if r["num_agents"] == n
                     and r["method"] == "kNN-DPFL"})
        fed = [r for r in rows if r["num_agents"] == n and r["method"] == "DP-FedSGD"]
        pts = sorted({(r["record_sampling_rate"], r["rounds"], r["local_steps"],
                       r.get("expected_batch")) for r in fed},
                     key=lambda t: (t[3] is not None, t[0], t[1], t[2]))
        local = 3000 // n if n else 0
        fed_txt = ", ".join(f"(p={p:.3g}{'' if b is None else f' = {b}/n'}, T={t}, E={e})"
                            for p, t, e, b in pts)
        lines.append(f"- N = {n} (about {local} records per agent): kNN-DPFL k in "
                     f"{{{', '.join(map(str, ks))}}} (fixed list {tuple(g['knn_k'])}"
                     + (f" plus k = round(frac * n) for frac in {tuple(g['knn_k_fracs'])}"
                        if g.get("knn_k_fracs") else "")
                     + f") x Q in {{{', '.join(map(str, g['knn_queries']))}}}; DP-FedSGD "
                     f"(logistic, lr {g['fedsgd_lr']:g}) {fed_txt}.")
    return lines


def abstain_table(rows: list[dict], best: list[dict], taus: list) -> list[str]:
    """AE-DPFL per abstention threshold (best over Q, eps <= target) next to DP-FedAvg."""
    lines = ["", "AE-DPFL by abstention threshold `abstain_below` (best test accuracy over Q with "
             "eps <= target; None = the paper's rule, every agent votes; the vote's sensitivity "
             "and hence sigma are the same for every threshold):", "",
             "| N | target eps | " + " | ".join(f"abstain {t}" for t in taus)
             + " | DP-FedAvg | AE-DPFL best - DP-FedAvg |", "|---|---|" + "---|" * (len(taus) + 2)]
    for e in best:
        if e["level"] != "agent":
            continue
        cells = []
        for tau in taus:
            cands = [r for r in rows if r["level"] == "agent" and r["method"] == "AE-DPFL"
                     and r["num_agents"] == e["num_agents"] and r["target"] == e["target"]
                     and r.get("abstain_below") == tau
                     and r["epsilon"] <= e["target"] * (1 + 1e-6)]
            cells.append(f"{max(r['test_accuracy'] for r in cands):.3f}" if cands else "-")
        fedavg = e.get("DP-FedAvg")
        base = f"{fedavg['test_accuracy']:.3f}" if fedavg else "-"
        gap = (f"{e['AE-DPFL']['test_accuracy'] - fedavg['test_accuracy']:+.3f}"
               if fedavg and "AE-DPFL" in e else "-")
        lines.append(f"| {e['num_agents']} | {e['target']:g} | " + " | ".join(cells)
                     + f" | {base} | {gap} |")
    return lines


def plot(rows: list[dict], best: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    large = [r for r in rows if r["level"] == "agent_large_n"]
    levels = [(lv, ms) for lv, ms in PAIRS.items() if any(r["level"] == lv for r in rows)]
    panels = len(levels) + bool(large)
    if not panels:
        return
    fig, axes = plt.subplots(1, panels, figsize=(5.2 * panels, 4.4), squeeze=False)
    axes = list(axes[0])
    colors = {"AE-DPFL": "C0", "DP-FedAvg": "C3", "kNN-DPFL": "C2", "DP-FedSGD": "C1",
              "AE-DPFL+SSL": "C9", "kNN-DPFL+SSL": "C8"}
    styles = ["-", "--", ":", "-."]
    for ax, (level, methods) in zip(axes, levels):
        counts = sorted({r["num_agents"] for r in rows if r["level"] == level})
        for method in methods + (SSL[level],):
            if not any(r["method"] == method for r in rows):
                continue
            for n, style in zip(counts, styles):
                pts = [r for r in rows if r["level"] == level and r["method"] == method
                       and r["num_agents"] == n]
                ax.scatter([r["epsilon"] for r in pts], [r["test_accuracy"] for r in pts],
                           s=10, alpha=0.3, color=colors[method])
                bests = [e[method] for e in best if e["level"] == level
                         and e["num_agents"] == n and method in e]
                ax.plot([r["epsilon"] for r in bests], [r["test_accuracy"] for r in bests],
                        "o" + style, color=colors[method], label=f"{method}, N={n}")
        ax.set_xscale("log")
        ax.set_xlabel(f"{level}-level epsilon (delta fixed)")
        ax.set_ylabel("test accuracy")
        ax.set_title(f"mnist5k non-IID, {level} level (best per target)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if large:
        ax = axes[-1]
        for i, target in enumerate(sorted({r["target"] for r in large})):
            pts = [r for r in large if r["target"] == target]
            ax.plot([r["num_agents"] for r in pts], [r["test_accuracy"] for r in pts], "o-",
                    color=f"C{i}", label=f"eps = {target:g}: student test acc")
            ax.plot([r["num_agents"] for r in pts], [r["label_accuracy"] for r in pts], "x--",
                    color=f"C{i}", alpha=0.6, label=f"eps = {target:g}: vote label acc")
        ax.set_xscale("log")
        ax.set_xlabel("number of agents N")
        ax.set_ylabel("accuracy")
        ax.set_title("AE-DPFL at fixed agent-level epsilon (synthetic)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --------------------------------------------------------------------------- main

def mnist_setup(num_agents: int, seed: int, quick: bool):
    ds = data_lib.load_dataset("mnist5k", seed=seed)
    if quick:   # 8x8 images keep the smoke run fast
        small = {f"x_{s}": data_lib.resize_images(getattr(ds, f"x_{s}"), 8)
                 for s in ("train", "public", "test")}
        ds = dataclasses.replace(ds, **small)
    parts = data_lib.partition("label_shards", ds.y_train, num_agents,
                               rng.stream(seed, "partition"), classes_per_agent=6)
    return ds, from_partition(ds.x_train, ds.y_train, parts)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny grids (smoke run)")
    parser.add_argument("--out", default=str(ROOT / "results" / "voting_dpfl"))
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--parts", nargs="+", default=["agent", "instance", "large_n"],
                        choices=["agent", "instance", "large_n"])
    parser.add_argument("--agents", type=int, nargs="+", default=None,
                        help="numbers of mnist5k agents (default: the grid's, 50 and 100)")
    parser.add_argument("--name", default="results",
                        help="output file stem: NAME.json, NAME.md (and a plot; 'results' "
                             "writes accuracy_vs_epsilon.png, else NAME_accuracy_vs_epsilon.png)")
    parser.add_argument("--abstain", nargs="+", default=None, metavar="TAU",
                        help="AE-DPFL abstention thresholds to tune over ('none' = the paper's "
                             "rule), e.g. --abstain none 0.5 0.7 0.9 (default: none only)")
    parser.add_argument("--targets", type=float, nargs="+", default=None,
                        help="target epsilons (default: the grid's, 2 4 8)")
    parser.add_argument("--knn-k-frac", type=float, nargs="+", default=None, metavar="FRAC",
                        help="kNN-DPFL: also k = round(FRAC * local size), e.g. 0.05 (the "
                             "paper's 5%%); added to the fixed k grid")
    parser.add_argument("--fedsgd-batch-points", nargs="+", default=None, metavar="B:T:E",
                        help="DP-FedSGD: extra grid points, expected batch B (record rate "
                             "p = B / local size), T rounds, E local steps, e.g. 32:10:10")
    parser.add_argument("--no-ssl", action="store_true",
                        help="skip the semi-supervised-student (+SSL) rows")
    args = parser.parse_args(argv)
    grids = QUICK_GRIDS if args.quick else GRIDS
    if args.no_ssl:
        grids = dataclasses.replace(grids, ssl=False)
    if args.agents:
        grids = dataclasses.replace(grids, agent_counts=tuple(args.agents))
    if args.targets:
        grids = dataclasses.replace(grids, targets=tuple(args.targets))
    if args.knn_k_frac:
        if any(not 0.0 < f <= 1.0 for f in args.knn_k_frac):
            parser.error(f"--knn-k-frac values must be in (0, 1], got {args.knn_k_frac}")
        grids = dataclasses.replace(grids, knn_k_fracs=tuple(args.knn_k_frac))
    if args.fedsgd_batch_points:
        try:
            pts = tuple(tuple(int(v) for v in p.split(":")) for p in args.fedsgd_batch_points)
        except ValueError:
            pts = ()
        if not pts or any(len(p) != 3 or min(p) < 1 for p in pts):
            parser.error("--fedsgd-batch-points takes B:T:E triples of positive integers, got "
                         f"{args.fedsgd_batch_points}")
        grids = dataclasses.replace(grids, fedsgd_batch_points=pts)
    if args.abstain:
        taus = tuple(None if t.lower() == "none" else ae_dpfl.check_abstain_below(
            "--abstain", float(t)) for t in args.abstain)
        grids = dataclasses.replace(grids, ae_abstain=taus)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    rows: list[dict] = []
    for n in grids.agent_counts if {"agent", "instance"} & set(args.parts) else ():
        ds, agents = mnist_setup(n, args.seed, args.quick)
        if "agent" in args.parts:
            run_ae_dpfl(rows, ds, agents, grids, args.delta, args.seed, check=args.quick)
            run_dp_fedavg(rows, ds, agents, grids, args.delta, args.seed)
        if "instance" in args.parts:
            run_knn_dpfl(rows, ds, agents, grids, args.delta, args.seed)
            run_dp_fedsgd(rows, ds, agents, grids, args.delta, args.seed)
    if "large_n" in args.parts:
        run_large_n(rows, grids, args.delta, args.seed)
    best = best_per_target(rows)
    meta = {"command": "python tools/exp_voting_dpfl.py " + " ".join(
                sys.argv[1:] if argv is None else argv),
            "delta": args.delta, "seed": args.seed, "quick": args.quick,
            "grids": dataclasses.asdict(grids), "wall_time_s": time.perf_counter() - start,
            "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, "
                       f"JAX backend {jax.default_backend()}",
            "jax": jax.__version__, "name": args.name,
            "plot": ("accuracy_vs_epsilon.png" if args.name == "results"
                     else f"{args.name}_accuracy_vs_epsilon.png")}
    record = {"meta": meta, "best": best, "rows": rows}
    (out / f"{args.name}.json").write_text(json.dumps(record, indent=2))
    (out / f"{args.name}.md").write_text(markdown(rows, best, meta))
    plot(rows, best, out / meta["plot"])
    print((out / f"{args.name}.md").read_text())
    return record


if __name__ == "__main__":
    main()
