"""The shipped configs: ``configs/`` of a checkout, ``fedjax_dp/configs/`` inside the wheel.

A config is named by its path under that folder without ``.toml`` (``dp_fedavg/mnist5k``,
``experiments/fedkt_table1``). ``fedjax-dp run`` / ``sweep`` take a file path or a name: a file
that exists always wins; otherwise ``NAME``, ``NAME.toml``, ``configs/NAME`` and
``configs/NAME.toml`` (the README's paths) name the shipped config, read from the package, and
a sweep file's ``sweep.configs`` resolve beside it there. Configs are data: every read goes
through :func:`fedjax_dp.experiments.config.read_toml`.
"""
from __future__ import annotations

import difflib
import hashlib
from pathlib import Path

import fedjax_dp
from fedjax_dp.experiments.config import ConfigError, read_toml

_PACKAGE = Path(fedjax_dp.__file__).resolve().parent


def root() -> Path:
    """The folder of the shipped configs: ``fedjax_dp/configs`` (an installed wheel) or the
    checkout's ``configs/`` beside the package (a source tree, ``pip install -e .``)."""
    for folder in (_PACKAGE / "configs", _PACKAGE.parent / "configs"):
        if folder.is_dir():
            return folder
    raise ConfigError(f"no shipped configs: neither {_PACKAGE / 'configs'} nor "
                      f"{_PACKAGE.parent / 'configs'} exists (a broken install?)")


def names() -> list[str]:
    """Every shipped config's name, sorted (``dp_fedavg/mnist5k``, ``experiments/...``)."""
    base = root()
    return sorted(p.relative_to(base).with_suffix("").as_posix() for p in base.rglob("*.toml")
                  if p.is_file())


def path_of(name: str) -> Path | None:
    """The shipped file a name (with or without ``.toml`` / a leading ``configs/``) names."""
    key = name.strip().replace("\\", "/")
    key = key[len("configs/"):] if key.startswith("configs/") else key
    key = key[:-len(".toml")] if key.endswith(".toml") else key
    if not key or key.startswith("/") or ".." in key.split("/"):
        return None
    path = root() / f"{key}.toml"
    return path if path.is_file() else None


def unknown(name: str) -> ConfigError:
    """The one-line error for a name that is neither a file nor a shipped config."""
    known = names()
    key = str(name).replace("\\", "/").removeprefix("configs/").removesuffix(".toml")
    close = difflib.get_close_matches(key, known, n=5, cutoff=0.5)
    if not close:            # a stem alone (mnist5k) matches the names that end in it
        close = [n for n in known if n.rsplit("/", 1)[-1] == key.rsplit("/", 1)[-1]][:5]
    hint = f"close matches: {', '.join(close)}" if close else "fedjax-dp configs list names them"
    return ConfigError(f"config {str(name)!r} does not exist: neither a file nor a shipped "
                       f"config; {hint}")


def resolve(arg: str | Path) -> tuple[Path, dict]:
    """``(path, source)`` for a config argument: the file when it exists, else the shipped
    config it names, else a one-line :class:`ConfigError` with close matches. ``source`` is
    what result.json records as ``config_source``: ``{"kind": "file" | "shipped", "path",
    "name" (shipped), "sha256"}``."""
    given = Path(arg)
    if given.is_file():
        return given, {"kind": "file", "path": str(given.resolve()), "sha256": _sha256(given)}
    path = path_of(str(arg))
    if path is None:
        raise unknown(str(arg))
    name = path.relative_to(root()).with_suffix("").as_posix()
    return path, {"kind": "shipped", "name": name, "path": str(path),
                  "version": fedjax_dp.version(), "sha256": _sha256(path)}


def _sha256(path: Path) -> str:
    from fedjax_dp.core import files
    from fedjax_dp.experiments.config import MAX_CONFIG_BYTES
    return hashlib.sha256(files.read_bytes(path, max_bytes=MAX_CONFIG_BYTES, root="/",
                                           what="config file")).hexdigest()


def describe(name: str) -> dict:
    """``{"name", "kind": "run" | "sweep" | "selftest", "description"}``: kind from the file's
    tables, the description its first comment line."""
    path = path_of(name)
    if path is None:
        raise unknown(name)
    table = read_toml(path)
    kind = "sweep" if "sweep" in table else "selftest" if "case" in table else "run"
    first = ""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            first = line.lstrip("#").strip()
            if first:
                break
        elif line.strip():
            break
    return {"name": name, "kind": kind, "description": first}


def sweep_bases(path: Path, seen: set[Path] | None = None) -> list[Path]:
    """The files a sweep file's ``sweep.configs`` name, beside it (and theirs), in order."""
    seen = set() if seen is None else seen
    out = []
    table = read_toml(path).get("sweep") or {}
    for rel in table.get("configs", []) if isinstance(table, dict) else []:
        sub = (path.parent / str(rel)).resolve()
        if sub in seen or not sub.is_file():
            continue
        seen.add(sub)
        out += [sub, *sweep_bases(sub, seen)]
    return out


def copy(name: str, dest: str | Path = "configs") -> list[Path]:
    """Copy shipped config ``name`` to ``dest/<name>.toml`` (with a sweep file, the configs
    its ``sweep.configs`` name, at the same places relative to it, so it runs as it is);
    refuses to overwrite a file. Returns the files written."""
    from fedjax_dp.core import files
    from fedjax_dp.experiments.config import MAX_CONFIG_BYTES
    path = path_of(name)
    if path is None:
        raise unknown(name)
    base, dest = root().resolve(), Path(dest)
    if dest.exists() and not dest.is_dir():
        raise ConfigError(f"DEST {str(dest)!r} is a file: give a folder (default ./configs)")
    todo = []
    for src in [path.resolve(), *sweep_bases(path)]:
        if not src.is_relative_to(base):
            raise ConfigError(f"{name!r} names {src}, outside the shipped configs")
        target = dest / src.relative_to(base)
        if target.exists():
            raise ConfigError(f"{str(target)!r} exists; not overwritten (give another DEST)")
        todo.append((src, target))
    written = []
    for src, target in todo:
        target.parent.mkdir(parents=True, exist_ok=True)
        data = files.read_bytes(src, max_bytes=MAX_CONFIG_BYTES, root="/", what="config file")
        files.write_text(target, data.decode("utf-8"))
        written.append(target)
    return written
