"""``fedjax-dp data convert``: published federated files -> a memory-mapped stacked population
(fedjax_dp.data.convert), its memory bound, and every shipped benchmark config run on a
converted file of its format (one of them through the CLI)."""
import json
from pathlib import Path
import tracemalloc

import numpy as np
import pytest

from federated_fixtures import write_emnist, write_leaf, write_tff
from fedjax_dp.data import convert
from fedjax_dp.experiments import cli


@pytest.fixture(scope="module")
def emnist(tmp_path_factory):
    """A digits-only EMNIST fixture (12 train writers of 3..6 records, 5 test writers) and its
    conversion."""
    root = tmp_path_factory.mktemp("emnist")
    rng = np.random.default_rng(0)
    sizes = [3 + c % 4 for c in range(12)]
    write_emnist(root, rng, sizes, [2, 1, 3, 1, 2], digits=True)
    summary = convert.convert("tff_emnist_digits", root, root / "pop", progress=False)
    return root, summary


def _h5(path):
    import h5py
    with h5py.File(path) as f:
        return {cid: {k: g[k][()] for k in g} for cid, g in f["examples"].items()}


def test_emnist_conversion_stacks_every_client_and_keeps_the_test_split(emnist):
    root, summary = emnist
    pop = root / "pop"
    train, test = _h5(root / "fed_emnist_digitsonly_train.h5"), \
        _h5(root / "fed_emnist_digitsonly_test.h5")
    x, y = np.load(pop / "x.npy"), np.load(pop / "y.npy")
    counts = np.load(pop / "counts.npy")
    ids = json.loads((pop / "clients.json").read_text())["train"]
    assert ids == sorted(train) and counts.tolist() == [len(train[c]["label"]) for c in ids]
    assert x.shape == (12, 6, 28, 28, 1) and y.shape == (12, 6)
    for i, cid in enumerate(ids):
        n = counts[i]
        np.testing.assert_array_equal(x[i, :n, :, :, 0], train[cid]["pixels"])
        np.testing.assert_array_equal(y[i, :n], train[cid]["label"])
        assert not x[i, n:].any() and not y[i, n:].any()          # padding is zeros
    with np.load(pop / "server.npz") as z:
        assert z["x_public"].shape == (0, 28, 28, 1) and int(z["num_classes"]) == 10
        tids = z["test_client_ids"].tolist()
        assert tids == sorted(test)
        for j, cid in enumerate(tids):                           # test records keep their client
            rows = z["test_client"] == j
            np.testing.assert_array_equal(z["y_test"][rows], test[cid]["label"])
            np.testing.assert_array_equal(z["x_test"][rows][..., 0], test[cid]["pixels"])
    assert summary["clients"] == 12 and summary["test_records"] == 9
    assert not (pop / "task.json").exists()                       # classification


def test_caps_and_test_subset(emnist, tmp_path):
    root, _ = emnist
    s = convert.convert("tff_emnist_digits", root, tmp_path / "p", max_clients=4, max_records=3,
                        max_test_records=5, seed=3, progress=False)
    assert np.load(tmp_path / "p" / "counts.npy").tolist() == [3, 3, 3, 3]
    full = np.load(root / "pop" / "y.npy")[:4, :3]
    np.testing.assert_array_equal(np.load(tmp_path / "p" / "y.npy"), full)
    with np.load(tmp_path / "p" / "server.npz") as z, np.load(root / "pop" / "server.npz") as a:
        assert len(z["y_test"]) == 5 and s["test_records_published"] == 9
        picked = [np.flatnonzero((a["x_test"] == xt).all(axis=(1, 2, 3)))[0]
                  for xt in z["x_test"]]
        assert picked == sorted(set(picked))                      # distinct, in client order
        np.testing.assert_array_equal(a["test_client"][picked], z["test_client"])


def test_sequences_write_task_and_vocab(tmp_path):
    write_tff(tmp_path / "shakespeare_train.h5", {"A": {"snippets": [b"dh", b"d" * 100]},
                                                   "B": {"snippets": [b"hl"]}})
    write_tff(tmp_path / "shakespeare_test.h5", {"A": {"snippets": [b"lp"]}})
    convert.convert("tff_shakespeare", tmp_path, tmp_path / "p", progress=False)
    y = np.load(tmp_path / "p" / "y.npy")
    assert y.shape == (2, 3, 80) and y.dtype == np.int32
    assert np.load(tmp_path / "p" / "counts.npy").tolist() == [3, 1]
    from fedjax_dp.models import tasks
    task = tasks.load(tmp_path / "p")
    assert (task.vocab_size, tuple(task.oov_ids), task.bos_id, task.eos_id) == (90, (87,), 88, 89)
    assert len((tmp_path / "p" / "vocab.txt").read_text().split("\n")) == 86 + 1
    from fedjax_dp.data import population                 # "stacked:PATH" carries the task
    dataset, agents = population.load_population({"dataset": f"stacked:{tmp_path / 'p'}",
                                                  "num_agents": 2})
    assert dataset.task == task and dataset.num_classes == 90
    assert dataset.x_test.shape == (1, 80) and dataset.x_test.dtype == np.int32
    assert agents.y.shape == (2, 3, 80) and dataset.y_train.shape == (4, 80)


def test_leaf_femnist_converts(tmp_path):
    rng = np.random.default_rng(4)
    def user(n):
        return rng.random((n, 784)).round(2).tolist(), rng.integers(0, 62, n).tolist()
    write_leaf(tmp_path, "train", [{"u0": user(2)}, {"u1": user(1), "u2": user(3)}])
    write_leaf(tmp_path, "test", [{"u0": user(1)}])
    s = convert.convert("leaf_femnist", tmp_path, tmp_path / "p", progress=False)
    assert (s["clients"], s["n_max"], s["test_records"]) == (3, 3, 1)
    assert json.loads((tmp_path / "p" / "clients.json").read_text())["train"] == \
        ["u0", "u1", "u2"]


def test_conversion_memory_is_one_client_not_the_population(tmp_path):
    """tracemalloc peak (numpy buffers included) of converting 300 clients (15 MB of pixels)
    stays far below the population: clients are read and written one at a time into the
    memory maps (whose pages are not Python allocations and are handed back as written)."""
    rng = np.random.default_rng(5)
    write_emnist(tmp_path, rng, [16] * 300, [2, 2])
    one_client = 16 * 28 * 28 * 4
    population = 300 * one_client
    tracemalloc.start()
    try:
        convert.convert("tff_emnist", tmp_path, tmp_path / "p", progress=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert np.load(tmp_path / "p" / "x.npy", mmap_mode="r").nbytes == population
    assert peak < 10 * one_client < population / 20, (peak, one_client, population)


def test_bad_input_is_named_before_any_work(emnist, tmp_path, capsys):
    root, _ = emnist
    bad = [(["bogus", str(root), str(tmp_path / "a")], "unknown FORMAT 'bogus'"),
           (["tff_emnist", str(tmp_path / "missing"), str(tmp_path / "a")], "does not exist"),
           (["tff_emnist_digits", str(root), str(root / "pop")], "is not an empty folder"),
           (["tff_emnist_digits", str(root), str(tmp_path / "a"), "--vocab-size", "5"],
            "--vocab-size / --vocab apply to"),
           (["tff_emnist_digits", str(root), str(tmp_path / "a"), "--max-clients", "0"],
            "--max-clients must be an integer >= 1"),
           (["leaf_femnist", str(root), str(tmp_path / "a")], "train/ folder")]
    for argv, msg in bad:
        assert cli.main(["data", "convert", *argv, "--quiet"]) == 2
        err = capsys.readouterr().err
        assert msg in err and err.count("\n") == 1, err
    assert not (tmp_path / "a").exists() and not (tmp_path / "a.partial").exists()


def _tweet(text):
    return ["1467810369", "Mon Apr 06 22:19:45 PDT 2009", "NO_QUERY", "user", text]


@pytest.mark.parametrize("fmt, x_shape, x_dtype, y_shape, classes", [
    ("tff_stackoverflow", (2, 2, 20), np.int32, (2, 2, 20), 7),
    ("tff_cifar100", (2, 2, 32, 32, 3), np.float32, (2, 2), 100),
    ("leaf_shakespeare", (1, 2, 80), np.int32, (1, 2, 80), 90),
    ("leaf_sent140", (2, 2, 25), np.float32, (2, 2), 2)])
def test_every_format_converts_to_its_record_layout(tmp_path, fmt, x_shape, x_dtype, y_shape,
                                                    classes):
    rng = np.random.default_rng(6)
    if fmt == "tff_stackoverflow":
        for split in ("train", "test"):
            write_tff(tmp_path / f"stackoverflow_{split}.h5",
                      {"1": {"tokens": [b"a b", b"c a"]}, "2": {"tokens": [b"b"]}})
    elif fmt == "tff_cifar100":
        for split in ("train", "test"):
            write_tff(tmp_path / f"fed_cifar100_{split}.h5", {c: {
                "image": rng.integers(0, 256, (2, 32, 32, 3)).astype(np.uint8),
                "label": rng.integers(0, 100, 2)} for c in ("0", "1")})
    elif fmt == "leaf_shakespeare":
        for split in ("train", "test"):
            write_leaf(tmp_path, split, [{"KING": (["d" * 80, "h" * 80], ["l", "p"])}])
    else:
        for split in ("train", "test"):
            write_leaf(tmp_path, split, [{"u1": ([_tweet("good day"), _tweet("bad")], [1, 0]),
                                          "u2": ([_tweet("day")], [1])}])
    options = {"vocab_size": 3} if fmt in ("tff_stackoverflow", "leaf_sent140") else {}
    s = convert.convert(fmt, tmp_path, tmp_path / "p", progress=False, **options)
    x, y = np.load(tmp_path / "p" / "x.npy"), np.load(tmp_path / "p" / "y.npy")
    assert (x.shape, x.dtype, y.shape, y.dtype) == (x_shape, x_dtype, y_shape, np.int32)
    assert s["num_classes"] == classes
    assert (tmp_path / "p" / "task.json").exists() == (len(y_shape) == 3)
    with np.load(tmp_path / "p" / "server.npz") as z:
        assert z["x_test"].shape[1:] == x_shape[2:] and z["y_test"].shape[1:] == y_shape[2:]


# ---- every shipped benchmark config runs (tiny) on a generated file of its format ----------

BENCHMARKS = sorted((Path(__file__).resolve().parents[1] / "configs" / "benchmarks")
                    .glob("*.toml"))
#: compile-cheap model sizes for the benchmark models (the configs use the literature's)
TINY_MODEL = {"cnn_emnist": "{conv_channels = [2, 2], dense = 4}",
              "char_lstm": "{embed_dim = 2, hidden = 3}",
              "word_lstm": "{embed_dim = 2, hidden = 3, projection = 2}",
              "resnet18_gn": "{width = 2, stage_blocks = [1, 1, 1, 1]}"}


def _benchmark_fixture(root, fmt):
    """A converted 4-client population of ``fmt`` (TFF layout) in ``root``; its folder."""
    rng = np.random.default_rng(7)
    if fmt == "tff_emnist":
        write_emnist(root, rng, [2, 3, 2, 1], [1, 1])
    elif fmt == "tff_shakespeare":
        for split in ("train", "test"):
            write_tff(root / f"shakespeare_{split}.h5",
                      {f"R{i}": {"snippets": [b"to be or not to be" * (i + 1)]} for i in range(4)})
    elif fmt == "tff_stackoverflow":
        for split in ("train", "test"):
            write_tff(root / f"stackoverflow_{split}.h5",
                      {str(i): {"tokens": [b"how do i sort a list", b"use sorted"]}
                       for i in range(4)})
    else:
        for split in ("train", "test"):
            write_tff(root / f"fed_cifar100_{split}.h5", {str(c): {
                "image": rng.integers(0, 256, (2, 32, 32, 3)).astype(np.uint8),
                "label": rng.integers(0, 100, 2)} for c in range(4)})
    options = {"vocab_size": 5} if fmt == "tff_stackoverflow" else {}
    options.update(seq_len=8) if fmt in ("tff_shakespeare", "tff_stackoverflow") else None
    return convert.convert(fmt, root, root / "pop", progress=False, **options)["folder"]


#: run in the default suite (the rest under -m sweep: tests/test_sequence_cli.py runs the
#: char_lstm DP-FedAvg and word_lstm FedAvg paths by default; ResNet-18 compiles for ~15 s)
DEFAULT_BENCHMARKS = ("emnist_dp_fedavg", "emnist_fedavg")


@pytest.mark.parametrize("path", [p if p.stem in DEFAULT_BENCHMARKS
                                  else pytest.param(p, marks=pytest.mark.sweep)
                                  for p in BENCHMARKS], ids=lambda p: p.stem)
def test_every_benchmark_config_runs_on_a_file_of_its_format(path, tmp_path, capsys):
    """Each configs/benchmarks/*.toml as shipped (algorithm, model, its privacy and sampling
    settings), made tiny by overrides: 1 round, 1 local step, small model sizes, on a converted
    4-client file of its dataset's format. The EMNIST DP-FedAvg one goes through the CLI end to
    end: ``data convert`` prints the config lines, ``run`` trains on ``stacked:DST`` (the writers
    as agents, the published test split)."""
    from fedjax_dp.experiments import config as config_lib
    from fedjax_dp.experiments import runner
    fmt = "tff_" + path.stem.split("_")[0]
    folder = _benchmark_fixture(tmp_path, fmt)
    if path.stem == "emnist_dp_fedavg":                  # again, through the CLI
        folder = str(tmp_path / "cli_pop")
        assert cli.main(["data", "convert", fmt, str(tmp_path / "fed_emnist_train.h5"),
                         folder, "--quiet"]) == 0
        printed = json.loads(capsys.readouterr().out)
        assert printed["dataset"] == f"stacked:{folder}" and printed["clients"] == 4
    shipped = config_lib.load(path)
    overrides = [f'data.dataset="stacked:{folder}"', "data.num_agents=4", "algorithm.rounds=1",
                 "train.steps=1", "train.batch_size=2",
                 f"model.options={TINY_MODEL[shipped['model']['name']]}"]
    if shipped["algorithm"].get("sampling") == "fixed":
        overrides.append("algorithm.cohort_size=2")
    else:
        overrides.append("algorithm.sampling_rate=0.5")
    if path.stem == "emnist_dp_fedavg":
        argv = [f"--set={o}" for o in overrides]
        assert cli.main(["run", str(path), *argv, "--out", str(tmp_path / "out"), "--quiet"]) == 0
        result = json.loads((tmp_path / "out" / "result.json").read_text())
    else:
        result = runner.run(config_lib.load(path, overrides), tmp_path / "out", progress=False)
    assert 0.0 <= result["test_accuracy"] <= 1.0
    private = shipped["algorithm"]["name"].startswith("dp_")
    assert bool(result["privacy"]) == private
