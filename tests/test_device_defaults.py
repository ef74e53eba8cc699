"""Device-aware defaults (fedjax_dp.core.defaults), tested by faking the platform and memory; the
install extras for accelerators; ``fedjax-dp devices``."""
from __future__ import annotations

import ast
import concurrent.futures
import dataclasses
import importlib.metadata
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import jax
import numpy as np
import pytest
from packaging.requirements import Requirement

from fedjax_dp.algorithms.fedkt import learners
from fedjax_dp.algorithms.voting import knn_dpfl
from fedjax_dp.core import agent_stream, auto_chunk_size, auto_placement, defaults as dl
from fedjax_dp.experiments import cli

ROOT = Path(__file__).resolve().parents[1]
GiB = 2 ** 30
MiB = 2 ** 20
SMALL, LARGE = 2 * GiB, 80 * GiB          # a 2 GiB and an 80 GiB accelerator


# ----------------------------------------------------------------------------- the decisions

@pytest.mark.parametrize("platform", ["cpu", "gpu", "tpu"])
@pytest.mark.parametrize("memory", [None, SMALL, LARGE])
def test_each_choice_per_platform_and_memory(platform, memory):
    d = dl.defaults(platform, memory)
    assert (d.platform, d.device_memory, d.accelerator) == (platform, memory, platform != "cpu")
    # never float64 in compiled code, float64 accounting on the host, on every platform
    assert (d.compute_dtype, d.accounting_dtype) == ("float32", "float64")
    assert d.prefetch and d.prefetch_threads == 1
    # placement: a quarter of the reported memory, else 64 MiB
    assert d.placement_host_bytes == (memory // 4 if memory else 64 * MiB)
    if platform == "cpu":
        assert (d.chunk_budget_bytes, d.min_chunks) == (8 * MiB, 4)
        assert (d.seed_axis, d.knn_method) == ("map", "threshold")
    else:
        assert d.knn_method == "top_k" and d.min_chunks == 1
        assert d.chunk_budget_bytes == (memory // 4 if memory else None)
        assert d.seed_axis == ("map" if memory == SMALL else "vmap")


def test_bad_platform_or_memory_is_refused_naming_it():
    with pytest.raises(ValueError, match="platform must be one of"):
        dl.defaults("cuda")
    with pytest.raises(ValueError, match="device_memory must be"):
        dl.defaults("gpu", 0)


def test_this_machine_is_read_and_the_cpu_defaults_are_todays():
    platform, memory = dl.read_device()
    assert platform == jax.default_backend() == "cpu" and memory is None
    assert dl.defaults() == dl.defaults("cpu", None)


def test_chunk_sizes_follow_the_device():
    cpu, small, large = dl.defaults("cpu"), dl.defaults("gpu", SMALL), dl.defaults("tpu", LARGE)
    # CPU: 8 MiB / 1 MiB per agent = 8 agents a chunk; < 4 chunks: none
    assert auto_chunk_size(MiB, 1000, platform_defaults=cpu) == 8
    assert auto_chunk_size(MiB, 20, platform_defaults=cpu) is None
    # accelerators: chunks only beyond a quarter of the device memory (512 MiB / 20 GiB)
    assert auto_chunk_size(MiB, 1000, platform_defaults=small) == 512
    assert auto_chunk_size(MiB, 512, platform_defaults=small) is None
    assert auto_chunk_size(MiB, 1000, platform_defaults=large) is None
    assert auto_chunk_size(MiB, 100_000, platform_defaults=large) == 20 * 1024
    assert auto_chunk_size(MiB, 10 ** 7, platform_defaults=dl.defaults("gpu")) is None


class _Device:
    def __init__(self, platform, stats):
        self.platform, self.stats = platform, stats

    def memory_stats(self):
        if isinstance(self.stats, Exception):
            raise self.stats
        return self.stats


def test_placement_and_device_reading_of_fake_devices():
    gpu = _Device("gpu", {"bytes_limit": 16 * GiB, "bytes_in_use": 5})
    assert dl.read_device(gpu) == ("gpu", 16 * GiB)
    assert dl.read_device(_Device("cuda", None)) == ("gpu", None)         # plugins: "gpu"
    assert dl.read_device(_Device("cpu", NotImplementedError())) == ("cpu", None)
    assert dl.defaults(device=gpu) == dl.defaults("gpu", 16 * GiB)
    assert auto_placement(4 * GiB, gpu) == "device" and auto_placement(4 * GiB + 1, gpu) == "host"
    cpu = _Device("cpu", None)
    assert auto_placement(64 * MiB, cpu) == "device" and auto_placement(64 * MiB + 1, cpu) == "host"


def test_every_user_of_a_default_follows_the_one_function(monkeypatch):
    """Faking the device in ``defaults`` alone switches every decision that reads it."""
    assert (knn_dpfl.resolve_method("auto"), learners.resolve_seed_axis("auto")) == \
        ("threshold", "map")
    assert knn_dpfl.Config().knn_method == "auto"
    real = dl.defaults
    monkeypatch.setattr(dl, "defaults", lambda *a, **k: real("gpu", LARGE) if not a and not k
                        else real(*a, **k))
    assert knn_dpfl.resolve_method("auto") == "top_k"
    assert knn_dpfl.resolve_method("threshold") == "threshold"            # explicit: kept
    assert learners.resolve_seed_axis("auto") == "vmap"
    assert auto_chunk_size(MiB, 1000) is None                            # fits 20 GiB


def test_prefetching_follows_the_one_function(monkeypatch):
    pools = []

    class Pool(concurrent.futures.ThreadPoolExecutor):
        def __init__(self, *args, **kwargs):
            pools.append(args or kwargs)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(concurrent.futures, "ThreadPoolExecutor", Pool)
    host = (np.arange(12.0).reshape(6, 2),)
    assert agent_stream.PREFETCH is None                                  # the device decides
    assert [c.num_real for c in agent_stream.chunks(host, 4)] == [4, 2] and len(pools) == 1
    real = dl.defaults
    monkeypatch.setattr(dl, "defaults", lambda *a, **k: dataclasses.replace(real(),
                                                                             prefetch=False))
    assert [c.num_real for c in agent_stream.chunks(host, 4)] == [4, 2] and len(pools) == 1


# ----------------------------------------------------------------------------- one reader

READ_ATTRS = ("default_backend", "platform", "memory_stats")


def _platform_reads(source: str) -> list[int]:
    """Line numbers where code (not a docstring or comment) reads the platform or a device's
    memory: ``*.default_backend``, ``*.platform``, ``*.memory_stats`` (the defaults module's own
    ``defaults_lib.memory_stats`` excepted)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in READ_ATTRS:
            if isinstance(node.value, ast.Name) and node.value.id == "defaults_lib":
                continue
            lines.append(node.lineno)
    return lines


def test_only_the_defaults_module_reads_the_platform():
    package = ROOT / "fedjax_dp"
    found = {str(p.relative_to(ROOT)): _platform_reads(p.read_text())
             for p in package.rglob("*.py") if p.name != "defaults.py" or p.parent.name != "core"}
    found = {k: v for k, v in found.items() if v}
    assert not found, f"read the platform outside fedjax_dp/core/defaults.py: {found}"
    # the check can fail
    assert _platform_reads("import jax\nx = jax.devices()[0].platform\n") == [2]
    assert _platform_reads("b = jax.default_backend()\ns = d.memory_stats()\n") == [1, 2]
    assert _platform_reads("import platform\nv = platform.python_version()\n") == []


def test_nothing_compiled_runs_in_float64():
    sources = "\n".join(p.read_text() for p in (ROOT / "fedjax_dp").rglob("*.py"))
    # nothing turns 64-bit mode on (config update, environment, experimental context) ...
    assert not re.search(r"update\(\s*['\"]jax_enable_x64|JAX_ENABLE_X64|enable_x64\(", sources)
    # ... and no jnp array is asked for in 64 bits (NumPy float64 on the host is accounting)
    assert not re.search(r"jnp\.float64|jnp\.complex128|dtype=['\"]float64['\"]", sources)
    assert not jax.config.jax_enable_x64                   # after importing the whole package


# ----------------------------------------------------------------------------- install extras

def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_accelerator_extras_name_jax_builds_with_the_jax_bounds():
    project = _pyproject()["project"]
    base = [Requirement(r) for r in project["dependencies"]]
    jax_spec = next(r.specifier for r in base if r.name == "jax")
    provided = set(importlib.metadata.metadata("jax").get_all("Provides-Extra"))
    for extra in ("cuda12", "tpu"):
        reqs = [Requirement(r) for r in project["optional-dependencies"][extra]]
        assert [(r.name, r.extras) for r in reqs] == [("jax", {extra})], extra
        assert reqs[0].specifier == jax_spec
        assert extra in provided                      # the installed jax offers that extra


@pytest.mark.sweep
@pytest.mark.parametrize("extra, needs", [("cuda12", "jax-cuda12-plugin"), ("tpu", "libtpu")])
def test_accelerator_extras_resolve_with_pip_dry_run(extra, needs, tmp_path):
    """``pip install --dry-run -e '.[EXTRA]'`` (needs the package index; ~10-50 s)."""
    report = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet",
                           "--report", str(report), "-e", f".[{extra}]"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    if done.returncode and re.search(r"connection|resolve host|network|No matching distri",
                                     done.stderr, re.I):
        pytest.skip(f"package index not reachable: {done.stderr.strip()[-200:]}")
    assert done.returncode == 0, done.stderr
    names = {i["metadata"]["name"] for i in json.loads(report.read_text())["install"]}
    assert needs in names, sorted(names)


# ----------------------------------------------------------------------------- device check

def test_devices_command_prints_the_platform_devices_and_defaults(capsys):
    assert cli.main(["devices", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["platform"] == "cpu" and info["jax"] == jax.__version__
    assert [d["repr"] for d in info["devices"]] == [str(d) for d in jax.devices()]
    assert info["defaults"] == dl.defaults().as_dict()
    assert cli.main(["devices"]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"jax {jax.__version__}: platform cpu") and "knn_method = " in text
