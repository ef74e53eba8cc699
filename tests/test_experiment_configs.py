"""The paper experiments as sweep files (configs/experiments/**.toml), the only definition of
each paper's tables, and ``fedjax-dp plot --selected``.

Every sweep file must pass ``fedjax-dp sweep FILE --dry-run``: every run's config resolved and
validated (bases, grid keys, calibrate keys, validation split for --select), nothing trained.
"""
import json
from pathlib import Path

import jax
import pytest

from fedjax_dp.experiments import cli, records
from fedjax_dp.experiments import sweep as sweep_lib

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = sorted((ROOT / "configs" / "experiments").glob("*.toml"))
PAPER_SCALE = sorted((ROOT / "configs" / "experiments" / "voting_paper_scale").glob("sweep_*.toml"))


def test_there_are_sweep_files_for_every_paper_and_no_experiment_scripts():
    names = {p.stem for p in EXPERIMENTS}
    for prefix in ("voting_dpfl_", "isrl_", "fedkt_", "fnas_"):
        assert any(n.startswith(prefix) for n in names), prefix
    tools = {p.name for p in (ROOT / "tools").glob("*.py")}
    for gone in ("exp_voting_dpfl.py", "exp_isrl.py", "exp_fnas.py", "knn_instance_sweep.py",
                 "exp_label_spreading_student.py", "exp_abstain_noise_free.py",
                 "plot_sweep.py", "plot_selected.py"):
        assert gone not in tools, gone


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.stem)
def test_sweep_file_dry_run(path, capsys):
    assert cli.main(["sweep", str(path), "--dry-run"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["runs"] > 0
    head = path.read_text().split("[sweep]")[0]                  # the comment block
    assert f"fedjax-dp sweep configs/experiments/{path.name} --out results/" in head
    assert "tools/" not in head and "NOT reproduce" not in head   # no script, no gap list


@pytest.mark.parametrize("path", PAPER_SCALE, ids=lambda p: p.stem)
def test_paper_scale_sweep_file_dry_run(path, capsys):
    assert cli.main(["sweep", str(path), "--dry-run"]) == 0
    assert json.loads(capsys.readouterr().out)["runs"] > 0
    assert "tools/" not in path.read_text()


def test_output_score_is_the_accuracy_the_runner_reports():
    """``api.Output.score``: the fraction of correct predictions, or the output's own
    ``accuracy(x, y)`` when it defines one (a result that is not one model)."""
    import numpy as np
    from fedjax_dp.algorithms import api
    x, y = np.zeros((4, 2)), np.array([0, 1, 1, 1])
    out = api.Output(model=None, predict=lambda x: np.ones(len(x), np.int32))
    assert out.score(x, y) == 0.75
    mean_of_two = api.Output(model=None, predict=lambda x: np.ones(len(x), np.int32),
                             accuracy=lambda x, y: (1.0 + 0.5) / 2)
    assert mean_of_two.score(x, y) == 0.75 and isinstance(mean_of_two.score(x, y), float)


def test_tied_grid_key_sets_its_keys_together():
    """``"k1+k2" = [[a1, a2], ...]``: one run per pair (not the product), each key set; a value
    of the wrong length and a key set by two grid keys are refused before anything runs."""
    sw = sweep_lib.load([str(ROOT / "configs" / "experiments" / "fnas_table2.toml")])
    runs = sweep_lib.expand(sw)
    pairs = [(r.config["algorithm"]["noise_weights"], r.config["algorithm"]["noise_arch"])
             for r in runs]
    assert pairs == [(0.5, 0.5), (1.0, 1.0), (2.0, 2.0), (4.0, 4.0)]
    other = sweep_lib.load([str(ROOT / "configs" / "experiments" / "fnas_table2.toml")],
                           grid=["algorithm.noise_weights+algorithm.noise_arch=[0.5,4.0],[4,0.5]",
                                 "data.num_agents=2,4"])
    got = {(r.config["data"]["num_agents"], r.config["algorithm"]["noise_weights"],
            r.config["algorithm"]["noise_arch"]) for r in sweep_lib.expand(other)}
    assert got == {(n, a, b) for n in (2, 4) for a, b in ((0.5, 4.0), (4.0, 0.5))}
    assert sweep_lib.assignments("a.x", 3) == [("a.x", 3)]
    with pytest.raises(sweep_lib.ConfigError, match="list of 2 values"):
        sweep_lib.load([str(ROOT / "configs" / "experiments" / "fnas_table2.toml")],
                       grid=["algorithm.noise_weights+algorithm.noise_arch=1,2"])
    with pytest.raises(sweep_lib.ConfigError, match="both set 'algorithm.noise_arch'"):
        sweep_lib.load([str(ROOT / "configs" / "experiments" / "fnas_table2.toml")],
                       grid=["algorithm.noise_arch=1,2"])


def test_fnas_random_genotype_is_drawn_from_the_run_key_and_skips_the_search():
    """``algorithm.fixed_genotype = "random"``: no search step, a genotype of the configured
    size drawn from the run's key (the same for the same key, another for another key)."""
    from fedjax_dp.algorithms.fnas import dp_fnas
    prims = ("none", "max_pool_3x3", "skip_connect", "sep_conv_3x3")
    cfg = dp_fnas.Config(nodes=2, primitives=prims, fixed_genotype=dp_fnas.RANDOM_GENOTYPE)
    assert cfg.search_steps == 0 and dp_fnas.num_steps(cfg) == cfg.retrain_epochs
    g0 = dp_fnas.fixed_genotype(jax.random.key(0), cfg)
    assert g0 == dp_fnas.fixed_genotype(jax.random.key(0), cfg)
    assert any(dp_fnas.fixed_genotype(jax.random.key(s), cfg) != g0 for s in (1, 2, 3))
    assert g0.nodes == 2 and {op for op, _ in g0.normal + g0.reduce} <= set(prims) - {"none"}
    assert dp_fnas.fixed_genotype(jax.random.key(0), dp_fnas.Config()) is None     # search
    fixed = dp_fnas.Config(nodes=2, fixed_genotype=json.dumps(g0.to_json()))
    assert dp_fnas.fixed_genotype(jax.random.key(5), fixed) == g0
    with pytest.raises(ValueError, match="retrain_epochs"):
        dp_fnas.Config(fixed_genotype="random", retrain_epochs=0)


def _record(algorithm, q, target, seed, acc, val):
    return {"algorithm": algorithm, "dataset": "mnist5k", "base": f"{algorithm}/mnist5k",
            "seed": seed, "params": {"algorithm.num_queries": q, "data.num_agents": 50},
            "target_epsilon": target, "calibrated": {"key": "algorithm.sigma", "value": 3.0},
            "test_accuracy": acc, "val_accuracy": val, "epsilon": target and target * 0.9999,
            "epsilon_unit": "agent", "epsilon_accountant": "rdp", "delta": 1e-5,
            "privacy": [], "history": [], "wall_time_s": 1.0, "config": {}}


def test_plot_selected_draws_the_selected_rows(tmp_path, capsys):
    """``fedjax-dp plot DIR --selected``: the runs of the cells selected.json chose, one line
    per selected row, each point its test accuracy mean +- std."""
    pytest.importorskip("matplotlib")
    recs = []
    for algorithm in ("ae_dpfl", "knn_dpfl"):
        for target in (2.0, 8.0):
            for q, base_acc in ((50, 0.5), (200, 0.7)):
                for seed in (0, 1, 2):
                    acc = base_acc + 0.01 * seed + 0.05 * (target == 8.0)
                    # the validation split prefers Q = 50 for knn_dpfl, Q = 200 for ae_dpfl
                    val = acc if algorithm == "ae_dpfl" else 1.0 - acc
                    recs.append(_record(algorithm, q, target, seed, acc, val))
    sweep_dir = tmp_path / "sweep"
    sweep_dir.mkdir()
    (sweep_dir / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    rows = sweep_lib.write_selection(recs, sweep_dir, "val_accuracy", ["algorithm.num_queries"])
    assert (sweep_dir / "selected.json").is_file() and len(rows) == 4

    from fedjax_dp.experiments import plots
    chosen = records.selected_records(recs, records.read_selected([sweep_dir]))
    assert len(chosen) == 12                                       # 4 cells x 3 seeds
    assert {r["params"]["algorithm.num_queries"] for r in chosen
            if r["algorithm"] == "knn_dpfl"} == {50}
    points = plots.summarize(chosen, "target_epsilon", "test_accuracy", "setting")
    by_key = {(r["algorithm"], r["target_epsilon"]): r for r in rows}
    for p in points:
        row = by_key[(p["hue"].split()[0], p["x"])]
        assert p["mean"] == pytest.approx(row["test_accuracy_mean"])
        assert p["std"] == pytest.approx(row["test_accuracy_std"])
    assert {p["hue"] for p in points} == {"ae_dpfl num_agents=50", "knn_dpfl num_agents=50"}

    assert cli.main(["plot", str(sweep_dir), "--selected", "--x", "target_epsilon",
                     "--out", str(tmp_path / "sel")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["records"] == 12 and all(Path(p).stat().st_size > 0 for p in out["written"])
    (sweep_dir / "selected.json").unlink()
    with pytest.raises(ValueError, match="selected.json"):
        records.read_selected([sweep_dir])
