"""Experiment configs: TOML files, dotted ``--set`` overrides, validation before any work.

A config has these tables (see ``configs/``)::

    seed = 0
    [data]       dataset, dataset_options, partition, partition_options, num_agents,
                 server_dataset, server_dataset_options, image_size (cross-domain runs),
                 validation_fraction (training records held out for val_accuracy)
    [model]      name, hidden
    [train]      local training: steps, batch_size, learning_rate, optimizer, weight_decay,
                 prox_mu, batching ("replacement": uniform draws; "stored": stored order)
    [algorithm]  name and the algorithm's own fields (rounds, sampling_rate, clip_norm, ...)
    [privacy]    delta, accountants
    [run]        eval_every, chunk_size, progress, agents_on ("device" | "host": where the
                 agents' records live; "host" copies only each round's cohort / chunk over),
                 checkpoint_every (rounds between checkpoints of a round-based run; 0: none)

Unknown keys are errors that name the key, so a typo never silently falls back to a default.
"""
from __future__ import annotations

import copy
import dataclasses
import tomllib
from pathlib import Path
from typing import Any

from fedjax_dp.core import validation

DEFAULTS: dict[str, Any] = {
    "seed": 0,
    "data": {"dataset": "mnist5k", "dataset_options": {}, "partition": "iid",
             "partition_options": {}, "num_agents": 10,
             # cross-domain: the server's public/test splits from another dataset (""= same),
             # and a common image size (0 = keep) applied to every split of both datasets
             "server_dataset": "", "server_dataset_options": {}, "image_size": 0,
             # a held-out fraction of the training split (before partitioning) on which the
             # final model is also evaluated (val_accuracy): for choosing hyper-parameters
             # without looking at the test set (fedjax-dp sweep --select val_accuracy)
             "validation_fraction": 0.0},
    "model": {"name": "mlp", "hidden": [200]},
    "train": {"steps": 50, "batch_size": 32, "learning_rate": 0.1, "optimizer": "sgd",
              "weight_decay": 0.0, "prox_mu": 0.0, "batching": "replacement"},
    "algorithm": {"name": "fedavg"},
    "privacy": {"delta": 1e-5, "accountants": ["rdp", "pld"]},
    "run": {"eval_every": 0, "chunk_size": "auto", "progress": True, "agents_on": "device",
            "checkpoint_every": 10},
}

# Tables whose keys are free-form (passed through to a dataset, partitioner or algorithm).
_OPEN_TABLES = {("data", "dataset_options"), ("data", "partition_options"), ("algorithm",),
                ("data", "server_dataset_options")}


class ConfigError(ValueError):
    """An invalid config: the message names the offending key."""


def parse_value(text: str) -> Any:
    """A ``--set`` value as TOML (numbers, booleans, arrays, quoted strings), else a bare string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_override(config: dict, assignment: str) -> None:
    """Apply ``key.sub=value`` to ``config`` in place."""
    if "=" not in assignment:
        raise ConfigError(f"--set expects key=value, got {assignment!r}")
    path, text = assignment.split("=", 1)
    keys = path.strip().split(".")
    if not all(keys):
        raise ConfigError(f"--set key {path!r} is not a dotted key like algorithm.rounds")
    node = config
    for k in keys[:-1]:
        child = node.setdefault(k, {})
        if not isinstance(child, dict):
            raise ConfigError(f"--set {path}: {k!r} is a value, not a table")
        node = child
    node[keys[-1]] = parse_value(text.strip())


def _merge(base: dict, update: dict, where: tuple[str, ...] = ()) -> dict:
    out = copy.deepcopy(base)
    is_open = where in _OPEN_TABLES
    for k, v in update.items():
        path = where + (k,)
        if not is_open and k not in base:
            raise ConfigError(f"unknown config key {'.'.join(path)!r}; allowed here: "
                              f"{sorted(base)}")
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v, path)
        else:
            out[k] = copy.deepcopy(v)
    return out


def resolve(raw: dict, overrides: list[str] | tuple[str, ...] = ()) -> dict:
    """Defaults <- file <- overrides, with unknown keys rejected."""
    config = copy.deepcopy(raw)
    for assignment in overrides:
        apply_override(config, assignment)
    resolved = _merge(DEFAULTS, config)
    validation.check_int("seed", resolved["seed"], minimum=0)
    validation.check_open_unit("privacy.delta", resolved["privacy"]["delta"])
    for acc in resolved["privacy"]["accountants"]:
        validation.check_choice("privacy.accountants[]", acc, ("rdp", "pld"))
    validation.check_int("data.num_agents", resolved["data"]["num_agents"], minimum=1)
    validation.check_int("data.image_size", resolved["data"]["image_size"], minimum=0)
    vf = resolved["data"]["validation_fraction"]
    if isinstance(vf, bool) or not isinstance(vf, (int, float)) or not 0 <= vf < 1:
        raise ConfigError(f"data.validation_fraction must be in [0, 1), got {vf!r}")
    if not isinstance(resolved["data"]["server_dataset"], str):
        raise ConfigError(f"data.server_dataset must be a dataset name or \"\" (the agents' "
                          f"dataset), got {resolved['data']['server_dataset']!r}")
    validation.check_int("run.eval_every", resolved["run"]["eval_every"], minimum=0)
    validation.check_int("run.checkpoint_every", resolved["run"]["checkpoint_every"], minimum=0)
    if not isinstance(resolved["run"]["progress"], bool):
        raise ConfigError(f"run.progress must be true or false, got "
                          f"{resolved['run']['progress']!r}")
    validation.check_choice("run.agents_on", resolved["run"]["agents_on"], ("device", "host"))
    if resolved["run"]["chunk_size"] != "auto":   # "auto" (cache-sized), 0 (none) or agents/chunk
        validation.check_int("run.chunk_size", resolved["run"]["chunk_size"], minimum=0)
    return resolved


def load(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> dict:
    """Read a TOML config file and resolve it."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {str(path)!r} is not valid TOML: {e}") from None
    return resolve(raw, overrides)


def build_dataclass(cls, table: dict, prefix: str, **extra):
    """Instantiate a config dataclass from a table, naming unknown fields (validation runs in it)."""
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(table) - fields)
    if unknown:
        raise ConfigError(f"unknown key(s) {[f'{prefix}.{k}' for k in unknown]}; "
                          f"{prefix} accepts {sorted(fields - set(extra))}")
    try:
        return cls(**table, **extra)
    except TypeError as e:
        raise ConfigError(f"{prefix}: {e}") from None
