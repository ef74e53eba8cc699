"""Device-aware defaults (fedjax_dp.core.defaults), tested by faking the platform and memory; the
install extras for accelerators; ``fedjax-dp devices``."""
from __future__ import annotations

import ast
import concurrent.futures
import dataclasses
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import jax
import numpy as np
import pytest
from packaging.requirements import Requirement
from packaging.version import Version

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


# ----------------------------------------------------------------------------- XLA flags

TRITON = "--xla_gpu_enable_triton_gemm=false"


def test_the_triton_gemm_flag_is_set_for_a_gpu_only():
    assert dl.TRITON_GEMM_FLAG == TRITON
    assert dl.xla_flags("gpu") == TRITON
    assert dl.xla_flags("gpu", "--xla_backend_optimization_level=0") == \
        "--xla_backend_optimization_level=0 " + TRITON
    for platform in ("cpu", "tpu", "other"):
        assert dl.xla_flags(platform) == ""
        assert dl.xla_flags(platform, "--xla_dump_to=/tmp/x") == "--xla_dump_to=/tmp/x"
    # the reason, the failing check and the versions are written beside the flag
    assert "subdim_size_accumulator == dim_size (16 vs. 8)" in dl.TRITON_GEMM_REASON
    assert "jaxlib 0.11.2" in dl.TRITON_GEMM_REASON


@pytest.mark.parametrize("user", ["--xla_gpu_enable_triton_gemm=true",
                                  "--xla_gpu_enable_triton_gemm=false",
                                  "--xla_gpu_enable_triton_gemm",
                                  "--xla_foo=1 -xla_gpu_enable_triton_gemm=True --xla_bar=2"])
def test_the_users_xla_flags_win(user):
    assert dl.xla_flags("gpu", user) == user                  # kept as written, nothing added
    # a different flag whose name only starts the same is not the user's choice of this one
    assert dl.xla_flags("gpu", "--xla_gpu_enable_triton_gemm_any=true") == \
        "--xla_gpu_enable_triton_gemm_any=true " + TRITON


def test_bad_xla_flags_arguments_are_refused_naming_them():
    with pytest.raises(ValueError, match="platform must be one of"):
        dl.xla_flags("cuda")
    with pytest.raises(ValueError, match="current .* must be a string"):
        dl.xla_flags("gpu", None)


@pytest.mark.parametrize("env, plugins, configured, expected", [
    ({}, [], None, "cpu"),
    ({}, ["xla_cuda13"], None, "gpu"),
    ({}, ["xla_cuda12", "jax_cuda12_plugin"], None, "gpu"),
    ({}, ["xla_rocm7"], None, "gpu"),
    ({}, ["libtpu"], None, "tpu"),
    ({}, ["some_other_plugin"], None, "cpu"),
    ({"JAX_PLATFORMS": "cpu"}, ["xla_cuda13"], None, "cpu"),       # restricted to the CPU
    ({"JAX_PLATFORMS": "cpu,cuda"}, [], None, "gpu"),
    ({"JAX_PLATFORMS": "tpu,cpu"}, ["xla_cuda13"], None, "tpu"),
    ({"JAX_PLATFORMS": "METAL"}, [], None, "other"),
    ({"JAX_PLATFORMS": "cuda"}, [], "cpu", "cpu"),                 # jax.config wins over env
    ({"JAX_PLATFORM_NAME": "cpu"}, ["xla_cuda13"], None, "gpu"),   # a GPU backend still starts
    ({"JAX_PLATFORM_NAME": "gpu"}, [], None, "gpu"),
])
def test_the_planned_platform_is_read_without_starting_jax(env, plugins, configured, expected):
    assert dl.planned_platform(env, plugins, configured) == expected


def test_apply_sets_the_flag_before_a_backend_starts_and_never_claims_it_after():
    env = {"XLA_FLAGS": "--xla_backend_optimization_level=0"}
    state = dl.apply_xla_flags(env, platform="gpu", backend_started=lambda: False)
    assert env["XLA_FLAGS"] == "--xla_backend_optimization_level=0 " + TRITON
    assert state["xla_flags"] == env["XLA_FLAGS"] and state["backend_started_before"] is False
    assert [(f["flag"], f["status"], f["in_effect"]) for f in state["flags"]] == \
        [(TRITON, "applied", True)]
    # the user's own value: kept, reported as theirs (in effect only if it is the same value)
    env = {"XLA_FLAGS": "--xla_gpu_enable_triton_gemm=true"}
    state = dl.apply_xla_flags(env, platform="gpu", backend_started=lambda: False)
    assert env["XLA_FLAGS"] == "--xla_gpu_enable_triton_gemm=true"
    assert [(f["status"], f["in_effect"]) for f in state["flags"]] == [("user", False)]
    # a backend already started: XLA has read its flags; nothing is set, a warning says so
    env = {}
    with pytest.warns(RuntimeWarning, match="NOT in effect"):
        state = dl.apply_xla_flags(env, platform="gpu", backend_started=lambda: True)
    assert "XLA_FLAGS" not in env and state["backend_started_before"] is True
    assert [(f["status"], f["in_effect"]) for f in state["flags"]] == [("too_late", False)]
    # the CPU: nothing to do, nothing written
    env = {}
    assert dl.apply_xla_flags(env, platform="cpu", backend_started=lambda: False)["flags"] == []
    assert env == {}


def _fake_cuda_plugin(tmp_path: Path) -> Path:
    """A ``jax_plugins.xla_cuda13`` module (namespace package, as jax-cuda13-pjrt installs it)
    that registers nothing: JAX imports it and still starts only its CPU backend."""
    (tmp_path / "jax_plugins").mkdir(exist_ok=True)
    (tmp_path / "jax_plugins" / "xla_cuda13.py").write_text("def initialize():\n    pass\n")
    return tmp_path


def _python(code: str, tmp_path: Path, **env_changes) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    env["PYTHONPATH"] = os.pathsep.join([str(_fake_cuda_plugin(tmp_path)), str(ROOT)])
    env.update(env_changes)
    done = subprocess.run([sys.executable, "-W", "always", "-c", code], env=env,
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]) | {"stderr": done.stderr}


def test_importing_the_library_sets_the_flag_before_the_backend_starts(tmp_path):
    """A CUDA plugin installed (faked) and no JAX_PLATFORMS: importing the library sets the flag
    before any backend starts; XLA then starts with it (this XLA knows the flag: an unknown one
    aborts the process) and ``fedjax-dp devices --json`` says it is in effect."""
    code = ("import json, os, jax, jax.numpy as jnp\n"
            "from fedjax_dp.algorithms import api\n"            # imports the defaults module
            "from fedjax_dp.core import defaults as dl\n"
            "flags = os.environ.get('XLA_FLAGS')\n"
            "assert float(jnp.ones(3).sum()) == 3.0\n"           # the backend starts now
            "print(json.dumps({'flags': flags, 'state': dl.XLA_FLAGS_STATE, "
            "'plugins': dl.installed_plugins(), 'described': dl.describe()['xla_workarounds']}))")
    out = _python(code, tmp_path, XLA_FLAGS="--xla_backend_optimization_level=0")
    assert "xla_cuda13" in out["plugins"]
    assert out["flags"] == "--xla_backend_optimization_level=0 " + TRITON
    state = out["state"]
    assert state["platform"] == "gpu" and state["backend_started_before"] is False
    assert [(f["flag"], f["status"], f["in_effect"]) for f in state["flags"]] == \
        [(TRITON, "applied", True)]
    assert out["described"] == state
    # the same with the CPU asked for: nothing set
    out = _python(code, tmp_path, JAX_PLATFORMS="cpu")
    assert out["flags"] is None and out["state"]["platform"] == "cpu"
    assert out["state"]["flags"] == []


def test_imported_after_the_backend_started_the_flag_is_reported_not_in_effect(tmp_path):
    code = ("import json, os, jax, jax.numpy as jnp\n"
            "assert float(jnp.ones(3).sum()) == 3.0\n"           # the user computed first
            "from fedjax_dp.core import defaults as dl\n"
            "print(json.dumps({'flags': os.environ.get('XLA_FLAGS'), "
            "'state': dl.XLA_FLAGS_STATE}))")
    out = _python(code, tmp_path)
    assert out["flags"] is None                     # nothing claimed in the environment
    assert out["state"]["backend_started_before"] is True
    assert [(f["status"], f["in_effect"]) for f in out["state"]["flags"]] == \
        [("too_late", False)]
    assert "RuntimeWarning" in out["stderr"] and "NOT in effect" in out["stderr"]


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


#: the one place 64-bit mode is on: jax-privacy's BLT strategy optimisation and its Toeplitz
#: coefficients, host-side and once per strategy (jax-privacy refuses float64 BLTs otherwise), in
#: a ``with jax.enable_x64(True):`` block that restores the mode; the noise is drawn in float32
X64_SCOPED = "fedjax_dp/privacy/correlated_noise.py"


def test_nothing_compiled_runs_in_float64():
    sources = "\n".join(p.read_text() for p in (ROOT / "fedjax_dp").rglob("*.py")
                        if str(p.relative_to(ROOT)) != X64_SCOPED)
    scoped = (ROOT / X64_SCOPED).read_text()
    assert re.findall(r"enable_x64\([^)]*\)", scoped) == \
        ["enable_x64(True)"] * len(re.findall(r"with jax\.enable_x64\(True\):", scoped))
    assert not re.search(r"update\(\s*['\"]jax_enable_x64|JAX_ENABLE_X64", scoped)
    # nothing turns 64-bit mode on (config update, environment, experimental context) ...
    assert not re.search(r"update\(\s*['\"]jax_enable_x64|JAX_ENABLE_X64|enable_x64\(", sources)
    # ... and no jnp array is asked for in 64 bits (NumPy float64 on the host is accounting)
    assert not re.search(r"jnp\.float64|jnp\.complex128|dtype=['\"]float64['\"]", sources)
    assert not jax.config.jax_enable_x64                   # after importing the whole package


# ----------------------------------------------------------------------------- install extras

def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


#: the accelerator extras and the lowest jax each needs beyond the jax dependency's own bound
#: (cuda13: 0.7.2, the first jax release with jax-cuda13-plugin wheels)
EXTRAS = {"cuda12": None, "cuda13": "0.7.2", "tpu": None}


def test_accelerator_extras_name_jax_builds_with_the_jax_bounds():
    project = _pyproject()["project"]
    base = [Requirement(r) for r in project["dependencies"]]
    jax_spec = next(r.specifier for r in base if r.name == "jax")
    assert str(jax_spec) == str(next(r.specifier for r in base if r.name == "jaxlib"))
    provided = set(importlib.metadata.metadata("jax").get_all("Provides-Extra"))
    assert set(EXTRAS) <= set(project["optional-dependencies"])
    for extra, floor in EXTRAS.items():
        reqs = [Requirement(r) for r in project["optional-dependencies"][extra]]
        assert [(r.name, r.extras) for r in reqs] == [("jax", {extra})], extra
        assert str(reqs[0].specifier) == (f">={floor}" if floor else str(jax_spec)), extra
        if floor is None or Version(jax.__version__) >= Version(floor):
            assert extra in provided                  # the installed jax offers that extra
        else:                                         # an older jax (the lowest supported)
            assert extra not in provided


@pytest.mark.sweep
@pytest.mark.parametrize("extra, needs", [("cuda12", "jax-cuda12-plugin"),
                                          ("cuda13", "jax-cuda13-plugin"), ("tpu", "libtpu")])
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
    # the tests run with JAX_PLATFORMS=cpu: no workaround flag, decided before any backend
    assert info["xla_workarounds"] == {"platform": "cpu", "xla_flags": os.environ.get(
        "XLA_FLAGS", ""), "backend_started_before": False, "flags": []}
    assert cli.main(["devices"]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"jax {jax.__version__}: platform cpu") and "knn_method = " in text
    assert "XLA flags for platform cpu (decided at import, before any backend started)" in text
