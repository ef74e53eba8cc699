"""The fedjax-dp command line: run writes result.json per the contract, list, account, errors."""
import contextlib
import io
import json
import math
import subprocess
import sys
from pathlib import Path

import dp_accounting
import pytest

from fedjax_dp.experiments import cli
from fedjax_dp.experiments import config as config_lib
from fedjax_dp.privacy import accounting

ROOT = Path(__file__).resolve().parents[1]
DP_CONFIG = ROOT / "configs" / "dp_fedavg" / "mnist5k.toml"
SMALL = ["data.num_agents=20", "algorithm.rounds=3", "train.steps=2", "model.hidden=[16]",
         "run.eval_every=0"]


def _run(capsys, argv):
    code = cli.main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def device_run(tmp_path_factory):
    """One ``fedjax-dp run`` of the small DP-FedAvg config (device-resident agents, diagnostics
    on), not ``--quiet``: its folder, result.json and what it printed (shared by the result
    contract test and the host-resident comparison)."""
    folder = tmp_path_factory.mktemp("device") / "device"
    argv = ["run", str(DP_CONFIG), "--out", str(folder), "--set", "run.agents_on=device",
            "--set", "algorithm.diagnostics=true"]
    for s in SMALL:
        argv += ["--set", s]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(argv)
    assert code == 0, err.getvalue()
    return folder, json.loads((folder / "result.json").read_text()), out.getvalue()


def test_run_dp_fedavg_result_contract_and_epsilon(device_run):
    tmp_path, result, out = device_run
    for field in ("algorithm", "dataset", "num_agents", "test_accuracy", "privacy",
                  "wall_time_s", "seed", "config", "versions"):
        assert field in result
    assert result["algorithm"] == "dp_fedavg" and result["dataset"] == "mnist5k"
    assert result["num_agents"] == 20 and 0.0 <= result["test_accuracy"] <= 1.0
    assert result["config"]["algorithm"]["rounds"] == 3            # overrides resolved
    assert len((tmp_path / "progress.jsonl").read_text().splitlines()) == 3
    cfg = result["config"]["algorithm"]
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(cfg["sampling_rate"],
                                            dp_accounting.GaussianDpEvent(cfg["noise_multiplier"])),
        cfg["rounds"])
    delta = result["config"]["privacy"]["delta"]
    by_acc = {g["accountant"]: g for g in result["privacy"]}
    assert set(by_acc) == {"rdp", "pld"}
    rdp = dp_accounting.rdp.RdpAccountant(list(accounting.DEFAULT_RDP_ORDERS))
    rdp.compose(event)
    assert by_acc["rdp"]["epsilon"] == pytest.approx(rdp.get_epsilon(delta), rel=1e-9)
    pld = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    pld.compose(event)
    assert by_acc["pld"]["epsilon"] == pytest.approx(pld.get_epsilon(delta), rel=1e-6)
    for g in result["privacy"]:
        assert g["unit"] == "agent" and g["delta"] == delta and g["data_dependent"] is False
        assert g["events"][0]["class_name"] == "SelfComposedDpEvent"
        assert g["events"][0]["event"]["class_name"] == "PoissonSampledDpEvent"
    printed = json.loads(out)
    assert printed["test_accuracy"] == result["test_accuracy"]


def test_host_resident_agents_give_the_same_run(tmp_path, capsys, device_run):
    """``run.agents_on = "host"``: only each round's cohort is copied to the device; the run,
    its history and its guarantee are those of the device-resident run (``device_run``)."""
    argv = ["run", str(DP_CONFIG), "--out", str(tmp_path / "host"), "--quiet",
            "--set", "run.agents_on=host", "--set", "algorithm.diagnostics=true"]
    for s in SMALL:
        argv += ["--set", s]
    code, _, err = _run(capsys, argv)
    assert code == 0, err
    host = json.loads((tmp_path / "host" / "result.json").read_text())
    dev = device_run[1]
    assert host["test_accuracy"] == dev["test_accuracy"]
    assert [r["train_loss"] for r in host["history"]] == [r["train_loss"] for r in dev["history"]]
    assert [g["epsilon"] for g in host["privacy"]] == [g["epsilon"] for g in dev["privacy"]]
    cohort = host["cohort"]                # the compilations are counted and reported
    assert cohort["execution"] == "gather" and 1 <= len(cohort["buckets"]) <= 3
    assert 1 <= len(cohort["compiled_pass_sizes"]) and \
        set(cohort["compiled_pass_sizes"]) <= set(cohort["buckets"])


def test_progress_bar_reports_rate_and_eta_on_a_terminal(monkeypatch, capsys):
    from fedjax_dp.core import progress
    monkeypatch.setattr(progress, "interactive", lambda: True)
    monkeypatch.delenv("CI", raising=False)
    reporter = progress.bar(True)
    assert reporter.enabled and not progress.bar(False).enabled
    reporter = progress.TqdmProgress(mininterval=0)          # redraw on every update
    with reporter.task("rounds", total=4, unit="round") as task:
        for _ in range(4):
            task.set(train_loss=0.5)
            task.update(1)
    err = capsys.readouterr().err
    assert "4/4" in err and "round/s" in err and "train_loss=0.5" in err
    monkeypatch.setattr(progress, "interactive", lambda: False)    # CI, pipes, --quiet: silent
    assert progress.bar(True) is progress.SILENT


def test_list(capsys):
    code, out, _ = _run(capsys, ["list", "--json"])
    listing = json.loads(out)
    assert code == 0
    assert {"fedavg", "dp_fedavg"} <= set(listing["algorithms"])
    assert {"digits", "wbcd", "mnist5k", "synthetic"} <= set(listing["datasets"])
    assert {"iid", "dirichlet", "label_shards", "one_class", "by_domain"} <= set(
        listing["partitions"])
    assert listing["models"] == ["logistic", "mlp", "cnn", "cnn_emnist", "resnet18_gn",
                                 "char_lstm", "word_lstm", "transformer_lm"]


def test_account_sampled_gaussian_matches_dp_accounting(capsys):
    code, out, _ = _run(capsys, ["account", "sampled-gaussian", "--noise-multiplier", "1.1",
                                 "--sampling-rate", "0.01", "--steps", "1000", "--delta", "1e-5"])
    assert code == 0
    report = json.loads(out)
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.1)), 1000)
    rdp = dp_accounting.rdp.RdpAccountant(list(accounting.DEFAULT_RDP_ORDERS))
    rdp.compose(event)
    assert report["epsilon"]["rdp"] == pytest.approx(rdp.get_epsilon(1e-5), rel=1e-9)
    assert report["epsilon"]["pld"] <= report["epsilon"]["rdp"]


def test_account_gaussian_known_value(capsys):
    """Gaussian, sensitivity 1, sigma 25, 500 compositions, delta 1e-3: eps about 3.09 (RDP)."""
    code, out, _ = _run(capsys, ["account", "gaussian", "--noise-multiplier", "25", "--count",
                                 "500", "--delta", "1e-3", "--accountant", "rdp"])
    assert code == 0
    assert json.loads(out)["epsilon"]["rdp"] == pytest.approx(3.09, abs=0.01)


def test_config_override_parsing():
    assert config_lib.parse_value("3") == 3 and config_lib.parse_value("1e-5") == 1e-5
    assert config_lib.parse_value("[1, 2]") == [1, 2] and config_lib.parse_value("true") is True
    assert config_lib.parse_value("mnist5k") == "mnist5k"
    cfg = config_lib.resolve({}, ["data.partition_options.beta=0.5"])
    assert cfg["data"]["partition_options"] == {"beta": 0.5}


def test_console_script_entry_point():
    proc = subprocess.run([sys.executable, "-m", "fedjax_dp.experiments.cli", "list"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "dp_fedavg" in proc.stdout


def test_fedkt_run_writes_votes_and_account_command_reproduces_its_epsilons(tmp_path, capsys):
    out = tmp_path / "fedkt"
    # the data-dependent guarantees and their input votes.npz: an opt-in (not private)
    # (3 trees per forest in place of 100: the votes and their accounting are what is checked)
    assert cli.main(["run", "configs/fedkt/wbcd.toml", "--out", str(out), "--quiet",
                     "--set", "algorithm.data_dependent=true",
                     "--set", "algorithm.tree_estimators=3"]) == 0
    capsys.readouterr()
    result = json.loads((out / "result.json").read_text())
    assert (out / "votes.npz").is_file() and result["votes_file"] == str(out / "votes.npz")
    argv = result["account_command"].split()
    assert argv[:3] == ["fedjax-dp", "account", "fedkt"]
    assert cli.main(argv[1:]) == 0
    report = json.loads(capsys.readouterr().out)
    for g in result["privacy"]:
        row = report["units"][g["unit"]]
        got = row["data_dependent"]["rdp"] if g["data_dependent"] else \
            row["data_independent"][g["accountant"]]
        assert got == pytest.approx(g["epsilon"], rel=1e-9), g


def test_run_with_distributed_noise(tmp_path, capsys):
    """Skellam noise under secure aggregation from the command line (a fixed cohort, 14 bits):
    the ledger's entry is the distributed RDP curve (data-independent, replace-one, its plan in
    the note), and every round is released."""
    argv = ["run", str(DP_CONFIG), "--out", str(tmp_path), "--set", 'algorithm.aggregation="secagg"',
            "--set", 'algorithm.sampling="fixed"', "--set", "algorithm.cohort_size=5",
            "--set", 'algorithm.distributed_noise={kind="skellam", bits=14}',
            "--set", "algorithm.diagnostics=true"]
    for s in SMALL:
        argv += ["--set", s]
    code, out, err = _run(capsys, argv)
    assert code == 0, err
    result = json.loads((tmp_path / "result.json").read_text())
    [entry] = [g for g in result["privacy"] if g["unit"] == "agent"]
    assert not entry["data_dependent"] and entry["relation"].startswith("replace one")
    assert "distributed skellam noise under secure aggregation mod 2^14" in entry["notes"][0]
    assert 0 < entry["epsilon"] < math.inf and "rdp" in entry["events"][-1]
    assert [h["released"] for h in result["history"]] == [1.0] * 3
    assert [h["num_sampled"] for h in result["history"]] == [5.0] * 3


def test_run_with_the_newer_mechanisms(tmp_path, capsys):
    """Adaptive clipping and correlated noise from the command line, in one run (as
    configs/dp_fedavg/mnist5k_adaptive_banded_mf.toml composes them): the history carries C_t,
    the ledger the unclipped count and the amplified banded MF event (SelfComposed over
    ceil(T / b) participations)."""
    argv = ["run", str(DP_CONFIG), "--out", str(tmp_path), "--set",
            "algorithm.adaptive_clip={target_quantile=0.5, learning_rate=0.3, count_noise=3.0}",
            "--set", 'algorithm.noise={kind="banded_mf", bands=3}']
    for s in SMALL:
        argv += ["--set", s]
    code, out, err = _run(capsys, argv)
    assert code == 0, err
    result = json.loads((tmp_path / "result.json").read_text())
    entry = result["privacy"][0]
    clips = [h["clip_norm"] for h in result["history"]]
    assert clips[0] == pytest.approx(1.0) and len(set(clips)) == 3
    assert "unclipped count" in entry["notes"][0]
    event = accounting.event_from_json(entry["events"][0])
    assert event.count == 1 and event.event.sampling_probability == 0.3   # ceil(3 / 3)


def test_account_distributed_plans_and_calibrates(capsys):
    """``fedjax-dp account distributed``: the calibrated z meets the target; the same z given
    back reports that epsilon; too few bits or both/neither of z and the target are one-line
    errors naming the flag."""
    base = ["account", "distributed", "--kind", "skellam", "--bits", "12", "--dim", "610",
            "--clip", "0.25", "--population", "30", "--cohort", "10", "--rounds", "20",
            "--delta", "1e-3"]
    assert cli.main(base + ["--target-epsilon", "5"]) == 0
    calibrated = json.loads(capsys.readouterr().out)
    assert calibrated["calibrated"] and 4.99 <= calibrated["epsilon"] <= 5.0
    assert calibrated["plan"]["padded_dim"] == 1024 and calibrated["plan"]["bits"] == 12
    z = calibrated["noise_multiplier"]
    assert cli.main(base + ["--noise-multiplier", str(z)]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["epsilon"] == pytest.approx(calibrated["epsilon"], rel=1e-9)
    assert not again["calibrated"]
    assert cli.main(base) == 2
    assert "exactly one of --noise-multiplier and --target-epsilon" in capsys.readouterr().err
    bad = ["3" if a == "12" else a for a in base]
    assert cli.main(bad + ["--noise-multiplier", "1"]) == 2
    assert "bits=3 is too few" in capsys.readouterr().err
