"""Experiment tracking (``run.log``): TensorBoard event files read back hold every metric of
``progress.jsonl`` at its round; a run killed after round 3 and resumed from its checkpoint of
round 2 continues the steps (none twice, none lost); W&B (a fake ``wandb`` module recording its
calls) gets the config, the rounds and the final scalars, and a resumed run continues the same
W&B run; a sweep logs each run in its own folder; bad ``run.log`` values and a missing package
are refused before any work."""
import json
import math
import sys
import types

import jax
import pytest

from fedjax_dp.core import compilation
from fedjax_dp.experiments import checkpoint, runner, sweep, tracking
from fedjax_dp.experiments import config as config_lib

pytest.importorskip("tensorboardX")

ROUNDS = 5
# a tiny DP-FedAvg run (q = 1: one cohort size, one compilation of the round)
RAW = {"data": {"dataset": "wbcd", "partition": "iid", "num_agents": 4},
       "model": {"name": "logistic"},
       "train": {"steps": 2, "batch_size": 8, "learning_rate": 0.1},
       "run": {"eval_every": 2, "checkpoint_every": 2, "progress": False,
               "log": ["tensorboard", "wandb"], "wandb_project": "tests"},
       "privacy": {"delta": 1e-5, "accountants": ["rdp"]},
       "algorithm": {"name": "dp_fedavg", "rounds": ROUNDS, "sampling_rate": 1.0,
                     "clip_norm": 1.0, "noise_multiplier": 1.0,
                     "diagnostics": True}}       # the rounds' train_loss is logged


class FakeWandb(types.ModuleType):
    """Stands in for ``wandb``: records ``init`` keyword arguments and every run's calls."""

    def __init__(self):
        super().__init__("wandb")
        self.runs: list[FakeRun] = []

    def init(self, **kwargs):
        run = FakeRun(kwargs)
        self.runs.append(run)
        return run


class FakeRun:
    def __init__(self, kwargs):
        self.init = kwargs
        self.logged: list[tuple[int, dict]] = []
        self.summary: dict = {}
        self.finished = False

    def log(self, metrics, step=None):
        assert not self.finished
        self.logged.append((step, dict(metrics)))

    def finish(self):
        self.finished = True


class Killed(Exception):
    """Stands in for the process being killed."""


def _progress(folder):
    return [json.loads(x) for x in (folder / "progress.jsonl").read_text().splitlines()]


def _assert_events_hold(scalars, lines):
    """Every number of every progress.jsonl line is in the event files at its round (float32)."""
    for line in lines:
        for tag, value in tracking.scalars(line).items():
            got = dict(scalars[tag])
            assert line["round"] in got, (tag, line["round"])
            if math.isnan(value):
                assert math.isnan(got[line["round"]]), tag
            else:
                assert got[line["round"]] == pytest.approx(value, rel=1e-6, abs=1e-30), tag


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    """A tracked run killed after round 3 (checkpoint at 2) and resumed, with a fake wandb; the
    event scalars and progress.jsonl as the killed process left them."""
    folder = tmp_path_factory.mktemp("tracking") / "run"
    fake = FakeWandb()
    cfg = config_lib.resolve(RAW)
    with pytest.MonkeyPatch.context() as m:
        m.setitem(sys.modules, "wandb", fake)
        # round 1 compiles and lists what it compiled, whatever ran before in this worker: a
        # test with the same config leaves its programs in JAX's in-memory caches (then round 1
        # compiles nothing: a CI failure), and one served from the suite's persistent cache can
        # load in under LISTED_S
        jax.clear_caches()
        m.setattr(compilation, "LISTED_S", 0.0)
        real = tracking.Trackers.log

        def log(self, step, metrics, *, restored=False):    # killed once round 3 is logged
            real(self, step, metrics, restored=restored)
            if step == 3:
                raise Killed

        m.setattr(tracking.Trackers, "log", log)
        with pytest.raises(Killed):
            runner.run(cfg, folder)
        m.setattr(tracking.Trackers, "log", real)
        killed = (tracking.read_scalars(folder / tracking.FOLDER), _progress(folder))
        # resumed with another execution key: the epsilon every 2 rounds (and at the last)
        result = runner.run(config_lib.resolve(RAW, ["run.log_epsilon_every=2"]), folder,
                            resume=True)
    return types.SimpleNamespace(folder=folder, killed=killed, result=result, fake=fake,
                                 config=cfg)


def test_event_files_hold_every_progress_metric_at_its_round(resumed):
    scalars, lines = resumed.killed                # the first process: a fresh run, rounds 1-3
    assert [x["round"] for x in lines] == [1, 2, 3]
    assert lines[0]["compilations"] and {"train_loss", "seconds"} <= lines[2].keys()
    _assert_events_hold(scalars, lines)
    assert scalars["compilations/count"][0] == (1, len(lines[0]["compilations"]))
    texts = tracking.read_texts(resumed.folder / tracking.FOLDER)
    assert json.loads("\n".join(t[4:] for t in texts["config"][0].splitlines())) == \
        runner.jsonable(resumed.config)


def test_resumed_run_continues_the_steps(resumed):
    folder = resumed.folder
    lines = _progress(folder)
    assert [x["round"] for x in lines] == list(range(1, ROUNDS + 1))
    scalars = tracking.read_scalars(folder / tracking.FOLDER)
    _assert_events_hold(scalars, lines)
    # every tag once per round: rounds 1-2 kept from the first process (their seconds too, which
    # the resumed progress.jsonl no longer has), round 3 as the resumed process logged it
    for tag in ("train_loss", "seconds"):
        assert [s for s, _ in scalars[tag]] == list(range(1, ROUNDS + 1)), tag
    # every round from the first process (round 3 purged), rounds 4 and 5 from the resumed one
    assert [s for s, _ in scalars["epsilon/agent/rdp"]] == [1, 2, 4, 5]
    assert [s for s, _ in scalars["test_accuracy"]] == [2, 4, 5]
    # the first process's round 3 is still in its file, dropped by the purge marker at step 3
    events = tracking.read_events(folder / tracking.FOLDER)
    raw3 = [e for e in events if e.step == 3 and any(v.tag == "train_loss"
                                                    for v in e.summary.value)]
    assert len(raw3) == 2
    assert [e.step for e in events if e.HasField("session_log")] == [3]
    # epsilon spent so far: increasing, ending at result.json's RDP guarantee
    eps = [v for _, v in scalars["epsilon/agent/rdp"]]
    assert all(a < b for a, b in zip(eps, eps[1:]))
    (g,) = resumed.result["privacy"]
    assert eps[-1] == pytest.approx(g["epsilon"], rel=1e-6)
    assert scalars["final/test_accuracy"] == [(ROUNDS, pytest.approx(
        resumed.result["test_accuracy"], rel=1e-6))]
    assert scalars["final/epsilon/agent/rdp"][0][1] == pytest.approx(g["epsilon"], rel=1e-6)


def test_wandb_gets_config_rounds_and_final_scalars_and_is_continued(resumed):
    first, second = resumed.fake.runs
    assert first.finished and second.finished
    assert first.init["id"] == second.init["id"] and second.init["resume"] == "allow"
    assert first.init["project"] == "tests" and first.init["dir"] == str(resumed.folder)
    assert first.init["config"] == runner.jsonable(resumed.config)
    assert [s for s, _ in first.logged] == [1, 2, 3]
    # the resumed process starts after its checkpoint (round 2), the final scalars at round 5
    assert [s for s, _ in second.logged] == [3, 4, 5, 5]
    # each process sent the numbers of the progress.jsonl lines it wrote, and the epsilon
    for logged, lines in ((first.logged, resumed.killed[1]),
                          (second.logged[:-1], _progress(resumed.folder))):
        for step, metrics in logged:
            want = tracking.scalars(lines[step - 1])
            eps = {"epsilon/agent/rdp"} if logged is first.logged or step != 3 else set()
            assert metrics.keys() == want.keys() | eps, step
            assert {k: metrics[k] for k in want} == pytest.approx(want, rel=1e-12)
    assert second.summary["final/test_accuracy"] == resumed.result["test_accuracy"]


def test_sweep_logs_each_run_in_its_own_folder(tmp_path, monkeypatch):
    # the runs themselves are the runner's (tested above); here: one folder per run, with the
    # vmapped seeds' results logged once finished (tracking.log_result)
    history = [{"round": 1, "train_loss": 0.5}, {"round": 2, "train_loss": 0.25,
                                                 "test_accuracy": 0.75}]

    def run_seeds(configs, progress=False):
        return [{"algorithm": "dp_fedavg", "dataset": "wbcd", "test_accuracy": 0.5 + c["seed"],
                 "privacy": [], "wall_time_s": 1.0, "seed": c["seed"], "config": c,
                 "history": history, "vmapped_seeds": len(configs),
                 "timing": {"round_s": [0.125, 0.25]}} for c in configs]

    monkeypatch.setattr(runner, "run_seeds", run_seeds)
    cfg_file = tmp_path / "c.toml"
    cfg_file.write_text('[data]\ndataset = "wbcd"\n[model]\nname = "logistic"\n'
                        '[algorithm]\nname = "dp_fedavg"\nrounds = 2\n')
    sw = sweep.load([str(cfg_file)], seeds="0,1", overrides=['run.log=["tensorboard"]'])
    sweep.run(sw, tmp_path / "sw")
    folders = sorted((tmp_path / "sw" / "runs").iterdir())
    assert len(folders) == 2 and "seed=0" in folders[0].name and "seed=1" in folders[1].name
    for seed, f in enumerate(folders):
        scalars = tracking.read_scalars(f / tracking.FOLDER)
        assert scalars["train_loss"] == [(1, 0.5), (2, 0.25)]
        assert scalars["seconds"] == [(1, 0.125), (2, 0.25)]
        assert scalars["final/test_accuracy"] == [(2, 0.5 + seed)]


def test_fresh_tracker_replaces_old_events_and_purge_keeps_them(tmp_path):
    t = tracking.TensorBoardTracker(tmp_path)
    t.log(1, {"a": 1.0})
    t.log(2, {"a": 2.0})
    t.close()
    t = tracking.TensorBoardTracker(tmp_path, purge_step=2)      # resumed from round 1
    t.log(1, {"a": 9.0}, restored=True)                          # already there: not again
    t.log(2, {"a": 4.0})
    t.close()
    assert tracking.read_scalars(tmp_path)["a"] == [(1, 1.0), (2, 4.0)]
    t = tracking.TensorBoardTracker(tmp_path)                    # a run done again
    t.log(1, {"a": 3.0})
    t.close()
    assert tracking.read_scalars(tmp_path)["a"] == [(1, 3.0)]
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 1


@pytest.mark.parametrize("value", ['"tensorboard"', '["tensorbord"]', '[3]',
                                   '["wandb", "wandb"]'])
def test_bad_run_log_is_refused(value):
    with pytest.raises(config_lib.ConfigError, match=r"run\.log.*(tensorboard|twice)"):
        config_lib.resolve({}, [f"run.log={value}"])


def test_missing_package_is_refused_before_any_work(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)          # import wandb -> ImportError
    cfg = config_lib.resolve(RAW)
    with pytest.raises(config_lib.ConfigError, match=r"fedjax-dp\[wandb\]"):
        runner.run(cfg, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(config_lib.ConfigError, match="needs the run's folder"):
        runner.run(config_lib.resolve(RAW, ['run.log=["tensorboard"]']), None)


def test_logging_keys_may_change_on_resume():
    a = config_lib.resolve(RAW)
    b = config_lib.resolve(RAW, ["run.log=[]", 'run.wandb_project="x"', "run.log_epsilon_every=0"])
    assert checkpoint.fingerprint(a) == checkpoint.fingerprint(b)


def test_run_failing_before_its_first_round_leaves_no_tracking_files(tmp_path, monkeypatch):
    def setup(config):
        raise ValueError("bad data")

    monkeypatch.setitem(sys.modules, "wandb", FakeWandb())
    monkeypatch.setattr(runner, "setup", setup)
    with pytest.raises(ValueError, match="bad data"):
        runner.run(config_lib.resolve(RAW), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_sweep_run_one_by_one_is_logged_round_by_round(tmp_path, resumed):
    # the fixture's config (compiled already in this process), one seed: runner.run(tracker=...)
    cfg_file = tmp_path / "c.toml"
    cfg_file.write_text('[data]\ndataset = "wbcd"\npartition = "iid"\nnum_agents = 4\n'
                        '[model]\nname = "logistic"\n'
                        '[train]\nsteps = 2\nbatch_size = 8\nlearning_rate = 0.1\n'
                        '[privacy]\naccountants = ["rdp"]\n'
                        '[algorithm]\nname = "dp_fedavg"\nrounds = 2\nsampling_rate = 1.0\n'
                        'clip_norm = 1.0\nnoise_multiplier = 1.0\ndiagnostics = true\n')
    sw = sweep.load([str(cfg_file)], seeds=[3], overrides=['run.log=["tensorboard"]'])
    (rec,) = sweep.run(sw, tmp_path / "sw", vmap_seeds=False)
    (folder,) = (tmp_path / "sw" / "runs").iterdir()
    assert "seed=3" in folder.name and rec["run_id"][:8] in folder.name
    scalars = tracking.read_scalars(folder / tracking.FOLDER)
    assert [s for s, _ in scalars["train_loss"]] == [1, 2]
    assert [s for s, _ in scalars["epsilon/agent/rdp"]] == [1, 2]
    assert scalars["final/test_accuracy"] == [(2, pytest.approx(rec["test_accuracy"]))]
