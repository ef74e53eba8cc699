"""The release steps of docs/getting_started.md, run as a user outside the source tree would
(issue 50): build the sdist and the wheel, ``twine check`` them, install the wheel into a fresh
virtual environment outside the checkout, and from an empty folder run the README's main job by
name, a copied config, ``fedjax-dp --version`` and ``python -m fedjax_dp``.

Nothing downloads: the build is ``python -m build --no-isolation`` with this environment's
setuptools (the test extras), the wheel goes in with ``--no-deps`` and the fresh environment
reads its dependencies from this one's site-packages through a ``.pth`` file (whose own
``.pth`` files, this checkout's editable install among them, are not processed there). One
test, so that ``-n 2`` builds once.
"""
from __future__ import annotations

import importlib.util
import json
import os
import site
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: the README's main job, small: 2 rounds of 2 local steps, no evaluation between rounds, epsilon
#: by RDP only (PLD is host work of seconds per run, tested elsewhere)
SMALL = ["--set", "algorithm.rounds=2", "--set", "train.steps=2", "--set", "run.eval_every=0",
         "--set", 'privacy.accountants=["rdp"]', "--quiet"]


#: the subprocesses' environment: no PYTHONPATH (a checkout on it would shadow the install)
CLEAN = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def _sh(argv, cwd, env=None, timeout=240) -> subprocess.CompletedProcess:
    r = subprocess.run([str(a) for a in argv], cwd=cwd, env=CLEAN if env is None else env,
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, (argv, r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    return r


@pytest.mark.slow
def test_release_steps_and_a_wheel_install_outside_the_tree(tmp_path):
    assert importlib.util.find_spec("build") and importlib.util.find_spec("twine"), \
        "build and twine are test extras: pip install -e '.[test]'"
    assert not tmp_path.resolve().is_relative_to(ROOT)
    dist = tmp_path / "dist"
    _sh([sys.executable, "-m", "build", "--no-isolation", "--outdir", dist, ROOT], cwd=tmp_path,
        timeout=180)
    wheel, = dist.glob("fedjax_dp-*.whl")
    sdist, = dist.glob("fedjax_dp-*.tar.gz")
    _sh([sys.executable, "-m", "twine", "check", "--strict", wheel, sdist], cwd=tmp_path)

    # what the wheel and the sdist hold: LICENSE and every shipped config
    shipped = sorted(p.relative_to(ROOT / "configs").as_posix()
                     for p in (ROOT / "configs").rglob("*.toml"))
    assert len(shipped) > 100
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [c for c in shipped if f"fedjax_dp/configs/{c}" not in names]
    assert not missing, missing
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), sorted(names)[:5]
    assert "fedjax_dp/__main__.py" in names
    with tarfile.open(sdist) as tar:
        members = {m.split("/", 1)[1] for m in tar.getnames() if "/" in m}
    assert {"LICENSE", "CHANGELOG.md", "CITATION.cff", "setup.py"} <= members
    assert {f"notebooks/{p.name}" for p in (ROOT / "notebooks").glob("*.ipynb")} <= members
    assert all(f"configs/{c}" in members for c in shipped)

    # a fresh environment outside the tree, its dependencies this one's (nothing downloads)
    venv = tmp_path / "venv"
    _sh([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp_path)
    py = venv / "bin" / "python"
    _sh([sys.executable, "-m", "pip", "--python", py, "install", "--no-deps", "--no-index",
         "--no-compile", "--quiet", wheel], cwd=tmp_path)
    purelib = Path(_sh([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                       cwd=tmp_path).stdout.strip())
    (purelib / "test_venv_dependencies.pth").write_text(
        "\n".join(site.getsitepackages()) + "\n")
    env = dict(CLEAN)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    empty = tmp_path / "empty"
    empty.mkdir()
    fedjax_dp = venv / "bin" / "fedjax-dp"

    # the README's main job by name, from the empty folder (before the copy below, which runs
    # the same shapes: its programs come from the session's persistent compilation cache)
    _sh([fedjax_dp, "run", "dp_fedavg/mnist5k", *SMALL, "--out", "by_name"], cwd=empty, env=env)
    result = json.loads((empty / "by_name" / "result.json").read_text())
    assert result["config_source"]["kind"] == "shipped"
    assert result["config_source"]["name"] == "dp_fedavg/mnist5k"
    assert Path(result["config_source"]["path"]).is_relative_to(venv)
    assert result["config"]["algorithm"]["rounds"] == 2 and result["num_agents"] == 100
    assert result["seed"] == 0
    import fedjax_dp as here
    assert result["versions"]["fedjax-dp"] == here.__version__
    assert result["versions"]["jax-privacy"] != "not installed"

    _outside_the_tree(py, fedjax_dp, venv, empty, env, shipped)
    assert sorted(p.name for p in empty.iterdir()) == ["by_name", "configs", "copy"]


def _outside_the_tree(py: Path, fedjax_dp: Path, venv: Path, empty: Path, env: dict,
                      shipped: list[str]) -> None:
    """The wheel's package, its version, its configs; then a copy a user edits (its seed) and
    runs (the file path wins over the shipped name)."""
    where = _sh([py, "-c", "import fedjax_dp; print(fedjax_dp.__file__)"], cwd=empty, env=env)
    assert Path(where.stdout.strip()).is_relative_to(venv), where.stdout   # the wheel's copy
    import fedjax_dp as here
    version = f"fedjax-dp {here.__version__}"
    assert _sh([fedjax_dp, "--version"], cwd=empty, env=env).stdout.strip() == version
    assert _sh([py, "-m", "fedjax_dp", "--version"], cwd=empty, env=env).stdout.strip() == version
    listing = json.loads(_sh([fedjax_dp, "configs", "list", "--json"], cwd=empty, env=env).stdout)
    assert sorted(f"{r['name']}.toml" for r in listing["configs"]) == shipped
    assert Path(listing["root"]).is_relative_to(venv)
    copied = _sh([fedjax_dp, "configs", "copy", "dp_fedavg/mnist5k"], cwd=empty, env=env)
    path = empty / "configs" / "dp_fedavg" / "mnist5k.toml"
    assert copied.stdout.split() == ["configs/dp_fedavg/mnist5k.toml"] and path.is_file()
    text = path.read_text()
    assert "\nseed = 0\n" in text
    path.write_text(text.replace("\nseed = 0\n", "\nseed = 1\n"))     # the same shapes
    _sh([fedjax_dp, "run", "configs/dp_fedavg/mnist5k.toml", *SMALL, "--out", "copy"],
        cwd=empty, env=env)
    result = json.loads((empty / "copy" / "result.json").read_text())
    assert result["config_source"]["kind"] == "file" and result["seed"] == 1
    assert Path(result["config_source"]["path"]) == path.resolve()


def test_versions_list_every_library_that_can_change_a_result():
    """result.json's ``versions``: Python, this package and each library below (``not
    installed`` when absent); JAX's accelerator plugins only when installed."""
    import importlib.metadata

    from fedjax_dp.experiments import runner
    v = runner.versions()
    for name in ("python", "fedjax-dp", "jax", "jaxlib", "flax", "optax", "chex", "numpy",
                 "scipy", "dp-accounting", "jax-privacy", "scikit-learn", "ml-dtypes"):
        assert v[name] and v[name] != "not installed", name
    assert v["jax-privacy"] == importlib.metadata.version("jax-privacy")
    for plugin in ("jax-cuda12-plugin", "jax-cuda13-plugin", "libtpu"):
        try:
            installed = importlib.metadata.version(plugin)
        except importlib.metadata.PackageNotFoundError:
            installed = None
        assert v.get(plugin) == installed, plugin
    assert "orbax-checkpoint" not in v            # no longer a dependency
