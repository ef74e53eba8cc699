"""Two processes under ``jax.distributed`` give the single-process results.

The test starts 2 worker processes on this machine (``multiprocess_worker.py``: a local
coordinator on a free port, gloo CPU collectives, 2 forced CPU devices each), which run
DP-FedAvg rounds and an AE-DPFL vote over ONE mesh of 4 devices spanning both processes, from a
memory-mapped population (``save_stacked`` / ``load_stacked``). Meanwhile this process computes
the same runs on one device with no mesh; both workers' results must equal them (the vote's
ballots, counts and released labels exactly, DP-FedAvg's parameters to float summation order).
"""
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import multiprocess_worker as worker  # noqa: E402

NUM_PROCESSES = 2
LOCAL_DEVICES = 2
TIMEOUT_S = 240          # both workers together; a hung collective is killed, not waited for


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_env() -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    # the device count comes from the worker's jax_num_cpu_devices; an inherited forced count
    # would contradict it. LLVM optimisation level 0: tiny programs, compile-bound (as
    # test_sharding.py); the sharding, padding and cross-process reductions are unchanged
    flags = [f for f in env.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_force_host_platform_device_count")]
    env["XLA_FLAGS"] = " ".join(flags + ["--xla_backend_optimization_level=0"])
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1]) + os.pathsep + \
        env.get("PYTHONPATH", "")
    # no persistent compilation cache (conftest's): the two workers compile the same programs
    # at the same moment, so it cannot save a compile, only add concurrent writes of one entry
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    return env


def launch(population: Path, out: Path) -> list[tuple[subprocess.Popen, Path]]:
    """The command shown in docs/scale.md, once per process (stdout+stderr to a log file)."""
    address = f"127.0.0.1:{free_port()}"
    procs = []
    for pid in range(NUM_PROCESSES):
        log = out / f"process_{pid}.log"
        cmd = [sys.executable, str(Path(worker.__file__)), str(population), str(out),
               "--process-id", str(pid), "--num-processes", str(NUM_PROCESSES),
               "--coordinator", address, "--local-devices", str(LOCAL_DEVICES)]
        with open(log, "w") as f:
            procs.append((subprocess.Popen(cmd, env=worker_env(), stdout=f,
                                           stderr=subprocess.STDOUT), log))
    return procs


def wait_all(procs, timeout_s: float) -> str | None:
    """Wait for every worker; on a failure or the timeout, kill the others (a process left
    alone blocks in its collectives). Returns None, or why they were stopped."""
    deadline = time.monotonic() + timeout_s
    problem = None
    while problem is None and any(p.poll() is None for p, _ in procs):
        failed = [i for i, (p, _) in enumerate(procs) if p.poll() not in (None, 0)]
        if failed:
            problem = f"process {failed[0]} exited with {procs[failed[0]][0].returncode}"
        elif time.monotonic() > deadline:
            problem = f"timed out after {timeout_s} s"
        else:
            time.sleep(0.05)
    for p, _ in procs:
        if p.poll() is None:
            p.kill()
        p.wait()
    if problem is None and any(p.returncode for p, _ in procs):
        problem = "exit codes " + str([p.returncode for p, _ in procs])
    return problem


def report(procs) -> str:
    return "\n".join(f"--- process {i} (exit {p.returncode}), {log}:\n"
                     + log.read_text()[-4000:] for i, (p, log) in enumerate(procs))


def test_two_processes_equal_one_process(tmp_path):
    population, out = tmp_path / "population", tmp_path / "out"
    out.mkdir()
    worker.write_population(population)
    start = time.monotonic()
    procs = launch(population, out)
    try:
        reference = worker.run_all(population, mesh=None)       # meanwhile, here: one device
    except BaseException:
        for p, _ in procs:
            p.kill()
            p.wait()
        raise
    problem = wait_all(procs, TIMEOUT_S - (time.monotonic() - start))
    assert problem is None, f"the 2-process run failed: {problem}\n{report(procs)}"

    for pid in range(NUM_PROCESSES):
        got = dict(np.load(out / f"process_{pid}.npz"))
        where = f"process {pid}:\n{report(procs)}"
        # the mesh really spanned both processes, each with its own 2 devices
        assert int(got["process_index"]) == pid and int(got["process_count"]) == 2, where
        assert int(got["local_devices"]) == LOCAL_DEVICES, where
        assert got["mesh_processes"].tolist() == [0, 1], where
        # the first round's parameters, placed replicated on the mesh, compile the program
        # every later round runs (not a second one for the round's own replicated output)
        assert int(got["round_compilations"]) == 1, where
        results = sorted(k for k in reference if k.startswith(("fedavg/", "ae_dpfl/")))
        assert sorted(k for k in got if k.startswith(("fedavg/", "ae_dpfl/"))) == results, where
        for key in ("ae_dpfl/ballots", "ae_dpfl/labels", "ae_dpfl/clean_vote_sums"):  # exact
            np.testing.assert_array_equal(got[key], reference[key], err_msg=f"{key}, {where}")
        for key in (k for k in results if k.startswith("fedavg/")):    # summation order only
            np.testing.assert_allclose(got[key], reference[key], rtol=1e-5, atol=1e-6,
                                       err_msg=f"{key}, {where}")
    # the vote is not degenerate: the agents disagree, the released labels use several classes
    assert len(np.unique(reference["ae_dpfl/ballots"])) > 1
    assert len(np.unique(reference["ae_dpfl/labels"])) > 1


@pytest.mark.parametrize("kill", ["fail", "hang"])
def test_a_failed_worker_is_reported_and_its_peer_killed(tmp_path, kill):
    """wait_all stops the peer of a worker that fails (or of a hung job, at the timeout) and
    the report shows each process's output."""
    script = ("import sys, time; print('worker', sys.argv[1], 'started', flush=True); "
              "sys.exit(3) if sys.argv[1] == '0' and sys.argv[2] == 'fail' else time.sleep(60)")
    procs = []
    for pid in range(2):
        log = tmp_path / f"{pid}.log"
        with open(log, "w") as f:
            procs.append((subprocess.Popen([sys.executable, "-c", script, str(pid), kill],
                                           stdout=f, stderr=subprocess.STDOUT), log))
    tick = time.monotonic()
    problem = wait_all(procs, timeout_s=60.0 if kill == "fail" else 1.0)
    assert time.monotonic() - tick < 30                     # not the 60 s sleep of the peer
    assert all(p.poll() is not None for p, _ in procs)
    assert problem == ("process 0 exited with 3" if kill == "fail" else "timed out after 1.0 s")
    text = report(procs)
    assert "--- process 1 (exit -9)" in text, text                  # killed, not waited for
    if kill == "fail":
        assert "--- process 0 (exit 3)" in text and "worker 0 started" in text, text
