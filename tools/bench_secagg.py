"""Benchmark: plain vs secure aggregation, for the MPC vote and the DP-FedAvg round.

Parts (one JSON record, ``results/secagg/bench.json`` by default):

* ``vote``: the streamed vote of AE-DPFL on stored ballots (N agents x Q queries, C classes, in
  chunks of S agents): the plain tally (:func:`fedjax_dp.algorithms.voting.vote_lib.tally_add` /
  ``tally_release``) vs secure aggregation with J talliers
  (:func:`~fedjax_dp.algorithms.voting.vote_lib.secagg_tally_add`, shares per chunk,
  :func:`fedjax_dp.privacy.secagg_shares.release_labels`); per-agent noise shares in both.
  Seconds per vote (median after a warm-up) and the ratio; the labels are checked equal.
* ``sum``: the cohort sum alone, ``[B, d]`` float32 updates: ``masked_sum`` vs
  :func:`fedjax_dp.privacy.secagg_masks.secure_sum` (encode, pairwise masks on a k-regular graph,
  server sum, dropout recovery, decode) for several k (None = complete graph): cost O(B k d).
* ``round``: one DP-FedAvg round (MLP, local SGD, clipping, noise; all N agents) through
  :class:`fedjax_dp.algorithms.averaging.rounds.RoundRunner`, plain vs secagg (k = 8).

Run: ``.venv/bin/python tools/bench_secagg.py [--out results/secagg/bench.json] [--small]``.
Timings on a shared CPU are noisy: compare ratios measured in the same run.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _median_time(fn, repeats: int) -> float:
    jax.block_until_ready(fn())                                        # warm-up / compile
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_vote(n: int, q: int, c: int, chunk: int, talliers: int, repeats: int) -> dict:
    from fedjax_dp.privacy import vote as vote_lib
    from fedjax_dp.privacy import secagg_shares
    rng = np.random.default_rng(0)
    ballots = rng.integers(0, c, size=(n, q)).astype(np.int8)
    key, share_key = jax.random.split(jax.random.key(0))
    sigma, std = jnp.float32(5.0), jnp.float32(5.0 / math.sqrt(n))
    blocks = []
    for start in range(0, n, chunk):
        b = ballots[start:start + chunk]
        pad = chunk - len(b)
        if pad:
            b = np.concatenate([b, np.full((pad, q), -1, np.int8)])
        blocks.append((jnp.asarray(b), jnp.arange(start, start + chunk),
                       jnp.arange(chunk) < chunk - pad))
    alive = jnp.ones((n,), bool)

    def plain():
        t = vote_lib.tally_init(q, c)
        for b, ids, valid in blocks:
            t = vote_lib.tally_add(t, key, b, ids, valid, std, num_classes=c, per_agent=True)
        return vote_lib.tally_release(t, key, sigma, jnp.float32(1.0), noise="per_agent")

    def secure():
        t = vote_lib.tally_init(q, c)._replace(
            shares=secagg_shares.tally_init(talliers, (q, c)))
        for b, ids, valid in blocks:
            t = vote_lib.secagg_tally_add(t, key, share_key, b, ids, valid, alive, std,
                                             jnp.float32(1.0), num_classes=c, per_agent=True,
                                             frac_bits=16)
        return secagg_shares.release_labels(t.shares, frac_bits=16)

    same = bool(np.array_equal(np.asarray(plain()), np.asarray(secure())))
    tp, ts = _median_time(plain, repeats), _median_time(secure, repeats)
    return {"agents": n, "queries": q, "classes": c, "agent_chunk": chunk, "talliers": talliers,
            "plain_s": tp, "secagg_s": ts, "ratio": ts / tp, "same_labels": same}


def bench_sum(b: int, d: int, ks: list, repeats: int) -> list[dict]:
    from fedjax_dp.core import cohort
    from fedjax_dp.privacy import secagg, secagg_masks
    x = jnp.asarray(np.random.default_rng(1).normal(size=(b, d)).astype(np.float32) * 0.01)
    ids = jnp.arange(b)
    valid = jnp.ones((b,), bool)
    plain = jax.jit(cohort.masked_sum)
    tp = _median_time(lambda: plain(x, valid), repeats)
    out = []
    for k in ks:
        cfg = secagg.SecAggConfig(frac_bits=16, neighbours=k)
        ts = _median_time(lambda: secagg_masks.secure_sum_jit(jax.random.key(2), x, ids, valid,
                                                              cfg), repeats)
        err = float(jnp.max(jnp.abs(secagg_masks.secure_sum_jit(jax.random.key(2), x, ids, valid,
                                                                cfg) - plain(x, valid))))
        out.append({"agents": b, "dim": d, "neighbours": "complete" if k is None else k,
                    "plain_s": tp, "secagg_s": ts, "ratio": ts / tp, "max_abs_error": err,
                    "error_bound": b * 2.0 ** -17})
    return out


def bench_round(n: int, ks: list, repeats: int) -> list[dict]:
    import dataclasses
    from fedjax_dp.algorithms import rounds
    from fedjax_dp.algorithms.averaging import dp_fedavg
    from fedjax_dp.core import from_ragged
    from fedjax_dp.models import make_model
    from fedjax_dp.stages import Setup
    from fedjax_dp.train import LocalTrainConfig
    rng = np.random.default_rng(3)
    ys = [rng.integers(0, 10, size=32) for _ in range(n)]
    xs = [rng.normal(size=(32, 32)).astype(np.float32) + y[:, None] * 0.1 for y in ys]
    data = from_ragged(xs, ys)
    model = make_model("mlp", (32,), 10, hidden=(64,))
    params = model.init(jax.random.key(0))
    dim = sum(int(np.prod(l.shape)) for l in jax.tree.leaves(params))
    base = dp_fedavg.Config(rounds=1, sampling_rate=1.0, clip_norm=1.0, noise_multiplier=1.0,
                            local=LocalTrainConfig(steps=4, batch_size=16, learning_rate=0.1))
    rows = []
    times = {}
    for label, cfg in [("plain", base)] + [
            (f"secagg_k={'complete' if k is None else k}",
             dataclasses.replace(base, aggregation="secagg", secagg_neighbours=k)) for k in ks]:
        chain = dp_fedavg.chain(cfg, model)
        runner = rounds.RoundRunner(chain, Setup(data.num_agents, cfg.rounds), data)
        view = {"params": params, "stages": chain.init_state(jax.random.key(0), params, n)}
        times[label] = _median_time(lambda: runner(jax.random.key(1), view)[0], repeats)
    for label, t in times.items():
        rows.append({"agents": n, "params": dim, "aggregation": label, "round_s": t,
                     "ratio_to_plain": t / times["plain"]})
    return rows


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "results" / "secagg" / "bench.json"))
    ap.add_argument("--small", action="store_true", help="tiny sizes (a smoke run)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    if args.small:
        vote_args, sum_args, round_n = (64, 16, 10, 32, 2), (16, 256, [2, None]), 16
    else:
        vote_args, sum_args, round_n = (2000, 200, 10, 500, 2), (100, 10_000, [4, 16, None]), 100
    start = time.perf_counter()
    record = {
        "device": str(jax.devices()[0]), "backend": jax.default_backend(),
        "note": "median seconds after one warm-up; shared CPU, compare ratios within this run",
        "vote": [bench_vote(*vote_args, repeats=args.repeats),
                 bench_vote(*vote_args[:4], 3, repeats=args.repeats)],
        "sum": bench_sum(*sum_args, repeats=args.repeats),
        "round": bench_round(round_n, [8], repeats=args.repeats),
    }
    record["wall_s"] = time.perf_counter() - start
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))
    return record


if __name__ == "__main__":
    main()
