"""Every flag of every ``fedjax-dp`` subcommand takes effect or is refused (issue 48, item 6).

The parser itself is walked (``cli.build_parser()``: every subparser, sub-subparser and action,
positionals included), so a flag added without a case here fails
``test_every_flag_has_a_case``, and a case left for a removed flag fails it too. A case passes
the flag and shows either its effect (the output, or what the command hands to the work it
starts where that work is patched out, differs from the same command without the flag, in the
way the flag says) or its refusal (exit status 2, ONE line ``fedjax-dp: error: ...`` naming the
flag, before any work), and often both: where it applies and where it would change nothing.

Cost: the heavy work is patched out where a flag's effect shows before it (a run's training, a
sweep's runs, the bench parts, the selftest families, the plots' drawing); the audits run with
2,000 trials, ``audit run`` trains three tiny real runs (honest, halve-noise, no-clip), the data
conversions are of a 3-user LEAF file.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import inspect
import io
import json
from pathlib import Path

import numpy as np
import pytest

from fedjax_dp.experiments import cli

ROOT = Path(__file__).resolve().parents[1]
DP = str(ROOT / "configs" / "dp_fedavg" / "mnist5k.toml")
FEDAVG = str(ROOT / "configs" / "fedavg" / "mnist5k.toml")
SYNTH = str(ROOT / "configs" / "dp_fedavg" / "synthetic_1_1.toml")


# --------------------------------------------------------------------------- the parser's flags

def _walk(parser: argparse.ArgumentParser, path: tuple = ()):
    """``(path, flag)`` for every action of every (sub-sub)parser: ``flag`` the first option
    string of an optional (``--clip`` for ``--clip`` / ``--clip-norm``), the metavar or dest of
    a positional; help actions and the subcommand choice itself are not flags."""
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _walk(sub, path + (name,))
            continue
        name = action.option_strings[0] if action.option_strings else (
            action.metavar or action.dest).upper()
        yield " ".join(path), name


def _parsers(parser, path=()):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, path + (name,))


#: (subcommand, flag) -> the case (registered below with @case)
CASES: dict[tuple[str, str], callable] = {}


def case(command: str, *flags: str):
    def register(fn):
        for flag in flags:
            assert (command, flag) not in CASES, (command, flag)
            CASES[command, flag] = fn
        return fn
    return register


# --------------------------------------------------------------------------- running the CLI

@dataclasses.dataclass
class Out:
    rc: int
    out: str
    err: str

    @property
    def json(self):
        return json.loads(self.out)


def run(*argv) -> Out:
    """``cli.main(argv)`` in this process, its stdout and stderr captured."""
    o, e = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(o), contextlib.redirect_stderr(e):
        rc = cli.main([str(a) for a in argv])
    return Out(rc, o.getvalue(), e.getvalue())


@functools.lru_cache(maxsize=None)
def run_cached(*argv) -> Out:
    """:func:`run` once per argv in this process (the commands whose output is deterministic)."""
    return run(*argv)


def refused(argv, *names) -> str:
    """``argv`` exits 2 with one line ``fedjax-dp: error: ...`` that names every one of
    ``names`` (the flag, and where useful what it conflicts with); returns the line."""
    r = run(*argv)
    assert r.rc == 2, (argv, r)
    lines = r.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fedjax-dp: error: "), (argv, r.err)
    for name in names:
        assert name in lines[0], (argv, name, lines[0])
    assert not r.out, (argv, r.out)
    return lines[0]


def differs(a: dict, b: dict, *keys) -> None:
    """Dicts ``a`` and ``b`` differ in every one of ``keys``."""
    for k in keys:
        assert a.get(k) != b.get(k), (k, a.get(k))


class Recorder:
    """A stand-in for a function whose calls are kept (``calls``: ``(args, kwargs)``)."""

    def __init__(self, result=None, effect=None):
        self.calls, self.result, self.effect = [], result, effect

    def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        if self.effect is not None:
            return self.effect(*args, **kwargs)
        return self.result

    @property
    def kwargs(self):
        return self.calls[-1][1]

    @property
    def args(self):
        return self.calls[-1][0]


@pytest.fixture
def no_cache(monkeypatch):
    """``compilation.enable_cache`` recorded instead of switched on."""
    from fedjax_dp.core import compilation
    rec = Recorder()
    monkeypatch.setattr(compilation, "enable_cache", rec)
    return rec


# --------------------------------------------------------------------------- the contract

def test_every_flag_has_a_case():
    flags = set(_walk(cli.build_parser()))
    assert flags - set(CASES) == set(), "flags without a case (add one below)"
    assert set(CASES) - flags == set(), "cases for flags the parser no longer has"
    commands = {p for p, _ in flags}
    # every subcommand, and every sub-subcommand, of fedjax-dp has its flags covered
    assert {"run", "sweep", "list", "audit", "plot", "bench", "devices", "selftest", "show",
            "account sampled-gaussian", "account gaussian", "account gaussian-vote",
            "account distributed", "account fedkt", "compare selected", "compare arms",
            "data convert"} <= commands


def test_a_new_flag_anywhere_would_fail_the_contract():
    """The walk reaches a sub-subcommand's new flag, which then has no case."""
    parser = cli.build_parser()
    sub = dict(_parsers(parser))[("account", "fedkt")]
    sub.add_argument("--new-flag", type=int)
    walked = set(_walk(parser))
    assert ("account fedkt", "--new-flag") in walked - set(CASES)


@pytest.mark.parametrize("path", [" ".join(p) for p, _ in _parsers(cli.build_parser())])
def test_help_of_every_parser(path):
    with pytest.raises(SystemExit) as e, contextlib.redirect_stdout(io.StringIO()) as o:
        cli.main(path.split() + ["--help"])
    assert e.value.code == 0 and o.getvalue().startswith(f"usage: fedjax-dp {path}".strip())


def pytest_generate_tests(metafunc):
    """``test_flag`` runs once per registered case (registered below, after this function)."""
    if metafunc.function.__name__ == "test_flag":
        metafunc.parametrize("command, flag", sorted(CASES))


def test_flag(command, flag, request):
    """The flag's case: its arguments are ``command``, ``flag`` and fixtures, by name."""
    fn = CASES[command, flag]
    given = {"command": command, "flag": flag}
    fn(**{name: given[name] if name in given else request.getfixturevalue(name)
          for name in inspect.signature(fn).parameters})


# =========================================================================== run

@pytest.fixture
def fake_run(monkeypatch, tmp_path, no_cache):
    """``runner.run`` recorded (no data, no training); it returns a minimal result."""
    from fedjax_dp.experiments import runner

    def result(config, out, **kwargs):
        return {"test_accuracy": 0.5, "history": [{"round": 1, "test_accuracy": 0.5}],
                "algorithm": config["algorithm"]["name"],
                "privacy": [{"unit": "agent", "epsilon": 1.0, "delta": 1e-5,
                             "accountant": "rdp", "data_dependent": False}]}
    rec = Recorder(effect=result)
    monkeypatch.setattr(runner, "run", rec)
    monkeypatch.chdir(tmp_path)              # the default --out is runs/ under the folder
    return rec


@case("run", "CONFIG")
def _(fake_run, tmp_path):
    assert run("run", DP, "--out", tmp_path / "a").rc == 0
    assert fake_run.args[0]["algorithm"]["name"] == "dp_fedavg"
    assert run("run", FEDAVG, "--out", tmp_path / "b").rc == 0
    assert fake_run.args[0]["algorithm"]["name"] == "fedavg"
    assert fake_run.kwargs["config_source"]["kind"] == "file"
    refused(["run"], "CONFIG")
    # a name that is no file: the shipped config (recorded so); else one line with close matches
    assert run("run", "fedavg/mnist5k", "--out", tmp_path / "c").rc == 0
    assert fake_run.args[0]["algorithm"]["name"] == "fedavg"
    assert fake_run.kwargs["config_source"]["name"] == "fedavg/mnist5k"
    refused(["run", "dp_fedavg/mnist"], "dp_fedavg/mnist", "close matches: dp_fedavg/mnist5k")


@case("run", "--set")
def _(fake_run, tmp_path):
    assert run("run", DP, "--out", tmp_path / "a", "--set", "algorithm.rounds=3").rc == 0
    assert fake_run.args[0]["algorithm"]["rounds"] == 3
    refused(["run", DP, "--set", "algorithm.rounds=-1"], "algorithm.rounds")


@case("run", "--out")
def _(fake_run, tmp_path):
    r = run("run", DP, "--out", tmp_path / "here")
    assert r.rc == 0 and r.json["result"] == str(tmp_path / "here" / "result.json")
    assert Path(fake_run.args[1]) == tmp_path / "here"
    r = run("run", DP)
    assert r.rc == 0 and Path(r.json["result"]).parent.parent.name == "mnist5k"


@case("run", "--resume")
def _(fake_run, tmp_path):
    assert run("run", DP, "--out", tmp_path / "a").rc == 0
    assert fake_run.kwargs["resume"] is False
    assert run("run", DP, "--resume", tmp_path / "a").rc == 0
    assert fake_run.kwargs["resume"] is True and Path(fake_run.args[1]) == tmp_path / "a"
    refused(["run", DP, "--resume", tmp_path / "a", "--out", tmp_path / "b"], "--out")


@case("run", "--quiet")
def _(fake_run, tmp_path):
    assert run("run", DP, "--out", tmp_path / "a").rc == 0
    assert fake_run.kwargs["progress"] is True
    assert run("run", DP, "--out", tmp_path / "b", "--quiet").rc == 0
    assert fake_run.kwargs["progress"] is False


@case("run", "--plot")
def _(fake_run, tmp_path, monkeypatch):
    from fedjax_dp.experiments import plots
    drawn = Recorder(result=["training_curve.png"])
    monkeypatch.setattr(plots, "plot_run", drawn)
    r = run("run", DP, "--out", tmp_path / "a")
    assert r.rc == 0 and "plot" not in r.json and not drawn.calls
    r = run("run", DP, "--out", tmp_path / "b", "--plot")
    assert r.rc == 0 and r.json["plot"] == ["training_curve.png"] and drawn.calls


def _debug_case(argv):
    """``argv`` fails: one line and exit 2 without --debug, the exception itself with it."""
    r = run(*argv)
    assert r.rc in (1, 2) and len(r.err.strip().splitlines()) == 1
    with pytest.raises(Exception):
        run(*argv, "--debug")


@case("run", "--debug")
def _(fake_run, tmp_path):
    _debug_case(["run", tmp_path / "missing.toml"])


class FakeGroup:
    """A 2-process job as process ``index`` sees it (no runtime): what the command tells it."""

    def __init__(self, spec, index: int = 0):
        self.spec, self.index, self.count = spec, index, 2
        self.is_writer = index == 0
        self.resume_hint, self.told, self.calls = "", False, []

    def broadcast_bytes(self, data):
        self.calls.append(("broadcast", data))
        return data or b""

    def __getattr__(self, name):               # the watchdog, barriers, leaving: recorded
        return lambda *a, **k: self.calls.append((name, a))


@pytest.fixture
def fake_job(monkeypatch):
    """``processes.initialize`` returns a :class:`FakeGroup` of the spec it is given."""
    import jax

    from fedjax_dp.core import stop
    from fedjax_dp.experiments import processes
    made = []

    def initialize(spec):
        made.append(FakeGroup(spec))
        return made[-1]
    monkeypatch.setattr(processes, "initialize", initialize)
    monkeypatch.setattr(jax.distributed, "shutdown", lambda: None)
    yield made
    stop.set_agreement(None)


JOB = ["--coordinator", "127.0.0.1:8476", "--num-processes", "2", "--process-id", "0"]


def _job_flags_case(command, flag, start, tmp_path, fake_job, monkeypatch):
    """The flags of a multi-process job: the three together reach jax.distributed (the
    spec), process 0 runs (with the group) and leaves the job; each is checked before any
    work, by name and range; without them (and no cluster environment) one process."""
    from fedjax_dp.experiments import processes
    for name in ("SLURM_JOB_ID", "OMPI_COMM_WORLD_SIZE", "TPU_WORKER_HOSTNAMES",
                 "JAX_COORDINATOR_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    r = run(*start(tmp_path / "one"))
    assert r.rc == 0 and not fake_job, r.err
    r = run(*start(tmp_path / "two"), *JOB, "--process-timeout", "7")
    assert r.rc == 0, r.err
    spec = fake_job[-1].spec
    assert (spec.coordinator, spec.num_processes, spec.process_id, spec.timeout_s) == \
        ("127.0.0.1:8476", 2, 0, 7)
    names = [c[0] for c in fake_job[-1].calls]
    assert "start_watchdog" in names and names[-2:] == ["stop_watchdog", "wait_alone"], names
    bad = {"--coordinator": ("nohost", "HOST:PORT"), "--num-processes": ("0", ">= 1"),
           "--process-id": ("2", "[0, 1]"), "--process-timeout": ("1", ">= 5")}
    value, says = bad[flag]
    argv = [a for a in JOB + ["--process-timeout", "60"]]
    argv[argv.index(flag) + 1] = value
    before = len(fake_job)
    refused([*start(tmp_path / "bad"), *argv], flag, says)
    assert len(fake_job) == before                       # refused before joining any job
    if flag != "--process-timeout":                      # the three go together
        trio = [a for i, a in enumerate(JOB) if flag not in JOB[i - (i % 2):i - (i % 2) + 1]]
        refused([*start(tmp_path / "part"), *trio], flag)
    assert processes.detect({"SLURM_JOB_ID": "1", "SLURM_NTASKS": "4",
                             "SLURM_PROCID": "0"}) == "slurm"


for _flag in ("--coordinator", "--num-processes", "--process-id", "--process-timeout"):
    case("run", _flag)(lambda command, flag, tmp_path, fake_job, fake_run, monkeypatch:
                       _job_flags_case(command, flag, lambda out: ("run", DP, "--out", out),
                                       tmp_path, fake_job, monkeypatch))
    case("sweep", _flag)(lambda command, flag, tmp_path, fake_job, fake_sweep, monkeypatch:
                         _job_flags_case(command, flag,
                                         lambda out: ("sweep", DP, "--out", out, "--quiet"),
                                         tmp_path, fake_job, monkeypatch))


# =========================================================================== sweep

@pytest.fixture
def fake_sweep(monkeypatch, no_cache):
    """``sweep.run`` / ``sweep.extend_edges`` recorded: they write a one-run sweep's files and
    log one line."""
    from fedjax_dp.experiments import sweep

    def work(sw, out, **kwargs):
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.jsonl").write_text('{"run_id": "x"}\n')
        (out / "summary.md").write_text("| summary |\n")
        (out / "summary.csv").write_text("summary\n")
        kwargs["log"]("run 1/1 finished")
        return [{"run_id": "x"}]
    fakes = {"run": Recorder(effect=work), "extend_edges": Recorder(effect=work)}
    for name, fake in fakes.items():
        monkeypatch.setattr(sweep, name, fake)
    return fakes


SELECT = ["--set", "data.validation_fraction=0.1", "--grid", "train.learning_rate=0.1,0.2",
          "--select", "val_accuracy"]


def _plan(*argv):
    r = run_cached("sweep", DP, "--dry-run", *argv)
    assert r.rc == 0, r.err
    return r.json


@case("sweep", "CONFIG")
def _():
    assert _plan()["bases"] == ["dp_fedavg/mnist5k"]
    r = run_cached("sweep", DP, SYNTH, "--dry-run")
    assert r.json["runs"] == 2 and len(r.json["bases"]) == 2
    # shipped sweep files by name, their bases read beside them in the package
    r = run_cached("sweep", "experiments/fedkt_table1", "--dry-run")
    assert r.json["name"] == "fedkt_table1" and "fedkt/mnist5k" in r.json["bases"]
    refused(["sweep", "experiments/fedkt_tabel1", "--dry-run"], "experiments/fedkt_table1")


@case("sweep", "--grid")
def _():
    plan = _plan("--grid", "algorithm.noise_multiplier=1,2")
    assert plan["runs"] == 2 * _plan()["runs"] and "algorithm.noise_multiplier" in plan["grid"]


@case("sweep", "--seeds")
def _():
    plan = _plan("--seeds", "3")
    assert plan["seeds"] == [0, 1, 2] and plan["runs"] == 3 * _plan()["runs"]


@case("sweep", "--target-epsilon", "--calibrate")
def _():
    plan = _plan("--target-epsilon", "1,4", "--calibrate", "algorithm.noise_multiplier")
    assert plan["target_epsilon"] == [1.0, 4.0] and plan["calibrate"] and plan["runs"] == 2
    refused(["sweep", DP, "--dry-run", "--target-epsilon", "1"], "--calibrate")
    refused(["sweep", DP, "--dry-run", "--calibrate", "algorithm.noise_multiplier"],
            "--target-epsilon")


@case("sweep", "--set")
def _():
    assert _plan("--set", "algorithm.rounds=3")["set"] == ["algorithm.rounds=3"]
    refused(["sweep", DP, "--dry-run", "--set", "algorithm.rounds=-1"], "algorithm.rounds")


@case("sweep", "--unit")
def _():
    assert _plan()["unit"] is None and _plan("--unit", "agent")["unit"] == "agent"


@case("sweep", "--select", "--select-over")
def _():
    plan = _plan(*SELECT)
    assert plan["select"] == "val_accuracy" and plan["select_over"] is None
    over = _plan(*SELECT, "--select-over", "train.learning_rate")
    assert over["select_over"] == ["train.learning_rate"]
    refused(["sweep", DP, "--dry-run", "--select-over", "train.learning_rate"], "--select")


def _sweep(tmp_path, *argv) -> Out:
    return run("sweep", DP, "--out", tmp_path / "sw", *argv)


@case("sweep", "--out")
def _(fake_sweep, tmp_path):
    r = _sweep(tmp_path)
    assert r.rc == 0 and r.json["results"] == str(tmp_path / "sw" / "results.jsonl")
    assert Path(fake_sweep["run"].args[1]) == tmp_path / "sw"
    refused(["sweep", DP, "--dry-run", "--out", tmp_path / "x"], "--out", "--dry-run")


@case("sweep", "--resume")
def _(fake_sweep, tmp_path):
    assert _sweep(tmp_path).rc == 0 and fake_sweep["run"].kwargs["resume"] is False
    r = run("sweep", DP, "--resume", tmp_path / "sw")
    assert r.rc == 0 and fake_sweep["run"].kwargs["resume"] is True
    assert Path(fake_sweep["run"].args[1]) == tmp_path / "sw"
    refused(["sweep", DP, "--dry-run", "--resume", tmp_path / "sw"], "--resume", "--dry-run")


@case("sweep", "--no-vmap-seeds")
def _(fake_sweep, tmp_path):
    assert _sweep(tmp_path).rc == 0 and fake_sweep["run"].kwargs["vmap_seeds"] is True
    assert run("sweep", DP, "--out", tmp_path / "b", "--no-vmap-seeds").rc == 0
    assert fake_sweep["run"].kwargs["vmap_seeds"] is False
    refused(["sweep", DP, "--dry-run", "--no-vmap-seeds"], "--no-vmap-seeds", "--dry-run")


@case("sweep", "--extend-edges", "--edge-limit")
def _(fake_sweep, tmp_path):
    assert _sweep(tmp_path, *SELECT).rc == 0 and not fake_sweep["extend_edges"].calls
    r = _sweep(tmp_path / "b", *SELECT, "--extend-edges", "2", "--edge-limit",
               "train.learning_rate=:1")
    assert r.rc == 0
    kw = fake_sweep["extend_edges"].kwargs
    assert kw["rounds"] == 2 and kw["limits"] == {"train.learning_rate": (None, 1)}
    refused(["sweep", DP, *SELECT, "--edge-limit", "train.learning_rate=:1"],
            "--edge-limit", "--extend-edges")
    refused(["sweep", DP, *SELECT, "--dry-run", "--extend-edges", "2"], "--extend-edges",
            "--dry-run")
    refused(["sweep", DP, "--extend-edges", "2"], "--extend-edges", "--select")


@case("sweep", "--dry-run")
def _(fake_sweep, tmp_path):
    r = run("sweep", DP, "--dry-run")
    assert r.rc == 0 and r.json["runs"] == 1 and not fake_sweep["run"].calls
    assert _sweep(tmp_path).rc == 0 and fake_sweep["run"].calls


@case("sweep", "--quiet")
def _(fake_sweep, tmp_path):
    r = _sweep(tmp_path)
    assert "run 1/1 finished" in r.err and "| summary |" in r.err
    r = run("sweep", DP, "--out", tmp_path / "b", "--quiet")
    assert r.rc == 0 and r.err == "" and fake_sweep["run"].kwargs["progress"] is False
    refused(["sweep", DP, "--dry-run", "--quiet"], "--quiet", "--dry-run")


@case("sweep", "--debug")
def _():
    _debug_case(["sweep", DP, "--grid", "algorithm.rounds"])


@case("sweep", "--compilation-cache")
def _(fake_sweep, tmp_path, no_cache):
    assert _sweep(tmp_path).rc == 0 and no_cache.args == ("user",)
    assert run("sweep", DP, "--out", tmp_path / "b", "--compilation-cache", "off").rc == 0
    assert no_cache.args == ("off",)
    refused(["sweep", DP, "--dry-run", "--compilation-cache", "off"], "--compilation-cache",
            "--dry-run")


# =========================================================================== list, devices

@case("list", "--json")
def _():
    text, js = run_cached("list"), run_cached("list", "--json")
    assert text.out.startswith("algorithms:") and "dp_fedavg" in js.json["algorithms"]
    stages = js.json["stages"]               # every stage kind a round chains, with options
    assert list(stages) == ["participation", "client_update", "clipping", "aggregation", "noise",
                            "server_update"]
    names = {kind: {s["name"] for s in options} for kind, options in stages.items()}
    assert {"poisson", "fixed", "cyclic"} <= names["participation"]
    assert {"gaussian", "banded_mf", "blt", "tree", "ddg", "skellam"} <= names["noise"]
    banded = next(s for s in stages["noise"] if s["name"] == "banded_mf")
    assert "bands" in banded["options"] and "algorithm.noise" in banded["config"]
    assert "stages:" in text.out and "  noise:" in text.out and "banded_mf" in text.out


@case("show", "RUN")
def _(tmp_path):
    """The full report of a run folder (or its result.json): every guarantee, and once what
    they do not cover; a folder without a finished run is refused naming RUN."""
    row = {"unit": "agent", "epsilon": 6.87, "delta": 1e-5, "data_dependent": False,
           "covers_all_releases": False, "not_covered": "the loss: computed without noise"}
    result = {"algorithm": "dp_fedavg", "dataset": "mnist5k", "num_agents": 100, "seed": 0,
              "test_accuracy": 0.74, "privacy": [{**row, "accountant": "rdp"},
                                                 {**row, "accountant": "pld"}],
              "config": {"privacy": {"accountants": ["rdp", "pld"]}}, "history": []}
    (tmp_path / "result.json").write_text(json.dumps(result))
    shown = run("show", tmp_path)
    assert shown.rc == 0 and shown.out == run("show", tmp_path / "result.json").out
    assert "agent: eps=6.87 at delta=1e-05 (rdp)  (headline)" in shown.out
    assert "agent: eps=6.87 at delta=1e-05 (pld)" in shown.out
    assert shown.out.count("the loss: computed without noise") == 1
    refused(["show", tmp_path / "nothing"], "RUN", "no result.json")


@case("devices", "--json")
def _():
    text, js = run_cached("devices"), run_cached("devices", "--json")
    assert text.out.startswith("jax ") and js.json["platform"] == "cpu"


# =========================================================================== --version, configs

@case("", "--version")
def _():
    import fedjax_dp
    o = io.StringIO()
    with pytest.raises(SystemExit) as e, contextlib.redirect_stdout(o):
        cli.main(["--version"])
    assert e.value.code == 0 and o.getvalue().strip() == f"fedjax-dp {fedjax_dp.__version__}"
    with pytest.raises(SystemExit) as e, contextlib.redirect_stderr(io.StringIO()):
        cli.main([])                                   # no command and no --version
    assert e.value.code == 2


@case("configs list", "--json")
def _():
    text, js = run_cached("configs", "list"), run_cached("configs", "list", "--json")
    rows = js.json["configs"]
    names = [r["name"] for r in rows]
    assert len(names) == len(list((ROOT / "configs").rglob("*.toml"))) == len(text.out.splitlines())
    assert {"dp_fedavg/mnist5k", "experiments/fedkt_table1", "selftest"} <= set(names)
    kinds = {r["name"]: r["kind"] for r in rows}
    assert kinds["dp_fedavg/mnist5k"] == "run" and kinds["experiments/fedkt_table1"] == "sweep"
    assert text.out.startswith(names[0]) and not text.out.startswith("{")


@case("configs show", "NAME")
def _():
    for name in ("dp_fedavg/mnist5k", "configs/dp_fedavg/mnist5k.toml"):
        assert run("configs", "show", name).out == Path(DP).read_text()
    assert run("configs", "show", "fedavg/mnist5k").out == Path(FEDAVG).read_text()
    refused(["configs", "show", "dp_fedavg/mnist"], "close matches: dp_fedavg/mnist5k")
    refused(["configs", "show", "../pyproject"], "../pyproject")


@case("configs copy", "NAME", "DEST")
def _(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = run("configs", "copy", "dp_fedavg/mnist5k")           # DEST: ./configs
    assert r.rc == 0 and r.out.split() == ["configs/dp_fedavg/mnist5k.toml"]
    assert (tmp_path / "configs/dp_fedavg/mnist5k.toml").read_text() == Path(DP).read_text()
    refused(["configs", "copy", "dp_fedavg/mnist5k"], "exists")          # never overwritten
    r = run("configs", "copy", "experiments/fedkt_table1", "mine")       # a sweep: its bases too
    assert r.rc == 0 and "mine/fedkt/mnist5k.toml" in r.out.split()
    assert run("sweep", "mine/experiments/fedkt_table1.toml", "--dry-run").json["runs"] == \
        run_cached("sweep", "experiments/fedkt_table1", "--dry-run").json["runs"]
    (tmp_path / "afile").write_text("")
    refused(["configs", "copy", "fedavg/mnist5k", "afile"], "afile")
    refused(["configs", "copy", "nope/nothing"], "nope/nothing")


# =========================================================================== account

SG = ["account", "sampled-gaussian", "--noise-multiplier", "1", "--sampling-rate", "0.1",
      "--steps", "10", "--delta", "1e-5"]
GAUSS = ["account", "gaussian", "--noise-multiplier", "1", "--count", "3", "--delta", "1e-5"]
GV = ["account", "gaussian-vote", "--sigma", "10", "--queries", "10", "--delta", "1e-5"]
DD = ["account", "distributed", "--kind", "ddg", "--bits", "16", "--dim", "100", "--clip", "1",
      "--population", "1000", "--cohort", "100", "--rounds", "10", "--delta", "1e-5",
      "--noise-multiplier", "1"]


def _changed(base, flag, value, *keys):
    """``base`` with ``flag value`` (replacing ``base``'s own value of ``flag``) prints another
    value of each of ``keys`` than ``base``."""
    argv = list(base)
    if flag in argv:
        i = argv.index(flag)
        del argv[i:i + 2]
    a, b = run_cached(*base), run_cached(*argv, flag, value)
    assert a.rc == 0 and b.rc == 0, (a.err, b.err)
    differs(a.json, b.json, *keys)
    return b.json


def _required(base, flag):
    argv = list(base)
    i = argv.index(flag)
    del argv[i:i + 2]
    with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()) as e:
        cli.main([str(a) for a in argv])
    assert flag in e.getvalue()


@case("account sampled-gaussian", "--noise-multiplier", "--sampling-rate", "--steps", "--delta")
def _(flag):
    value = {"--noise-multiplier": "2", "--sampling-rate": "0.2", "--steps": "20",
             "--delta": "1e-3"}[flag]
    _changed(SG, flag, value, "epsilon")
    _required(SG, flag)


@case("account gaussian", "--noise-multiplier", "--count", "--delta")
def _(flag):
    value = {"--noise-multiplier": "2", "--count": "5", "--delta": "1e-3"}[flag]
    _changed(GAUSS, flag, value, "epsilon")
    _required(GAUSS, flag)


@case("account sampled-gaussian", "--accountant")
@case("account gaussian", "--accountant")
@case("account gaussian-vote", "--accountant")
@case("account distributed", "--delta")
def _(command, flag):
    base = {"account sampled-gaussian": SG, "account gaussian": GAUSS,
            "account gaussian-vote": GV + ["--unit", "agent"],
            "account distributed": DD}[command]
    if flag == "--accountant":
        both = run_cached(*base).json["epsilon"]
        one = _changed(base, "--accountant", "rdp", "epsilon")["epsilon"]
        assert set(both) == {"rdp", "pld"} and set(one) == {"rdp"}
    else:
        _changed(base, "--delta", "1e-4", "epsilon", "delta")


@case("account gaussian-vote", "--sigma", "--queries", "--unit", "--algorithm", "--delta")
def _(flag):
    base = GV + ["--unit", "agent"]
    value, keys = {"--sigma": ("20", ["epsilon"]), "--queries": ("20", ["epsilon"]),
                   "--unit": ("instance", ["epsilon", "sensitivity", "relation"]),
                   "--delta": ("1e-3", ["epsilon"]),
                   "--algorithm": (None, None)}[flag]
    if flag == "--algorithm":
        inst = GV + ["--unit", "instance"]
        knn = run_cached(*inst, "--algorithm", "knn", "--k", "4").json
        assert knn["sensitivity"] == pytest.approx(2 ** 0.5 / 4) != \
            run_cached(*inst).json["sensitivity"]
        return
    _changed(base, flag, value, *keys)
    if flag != "--delta":
        _required(base, flag)


@case("account gaussian-vote", "--k", "--rule")
def _(flag):
    knn = GV + ["--unit", "instance", "--algorithm", "knn", "--k", "4"]
    value = {"--k": "2", "--rule": "paper"}[flag]
    _changed(knn, flag, value, "epsilon", "sensitivity")
    for where in (GV + ["--unit", "agent", "--algorithm", "knn"], GV + ["--unit", "instance"]):
        refused(where + [flag, value], flag, "--algorithm knn --unit instance")


@case("account distributed", "--kind", "--bits", "--dim", "--clip", "--population", "--cohort",
      "--rounds", "--k-stddevs", "--beta", "--min-survivors")
def _(flag):
    value = {"--kind": "skellam", "--bits": "18", "--dim": "200", "--clip": "2",
             "--population": "2000", "--cohort": "50", "--rounds": "20", "--k-stddevs": "3",
             "--beta": "0.3", "--min-survivors": "50"}[flag]
    _changed(DD, flag, value, "plan" if flag == "--clip" else "epsilon")   # eps: c / z c
    if flag in ("--kind", "--bits", "--dim", "--clip", "--population", "--cohort", "--rounds"):
        _required(DD, flag)


@case("account distributed", "--allow-large-delta")
def _():
    large = DD[:DD.index("--delta")] + ["--delta", "1e-3"] + DD[DD.index("--delta") + 2:]
    refused(large, "--allow-large-delta")           # delta >= 1/N (N = 1000)
    r = run(*large, "--allow-large-delta")
    assert r.rc == 0 and r.json["delta"] == 1e-3


@case("account distributed", "--noise-multiplier", "--target-epsilon")
def _(flag):
    base = DD[:-2]
    assert DD[-2] == "--noise-multiplier"
    a = run_cached(*base, "--noise-multiplier", "1").json
    b = run_cached(*base, "--target-epsilon", "5").json
    assert b["calibrated"] and not a["calibrated"] and b["epsilon"] <= 5 < a["epsilon"]
    refused(base, "--noise-multiplier", "--target-epsilon")


@pytest.fixture(scope="module")
def votes(tmp_path_factory):
    """L1 server histograms [Q, C] and L2 teacher histograms [n, s, Q, C] (s = 4)."""
    root = tmp_path_factory.mktemp("votes")
    np.savez(root / "l1.npz", votes=np.array([[5, 1], [3, 3], [6, 0]]))
    np.savez(root / "l2.npz", votes=np.random.default_rng(0).integers(0, 5, (3, 4, 4, 2)))
    return root


def _fk(votes, level, *extra):
    return ["account", "fedkt", "--votes", votes / f"{level.lower()}.npz", "--gamma", "0.1",
            "--level", level, "--delta", "1e-5", "--s", "4", *extra]


def _units(out, unit):
    return out.json["units"][unit]


@case("account fedkt", "--votes", "--gamma", "--level", "--s", "--orders", "--delta",
      "--accountant", "--unit")
def _(flag, votes, tmp_path):
    base = run_cached(*_fk(votes, "L1"))
    ex = _units(base, "example")
    if flag == "--votes":
        np.savez(tmp_path / "v.npz", votes=np.array([[6, 0]] * 5))      # 5 queries, not 3
        argv = _fk(votes, "L1")
        argv[argv.index("--votes") + 1] = tmp_path / "v.npz"
        assert run(*argv).json["noisy_queries_per_unit"] == 5
        assert base.json["noisy_queries_per_unit"] == 3
        _required(_fk(votes, "L1"), "--votes")
    elif flag == "--level":
        assert run_cached(*_fk(votes, "L2")).json["noisy_queries_per_unit"] == 16 != \
            base.json["noisy_queries_per_unit"]
        _required(_fk(votes, "L1"), "--level")
    elif flag == "--unit":
        party = run_cached(*_fk(votes, "L1", "--unit", "party")).json["units"]
        assert set(party) == {"party"} and set(base.json["units"]) == {"party", "example"}
    elif flag == "--accountant":
        one = _units(run_cached(*_fk(votes, "L1", "--accountant", "pld")), "example")
        assert set(one["data_independent"]) == {"pld"} and len(ex["data_independent"]) == 2
    else:
        value = {"--gamma": "0.2", "--s": "3", "--orders": "4", "--delta": "1e-3"}[flag]
        argv = _fk(votes, "L1")
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
        assert _units(run(*argv), "example")["moments_epsilon"] != ex["moments_epsilon"]
        if flag in ("--gamma", "--delta"):
            _required(_fk(votes, "L1"), flag)


@case("account fedkt", "--z", "--example-rule")
def _(flag, votes):
    # L1, s = 4, example level: z = 1 gives k = s / 2 (consistent voting) or k = z (the paper's)
    base = _units(run_cached(*_fk(votes, "L1", "--z", "1")), "example")["moments_epsilon"]
    if flag == "--z":
        assert _units(run_cached(*_fk(votes, "L1")), "example")["moments_epsilon"] != base
        value = "1"
    else:
        paper = run_cached(*_fk(votes, "L1", "--z", "1", "--example-rule", "paper"))
        assert _units(paper, "example")["moments_epsilon"] != base
        value = "paper"
    refused(_fk(votes, "L2", flag, value), flag, "--level L2")
    refused(_fk(votes, "L1", "--unit", "party", flag, value), flag, "--unit party")


@case("account fedkt", "--t")
def _(votes):
    base = _units(run_cached(*_fk(votes, "L2")), "party")
    assert _units(run_cached(*_fk(votes, "L2", "--t", "3")), "party") != base
    refused(_fk(votes, "L2", "--unit", "example", "--t", "3"), "--t", "--unit example")


# =========================================================================== audit MECHANISM

TRIALS = "2000"

#: the flag's test value and a mechanism that takes it
MECHANISM_FLAGS = {
    "--sigma": ("gaussian-vote", "2"), "--unit": ("gaussian-vote", "instance"),
    "--noise": ("gaussian-vote", "aggregate"), "--num-agents": ("gaussian-vote", "6"),
    "--num-classes": ("fedkt-laplace", "3"), "--gamma": ("fedkt-laplace", "1"),
    "--gap": ("fedkt-laplace", "2"), "--noise-multiplier": ("isrl-upload", "2"),
    "--clip": ("isrl-upload", "2"), "--num-records": ("isrl-upload", "6"),
    "--num-examples": ("dp-sgd-step", "6"),
    "--noise-trials": ("sdp-upload", "1026"), "--granularity": ("sdp-upload", "4"),
}


def _audit(mechanism, *extra) -> dict:
    r = run_cached("audit", mechanism, "--trials", TRIALS, *extra)
    assert r.rc == 0, r.err
    return r.json


def _audit_differs(mechanism, extra, base_extra=()):
    """The audit with ``extra`` differs from the one without in more than the echoed params."""
    a, b = _audit(mechanism, *base_extra), _audit(mechanism, *base_extra, *extra)
    changed = sorted(k for k in a if a[k] != b[k] and k != "params")
    assert changed, (mechanism, extra)
    return a, b


def _not_taken(flag, value):
    """A mechanism that does not take ``flag`` refuses it, naming it."""
    from fedjax_dp.audit import harness
    from fedjax_dp.algorithms import registry
    registry.algorithms()
    name = "clip_norm" if flag == "--clip" else flag[2:].replace("-", "_")
    other = next(m for m, spec in sorted(harness.MECHANISMS.items()) if name not in spec.defaults)
    refused(["audit", other, "--trials", TRIALS, flag, value], flag, "is not a parameter")


@case("audit", *MECHANISM_FLAGS)
def _(flag):
    mechanism, value = MECHANISM_FLAGS[flag]
    a, b = _audit_differs(mechanism, [flag, value])
    param = "clip_norm" if flag == "--clip" else flag[2:].replace("-", "_")
    assert b["params"][param] != a["params"][param]
    _not_taken(flag, value)
    refused(["audit", "run", "--config", DP, flag, value], flag, "audit run")


@case("audit", "--k", "--ballot")
def _(flag):
    inst = ["--unit", "instance", "--ballot", "neighbour_counts"]
    if flag == "--k":
        _audit_differs("gaussian-vote", ["--k", "2"], inst)
        refused(["audit", "gaussian-vote", "--k", "2"], "--k", "neighbour_counts")
    else:
        _audit_differs("gaussian-vote", ["--ballot", "neighbour_counts"], ["--unit", "instance"])
        # at agent level agent 0's whole ballot is added or removed: the form changes nothing
        refused(["audit", "gaussian-vote", "--ballot", "neighbour_counts"], "--ballot",
                "unit='agent'")
    _not_taken(flag, "2" if flag == "--k" else "one_hot")
    refused(["audit", "run", "--config", DP, flag, "2"], flag, "audit run")


@case("audit", "--num-teachers")
def _():
    _audit_differs("fedkt-laplace", ["--num-teachers", "12"], ["--num-classes", "3"])
    refused(["audit", "fedkt-laplace", "--num-teachers", "12"], "--num-teachers",
            "num_classes=2")
    _not_taken("--num-teachers", "12")


@case("audit", "--canary-scale")
def _(fake_canaries):
    _audit_differs("dp-sgd-step", ["--canary-scale", "5"])
    _audit_differs("isrl-upload", ["--canary-scale", "5"], ["--weaken", "no-clip"])
    # clipped to clip_norm whatever its scale: refused where it would change nothing
    refused(["audit", "isrl-upload", "--canary-scale", "5"], "--canary-scale", "no-clip")
    refused(["audit", "sdp-upload", "--canary-scale", "5"], "--canary-scale")
    _not_taken("--canary-scale", "5")
    # audit run: a canary below the clip is smaller; above it, with a fixed clip, the same
    assert _audit_run_fake()["canary_scale"] is None
    assert _audit_run_fake("--canary-scale", "0.5")["canary_scale"] == 0.5
    refused(["audit", "run", "--config", DP, *TINY, "--canary-scale", "5"], "--canary-scale",
            "fixed clip")
    refused(["audit", "run", "--config", DP, *TINY, "--canary-scale", "1", "--weaken",
             "no-clip"], "--canary-scale", "above 1")


@case("audit", "MECHANISM")
def _():
    a, b = _audit("isrl-upload"), _audit("fedkt-laplace")
    assert (a["mechanism"], b["mechanism"]) == ("isrl-upload", "fedkt-laplace")
    refused(["audit", "no-such-mechanism"], "mechanism must be one of")


@case("audit", "--trials", "--seed", "--confidence")
def _(flag):
    value = {"--trials": "1000", "--seed": "3", "--confidence": "0.9"}[flag]
    a, b = _audit_differs("isrl-upload", [flag, value])
    key = flag[2:]
    assert a[key] != b[key]
    refused(["audit", "run", "--config", DP, flag, value], flag, "does not apply to audit run")


@case("audit", "--weaken")
def _(canary_runs):
    a, b = _audit_differs("fedkt-laplace", ["--weaken", "halve-noise"])
    assert b["weaken"] == "halve-noise" and b["claimed_epsilon"] == a["claimed_epsilon"]
    refused(["audit", "fedkt-laplace", "--weaken", "no-clip"], "--weaken", "halve-noise")
    # audit run: the run's noise halved (or its clip removed), the honest claim kept
    honest, half, noclip = (canary_runs[w] for w in (None, "halve-noise", "no-clip"))
    assert half["claimed_epsilon"] == honest["claimed_epsilon"] == noclip["claimed_epsilon"]
    assert half["run_noise_multiplier"] == honest["run_noise_multiplier"] / 2
    assert half["epsilon_lower_bound"] > honest["epsilon_lower_bound"]
    assert honest["consistent"] and noclip["canary_scale"] == 100
    assert noclip["epsilon_lower_bound"] > noclip["claimed_epsilon"]       # caught


# =========================================================================== audit run

TINY = ["--set", "data.num_agents=10", "--set", "algorithm.rounds=1", "--set", "train.steps=1",
        "--set", "model.hidden=[8]"]
SYNTH_TINY = ["--set", "algorithm.rounds=1", "--set", "train.steps=1"]


@pytest.fixture(scope="module")
def canary_runs():
    """Three real one-run audits of a tiny DP-FedAvg run (one round, every one of 10 agents,
    z = 2: claim 2.3 at delta 1e-5 (RDP); 300 canaries, 6,370 parameters): honest, halve-noise,
    no-clip (canaries pushing 100 x clip_norm unclipped)."""
    out = {}
    for weaken in (None, "halve-noise", "no-clip"):
        r = run("audit", "run", "--config", DP, "--canaries", "300", *TINY,
                "--set", "algorithm.sampling_rate=1.0", "--set", "algorithm.noise_multiplier=2",
                *(["--weaken", weaken] if weaken else []))
        assert r.rc == 0, r.err
        out[weaken] = r.json
    return out


@pytest.fixture
def fake_canaries(monkeypatch):
    """The dp_fedavg canary run recorded: fixed, overlapping scores (no training); the claim is
    the config's ledger, as the real one's; ``runner.setup`` memoised per config."""
    from fedjax_dp.algorithms.averaging import dp_fedavg
    from fedjax_dp.audit import one_run
    from fedjax_dp.experiments import runner

    def scores(key, data, model, config, *, canaries, delta, accountant, **kwargs):
        half = canaries // 2
        return one_run.CanaryScores(
            in_scores=np.linspace(1.0, 2.0, canaries - half),
            out_scores=np.linspace(0.0, 1.2, half),
            claimed_epsilon=dp_fedavg.ledger(config).epsilon("agent", delta, accountant),
            delta=delta, unit="agent", relation="x", canary="x",
            extras={"features": int(np.prod(data.agents.x.shape[2:])), "accountant": accountant,
                    **kwargs})
    rec = Recorder(effect=scores)
    monkeypatch.setitem(one_run.RUN_AUDITS, "dp_fedavg", rec)
    real = runner.setup

    def setup(config):
        key = json.dumps(config, sort_keys=True)
        if key not in _SETUPS:
            _SETUPS[key] = real(config)
        return _SETUPS[key]
    monkeypatch.setattr(runner, "setup", setup)
    return rec


#: runner.setup's result per config (loading mnist5k once for the fake canary runs)
_SETUPS: dict = {}


def _audit_run_fake(*extra, config=DP, sets=TINY):
    r = run("audit", "run", "--config", config, "--canaries", "40", *sets, *extra)
    assert r.rc == 0, r.err
    return r.json


@case("audit", "--config", "--set", "--canaries", "--significance")
def _(flag, fake_canaries):
    value = {"--config": DP, "--set": "seed=1", "--canaries": "30", "--significance": "0.1"}[flag]
    refused(["audit", "isrl-upload", flag, value], flag, "goes with the mechanism \"run\"")
    base = _audit_run_fake()
    if flag == "--config":
        refused(["audit", "run"], "--config")
        refused(["audit", "run", "--config", FEDAVG], "algorithm.name")
        other = _audit_run_fake(config=SYNTH, sets=SYNTH_TINY)
        assert other["config"] == SYNTH and other["features"] != base["features"]
        assert other["claimed_epsilon"] != base["claimed_epsilon"]
    elif flag == "--set":
        z = _audit_run_fake("--set", "algorithm.noise_multiplier=3")
        assert z["claimed_epsilon"] < base["claimed_epsilon"]
        refused(["audit", "run", "--config", DP, "--set", "run.checkpoint_every=5"],
                "--set run.checkpoint_every", "does not apply to audit run")
        refused(["audit", "run", "--config", DP, "--delta", "1e-3", "--set",
                 "privacy.delta=1e-4"], "--delta", "privacy.delta")
        chunk = _audit_run_fake("--set", "run.chunk_size=3")
        assert chunk["chunk_size"] == 3 and base["chunk_size"] == "auto"
    elif flag == "--canaries":
        assert _audit_run_fake("--canaries", "30")["canaries"] == 30 != base["canaries"]
        refused(["audit", "run", "--config", DP, "--canaries", "1"], "--canaries")
    else:
        loose = _audit_run_fake("--significance", "0.5")
        assert loose["epsilon_lower_bound"] > base["epsilon_lower_bound"]
        assert loose["significance"] == 0.5 != base["significance"]


@case("audit", "--accountant")
def _(fake_canaries):
    a, b = _audit_differs("isrl-upload", ["--accountant", "rdp"])
    assert a["claimed_epsilon"] != b["claimed_epsilon"] and b["params"]["accountant"] == "rdp"
    refused(["audit", "sdp-upload", "--accountant", "rdp"], "--accountant", "is not a parameter")
    pld = _audit_run_fake("--accountant", "pld")
    rdp = _audit_run_fake("--accountant", "rdp")
    assert (pld["accountant"], rdp["accountant"]) == ("pld", "rdp")
    assert pld["claimed_epsilon"] != rdp["claimed_epsilon"]
    refused(["audit", "run", "--config", DP, "--accountant", "rdp", "--set",
             'privacy.accountants=["pld"]'], "--accountant", "privacy.accountants")


@case("audit", "--delta")
def _(fake_canaries):
    a, b = _audit_differs("isrl-upload", ["--delta", "1e-3"])
    assert b["delta"] == 1e-3 and b["claimed_epsilon"] < a["claimed_epsilon"]
    base, other = _audit_run_fake(), _audit_run_fake("--delta", "1e-3")
    assert base["delta"] == 1e-5 and other["delta"] == 1e-3       # the config's, or the flag's
    assert other["claimed_epsilon"] < base["claimed_epsilon"]


# =========================================================================== plot

def _plot_record(algorithm, epsilon, seed, acc, **extra):
    return {"base": f"b/{algorithm}", "algorithm": algorithm, "seed": seed,
            "target_epsilon": epsilon, "epsilon": epsilon, "test_accuracy": acc,
            "params": {"train.learning_rate": 0.1 if seed < 2 else 0.2},
            "history": [{"round": t, "loss": 1.0 / t + 0.01 * seed, "test_accuracy": acc}
                        for t in (1, 2)], "rounds": 2, **extra}


@pytest.fixture
def plot_records(tmp_path, monkeypatch):
    """A results.jsonl of 2 algorithms x 2 epsilons x 3 seeds, a selected.json beside it, and
    ``plots.plot_xy`` / ``plot_curves`` recorded (no drawing)."""
    from fedjax_dp.experiments import plots
    recs = [_plot_record(a, e, s, 0.5 + 0.1 * s + (a == "x") * 0.05)
            for a in ("x", "y") for e in (1.0, 4.0) for s in range(3)]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (tmp_path / "selected.json").write_text(json.dumps([
        {"base": f"b/{a}", "algorithm": a, "target_epsilon": e,
         "selected": {"train.learning_rate": 0.1}} for a in ("x", "y") for e in (1.0, 4.0)]))
    fakes = {name: Recorder(effect=lambda recs, *a, **k: [str(k.get("out_stem", a[-1] if a
                                                                       else "x")) + ".png"])
             for name in ("plot_xy", "plot_curves")}
    for name, fake in fakes.items():
        monkeypatch.setattr(plots, name, fake)
    return tmp_path, fakes


def _xy(plot_records, *extra) -> dict:
    """``fedjax-dp plot FOLDER *extra``: the drawing function's arguments by name (and the
    number of records it got, the command's JSON)."""
    from fedjax_dp.experiments import plots
    folder, fakes = plot_records
    r = run("plot", folder, *extra)
    assert r.rc == 0, r.err
    name = "plot_curves" if "--curve" in extra else "plot_xy"
    args, kwargs = fakes[name].calls[-1]
    bound = inspect.signature(_REAL_PLOTS[name]).bind(*args, **kwargs)
    bound.apply_defaults()
    return {**bound.arguments, "out": r.json, "records": len(list(args[0]))}


def _real_plots():
    from fedjax_dp.experiments import plots         # matplotlib is imported lazily
    return {"plot_xy": plots.plot_xy, "plot_curves": plots.plot_curves}


_REAL_PLOTS = _real_plots()


@case("plot", "RESULTS")
def _(plot_records, tmp_path):
    assert _xy(plot_records)["records"] == 12
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "results.jsonl").write_text(json.dumps(_plot_record("x", 1.0, 0, 0.5))
                                                    + "\n")
    r = run("plot", tmp_path / "one")
    assert r.rc == 0 and r.json["records"] == 1
    refused(["plot", tmp_path / "nothing"], "nothing")


@case("plot", "--x", "--y", "--hue", "--title")
def _(flag, plot_records):
    value, key = {"--x": ("seed", "x"), "--y": ("seed", "y"), "--hue": ("seed", "hue"),
                  "--title": ("T", "title")}[flag]
    default, given = _xy(plot_records), _xy(plot_records, flag, value)
    assert given[key] == (value if flag != "--hue" else "seed") != default[key]
    if flag in ("--y", "--hue", "--title"):       # curves take them too
        a, b = _xy(plot_records, "--curve"), _xy(plot_records, "--curve", flag, value)
        assert b[key] == value != a[key]
    else:
        refused(["plot", plot_records[0], "--curve", "--x", "seed"], "--x", "--curve")


@case("plot", "--curve")
def _(plot_records):
    folder, fakes = plot_records
    assert run("plot", folder).rc == 0 and not fakes["plot_curves"].calls
    assert run("plot", folder, "--curve").rc == 0 and fakes["plot_curves"].calls


@case("plot", "--selected")
def _(plot_records):
    a, b = _xy(plot_records), _xy(plot_records, "--selected")
    assert (a["records"], b["records"]) == (12, 8) and b["hue"] == "setting" != a["hue"]


@case("plot", "--out")
def _(plot_records, tmp_path):
    a, b = _xy(plot_records), _xy(plot_records, "--out", tmp_path / "fig")
    assert Path(b["out_stem"]) == tmp_path / "fig" != Path(a["out_stem"])
    (tmp_path / "file").write_text("")
    refused(["plot", plot_records[0], "--out", tmp_path / "file" / "fig"], "--out")


@case("plot", "--reference")
def _(plot_records):
    a, b = _xy(plot_records), _xy(plot_records, "--reference", "algorithm=y")
    assert b["reference"] == ("algorithm", "y") and a["reference"] is None
    refused(["plot", plot_records[0], "--curve", "--reference", "algorithm=y"], "--reference",
            "--curve")


@case("plot", "--label")
def _(plot_records):
    a = _xy(plot_records)
    b = _xy(plot_records, "--label", "x=Ours", "--label", "test_accuracy = Accuracy")
    assert b["labels"] == {"x": "Ours", "test_accuracy": "Accuracy"} and a["labels"] == {}
    c = _xy(plot_records, "--curve", "--label", "loss=Loss")
    assert c["labels"] == {"loss": "Loss"}
    refused(["plot", plot_records[0], "--label", "x"], "--label", "KEY=TEXT")
    refused(["plot", plot_records[0], "--label", "x="], "--label")


@case("plot", "--logx")
def _(plot_records):
    for flag, want in (("--logx", True), ("--no-logx", False)):
        assert _xy(plot_records, flag)["logx"] is want
    assert _xy(plot_records)["logx"] is None
    refused(["plot", plot_records[0], "--curve", "--logx"], "--logx", "--curve")


# =========================================================================== compare

def _sweep_dir(folder, cells):
    """A sweep folder with selected.json and results.jsonl (compare's inputs): cells
    (algorithm, epsilon, chosen rounds, per-seed accuracies); rounds + 1 a candidate not chosen;
    each run's guarantee a Gaussian event (what --tuning-cost composes)."""
    from dp_accounting import dp_event
    from fedjax_dp.privacy import accounting
    privacy = [{"unit": "agent", "accountant": "rdp", "delta": 1e-5,
                "events": [accounting.event_to_json(dp_event.GaussianDpEvent(3.0))]}]
    folder.mkdir()
    rows, recs = [], []
    for algorithm, e, rounds, accs in cells:
        rows.append({"base": f"b/{algorithm}", "algorithm": algorithm, "target_epsilon": e,
                     "data.num_agents": 50, "selected": {"algorithm.rounds": rounds},
                     "n_candidates": 2, "val_accuracy_mean": 0.0, "n": len(accs),
                     "test_accuracy_mean": float(np.mean(accs)),
                     "test_accuracy_std": float(np.std(accs, ddof=1)), "epsilon_mean": e,
                     "epsilon_std": 0.0, "epsilon_unit": "agent", "calibrated_value": 1.0})
        for r in (rounds, rounds + 1):
            for seed, acc in enumerate(accs):
                recs.append({"base": f"b/{algorithm}", "algorithm": algorithm, "seed": seed,
                             "target_epsilon": e, "params": {"algorithm.rounds": r},
                             "test_accuracy": acc if r == rounds else 0.1 * seed,
                             "val_accuracy": acc, "privacy": privacy})
    (folder / "selected.json").write_text(json.dumps(rows))
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return folder


@pytest.fixture
def sweeps(tmp_path, monkeypatch):
    """Two sweep folders (x and y; z without privacy) and compare's plot recorded."""
    from fedjax_dp.experiments import compare
    a = _sweep_dir(tmp_path / "a", [("x", 1.0, 10, [0.80, 0.82, 0.81]),
                                    ("x", 4.0, 10, [0.90, 0.91, 0.92])])
    b = _sweep_dir(tmp_path / "b", [("y", 1.0, 20, [0.70, 0.72, 0.69]),
                                    ("y", 4.0, 20, [0.75, 0.74, 0.79])])
    top = _sweep_dir(tmp_path / "top", [("z", None, 5, [0.95, 0.96, 0.97])])
    monkeypatch.setattr(compare, "arms_plot", Recorder(result=[]))
    return a, b, top


def _cmp(*argv, out) -> tuple[Out, str]:
    r = run("compare", *argv, "--out", out)
    assert r.rc == 0, r.err
    return r, r.out


@case("compare selected", "SWEEP", "--names", "--rows", "--ceiling", "--tuning-cost", "--title")
@case("compare selected", "--out")
def _(flag, sweeps, tmp_path):
    a, b, top = sweeps
    _, base = _cmp("selected", a, b, out=tmp_path / "base")
    extra = {"SWEEP": None, "--names": ["--names", "P,Q"], "--rows": ["--rows", "target_epsilon"],
             "--ceiling": ["--ceiling", top], "--tuning-cost": ["--tuning-cost"],
             "--title": ["--title", "My title"], "--out": None}[flag]
    if flag == "SWEEP":
        _, one = _cmp("selected", a, out=tmp_path / "one")
        assert "| y" not in one and "y" in base
    elif flag == "--out":
        assert json.loads((tmp_path / "base.json").read_text())["names"] == ["x", "y"]
        _required(["compare", "selected", a, b, "--out", tmp_path / "o"], "--out")
        (tmp_path / "file").write_text("")
        refused(["compare", "selected", a, b, "--out", tmp_path / "file" / "o"], "--out")
    else:
        _, md = _cmp("selected", a, b, *extra, out=tmp_path / "with")
        assert md != base
        if flag == "--rows":                      # one row key, not two
            assert "num_agents" in base and "num_agents" not in md
            return
        want = {"--names": "| P |", "--ceiling": "Ceiling", "--tuning-cost": "all candidates",
                "--title": "My title"}[flag]
        assert want in md and want not in base, (flag, md)
        if flag == "--tuning-cost":               # nothing to compose: said, not silent
            for d in (a, b):
                (d / "results.jsonl").write_text("".join(
                    json.dumps({k: v for k, v in json.loads(line).items() if k != "privacy"})
                    + "\n" for line in (d / "results.jsonl").read_text().splitlines()))
            r = run("compare", "selected", a, b, "--tuning-cost", "--out", tmp_path / "none")
            assert r.rc == 0 and "warning: --tuning-cost" in r.err


@case("compare arms", "RESULTS", "--arm", "--unit", "--labels", "--y", "--selected", "--title")
@case("compare arms", "--out")
def _(flag, sweeps, tmp_path):
    a, b, _ = sweeps
    args = ["arms", a / "results.jsonl", "--arm", "algorithm.rounds"]
    _, base = _cmp(*args, out=tmp_path / "base")
    if flag == "--out":
        assert "Welch" in (tmp_path / "base.md").read_text()
        _required([*(["compare"] + args), "--out", tmp_path / "o"], "--out")
        return
    if flag == "--arm":
        _required(["compare", *args, "--out", tmp_path / "x"], "--arm")
    extra = {"RESULTS": None, "--arm": None, "--unit": ["--unit", "target_epsilon"],
             "--labels": ["--labels", "chosen,other"], "--y": ["--y", "val_accuracy"],
             "--selected": ["--selected"], "--title": ["--title", "My title"]}[flag]
    if flag == "RESULTS":
        _, md = _cmp("arms", a / "results.jsonl", b / "results.jsonl", "--arm",
                     "algorithm.rounds", out=tmp_path / "two")
    elif flag == "--arm":
        _, md = _cmp("arms", a / "results.jsonl", "--arm", "target_epsilon", out=tmp_path / "e")
    else:
        _, md = _cmp(*args, *extra, out=tmp_path / "with")
    assert md != base, flag


@case("compare selected", "--debug")
@case("compare arms", "--debug")
def _(command, tmp_path):
    _debug_case(["compare", command.split()[1], tmp_path / "nothing", "--arm", "k", "--out",
                 tmp_path / "o"] if command.endswith("arms") else
                ["compare", "selected", tmp_path / "nothing", "--out", tmp_path / "o"])


# =========================================================================== bench

@pytest.fixture
def fake_bench(monkeypatch):
    """``bench.suite.run`` recorded: a record of the parts requested, each part's sizes named."""
    from fedjax_dp.bench import suite

    def record(name, out, *, only=None, sizes=None, population=None, log=print):
        names = suite.check_request(name, only, sizes, population)
        rec = {"suite": name, "sizes": sizes or name, "parts": names, "errors": [],
               "population": population}
        log(f"ran {names}")
        if out is not None:
            Path(f"{out}.json").write_text(json.dumps(rec))
            Path(f"{out}.md").write_text("x")
        return rec
    monkeypatch.setattr(suite, "run", Recorder(effect=record))
    monkeypatch.setattr(suite, "markdown",
                        lambda rec: f"suite {rec['suite']} sizes {rec['sizes']} {rec['parts']}"
                                    f" population {rec['population']}\n")
    return suite.run


@case("bench", "--suite", "--out", "--only", "--sizes", "--population")
def _(flag, fake_bench, tmp_path):
    base = run("bench")
    assert base.rc == 0 and base.out.startswith("suite quick sizes quick")
    population = tmp_path / "pop"                     # a converted population's three arrays
    population.mkdir()
    for name in ("x", "y", "counts"):
        np.save(population / f"{name}.npy", np.zeros(2, np.int32))
    value = {"--suite": "full", "--out": tmp_path / "b", "--only": "dp_sgd_step",
             "--sizes": "tiny", "--population": population}[flag]
    r = run("bench", flag, value)
    assert r.rc == 0 and r.out != base.out or flag == "--out", (flag, r)
    if flag == "--out":
        assert (tmp_path / "b.json").is_file() and "wrote" in r.err
    else:
        bad = {"--suite": "nope", "--only": "nope", "--sizes": "nope",
               "--population": str(tmp_path / "nope")}[flag]
        refused(["bench", flag, bad], flag)


@case("bench", "--debug")
def _(fake_bench):
    _debug_case(["bench", "--suite", "nope"])


# =========================================================================== data convert

def _tweet(text):
    return ["1467810369", "Mon Apr 06 22:19:45 PDT 2009", "NO_QUERY", "user", text]


@pytest.fixture(scope="module")
def leaf(tmp_path_factory):
    """A LEAF Sent140 source: 3 train users (3, 2, 1 tweets), 2 test users (3 tweets)."""
    from federated_fixtures import write_leaf
    root = tmp_path_factory.mktemp("sent140")
    write_leaf(root, "train", [{"u1": ([_tweet("good day"), _tweet("bad day"),
                                        _tweet("a good one")], [1, 0, 1]),
                                "u2": ([_tweet("day"), _tweet("night")], [1, 0])},
                               {"u3": ([_tweet("good night")], [1])}])
    write_leaf(root, "test", [{"u1": ([_tweet("good"), _tweet("bad")], [1, 0]),
                               "u2": ([_tweet("day one")], [1])}])
    (root / "vocab.txt").write_text("good\nday\nbad\n")
    return root


def _convert(leaf, tmp_path, *extra) -> dict:
    dst = tmp_path / f"pop{len(list(tmp_path.iterdir()))}"
    r = run("data", "convert", "leaf_sent140", leaf, dst, *extra)
    assert r.rc == 0, r.err
    return {**r.json, "stderr": r.err}


@case("data convert", "FORMAT", "SRC", "DST")
def _(flag, leaf, tmp_path):
    base = _convert(leaf, tmp_path)
    assert base["format"] == "leaf_sent140" and base["clients"] == 3
    if flag == "FORMAT":
        refused(["data", "convert", "tff_emnist", leaf, tmp_path / "f"], "tff_emnist")
        refused(["data", "convert", "nope", leaf, tmp_path / "f"], "FORMAT", "nope")
    elif flag == "SRC":
        refused(["data", "convert", "leaf_sent140", tmp_path / "nowhere", tmp_path / "g"],
                "nowhere")
    else:
        assert Path(base["folder"]).is_dir() and base["dataset"] == f"stacked:{base['folder']}"
        refused(["data", "convert", "leaf_sent140", leaf, base["folder"]], "DST")


@case("data convert", "--max-clients", "--max-records", "--max-test-records", "--vocab-size",
      "--vocab", "--seq-len", "--seed")
def _(flag, leaf, tmp_path):
    base = _convert(leaf, tmp_path, "--max-test-records", "2")
    value, key = {"--max-clients": ("2", "clients"), "--max-records": ("1", "train_records"),
                  "--max-test-records": ("1", "test_records"),
                  "--vocab-size": ("2", "options"), "--vocab": (leaf / "vocab.txt", "options"),
                  "--seq-len": ("5", "feature_shape"), "--seed": ("7", "subset")}[flag]
    got = _convert(leaf, tmp_path, "--max-test-records", "2", flag, value)
    if flag == "--seed":                     # another subset of the test records
        seeds = [_convert(leaf, tmp_path, "--max-test-records", "2", "--seed", str(s))
                 for s in range(1, 4)]
        subsets = {tuple(np.load(Path(g["folder"]) / "server.npz")["y_test"])
                   for g in seeds + [base, got]}
        assert len(subsets) > 1 and got["options"]["seed"] == 7
        refused(["data", "convert", "leaf_sent140", leaf, tmp_path / "s", "--seed", "7"],
                "--seed", "--max-test-records")
        return
    assert got[key] != base[key], (flag, got[key])
    if flag in ("--vocab-size", "--vocab"):
        vocab = (Path(got["folder"]) / "vocab.txt").read_text().split()
        assert len(vocab) == (2 if flag == "--vocab-size" else 3)
    if flag in ("--vocab-size", "--vocab", "--seq-len"):     # not for an image format
        refused(["data", "convert", "leaf_femnist", leaf, tmp_path / "i", flag, value], flag)


@pytest.fixture(scope="module")
def plays(tmp_path_factory):
    """Two per-play Gutenberg texts (tests/test_gutenberg_shakespeare.py's): 6 clients."""
    from test_gutenberg_shakespeare import PLAY_A, PLAY_B
    root = tmp_path_factory.mktemp("plays")
    (root / "a_gut.txt").write_text(PLAY_A)
    (root / "b_gut.txt").write_text(PLAY_B)
    return root


@case("data convert", "--split", "--train-fraction", "--split-seed")
def _(flag, plays, leaf, tmp_path):
    def convert(*extra) -> tuple[dict, list]:
        dst = tmp_path / f"g{len(list(tmp_path.iterdir()))}"
        r = run("data", "convert", "gutenberg_shakespeare", plays, dst, "--seq-len", "8", *extra)
        assert r.rc == 0, r.err
        return r.json, json.loads((dst / "clients.json").read_text())["train"]

    user = ("--split", "user", "--train-fraction", "0.5") if flag == "--split-seed" else ()
    value = {"--split": "user", "--train-fraction": "0.5", "--split-seed": "2"}[flag]
    (base, base_ids), (got, got_ids) = convert(*user), convert(*user, flag, value)
    if flag == "--split":                    # whole clients: 4 of the 6 train, 2 test (by
        # sample, 5 of them have test samples past the 7-sample gap)
        assert (base["clients"], got["clients"], got["test_clients"]) == (5, 4, 2)
    elif flag == "--train-fraction":         # the first half of each client's samples
        assert got["train_records"] < base["train_records"]
        assert got["options"]["train_fraction"] == 0.5
    else:                                    # another draw of the 3 training clients
        assert got["clients"] == base["clients"] == 3 and got_ids != base_ids
        refused(["data", "convert", "gutenberg_shakespeare", plays, tmp_path / "q", flag,
                 value], flag, "--split")
    refused(["data", "convert", "leaf_sent140", leaf, tmp_path / "r", flag, value], flag)


@case("data convert", "--window-stride")
def _(plays, leaf, tmp_path):
    def convert(*extra) -> dict:
        dst = tmp_path / f"s{len(list(tmp_path.iterdir()))}"
        r = run("data", "convert", "gutenberg_shakespeare", plays, dst, "--seq-len", "8", *extra)
        assert r.rc == 0, r.err
        return r.json

    base, got = convert(), convert("--window-stride", "8")
    assert got["clients"] == base["clients"] and got["train_records"] < base["train_records"]
    assert got["options"]["window_stride"] == 8
    refused(["data", "convert", "gutenberg_shakespeare", plays, tmp_path / "q",
             "--window-stride", "0"], "--window-stride")
    refused(["data", "convert", "leaf_sent140", leaf, tmp_path / "r", "--window-stride", "8"],
            "--window-stride")


@case("data convert", "--quiet")
def _(leaf, tmp_path, monkeypatch):
    from fedjax_dp.data import convert
    seen = Recorder(effect=convert.convert)
    monkeypatch.setattr(convert, "convert", seen)
    _convert(leaf, tmp_path)
    assert seen.kwargs["progress"] is True
    _convert(leaf, tmp_path, "--quiet")
    assert seen.kwargs["progress"] is False


@case("data convert", "--debug")
def _(leaf, tmp_path):
    _debug_case(["data", "convert", "nope", leaf, tmp_path / "x"])


# =========================================================================== selftest

@pytest.fixture
def fake_selftest(monkeypatch, no_cache):
    """``selftest.run`` recorded: a passing report of the selected cases (nothing runs)."""
    from fedjax_dp.experiments import selftest

    def report(cases, *, log=lambda line: None):
        names = [c.algorithm for c in cases]
        for n in names:
            log(f"PASS {n}")
        return {"passed": True, "cases": names}
    monkeypatch.setattr(selftest, "run", Recorder(effect=report))
    monkeypatch.setattr(selftest, "summary", lambda rep: f"{len(rep['cases'])} passed")
    return selftest.run


@case("selftest", "--json", "--families", "--compilation-cache")
def _(flag, fake_selftest, no_cache):
    base = run("selftest")
    assert base.rc == 0 and "PASS" in base.out and no_cache.args == ("user",)
    if flag == "--json":
        r = run("selftest", "--json")
        assert "PASS" not in r.out and r.json["passed"] is True
    elif flag == "--families":
        r = run("selftest", "--families", "fedkt")
        assert r.rc == 0 and 0 < r.out.count("PASS") < base.out.count("PASS")
        refused(["selftest", "--families", "nope"], "nope")
    else:
        assert run("selftest", "--compilation-cache", "off").rc == 0
        assert no_cache.args == ("off",)


@case("selftest", "--debug")
def _(fake_selftest):
    _debug_case(["selftest", "--families", "nope"])
