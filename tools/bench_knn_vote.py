"""Benchmark: kNN-DPFL voting (distances, per-agent top-k, noise, secure sum, argmax) at scale.

    python tools/bench_knn_vote.py --out results/bench/knn_vote.json
    fedjax-dp bench --only knn_vote    # the vote vs the matmul in one process (no memory figures)

Default workload (issue 3): N = 1000 agents x n = 600 local points x Q = 1000 queries x d = 64
features, C = 10 classes, k = 30 (the paper's 5% of the local size), and the same with
N = 10,000 in chunks of agents. Every configuration runs in a FRESH subprocess, and before each
timed function the peak-RSS mark is reset (``/proc/self/clear_refs``), so its working memory is
``VmHWM`` (peak RSS over its compile and run) minus the RSS just before it; generating the agents'
data (which itself grows with N: 0.15 GB at N = 1000, 1.5 GB at N = 10,000) is not counted. The
process-wide ``ru_maxrss`` is reported too.

Per configuration: the compiled function is built ahead of time (``jit(...).lower().compile()``,
compile time reported separately) and then timed as the best of ``--repeats`` calls (default 3;
all calls listed in ``walls_s``). The functions timed:

* ``distances``: the scores GEMMs alone, in the same blocks as the kNN search (``||b||^2 - 2 a.b``
  as one augmented GEMM per block, reduced with a min so nothing is dead code): the ceiling of
  this approach;
* ``clean``: the noise-free kNN vote sums (distances + top-k + label counts);
* ``vote``: the full MPC vote (``vote.mpc_vote``: + every agent's noise per query, secure sum,
  argmax);
* ``vote_aggregate``: the same vote with ``noise="aggregate"`` (the secure sum's noise drawn at
  once per query: the same distribution of released labels, Q C draws instead of N Q C).

``clean`` and ``vote`` use the default kNN method ``threshold`` (threshold search,
:mod:`fedjax_dp.ops.knn_search`); ``clean_top_k`` is ``clean`` with the straightforward
``lax.top_k`` method, timed in the same process for the ratio.

Achieved GFLOP/s counts the distance GEMM only, ``2 Q d N n`` FLOPs, and is compared with a large
float32 matmul measured in the same run (``bench_common.matmul_gflops``), before and after every
configuration; a configuration's ``fraction_of_matmul`` uses the faster of the two.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

from bench_common import environment, matmul_gflops, write_json  # tools/, the script's folder


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def _peak_mb() -> float:
    """Peak RSS since the last :func:`_reset_peak` (VmHWM), else the process's ru_maxrss."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0                   # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0     # KiB on Linux


def _reset_peak() -> bool:
    """Reset the peak-RSS high-water mark (Linux ``clear_refs`` 5); False if not permitted."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def child(args) -> dict:
    """One configuration, in this (fresh) process."""
    import jax
    import jax.numpy as jnp

    from fedjax_dp.algorithms.voting import knn_dpfl
    from fedjax_dp.bench import knn_vote
    from fedjax_dp.core import agent_mesh
    from fedjax_dp.ops import knn_search
    from fedjax_dp.privacy import vote

    n_agents, n, q, d, c, k = args.agents, args.local_size, args.queries, args.features, 10, args.k
    mesh = agent_mesh() if jax.device_count() > 1 else None
    chunk = args.agent_chunk or None
    agents, queries = jax.block_until_ready(knn_vote.workload(n_agents, n, q, d, c))
    rss_data, x = _rss_mb(), agents[0]
    fn = knn_dpfl.ballot_fn(k, c)

    def dist_only(ag, qs):         # the scores GEMMs of knn_search alone (same blocks), + a min
        xb, _, m = ag
        a = xb.shape[0]
        ab = knn_search.agent_block_size(a, knn_search.AGENT_BLOCK)
        qb = knn_search.query_block_size(q, knn_search.QUERY_BLOCK)
        xa = knn_search.augment_records(xb, m)
        xa = jnp.pad(xa, ((0, (-a) % ab), (0, 0), (0, 0))).reshape(-1, ab, n, d + 1)
        qa = knn_search.augment_queries(qs)
        qa = jnp.pad(qa, ((0, (-q) % qb), (0, 0))).reshape(-1, qb, d + 1)
        mins = jax.lax.map(lambda xblk: jax.lax.map(
            lambda qblk: jnp.min(knn_search.augmented_scores(xblk, qblk), axis=1), qa), xa)
        mins = jnp.transpose(mins, (0, 2, 1, 3)).reshape(-1, qa.shape[0] * qb)[:a, :q]
        return jnp.broadcast_to(mins[..., None], (a, q, c))

    def plan(name):
        if name == "clean_top_k":
            return jax.jit(lambda key, ag, qs: vote.noisy_tally(
                key, ag, qs, 0.0, ballot_fn=knn_dpfl.ballot_fn(k, c, "top_k"), num_classes=c,
                agent_chunk=chunk, query_chunk=None, noisy=False, mesh=mesh))
        if name in ("vote", "vote_aggregate"):
            noise = "aggregate" if name == "vote_aggregate" else "per_agent"
            return knn_vote.release_fn(k, c, "auto", chunk, mesh=mesh, noise=noise)
        f = fn if name == "clean" else dist_only
        return jax.jit(lambda key, ag, qs: vote.noisy_tally(
            key, ag, qs, 0.0, ballot_fn=f, num_classes=c, agent_chunk=chunk, query_chunk=None,
            noisy=False, mesh=mesh))

    out = {"agents": n_agents, "local_size": n, "queries": q, "features": d, "k": k,
           "devices": jax.device_count(),
           "classes": c, "agent_chunk": chunk, "data_mb": x.nbytes / 2 ** 20 * (1 + 2 / d),
           "rss_after_data_mb": rss_data}
    gemm_flops = 2.0 * q * d * n_agents * n
    for name in args.what.split(","):
        before = _rss_mb()
        reset = _reset_peak()
        t0 = time.perf_counter()
        compiled = plan(name).lower(jax.random.key(1), agents, queries).compile()
        compile_s = time.perf_counter() - t0
        walls = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            jax.block_until_ready(compiled(jax.random.key(1), agents, queries))
            walls.append(time.perf_counter() - t0)
        wall = min(walls)
        peak = _peak_mb()
        out[name] = {"wall_s": wall, "walls_s": walls, "compile_s": compile_s,
                     "gemm_gflops": gemm_flops / wall / 1e9, "peak_rss_mb": peak,
                     "working_mb": peak - before, "peak_reset": reset}
        del compiled
    out["process_peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--agents", type=int, default=1000)
    ap.add_argument("--local-size", type=int, default=600)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--features", type=int, default=64)
    ap.add_argument("--k", type=int, default=30)
    ap.add_argument("--agent-chunk", type=int, default=0, help="0: no chunking")
    ap.add_argument("--what", default="distances,clean,vote,vote_aggregate,clean_top_k")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls per function (best)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--configs", default="1000:0:1,1000:40:1,1000:40:2,10000:40:1",
                    help="comma-separated AGENTS:AGENT_CHUNK[:DEVICES] runs, each in a fresh "
                         "process; DEVICES > 1 forces that many CPU devices and splits the "
                         "agents over them (voting's mesh=)")
    ap.add_argument("--out", default="results/bench/knn_vote.json")
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args)))
        return {}

    # the matmul reference is measured before AND after every configuration (this shared VM's
    # speed drifts by up to ~2x between minutes); each configuration's fractions use the fastest
    # of its two neighbouring measurements (conservative: a slow spell never inflates a ratio)
    mms = [matmul_gflops()]
    print(f"float32 matmul 2048^3: {mms[-1]:.1f} GFLOP/s", flush=True)
    runs = []
    for spec in args.configs.split(","):
        parts = [int(v) for v in spec.split(":")]
        agents, chunk, devices = parts[0], parts[1], (parts[2] if len(parts) > 2 else 1)
        env = dict(os.environ)
        if devices > 1:
            env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_"
                                f"count={devices}").strip()
        cmd = [sys.executable, __file__, "--child", "--agents", str(agents),
               "--agent-chunk", str(chunk), "--local-size", str(args.local_size),
               "--queries", str(args.queries), "--features", str(args.features),
               "--k", str(args.k), "--what", args.what, "--repeats", str(args.repeats)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
        rec = json.loads(proc.stdout.strip().splitlines()[-1])
        mms.append(matmul_gflops())
        print(f"float32 matmul 2048^3: {mms[-1]:.1f} GFLOP/s", flush=True)
        mm = max(mms[-2:])
        rec["matmul_gflops"] = mm
        for name in args.what.split(","):
            rec[name]["fraction_of_matmul"] = rec[name]["gemm_gflops"] / mm
        rec["peak_rss_above_data_mb"] = {name: rec[name]["peak_rss_mb"] - rec["rss_after_data_mb"]
                                         for name in args.what.split(",")}
        if "clean" in rec and "clean_top_k" in rec:
            rec["threshold_speedup_vs_top_k"] = rec["clean_top_k"]["wall_s"] / rec["clean"]["wall_s"]
        runs.append(rec)
        print(json.dumps(rec), flush=True)
    record = {"benchmark": "knn_vote", "matmul_gflops": max(mms), "matmul_gflops_all": mms,
              "runs": runs, "environment": environment(), "command": " ".join(sys.argv)}
    write_json(args.out, record)
    return record


if __name__ == "__main__":
    main()
