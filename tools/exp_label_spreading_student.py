"""Does a stronger semi-supervised student rescue AE-DPFL on mnist5k? (label spreading check)

Same agents, queries, votes and keys as ``tools/exp_voting_dpfl.py`` (AE-DPFL, MLP-200 locals,
label_shards 6 digits per agent, noise calibrated to agent-level epsilon at delta 1e-5). For each
(epsilon, Q) the released labels are spread over the server's whole public set with scikit-learn's
``LabelSpreading`` (kNN graph, 7 neighbours, alpha 0.2) on PCA-50 features fitted on the public
data only, and the student MLP is trained on every public point with its spread label. This is
post-processing of the released labels and the public data (no privacy cost). Reported next to
the plain supervised student and to label spreading from the TRUE labels of the same Q queries
(the ceiling of this student).

    .venv/bin/python tools/exp_label_spreading_student.py --agents 100 \
        --out results/voting_dpfl/label_spreading_student.md
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import exp_voting_dpfl as sweep  # noqa: E402

from sklearn.semi_supervised import LabelSpreading  # noqa: E402

from fedjax_dp.algorithms.voting import ae_dpfl  # noqa: E402
from fedjax_dp.train import student as student_lib  # noqa: E402
from fedjax_dp.core import rng  # noqa: E402
from fedjax_dp.models import make_model  # noqa: E402
from fedjax_dp.train import LocalTrainConfig  # noqa: E402

POINTS = ((2.0, 100), (2.0, 200), (4.0, 200), (4.0, 500), (8.0, 200), (8.0, 500))


def spread(features: np.ndarray, qidx: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Labels for every public point from ``labels`` on ``qidx`` (kNN label spreading)."""
    y = -np.ones(len(features), int)
    y[qidx] = labels
    model = LabelSpreading(kernel="knn", n_neighbors=7, alpha=0.2, max_iter=100)
    return model.fit(features, y).transduction_.astype(np.int32)


def main(argv=None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--agents", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--out", default="results/voting_dpfl/label_spreading_student.md")
    args = ap.parse_args(argv)
    start = time.perf_counter()
    ds, agents = sweep.mnist_setup(args.agents, args.seed, quick=False)
    model = make_model("mlp", ds.feature_shape, ds.num_classes, hidden=(200,))
    key = rng.stream(args.seed, "ae_dpfl")
    trained = sweep.TrainedAgents(key, agents, model,
                                  LocalTrainConfig(steps=200, batch_size=32, learning_rate=0.1))
    flat = np.asarray(ds.x_public, np.float32).reshape(len(ds.x_public), -1)
    mean = flat.mean(0)
    _, _, vt = np.linalg.svd(flat - mean, full_matrices=False)
    feats = (flat - mean) @ vt[:50].T                                     # public data only
    lines = [
        "# AE-DPFL with a label-spreading student (mnist5k, agent level)", "",
        f"Command: `.venv/bin/python tools/exp_label_spreading_student.py --agents {args.agents}`"
        f"; N = {args.agents} agents, delta = {args.delta:g}, RDP; seed {args.seed}.", "",
        "| eps | Q | sigma | released-label acc | supervised student | spread-label acc (all "
        "public) | student on spread labels | true-label spreading acc (ceiling) |",
        "|---|---|---|---|---|---|---|---|"]
    for eps, q in POINTS:
        sigma = sweep.gaussian_votes_sigma(eps, args.delta, q, 1.0)
        cfg = ae_dpfl.Config(sigma=sigma, num_queries=q, student_steps=500)
        student, qidx, labels, _ = trained.vote_and_student(cfg, ds.x_public)
        plain = sweep.accuracy(model, student, ds.x_test, ds.y_test)
        spread_labels = spread(feats, qidx, labels)
        st = student_lib.train_supervised(rng.stream(key, "student"), model, ds.x_public,
                                          spread_labels, cfg.student)
        acc = sweep.accuracy(model, st, ds.x_test, ds.y_test)
        ceiling = np.mean(spread(feats, qidx, ds.y_public[qidx]) == ds.y_public)
        row = (f"| {eps:g} | {q} | {sigma:.1f} | {np.mean(labels == ds.y_public[qidx]):.3f} | "
               f"{plain:.3f} | {np.mean(spread_labels == ds.y_public):.3f} | {acc:.3f} | "
               f"{ceiling:.3f} |")
        print(row, flush=True)
        lines.append(row)
    lines += ["", f"Wall time {time.perf_counter() - start:.0f} s. DP-FedAvg at the same epsilon "
              "and N (results/voting_dpfl/results.md): see that table."]
    text = "\n".join(lines) + "\n"
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(f"wrote {args.out}")
    return text


if __name__ == "__main__":
    main()
