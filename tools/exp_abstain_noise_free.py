"""AE-DPFL abstention: noise-free vote quality on mnist5k non-IID (label_shards, 6 digits/agent).

Same agents as ``tools/exp_voting_dpfl.py`` (MLP-200, 200 local steps, batch 32, lr 0.1, key
stream ``ae_dpfl``, partition stream ``partition``). For every ``abstain_below`` the ballots of all
agents on all 1000 public images are summed without noise (analysis only; ``y_public`` is used
only to score) and we report:

* label acc: ``argmax`` of the noise-free sum equals the true label (all-abstain queries count as
  wrong);
* median margin: median over queries of (top-1 count - top-2 count), in votes (sensitivity units);
* mean votes: ballots cast per query (N without abstention); no-vote: share of queries with none;
* noisy acc @ eps: the released-label accuracy of the actual noisy vote, with sigma calibrated to
  agent-level eps (delta 1e-5, Q = 200, Delta = 1 -- identical for every abstain_below), mean of
  5 vote keys over the 1000 public images.

    .venv/bin/python tools/exp_abstain_noise_free.py [--agents 100 50]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

import exp_voting_dpfl as exp  # noqa: E402
from fedjax_dp.algorithms.voting import ae_dpfl  # noqa: E402
from fedjax_dp.core import rng  # noqa: E402
from fedjax_dp.models import make_model  # noqa: E402
from fedjax_dp.privacy import vote  # noqa: E402
from fedjax_dp.train import LocalTrainConfig  # noqa: E402

THRESHOLDS = (None, 0.5, 0.7, 0.9, 0.95, 0.99)
TARGETS = (2.0, 4.0, 8.0)


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--agents", type=int, nargs="+", default=[100, 50])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--queries", type=int, default=200)
    args = parser.parse_args(argv)
    grids = exp.GRIDS
    sigmas = {t: exp.gaussian_votes_sigma(t, args.delta, args.queries, 1.0) for t in TARGETS}
    lines = []
    for n in args.agents:
        t0 = time.perf_counter()
        ds, agents = exp.mnist_setup(n, args.seed, False)
        model = make_model("mlp", ds.feature_shape, ds.num_classes, hidden=(200,))
        local = LocalTrainConfig(steps=grids.ae_local_steps, batch_size=32, learning_rate=0.1)
        trained = exp.TrainedAgents(rng.stream(args.seed, "ae_dpfl"), agents, model, local)
        x = jnp.asarray(ds.x_public)
        y = np.asarray(ds.y_public)
        lines += [f"", f"N = {n} agents ({3000 // n} records each), local training "
                  f"{trained.train_s:.1f} s; sigma for Q={args.queries}: "
                  + ", ".join(f"eps {t:g} -> {s:.2f}" for t, s in sigmas.items()), "",
                  "| abstain_below | label acc (noise-free) | median margin | mean votes/query "
                  "| no-vote queries | " + " | ".join(f"noisy acc @ eps {t:g}" for t in TARGETS)
                  + " |", "|---|---|---|---|---|" + "---|" * len(TARGETS)]
        for tau in THRESHOLDS:
            fn = ae_dpfl.ballot_fn(model, tau)
            clean = np.asarray(vote.vote_sums(fn, trained.params, x,
                                              num_classes=ds.num_classes))       # [M, C]
            top = np.sort(clean, -1)
            votes = clean.sum(-1)
            acc = float(np.mean((np.argmax(clean, -1) == y) & (votes > 0)))
            noisy = []
            for t in TARGETS:
                accs = [np.mean(np.asarray(vote.mpc_vote(
                    jax.random.key(100 + r), fn, trained.params, x, sigmas[t],
                    num_classes=ds.num_classes)) == y) for r in range(5)]
                noisy.append(float(np.mean(accs)))
            lines.append(f"| {tau} | {acc:.3f} | {np.median(top[:, -1] - top[:, -2]):.1f} | "
                         f"{votes.mean():.1f} | {np.mean(votes == 0):.3f} | "
                         + " | ".join(f"{a:.3f}" for a in noisy) + " |")
            print(lines[-1], flush=True)
        lines.append(f"\n(N = {n}: {time.perf_counter() - t0:.0f} s)")
    text = "\n".join(lines)
    print(text)
    return text


if __name__ == "__main__":
    main()
