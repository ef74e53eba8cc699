"""Files are data (issue 48) outside the run folder: every reader of a sweep's folder, a converted
population, a config, a votes file, a LEAF shard, a vocabulary, tracking.json and a DpEvent /
ledger JSON refuses a hostile file (a symlink out of its folder, too large, nested too deep, the
wrong top-level type, a class outside the registry) with ONE ValueError line (exit status 2 and
``fedjax-dp: error: ...`` through the command line), imports nothing it names; a failed write
(a full disk) leaves the previous file, no half population and a resumable sweep; one process
holds a sweep folder."""
import errno
import importlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from fedjax_dp.core import files
from fedjax_dp.experiments import cli, sweep

ROOT = Path(__file__).resolve().parents[1]
FEDAVG = str(ROOT / "configs" / "dp_fedavg" / "mnist5k.toml")
FEDAVG_SETS = ["data.num_agents=20", "algorithm.rounds=1", "train.steps=1", "run.eval_every=1",
               "model.hidden=[8]", "privacy.accountants=[\"rdp\"]"]
EMNIST = str(ROOT / "configs" / "benchmarks" / "emnist_fedavg.toml")
DEEP = "[" * 300 + "]" * 300                   # past files.MAX_JSON_DEPTH (100)


def _sweep_argv(*extra):
    return ["sweep", FEDAVG, *[a for s in FEDAVG_SETS for a in ("--set", s)], "--quiet", *extra]


def _refused(capsys, argv, *matches, code=2):
    got = cli.main(argv)
    err = capsys.readouterr().err.strip()
    assert got == code, err
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.startswith("fedjax-dp: error: "), err
    for m in matches:
        assert m in err, err
    return err


def _files(folder):
    """Every file's bytes (the lock file aside: it names its last holder's pid)."""
    return {p.relative_to(folder): p.read_bytes() for p in Path(folder).rglob("*")
            if p.is_file() and p.name != files.LOCK_NAME}


# ----------------------------------------------------------------------- a sweep's folder

@pytest.fixture(scope="module")
def finished_sweep(tmp_path_factory):
    """A finished one-run sweep folder as sweep.run leaves it, written by the sweep's own
    writers (its record made here, not trained: a --resume finds it done and trains nothing)."""
    out = tmp_path_factory.mktemp("sweep") / "sw"
    out.mkdir()
    sw = sweep.load([FEDAVG], overrides=FEDAVG_SETS)
    (run,) = sweep.expand(sw)
    rec = {"run_id": sweep.run_id(run.config), "sweep": sw.name, "base": run.base,
           "algorithm": "dp_fedavg", "params": {}, "target_epsilon": None, "calibrated": None,
           "seed": 0, "test_accuracy": 0.5, "epsilon": 1.0, "epsilon_unit": "agent",
           "privacy": [], "history": [], "config": run.config}
    sweep._append(out, rec)
    sweep.write_summaries([rec], out)
    files.write_json(out / "sweep.json", {"name": sw.name, "runs": 1,
                                          "invocations": [{"name": sw.name, "runs": 1}]})
    return out


@pytest.fixture
def sweep_copy(finished_sweep, tmp_path):
    out = tmp_path / "sw"
    shutil.copytree(finished_sweep, out)
    return out


def _outside(tmp_path, name, data: bytes):
    p = tmp_path / "elsewhere" / name
    p.parent.mkdir(exist_ok=True)
    p.write_bytes(data)
    return p


@pytest.mark.parametrize("case", ["symlink", "list", "deep", "large", "invocations"])
def test_hostile_sweep_json_is_refused_on_resume(sweep_copy, tmp_path, capsys, monkeypatch,
                                                 case):
    plan = sweep_copy / "sweep.json"
    if case == "symlink":
        target = _outside(tmp_path, "sweep.json", plan.read_bytes())
        plan.unlink()
        plan.symlink_to(target)
        expect = "is a symlink to"
    elif case == "list":
        plan.write_text("[]")
        expect = "holds a JSON list, expected a JSON object"
    elif case == "deep":
        plan.write_text('{"invocations": ' + DEEP + "}")
        expect = "nested deeper than"
    elif case == "large":
        monkeypatch.setattr(sweep, "MAX_PLAN_BYTES", 64)
        expect = "larger than 64 bytes"
    else:
        plan.write_text('{"invocations": [1, 2]}')
        expect = "'invocations' must be a list of JSON objects"
    before = _files(sweep_copy)
    _refused(capsys, _sweep_argv("--resume", str(sweep_copy)), "sweep.json", expect)
    assert _files(sweep_copy) == before                  # nothing written before the refusal


@pytest.mark.parametrize("case", ["symlink", "middle line", "not an object", "no run_id"])
def test_hostile_results_jsonl_is_refused_on_resume(sweep_copy, tmp_path, capsys, case):
    results = sweep_copy / "results.jsonl"
    line = results.read_bytes()
    if case == "symlink":
        target = _outside(tmp_path, "results.jsonl", line)
        results.unlink()
        results.symlink_to(target)
        expect = "is a symlink to"
    elif case == "middle line":
        results.write_bytes(b'{"run_id": "cut\n' + line)
        expect = "line 1 is not valid JSON"
    elif case == "not an object":
        results.write_bytes(b"[1, 2]\n" + line)
        expect = "line 1 is a JSON list, not a record"
    else:
        results.write_bytes(b'{"seed": 0}\n' + line)
        expect = "has no run_id"
    before = _files(sweep_copy)
    _refused(capsys, _sweep_argv("--resume", str(sweep_copy)), "results.jsonl", expect)
    assert _files(sweep_copy) == before


def test_a_killed_sweeps_folder_resumes_as_it_is(sweep_copy, capsys):
    """Killed while appending (a last line without its newline) and holding its lock (a stale
    .lock naming a dead pid): --resume drops the cut line, runs nothing already done, and ends
    with a whole file."""
    results = sweep_copy / "results.jsonl"
    whole = results.read_bytes()
    results.write_bytes(whole + b'{"run_id": "cu')
    (sweep_copy / files.LOCK_NAME).write_text("999999999\n")
    (sweep_copy / ".summary.csv.abc.tmp").write_text("half")        # a cut atomic write
    assert cli.main(_sweep_argv("--resume", str(sweep_copy))) == 0
    capsys.readouterr()
    assert results.read_bytes() == whole                 # the record was done: not run again
    assert not (sweep_copy / ".summary.csv.abc.tmp").exists()


def test_a_full_disk_during_a_table_write_keeps_the_previous_file(sweep_copy, capsys,
                                                                  monkeypatch):
    before = _files(sweep_copy)
    real = os.replace

    def full(src, dst, *a, **k):
        if Path(dst).name == "summary.csv":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(src, dst, *a, **k)

    monkeypatch.setattr(os, "replace", full)
    err = _refused(capsys, _sweep_argv("--resume", str(sweep_copy)), "summary.csv",
                   "No space left on device", f"--resume {sweep_copy}", code=1)
    assert "free some space" in err
    after = _files(sweep_copy)
    assert after[Path("summary.csv")] == before[Path("summary.csv")]
    assert after[Path("results.jsonl")] == before[Path("results.jsonl")]
    assert not list(sweep_copy.glob(".*.tmp"))          # the temporary file went with it
    monkeypatch.setattr(os, "replace", real)
    assert cli.main(_sweep_argv("--resume", str(sweep_copy))) == 0      # and it resumes
    capsys.readouterr()
    assert _files(sweep_copy)[Path("results.jsonl")] == before[Path("results.jsonl")]


def test_a_second_sweep_on_a_live_folder_is_refused(sweep_copy, tmp_path, capsys):
    before = _files(sweep_copy)
    with files.FolderLock(sweep_copy, what="--out"):    # another live sweep (this process)
        _refused(capsys, _sweep_argv("--resume", str(sweep_copy)), "--resume",
                 "in use by another process", f"pid {os.getpid()}")
        fresh = tmp_path / "fresh"
        fresh.mkdir()
        with files.FolderLock(fresh):
            _refused(capsys, _sweep_argv("--out", str(fresh)), "--out", f"pid {os.getpid()}")
        assert _files(sweep_copy) == before and _files(fresh) == {}
    # the sweep's lock is the sweep folder's: a run folder inside it is locked on its own
    run_folder = sweep_copy / "runs" / "x"
    run_folder.mkdir(parents=True)
    with sweep.hold(sweep_copy, what="--resume"):
        with sweep.hold(sweep_copy):                     # nested in one process: one lock
            with files.FolderLock(run_folder):
                pass
        with pytest.raises(files.FolderBusyError):
            files.FolderLock(sweep_copy)
    files.FolderLock(sweep_copy).release()               # released at the block's end


def test_a_refused_sweep_leaves_no_folder(tmp_path, capsys):
    out = tmp_path / "new"
    _refused(capsys, _sweep_argv("--out", str(out), "--set", "algorithm.rounds=0"),
             "algorithm.rounds")
    assert not out.exists()


# ----------------------------------------------------------------------- records read back

@pytest.mark.parametrize("case", ["symlink", "list", "selected"])
def test_hostile_records_are_refused_by_plot(finished_sweep, tmp_path, capsys, case):
    folder = tmp_path / "r"
    folder.mkdir()
    argv = ["plot", str(folder), "--out", str(tmp_path / "p")]
    if case == "symlink":               # a file found in the folder must be inside it
        (folder / "results.jsonl").symlink_to(finished_sweep / "results.jsonl")
        expect = "is a symlink to"
    elif case == "list":
        (folder / "result.json").write_text("[]")
        expect = "holds a JSON list, expected a JSON object"
    else:
        shutil.copy(finished_sweep / "results.jsonl", folder)
        (folder / "selected.json").write_text('[{"base": 1}]')
        argv.append("--selected")
        expect = "row 1 is not a selection"
    _refused(capsys, argv, expect)
    assert not list(tmp_path.glob("p.*"))


# ----------------------------------------------------------------------- a population

@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """A converted 4-writer EMNIST population (the folder)."""
    from federated_fixtures import write_emnist
    from fedjax_dp.data import convert
    root = tmp_path_factory.mktemp("conv")
    write_emnist(root, np.random.default_rng(1), [2, 3, 2, 4], [1, 1])
    return Path(convert.convert("tff_emnist", root, root / "pop", progress=False)["folder"])


def _symlink_out(folder, name, tmp_path):
    target = _outside(tmp_path, name, (folder / name).read_bytes())
    (folder / name).unlink()
    (folder / name).symlink_to(target)


def _object_server(folder, tmp_path):
    with np.load(folder / "server.npz") as z:
        arrays = dict(z)
    arrays["x_test"] = np.array([{"a": 1}], dtype=object)
    np.savez(folder / "server.npz", **arrays)


def _object_x(folder, tmp_path):
    np.save(folder / "x.npy", np.array([[{"a": 1}]], dtype=object), allow_pickle=True)


POPULATION_CASES = {
    "x.npy out": (lambda f, t: _symlink_out(f, "x.npy", t), "x.npy"),
    "clients.json out": (lambda f, t: _symlink_out(f, "clients.json", t), "clients.json"),
    "server.npz out": (lambda f, t: _symlink_out(f, "server.npz", t), "server.npz"),
    "clients.json deep": (lambda f, t: (f / "clients.json").write_text(
        '{"train": ' + DEEP + "}"), "nested deeper than"),
    "clients.json list": (lambda f, t: (f / "clients.json").write_text("[]"),
                          "holds a JSON list, expected a JSON object"),
    "task.json list": (lambda f, t: (f / "task.json").write_text("[]"),
                       "task file"),
    "task.json out": (lambda f, t: (_outside(t, "task.json", b'{"kind": "classification"}'),
                                    (f / "task.json").symlink_to(t / "elsewhere" / "task.json")),
                      "task.json"),
    "server.npz pickled": (_object_server, "server.npz"),
    "x.npy pickled": (_object_x, "x.npy"),
}


@pytest.mark.parametrize("case", list(POPULATION_CASES))
def test_a_hostile_population_is_refused(converted, tmp_path, capsys, case):
    edit, expect = POPULATION_CASES[case]
    folder = tmp_path / "pop"
    shutil.copytree(converted, folder, symlinks=True)
    edit(folder, tmp_path)
    err = _refused(capsys, ["run", EMNIST, "--set", f'data.dataset="stacked:{folder}"',
                            "--set", "data.num_agents=4", "--quiet", "--out",
                            str(tmp_path / "out")], "data.dataset", expect)
    if case.endswith(" out"):
        assert "symlink" in err and "outside" in err
    assert not (tmp_path / "out").exists()


def test_an_oversized_population_file_is_refused(converted, tmp_path, capsys, monkeypatch):
    from fedjax_dp.data import population
    monkeypatch.setattr(population, "MAX_META_BYTES", 16)
    folder = tmp_path / "pop"
    shutil.copytree(converted, folder)
    _refused(capsys, ["run", EMNIST, "--set", f'data.dataset="stacked:{folder}"',
                      "--set", "data.num_agents=4", "--quiet", "--out", str(tmp_path / "out")],
             "clients.json", "larger than 16 bytes")


# ----------------------------------------------------------------------- convert's writes

def _emnist_src(tmp_path):
    from federated_fixtures import write_emnist
    (tmp_path / "src").mkdir()
    return write_emnist(tmp_path / "src", np.random.default_rng(1), [2, 3], [1])


@pytest.mark.parametrize("where", ["savez", "rename"])
def test_a_full_disk_during_convert_leaves_no_population(tmp_path, capsys, monkeypatch, where):
    src = _emnist_src(tmp_path)
    dst = tmp_path / "pop"
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    if where == "savez":
        def savez(*a, **k):
            raise full
        monkeypatch.setattr(np, "savez", savez)
    else:
        real = os.replace

        def replace(a, b, *args, **kw):
            if Path(b) == dst:
                raise full
            return real(a, b, *args, **kw)
        monkeypatch.setattr(os, "replace", replace)
    _refused(capsys, ["data", "convert", "tff_emnist", str(src), str(dst), "--quiet"],
             str(dst), "No space left on device", "nothing was kept", code=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]    # no DST, no .pop.tmp-*


def test_convert_builds_in_a_hidden_sibling_and_clears_a_dead_ones(tmp_path, monkeypatch):
    from fedjax_dp.data import convert
    src = _emnist_src(tmp_path)
    dead = subprocess.Popen(["true"])
    dead.wait()
    left = tmp_path / f".pop.tmp-{dead.pid}"           # what a killed conversion left
    (left / "x.npy").parent.mkdir()
    (left / "x.npy").write_bytes(b"half")
    seen = []
    real = os.replace

    def replace(a, b, *args, **kw):
        seen.append(Path(a).name)
        return real(a, b, *args, **kw)
    monkeypatch.setattr(os, "replace", replace)
    convert.convert("tff_emnist", src, tmp_path / "pop", progress=False)
    assert f".pop.tmp-{os.getpid()}" in seen
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pop", "src"]


# ----------------------------------------------------------------------- other readers

def test_an_oversized_or_deep_config_file_is_refused(tmp_path, capsys, monkeypatch):
    from fedjax_dp.experiments import config as config_lib
    deep = tmp_path / "deep.toml"
    deep.write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
    _refused(capsys, ["run", str(deep), "--out", str(tmp_path / "o")], "deep.toml",
             "nested too deep")
    monkeypatch.setattr(config_lib, "MAX_CONFIG_BYTES", 64)
    _refused(capsys, ["run", FEDAVG, "--out", str(tmp_path / "o")], "mnist5k.toml",
             "larger than 64 bytes")
    _refused(capsys, _sweep_argv("--out", str(tmp_path / "s")), "larger than 64 bytes")
    assert not (tmp_path / "o").exists() and not (tmp_path / "s").exists()


@pytest.mark.parametrize("content, expect", [
    (DEEP, "nested deeper than"),
    ('{"votes": [[1, 2]], "z": {"a": 1}}', "z must be one integer"),
    ('{"votes": [[1, 2], [3]]}', "votes must be a numeric array"),
    ("[1, 2", "is not valid JSON"),
])
def test_hostile_votes_files_are_refused(tmp_path, capsys, content, expect):
    path = tmp_path / "votes.json"
    path.write_text(content)
    _refused(capsys, ["account", "fedkt", "--votes", str(path), "--gamma", "0.05", "--delta",
                      "1e-5", "--level", "L1"], expect)


def test_a_pickled_votes_archive_is_refused(tmp_path, capsys):
    path = tmp_path / "votes.npz"
    np.savez(path, votes=np.array([[{"a": 1}]], dtype=object))
    _refused(capsys, ["account", "fedkt", "--votes", str(path), "--gamma", "0.05", "--delta",
                      "1e-5", "--level", "L1"], "votes.npz", "not a votes archive")


def test_hostile_leaf_shards_and_vocabularies_are_refused(tmp_path, monkeypatch):
    from fedjax_dp.data import leaf_json, vocab
    shard = tmp_path / "src" / "train" / "a.json"
    shard.parent.mkdir(parents=True)
    shard.write_text('{"users": ' + "[" * 100000 + "]" * 100000 + "}")
    with pytest.raises(ValueError, match="a.json.*is nested deeper than"):
        leaf_json.read_shard(shard)
    shard.unlink()
    shard.symlink_to(_outside(tmp_path, "a.json", b'{"users": []}'))
    with pytest.raises(files.UntrustedFileError, match="symlink.*outside"):
        leaf_json.read_shard(shard)
    monkeypatch.setattr(leaf_json, "MAX_SHARD_BYTES", 4)
    with pytest.raises(files.UntrustedFileError, match="larger than 4 bytes"):
        leaf_json.read_shard(shard.resolve())
    words = tmp_path / "vocab.txt"
    words.write_text("a\nb\nc\n")
    assert vocab.load_vocab(words).tokens == ("a", "b", "c")
    monkeypatch.setattr(vocab, "MAX_VOCAB_BYTES", 4)
    with pytest.raises(files.UntrustedFileError, match="--vocab.*larger than 4 bytes"):
        vocab.load_vocab(words)


def test_hostile_tracking_state_is_refused(tmp_path):
    from fedjax_dp.experiments import tracking
    folder = tmp_path / "run"
    folder.mkdir()
    assert tracking.read_state(folder) == {}
    for text, expect in [("[]", "expected a JSON object"), ('{"wandb_id": "../x"}',
                                                            "is not a W&B run id"),
                         ('{"a": ' + DEEP + "}", "nested deeper than")]:
        (folder / "tracking.json").write_text(text)
        with pytest.raises(ValueError, match=expect):
            tracking.read_state(folder)
    (folder / "tracking.json").unlink()
    (folder / "tracking.json").symlink_to(_outside(tmp_path, "t.json", b'{"wandb_id": "ab"}'))
    with pytest.raises(ValueError, match="symlink"):
        tracking.read_state(folder)


# ----------------------------------------------------------------------- events and ledgers

EVENT_CASES = [
    ({"class_name": "popen", "module_name": "os"}, "unknown DpEvent class 'os.popen'"),
    ({"class_name": "GaussianDpEvent", "module_name": "dp_accounting.xyz",
      "noise_multiplier": 1.0}, "unknown DpEvent class 'dp_accounting.xyz.GaussianDpEvent'"),
    ({"class_name": "RdpAccountant", "module_name": "dp_accounting.rdp"}, "unknown DpEvent"),
    ({"class_name": "DpEvent"}, "unknown DpEvent class"),
    ({"class_name": "GaussianDpEvent", "noise_multiplier": "1; rm -rf"}, "is not a float"),
    ({"class_name": "GaussianDpEvent", "noise_multiplier": 1.0, "__class__": 1}, "unknown"),
    ({"class_name": "GaussianDpEvent"}, "missing ['noise_multiplier']"),
    ({"class_name": "SelfComposedDpEvent", "count": 2, "event": {"x": 1}}, "is not a DpEvent"),
    ([], "must be an object with a class_name"),
    ('{"class_name": ' * 200 + "1" + "}" * 200, "nested deeper than"),
]


@pytest.mark.parametrize("data, expect", EVENT_CASES)
def test_a_dp_event_from_json_is_looked_up_never_imported(monkeypatch, data, expect):
    from dp_accounting import dp_event
    from fedjax_dp.privacy import accounting, ledger

    def no_import(name, *a, **k):
        raise AssertionError(f"imported {name!r} named in a file")

    monkeypatch.setattr(importlib, "import_module", no_import)
    good = dp_event.SelfComposedDpEvent(dp_event.PoissonSampledDpEvent(
        0.1, dp_event.GaussianDpEvent(1.0)), 3)
    assert accounting.event_from_json(json.dumps(accounting.event_to_json(good))) == good
    with pytest.raises(ValueError, match=expect.replace("[", r"\[").replace("(", r"\(")) as e:
        accounting.event_from_json(data)
    assert "\n" not in str(e.value)
    entry = {"unit": "agent", "relation": "add_remove", "kind": "event", "event": data}
    with pytest.raises(ValueError):
        ledger.PrivacyLedger.from_json({"entries": [entry]})


@pytest.mark.parametrize("data, expect", [
    ("[]", "an object with a list 'entries'"),
    ({"entries": [{"unit": "agent"}]}, "malformed (no key 'kind')"),
    ({"entries": [["kind"]]}, "must be a JSON object"),
    ({"entries": [], "uncovered": [{"release": 1}]}, "'uncovered' must be a list"),
    ('{"entries": ' + DEEP + "}", "nested deeper than"),
])
def test_a_malformed_ledger_json_is_one_value_error(data, expect):
    from fedjax_dp.privacy import ledger
    with pytest.raises(ValueError, match=expect.replace("(", r"\(").replace(")", r"\)")):
        ledger.PrivacyLedger.from_json(data)


def test_a_deep_genotype_string_is_a_value_error():
    from fedjax_dp.models import darts
    with pytest.raises(ValueError, match="nested deeper than 8"):
        darts.Genotype.from_json(DEEP)
