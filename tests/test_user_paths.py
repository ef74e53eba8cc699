"""What users run, run as they run it: the README's first command in a fresh copy of the
repository (relative paths, twice), a run killed with SIGKILL from a relative folder and resumed,
Ctrl-C, and every command line shown in README.md and docs/getting_started.md (run here, run by
a named test, checked against the parser as a synopsis, or marked ``<!-- not run by the tests:
why -->`` on its line)."""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedjax_dp.experiments import cli
from fedjax_dp.experiments import config as config_lib
from fedjax_dp.experiments import runner

ROOT = Path(__file__).resolve().parents[1]
SHOWN_IN = ("README.md", "docs/getting_started.md")
NOT_RUN = "<!-- not run by the tests:"
_STARTS = ("fedjax-dp ", ".venv/bin/", "python ", "python3 ", "pip ", "mkdocs ")


# ----------------------------------------------------------------------------- helpers

def fresh_copy(dest: Path) -> Path:
    """The repository's tracked files copied to ``dest`` (what a fresh clone holds), with
    ``.venv`` pointing at the environment running the tests (the README's install step)."""
    try:
        files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                               check=True).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):        # not a git checkout: the tree
        files = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file() and not
                 {".git", ".venv", "runs", "build"} & set(p.relative_to(ROOT).parts)]
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    (dest / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    return dest


#: the flag of tests/conftest.py that trades the compiled code's speed for compile time (its other
#: two, the legacy fusion emitters and one LLVM module per program, cut XLA:CPU's compile time
#: and leave the rounds about as fast)
TEST_ONLY_XLA_FLAGS = ("--xla_backend_optimization_level",)


def _env(cache: Path, *, users_xla_flags: bool = False) -> dict:
    """The subprocesses' environment: the CLI's compilation cache is the test session's (shared
    with the workers, tests/conftest.py), else ``cache``. ``users_xla_flags``: at XLA's default
    optimisation level, as a user's run compiles (without the suite's level 0, tests/conftest.py):
    for a run whose rounds do real work (the README's demo: 14 -> 6 s of rounds), not for one
    that compiles tiny programs or is compared with the test process's own results. (The legacy
    fusion emitters and the unsplit LLVM module stay: the README demo's first run compiled in
    22 s with them, 35 s without, its rounds as fast.)"""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    if users_xla_flags:
        env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split()
                                    if f.split("=")[0] not in TEST_ONLY_XLA_FLAGS)
    if not env.get("JAX_COMPILATION_CACHE_DIR"):
        env["FEDJAX_DP_CACHE_DIR"] = str(cache)
    return env


def readme_first_command() -> str:
    """The README's first ``fedjax-dp run`` command as written (its set-up line's last part)."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.S).group(1)
    first = next(line for line in block.splitlines() if "fedjax-dp run" in line)
    return next(part.strip() for part in first.split("&&") if "fedjax-dp run" in part)


def _fedjax_dp(copy: Path) -> str:
    return str(copy / ".venv" / "bin" / "fedjax-dp")


# ----------------------------------------------------------------------------- README first command

@pytest.mark.slow
def test_readme_first_command_as_written_in_a_fresh_copy_twice(tmp_path):
    copy = fresh_copy(tmp_path / "clone")
    command = readme_first_command()
    assert command.startswith(".venv/bin/fedjax-dp run ") and "--out" not in command
    env = _env(tmp_path / "cache", users_xla_flags=True)
    outs = []
    for _ in range(2):
        proc = subprocess.run(shlex.split(command), cwd=copy, env=env, capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        report = json.loads(proc.stdout)
        where = Path(report["result"])
        assert not where.is_absolute() and where.parts[0] == "runs"     # relative, as promised
        assert (copy / where).is_file()
        outs.append((copy / where, (copy / where).read_bytes()))
    (first, first_bytes), (second, _) = outs
    assert first.parent != second.parent                     # two folders ...
    assert first.read_bytes() == first_bytes                 # ... nothing overwritten
    results = [json.loads(p.read_text()) for p, _ in outs]
    assert results[0]["test_accuracy"] == results[1]["test_accuracy"]
    assert [g["epsilon"] for g in results[0]["privacy"]] == \
        [g["epsilon"] for g in results[1]["privacy"]]
    # the second identical run compiles nothing: its compilations are persistent-cache hits
    timing = results[1]["timing"]
    assert timing["compilations"] > 0 and timing["cache_hits"] >= 0.9 * timing["compilations"]
    lines = [json.loads(l) for l in (second.parent / "progress.jsonl").read_text().splitlines()]
    assert [l["round"] for l in lines] == list(range(1, 31))
    assert all(l["seconds"] >= 0 for l in lines)
    assert len(timing["round_s"]) == 30


# ----------------------------------------------------------------------------- killed and resumed

#: a DP-FedAvg run long enough to be stopped twice, small enough for the suite
KILL_SETS = ["algorithm.rounds=120", "run.checkpoint_every=10", "run.eval_every=40",
             "train.steps=2", "model.hidden=[16]", "privacy.accountants=[\"rdp\"]"]


def _sets(sets):
    return [a for s in sets for a in ("--set", s)]


#: Run in the child in place of the command: Ctrl-C's default disposition, then exec the command.
#: A test session started as a background job (``cmd &`` without job control) ignores SIGINT, a
#: Python started with it ignored never raises KeyboardInterrupt (the run would just finish), and
#: an ignored signal stays ignored across exec. (A ``preexec_fn`` would run Python between fork and
#: exec of this multithreaded process: unsafe, and JAX warns of it.)
_DEFAULT_SIGINT_THEN_EXEC = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL);"
                             " os.execv(sys.argv[1], sys.argv[1:])")


def _start(copy: Path, argv: list[str], env: dict) -> subprocess.Popen:
    command = [_fedjax_dp(copy), "run", *argv, "--quiet"]
    return subprocess.Popen([sys.executable, "-c", _DEFAULT_SIGINT_THEN_EXEC, *command], cwd=copy,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_rounds(proc: subprocess.Popen, progress: Path, rounds: int) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if progress.is_file() and len(progress.read_text().splitlines()) >= rounds:
            return
        assert proc.poll() is None, f"the run ended before round {rounds}: {proc.stderr.read()}"
        time.sleep(0.01)
    raise AssertionError("no progress")


@pytest.mark.slow
def test_killed_interrupted_and_resumed_from_a_relative_folder_equals_the_whole_run(
        tmp_path, monkeypatch):
    """SIGKILL mid-run, ``--resume``, Ctrl-C (SIGINT) during the resumed run, ``--resume`` to
    the end: the result equals the uninterrupted run (history, accuracy, every epsilon) and no
    round is counted twice; the Ctrl-C ends in one line naming the saved round, the epsilon of
    the finished rounds and the resume command."""
    copy = fresh_copy(tmp_path / "clone")
    env = _env(tmp_path / "cache")
    progress = copy / "runs" / "x" / "progress.jsonl"

    proc = _start(copy, ["configs/dp_fedavg/mnist5k.toml", *_sets(KILL_SETS), "--out",
                         "runs/x"], env)
    _wait_for_rounds(proc, progress, 25)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    killed_at = len(progress.read_text().splitlines())
    # rounds take milliseconds: enough must remain after the Ctrl-C below for it to land mid-run
    assert proc.returncode == -signal.SIGKILL and killed_at < 60
    assert (copy / "runs" / "x" / "checkpoints").is_dir()
    assert not (copy / "runs" / "x" / "result.json").exists()

    proc = _start(copy, ["--resume", "runs/x"], env)                # resumed, then Ctrl-C
    _wait_for_rounds(proc, progress, killed_at + 15)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    lines = [l for l in err.splitlines() if l.strip() and "WARNING" not in l]
    assert len(lines) == 1 and "Traceback" not in err, err
    line = lines[0]
    assert line.startswith("fedjax-dp: interrupted: stopped after round ")
    saved = int(re.search(r"last checkpoint at round (\d+)", line).group(1))
    finished = int(re.search(r"stopped after round (\d+)", line).group(1))
    assert saved >= 30 and saved % 10 == 0 and finished >= saved
    eps = float(re.search(r"agent eps=([0-9.]+)", line).group(1))
    import dp_accounting                          # dp-accounting directly: the config's q, sigma
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.PoissonSampledDpEvent(0.3, dp_accounting.GaussianDpEvent(1.5)),
                finished)
    assert eps == pytest.approx(acc.get_epsilon(1e-5), rel=2e-2)
    assert line.endswith("resume with: fedjax-dp run --resume runs/x")

    cfg = config_lib.load(ROOT / "configs" / "dp_fedavg" / "mnist5k.toml", KILL_SETS)
    want = runner.run(cfg, tmp_path / "whole", progress=False)
    monkeypatch.chdir(copy)                       # the last resume: the same command, in-process
    assert cli.main(["run", "--resume", "runs/x", "--quiet"]) == 0
    got = json.loads((copy / "runs" / "x" / "result.json").read_text())
    assert got["history"] == want["history"]
    assert got["test_accuracy"] == want["test_accuracy"]
    assert [(g["unit"], g["accountant"], g["epsilon"]) for g in got["privacy"]] == \
        [(g["unit"], g["accountant"], g["epsilon"]) for g in want["privacy"]]
    rounds = [json.loads(l)["round"] for l in progress.read_text().splitlines()]
    assert rounds == list(range(1, 121))                     # no round counted twice


# ----------------------------------------------------------------------------- errors in one line

def test_a_run_that_fails_after_it_started_keeps_its_rounds_and_says_how_to_resume(
        tmp_path, monkeypatch, capsys):
    """An error in round 3 (here: a failing evaluation) ends in one line, keeps rounds 1-2 and a
    checkpoint, and names the resume command; --debug shows the traceback instead."""
    from fedjax_dp.experiments import runner as runner_mod
    calls = {"n": 0}
    real = runner_mod.Setup.evaluate

    def failing(self, output):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("disk on fire\nsecond line")
        return real(self, output)

    monkeypatch.setattr(runner_mod.Setup, "evaluate", failing)
    monkeypatch.chdir(tmp_path)
    argv = ["run", str(ROOT / "configs" / "dp_fedavg" / "mnist5k.toml"),
            *_sets(["algorithm.rounds=5", "run.checkpoint_every=2", "run.eval_every=1",
                    "train.steps=2", "model.hidden=[8]", "data.num_agents=10"]),
            "--out", "runs/failed", "--quiet"]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "RuntimeError: disk on fire" in err[0] and "second line" not in err[0]
    assert "stopped after round 2 of 5" in err[0] and "last checkpoint at round 2" in err[0]
    assert err[0].endswith("resume with: fedjax-dp run --resume runs/failed")
    assert len((tmp_path / "runs" / "failed" / "progress.jsonl").read_text().splitlines()) == 2
    calls["n"] = 0
    with pytest.raises(RuntimeError, match="disk on fire"):
        cli.main(argv[:-3] + ["--out", "runs/failed2", "--quiet", "--debug"])


def test_a_diverging_learning_rate_stops_in_one_line_or_is_marked(tmp_path, capsys):
    argv = ["run", str(ROOT / "configs" / "dp_fedavg" / "mnist5k.toml"),
            *_sets(["algorithm.rounds=4", "train.learning_rate=1e30", "train.steps=2",
                    "model.hidden=[8]", "data.num_agents=10", "run.checkpoint_every=0"])]
    assert cli.main(argv + ["--out", str(tmp_path / "a"), "--quiet"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "training diverged at round 1" in err[0]
    assert "train.learning_rate (1e+30)" in err[0]
    assert not (tmp_path / "a" / "result.json").exists()
    assert (tmp_path / "a" / "progress.jsonl").read_text().strip()       # what was written kept
    # asked to continue: the run finishes, marked non-finite in result.json and the summary
    code = cli.main(argv + ["--set", "run.on_nonfinite=continue", "--out",
                            str(tmp_path / "b"), "--quiet"])
    out = capsys.readouterr().out
    assert code == 0 and json.loads(out)["non_finite"]["round"] == 1
    result = json.loads((tmp_path / "b" / "result.json").read_text())
    # the parameters (DP-FedAvg reports no train_loss unless algorithm.diagnostics = true)
    assert result["non_finite"] == {"round": 1, "what": "parameters"}
    assert "NON-FINITE from round 1" in runner.summary_line("dp_fedavg", result, None)


@pytest.mark.parametrize("setting, message", [
    ("algorithm.rounds=2.5", "algorithm.rounds must be"),
    ("algorithm.rounds=1e30", "algorithm.rounds must be in"),
    ("train.batch_size=8.5", "train.batch_size must be"),
    ("train.steps=1e30", "train.steps must be"),
])
def test_bad_numbers_through_the_cli_end_in_one_line(tmp_path, capsys, setting, message):
    code = cli.main(["run", str(ROOT / "configs" / "dp_fedavg" / "mnist5k.toml"), "--set",
                     setting, "--out", str(tmp_path / "x"), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0]


def test_integral_floats_run_as_integers():
    cfg = config_lib.load(ROOT / "configs" / "dp_fedavg" / "mnist5k.toml",
                          ["algorithm.rounds=2.0", "train.steps=2.0", "train.batch_size=8.0"])
    p = runner.plan(cfg)
    assert p.algorithm_config.rounds == 2 and type(p.algorithm_config.rounds) is int
    assert type(p.local.steps) is int and type(p.local.batch_size) is int
    # what config.json and result.json store is what runs
    assert cfg["algorithm"]["rounds"] == 2 and type(cfg["algorithm"]["rounds"]) is int
    assert type(cfg["train"]["batch_size"]) is int


# ----------------------------------------------------------------------------- shown commands

def shown_commands(path: Path) -> list[tuple[str, str]]:
    """``(command, line)`` for every command shown in a markdown file: lines of fenced blocks
    and inline code spans that start like a command (``fedjax-dp``, ``python``, ``pip``, ...)."""
    found, fenced = [], False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            cmd = line.split("  #")[0].strip()
            if cmd.startswith(_STARTS):
                found.append((cmd, line))
        else:
            for span in re.findall(r"`([^`]+)`", line):
                if span.startswith(_STARTS):
                    found.append((span.strip(), line))
    return found


def _is_synopsis(cmd: str) -> bool:
    return "[" in cmd or "..." in cmd or bool(re.search(r"\b[A-Z]{1,}\b", cmd.split(" ", 2)[-1]))


def _subparser(parser, words: list[str]):
    """The argparse parser of ``fedjax-dp WORD [WORD]`` (``account sampled-gaussian``) and the
    words it consumed; a word after a parser without sub-commands is a positional argument
    (``audit run``), a word that a parser with sub-commands does not know is not consumed."""
    import argparse
    used = []
    for word in words:
        actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not actions:
            return parser, used, False
        if word not in actions[0].choices:
            return parser, used, True
        parser = actions[0].choices[word]
        used.append(word)
    return parser, used, False


def check_synopsis(cmd: str) -> None:
    """A synopsis line names real sub-commands and flags of ``fedjax-dp``."""
    words = cmd.split()[1:]
    head = [w for w in words[:2] if re.fullmatch(r"[a-z][a-z-]*", w)]
    parser, used, unknown = _subparser(cli.build_parser(), head)
    known = {s for a in parser._actions for s in a.option_strings}
    flags = set(re.findall(r"(--[a-z][a-z-]*)", cmd))
    assert flags <= known, f"{cmd!r}: {sorted(flags - known)} are not flags of {used}"
    assert used and not unknown and parser.prog.endswith(" ".join(used)), \
        f"{cmd!r}: unknown sub-command"


_WHEEL = "tests/test_wheel.py::test_release_steps_and_a_wheel_install_outside_the_tree"
#: commands shown in the docs that other tests run (the test that runs each)
RUN_ELSEWHERE = {
    "python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]' && .venv/bin/python -m "
    "pytest -q -n 2": "tests/test_end_to_end.py::test_readme_has_two_setup_commands_and_ci_runs"
                      "_the_test_one (.ci/run runs it)",
    "mkdocs build": "tests/test_docs.py::test_site_builds_strict_with_every_page_and_the_api",
    # a wheel install outside the tree and the release steps (docs/getting_started.md): the
    # wheel test runs them (the install --no-deps, the dependencies the test environment's)
    **{cmd: _WHEEL for cmd in (
        "fedjax-dp run dp_fedavg/mnist5k", "fedjax-dp --version", "python -m fedjax_dp --version",
        "python -m build --no-isolation --outdir dist .",
        "python -m twine check --strict dist/*",
        "python3 -m venv /tmp/fedjax-dp-release && /tmp/fedjax-dp-release/bin/pip install -q "
        "dist/fedjax_dp-0.1.0-py3-none-any.whl")},
    "fedjax-dp sweep experiments/fedkt_table1 --dry-run":
        "tests/test_every_flag.py::test_flag (its sweep CONFIG case)",
}
#: concrete ``fedjax-dp run CONFIG`` commands shown in the docs, run here at small settings
#: (epsilon by RDP only: PLD is seconds of host work per run, checked by the README test above for
#: DP-FedAvg and by tests/test_fnas.py::test_cli_run_writes_genotype_times_and_privacy for DP-FNAS)
SMALL = ["algorithm.rounds=2", "train.steps=2", "model.hidden=[8]", "run.checkpoint_every=0",
         "run.eval_every=0", "privacy.accountants=[\"rdp\"]"]
#: DP-FNAS: the selftest's fnas case (configs/selftest.toml), so that its programs are the ones
#: tests/test_selftest.py compiled into the session's cache
SMALL_BY_ALGORITHM = {"dp_fnas": ["data.num_agents=2", "privacy.accountants=[\"rdp\"]",
                                  "algorithm.search_epochs=1", "algorithm.retrain_epochs=1",
                                  "algorithm.cells=1", "algorithm.nodes=1",
                                  "algorithm.channels=2", "algorithm.stem_multiplier=1",
                                  "algorithm.batch_size=8",
                                  "algorithm.retrain_batch_size=8", "run.checkpoint_every=0",
                                  "algorithm.primitives=[\"skip_connect\", \"max_pool_3x3\"]",
                                  "run.eval_every=0"]}


def _classify():
    run_here, synopses, problems = [], [], []
    for name in SHOWN_IN:
        for cmd, line in shown_commands(ROOT / name):
            if NOT_RUN in line:
                reason = line.split(NOT_RUN, 1)[1].split("-->")[0].strip()
                if not reason:
                    problems.append(f"{name}: {cmd!r} is marked not run without a reason")
            elif cmd in RUN_ELSEWHERE:
                pass
            elif cmd.startswith(".venv/bin/pip install") or "fedjax-dp run configs/" in cmd and \
                    cmd.endswith(readme_first_command().split("fedjax-dp ", 1)[1]) and \
                    "&&" in cmd:
                pass                         # the README's first line: the tests above run it
            elif cmd.startswith("fedjax-dp ") and _is_synopsis(cmd):
                synopses.append(cmd)
            elif cmd == readme_first_command().removeprefix(".venv/bin/"):
                pass                         # run as written (twice) by the README test above
            elif re.fullmatch(r"fedjax-dp run configs/[\w/]+\.toml", cmd):
                run_here.append(cmd)
            else:
                problems.append(f"{name}: {cmd!r} is neither run by a test nor marked "
                                f"'{NOT_RUN} why -->' on its line")
    return run_here, synopses, problems


def test_every_shown_command_is_run_or_marked_not_run():
    run_here, synopses, problems = _classify()
    assert not problems, "\n".join(problems)
    assert run_here and synopses
    for cmd in synopses:
        check_synopsis(cmd)
    for test in RUN_ELSEWHERE.values():
        file, func = test.split(" ")[0].split("::")
        assert f"def {func}(" in (ROOT / file).read_text(), test


def test_the_shown_command_check_can_fail(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text("Run `fedjax-dp run configs/x.toml --bogus` and\n```\nfedjax-dp sweep CONFIG "
                   "[--no-such-flag]\n```\n`python tools/slow.py` <!-- not run by the tests: slow -->\n")
    cmds = shown_commands(doc)
    assert [c for c, _ in cmds] == ["fedjax-dp run configs/x.toml --bogus",
                                    "fedjax-dp sweep CONFIG [--no-such-flag]",
                                    "python tools/slow.py"]
    with pytest.raises(AssertionError, match="--no-such-flag"):
        check_synopsis(cmds[1][0])
    # a misspelt sub-command of a command that has them; a positional word after one that has not
    with pytest.raises(AssertionError, match="unknown sub-command"):
        check_synopsis("fedjax-dp account sampled-gausian")
    check_synopsis("fedjax-dp audit run --config CONFIG --canaries M")


@pytest.mark.slow
@pytest.mark.parametrize("cmd", _classify()[0])
def test_shown_run_command_runs_at_small_settings(cmd, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)                       # the docs' paths are relative to the checkout
    config_path = cmd.split()[2]
    algorithm = config_lib.load(config_path)["algorithm"]["name"]
    sets = SMALL_BY_ALGORITHM.get(algorithm, SMALL)
    code = cli.main(cmd.split()[1:] + _sets(sets) + ["--out", str(tmp_path / "o"), "--quiet"])
    assert code == 0, capsys.readouterr().err
    assert (tmp_path / "o" / "result.json").is_file()


def test_sweep_in_a_relative_folder_resumes(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    base = ["sweep", str(ROOT / "configs" / "dp_fedavg" / "mnist5k.toml"),
            *_sets(["algorithm.rounds=1", "train.steps=2", "model.hidden=[8]",
                    "data.num_agents=10", "privacy.accountants=[\"rdp\"]"]), "--quiet"]
    assert cli.main(base + ["--grid", "algorithm.noise_multiplier=1.0", "--out",
                            "runs/sw"]) == 0
    assert json.loads(capsys.readouterr().out)["results"] == "runs/sw/results.jsonl"
    assert cli.main(base + ["--grid", "algorithm.noise_multiplier=1.0,2.0", "--resume",
                            "runs/sw"]) == 0                     # runs only the missing one
    lines = (tmp_path / "runs" / "sw" / "results.jsonl").read_text().splitlines()
    assert sorted(json.loads(l)["config"]["algorithm"]["noise_multiplier"] for l in lines) == \
        [1.0, 2.0]
