"""SIGINT and SIGTERM at every phase of a small ``fedjax-dp run``, each run then resumed.

One uninterrupted run gives the reference (history without timings, test accuracy, privacy).
Then, for each signal, ``--tries`` runs each get the signal at a moment of one of four phases,
in turn: *start-up* (a delay in [0, 1.5] s, while Python imports the library), *set-up* (a delay
in [0, 1] s after ``config.json`` appears: the data loads, the first round compiles), *rounds*
(right after progress line k appears, k uniform in 1..R-1: with ``run.checkpoint_every = 1``
each round's checkpoint is being written then) and *final write* (right after the last round's
line: evaluation, accounting and ``result.json``). A run that ended before its moment is tried
again (up to 5 times) and counted. Each interrupted run must exit with 128 + signum and end in
ONE stop line (no traceback, no ``Exception ignored``); the command the line names
(``--resume DIR``, or ``CONFIG --resume DIR`` / the same command before the run began) must then
finish the run, equal to the reference. The phase each signal landed in is also read off the
stop line. Writes one JSON (every try, and the counts).

    python tools/bench_signal_storm.py --tries 20 --out results/robustness/signal_storm.json
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFIG = """seed = 0
[data]
dataset = "wbcd"
partition = "iid"
num_agents = 8
[model]
name = "mlp"
hidden = [16]
[train]
steps = 2
batch_size = 8
learning_rate = 0.1
[algorithm]
name = "dp_fedavg"
rounds = 40
sampling_rate = 0.5
clip_norm = 1.0
noise_multiplier = 1.0
[run]
eval_every = 8
checkpoint_every = 1
rounds_per_call = 1
[privacy]
delta = 1e-5
accountants = ["rdp"]
"""


def _cli() -> list[str]:
    return [sys.executable, "-c", "import sys; from fedjax_dp.experiments.cli import main; "
                                  "sys.exit(main(exiting=True))"]


def _same(result: dict) -> dict:
    untimed = [{k: v for k, v in r.items() if not k.endswith("_s") and k != "seconds"
                and k != "compilations"} for r in result["history"]]
    return {"history": untimed, "test_accuracy": result["test_accuracy"],
            "privacy": result["privacy"]}


def _phase(line: str, rc: int) -> str:
    if rc == 0:
        return "after the exit (finished first)"
    if "before the run began" in line:
        return "start-up (before the run began)"
    if "had finished" in line:
        return "after the final write"
    m = re.search(r"stopped after round (\d+) of (\d+)", line)
    if m:
        k, n = int(m.group(1)), int(m.group(2))
        return "set-up / compilation (round 0)" if k == 0 else \
            ("final write" if k == n else "rounds and checkpoints")
    return "unknown"


def _lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except OSError:
        return 0


def _send_at(proc: subprocess.Popen, out: Path, aim: str, sig: int, rng: random.Random,
             rounds: int) -> float | None:
    """Send ``sig`` at a moment of phase ``aim``; the seconds since the start, or None when the
    run ended first."""
    start = time.perf_counter()
    if aim == "start-up":
        time.sleep(rng.uniform(0.0, 1.5))
    elif aim == "set-up":
        while not (out / "config.json").exists() and proc.poll() is None:
            time.sleep(0.002)
        time.sleep(rng.uniform(0.0, 1.0))
    else:
        want = rng.randint(1, rounds - 1) if aim == "rounds" else rounds
        while _lines(out / "progress.jsonl") < want and proc.poll() is None:
            time.sleep(0.0005)
    if proc.poll() is not None:
        return None
    proc.send_signal(sig)
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tries", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="JSON file to write")
    args = ap.parse_args()
    if args.tries < 1:
        ap.error("--tries must be >= 1")
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="signal_storm_"))
    cfg = work / "storm.toml"
    cfg.write_text(CONFIG)
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    start = time.perf_counter()
    subprocess.run(_cli() + ["run", str(cfg), "--out", str(work / "ref"), "--quiet"], env=env,
                   check=True, capture_output=True)
    wall = time.perf_counter() - start
    reference = _same(json.loads((work / "ref" / "result.json").read_text()))
    tries = []
    phases_cycle = ("start-up", "set-up", "rounds", "final write")
    rounds = int(re.search(r"rounds = (\d+)", CONFIG).group(1))
    missed = 0
    for sig in (signal.SIGINT, signal.SIGTERM):
        for i in range(args.tries):
            aim = phases_cycle[i % len(phases_cycle)]
            for attempt in range(5):
                out = work / f"{sig.name}_{i}_{attempt}"
                proc = subprocess.Popen(_cli() + ["run", str(cfg), "--out", str(out),
                                                  "--quiet"], env=env, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True)
                sent = _send_at(proc, out, aim, sig, rng, rounds)
                if sent is not None:
                    break
                proc.communicate(timeout=600)
                missed += 1
            delay = sent or 0.0
            stdout, stderr = proc.communicate(timeout=600)
            lines = [x for x in stderr.strip().splitlines() if x.strip()]
            last = lines[-1] if lines else ""
            row = {"signal": sig.name, "aimed_at": aim, "sent_at_s": round(delay, 3),
                   "rc": proc.returncode,
                   "stop_line": last, "phase": _phase(last, proc.returncode),
                   "stderr_lines": len(lines),
                   "swallowed": "Exception ignored" in stderr, "traceback": "Traceback" in stderr}
            row["stopped_ok"] = (
                proc.returncode == 128 + sig and last.startswith("fedjax-dp: ")
                and len(lines) == 1 and not row["swallowed"] and not row["traceback"])
            if proc.returncode != 0:
                m = re.search(r"(?:resume with|start it with): (fedjax-dp run .*)$", last)
                again = (shlex.split(m.group(1))[1:] if m else
                         ["run", str(cfg), "--out", str(out)] if "same command" in last else
                         ["run", "--resume", str(out)])
                if "--quiet" not in again:
                    again.append("--quiet")
                r = subprocess.run(_cli() + again, env=env, capture_output=True, text=True)
                row["resume_rc"] = r.returncode
                row["resume_error"] = r.stderr.strip().splitlines()[-1:] if r.returncode else []
            result = out / "result.json"
            row["equal"] = result.is_file() and _same(json.loads(result.read_text())) == reference
            tries.append(row)
            print(json.dumps(row), flush=True)
    phases: dict[str, int] = {}
    for row in tries:
        phases[row["phase"]] = phases.get(row["phase"], 0) + 1
    summary = {"tries_per_signal": args.tries, "reference_wall_s": round(wall, 2),
               "runs_that_ended_before_their_moment": missed,
               "all_stopped_ok": all(r["stopped_ok"] for r in tries),
               "all_resumed_equal": all(r["equal"] for r in tries),
               "interrupted": sum(r["rc"] != 0 for r in tries),
               "aimed": {a: sum(r["aimed_at"] == a for r in tries) for a in phases_cycle},
               "exit_status": sorted({r["rc"] for r in tries}), "phases": phases,
               "python": sys.version.split()[0]}
    print(json.dumps(summary, indent=2))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"summary": summary, "tries": tries}, indent=1))
    return 0 if summary["all_stopped_ok"] and summary["all_resumed_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
