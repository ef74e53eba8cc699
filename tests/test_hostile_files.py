"""A run folder received from someone else is data: hostile checkpoints and configs end in one
line and exit status 2, with no side effect (nothing imported, called, run or written).

The adversary recomputes ``digests.json`` after editing (digests catch damage, not intent), so
these cases reach the parser behind them: the named-tuple registry, the type and size checks."""
import copy
import hashlib
import json
import os
import shutil

import pytest

from fedjax_dp.experiments import checkpoint, cli
from fedjax_dp.experiments import config as config_lib
from killed_runs import kill_after

RAW = {"data": {"dataset": "wbcd", "partition": "iid", "num_agents": 4},
       "model": {"name": "logistic"},
       "train": {"steps": 1, "batch_size": 8, "learning_rate": 0.1},
       "algorithm": {"name": "dp_fedavg", "rounds": 4, "sampling_rate": 0.75, "clip_norm": 1.0,
                     "noise_multiplier": 1.0},
       "run": {"eval_every": 0, "checkpoint_every": 2, "progress": False},
       "privacy": {"delta": 1e-5, "accountants": ["rdp"]}}


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory):
    """A run folder with a checkpoint at round 2, killed after round 3."""
    return kill_after(config_lib.resolve(copy.deepcopy(RAW)),
                      tmp_path_factory.mktemp("hostile") / "run", 3)


def _rehash(step):
    """What an adversary does after editing: digests.json made to match again."""
    d = json.loads((step / "digests.json").read_text())
    for name in d["files"]:
        if (step / name).is_file():
            d["files"][name] = hashlib.sha256((step / name).read_bytes()).hexdigest()
    (step / "digests.json").write_text(json.dumps(d))


def _edit_meta(step, edit):
    meta = json.loads((step / "meta.json").read_text())
    edit(meta)
    (step / "meta.json").write_text(json.dumps(meta))
    _rehash(step)


def _inject(meta, node):
    """``node`` added to the state's tree, after everything the run saved."""
    meta["structure"] = {"tuple": [meta["structure"], node]}


def _popen(meta, marker):
    _inject(meta, {"namedtuple": "fedjax_dp.experiments.checkpoint:os.popen",
                   "fields": {"cmd": {"leaf": 0}, "mode": {"leaf": 0}}})


def _system(meta, marker):
    _inject(meta, {"namedtuple": "os:system", "fields": {"command": {"leaf": 0}}})


def _unknown_class(meta, marker):
    _inject(meta, {"namedtuple": "collections:OrderedDict", "fields": {}})


def _wrong_fields(meta, marker):
    _inject(meta, {"namedtuple": "optax._src.base:EmptyState",
                   "fields": {"extra": {"leaf": 0}}})


def _nested(meta, marker):
    deep = {"leaf": 0}
    for _ in range(300):
        deep = {"list": [deep]}
    meta["structure"]["dict"]["deep"] = deep


def _python_kind(meta, marker):
    meta["structure"] = {"leaf": 0, "python": "eval"}


def _leaf_index(meta, marker):
    meta["structure"] = {"leaf": 10**9}


def _object_dtype(meta, marker):
    meta["arrays"][0]["dtype"] = "object"


def _huge_shape(meta, marker):
    meta["arrays"][0]["shape"] = [10**9, 10**9]


def _step_type(meta, marker):
    meta["step"] = "2; rm -rf ~"


def _history(meta, marker):
    meta["history"] = ["not a record"]


def _key_impl(meta, marker):
    meta["structure"] = {"leaf": 0, "key_impl": "os.system"}


META_CASES = {"attribute walk to os.popen": (_popen, "may hold"),
              "os:system": (_system, "may hold"),
              "class outside the registry": (_unknown_class, "may hold"),
              "fields not the class's": (_wrong_fields, "must be exactly"),
              "deeply nested": (_nested, "nested deeper"),
              "python scalar kind": (_python_kind, "bool, int or float"),
              "leaf index out of range": (_leaf_index, "not a tree node"),
              "object dtype": (_object_dtype, "dtype: one of"),
              "huge shape": (_huge_shape, "more than"),
              "step not an integer": (_step_type, "step must be"),
              "history not records": (_history, "history must be"),
              "PRNG key implementation": (_key_impl, "key implementation")}


def _files(folder):
    """Every file's bytes (the lock file aside: it names the pid of its last holder)."""
    return {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*")
            if p.is_file() and p.name != ".lock"}


def _resume_refused(folder, capsys, expect):
    before = _files(folder)
    code = cli.main(["run", "--resume", str(folder), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("fedjax-dp: error: ") and len(err.strip().splitlines()) == 1, err
    assert expect in err, err
    assert _files(folder) == before                     # no side effect: nothing written or removed


@pytest.mark.parametrize("case", list(META_CASES))
def test_hostile_checkpoint_metadata_is_refused(killed_run, tmp_path, capsys, case):
    edit, expect = META_CASES[case]
    folder = tmp_path / "run"
    shutil.copytree(killed_run, folder)
    marker = tmp_path / "pwned"
    _edit_meta(checkpoint.latest(folder), lambda meta: edit(meta, marker))
    _resume_refused(folder, capsys, expect)
    assert not marker.exists()


def test_the_attribute_walk_reaches_no_callable(killed_run):
    """The registry holds named-tuple classes only, looked up by exact name."""
    import optax
    types = checkpoint.registry({"s": optax.EmptyState()})
    assert "fedjax_dp.experiments.checkpoint:os.popen" not in types
    assert all(isinstance(c, type) and issubclass(c, tuple) and hasattr(c, "_fields")
               for c in types.values())
    with pytest.raises(checkpoint.CheckpointError, match="may hold"):
        checkpoint._decode({"namedtuple": "fedjax_dp.experiments.checkpoint:os.popen",
                            "fields": {"cmd": {"leaf": 0}}}, ["id"], types, "values")


def test_meta_json_is_covered_by_the_digests(killed_run, tmp_path, capsys):
    folder = tmp_path / "run"
    shutil.copytree(killed_run, folder)
    step = checkpoint.latest(folder)
    meta = json.loads((step / "meta.json").read_text())
    meta["history"][0]["train_loss"] = 0.0                # edited without rehashing
    (step / "meta.json").write_text(json.dumps(meta))
    _resume_refused(folder, capsys, "meta.json does not match its SHA-256")


def _symlinked_array(folder, outside):
    leaf = next(p for p in sorted((checkpoint.latest(folder) / "values").iterdir()))
    outside.write_bytes(leaf.read_bytes())
    leaf.unlink()
    leaf.symlink_to(outside)


def _symlinked_step(folder, outside):
    step = checkpoint.latest(folder)
    shutil.copytree(step, outside)
    shutil.rmtree(step)
    step.symlink_to(outside)                    # not a checkpoint: the resume starts over...


def _traversal(folder, outside):
    step = checkpoint.latest(folder)
    d = json.loads((step / "digests.json").read_text())
    d["files"]["../../../../etc/passwd"] = "0" * 64
    (step / "digests.json").write_text(json.dumps(d))


def _oversized_digests(folder, outside):
    step = checkpoint.latest(folder)
    with open(step / "digests.json", "w") as f:
        f.write('{"format": 2, "files": {"meta.json": "' + "0" * (65 * 2**20) + '"}}')


FILE_CASES = {"array file a symlink out of the folder": (_symlinked_array, "symlink"),
              "file name with a path traversal": (_traversal, "digests.json is not"),
              "oversized digests.json": (_oversized_digests, "larger than")}


@pytest.mark.parametrize("case", list(FILE_CASES))
def test_hostile_checkpoint_files_are_refused(killed_run, tmp_path, capsys, case):
    make, expect = FILE_CASES[case]
    folder = tmp_path / "run"
    shutil.copytree(killed_run, folder)
    make(folder, tmp_path / "outside")
    _resume_refused(folder, capsys, expect)


def test_a_symlinked_checkpoint_folder_is_not_read(killed_run, tmp_path):
    """checkpoints/step_N as a symlink out of the run folder is not a checkpoint."""
    folder = tmp_path / "run"
    shutil.copytree(killed_run, folder)
    _symlinked_step(folder, tmp_path / "outside")
    assert checkpoint.latest(folder) is None


@pytest.mark.parametrize("content,expect", [
    ("[" * 5000 + "]" * 5000, "nested deeper"),
    ('["a list, not a config"]', "expected a JSON object"),
    ("{not json", "not valid JSON"),
], ids=["nested", "not an object", "not JSON"])
def test_hostile_config_json_is_refused(killed_run, tmp_path, capsys, content, expect):
    folder = tmp_path / "run"
    shutil.copytree(killed_run, folder)
    (folder / "config.json").write_text(content)
    _resume_refused(folder, capsys, expect)


def test_config_json_symlink_out_of_the_folder_is_refused(killed_run, tmp_path, capsys):
    folder = tmp_path / "run"
    shutil.copytree(killed_run, folder)
    outside = tmp_path / "elsewhere.json"
    os.replace(folder / "config.json", outside)
    (folder / "config.json").symlink_to(outside)
    _resume_refused(folder, capsys, "symlink")
