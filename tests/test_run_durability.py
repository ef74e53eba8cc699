"""A run survives a signal at any moment, a full disk and a second process (docs/runs.md).

Signals: a signal that Python swallows (raised inside a garbage-collection callback) is not
lost; SIGTERM and SIGINT to a real ``fedjax-dp run`` at start-up and during set-up end in one
line with 143 / 130, and the command that line names finishes the run, equal to an
uninterrupted one (``tools/bench_signal_storm.py`` sends 20 of each at random moments). A full disk
(an injected ENOSPC) while writing result.json or a checkpoint leaves the previous state and a
run that resumes. A live run's folder refuses a second process, naming its pid; a killed
holder's folder resumes at once."""
import copy
import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fedjax_dp.core import files, stop
from fedjax_dp.experiments import checkpoint, cli, runner
from fedjax_dp.experiments import config as config_lib
from killed_runs import kill_after

RAW = {"data": {"dataset": "wbcd", "partition": "iid", "num_agents": 4},
       "model": {"name": "logistic"},
       "train": {"steps": 1, "batch_size": 8, "learning_rate": 0.1},
       "algorithm": {"name": "dp_fedavg", "rounds": 4, "sampling_rate": 0.75, "clip_norm": 1.0,
                     "noise_multiplier": 1.0},
       "run": {"eval_every": 2, "checkpoint_every": 2, "progress": False},
       "privacy": {"delta": 1e-5, "accountants": ["rdp"]}}
TOML = """[data]
dataset = "wbcd"
partition = "iid"
num_agents = 4
[model]
name = "logistic"
[train]
steps = 1
batch_size = 8
learning_rate = 0.1
[algorithm]
name = "dp_fedavg"
rounds = 4
sampling_rate = 0.75
clip_norm = 1.0
noise_multiplier = 1.0
[run]
eval_every = 2
checkpoint_every = 2
[privacy]
delta = 1e-5
accountants = ["rdp"]
"""


def _config() -> dict:
    return config_lib.resolve(copy.deepcopy(RAW))


def _same(a: dict, b: dict) -> None:
    untimed = lambda r: {k: v for k, v in r.items() if not k.endswith("_s")    # noqa: E731
                         and k not in ("seconds", "compilations")}
    assert [untimed(r) for r in a["history"]] == [untimed(r) for r in b["history"]]
    assert a["test_accuracy"] == b["test_accuracy"]
    assert a["privacy"] == b["privacy"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return runner.run(_config(), tmp_path_factory.mktemp("ref") / "run")


def _one_line(capsys, code, status):
    err = capsys.readouterr().err
    assert code == status, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


# ----------------------------------------------------------------------------- signals

@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                    reason="signal handlers are installed from the main thread only")
def test_a_swallowed_signal_stops_the_run_at_the_next_safe_point(capsys):
    """What JAX's garbage-collection callback did to a Ctrl-C: the raise is swallowed (and not
    printed as ``Exception ignored``); the recorded signal is raised again at the next check.
    Inside a deferred block (a write) a signal waits for the block's end."""
    import gc
    swallowed = []

    def callback(phase, info):
        if phase == "start" and not swallowed:
            swallowed.append(True)
            os.kill(os.getpid(), signal.SIGTERM)          # delivered inside the callback

    with stop.handling():
        gc.callbacks.append(callback)
        try:
            try:
                gc.collect()
                for _ in range(1000):                     # let the handler run
                    pass
            except stop.Stopped:
                pytest.skip("the signal was delivered outside the callback this time")
        finally:
            gc.callbacks.remove(callback)
        assert stop.pending() == signal.SIGTERM
        assert "Exception ignored" not in capsys.readouterr().err
        with pytest.raises(stop.Stopped) as e:
            stop.check()
        assert stop.exit_status(e.value) == 143 and stop.what(e.value) == "terminated"
        stop.clear()
        finished = []
        with pytest.raises(stop.Stopped) as e:
            with stop.deferred():
                stop._handler(signal.SIGINT, None)        # inside a write: it waits ...
                finished.append(True)
        assert finished and e.value.signum == signal.SIGINT   # ... and is raised at its end
        stop.clear()


def _cli(*args) -> subprocess.Popen:
    code = "import sys; from fedjax_dp.experiments.cli import main; sys.exit(main(exiting=True))"
    return subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
@pytest.mark.parametrize("sig,moment", [(signal.SIGTERM, "set-up"),
                                        (signal.SIGINT, "start-up")])
def test_a_signal_to_a_real_run_stops_it_and_its_line_finishes_it(tmp_path, reference, sig,
                                                                   moment):
    cfg = tmp_path / "small.toml"
    cfg.write_text(TOML)
    out = tmp_path / "run"
    proc = _cli("run", str(cfg), "--out", str(out), "--quiet")
    if moment == "set-up":                   # the data loads, the first round compiles
        deadline = time.time() + 120
        while not (out / "config.json").exists() and proc.poll() is None \
                and time.time() < deadline:
            time.sleep(0.01)
    else:
        time.sleep(0.2)                      # the library is being imported
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=300)
    lines = err.strip().splitlines()
    assert proc.returncode == 128 + sig, err
    assert len(lines) == 1 and lines[0].startswith(
        f"fedjax-dp: {'terminated' if sig == signal.SIGTERM else 'interrupted'}: "), err
    line = lines[0]
    if "resume with: " in line or "start it with: " in line:
        again = line.split(" with: ")[-1].split()[1:]
    else:
        assert "run the same command again" in line
        again = ["run", str(cfg), "--out", str(out)]
    assert cli.main(again + ["--quiet"]) == 0
    _same(json.loads((out / "result.json").read_text()), reference)


# ----------------------------------------------------------------------------- a full disk

class _Full:
    """``os.replace`` failing with ENOSPC for the files named (a disk that filled)."""

    def __init__(self, monkeypatch, names):
        real = os.replace

        def replace(src, dst, *a, **k):
            if Path(dst).name in names:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real(src, dst, *a, **k)

        monkeypatch.setattr(files.os, "replace", replace)


def test_a_full_disk_at_the_result_leaves_none_and_the_run_resumes(tmp_path, monkeypatch,
                                                                    capsys, reference):
    folder = tmp_path / "run"
    with monkeypatch.context() as m:
        _Full(m, {"result.json"})
        code = cli.main(["run", "--out", str(folder), "--quiet", *_as_cli(tmp_path)])
    err = _one_line(capsys, code, 1)
    assert "No space left on device" in err and "resume with" in err
    assert not (folder / "result.json").exists()
    assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]   # no partial file
    assert cli.main(["run", "--resume", str(folder), "--quiet"]) == 0
    _same(json.loads((folder / "result.json").read_text()), reference)


def test_a_full_disk_in_a_checkpoint_keeps_the_previous_one(tmp_path, monkeypatch, capsys,
                                                             reference):
    raw = copy.deepcopy(RAW)
    raw["algorithm"]["rounds"] = 6
    raw["run"]["checkpoint_every"] = 2
    cfg = config_lib.resolve(raw)
    folder = tmp_path / "run"
    real = checkpoint._write_new

    def write_new(path, data):                      # the disk fills in round 4's checkpoint
        if ".step_00000004.tmp" in (path.parent.name, path.parent.parent.name):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(path, data)

    with monkeypatch.context() as m:
        m.setattr(checkpoint, "_write_new", write_new)
        with pytest.raises(files.WriteError, match="No space left"):
            runner.run(cfg, folder)
    assert [s for s, _ in checkpoint.saved_steps(folder)] == [2]          # intact
    assert not list((folder / "checkpoints").glob(".*.tmp"))              # no half folder
    rounds = [json.loads(x)["round"] for x in (folder / "progress.jsonl").read_text().splitlines()]
    assert rounds == [1, 2, 3, 4]
    resumed = runner.run(cfg, folder, resume=True)
    _same(resumed, runner.run(cfg, tmp_path / "whole"))


def test_a_failed_append_leaves_no_part_of_a_line(tmp_path, monkeypatch):
    path = tmp_path / "progress.jsonl"
    files.append_line(path, '{"round": 1}')
    real = os.write

    def half(fd, data):
        real(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(files.os, "write", half)
    with pytest.raises(files.WriteError, match="progress.jsonl"):
        files.append_line(path, '{"round": 2}')
    assert path.read_text() == '{"round": 1}\n'


def _as_cli(tmp_path) -> list[str]:
    cfg = tmp_path / "small.toml"
    cfg.write_text(TOML)
    return [str(cfg)]


# ----------------------------------------------------------------------------- one process

def _hold(folder: Path) -> subprocess.Popen:
    """Another process holding ``folder`` as a live run does."""
    code = ("import sys, time; from fedjax_dp.core import files; files.FolderLock(sys.argv[1]); "
            "print('held', flush=True); time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(folder)], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_live_folder_refuses_a_second_process_and_a_killed_one_does_not(tmp_path, capsys,
                                                                          reference):
    folder = kill_after(_config(), tmp_path / "run", 3)
    progress = (folder / "progress.jsonl").read_bytes()
    holder = _hold(folder)
    try:
        err = _one_line(capsys, cli.main(["run", "--resume", str(folder), "--quiet"]), 2)
        assert f"in use by another process (pid {holder.pid})" in err
        err = _one_line(capsys, cli.main(["run", *_as_cli(tmp_path), "--out", str(folder),
                                          "--quiet"]), 2)
        assert f"pid {holder.pid}" in err
        assert (folder / "progress.jsonl").read_bytes() == progress       # every round kept
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # the killed holder's lock is gone with it: the folder resumes without any clean-up
    assert cli.main(["run", "--resume", str(folder), "--quiet"]) == 0
    _same(json.loads((folder / "result.json").read_text()), reference)
