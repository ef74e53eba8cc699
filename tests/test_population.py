"""A run's population: generated sources streamed into the stacked agents (equal to the old
gather-then-stack path), ``stacked:PATH`` round trips through the runner, ``agents_on = "auto"``,
and the build holding less than twice the agents' data."""
import copy
import tracemalloc

import jax
import numpy as np
import pytest

from fedjax_dp import data as data_lib
from fedjax_dp.core import (auto_placement, from_partition, is_on_host, place, rng,
                            stack_records)
from fedjax_dp.core.defaults import AUTO_HOST_BYTES
from fedjax_dp.experiments import config as config_lib
from fedjax_dp.data import population
from fedjax_dp.experiments import runner

SYN = ["data.dataset=synthetic", "data.dataset_options={num_train=600,num_features=6,"
       "num_public=40,num_test=50}", "data.num_agents=23"]
FEDAVG = ["algorithm.name=\"fedavg\"", "algorithm.rounds=2", "train.steps=2",
          "model.hidden=[8]", "run.progress=false", "run.checkpoint_every=0"]


def _old_agents(config):
    """The pre-streaming path: materialised dataset -> hold-out -> partition -> from_partition."""
    d, root = config["data"], rng.as_key(config["seed"])
    ds = data_lib.load_dataset(d["dataset"], **d["dataset_options"])
    x_val = None
    if d["validation_fraction"]:
        ds, x_val, _ = population.hold_out(ds, d["validation_fraction"],
                                           rng.stream(root, "validation"))
    idx = population.partition_indices(d, ds, rng.stream(root, "partition"))
    return from_partition(ds.x_train, ds.y_train, idx), x_val


def _equal(a, b):
    for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        u, v = np.asarray(u), np.asarray(v)
        assert u.dtype == v.dtype and u.shape == v.shape and np.array_equal(u, v)


@pytest.mark.parametrize("extra", [
    ["data.partition=\"iid\"", "run.agents_on=\"host\""],
    ["data.partition=\"label_shards\"", "data.partition_options={classes_per_agent=3}",
     "data.validation_fraction=0.1", "run.agents_on=\"device\""],
    ["data.partition=\"by_domain\"", "data.num_agents=24", "data.validation_fraction=0.2",
     "data.dataset_options={num_train=600,num_features=6,num_domains=3}"],
])
def test_streamed_synthetic_equals_old_path(extra):
    config = config_lib.resolve({}, SYN + extra)
    pop = population.build(config)
    assert isinstance(pop.dataset, data_lib.StreamedDataset)       # x_train never built
    old, x_val = _old_agents(config)
    _equal(old, pop.agents)
    if x_val is not None:
        assert np.array_equal(x_val, pop.x_val)
    where = config["run"]["agents_on"]
    if where == "auto":
        where = auto_placement(pop.agents.nbytes)                  # 22 KB: on the device
    assert is_on_host(pop.agents) == (where == "host")


def test_stream_is_block_size_free_and_stack_records_checks():
    s = data_lib.synthetic_stream(num_train=300, num_features=4, num_domains=2, seed=3)
    whole = data_lib.synthetic(num_train=300, num_features=4, num_domains=2, seed=3)
    for size in (1, 7, 1000):
        assert np.array_equal(np.concatenate(list(s.blocks(size))), whole.x_train)
    keep = np.arange(0, 300, 3)
    assert np.array_equal(np.concatenate(list(s.subset(keep).blocks(11))), whole.x_train[keep])
    assert np.array_equal(s.rows([5, 2, 299]), whole.x_train[[5, 2, 299]])
    y = whole.y_train
    with pytest.raises(ValueError, match="disjoint"):
        stack_records([whole.x_train], y, [np.array([0, 1]), np.array([1])])
    with pytest.raises(ValueError, match="agent 1 has no records"):
        stack_records([whole.x_train], y, [np.array([0]), np.array([], np.int64)])
    with pytest.raises(ValueError, match="blocks hold 299"):
        stack_records([whole.x_train[:299]], y, [np.array([0])])


def _result(config, out):
    r = runner.run(config, out)
    return {k: r[k] for k in ("test_accuracy", "privacy", "history", "num_agents")}


def test_stacked_path_round_trip_through_runner(tmp_path, monkeypatch):
    config = config_lib.resolve({}, SYN + FEDAVG)
    direct = _result(config, tmp_path / "direct")
    saved = population.save(config, tmp_path / "pop")
    assert isinstance(saved.agents.x, np.memmap)
    monkeypatch.chdir(tmp_path)                                    # relative PATH: from cwd
    stacked = copy.deepcopy(config)
    stacked["data"].update(dataset="stacked:pop", dataset_options={})
    assert _result(stacked, tmp_path / "from_stacked") == direct
    stacked["run"]["agents_on"] = "host"
    s = runner.setup(stacked)                          # memory-mapped, not copied
    assert isinstance(s.fed.agents.x, np.memmap) and s.dataset.name == "synthetic"


def test_stacked_path_errors(tmp_path):
    base = config_lib.resolve({}, FEDAVG + ["data.num_agents=23"])

    def err(spec, **data):
        c = config_lib.resolve({}, FEDAVG + ["data.num_agents=23"])
        c["data"].update(dataset=spec, **data)
        with pytest.raises(config_lib.ConfigError) as e:
            runner.setup(c)
        assert "\n" not in str(e.value)
        return str(e.value)

    assert "does not exist" in err(f"stacked:{tmp_path / 'nowhere'}")
    assert "is not a stacked population" in err(f"stacked:{tmp_path}")
    agents, _ = _old_agents(config_lib.resolve({}, SYN))
    population.save_population(tmp_path / "p", agents.on_host(), data_lib.synthetic(
        num_train=600, num_features=6, num_public=40, num_test=50))
    assert "set data.num_agents=23" in err(f"stacked:{tmp_path / 'p'}", num_agents=5)
    assert "validation_fraction" in err(f"stacked:{tmp_path / 'p'}", validation_fraction=0.1)
    (tmp_path / "p" / population.SERVER_FILE).unlink()
    assert "server_dataset" in err(f"stacked:{tmp_path / 'p'}")
    assert base["run"]["agents_on"] == "auto"                      # the default


class _FakeDevice:
    def __init__(self, stats):
        self.stats = stats

    def memory_stats(self):
        if isinstance(self.stats, Exception):
            raise self.stats
        return self.stats


def test_agents_on_auto_rule():
    gpu = _FakeDevice({"bytes_limit": 16 << 30, "bytes_in_use": 0})
    assert auto_placement(4 << 30, gpu) == "device"               # exactly 25%: fits
    assert auto_placement((4 << 30) + 1, gpu) == "host"
    for cpu in (_FakeDevice(None), _FakeDevice(NotImplementedError()), _FakeDevice({})):
        assert auto_placement(AUTO_HOST_BYTES, cpu) == "device"         # 64 MiB
        assert auto_placement(AUTO_HOST_BYTES + 1, cpu) == "host"
    agents, _ = _old_agents(config_lib.resolve({}, SYN))
    tiny = _FakeDevice({"bytes_limit": 4 * agents.nbytes - 4})
    assert is_on_host(place(agents, "auto", tiny))
    assert not is_on_host(place(agents.on_host(), "auto", gpu))
    assert is_on_host(place(agents, "host")) and not is_on_host(place(agents, "device"))


def test_build_holds_less_than_twice_the_agents_data():
    """numpy's allocations while a 20,000-agent population (41 MB) is generated, partitioned
    and stacked peak below twice the agents' arrays (1.5x; the old path: 3.2x)."""
    config = config_lib.resolve({}, [
        "data.dataset=synthetic", "data.num_agents=20000", "data.partition=\"iid\"",
        "data.dataset_options={num_train=320000,num_features=32,num_public=10,num_test=10}",
        "run.agents_on=\"host\""])
    tracemalloc.start()
    try:
        pop = population.build(config)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert pop.agents.nbytes > 40e6
    assert peak < 2 * pop.agents.nbytes, (peak, pop.agents.nbytes)


# ----------------------------------------------------------------- generated where consumed
# ``synthetic``'s ``generator = "jax"``: every record's noise is a pure function of the record,
# so a population is drawn by chunks of agents on the device (device-resident: the features
# never exist on the host) and equals the record-order stream stacked the old way.

JAX = ["data.dataset=synthetic", "data.num_agents=23", "data.dataset_options={num_train=600,"
       "num_features=6,num_public=40,num_test=50,generator=\"jax\"}"]


@pytest.mark.parametrize("extra", [
    ["data.partition=\"iid\""],
    ["data.partition=\"iid\"", "data.num_agents=24"],                  # every agent full
    ["data.partition=\"label_shards\"", "data.partition_options={classes_per_agent=3}",
     "data.validation_fraction=0.1"],
    ["data.partition=\"by_domain\"", "data.num_agents=24", "data.validation_fraction=0.2",
     "data.dataset_options={num_train=600,num_features=6,num_domains=3,generator=\"jax\"}"],
    ["data.partition=\"iid\"", "data.validation_fraction=0.1",
     "data.validation_split=\"per_agent\""],
])
def test_drawn_population_is_the_same_on_every_path(extra):
    """Device-resident (one compiled draw), host-resident (chunks drawn on the device, copied)
    and the old path (the whole record stream materialised, then gathered) give identical
    populations and validation records."""
    pops = {on: population.build(config_lib.resolve({}, JAX + extra
                                                    + [f"run.agents_on=\"{on}\""]))
            for on in ("device", "host")}
    assert not is_on_host(pops["device"].agents) and is_on_host(pops["host"].agents)
    _equal(pops["device"].agents, pops["host"].agents)
    if pops["host"].x_val is not None:
        assert np.array_equal(pops["device"].x_val, pops["host"].x_val)
    if "data.validation_split=\"per_agent\"" in extra:
        return                                   # _old_agents holds out the pooled way only
    old, x_val = _old_agents(config_lib.resolve({}, JAX + extra))
    for pop in pops.values():
        assert pop.dataset.draw is not None
        _equal(old, pop.agents)
        if x_val is not None:
            assert np.array_equal(x_val, pop.x_val)


def test_jax_generator_changes_only_the_training_noise():
    """The labels, domains, means and the public and test splits are the numpy generator's;
    the training features follow the same law (class means, unit noise), not the same values."""
    kw = dict(num_train=20000, num_public=30, num_test=40, num_features=4, num_classes=3,
              num_domains=2, seed=3)
    a = data_lib.synthetic(**kw)
    b = data_lib.synthetic(**kw, generator="jax")
    for f in ("y_train", "domain_train", "x_public", "y_public", "x_test", "y_test"):
        assert np.array_equal(getattr(a, f), getattr(b, f)), f
    assert b.x_train.dtype == np.float32 and not np.allclose(a.x_train, b.x_train)
    for c in range(3):
        for dom in range(2):
            sel = (a.y_train == c) & (a.domain_train == dom)
            np.testing.assert_allclose(b.x_train[sel].mean(0), a.x_train[sel].mean(0), atol=0.1)
    group = {(c, d): b.x_train[(b.y_train == c) & (b.domain_train == d)].mean(0)
             for c in range(3) for d in range(2)}         # each record minus its group's mean
    resid = b.x_train - np.stack([group[c, d] for c, d in zip(b.y_train, b.domain_train)])
    np.testing.assert_allclose(resid.std(0), 1.0, atol=0.05)
    with pytest.raises(ValueError, match="generator must be one of"):
        data_lib.synthetic(num_train=10, generator="torch")


def test_drawn_rows_and_subset_keep_the_records_values():
    s = data_lib.synthetic_stream(num_train=300, num_features=5, generator="jax", seed=1)
    whole = s.materialize().x_train
    assert np.array_equal(np.concatenate(list(s.blocks(7))), whole)      # any block size
    idx = np.array([299, 0, 17, 17, 150])
    assert np.array_equal(s.rows(idx), whole[idx])
    keep = np.array([3, 10, 200, 299])
    sub = s.subset(keep)
    assert np.array_equal(sub.materialize().x_train, whole[keep])
    assert np.array_equal(sub.rows(np.array([2, 0])), whole[[200, 3]])
    assert np.array_equal(sub.draw.rows(np.array([-1, 1])), np.stack([np.zeros(5), whole[10]]))


def test_device_resident_draw_never_holds_the_population_on_the_host(monkeypatch):
    """agents_on = "device" with the jax generator: the host never reads the record stream
    (patched to fail) and numpy's allocations while 20,000 agents (41 MB of features) are
    generated, partitioned and stacked peak far below the features (the record indices, labels
    and cluster ids only: ~4 MB)."""
    def no_stream(*args, **kwargs):
        raise AssertionError("the record stream was read on the host")

    monkeypatch.setattr(data_lib, "train_blocks", no_stream)
    config = config_lib.resolve({}, [
        "data.dataset=synthetic", "data.num_agents=20000", "data.partition=\"iid\"",
        "data.dataset_options={num_train=320000,num_features=32,num_public=10,num_test=10,"
        "generator=\"jax\"}", "run.agents_on=\"device\""])
    tracemalloc.start()
    try:
        pop = population.build(config)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    features = pop.agents.x.nbytes
    assert not is_on_host(pop.agents) and features > 40e6
    assert peak < features / 4, (peak, features)


def test_host_resident_draw_holds_the_features_once():
    """agents_on = "host" with the jax generator: chunks of agents are drawn on the device into
    the host rows, the only copy (numpy's peak: the agents' arrays plus ~10%)."""
    config = config_lib.resolve({}, [
        "data.dataset=synthetic", "data.num_agents=20000", "data.partition=\"iid\"",
        "data.dataset_options={num_train=320000,num_features=32,num_public=10,num_test=10,"
        "generator=\"jax\"}", "run.agents_on=\"host\""])
    tracemalloc.start()
    try:
        pop = population.build(config)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert is_on_host(pop.agents)
    assert peak < 1.25 * pop.agents.nbytes, (peak, pop.agents.nbytes)


@pytest.mark.parametrize("n,agents", [(600, 23), (600, 24), (17, 17), (100, 1)])
def test_iid_rows_equal_the_index_lists(n, agents):
    from fedjax_dp.core import record_rows
    key = rng.stream(rng.as_key(2), "partition")
    rows = data_lib.iid_rows(n, agents, key)
    want = record_rows(data_lib.iid(n, agents, key), n)
    assert np.array_equal(rows.records, want.records)
    assert np.array_equal(rows.counts, want.counts)
    y = np.arange(n) % 4
    shards = data_lib.partition_rows("label_shards", y, 4, key, classes_per_agent=2)
    want = record_rows(data_lib.partition("label_shards", y, 4, key, classes_per_agent=2), n)
    assert np.array_equal(shards.records, want.records)


def test_record_rows_checks():
    from fedjax_dp.core import record_rows
    from fedjax_dp.core.stacked import RecordRows, check_rows
    rows = record_rows([np.array([4, 1]), np.array([0])], 5)
    assert rows.records.tolist() == [[4, 1], [0, -1]] and rows.counts.tolist() == [2, 1]
    assert rows.row_of(5).tolist() == [2, 1, -1, -1, 0]
    with pytest.raises(ValueError, match="pairwise disjoint"):
        record_rows([np.array([1]), np.array([1])], 5)
    with pytest.raises(ValueError, match="no records"):
        record_rows([np.array([1]), np.array([], np.int64)], 5)
    with pytest.raises(ValueError, match=r"in \[0, 4\]"):
        check_rows(RecordRows(np.array([[5]]), np.array([1])), 5)
    with pytest.raises(ValueError, match="-1 after"):
        check_rows(RecordRows(np.array([[1, 2]]), np.array([1])), 5)


def test_runs_sharing_a_dataset_load_it_once_and_build_as_before(monkeypatch):
    """A sweep's runs that differ only in seed or non-data keys load the source once (the memo),
    build the same agents as a fresh load, and cannot write into the shared splits."""
    cfg = config_lib.load("configs/fedavg/mnist5k.toml", ["data.validation_fraction=0.1"])
    monkeypatch.setattr(population, "_SOURCE_MEMO", {})
    fresh = population.build(cfg)
    calls = []
    real = population.load_data
    monkeypatch.setattr(population, "load_data", lambda *a, **k: calls.append(1) or real(*a, **k))
    for seed in (cfg["seed"], cfg["seed"] + 1):
        again = population.build({**cfg, "seed": seed})
    assert calls == [] and len(population._SOURCE_MEMO) == 1
    _equal(population.build(cfg).agents, fresh.agents)
    assert not np.array_equal(np.asarray(again.agents.x), np.asarray(fresh.agents.x))
    shared = next(iter(population._SOURCE_MEMO.values()))
    with pytest.raises(ValueError, match="read-only"):
        shared.x_train[0] = 0
    other = copy.deepcopy(cfg)
    other["data"]["features"] = {"map": "pca", "dim": 8}
    population.build(other)
    assert calls == [1]                                   # other features: loaded again
