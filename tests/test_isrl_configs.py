"""ISRL configs and the command line: every config validates, the CLI lists the family, and a
run's result.json reports the worst silo's epsilon as dp-accounting computes it."""
import json
import logging
from pathlib import Path

import dp_accounting
import numpy as np
import pytest

from fedjax_dp.algorithms import isrl
from fedjax_dp.algorithms import registry
from fedjax_dp.experiments import cli, runner
from fedjax_dp.experiments import config as config_lib
from fedjax_dp.privacy import accounting

logging.getLogger("absl").setLevel(logging.ERROR)

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs" / "isrl").glob("*.toml"))


def test_every_algorithm_has_wbcd_and_mnist_configs_and_is_registered():
    names = {p.stem for p in CONFIGS}
    for algo in isrl.ALGORITHMS:
        assert registry.get(algo) is isrl.ALGORITHMS[algo]
        assert f"wbcd_{algo}" in names and f"mnist5k_oddeven_{algo}" in names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_plans(path):
    config = config_lib.load(path)
    from fedjax_dp import data
    if config["data"]["dataset"] not in data.DATASETS:
        pytest.skip(f"dataset {config['data']['dataset']} not in this checkout")
    plan = runner.plan(config)
    assert isinstance(plan.algorithm_config, plan.entry.Config)
    if hasattr(plan.algorithm_config, "delta"):         # target delta = [privacy].delta
        assert plan.algorithm_config.delta == config["privacy"]["delta"]


def test_list_names_the_family(capsys):
    assert cli.main(["list", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    for name in isrl.ALGORITHMS:
        assert name in listing["algorithms"]


def test_cli_run_reports_worst_silo_epsilon(tmp_path, capsys):
    path = ROOT / "configs" / "isrl" / "wbcd_isrl_spider.toml"
    argv = ["run", str(path), "--out", str(tmp_path), "--quiet", "--set", "algorithm.rounds=3",
            "--set", "run.eval_every=0", "--set", "algorithm.num_available=1",
            "--set", "algorithm.report_objective=true"]      # an opt-in (not private)
    assert cli.main(argv) == 0, capsys.readouterr().err
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["algorithm"] == "isrl_spider" and result["num_agents"] == 2
    history = result["history"]
    assert len(history) == 3 and all(np.isfinite(h["objective"]) for h in history)
    delta = result["config"]["privacy"]["delta"]
    rows = {g["accountant"]: g for g in result["privacy"]}
    assert set(rows) == {"rdp", "pld"}
    # recompute: the worst member event reported, then dp-accounting directly on it
    for acc, row in rows.items():
        assert row["unit"] == "silo_record" and row["delta"] == delta
        event = accounting.event_from_json(row["events"][0])
        direct = (dp_accounting.rdp.RdpAccountant(list(accounting.DEFAULT_RDP_ORDERS))
                  if acc == "rdp" else
                  dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4))
        direct.compose(event)
        assert row["epsilon"] == pytest.approx(direct.get_epsilon(delta), rel=1e-9)
    # M = 1 of 2 silos: 3 uploads in all, the worst silo composed at most 3, calibrated for 3
    assert rows["rdp"]["epsilon"] <= result["config"]["algorithm"]["target_epsilon"] + 1e-9
