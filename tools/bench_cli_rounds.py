"""The command line's round against the peers' plain-JAX reference, measured back to back.

The peers' DP-FedAvg shapes (1,000 agents x 64 records, dim 64, MLP 100, 4 local steps of batch
16; ``../shared/peers/workload.py``) run by ``fedjax-dp run`` as a user runs it (a subprocess,
``run.eval_every = 0``, ``run.checkpoint_every = 0``, Poisson sampling at ``sampling_rate`` q),
for ``--short`` and ``--long`` rounds; the CLI's seconds per round are

    (wall(long rounds) - wall(short rounds)) / (long - short)

(start-up, data generation and compilation cancel), beside the median round of
``jax_ref.py --engine map --chunk 10`` at the cohort qN, run right after on the same machine.
Also recorded: the long run's ``timing.compilations_after_first_call`` (a steady run compiles
nothing after its first call) and its median ``timing.round_s``. Writes one JSON.

    python tools/bench_cli_rounds.py --peers ../shared/peers --rates 0.01,1.0 --out results/bench/cli_rounds_cpu.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFIG = """seed = 0
[data]
dataset = "synthetic"
dataset_options = {{num_train = 64000, num_features = 64, num_test = 200, num_public = 0}}
partition = "iid"
num_agents = 1000
[model]
name = "mlp"
hidden = [100]
[train]
steps = 4
batch_size = 16
learning_rate = 0.1
batching = "stored"
[algorithm]
name = "dp_fedavg"
rounds = 30
sampling_rate = {rate}
clip_norm = 1.0
noise_multiplier = 1.0
server_lr = 1.0
[privacy]
accountants = ["rdp"]
[run]
eval_every = 0
checkpoint_every = 0
progress = false
rounds_per_call = {rpc}
"""


def cli_run(config: Path, rounds: int, cache: Path) -> tuple[float, dict]:
    """``fedjax-dp run config --set algorithm.rounds=R`` (a subprocess): wall seconds, record."""
    out = config.parent / f"run_{rounds}_{time.time_ns()}"
    exe = Path(sys.executable).with_name("fedjax-dp")
    cmd = ([str(exe)] if exe.exists() else [sys.executable, "-m", "fedjax_dp.experiments.cli"])
    env = dict(os.environ, FEDJAX_DP_CACHE_DIR=str(cache))
    start = time.perf_counter()
    res = subprocess.run(cmd + ["run", str(config), "--set", f"algorithm.rounds={rounds}",
                                "--out", str(out), "--quiet"], env=env, capture_output=True,
                         text=True)
    if res.returncode:
        sys.exit(f"fedjax-dp run failed (exit {res.returncode}):\n{res.stderr[-3000:]}")
    return time.perf_counter() - start, json.loads((out / "result.json").read_text())


def reference(peers: Path, cohorts: list[int], rounds: int) -> dict[int, float]:
    """Median seconds per round of ``jax_ref.py --engine map --chunk 10`` per cohort."""
    with tempfile.TemporaryDirectory() as raw:
        res = subprocess.run([sys.executable, str(peers / "jax_ref.py"), "--engine", "map",
                              "--chunk", "10", "--rounds", str(rounds), "--cohorts",
                              ",".join(map(str, cohorts))], check=True, capture_output=True,
                             text=True, env=dict(os.environ, PEERS_RAW_DIR=raw))
    out = {}
    for line in res.stdout.splitlines():
        m = re.match(r"C=(\d+): median ([0-9.]+)s/round", line)
        if m:
            out[int(m.group(1))] = float(m.group(2))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peers", default="../shared/peers", help="the peers' folder (jax_ref.py)")
    ap.add_argument("--rates", default="0.01,1.0", help="sampling rates q (cohort qN)")
    ap.add_argument("--short", type=int, default=30)
    ap.add_argument("--long", type=int, default=330)
    ap.add_argument("--ref-rounds", type=int, default=20)
    ap.add_argument("--rounds-per-call", default="auto")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    rpc = args.rounds_per_call if args.rounds_per_call == "auto" else int(args.rounds_per_call)
    rpc_toml = f'"{rpc}"' if rpc == "auto" else str(rpc)
    import jax
    record = {"machine": {"platform": platform.platform(), "processor": platform.processor(),
                          "cpus": os.cpu_count(), "jax": jax.__version__,
                          "devices": [str(d) for d in jax.devices()],
                          "load_avg": os.getloadavg()},
              "short_rounds": args.short, "long_rounds": args.long,
              "rounds_per_call": rpc, "rates": {}}
    with tempfile.TemporaryDirectory(prefix="cli_rounds_") as tmp:
        tmp = Path(tmp)
        for q in rates:
            config = tmp / f"peers_q{q}.toml"
            config.write_text(CONFIG.format(rate=q, rpc=rpc_toml))
            cli_run(config, args.short, tmp / "cache")              # warms the cache
            t_short, _ = cli_run(config, args.short, tmp / "cache")
            t_long, rec = cli_run(config, args.long, tmp / "cache")
            cohort = max(1, round(q * 1000))
            ref = reference(Path(args.peers), [cohort], args.ref_rounds)[cohort]
            per_round = (t_long - t_short) / (args.long - args.short)
            row = {"cohort": cohort, "cli_s_per_round": per_round,
                   "cli_median_round_s": statistics.median(rec["timing"]["round_s"]),
                   "reference_median_s": ref, "cli_over_reference": per_round / ref,
                   "cli_short_wall_s": t_short, "cli_long_wall_s": t_long,
                   "compilations": rec["timing"]["compilations"],
                   "compilations_after_first_call":
                       rec["timing"].get("compilations_after_first_call"),
                   "cohort_execution": rec.get("cohort"),
                   "test_accuracy": rec["test_accuracy"]}
            record["rates"][str(q)] = row
            print(f"q={q} (cohort {cohort}): CLI {per_round * 1e3:.3f} ms/round, reference "
                  f"{ref * 1e3:.3f} ms: {row['cli_over_reference']:.2f}x; "
                  f"{row['compilations_after_first_call']} compilations after the first call",
                  flush=True)
    record["load_avg_end"] = os.getloadavg()
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
