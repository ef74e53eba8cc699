"""``fedjax-dp run`` / ``sweep`` on 2 processes x 2 CPU devices equal the single-process run.

The commands of docs/scale.md ("Several hosts from the command line"), on one machine: each
process is started with ``--coordinator 127.0.0.1:PORT --num-processes 2 --process-id I`` and
2 forced CPU devices; the run's agents are split over the 4 devices of both processes
(``run.mesh = "auto"``). ``fedjax-dp sweep`` of a tiny config of every family (the selftest's
cases: DP-FedAvg, DP-FedSGD, AE-DPFL, kNN-DPFL, FedKT, ISRL-DP, DP-FNAS) on 2 processes: each
record written by process 0 must equal the same config's record in one process, and the sweep
resumed on both finds nothing left. A second test stops a 2-process ``fedjax-dp run`` with
SIGTERM on process 1 (both stop after the same round, with the resume command), resumes it,
SIGKILLs process 1 (process 0 ends within the stated timeout with one line naming it), resumes
again, and checks the result equals the uninterrupted single-process run.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 5                    # --process-timeout: a lost process is noticed after this
LOCAL_DEVICES = 2
#: the selftest cases of each family, by algorithm name
FAMILIES = ("dp_fedavg", "dp_fedsgd", "ae_dpfl", "knn_dpfl", "fedkt", "isrl", "dp_fnas")
#: history entries that say how a step ran, not what it computed (a chunk is rounded up to a
#: multiple of the mesh's devices)
EXECUTION = {"party_chunk", "agent_chunk", "chunk_size"}
#: more agents than the selftest's, so that both processes get some (4 devices)
MORE = {"fedkt": ["data.num_agents=3"], "dp_fnas": ["data.num_agents=3"]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env(devices: int) -> dict:
    e = dict(os.environ, JAX_PLATFORMS="cpu")
    flags = [f for f in e.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_force_host_platform_device_count")]
    e["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={devices}"])
    # the session's persistent compilation cache (tests/conftest.py), never the user's: without
    # JAX_COMPILATION_CACHE_DIR the CLI's run.compilation_cache = "user" is ~/.cache/fedjax_dp,
    # which the tests would fill and whose state (earlier test runs) would decide what compiles.
    # The 2 processes of a job compile the same programs at the same moment (only process 0
    # writes an entry); a resumed job loads the programs its first start compiled
    cache = os.environ.get("FEDJAX_DP_TEST_JAX_CACHE", "off")
    if cache == "off":        # a folder that cannot be made: the CLI leaves its cache off
        e["FEDJAX_DP_CACHE_DIR"] = os.devnull
        e.pop("JAX_COMPILATION_CACHE_DIR", None)
    else:
        e.pop("FEDJAX_DP_CACHE_DIR", None)        # it would come before JAX's variable
        e["JAX_COMPILATION_CACHE_DIR"] = cache
    return e


def cli(*args) -> list[str]:
    return [sys.executable, "-m", "fedjax_dp", *args]


def start_job(args: list[str], logs: Path, port: int) -> list[subprocess.Popen]:
    """The same command on 2 processes (the coordinator in process 0)."""
    procs = []
    for i in range(2):
        log = open(logs / f"process_{i}.log", "a")
        procs.append(subprocess.Popen(
            cli(*args, "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2",
                "--process-id", str(i), "--process-timeout", str(TIMEOUT_S)),
            env=env(LOCAL_DEVICES), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT))
    return procs


def wait(procs, seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    for p in procs:
        try:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError(f"the job did not end within {seconds} s")
    return [p.returncode for p in procs]


def logs_text(logs: Path) -> str:
    return "\n".join(f"--- {f.name}:\n{f.read_text()[-3000:]}"
                     for f in sorted(logs.glob("process_*.log")))


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(type(v))


def write_case(case, folder: Path) -> Path:
    """A selftest case (a shipped config and its overrides) as one TOML file."""
    from fedjax_dp.experiments import config as config_lib
    raw = tomllib.loads((ROOT / "configs" / case.config).read_text())
    for assignment in list(case.overrides) + MORE.get(case.algorithm, []):
        config_lib.apply_override(raw, assignment)
    lines = [f"{k} = {toml_value(v)}" for k, v in raw.items() if not isinstance(v, dict)]
    for table, body in raw.items():
        if isinstance(body, dict):
            lines.append(f"[{table}]")
            lines += [f"{k} = {toml_value(v)}" for k, v in body.items()]
    path = folder / f"{case.algorithm}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def records(out: Path) -> dict[str, dict]:
    recs = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    return {r["config"]["algorithm"]["name"]: r for r in recs}


def assert_same_run(got: dict, want: dict, where: str) -> None:
    assert got["test_accuracy"] == pytest.approx(want["test_accuracy"], abs=1e-6), where
    eps = [(g["unit"], g["accountant"], g["epsilon"]) for g in got["privacy"]]
    ref = [(g["unit"], g["accountant"], g["epsilon"]) for g in want["privacy"]]
    assert [e[:2] for e in eps] == [e[:2] for e in ref], where
    np.testing.assert_allclose([e[2] for e in eps], [e[2] for e in ref], rtol=1e-9,
                               err_msg=where)
    assert len(got["history"]) == len(want["history"]), where
    for a, b in zip(got["history"], want["history"]):
        assert sorted(a) == sorted(b), where
        for k in a:
            if k.endswith("_s") or k in EXECUTION:     # timing and chunking, not results
                continue
            if isinstance(a[k], float):
                assert a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-5), f"{where}: {k}"
            else:
                assert a[k] == b[k], f"{where}: {k}"


def test_every_family_in_a_sweep_on_two_processes_equals_one_process_and_resumes(tmp_path):
    """``fedjax-dp sweep`` of one config per family on 2 processes x 2 devices (one job, one
    start-up: process 0 writes the records, every run computed by both processes together);
    meanwhile the same sweep in one process; each 2-process record equals the single-process one
    and says where it ran; ``--resume`` on both processes finds nothing left to run."""
    from fedjax_dp.algorithms import registry
    from fedjax_dp.experiments import selftest
    cases = {c.algorithm: c for c in selftest.load_cases()}
    chosen = [cases[a] for a in cases if a.startswith(FAMILIES) or a in FAMILIES]
    assert {selftest.family(registry.get(c.algorithm)) for c in chosen} == \
        {"averaging", "voting", "fedkt", "isrl", "fnas"}
    bases = [str(write_case(c, tmp_path)) for c in chosen]
    sweep = ["sweep", *bases, "--quiet", "--seeds", "1", "--no-vmap-seeds"]
    single = subprocess.Popen(cli(*sweep, "--out", str(tmp_path / "one")), env=env(1), cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    logs, out = tmp_path / "logs", tmp_path / "two"
    logs.mkdir()
    try:
        codes = wait(start_job(sweep + ["--out", str(out)], logs, free_port()), 600)
        assert codes == [0, 0], logs_text(logs)
        assert single.wait(timeout=600) == 0, single.stderr.read()[-3000:]
    finally:
        if single.poll() is None:
            single.kill()
    text = logs_text(logs)
    got, want = records(out), records(tmp_path / "one")
    assert sorted(got) == sorted(want) == sorted(c.algorithm for c in chosen), text
    for name, result in got.items():
        where = f"{name}\n{text}"
        assert_same_run(result, want[name], where)
        assert result["processes"]["count"] == 2, where
        assert result["processes"]["mesh_devices"] == 2 * LOCAL_DEVICES, where
        assert "processes" not in want[name]
        counts = result["processes"].get("agents_per_process")
        if counts is not None:              # the one-shot families count who trained whom
            assert len(counts) == 2 and min(counts) > 0, where
            assert sum(counts) == result["num_agents"], where
    counted = [n for n, r in got.items() if "agents_per_process" in r["processes"]]
    assert {"ae_dpfl", "knn_dpfl", "fedkt", "dp_fnas"} <= set(counted), counted
    lines = (out / "results.jsonl").read_text().splitlines()
    assert wait(start_job(sweep + ["--resume", str(out)], logs, free_port()), 300) == [0, 0], \
        logs_text(logs)
    assert (out / "results.jsonl").read_text().splitlines() == lines    # nothing run again


def progress_lines(out: Path) -> int:
    path = out / "progress.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_stopped_killed_and_resumed_on_two_processes(tmp_path):
    """SIGTERM on process 1: both stop after the same round with the resume command; resumed,
    SIGKILL of process 1: process 0 ends within TIMEOUT_S (+ start-up margin) with one line
    naming process 1 (or gloo aborts it first, docs/scale.md); resumed again: the result
    equals the single-process run's."""
    sets = ['data.dataset="digits"', "data.num_agents=10", "algorithm.rounds=8",
            "train.steps=2", "model.hidden=[8]", "run.checkpoint_every=1",
            "run.rounds_per_call=1", 'privacy.accountants=["rdp"]', "algorithm.diagnostics=true"]
    args = ["run", "dp_fedavg/mnist5k", "--quiet"] + [a for s in sets for a in ("--set", s)]
    out, logs = tmp_path / "run", tmp_path / "logs"
    logs.mkdir()
    reference = subprocess.Popen(cli(*args, "--out", str(tmp_path / "ref")), env=env(1),
                                 cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                 text=True)

    def stop_when(rounds: int, procs, sig) -> None:
        deadline = time.monotonic() + 300
        while progress_lines(out) < rounds and all(p.poll() is None for p in procs):
            assert time.monotonic() < deadline, logs_text(logs)
            time.sleep(0.05)
        assert all(p.poll() is None for p in procs), logs_text(logs)
        procs[1].send_signal(sig)

    job = start_job(args + ["--out", str(out)], logs, free_port())
    stop_when(2, job, signal.SIGTERM)
    assert wait(job, 120) == [143, 143], logs_text(logs)
    text = logs_text(logs)
    assert text.count("resume on every host with: fedjax-dp run --resume") == 2, text
    done = progress_lines(out)
    assert 2 <= done < 8, text

    resume = ["run", "--resume", str(out), "--quiet"]
    job = start_job(resume, logs, free_port())
    stop_when(done + 2, job, signal.SIGKILL)
    tick = time.monotonic()
    codes = wait(job, TIMEOUT_S + 60)
    assert time.monotonic() - tick < TIMEOUT_S + 30, logs_text(logs)
    assert codes[1] == -signal.SIGKILL, logs_text(logs)
    log_0 = (logs / "process_0.log").read_text()
    if codes[0] == -signal.SIGABRT:       # gloo aborted the survivor first (docs/scale.md)
        assert "gloo::EnforceNotMet" in log_0, logs_text(logs)
    else:
        assert codes[0] == 75, logs_text(logs)
        last = log_0.strip().splitlines()[-1]
        assert last.startswith("fedjax-dp: process 0: lost process 1 of 2"), last
        assert "resume on every host with" in last, last

    job = start_job(resume, logs, free_port())
    assert wait(job, 300) == [0, 0], logs_text(logs)
    assert reference.wait(timeout=300) == 0, reference.stderr.read()[-3000:]
    got = json.loads((out / "result.json").read_text())
    want = json.loads((tmp_path / "ref" / "result.json").read_text())
    assert_same_run(got, want, logs_text(logs))
    assert [h["round"] for h in got["history"]] == list(range(1, 9))
