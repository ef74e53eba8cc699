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
from fedjax_dp.core.stacked import AUTO_HOST_BYTES
from fedjax_dp.experiments import config as config_lib
from fedjax_dp.experiments import population, runner

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
