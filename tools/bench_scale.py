"""Scale benchmark: rounds that cost the cohort, and populations up to a million agents.

Parts (each writes into one JSON record, ``results/scale/bench_scale.json`` by default):

* ``peers``: the fixed DP-FedAvg workload of ``../shared/peers`` (1,000 clients x 64 examples,
  MLP 64-100-10, 4 local SGD steps of batch 16 in stored order, clip 1, noise 1, a uniformly
  random cohort of exactly C clients, divided by C) at C = 10 / 100 / 1,000, seconds per round
  (median of 5 after 2 warm-up rounds): this library's gathered round (``sampling = "fixed"``,
  ``train.batching = "stored"``), its masked all-agent round (what every round cost before), the
  plain-JAX reference ``jax_ref.py --engine map --chunk 10`` and fedjax 0.0.17
  (``fedjax_peer.py``, from the Python of ``--fedjax-python``, default ``runs/fedjax_venv``:
  ``python -m venv runs/fedjax_venv && runs/fedjax_venv/bin/pip install fedjax==0.0.17 jax``),
  both in subprocesses of the same run, ``--repeats`` times, alternating; fedjax's figure from
  the peers' README is kept beside them as quoted. First, the workload's check: one noiseless
  round of all 1,000 clients from the shared initial weights must give the parameter norm
  14.735746 of every correct implementation (recorded, and the run stops if it does not).
* ``cli``: the same shapes through ``fedjax-dp run`` (a subprocess, as a user runs it),
  seconds per round as the difference of a 330- and a 30-round run, beside this tool's own
  round on the same shapes in the same run (:func:`cli_part`).
* ``population``: DP-FedAvg (Poisson sampling, expected cohort 1,000) over N = 1e3 ... 1e6
  synthetic host-resident agents (16 records x 32 features, MLP 32-64-10), each N in a fresh
  subprocess: seconds per round (median), compilations (bucket sizes), and peak RSS next to the
  agents' data size.
* ``oneshot``: AE-DPFL and kNN-DPFL end to end (``tools/bench_scale_oneshot.py``).

``fedjax-dp bench`` (:mod:`fedjax_dp.bench`) runs the peers' workload against the plain-JAX
reference (re-expressed in the package) and AE-DPFL at N = 100,000 in one process.

Run: ``.venv/bin/python tools/bench_scale.py [--parts peers,population,oneshot] [--agents
1000,10000,100000,1000000]``; ``--plot`` redraws the figure from the JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
FEDJAX_PEER_S = {"10": 0.013, "100": 0.107, "1000": 0.99}   # ../shared/peers/README.md


def load_workload(peers: Path):
    """The peers' shared workload definition, ``PEERS/workload.py``, as a module (loaded from
    its file: no ``sys.path`` edit)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("workload", Path(peers) / "workload.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20   # KiB on Linux


def _time_rounds(step, state, rounds: int, warmup: int) -> tuple[list[float], object]:
    import jax
    from fedjax_dp.algorithms import api
    key = jax.random.key(0)
    times = []
    for t in range(warmup + rounds):
        start = time.perf_counter()
        state, metrics = step(state, api.step_key(key, t))
        jax.block_until_ready((state.values, metrics))
        if t >= warmup:
            times.append(time.perf_counter() - start)
    return times, state


# --------------------------------------------------------------------------- peers workload

def _peer_medians(python: str, script: Path, extra: list[str], cohorts: str,
                  rounds: int) -> dict:
    """A peer program (``jax_ref.py`` / ``fedjax_peer.py``) in a subprocess: its per-cohort
    median seconds per round."""
    env = dict(os.environ, PEERS_RAW_DIR=str(ROOT / "runs" / "peers_raw"))
    proc = subprocess.run([python, str(script), *extra, "--rounds", str(rounds), "--cohorts",
                           cohorts], capture_output=True, text=True, env=env, check=True)
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT "))
    res = json.loads(line[len("RESULT "):])
    return {str(c): v["median_s"] for c, v in res["cohorts"].items()}


def _peers_setup(W):
    import jax
    from fedjax_dp.algorithms import api
    from fedjax_dp.core import from_arrays
    from fedjax_dp.models import make_model
    from fedjax_dp.train import LocalTrainConfig

    x, y = W.make_data()
    counts = np.full((W.NUM_CLIENTS,), W.EXAMPLES_PER_CLIENT, np.int32)
    host = from_arrays(x, y.astype(np.int32), counts)
    data = api.FederatedData(agents=host.on_device(), num_classes=W.NUM_CLASSES)
    model = make_model("mlp", (W.DIM,), W.NUM_CLASSES, hidden=(W.HIDDEN,))
    local = LocalTrainConfig(steps=W.LOCAL_STEPS, batch_size=W.BATCH, learning_rate=W.CLIENT_LR,
                             batching="stored")
    w = W.init_params()                                  # the workload's shared initial weights
    params = jax.tree.map(jax.numpy.asarray, {"params": {
        "Dense_0": {"kernel": w["w1"], "bias": w["b1"]},
        "Dense_1": {"kernel": w["w2"], "bias": w["b2"]}}})
    return x, y, data, model, local, params


def _peers_config(W, local, cohort: int, noise: float, rounds: int):
    from fedjax_dp.algorithms.averaging import dp_fedavg
    return dp_fedavg.Config(rounds=rounds, sampling="fixed", cohort_size=cohort,
                            clip_norm=W.CLIP, noise_multiplier=noise, server_lr=W.SERVER_LR,
                            local=local)


def peers_check(W) -> dict:
    """The workload's correctness check: one noiseless round of all clients from the shared
    initial weights (every correct implementation: parameter norm 14.735746, loss 1.5137)."""
    import jax
    from fedjax_dp.algorithms import api
    from fedjax_dp.algorithms.averaging import dp_fedavg
    x, y, data, model, local, params = _peers_setup(W)
    cfg = _peers_config(W, local, W.NUM_CLIENTS, 0.0, 1)
    state = dp_fedavg.init(jax.random.key(0), data, model, cfg)
    state = api.State(step=0, values={**state.values, "params": params}, context=state.context)
    state, _ = dp_fedavg.step(state, api.step_key(jax.random.key(0), 0))
    p = state.values["params"]["params"]
    names = {"w1": p["Dense_0"]["kernel"], "b1": p["Dense_0"]["bias"],
             "w2": p["Dense_1"]["kernel"], "b2": p["Dense_1"]["bias"]}
    got = W.checksum({k: np.asarray(v) for k, v in names.items()}, x, y)
    return {**got, "expected_param_norm": 14.735746,
            "ok": abs(got["param_norm"] - 14.735746) < 1e-4}


def _ours(W, cohorts: list[int], rounds: int, warmup: int) -> tuple[dict, dict, dict]:
    import jax
    from fedjax_dp.algorithms import api
    from fedjax_dp.algorithms.averaging import dp_fedavg
    _, _, data, model, local, params = _peers_setup(W)
    gathered, masked, passes = {}, {}, {}
    for c in cohorts:
        cfg = _peers_config(W, local, c, W.NOISE_MULTIPLIER, warmup + rounds)
        for mode in ("gather", "masked"):
            state = dp_fedavg.init(jax.random.key(1), data, model, cfg, api.Runtime(cohort=mode))
            state = api.State(step=0, values={**state.values, "params": params}, context=state.context)
            times, state = _time_rounds(dp_fedavg.step, state, rounds, warmup)
            (gathered if mode == "gather" else masked)[str(c)] = statistics.median(times)
            if mode == "gather":
                passes[str(c)] = list(state.context.round_fn.compiled_pass_sizes)
        print(f"peers C={c}: gathered {gathered[str(c)]:.4f} s, masked {masked[str(c)]:.4f} s",
              flush=True)
    return gathered, masked, passes


def peers_part(peers: Path, cohorts: list[int], rounds: int, warmup: int, repeats: int,
               fedjax_python: str) -> dict:
    W = load_workload(peers)
    check = peers_check(W)
    print(f"peers check: param norm {check['param_norm']} (expected 14.735746), loss "
          f"{check['loss_all']}", flush=True)
    if not check["ok"]:
        raise SystemExit(f"the peers' workload check failed: {check}")
    out = {"check": check, "repeats": []}
    cs = ",".join(map(str, cohorts))
    has_fedjax = Path(fedjax_python).exists()
    if not has_fedjax:
        print(f"fedjax: {fedjax_python} not found; only the quoted figures", flush=True)
    for r in range(repeats):                 # alternate the systems: drift hits all alike
        gathered, masked, passes = _ours(W, cohorts, rounds, warmup)
        rep = {"ours_gathered_s": gathered, "ours_masked_s": masked,
               "compiled_pass_sizes": passes,
               "jax_ref_map10_s": _peer_medians(sys.executable, peers / "jax_ref.py",
                                                ["--engine", "map", "--chunk", "10"], cs,
                                                rounds)}
        if has_fedjax:
            rep["fedjax_0.0.17_s"] = _peer_medians(fedjax_python, peers / "fedjax_peer.py",
                                                   ["--algo", "dpfedavg"], cs, rounds)
        ours, ref = rep["ours_gathered_s"], rep["jax_ref_map10_s"]
        rep["ratio_vs_jax_ref"] = {c: ours[c] / ref[c] for c in ours}
        if has_fedjax:
            rep["fedjax_over_ours"] = {c: rep["fedjax_0.0.17_s"][c] / ours[c] for c in ours}
        small, large = str(min(cohorts)), str(max(cohorts))
        rep["smallest_over_largest_cohort"] = ours[small] / ours[large]
        print(json.dumps({k: rep[k] for k in ("ratio_vs_jax_ref", "fedjax_over_ours",
                                              "smallest_over_largest_cohort") if k in rep}),
              flush=True)
        out["repeats"].append(rep)
    out["fedjax_0.0.17_s_quoted"] = FEDJAX_PEER_S
    out["fedjax_quoted_over_ours"] = {
        c: FEDJAX_PEER_S[c] / statistics.median(r["ours_gathered_s"][c] for r in out["repeats"])
        for c in FEDJAX_PEER_S}
    return out


# --------------------------------------------------------------------------- the CLI's rounds

CLI_CONFIG = """seed = 0
[data]
dataset = "synthetic"
dataset_options = {{num_train = {n}, num_features = {d}, num_test = 200, num_public = 0}}
partition = "iid"
num_agents = {clients}
[model]
name = "mlp"
hidden = [{hidden}]
[train]
steps = {steps}
batch_size = {batch}
learning_rate = {lr}
batching = "stored"
[algorithm]
name = "dp_fedavg"
rounds = 30
sampling = "fixed"
cohort_size = {cohort}
clip_norm = {clip}
noise_multiplier = {noise}
server_lr = {server_lr}
[privacy]
accountants = ["rdp"]
[run]
eval_every = 0
checkpoint_every = 0
progress = false
"""


def _cli_seconds(config: Path, rounds: int, cache: Path) -> tuple[float, dict]:
    """``fedjax-dp run config --set algorithm.rounds=R`` as a user runs it (a subprocess, the
    persistent compilation cache in ``cache``): its wall seconds and result record."""
    out = config.parent / f"run_{rounds}_{time.time_ns()}"
    env = dict(os.environ, FEDJAX_DP_CACHE_DIR=str(cache))
    start = time.perf_counter()
    subprocess.run([str(Path(sys.executable).with_name("fedjax-dp")), "run", str(config),
                    "--set", f"algorithm.rounds={rounds}", "--out", str(out), "--quiet"],
                   check=True, env=env, capture_output=True)
    wall = time.perf_counter() - start
    return wall, json.loads((out / "result.json").read_text())


def cli_part(peers: Path, cohorts: list[int], short: int, long: int, rounds: int,
             warmup: int) -> dict:
    """The peers' shapes through ``fedjax-dp run`` (synthetic records of the same shapes: 1,000
    agents x 64 records x 64 features, MLP 100, 4 local steps of batch 16 in stored order, a
    fixed cohort of C, no evaluation, no checkpoints): seconds per round as the difference of
    a ``long``- and a ``short``-round run over their round difference (each run's start-up and
    compilations cancel; the cache is warmed by a first run), and the median of the long run's
    own per-round seconds (``timing.round_s``), beside this tool's own gathered round on the
    same shapes (median of ``rounds`` after ``warmup``) measured in the same process."""
    import tempfile
    W = load_workload(peers)
    own, _, _ = _ours(W, cohorts, rounds, warmup)
    out = {"short_rounds": short, "long_rounds": long}
    with tempfile.TemporaryDirectory(prefix="bench_cli_") as tmp:
        tmp = Path(tmp)
        # "fixed": the tool's own round (a fixed cohort, records in stored order); "poisson":
        # the shipped configs' kind (Poisson sampling at q = C / N, uniform batches)
        for kind in ("fixed", "poisson"):
            for c in cohorts:
                config = tmp / f"peers_{kind}_c{c}.toml"
                config.write_text(CLI_CONFIG.format(
                    n=W.NUM_CLIENTS * W.EXAMPLES_PER_CLIENT, d=W.DIM, clients=W.NUM_CLIENTS,
                    hidden=W.HIDDEN, steps=W.LOCAL_STEPS, batch=W.BATCH, lr=W.CLIENT_LR,
                    cohort=c, clip=W.CLIP, noise=W.NOISE_MULTIPLIER, server_lr=W.SERVER_LR))
                if kind == "poisson":
                    text = config.read_text().replace('batching = "stored"',
                                                      'batching = "replacement"')
                    text = text.replace('sampling = "fixed"\ncohort_size = ' + str(c),
                                        f"sampling_rate = {c / W.NUM_CLIENTS}")
                    config.write_text(text)
                _cli_seconds(config, long, tmp / "cache")          # warms the cache (buckets)
                t_short, _ = _cli_seconds(config, short, tmp / "cache")
                t_long, rec = _cli_seconds(config, long, tmp / "cache")
                per_round = (t_long - t_short) / (long - short)
                steady = statistics.median(rec["timing"]["round_s"][short:])
                row = {"cli_s_per_round": per_round, "cli_median_round_s": steady,
                       "tool_gathered_s": own[str(c)], "cli_over_tool": per_round / own[str(c)],
                       "cli_short_run_s": t_short, "cli_long_run_s": t_long,
                       "cache_hits": rec["timing"]["cache_hits"],
                       "compilations": rec["timing"]["compilations"]}
                out.setdefault(kind, {})[str(c)] = row
                print(f"cli {kind} C={c}: {per_round:.4f} s/round (median {steady:.4f}) vs the "
                      f"tool's fixed-cohort round {own[str(c)]:.4f}: "
                      f"{row['cli_over_tool']:.2f}x", flush=True)
    return out


# --------------------------------------------------------------------------- population sweep

def population_worker(num_agents: int, cohort: int, rounds: int, warmup: int,
                      records: int, features: int, hidden: int) -> dict:
    """One N in this (fresh) process: host-resident synthetic agents, DP-FedAvg rounds."""
    import jax
    from fedjax_dp.algorithms import api
    from fedjax_dp.algorithms.averaging import dp_fedavg
    from fedjax_dp.core import from_arrays
    from fedjax_dp.models import make_model
    from fedjax_dp.train import LocalTrainConfig

    rss0 = _peak_rss_gb()
    rng = np.random.default_rng(0)
    means = rng.standard_normal((10, features), dtype=np.float32)
    y = rng.integers(0, 10, size=(num_agents, records), dtype=np.int32)
    x = rng.standard_normal((num_agents, records, features), dtype=np.float32)
    for start in range(0, num_agents, 65536):          # in place, no second copy of the data
        x[start:start + 65536] += means[y[start:start + 65536]]
    agents = from_arrays(x, y, np.full((num_agents,), records, np.int32))
    data = api.FederatedData(agents=agents, num_classes=10)
    model = make_model("mlp", (features,), 10, hidden=(hidden,))
    cfg = dp_fedavg.Config(rounds=warmup + rounds, sampling_rate=min(1.0, cohort / num_agents),
                           clip_norm=1.0, noise_multiplier=1.0,
                           local=LocalTrainConfig(steps=4, batch_size=16, learning_rate=0.1))
    t0 = time.perf_counter()
    state = dp_fedavg.init(jax.random.key(0), data, model, cfg)
    key = jax.random.key(0)
    times = []
    for t in range(warmup + rounds):
        start = time.perf_counter()
        state, metrics = dp_fedavg.step(state, api.step_key(key, t))
        if t + 1 < warmup + rounds:
            dp_fedavg.prefetch(state, api.step_key(key, t + 1))
        jax.block_until_ready((state.values, metrics))
        if t >= warmup:
            times.append(time.perf_counter() - start)
    return {"num_agents": num_agents, "expected_cohort": cohort,
            "round_s_median": statistics.median(times), "round_s_all": times,
            "total_s": time.perf_counter() - t0,
            "compiled_pass_sizes": list(state.context.round_fn.compiled_pass_sizes),
            "buckets": list(state.context.round_fn.plan.buckets),
            "data_gb": agents.nbytes / 2 ** 30, "peak_rss_gb": _peak_rss_gb(),
            "rss_before_data_gb": rss0}


def population_part(agents_list: list[int], args) -> list[dict]:
    rows = []
    for n in agents_list:
        cmd = [sys.executable, __file__, "--worker", str(n), "--cohort", str(args.cohort),
               "--rounds", str(args.rounds), "--warmup", str(args.warmup)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            rows.append({"num_agents": n, "error": proc.stderr.strip().splitlines()[-1:]})
            print(f"N={n}: FAILED {rows[-1]['error']}", flush=True)
            continue
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        r = rows[-1]
        print(f"N={n}: {r['round_s_median']:.4f} s/round, peak RSS {r['peak_rss_gb']:.2f} GB "
              f"(data {r['data_gb']:.3f} GB), passes {r['compiled_pass_sizes']}", flush=True)
    return rows


# --------------------------------------------------------------------------- plot

def plot(record: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    pop = [r for r in record.get("population", []) if "error" not in r]
    if pop:
        n = [r["num_agents"] for r in pop]
        a.loglog(n, [r["round_s_median"] for r in pop], "o-", label="DP-FedAvg round (cohort 1,000)")
        b.loglog(n, [r["peak_rss_gb"] for r in pop], "o-", label="DP-FedAvg peak RSS")
        b.loglog(n, [r["data_gb"] for r in pop], "k--", label="agents' data")
    oneshot = [r for r in (record.get("oneshot") or {}).get("rows", []) if "error" not in r]
    for name in sorted({r["algorithm"] for r in oneshot}):
        rows = sorted((r for r in oneshot if r["algorithm"] == name),
                      key=lambda r: r["num_agents"])
        n = [r["num_agents"] for r in rows]
        a.loglog(n, [r["wall_s"] for r in rows], "s-", label=f"{name} end to end")
        b.loglog(n, [r["peak_rss_bytes"] / 2 ** 30 for r in rows], "s-",
                 label=f"{name} peak RSS")
    a.set_xlabel("agents N")
    a.set_ylabel("seconds")
    a.set_title("time vs population")
    b.set_xlabel("agents N")
    b.set_ylabel("GiB")
    b.set_title("peak memory vs population")
    for ax in (a, b):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parts", default="peers,cli,population,oneshot")
    ap.add_argument("--cli-cohorts", default="10,1000", help="cli part: the cohorts")
    ap.add_argument("--agents", default="1000,10000,100000,1000000")
    ap.add_argument("--oneshot-agents", default="1000,10000,100000,1000000")
    ap.add_argument("--cohorts", default="10,100,1000")
    ap.add_argument("--cohort", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--peers", default=str(ROOT.parent / "shared" / "peers"))
    ap.add_argument("--repeats", type=int, default=3, help="peers part: runs of every system")
    ap.add_argument("--fedjax-python", default=str(ROOT / "runs" / "fedjax_venv" / "bin" /
                                                   "python"))
    ap.add_argument("--out", default=str(ROOT / "results" / "scale" / "bench_scale.json"))
    ap.add_argument("--plot", action="store_true", help="only redraw the figure from --out")
    ap.add_argument("--worker", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(population_worker(args.worker, args.cohort, args.rounds, args.warmup,
                                           records=16, features=32, hidden=64)))
        return
    out = Path(args.out)
    png = out.with_suffix(".png")
    if args.plot:
        plot(json.loads(out.read_text()), png)
        return
    from bench_common import environment, matmul_gflops, write_json
    record = json.loads(out.read_text()) if out.exists() else {}
    record["environment"] = environment()
    record["matmul_gflops"] = matmul_gflops()
    parts = args.parts.split(",")
    if "peers" in parts:
        record["peers"] = peers_part(Path(args.peers), [int(c) for c in args.cohorts.split(",")],
                                     args.rounds, args.warmup, args.repeats, args.fedjax_python)
        write_json(out, record)
    if "cli" in parts:
        record["cli"] = cli_part(Path(args.peers), [int(c) for c in args.cli_cohorts.split(",")],
                                 30, 330, args.rounds, args.warmup)
        write_json(out, record)
    if "population" in parts:
        record["population"] = population_part([int(n) for n in args.agents.split(",")], args)
        write_json(out, record)
    if "oneshot" in parts:
        import bench_scale_oneshot
        record["oneshot"] = bench_scale_oneshot.run(
            [int(n) for n in args.oneshot_agents.split(",")])
        write_json(out, record)
    write_json(out, record)
    plot(record, png)


if __name__ == "__main__":
    main()
