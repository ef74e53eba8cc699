"""Inputs consistent and bounded (issue 48, item 5), through the command line: converted data
that disagrees with itself, config sizes past their stated bounds, a delta at or above 1/N of the
units it protects, and a cohort empty in every round. Each is refused before any work with exit
status 2 and ONE line naming the key (or the file and the client), leaving no output behind."""
import json
from pathlib import Path

import numpy as np
import pytest

from fedjax_dp.experiments import cli

ROOT = Path(__file__).resolve().parents[1]
DP = str(ROOT / "configs" / "dp_fedavg" / "mnist5k.toml")          # 100 agents
FEDSGD = str(ROOT / "configs" / "dp_fedsgd" / "mnist5k.toml")      # 50 agents, 3000 records
ISRL = str(ROOT / "configs" / "isrl" / "wbcd_isrl_spider.toml")     # 2 silos, 341 records


def _refused(capsys, argv, *matches):
    code = cli.main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    for m in matches:
        assert m in err, err
    return err


# ----------------------------------------------------------------------- converted data

def _emnist_files(folder: Path, client: dict) -> Path:
    """``fed_emnist_{train,test}.h5``: two good writers and ``client`` as writer ``f0002_14``."""
    from federated_fixtures import emnist_clients, write_tff
    rng = np.random.default_rng(0)
    good = emnist_clients(rng, [3, 4])
    write_tff(folder / "fed_emnist_train.h5", {**good, "f0002_14": client})
    write_tff(folder / "fed_emnist_test.h5", dict(list(good.items())[:1]))
    return folder


def _pixels(n):
    return np.zeros((n, 28, 28), np.float32)


@pytest.mark.parametrize("client, match", [
    ({"pixels": _pixels(5), "label": np.zeros(1, np.int32)}, "label has 1 records but pixels "
     "has 5"),                                       # was: one label broadcast over five images
    ({"pixels": _pixels(5), "label": np.zeros(9, np.int32)}, "label has 9 records but pixels "
     "has 5"),                                       # was: nine labels cut to five
    ({"pixels": _pixels(5), "label": np.zeros(3, np.int32)}, "label has 3 records but pixels "
     "has 5"),                                       # was: a broadcast error naming neither
    ({"pixels": _pixels(5), "label": np.zeros(5, np.int32), "writer": np.zeros(4)},
     "writer has 4 records but pixels has 5"),       # a field the conversion does not read
    ({"pixels": _pixels(5), "label": np.int32(3)},
     "label has no records (a scalar) but pixels has 5"),
    ({"pixels": _pixels(5), "label": np.zeros((5, 2), np.int32)},
     "its labels have 10 records but its features have 5"),   # rows agree, records do not
], ids=["1 label", "9 labels", "3 labels", "unused field", "scalar", "two labels a row"])
def test_tff_client_fields_disagreeing_are_named(tmp_path, capsys, client, match):
    src = _emnist_files(tmp_path, client)
    dst = tmp_path / "pop"
    _refused(capsys, ["data", "convert", "tff_emnist", str(src), str(dst), "--quiet"],
             match, "client 'f0002_14'", "fed_emnist_train.h5")
    assert not dst.exists() and not (tmp_path / "pop.partial").exists()


@pytest.mark.parametrize("user, match", [
    ({"x": [[0.0] * 784] * 2, "y": [1]}, "user 'u1' has num_samples 2 but 2 x and 1 y"),
    ({"x": [[0.0] * 784], "y": [1, 2, 3]}, "user 'u1' has num_samples 1 but 1 x and 3 y"),
    ({"x": [[0.0] * 784], "y": 1}, "user_data['u1'] must be"),
])
def test_leaf_user_fields_disagreeing_are_named(tmp_path, capsys, user, match):
    for split in ("train", "test"):
        (tmp_path / split).mkdir()
        doc = {"users": ["u0", "u1"],
               "num_samples": [1, len(user["x"])],
               "user_data": {"u0": {"x": [[0.0] * 784], "y": [0]}, "u1": user}}
        (tmp_path / split / "s.json").write_text(json.dumps(doc))
    _refused(capsys, ["data", "convert", "leaf_femnist", str(tmp_path), str(tmp_path / "pop"),
                      "--quiet"], match, "s.json")
    assert not (tmp_path / "pop").exists()


def test_leaf_bad_num_samples_is_named(tmp_path, capsys):
    for split in ("train", "test"):
        (tmp_path / split).mkdir()
        doc = {"users": ["u0"], "num_samples": [-1], "user_data": {"u0": {"x": [], "y": []}}}
        (tmp_path / split / "s.json").write_text(json.dumps(doc))
    _refused(capsys, ["data", "convert", "leaf_femnist", str(tmp_path), str(tmp_path / "pop"),
                      "--quiet"], "user 'u0' has num_samples -1, not a count >= 0")


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """A converted 4-writer EMNIST population (the folder)."""
    from federated_fixtures import write_emnist
    from fedjax_dp.data import convert
    root = tmp_path_factory.mktemp("conv")
    write_emnist(root, np.random.default_rng(1), [2, 3, 2, 4], [1, 1])
    return Path(convert.convert("tff_emnist", root, root / "pop", progress=False)["folder"])


@pytest.mark.parametrize("change, match", [
    (lambda m: {**m, "train": m["train"][:3]}, "states 3 client ids but the arrays hold 4"),
    (lambda m: {**m, "train_records": 12}, "states train_records = 12 but the arrays hold 11"),
    (lambda m: {**m, "n_max": 5}, "states n_max = 5 but the arrays hold 4"),
])
def test_a_converted_folder_read_back_must_match_its_metadata(converted, tmp_path, capsys,
                                                              change, match):
    import shutil
    folder = tmp_path / "pop"
    shutil.copytree(converted, folder)
    meta = json.loads((folder / "clients.json").read_text())
    (folder / "clients.json").write_text(json.dumps(change(meta)))
    _refused(capsys, ["run", str(ROOT / "configs" / "benchmarks" / "emnist_fedavg.toml"),
                      "--set", f'data.dataset="stacked:{folder}"', "--set", "data.num_agents=4",
                      "--quiet", "--out", str(tmp_path / "out")], match, "clients.json")
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------- delta below 1/N

DELTA_CASES = [
    (DP, ["privacy.delta=0.5"], "privacy.delta = 0.5 must be below 1/N = 0.01 for the "
     "agent-level guarantee (N = 100 agents)"),             # reported epsilon 0.0 before
    (DP, ["privacy.delta=0.02"], "privacy.delta = 0.02 must be below 1/N = 0.01"),
    (DP, ["privacy.delta=0.01"], "privacy.delta = 0.01 must be below 1/N = 0.01"),   # = 1/N
    (FEDSGD, ["privacy.delta=1e-3"], "for the instance-level guarantee (N = 3000 records)"),
    (ISRL, ["algorithm.delta=0.01"], "algorithm.delta = 0.01 must be below 1/N = 0.00293 for "
     "the silo_record-level guarantee (N = 341 records)"),  # the calibration's target delta
]


@pytest.mark.parametrize("config, sets, match", DELTA_CASES,
                         ids=[" ".join(s) + " " + Path(c).stem for c, s, _ in DELTA_CASES])
def test_a_delta_at_or_above_one_over_n_is_refused(tmp_path, capsys, config, sets, match):
    argv = ["run", config, "--quiet", "--out", str(tmp_path / "out")]
    for s in sets:
        argv += ["--set", s]
    _refused(capsys, argv, match, "privacy.allow_large_delta = true")
    assert not (tmp_path / "out").exists()


def test_the_override_lets_a_large_delta_through():
    from fedjax_dp.experiments import config as config_lib
    from fedjax_dp.experiments import runner
    for path, sets, records in ((DP, ["privacy.delta=0.5"], None),
                                (FEDSGD, ["privacy.delta=1e-3"], 3000)):
        cfg = config_lib.load(path, sets + ["privacy.allow_large_delta=true"])
        runner.check_delta(runner.plan(cfg), agents=cfg["data"]["num_agents"], records=records)
        assert cfg["privacy"]["allow_large_delta"] is True
    # at its default the key is left out of the resolved config (stored runs keep their
    # fingerprints); a value below 1/N passes without it
    cfg = config_lib.load(FEDSGD, ["privacy.delta=3e-4"])
    assert "allow_large_delta" not in cfg["privacy"]
    runner.check_delta(runner.plan(cfg), agents=50, records=3000)


def test_sweeps_and_calibration_respect_the_bound(tmp_path, capsys):
    """A sweep's cell is refused when its data loads (the calibration sets it up), before any
    run is trained or recorded."""
    from fedjax_dp.experiments import calibrate
    from fedjax_dp.experiments import config as config_lib
    out = tmp_path / "sw"
    _refused(capsys, ["sweep", DP, "--out", str(out), "--set", "privacy.delta=0.02",
                      "--target-epsilon", "2", "--calibrate", "algorithm.noise_multiplier"],
             "privacy.delta = 0.02 must be below 1/N = 0.01")
    assert not (out / "results.jsonl").exists() or not (out / "results.jsonl").read_text()
    cfg = config_lib.load(FEDSGD, ["privacy.delta=1e-3"])
    with pytest.raises(ValueError, match=r"N = 3000 records\)"):
        calibrate.calibrate(cfg, "algorithm.noise_multiplier", 2.0)


def test_account_distributed_refuses_a_delta_at_or_above_one_over_the_population(capsys):
    argv = ["account", "distributed", "--kind", "ddg", "--bits", "16", "--dim", "10", "--clip",
            "1", "--population", "100", "--cohort", "10", "--rounds", "5", "--noise-multiplier",
            "1", "--delta"]
    _refused(capsys, argv + ["0.02"], "--delta = 0.02 must be below 1/N = 0.01",
             "--allow-large-delta")
    assert cli.main(argv + ["0.02", "--allow-large-delta"]) == 0
    assert json.loads(capsys.readouterr().out)["delta"] == 0.02


def test_every_private_algorithm_names_its_units_before_any_data():
    """The ``privacy_units`` hook: each registered private algorithm's units from its default
    config alone; the default reads ``ledger(config, None)``, every documented unit where that
    needs the state."""
    import types
    from fedjax_dp.algorithms import api, registry
    from fedjax_dp.privacy import UNITS, PrivacyLedger, accounting
    for name in registry.names():
        h = api.hooks(registry.get(name))
        units = h.privacy_units(registry.get(name).Config())
        assert set(units) <= set(UNITS) and (units or not h.private or name == "fedkt"), name
    one = PrivacyLedger().add_event("party", accounting.gaussian_event(1.0), relation="r")
    assert api.hooks(types.SimpleNamespace(ledger=lambda c, s: one)).privacy_units(None) == \
        ("party",)

    def needs_state(config, state):
        raise ValueError("needs the run's state")
    assert api.hooks(types.SimpleNamespace(ledger=needs_state)).privacy_units(None) == \
        tuple(UNITS)


def test_the_bound_counts_agents_or_records_by_unit():
    from fedjax_dp.privacy import delta_bound
    assert [delta_bound.kind(u) for u in ("agent", "party", "instance", "example",
                                          "silo_record", "shuffle", "instance (party 2)",
                                          "something_new")] == \
        ["agents"] * 2 + ["records"] * 6
    delta_bound.check(0.0099, ["agent"], agents=100)
    delta_bound.check(0.5, ["instance"], agents=100)                 # records not known yet
    with pytest.raises(delta_bound.DeltaBoundError, match="for the party-level"):
        delta_bound.check(0.2, ["party"], agents=5, records=1000)


# ------------------------------------------------------------------ config sizes bounded

SIZE_CASES = [
    (DP, ["model.hidden=[" + ", ".join(["8"] * 65) + "]"],
     "model.hidden must be a list of 0 to 64 item(s), got 65 items"),
    (DP, ['privacy.accountants=["rdp", "rdp"]'], "privacy.accountants must not list an item twice"),
    (DP, ['privacy.accountants=["rdp", "pld", "rdp"]'],
     "privacy.accountants must be a list of 1 to 2 item(s), got 3 items"),
    (DP, ["model.name=char_lstm", "model.options.layers=1000"],
     "model.options.layers must be in [1, 64]"),
    (DP, ["model.name=char_lstm", "model.options.hidden=1e6"],
     "model.options.hidden must be in [1, 65536]"),
    (DP, ["model.name=cnn_emnist", "model.options.conv_channels=[" + ", ".join(["2"] * 65) + "]"],
     "model.options.conv_channels must be a list of 1 to 64"),
    (DP, ["model.name=resnet18_gn", "model.options.stage_blocks=[1, 1, 1, 100]"],
     "model.options.stage_blocks[] must be in [1, 64]"),
    (DP, ["data.partition=dirichlet", "data.partition_options.beta=0.5",
          "data.partition_options.max_tries=1e9"],
     "data.partition_options.max_tries must be in [1, 100000]"),
    (DP, ["data.dataset=synthetic", "data.dataset_options.num_classes=1e9"],
     "num_classes must be in [2, 65536]"),           # the generated means' memory
]


@pytest.mark.parametrize("config, sets, match", SIZE_CASES, ids=[m[:40] for _, _, m in SIZE_CASES])
def test_config_sizes_past_their_bound_are_refused(tmp_path, capsys, config, sets, match):
    argv = ["run", config, "--quiet", "--out", str(tmp_path / "out")]
    for s in sets:
        argv += ["--set", s]
    _refused(capsys, argv, match)
    assert not (tmp_path / "out").exists()


def test_sweep_sizes_are_bounded(capsys):
    _refused(capsys, ["sweep", DP, "--dry-run", "--seeds", "100000"],
             "--seeds must be in [1, 10000]")
    many = ",".join(str(i) for i in range(1, 201))
    _refused(capsys, ["sweep", DP, "--dry-run", "--grid", f"algorithm.rounds={many}",
                      "--grid", f"train.steps={many}"],
             "the sweep holds 40,000 runs (200 (--grid algorithm.rounds) x 200 (--grid "
             "train.steps)); at most 10,000 runs")


# ------------------------------------------------------------------- cohorts never empty

@pytest.mark.parametrize("config, rate, match", [
    (DP, 1e-6, "algorithm.sampling_rate = 1e-06 with 100 agents and 30 round(s)"),
    (FEDSGD, 1e-4, "every round's cohort is empty with probability 0.882"),
])
def test_a_cohort_empty_in_every_round_is_refused(tmp_path, capsys, config, rate, match):
    _refused(capsys, ["run", config, "--quiet", "--out", str(tmp_path / "out"), "--set",
                      f"algorithm.sampling_rate={rate}"], match, "raise algorithm.sampling_rate")
    assert not (tmp_path / "out").exists()


def test_the_empty_cohort_rule():
    from fedjax_dp.core import cohort
    ok = cohort.Sampling("poisson", rate=0.01)
    ok.check(100, 30)                        # P(all 30 rounds empty) = 0.99^3000: tiny
    ok.check(100)                            # without rounds: no probabilistic check
    with pytest.raises(ValueError, match="probability 0.605"):
        ok.check(10, 5)                      # 0.99^50 = 0.605 >= 1/2
    with pytest.raises(ValueError, match="empty with probability 1 "):
        cohort.Sampling("poisson", rate=1e-12).check(10 ** 6, 10)   # below the coins' 2^-32
    cohort.Sampling("fixed", size=1).check(5, 1)
