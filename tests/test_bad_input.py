"""Bad input, table-driven, through the command line and the Python API.

Every entry fails before any work with ONE line that names the parameter (and its allowed range
or choices): the CLI exits with status 2 and no traceback, leaves no run in a fresh ``--out`` and
never writes over an earlier run; the API raises ``ValueError``.
"""
import json
import math
from pathlib import Path

import jax
import numpy as np
import pytest

import cli_parser_once

ROOT = Path(__file__).resolve().parents[1]
DP = str(ROOT / "configs" / "dp_fedavg" / "mnist5k.toml")
KNN = str(ROOT / "configs" / "knn_dpfl" / "mnist5k.toml")
AE = str(ROOT / "configs" / "ae_dpfl" / "mnist5k.toml")
ISRL = str(ROOT / "configs" / "isrl" / "wbcd_isrl_spider.toml")

#: (config, --set overrides, what the one-line error must contain)
CLI_RUN = [
    (DP, ["algorithm.noise_multiplier=-2"], "algorithm.noise_multiplier must be in [0, 1e+12]"),
    (DP, ["algorithm.noise_multiplier=1e300"], "algorithm.noise_multiplier must be in [0, 1e+12]"),
    (DP, ["algorithm.noise_multiplier=nan"], "algorithm.noise_multiplier must be a number"),
    (DP, ["algorithm.noise_multiplier=inf"], "algorithm.noise_multiplier must be in [0, 1e+12]"),
    (DP, ["privacy.delta=0"], "privacy.delta must be in (0, 1)"),
    (DP, ["privacy.delta=1.5"], "privacy.delta must be in (0, 1)"),
    (DP, ["algorithm.sampling_rate=1.5"], "algorithm.sampling_rate must be in (0, 1]"),
    (DP, ["algorithm.sampling_rate=-0.1"], "algorithm.sampling_rate must be in (0, 1]"),
    (DP, ["algorithm.clip_norm=0"], "algorithm.clip_norm must be a finite number > 0"),
    (DP, ["algorithm.sampling=fixed", "algorithm.cohort_size=0"], "algorithm.cohort_size"),
    (DP, ["data.num_agents=0"], "data.num_agents must be >= 1"),
    (DP, ["data.num_agents=100000"], "data.num_agents must be in [1, 3000]"),   # empty agents
    (DP, ["algorithm.name=foo"], "algorithm.name must be one of"),
    (DP, ["data.dataset=cifar100"], "data.dataset must be one of"),
    (DP, ["data.partition=foo"], "data.partition must be one of"),
    (DP, ["model.name=resnet"], "model.name must be one of"),
    (DP, ["model.hidden=[0]"], "model.hidden[] must be in [1, 65536]"),
    (DP, ['privacy.accountants=["foo"]'], "privacy.accountants[] must be one of"),
    (DP, ["algorithm.nosie=1"], "algorithm.nosie"),
    (DP, ["datta.num_agents=3"], "datta"),
    (DP, ['algorithm.rounds="many"'], "algorithm.rounds must be an integer"),
    (DP, ["algorithm.rounds=2.5"], "algorithm.rounds must be an integer"),
    (DP, ["train.steps=true"], "train.steps must be an integer"),
    (DP, ["run.progress=3"], "run.progress must be true or false"),
    (DP, ["seed=-1"], "seed must be in [0, 4294967295]"),
    (DP, ["train.batch_size=0"], "train.batch_size must be in [1, 1048576]"),
    (DP, ["train.learning_rate=nan"], "train.learning_rate must be a number"),
    (DP, ["train.learning_rate=-0.1"], "train.learning_rate"),
    (DP, ["train.optimizer=foo"], "train.optimizer must name an optax optimizer"),
    (DP, ["run.chunk_size=-1"], "run.chunk_size must be >= 0"),
    (DP, ["run.agents_on=gpu"], "run.agents_on must be one of"),
    (DP, ["run.checkpoint_every=-1"], "run.checkpoint_every must be >= 0"),
    (DP, ["data.image_size=-3"], "data.image_size must be in [0, 4096]"),
    (DP, ["data.partition=dirichlet", "data.partition_options.beta=-1"],
     "data.partition_options.beta must be > 0"),
    (DP, ["data.dataset_options.foo=1"], "data.dataset_options"),
    (DP, ["data.partition_options.beta=1"], "data.partition_options for 'iid'"),
    (DP, ["data.partition=dirichlet", "data.partition_options.betta=1"],
     "it accepts ['beta', 'min_size', 'max_tries']"),
    (DP, ["data.server_dataset=digits", "data.server_dataset_options.foo=1"],
     "data.server_dataset_options for 'digits'"),
    (DP, ['run.compilation_cache=""'], "run.compilation_cache must be"),
    (DP, ["data.server_dataset_options.seed=1"],
     "data.server_dataset_options needs data.server_dataset"),
    (str(ROOT / "configs" / "benchmarks" / "emnist_fedavg.toml"), ["data.dataset_options.seed=1"],
     "data.dataset_options cannot be used with a stacked population"),   # before its folder
    (KNN, ["algorithm.k=100000"], "algorithm.k must be in [1, 60]"),     # k above a record count
    (AE, ["algorithm.num_queries=100000"], "algorithm.num_queries must be <="),
    (AE, ["algorithm.sigma=-1"], "algorithm.sigma must be in (0, 1e+12]"),
    (AE, ["algorithm.aggregation=secagg", "algorithm.secagg_talliers=1"],
     "algorithm.secagg_talliers must be >= 2"),
    (ISRL, ["algorithm.target_epsilon=0"], "algorithm.target_epsilon must be a finite number > 0"),
    (ISRL, ["algorithm.target_epsilon=1e-9"], "unreachable: even noise multiplier 500 gives a "
     "silo epsilon of"),                           # named by its config key, not the bracket
    (str(ROOT / "configs" / "isrl" / "wbcd_sdp_mb_sgd.toml"),
     ["algorithm.target_epsilon=1e-9", "algorithm.rounds=2"],
     "at delta=2.1e-05); raise algorithm.target_epsilon"),   # SDP: named by its config key
    (ISRL, ["algorithm.num_available=5"], "algorithm.num_available must be in [1, 2]"),
]


def _cli(capsys, argv):
    code = cli_parser_once.main(argv)          # cli.main, its parser built once per process
    err = capsys.readouterr().err.strip()
    return code, err


def _one_line(code, err, match):
    assert code == 2, err
    assert match in err, err
    assert "Traceback" not in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("config,sets,match", CLI_RUN,
                         ids=[" ".join(s) for _, s, _ in CLI_RUN])
def test_cli_run_bad_input(tmp_path, capsys, config, sets, match):
    argv = ["run", config, "--quiet", "--out", str(tmp_path / "out")]
    for s in sets:
        argv += ["--set", s]
    _one_line(*_cli(capsys, argv), match)
    assert not (tmp_path / "out").exists()              # no run left behind


def test_cli_bad_input_never_overwrites_an_earlier_run(tmp_path, capsys):
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "result.json").write_text(json.dumps({"test_accuracy": 0.9}))
    for sets in (["algorithm.k=100000"], []):          # a bad input, then a good one
        argv = ["run", KNN, "--quiet", "--out", str(earlier)]
        for s in sets:
            argv += ["--set", s]
        code, err = _cli(capsys, argv)
        assert code == 2 and len(err.splitlines()) == 1
    assert json.loads((earlier / "result.json").read_text()) == {"test_accuracy": 0.9}
    assert sorted(p.name for p in earlier.iterdir()) == ["result.json"]


CLI_OTHER = [
    (lambda t: ["run", str(t / "bad.toml")], "is not valid TOML"),
    (lambda t: ["run", "no/such/config.toml"], "does not exist"),
    (lambda t: ["run", DP, "--out", str(t / "afile")], "is a file, not a folder"),
    (lambda t: ["run", DP, "--out", str(t / "afile" / "sub")], "is not a writable folder"),
    (lambda t: ["run", DP, "--out", str(t / "earlier")], "already holds a run"),
    (lambda t: ["run", "--resume", str(t)], "holds no run"),
    (lambda t: ["run"], "CONFIG is required"),
    (lambda t: ["plot", str(ROOT / "results" / "sweeps" / "fnas_discriminative"), "--out",
                str(t / "afile" / "sub")], "afile' is a file, not a folder"),   # before reading
    (lambda t: ["compare", "arms", str(ROOT / "results" / "sweeps" / "fnas_discriminative"),
                "--arm", "seed", "--out", str(t / "afile" / "x")], "is a file, not a folder"),
    (lambda t: ["sweep", DP, "--dry-run", "--set", "data.partition_options.zzz=1"],
     "data.partition_options for 'iid'"),           # a sweep's typo: refused before any cell
    (lambda t: ["sweep", DP, "--out", str(t / "sw"), "--compilation-cache", " "],
     "compilation cache must be"),
    (lambda t: ["account", "gaussian", "--noise-multiplier", "1", "--count", "5", "--delta", "2"],
     "--delta"),
    (lambda t: ["account", "sampled-gaussian", "--noise-multiplier", "-1", "--sampling-rate",
                "0.1", "--steps", "5", "--delta", "1e-5"], "noise_multiplier"),
    (lambda t: ["account", "sampled-gaussian", "--noise-multiplier", "1", "--sampling-rate",
                "1.5", "--steps", "5", "--delta", "1e-5"], "sampling_rate must be in (0, 1]"),
    (lambda t: ["account", "gaussian-vote", "--sigma", "0", "--queries", "3", "--delta", "1e-5",
                "--unit", "agent"], "sigma must be > 0"),
    (lambda t: ["account", "gaussian-vote", "--sigma", "1", "--queries", "3", "--delta", "1e-5",
                "--unit", "instance", "--algorithm", "knn"], "--k must be given"),
]


@pytest.mark.parametrize("make_argv,match", CLI_OTHER, ids=[m for _, m in CLI_OTHER])
def test_cli_other_bad_input(tmp_path, capsys, make_argv, match):
    (tmp_path / "bad.toml").write_text("[data\nnum_agents = ")
    (tmp_path / "afile").write_text("x")
    (tmp_path / "earlier").mkdir()
    (tmp_path / "earlier" / "result.json").write_text("{}")
    _one_line(*_cli(capsys, make_argv(tmp_path)), match)
    assert (tmp_path / "earlier" / "result.json").read_text() == "{}"


# ----------------------------------------------------------------------------- Python API

def _agents(x=None, y=None):
    from fedjax_dp.core import from_arrays
    rng = np.random.default_rng(0)
    x = rng.random((3, 5, 4), np.float32) if x is None else x
    y = np.zeros((3, 5), np.int32) if y is None else y
    return from_arrays(x, y, np.array([5, 5, 5]))


def _with(x_change=None, y_change=None):
    rng = np.random.default_rng(0)
    x, y = rng.random((3, 5, 4), np.float32), np.zeros((3, 5), np.int32)
    if x_change:
        x[x_change[0]] = x_change[1]
    if y_change:
        y[y_change[0]] = y_change[1]
    return x, y


def _dp_fedavg_init(agents, num_classes=3):
    from fedjax_dp.algorithms import api
    from fedjax_dp.algorithms.averaging import dp_fedavg
    from fedjax_dp.models import make_model
    data = api.FederatedData(agents=agents, num_classes=num_classes)
    return dp_fedavg.init(jax.random.key(0), data, make_model("logistic", (4,), 3),
                          dp_fedavg.Config(rounds=1))


def _knn_init(k):
    from fedjax_dp.algorithms import api
    from fedjax_dp.algorithms.voting import knn_dpfl
    from fedjax_dp.models import make_model
    data = api.FederatedData(agents=_agents(), num_classes=3,
                             x_public=np.zeros((10, 4), np.float32))
    return knn_dpfl.init(jax.random.key(0), data, make_model("logistic", (4,), 3),
                         knn_dpfl.Config(k=k, num_queries=3, sigma=1.0))


def _api_cases():
    from fedjax_dp.algorithms import api
    from fedjax_dp.algorithms.averaging import dp_fedavg, dp_fedsgd
    from fedjax_dp.audit import audit
    from fedjax_dp.core import cohort, from_arrays, from_ragged
    from fedjax_dp.models import make_model
    from fedjax_dp.privacy import PrivacyLedger, accounting, mechanisms, noise
    from fedjax_dp.privacy.secagg import SecAggConfig
    key = jax.random.key(0)
    event = accounting.gaussian_event(1.0)
    ledger = PrivacyLedger().add_event("agent", event, relation="add/remove", sensitivity=1.0)
    nan_x, _ = _with(x_change=((1, 2, 0), np.nan))
    inf_x, _ = _with(x_change=((0, 0, 0), np.inf))
    _, big_y = _with(y_change=((0, 0), 7))
    _, neg_y = _with(y_change=((2, 1), -1))
    x, y = _with()
    return [
        (lambda: noise.gaussian_noise(key, (3,), -1.0), "std must be a finite number >= 0"),
        (lambda: mechanisms.gaussian_mechanism(key, np.zeros(3), 1.0, math.nan),
         "noise_multiplier"),
        (lambda: accounting.epsilon(event, 0.0), "delta"),
        (lambda: accounting.sampled_gaussian_event(1.0, 1.5, 10), "sampling_rate"),
        (lambda: ledger.epsilon("agent", 2.0), "delta"),
        (lambda: _dp_fedavg_init(_agents(x=nan_x)), "features must be finite"),
        (lambda: _dp_fedavg_init(_agents(x=inf_x)), "features must be finite"),
        (lambda: _dp_fedavg_init(_agents(y=big_y)), "labels must be in [0, 2]"),
        (lambda: _dp_fedavg_init(_agents(y=neg_y)), "labels must be in [0, 2]"),
        (lambda: from_ragged([x[0], x[1][:0]], [y[0], y[1][:0]]), "agent 1 has no records"),
        (lambda: from_ragged([], []), "at least one agent"),
        (lambda: from_arrays(x, y[:2], np.array([5, 5, 5])), "y must have shape [3, 5]"),
        (lambda: api.FederatedData(agents=_agents(), num_classes=3,
                                   x_public=np.zeros((4, 7))), "data.x_public has feature shape"),
        (lambda: _knn_init(9), "algorithm.k must be in [1, 5]"),
        (lambda: api.Runtime(chunk_size=0), "runtime.chunk_size must be >= 1"),
        (lambda: api.Runtime(backend="pmap"), "runtime.backend must be one of"),
        (lambda: api.Runtime(cohort="all"), "runtime.cohort must be one of"),
        (lambda: cohort.Sampling(kind="poisson", rate=1.5), "sampling_rate"),
        (lambda: dp_fedavg.Config(noise_multiplier=-1.0), "algorithm.noise_multiplier"),
        (lambda: dp_fedsgd.Config(clip_norm=math.inf), "algorithm.clip_norm"),
        (lambda: make_model("mlp", (0,), 3), "feature_shape"),
        (lambda: SecAggConfig(talliers=1), "talliers"),
        (lambda: audit("gaussian-vote", trials=1), "trials"),
        (lambda: audit("no-such-mechanism"), "mechanism"),
    ]


API_NAMES = ["gaussian_noise std<0", "gaussian_mechanism nan noise", "epsilon delta=0",
             "sampled_gaussian rate>1", "ledger delta>1", "NaN features", "infinite features",
             "label above num_classes", "negative label", "empty agent", "zero agents",
             "shape mismatch x/y", "x_public feature shape", "k above records",
             "chunk_size 0", "unknown backend", "unknown cohort", "poisson rate>1",
             "DP-FedAvg negative noise", "DP-FedSGD infinite clip", "empty feature shape",
             "one tallier", "audit trials", "audit unknown mechanism"]


@pytest.mark.parametrize("i", range(len(API_NAMES)), ids=API_NAMES)
def test_api_bad_input(i):
    call, match = _api_cases()[i]
    with pytest.raises(ValueError) as info:
        call()
    msg = str(info.value)
    assert match in msg and len(msg.splitlines()) == 1, msg


def test_the_table_is_large():
    assert len(CLI_RUN) + len(CLI_OTHER) + len(API_NAMES) >= 40


# ------------------------------------------------------ every config key, by type and range
#
# Generated from the one declaration of each key's type and range (fedjax_dp.core.validation
# specs: config.FIELDS, train.LocalTrainConfig.FIELDS and every registered algorithm Config's
# FIELDS): each spec's bad values (ints: 2.5, True, "x", 1e30, below / above the range; floats:
# "x", True, NaN, inf, out of range; choices, booleans, strings, tables, lists) through
# ``fedjax-dp run --set``; every one fails with status 2 and one line naming the key, before any
# data is loaded.

def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") \
            if math.isinf(value) else repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return str(value)


@pytest.fixture
def no_data(monkeypatch):
    """Loading or setting up data is an error: a bad config must fail before."""
    from fedjax_dp.experiments import runner

    def refuse(*args, **kwargs):
        raise AssertionError("data loaded before the config was validated")
    monkeypatch.setattr(runner, "setup", refuse)       # the runner's one way to data


def _expect_refused(tmp_path, capsys, config, key, value, cases):
    argv = ["run", str(config), "--quiet", "--out", str(tmp_path / "out"),
            "--set", f"{key}={_toml(value)}"]
    code, err = _cli(capsys, argv)
    cases.append(key)
    ok = code == 2 and key in err and "Traceback" not in err and len(err.splitlines()) == 1
    return None if ok else f"--set {key}={_toml(value)}: status {code}, {err!r}"


def _algorithm_toml(tmp_path, name):
    path = tmp_path / f"{name}.toml"
    path.write_text(f'[algorithm]\nname = "{name}"\n')
    return path


def _algorithms():
    from fedjax_dp.algorithms import registry
    return registry.names()


@pytest.mark.parametrize("name", _algorithms())
def test_every_algorithm_field_refuses_bad_types_and_ranges(tmp_path, capsys, no_data, name):
    from fedjax_dp.core import validation
    from fedjax_dp.algorithms import registry
    config = _algorithm_toml(tmp_path, name)
    specs = validation.field_specs(registry.get(name).Config)   # every field has a spec
    failures, cases = [], []
    for field, spec in specs.items():
        for value in spec.bad_values():
            failures.append(_expect_refused(tmp_path, capsys, config, f"algorithm.{field}",
                                            value, cases))
    assert not [f for f in failures if f], "\n".join(f for f in failures if f)
    assert cases and not (tmp_path / "out").exists()


def test_every_config_table_key_refuses_bad_types_and_ranges(tmp_path, capsys, no_data):
    from fedjax_dp.experiments import config as config_lib
    failures, cases = [], []
    for path, spec in config_lib.fields().items():
        if path == ("algorithm", "name"):
            continue                                   # a bad name: the table above
        for value in spec.bad_values():
            failures.append(_expect_refused(tmp_path, capsys, DP, ".".join(path), value,
                                            cases))
    assert not [f for f in failures if f], "\n".join(f for f in failures if f)
    # every key of every fixed table (and [train]) is declared
    declared = {p for p in config_lib.fields()}
    for table, keys in config_lib.DEFAULTS.items():
        for key in (keys if isinstance(keys, dict) else [None]):
            full = (table,) if key is None else (table, key)
            assert full in declared, full
    assert len(cases) > 60


def test_every_spec_refuses_what_it_lists_and_converts_integral_floats():
    from fedjax_dp.core import validation as v
    for spec in (v.Int(1), v.Int(0, 10, optional=True), v.Float(0.0, low_open=True),
                 v.Float(0.0, 1.0, high_open=True), v.Choice(("a", "b")), v.Bool(), v.Text(),
                 v.Table(), v.ListOf(v.Int(1))):
        for value in spec.bad_values():
            with pytest.raises(ValueError) as info:
                spec("x.key", value)
            assert str(info.value).startswith("x.key") and "\n" not in str(info.value)
    assert v.Int(1)("k", 2.0) == 2 and type(v.Int(1)("k", 2.0)) is int
    assert type(v.Float()("k", 3)) is float
    with pytest.raises(ValueError, match=r"k must be in \[1, 2147483647\], got 1e\+30"):
        v.Int(1)("k", 1e30)
    with pytest.raises(ValueError, match="k must be an integer >= 1, got True"):
        v.Int(1)("k", True)
    with pytest.raises(ValueError, match="k must be true or false"):
        v.Bool()("k", 1)


def test_every_algorithm_config_declares_every_field():
    from fedjax_dp.core import validation
    from fedjax_dp.algorithms import registry
    for name, entry in registry.algorithms().items():
        validation.field_specs(entry.Config)          # TypeError names a field without a spec
        entry.Config()                                # the defaults pass their own specs


@pytest.mark.parametrize("sets", [["algorithm.rounds=2.0"], ["algorithm.rounds=2.0",
                                                              "train.steps=2.0",
                                                              "train.batch_size=8.0"]])
def test_integral_floats_become_ints(sets):
    from fedjax_dp.experiments import config as config_lib
    from fedjax_dp.experiments import runner
    p = runner.plan(config_lib.load(DP, sets))
    assert p.algorithm_config.rounds == 2 and type(p.algorithm_config.rounds) is int
    for s in sets[1:]:
        key, value = s.split("=")
        got = getattr(p.local, key.split(".")[1])
        assert got == int(float(value)) and type(got) is int
        assert p.algorithm_config.local == p.local


@pytest.mark.parametrize("sets,match", [
    (["algorithm.rounds=2.0"], None), (["algorithm.rounds=1e30"], "algorithm.rounds must be in"),
    (["algorithm.rounds=2.5"], "algorithm.rounds must be an integer >= 1"),
    (["train.steps=2.5"], "train.steps must be an integer >= 0"),
    (["train.batch_size=8.0"], None),
    (["train.batch_size=1e9"], "train.batch_size must be in [1, 1048576]"),
    (["data.num_agents=1e30"], "data.num_agents must be in [1, 2147483647]"),
    (["algorithm.noise_multiplier=true"], "algorithm.noise_multiplier must be a number"),
])
def test_the_issue_21_examples(capsys, no_data, sets, match):
    from fedjax_dp.experiments import config as config_lib
    from fedjax_dp.experiments import runner
    if match is None:
        runner.plan(config_lib.load(DP, sets))
        return
    argv = ["run", DP, "--quiet"]
    for s in sets:
        argv += ["--set", s]
    _one_line(*_cli(capsys, argv), match)
