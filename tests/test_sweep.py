"""``fedjax-dp sweep``: grid x targets x seeds, seeds vmapped == separate runs, calibration hits
its targets, resume runs only what is missing, summaries are mean / std over seeds, bad input
fails before any work."""
import json
import shutil
import types
from pathlib import Path

import dp_accounting
import numpy as np
import pytest

from fedjax_dp.algorithms import registry, seeds
from fedjax_dp.algorithms.averaging import dp_fedavg
from fedjax_dp.experiments import calibrate, cli, records, runner, sweep
from fedjax_dp.experiments import config as config_lib
from fedjax_dp.privacy.accounting import DEFAULT_RDP_ORDERS  # the library's order grid

# tiny runs: DP-FedAvg on mnist5k (20 agents, 2 rounds of 2 local steps), ISRL on WBCD (2 silos)
FEDAVG = "configs/dp_fedavg/mnist5k.toml"
FEDAVG_SETS = ["data.num_agents=20", "algorithm.rounds=2", "train.steps=2", "run.eval_every=1",
               "model.hidden=[16]", "privacy.accountants=[\"rdp\"]"]
ISRL = "configs/isrl/wbcd_isrl_spider.toml"
ISRL_SETS = ["algorithm.rounds=4", "run.eval_every=2", "privacy.accountants=[\"rdp\"]"]


def _sets(sets):
    return [a for s in sets for a in ("--set", s)]


def test_split_values_keeps_arrays_and_quoted_commas():
    assert sweep.split_values('1, 2.5,[100, 50],"a,b",x') == [1, 2.5, [100, 50], "a,b", "x"]
    with pytest.raises(ValueError, match="empty value"):
        sweep.split_values("1,,2")


def test_seeds_vmapped_equal_separate_runs():
    base = config_lib.load(ISRL, ISRL_SETS + ["run.progress=false"])
    configs = [dict(base, seed=s) for s in (0, 3)]
    together = runner.run_seeds(configs)
    assert together is not None and [r["vmapped_seeds"] for r in together] == [2, 2]
    for joint, cfg in zip(together, configs):
        alone = runner.run(cfg)
        assert joint["seed"] == alone["seed"]
        assert joint["test_accuracy"] == pytest.approx(alone["test_accuracy"], abs=1e-6)
        assert len(joint["history"]) == len(alone["history"]) == 4
        for a, b in zip(joint["history"], alone["history"]):
            assert a.keys() == b.keys()
            for k in a:
                if b[k] is None:                  # NaN metric (e.g. no upload of a kind yet)
                    assert a[k] is None, k
                else:
                    assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-6), k
        assert [g["epsilon"] for g in joint["privacy"]] == pytest.approx(
            [g["epsilon"] for g in alone["privacy"]], rel=1e-9)
    # different seeds: different models (the seed axis is not broadcast)
    assert together[0]["history"][-1] != together[1]["history"][-1]


def test_seeds_that_do_not_fit_together_run_one_by_one(tmp_path, monkeypatch):
    """The memory budget refuses a cell's vmapped seeds (before any work): the sweep says so and
    runs them one by one, each checked on its own, and records every seed."""
    from fedjax_dp.core import memory

    def refused(configs, **kwargs):
        raise memory.MemoryBudgetError("one step of 2 seeds needs about 36 GB of memory")

    monkeypatch.setattr(runner, "run_seeds", refused)
    sw = sweep.load([FEDAVG], seeds=2, overrides=FEDAVG_SETS + ["run.progress=false"])
    lines = []
    records = sweep.run(sw, tmp_path / "sw", log=lines.append)
    assert sorted(r["seed"] for r in records) == [0, 1]
    assert [r["vmapped_seeds"] for r in records] == [1, 1]
    assert any("2 seeds do not fit in memory together" in line and "36 GB" in line
               and "one by one" in line for line in lines), lines


def test_algorithm_without_pure_step_is_not_vmapped(monkeypatch):
    # an algorithm with neither seed_step nor batched_step (DP-FedAvg with its hook taken away:
    # every registered algorithm may gain one) runs its seeds one by one
    hookless = types.SimpleNamespace(**{k: getattr(dp_fedavg, k) for k in dir(dp_fedavg)
                                        if not k.startswith("__") and k != "seed_step"})
    assert not seeds.can_vmap_seeds(hookless)
    monkeypatch.setitem(registry.algorithms(), "dp_fedavg", hookless)
    base = config_lib.load(FEDAVG, FEDAVG_SETS)
    assert runner.run_seeds([dict(base, seed=0), dict(base, seed=1)]) is None
    with pytest.raises(ValueError, match="differ only in seed"):
        runner.run_seeds([base, config_lib.load(FEDAVG, FEDAVG_SETS + ["algorithm.rounds=3"])])


def test_sweep_calibration_summary_and_resume(tmp_path):
    out = tmp_path / "sw"
    argv = ["sweep", FEDAVG, *_sets(FEDAVG_SETS), "--seeds", "2", "--target-epsilon", "1.5,6",
            "--calibrate", "algorithm.noise_multiplier", "--out", str(out), "--quiet"]
    assert cli.main(argv) == 0
    recs = records.read([out / "results.jsonl"])
    assert len(recs) == 2 * 2
    q = recs[0]["config"]["algorithm"]["sampling_rate"]
    for r in recs:
        # the run's own ledger (not the planner) meets the target within 1% (and not above it)
        assert r["epsilon"] <= r["target_epsilon"] * (1 + 1e-9)
        assert r["epsilon"] == pytest.approx(r["target_epsilon"], rel=0.01)
        assert r["calibrated"]["key"] == "algorithm.noise_multiplier"
        assert r["config"]["algorithm"]["noise_multiplier"] == r["calibrated"]["value"]
        # independent value: dp-accounting's RDP accountant on the sampled Gaussian directly
        acc = dp_accounting.rdp.RdpAccountant(list(DEFAULT_RDP_ORDERS))
        acc.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
            q, dp_accounting.GaussianDpEvent(r["calibrated"]["value"])), 2))
        assert acc.get_epsilon(1e-5) == pytest.approx(r["epsilon"], rel=1e-6)
    # more noise for the smaller target; the seeds of a cell share the calibrated value
    by = {(r["target_epsilon"], r["seed"]): r["calibrated"]["value"] for r in recs}
    assert by[(1.5, 0)] == by[(1.5, 1)] > by[(6.0, 0)] == by[(6.0, 1)]
    # summary: one row per cell, mean / sample std over the two seeds
    rows = sweep.summarize(recs)
    assert len(rows) == 2 and all(r["n"] == 2 for r in rows)
    for row in rows:
        accs = [r["test_accuracy"] for r in recs if r["target_epsilon"] == row["target_epsilon"]]
        assert row["test_accuracy_mean"] == pytest.approx(np.mean(accs))
        assert row["test_accuracy_std"] == pytest.approx(np.std(accs, ddof=1))
    md = (out / "summary.md").read_text()
    assert md.count("\n") == 2 + 2 and "test_accuracy_mean" in md
    assert (out / "summary.csv").read_text().count("\n") == 1 + 2
    # resume with a third seed: only the 2 new runs run, the 4 earlier records are kept as is
    before = (out / "results.jsonl").read_text()
    with open(out / "results.jsonl", "a") as f:             # a record cut by a kill
        f.write('{"run_id": "cut')
    argv3 = [a if a != "2" else "0,1,2" for a in argv]
    argv3 = [a for a in argv3 if a not in ("--out", str(out))] + ["--resume", str(out)]
    assert cli.main(argv3) == 0
    after = (out / "results.jsonl").read_text()
    assert after.startswith(before)
    new = [json.loads(line) for line in after[len(before):].splitlines()]
    assert sorted(r["seed"] for r in new) == [2, 2]
    assert all(r["n"] == 3 for r in sweep.summarize(records.read([out])))
    # sweep.json describes both invocations (seeds 0-1, then 0-2), the latest at the top
    plan = json.loads((out / "sweep.json").read_text())
    assert plan["seeds"] == [0, 1, 2]
    assert [i["seeds"] for i in plan["invocations"]] == [[0, 1], [0, 1, 2]]


def test_sweep_file_vmaps_seeds_and_calibrates_isrl_directly(tmp_path):
    sw_file = tmp_path / "exp.toml"
    sw_file.write_text(f"""
[sweep]
name = "isrl_small"
configs = ["{(config_lib.Path.cwd() / ISRL).as_posix()}"]
seeds = 2
target_epsilon = [2.0]
calibrate = "algorithm.target_epsilon"
set = {{ "algorithm.rounds" = 4, "run.eval_every" = 2 }}
[sweep.grid]
"algorithm.learning_rate" = [0.05, 0.2]
""")
    out = tmp_path / "out"
    recs = sweep.run(sweep.load([str(sw_file)]), out)
    assert len(recs) == 4
    assert all(r["vmapped_seeds"] == 2 for r in recs)
    assert all(r["sweep"] == "isrl_small" for r in recs)
    assert all(r["config"]["algorithm"]["target_epsilon"] == 2.0 for r in recs)
    # every silo is available every round: the realised worst silo meets the target (RDP)
    for r in recs:
        rdp = [g["epsilon"] for g in r["privacy"] if g["accountant"] == "rdp"][0]
        assert rdp == pytest.approx(2.0, rel=0.01) and rdp <= 2.0 * (1 + 1e-9)


def test_calibrate_other_algorithms_against_dp_accounting():
    # AE-DPFL: SelfComposed(Gaussian(sigma / 1), Q) at the agent level
    cfg = config_lib.load("configs/ae_dpfl/mnist5k.toml", ["data.num_agents=10"])
    sigma = calibrate.calibrate(cfg, "algorithm.sigma", 3.0)
    acc = dp_accounting.rdp.RdpAccountant(list(DEFAULT_RDP_ORDERS))
    acc.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(sigma),
                                                  cfg["algorithm"]["num_queries"]))
    eps = acc.get_epsilon(cfg["privacy"]["delta"])
    assert eps == pytest.approx(3.0, rel=0.01) and eps <= 3.0 * (1 + 1e-9)


@pytest.mark.parametrize("argv, message", [
    (["--grid", "algorithm.sigma"], "--grid expects KEY=V1,V2"),
    (["--seeds", "0"], "--seeds must be in [1, 10000]"),
    (["--seeds", "1,1"], "lists a seed twice"),
    (["--target-epsilon", "-1", "--calibrate", "algorithm.noise_multiplier"],
     "--target-epsilon values must be positive"),
    (["--target-epsilon", "1"], "--target-epsilon needs --calibrate"),
    (["--target-epsilon", "1", "--calibrate", "algorithm.nois"], "--calibrate key "
     "'algorithm.nois' is not in the config"),
    (["--target-epsilon", "1", "--calibrate", "algorithm.rounds"], "holds an integer"),
    (["--grid", "train.batch_size=0,2"], "train.batch_size must be in [1,"),
    (["--grid", "algorithm.rounds=1,3"], "--set algorithm.rounds is also a grid key"),
    (["--grid", "train.batch_size=2,2.0"], "--grid train.batch_size lists 2.0 twice"),
    (["--grid", "train.batch_size=2", "--grid", "train.batch_size=4"], "given twice"),
    (["--grid", "algorithm.bogus=1"], "algorithm.bogus"),
])
def test_bad_input_one_line_exit_2_before_any_run(tmp_path, capsys, argv, message):
    out = tmp_path / "o"
    for dry in ([], ["--dry-run"]):                  # a dry run validates every run as well
        where = dry or ["--out", str(out), "--quiet"]  # (a dry run writes and logs nothing)
        code = cli.main(["sweep", FEDAVG, *_sets(FEDAVG_SETS), *where, *argv])
        assert code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("fedjax-dp: error:") and message in err[0], err
        assert not (out / "results.jsonl").exists()


def test_existing_sweep_folder_is_refused(tmp_path, capsys):
    out = tmp_path / "o"
    out.mkdir()
    (out / "results.jsonl").write_text("")
    code = cli.main(["sweep", FEDAVG, "--out", str(out), "--quiet"])
    assert code == 2 and "already holds a sweep" in capsys.readouterr().err


def _rec(lr, target, seed, val, test):
    return {"base": "b", "algorithm": "a", "params": {"train.learning_rate": lr, "x": 1},
            "target_epsilon": target, "seed": seed, "val_accuracy": val, "test_accuracy": test,
            "epsilon": target, "epsilon_unit": "agent", "calibrated": None}


def test_select_chooses_on_validation_and_reports_test():
    recs = [_rec(0.1, 1.0, 0, 0.50, 0.90), _rec(0.1, 1.0, 1, 0.52, 0.92),   # best test ...
            _rec(0.3, 1.0, 0, 0.60, 0.70), _rec(0.3, 1.0, 1, 0.62, 0.74),   # ... best val
            _rec(0.1, 4.0, 0, 0.80, 0.81), _rec(0.3, 4.0, 0, 0.70, 0.95)]
    rows = sweep.select(recs, "val_accuracy", ["train.learning_rate"])
    assert [(r["target_epsilon"], r["selected"]) for r in rows] == [
        (1.0, {"train.learning_rate": 0.3}), (4.0, {"train.learning_rate": 0.1})]
    assert rows[0]["test_accuracy_mean"] == pytest.approx(0.72)
    assert rows[0]["test_accuracy_std"] == pytest.approx(np.std([0.70, 0.74], ddof=1))
    assert rows[0]["val_accuracy_mean"] == pytest.approx(0.61)
    assert rows[0]["x"] == 1 and rows[0]["n_candidates"] == 2


def test_grid_edges_along_the_axes_through_the_chosen_point():
    over = ["rounds", "lr"]
    grid = [{"rounds": r, "lr": lr} for r in (25, 100, 300) for lr in (0.3, 1.0, 3.0)]
    edges = lambda chosen, tried=grid: sweep.grid_edges(chosen, tried, over)     # noqa: E731
    assert edges({"rounds": 100, "lr": 1.0}) == ""
    assert edges({"rounds": 300, "lr": 0.3}) == "rounds=high; lr=low"
    # an extension past one edge, tried only along the chosen point's axis, makes it interior
    ext = [{"rounds": 100, "lr": 1.0}, {"rounds": 30, "lr": 3.0}, {"rounds": 100, "lr": 3.0},
           {"rounds": 300, "lr": 3.0}, {"rounds": 100, "lr": 10.0}]
    assert edges({"rounds": 100, "lr": 3.0}, ext) == ""
    assert edges({"rounds": 300, "lr": 3.0}, ext) == "rounds=high; lr=only"
    # names and flags have no order; a single numeric value is "only"
    assert sweep.grid_edges({"opt": "adam", "lr": 0.1}, [{"opt": "sgd", "lr": 0.1},
                            {"opt": "adam", "lr": 0.1}], ["opt", "lr"]) == "lr=only"
    recs = [_rec(lr, 1.0, 0, val, 0.5) for lr, val in ((0.1, 0.4), (0.3, 0.6), (1.0, 0.5))]
    assert sweep.select(recs, "val_accuracy", ["train.learning_rate"])[0]["at_edge"] == ""
    recs = recs[:2]
    assert (sweep.select(recs, "val_accuracy", ["train.learning_rate"])[0]["at_edge"]
            == "train.learning_rate=high")


def test_next_value_past_an_edge():
    nv = sweep._next_value
    assert nv([25, 100, 300], "high", (None, None)) == 900
    assert nv([25, 100, 300], "low", (None, None)) == 6            # 25 / 4, floored
    assert nv([0.1, 0.3, 1.0], "high", (None, None)) == 3.333
    assert nv([0.5], "low", (None, None)) == 0.1667                 # 4 significant digits
    assert nv([100, 500], "high", (None, 1000)) == 1000            # clamped to the limit ...
    assert nv([100, 1000], "high", (None, 1000)) is None           # ... which is a hard edge
    assert nv([1, 2], "low", (None, None)) is None                 # no integer below 1
    assert nv([3, 10], "low", (None, None)) == 1                   # 3 / 3.33 floors to 1, not 0
    assert nv([0.0, 1.0], "low", (None, None)) is None             # no geometric step below 0
    assert nv([1], "low", (None, None), ints=False) == 0.3333       # a float key given as 1


def test_edge_points_step_past_each_edge_of_each_chosen_cell():
    def rec(lr, steps, seed, val, target=1.0):
        return {"base": "b", "algorithm": "a", "target_epsilon": target, "seed": seed,
                "params": {"train.learning_rate": lr, "train.steps": steps, "x": 1},
                "val_accuracy": val, "test_accuracy": val, "epsilon": target,
                "epsilon_unit": "agent", "calibrated": None}
    over = ["train.learning_rate", "train.steps"]
    recs = [rec(lr, st, s, v) for lr, st, v in
            ((0.1, 10, 0.5), (0.3, 10, 0.6), (0.1, 20, 0.4), (0.3, 20, 0.55)) for s in (3, 4)]
    recs += [rec(0.3, 10, 0, 0.7, target=2.0), rec(0.1, 10, 0, 0.2, target=2.0)]
    pts = sweep.edge_points(recs, "val_accuracy", over)
    assert [(p, t, s) for _, p, t, s in pts] == [
        ({"train.learning_rate": 0.9, "train.steps": 10, "x": 1}, 1.0, [3, 4]),
        ({"train.learning_rate": 0.3, "train.steps": 5, "x": 1}, 1.0, [3, 4]),
        ({"train.learning_rate": 0.9, "train.steps": 10, "x": 1}, 2.0, [0]),
        ({"train.learning_rate": 0.3, "train.steps": 3, "x": 1}, 2.0, [0]),    # only: /3 ...
        ({"train.learning_rate": 0.3, "train.steps": 30, "x": 1}, 2.0, [0])]   # ... and x3
    # a learning rate given as the integer 1 is a float key (the resolved config says so)
    ones = [{**r, "params": {**r["params"], "train.learning_rate": 1}, "config": {"train": {
        "learning_rate": 1.0, "steps": r["params"]["train.steps"]}}} for r in recs[-2:]]
    assert [p["train.learning_rate"] for _, p, _, _ in sweep.edge_points(
        ones, "val_accuracy", over)][:2] == [0.3333, 3]
    limited = sweep.edge_points(recs, "val_accuracy", over, {"train.learning_rate": (None, 0.3),
                                                              "train.steps": (10, None)})
    assert [(p["train.steps"], t) for _, p, t, _ in limited] == [(30, 2.0)]


def test_extend_edges_runs_past_the_edge_until_interior(tmp_path, capsys):
    out = tmp_path / "e"
    args = ["sweep", ISRL, "--grid", "algorithm.learning_rate=0.1,0.3", "--seeds", "1",
            "--select", "val_accuracy"] + sum((["--set", s] for s in ISRL_SETS + [
                "data.validation_fraction=0.2"]), [])
    assert cli.main(args + ["--out", str(out), "--quiet"]) == 0
    first = json.loads((out / "selected.json").read_text())[0]
    assert first["at_edge"]                              # two values: the choice is an edge
    assert cli.main(args + ["--resume", str(out), "--extend-edges", "2", "--quiet",
                            "--edge-limit", "algorithm.learning_rate=0.01:3"]) == 0
    row = json.loads((out / "selected.json").read_text())[0]
    lrs = sorted({r["params"]["algorithm.learning_rate"]
                  for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())})
    assert len(lrs) > 2 and min(lrs) >= 0.01 and max(lrs) <= 3
    lr = row["selected"]["algorithm.learning_rate"]
    invocations = json.loads((out / "sweep.json").read_text())["invocations"]
    # interior, at the hard limit, or both rounds spent
    assert row["at_edge"] == "" or lr in (0.01, 3) or len(invocations) == 3
    assert [i.get("extend_edges") for i in invocations][:2] == [None, 1]   # no grid re-run
    # every invocation records the --set values its runs were made with (execution-only ones too)
    assert all("data.validation_fraction=0.2" in i["overrides"] for i in invocations)
    assert invocations[1]["points"] and len(lrs) == 2 + sum(len(i["points"])
                                                            for i in invocations[1:])
    capsys.readouterr()
    assert cli.main(args + ["--resume", str(out), "--extend-edges", "1", "--edge-limit",
                            "x=a:b"]) == 2
    assert "--edge-limit expects KEY=LO:HI" in capsys.readouterr().err
    assert cli.main(args + ["--resume", str(out), "--extend-edges", "0"]) == 2
    assert "--extend-edges must be a number of rounds >= 1" in capsys.readouterr().err


def test_extend_edges_stops_at_a_limit_the_run_refuses(tmp_path, monkeypatch, capsys):
    """A value past a limit only the data shows (a ValueError naming the stepped key, raised
    before any work) is a hard limit: listed in the invocation's ``refused``, never tried again;
    any other error still stops the sweep."""
    out = tmp_path / "r"
    args = ["sweep", ISRL, "--grid", "algorithm.learning_rate=0.1,0.3", "--seeds", "1",
            "--select", "val_accuracy", "--quiet"] + sum((["--set", s] for s in ISRL_SETS + [
                "data.validation_fraction=0.2"]), [])
    assert cli.main(args + ["--out", str(out)]) == 0
    message = {"text": "algorithm.learning_rate must be 0.1 or 0.3 here"}
    tried = []

    def refuse(run):
        def wrapped(config, *a, **k):
            configs = config if isinstance(config, list) else [config]
            tried.extend(c["algorithm"]["learning_rate"] for c in configs)
            if any(c["algorithm"]["learning_rate"] not in (0.1, 0.3) for c in configs):
                raise ValueError(message["text"])
            return run(config, *a, **k)
        return wrapped
    monkeypatch.setattr(runner, "run", refuse(runner.run))
    monkeypatch.setattr(runner, "run_seeds", refuse(runner.run_seeds))
    assert cli.main(args + ["--resume", str(out), "--extend-edges", "3"]) == 0
    invocations = json.loads((out / "sweep.json").read_text())["invocations"]
    assert len(invocations) == 2 and len(tried) == 1          # one round: the point refused
    (refused,) = invocations[1]["refused"]
    assert refused["params"]["algorithm.learning_rate"] == tried[0] not in (0.1, 0.3)
    assert refused["error"] == message["text"]
    assert len((out / "results.jsonl").read_text().splitlines()) == 2
    assert cli.main(args + ["--resume", str(out), "--extend-edges", "1"]) == 0
    assert len(tried) == 1 and len(json.loads((out / "sweep.json").read_text())[
        "invocations"]) == 2                                    # read back: not tried again
    message["text"] = "data.num_agents must be at least 2"       # names no stepped key
    fresh = tmp_path / "s"
    shutil.copytree(out, fresh)
    sj = json.loads((fresh / "sweep.json").read_text())
    sj["invocations"][1].pop("refused")
    (fresh / "sweep.json").write_text(json.dumps(sj))
    capsys.readouterr()
    assert cli.main(args + ["--resume", str(fresh), "--extend-edges", "1"]) != 0
    assert "data.num_agents must be at least 2" in capsys.readouterr().err


def test_validation_split_is_held_out_of_training(tmp_path):
    cfg = config_lib.load(FEDAVG, FEDAVG_SETS + ["data.validation_fraction=0.1"])
    full = runner.setup(config_lib.load(FEDAVG, FEDAVG_SETS))
    s = runner.setup(cfg)
    n = len(full.dataset.y_train)
    m = round(0.1 * n)
    assert len(s.y_val) == m and len(s.dataset.y_train) == n - m
    # disjoint and together the whole training split (rows compared as bytes)
    rows = {r.tobytes() for r in full.dataset.x_train.reshape(n, -1)}
    val = {r.tobytes() for r in np.asarray(s.x_val).reshape(m, -1)}
    train = {r.tobytes() for r in s.dataset.x_train.reshape(n - m, -1)}
    assert not (val & train) and (val | train) <= rows
    assert int(np.sum(np.asarray(s.fed.agents.counts))) == n - m
    with pytest.raises(ValueError, match="data.validation_fraction must be in"):
        config_lib.load(FEDAVG, ["data.validation_fraction=1.0"])
    code = cli.main(["sweep", FEDAVG, "--grid", "train.learning_rate=0.1,0.2", "--select",
                     "val_accuracy", "--out", str(tmp_path / "o"), "--quiet"])
    assert code == 2


def test_dry_run_keeps_two_algorithms_on_one_dataset_apart(capsys):
    code = cli.main(["sweep", FEDAVG, "configs/ae_dpfl/mnist5k.toml", "--grid",
                     "data.num_agents=50,100", "--seeds", "3", "--target-epsilon", "1,2",
                     "--calibrate", "dp_fedavg=algorithm.noise_multiplier", "--calibrate",
                     "ae_dpfl=algorithm.sigma", "--dry-run"])
    plan = json.loads(capsys.readouterr().out)
    assert code == 0 and plan["runs"] == 2 * 2 * 2 * 3 and plan["cells"] == 8
    assert plan["bases"] == ["dp_fedavg/mnist5k", "ae_dpfl/mnist5k"]


def test_sweep_file_sets_inline_tables_and_lists_of_them(tmp_path):
    """[sweep.set] values reach every run's config as TOML: a table (dataset options), a list,
    nested tables; an option a source or partition does not take is refused before any run."""
    f = tmp_path / "s.toml"
    f.write_text(f"""[sweep]
configs = ["{Path(ISRL).resolve()}"]
[sweep.set]
"data.dataset_options" = {{ num_test = 50, seed = 3 }}
"privacy.accountants" = ["rdp"]
"data.features" = {{ map = "pca", dim = 4 }}
"data.partition" = "dirichlet"
"data.partition_options" = {{ beta = 0.5 }}
""")
    sw = sweep.load([str(f)])
    config = sweep.expand(sw)[0].config
    assert config["data"]["dataset_options"] == {"num_test": 50, "seed": 3}
    assert config["privacy"]["accountants"] == ["rdp"]
    assert config["data"]["features"] == {"map": "pca", "dim": 4}
    assert config["data"]["partition_options"] == {"beta": 0.5}
    assert sweep._toml_value([{"a": 1}, "x"]) == '[{"a" = 1}, "x"]'
    assert sweep._toml_value({"nested": {"a": [1, 2]}}) == '{"nested" = {"a" = [1, 2]}}'
    f.write_text(f.read_text().replace("beta = 0.5", "betta = 0.5"))   # a typo: refused at load
    with pytest.raises(ValueError, match="data.partition_options for 'dirichlet'"):
        sweep.expand(sweep.load([str(f)]))


#: a private shipped config of every calibratable family and the key a sweep calibrates
CALIBRATED = [("dp_fedsgd/mnist5k", "algorithm.noise_multiplier", None),
              ("knn_dpfl/mnist5k", "algorithm.sigma", None),
              ("knn_dpfl/mnist5k", "algorithm.sigma", "instance"),
              ("fedkt/digits", "algorithm.gamma", None),
              ("fedkt/wbcd", "algorithm.gamma", None)]


@pytest.mark.parametrize("name, key, unit", CALIBRATED,
                         ids=[f"{c[0]}-{c[2] or 'first'}" for c in CALIBRATED])
def test_planned_epsilon_meets_each_target(name, key, unit):
    cfg = config_lib.load(f"configs/{name}.toml", ["algorithm.rounds=3"]
                          if name.startswith("dp_fedsgd") else [])
    for target in ((2.0, 16.0) if name.startswith("fedkt") else (4.0,)):
        value = calibrate.calibrate(cfg, key, target, unit=unit)
        eps = calibrate.planned_epsilon(calibrate.set_key(cfg, key, value), unit)
        assert target * 0.99 <= eps <= target * (1 + 1e-9)
    if unit == "instance":        # kNN-DPFL: instance Delta = sqrt(2)/k < 1 = agent Delta
        assert value < calibrate.calibrate(cfg, key, 4.0)


def test_every_shipped_config_expands_into_a_sweep(capsys):
    paths = sorted(str(p) for p in config_lib.Path("configs").glob("*/*.toml")
                   if p.parent.name != "experiments")
    assert cli.main(["sweep", *paths, "--seeds", "2", "--dry-run"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["runs"] == 2 * len(paths) and plan["cells"] == len(paths)


def test_dp_fedsgd_run_meets_its_calibrated_target(tmp_path):
    # the planner replays the run's own agent sampling: the run's ledger equals the target
    sets = ["data.num_agents=10", "algorithm.rounds=2", "privacy.accountants=[\"rdp\"]"]
    out = tmp_path / "o"
    assert cli.main(["sweep", "configs/dp_fedsgd/mnist5k.toml", *_sets(sets), "--seeds", "0,1",
                     "--target-epsilon", "3", "--calibrate", "algorithm.noise_multiplier",
                     "--out", str(out), "--quiet"]) == 0
    recs = records.read([out])
    assert len(recs) == 2
    for r in recs:
        assert 3 * 0.99 <= r["epsilon"] <= 3 * (1 + 1e-9)
