"""The paper experiments as sweep files (configs/experiments/*.toml) and tools/plot_sweep.py.

Every sweep file must pass ``fedjax-dp sweep FILE --dry-run``: every run's config resolved and
validated (bases, grid keys, calibrate keys, validation split for --select), nothing trained.
"""
import importlib.util
import json
from pathlib import Path

import pytest

from fedjax_dp.experiments import cli
from fedjax_dp.experiments import sweep as sweep_lib

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = sorted((ROOT / "configs" / "experiments").glob("*.toml"))
SCRIPTS = ("exp_voting_dpfl", "exp_isrl", "exp_fedkt", "exp_fnas")


def test_there_are_sweep_files_for_every_experiment_script():
    names = {p.stem for p in EXPERIMENTS}
    for prefix in ("voting_dpfl_", "isrl_", "fedkt_", "fnas_"):
        assert any(n.startswith(prefix) for n in names), prefix
    for script in SCRIPTS:          # each old script points to its sweep file(s)
        text = (ROOT / "tools" / f"{script}.py").read_text()
        assert "configs/experiments/" in text, script


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.stem)
def test_sweep_file_dry_run(path, capsys):
    assert cli.main(["sweep", str(path), "--dry-run"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["runs"] > 0
    head = path.read_text().split("[sweep]")[0]                  # the comment block
    assert f"fedjax-dp sweep configs/experiments/{path.name} --out results/" in head
    assert "NOT" in head or "not reproduce" in head.lower()       # what it leaves out


def _plot_sweep():
    spec = importlib.util.spec_from_file_location("plot_sweep", ROOT / "tools" / "plot_sweep.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _record(algorithm, q, target, seed, acc, val):
    return {"algorithm": algorithm, "dataset": "mnist5k", "base": f"{algorithm}/mnist5k",
            "seed": seed, "params": {"algorithm.num_queries": q, "data.num_agents": 50},
            "target_epsilon": target, "calibrated": {"key": "algorithm.sigma", "value": 3.0},
            "test_accuracy": acc, "val_accuracy": val, "epsilon": target and target * 0.9999,
            "epsilon_unit": "agent", "epsilon_accountant": "rdp", "delta": 1e-5,
            "privacy": [], "history": [], "wall_time_s": 1.0, "config": {}}


def test_plot_sweep_draws_all_runs_and_the_selected_rows(tmp_path):
    recs = []
    for algorithm in ("ae_dpfl", "knn_dpfl"):
        for target in (2.0, 8.0):
            for q, base_acc in ((50, 0.5), (200, 0.7)):
                for seed in (0, 1, 2):
                    acc = base_acc + 0.01 * seed + 0.05 * (target == 8.0)
                    # the validation split prefers Q = 50 for knn_dpfl, Q = 200 for ae_dpfl
                    val = acc if algorithm == "ae_dpfl" else 1.0 - acc
                    recs.append(_record(algorithm, q, target, seed, acc, val))
    recs.append({**_record("fedavg", 50, None, 0, 0.9, 0.9), "epsilon": None,
                 "target_epsilon": None, "calibrated": None})     # no epsilon: left out
    sweep_dir = tmp_path / "sweep"
    sweep_dir.mkdir()
    (sweep_dir / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    rows = sweep_lib.write_selection(recs[:-1], sweep_dir, "val_accuracy",
                                     ["algorithm.num_queries"])
    assert (sweep_dir / "selected.json").is_file() and len(rows) == 4

    tool = _plot_sweep()
    written = tool.main([str(sweep_dir)])     # the fedavg run (no epsilon) is left out
    for paths in written.values():
        assert [Path(p).suffix for p in paths] == [".png", ".svg"]
        assert all(Path(p).stat().st_size > 0 for p in paths)
    assert Path(written["all_runs"][0]) == sweep_dir / "accuracy_vs_epsilon.png"
    assert Path(written["selected"][0]) == sweep_dir / "accuracy_vs_epsilon_selected.png"

    # the selected plot's points are selected.json's test accuracy mean +- std
    chosen = tool.selected_records(recs, json.loads((sweep_dir / "selected.json").read_text()))
    assert len(chosen) == 12                                       # 4 cells x 3 seeds
    assert {r["params"]["algorithm.num_queries"] for r in chosen
            if r["algorithm"] == "knn_dpfl"} == {50}
    from fedjax_dp.experiments import plots
    points = plots.summarize(chosen, "target_epsilon", "test_accuracy", "setting")
    by_key = {(r["algorithm"], r["target_epsilon"]): r for r in rows}
    for p in points:
        row = by_key[(p["hue"].split()[0], p["x"])]
        assert p["mean"] == pytest.approx(row["test_accuracy_mean"])
        assert p["std"] == pytest.approx(row["test_accuracy_std"])
    assert {p["hue"] for p in points} == {"ae_dpfl num_agents=50", "knn_dpfl num_agents=50"}
