"""1, 2 and 4 processes of ``fedjax-dp run`` on this machine: seconds per step and bytes exchanged.

Every family's selftest case (``configs/selftest.toml``, shrunk further or grown by
``--set``) runs through the command line as a user runs it on a cluster: P processes, each
``fedjax-dp run CONFIG --coordinator 127.0.0.1:PORT --num-processes P --process-id I`` with
``--devices`` CPU devices of its own, the agents split over all P x devices (``run.mesh =
"auto"``); P = 1 is the plain single-process command. Each (family, P) reports the wall time of
the job (start-up and compiles included), process 0's ``result.json`` timing (set-up, the median
seconds of a step: a round, or a one-shot method's phase) and the bytes the processes exchanged,
measured as the growth of the loopback interface's byte counter (``/proc/net/dev``, ``lo``)
across the job, minus its growth over the same time with no job (the coordination service's
heartbeats are in both: they are the job's too). The machine must be otherwise quiet for the
bytes to be the job's. Usage::

    .venv/bin/python tools/bench_processes.py                   # P = 1, 2, 4, every family
    .venv/bin/python tools/bench_processes.py --processes 1 2 --families dp_fedavg ae_dpfl \\
        --set algorithm.rounds=20 --out /tmp/p.json

Writes ``results/scale/processes.json`` (default) and prints one line per (family, P).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the round-based cases run more rounds than the selftest's 2, so that the median step is a
#: compiled round's, not the first round's compile
STEPS = {"dp_fedavg": ["algorithm.rounds=8"], "dp_fedsgd": ["algorithm.rounds=8"],
         "isrl_mb_sgd": ["algorithm.rounds=8"], "sdp_mb_sgd": ["algorithm.rounds=8"]}


def loopback_bytes() -> int:
    """Bytes received on ``lo`` so far (every byte sent on it is received on it)."""
    for line in Path("/proc/net/dev").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name.strip() == "lo":
            return int(rest.split()[0])
    raise RuntimeError("no loopback interface in /proc/net/dev")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job(case, sets: list[str], processes: int, devices: int, out: Path,
        timeout_s: int) -> dict:
    """One (case, P) job: wall time, loopback bytes and process 0's result.json."""
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    args = [sys.executable, "-m", "fedjax_dp", "run", case.config, "--out", str(out),
            "--quiet"]
    for s in list(case.overrides) + STEPS.get(case.algorithm, []) + sets:
        args += ["--set", s]
    port = free_port()
    cmds = [args] if processes == 1 else [
        args + ["--coordinator", f"127.0.0.1:{port}", "--num-processes", str(processes),
                "--process-id", str(i)] for i in range(processes)]
    logs = [out.parent / f"{out.name}.{i}.log" for i in range(len(cmds))]
    before, tick = loopback_bytes(), time.perf_counter()
    procs = []
    for c, log in zip(cmds, logs):
        with open(log, "w") as f:
            procs.append(subprocess.Popen(c, env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                                          stderr=f))
    peaks, codes = {}, {}
    deadline = time.monotonic() + timeout_s
    while len(codes) < len(procs) and time.monotonic() < deadline:
        for i, p in enumerate(procs):
            if i not in codes:
                pid, status, usage = os.wait4(p.pid, os.WNOHANG)
                if pid:
                    codes[i] = os.waitstatus_to_exitcode(status)
                    peaks[i] = round(usage.ru_maxrss / 1024, 1)       # KiB -> MiB
        time.sleep(0.05)
    wall = time.perf_counter() - tick
    moved = loopback_bytes() - before
    for p in procs:
        if p.poll() is None:
            p.kill()
    if len(codes) < len(procs) or any(codes.values()):
        raise RuntimeError(f"{case.algorithm} on {processes} process(es) failed {codes}:\n"
                           + "\n".join(log.read_text()[-2000:] for log in logs))
    time.sleep(min(wall, 5.0))                   # the idle loopback traffic over a while
    idle_start, idle_tick = loopback_bytes(), time.perf_counter()
    time.sleep(min(wall, 5.0))
    idle_rate = (loopback_bytes() - idle_start) / (time.perf_counter() - idle_tick)
    result = json.loads((out / "result.json").read_text())
    steps = [s for s in result["timing"]["round_s"] if s is not None]
    return {"wall_s": round(wall, 3), "setup_s": result["timing"]["setup_s"],
            "steps": len(result["history"]),
            "median_step_s": round(statistics.median(steps), 6) if steps else None,
            "loopback_bytes": int(max(0, moved - idle_rate * wall)),
            "peak_rss_mib": [peaks[i] for i in range(len(procs))],
            "test_accuracy": result["test_accuracy"],
            "epsilon": [g["epsilon"] for g in result["privacy"]]}


def run(processes: list[int], families: list[str] | None, sets: list[str], devices: int,
        timeout_s: int) -> dict:
    from fedjax_dp.experiments import selftest
    cases = selftest.select(families)
    rows = []
    with tempfile.TemporaryDirectory(prefix="fedjax_dp_bench_processes_") as tmp:
        for case in cases:
            for p in processes:
                row = {"algorithm": case.algorithm, "processes": p,
                       "devices_per_process": devices,
                       **job(case, sets, p, devices, Path(tmp) / f"{case.algorithm}_{p}",
                             timeout_s)}
                row["bytes_per_step"] = (None if p == 1 or not row["steps"] else
                                         int(row["loopback_bytes"] / row["steps"]))
                rows.append(row)
                print(f"{case.algorithm:10s} P={p} wall {row['wall_s']:7.2f} s  step "
                      f"{row['median_step_s']} s  bytes/step {row['bytes_per_step']}  "
                      f"acc {row['test_accuracy']:.3f}", file=sys.stderr, flush=True)
    import fedjax_dp
    return {"tool": "tools/bench_processes.py", "version": fedjax_dp.version(),
            "cpu_count": os.cpu_count(), "set": sets, "rows": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--families", nargs="+", default=None,
                    help="families or algorithms of configs/selftest.toml (default: all)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="an override for every case (after the case's own)")
    ap.add_argument("--devices", type=int, default=1, help="CPU devices per process")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per job")
    ap.add_argument("--out", default=str(ROOT / "results" / "scale" / "processes.json"))
    a = ap.parse_args(argv)
    if any(p < 1 for p in a.processes) or a.devices < 1:
        ap.error("--processes and --devices must be >= 1")
    record = run(a.processes, a.families, a.set, a.devices, a.timeout)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(record, indent=1) + "\n")
    print(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
