"""Checkpoint and resume through the runner and the CLI: a run killed after round k and resumed
equals the uninterrupted run (history, accuracy, ledger; no round counted twice or skipped);
another config's or a corrupted run's folder is refused with one clear line; a finished run's is
answered with its result, never run again.

Every registered algorithm (DP-FedSGD's participation counts and ledger included) also goes
through a checkpoint and resume in ``tests/test_protocol.py``'s conformance test; hostile
checkpoints are in ``tests/test_hostile_files.py``."""
import json
import shutil
from pathlib import Path

import pytest

from fedjax_dp.experiments import checkpoint, cli, runner
from fedjax_dp.experiments import config as config_lib

ROOT = Path(__file__).resolve().parents[1]
ROUNDS = 5
BASE = {"data": {"dataset": "wbcd", "partition": "iid", "num_agents": 4},
        "model": {"name": "logistic"},
        "train": {"steps": 2, "batch_size": 8, "learning_rate": 0.1},
        "run": {"eval_every": 2, "checkpoint_every": 2, "progress": False},
        "privacy": {"delta": 1e-5, "accountants": ["rdp"]}}
ALGORITHMS = {
    "dp_fedavg": {"sampling_rate": 0.75, "clip_norm": 1.0, "noise_multiplier": 1.0},
    "isrl_spider": {"num_available": 3, "batch_size": 8, "learning_rate": 0.1, "clip_norm": 1.0,
                    "target_epsilon": 2.0, "phase_length": 2},
}


def _config(name: str) -> dict:
    raw = {**BASE, "algorithm": {"name": name, "rounds": ROUNDS, **ALGORITHMS[name]}}
    return config_lib.resolve(raw)


class Killed(Exception):
    """Stands in for the process being killed."""


def _killed_after(monkeypatch, rounds: int):
    """Make the runner die right after it has written round ``rounds`` to progress.jsonl."""
    real = runner.append_progress

    def append(out, record):
        real(out, record)
        if record["round"] == rounds:
            raise Killed

    monkeypatch.setattr(runner, "append_progress", append)


def _same_run(a: dict, b: dict) -> None:
    """Equal results apart from timings (and the compilations of the resumed process)."""
    timing = lambda r: {k: v for k, v in r.items() if not k.endswith("_s")}      # noqa: E731
    assert [timing(r) for r in a["history"]] == [timing(r) for r in b["history"]]
    assert a["test_accuracy"] == b["test_accuracy"]
    assert a["privacy"] == b["privacy"]


# DP-FedAvg is killed with a real SIGKILL from a relative folder and resumed by the command line
# in tests/test_user_paths.py; here ISRL-DP's SPIDER (counters in the state) by an exception
@pytest.mark.parametrize("name", [n for n in sorted(ALGORITHMS) if n != "dp_fedavg"])
def test_killed_and_resumed_run_equals_the_uninterrupted_one(tmp_path, monkeypatch, name):
    cfg = _config(name)
    whole = runner.run(cfg, tmp_path / "whole")
    # killed after round 3: the checkpoint of round 2 is the last; round 3 is done again
    with monkeypatch.context() as m:
        _killed_after(m, 3)
        with pytest.raises(Killed):
            runner.run(cfg, tmp_path / "killed")
    folder = tmp_path / "killed"
    assert [p.name for _, p in checkpoint.saved_steps(folder)] == ["step_00000002"]
    assert len((folder / "progress.jsonl").read_text().splitlines()) == 3
    meta = checkpoint.read_meta(checkpoint.latest(folder))
    assert meta["step"] == 2 and [r["round"] for r in meta["history"]] == [1, 2]
    assert meta["ledgers"]                                  # the ledger of the state at round 2
    resumed = runner.run(cfg, folder, resume=True)
    _same_run(resumed, whole)
    lines = [json.loads(x) for x in (folder / "progress.jsonl").read_text().splitlines()]
    assert [r["round"] for r in lines] == list(range(1, ROUNDS + 1))    # none twice, none skipped
    assert [r["round"] for r in resumed["history"]] == list(range(1, ROUNDS + 1))


@pytest.mark.parametrize("extra", [
    # the three stages in one run (as configs/dp_fedavg/mnist5k_adaptive_banded_mf.toml composes
    # the first two): each one's state must be restored for the runs to be equal
    {"adaptive_clip": {"target_quantile": 0.5, "learning_rate": 0.3, "count_noise": 2.0},
     "noise": {"kind": "banded_mf", "bands": 2},
     "server_optimizer": {"name": "adam", "learning_rate": 0.05, "eps": 1e-3}},
    {"aggregation": "secagg", "sampling": "fixed", "cohort_size": 3, "secagg_dropout": 0.2,
     "distributed_noise": {"kind": "ddg", "bits": 16, "min_survivors": 2}}],
    ids=["adaptive_clip+banded_mf+server_adam", "distributed_ddg"])
def test_killed_and_resumed_with_server_state(tmp_path, monkeypatch, extra):
    """DP-FedAvg whose rounds carry server state besides the model (C_t; the noise stream's
    buffers, round counter and participation groups; the server optimizer's optax state; the
    first three composed in one run): resumed == uninterrupted."""
    raw = {**BASE, "algorithm": {"name": "dp_fedavg", "rounds": ROUNDS,
                                 **ALGORITHMS["dp_fedavg"], **extra}}
    cfg = config_lib.resolve(raw)
    whole = runner.run(cfg, tmp_path / "whole")
    with monkeypatch.context() as m:
        _killed_after(m, 3)
        with pytest.raises(Killed):
            runner.run(cfg, tmp_path / "killed")
    resumed = runner.run(cfg, tmp_path / "killed", resume=True)
    _same_run(resumed, whole)


def test_cli_resume_refuses_other_configs_corruption_and_finished_runs(tmp_path, monkeypatch,
                                                                       capsys):
    cfg = _config("dp_fedavg")
    folder = tmp_path / "run"
    with monkeypatch.context() as m:
        _killed_after(m, 3)
        with pytest.raises(Killed):
            runner.run(cfg, folder)

    def cli_error(argv):
        code = cli.main(argv)
        err = capsys.readouterr().err
        assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
        return err

    # another config (a field that changes the results) is refused ...
    err = cli_error(["run", "--resume", str(folder), "--set", "algorithm.noise_multiplier=2.0"])
    assert "different config" in err
    # ... an execution-only key may change
    saved = tmp_path / "saved"
    shutil.copytree(folder, saved)
    # a truncated meta.json (a run killed mid-write cannot leave one: writes are atomic)
    latest = checkpoint.latest(folder)
    (latest / "meta.json").write_text((latest / "meta.json").read_text()[:-50])
    assert "corrupted" in cli_error(["run", "--resume", str(folder)])
    # the saved copy resumes, from the CLI, with an execution-only override
    assert cli.main(["run", "--resume", str(saved), "--quiet", "--set", "run.chunk_size=0"]) == 0
    capsys.readouterr()
    assert json.loads((saved / "result.json").read_text())["config"]["run"]["chunk_size"] == 0
    # a finished run is not run again: a resume (a requeued job) prints its result, exit 0,
    # nor is it overwritten by a new run
    before = (saved / "result.json").read_bytes()
    assert cli.main(["run", "--resume", str(saved), "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out)["result"] == str(saved / "result.json")
    assert (saved / "result.json").read_bytes() == before
    fedavg = ROOT / "configs" / "fedavg" / "mnist5k.toml"
    assert "already holds a run" in cli_error(["run", str(fedavg), "--out", str(saved)])


def test_corrupted_array_is_refused(tmp_path):
    """A damaged array file or meta.json fails its SHA-256 (digests.json) before it is used."""
    import jax
    import numpy as np
    from fedjax_dp.algorithms import api
    values = {"params": {"w": jax.numpy.arange(512, dtype=np.float32)}, "t": np.int32(3)}
    state = api.State(step=1, values=values)
    cfg = {"algorithm": {"name": "x"}}
    path = checkpoint.save(tmp_path, state, config=cfg, history=[], ledgers=[])
    restored, _ = checkpoint.restore(path, state, cfg)
    np.testing.assert_array_equal(restored.values["params"]["w"], values["params"]["w"])
    assert isinstance(restored.values["params"]["w"], jax.Array)
    assert restored.values["t"] == 3 and restored.values["t"].dtype == np.int32
    with pytest.raises(checkpoint.CheckpointError, match="different config"):
        checkpoint.restore(path, state, {"algorithm": {"name": "y"}})
    with pytest.raises(checkpoint.CheckpointError, match="does not match this run"):
        checkpoint.restore(path, api.State(step=0, values={**values, "t": np.zeros(2)}), cfg)
    meta = (path / "meta.json").read_bytes()
    (path / "meta.json").write_bytes(meta.replace(b'"step": 1', b'"step": 2'))
    with pytest.raises(checkpoint.CheckpointError, match="meta.json does not match its SHA"):
        checkpoint.restore(path, state, cfg)
    (path / "meta.json").write_bytes(meta)
    leaf = path / "values" / "leaf_00000.bin"
    data = bytearray(leaf.read_bytes())
    data[-16:] = bytes(16)                                # damage the stored bytes
    leaf.write_bytes(bytes(data))
    with pytest.raises(checkpoint.CheckpointError, match="does not match its SHA-256"):
        checkpoint.restore(path, state, cfg)


def test_fingerprint_ignores_a_later_key_only_at_its_earlier_value():
    """``train.batching`` arrived after runs were stored: at "replacement" (what every earlier
    run did) the fingerprint is the one computed without the key, so those runs resume; at
    "stored" it differs."""
    base = config_lib.load("configs/dp_fedavg/mnist5k.toml", [])
    assert base["train"]["batching"] == "replacement"
    earlier = json.loads(json.dumps(base))
    del earlier["train"]["batching"]
    assert checkpoint.fingerprint(base) == checkpoint.fingerprint(earlier)
    stored = config_lib.load("configs/dp_fedavg/mnist5k.toml", ["train.batching=stored"])
    assert checkpoint.fingerprint(stored) != checkpoint.fingerprint(base)
