"""Experiment configs: TOML files, dotted ``--set`` overrides, validation before any work.

A config has the tables of :data:`DEFAULTS`: ``seed``, ``[data]``, ``[model]``, ``[train]``
(local training), ``[algorithm]`` (``name`` and the algorithm's own fields), ``[privacy]`` and
``[run]``; each key is listed there with its default and meaning (docs/runs.md; examples in
``configs/``).

Unknown keys are errors that name the key, so a typo never silently falls back to a default."""
from __future__ import annotations

import copy
import tomllib
from pathlib import Path
from typing import Any

from fedjax_dp.core import validation
from fedjax_dp.core.validation import ConfigError

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
             "validation_fraction": 0.0,
             # where the hold-out comes from: "pooled" (the whole training split, before
             # partitioning) or "per_agent" (max(1, round(f n_i)) of agent i's n_i records), and
             # its seed (-1: the run's; s >= 0: the same hold-out for every run)
             "validation_split": "pooled", "validation_seed": -1,
             # frozen features: {} (the raw features) or {map = "pca" | "random_projection" |
             # "identity", dim = m, seed = s}: a fixed map fitted on the PUBLIC split only,
             # applied to every split before training (fedjax_dp.data.features)
             "features": {}},
    # options: the model's size options (fedjax_dp.models.MODEL_OPTIONS, e.g. {hidden = 6,
    # embed_dim = 3} for char_lstm; {} = the literature's sizes)
    "model": {"name": "mlp", "hidden": [200], "options": {}},
    # batching: "replacement" (uniform draws) or "stored" (the records' stored order);
    # optimizer: a name with learning_rate ("sgd", "momentum", "adam", any optax name) or a
    # table {name = "adamw", learning_rate = 1e-3, weight_decay = 1e-4} (docs/optimizers.md)
    "train": {"steps": 50, "batch_size": 32, "learning_rate": 0.1, "optimizer": "sgd",
              "weight_decay": 0.0, "prox_mu": 0.0, "batching": "replacement"},
    "algorithm": {"name": "fedavg"},
    # allow_large_delta: report a guarantee at a delta >= 1/N of the units it protects, which
    # permits releasing one whole unit's data (refused without it: fedjax_dp.privacy.delta_bound)
    "privacy": {"delta": 1e-5, "accountants": ["rdp", "pld"], "allow_large_delta": False},
    # agents_on: where the agents' records live, "device", "host" (only each round's cohort /
    # chunk is copied over) or "auto" (host when large, fedjax_dp.core.auto_placement);
    # checkpoint_every: rounds between checkpoints of a round-based run (0: none)
    "run": {"eval_every": 0, "chunk_size": "auto", "progress": True, "agents_on": "auto",
            "checkpoint_every": 10,
            # rounds run per compiled call of the round engine (algorithms/rounds.py):
            # "auto" (each call sized to ~0.5 s from the calls' measured time) or k >= 1
            "rounds_per_call": "auto",
            # a loss or the parameters become NaN / inf: "stop" (one line, what was written
            # kept) or "continue" (finish, the result marked non_finite)
            "on_nonfinite": "stop",
            # JAX's persistent compilation cache of the command line: "user" (a user-level
            # folder, core/compilation.py), "off", or a folder
            "compilation_cache": "user",
            # experiment tracking (experiments/tracking.py): [] (none), "tensorboard", "wandb"
            # and the W&B project; the epsilon spent so far is logged every log_epsilon_every
            # rounds and at the last (0: never)
            "log": [], "wandb_project": "fedjax-dp", "log_epsilon_every": 1,
            # several processes (docs/scale.md#several-hosts-from-the-command-line): the mesh
            # the agents are split over, "auto" (every device of every process when the run
            # has several processes; none otherwise), "all" (every device, also of one
            # process) or "none"; distributed = {coordinator = "HOST:PORT", num_processes = N,
            # process_id = I, timeout_s = 60} joins a job as the command-line flags do
            "mesh": "auto", "distributed": {}},
}

#: the backends ``run.log`` may name (:mod:`fedjax_dp.experiments.tracking`)
LOG_BACKENDS = ("tensorboard", "wandb")

#: ``data.validation_split`` values: the hold-out from the whole training split before
#: partitioning, or from every agent's own records after it (data/population.py)
VALIDATION_SPLITS = ("pooled", "per_agent")

#: keys added after runs were stored, left out of a resolved config while at their default so
#: that its fingerprint (experiments/checkpoint.py) and stored runs' stay the same; read them
#: with ``.get(key, default)``
_LATER_DEFAULTS = (("privacy", "allow_large_delta"), ("run", "mesh"), ("run", "distributed"))

# Tables whose keys are free-form (passed through to a dataset, partitioner or algorithm).
_OPEN_TABLES = {("data", "dataset_options"), ("data", "partition_options"), ("algorithm",),
                ("data", "server_dataset_options"), ("model", "options"), ("data", "features"),
                ("run", "distributed")}


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


def _distributed(name: str, value: Any) -> dict:
    """``run.distributed``: a table of :data:`fedjax_dp.experiments.processes.TABLE_KEYS`,
    checked as the command-line flags are (:func:`fedjax_dp.experiments.processes.resolve`)."""
    from fedjax_dp.experiments import processes
    if not isinstance(value, dict):
        raise ConfigError(f"{name} must be a table (coordinator, num_processes, process_id, "
                          f"timeout_s), got {value!r}")
    if value:
        try:
            processes.resolve(table=value, env={})
        except ValueError as e:
            raise ConfigError(str(e)) from None
    return value


def _chunk_size(name: str, value: Any) -> int | str:
    """``"auto"`` (cache-sized), 0 (all agents at once) or agents per chunk."""
    if isinstance(value, str) and value == "auto":
        return value
    if isinstance(value, str) or isinstance(value, bool):
        raise ConfigError(f"{name} must be \"auto\" or an integer >= 0, got {value!r}")
    return validation.Int(0)(name, value)


def _rounds_per_call(name: str, value: Any) -> int | str:
    """``"auto"`` or rounds per compiled call (>= 1)."""
    if isinstance(value, str) and value == "auto":
        return value
    if isinstance(value, str) or isinstance(value, bool):
        raise ConfigError(f"{name} must be \"auto\" or an integer >= 1, got {value!r}")
    return validation.Int(1)(name, value)


def _log(name: str, value: Any) -> list[str]:
    """``run.log``: a list of distinct backends from :data:`LOG_BACKENDS` (``[]``: none)."""
    allowed = list(LOG_BACKENDS)
    if not isinstance(value, (list, tuple)) or not all(
            isinstance(v, str) and v in LOG_BACKENDS for v in value):
        raise ConfigError(f"{name} must be a list of backends from {allowed} (e.g. "
                          f"[\"tensorboard\"]; [] logs nowhere but progress.jsonl), got {value!r}")
    if len(set(value)) != len(value):
        raise ConfigError(f"{name} names a backend twice: {list(value)}")
    return list(value)


def _features(name: str, value: Any) -> dict:
    """``data.features``: ``{}`` or a frozen feature map's table
    (:func:`fedjax_dp.data.features.check_spec`)."""
    from fedjax_dp.data import features
    try:
        return features.check_spec(name, value)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _train_fields() -> dict:
    from fedjax_dp.train import LocalTrainConfig
    return validation.field_specs(LocalTrainConfig)


#: The type and range of every key of the fixed tables, checked and converted (2.0 -> 2) by
#: :func:`resolve`; the ``[algorithm]`` keys and the names (datasets, partitions, models) are
#: checked by ``runner.plan``.
FIELDS: dict[tuple[str, ...], Any] = {
    ("seed",): validation.Int(0, 2 ** 32 - 1),
    ("data", "dataset"): validation.Text("a dataset name"),
    ("data", "dataset_options"): validation.Table(),
    ("data", "partition"): validation.Text("a partition name"),
    ("data", "partition_options"): validation.Table(),
    ("data", "num_agents"): validation.Int(1),
    ("data", "server_dataset"): validation.Text("a dataset name or \"\" (the agents' dataset)"),
    ("data", "server_dataset_options"): validation.Table(),
    ("data", "image_size"): validation.Int(0, 4096),
    ("data", "validation_fraction"): validation.Float(0.0, 1.0, high_open=True),
    ("data", "validation_split"): validation.Choice(VALIDATION_SPLITS),
    ("data", "validation_seed"): validation.Int(-1, 2 ** 32 - 1),
    ("data", "features"): validation.Custom(_features, bad=("pca", {"map": "svd", "dim": 2},
                                                             {"map": "pca"}, {"dim": 2},
                                                             {"map": "pca", "dim": 0})),
    ("model", "name"): validation.Text("a model name"),
    ("model", "hidden"): validation.ListOf(validation.Int(1, validation.WIDTH_MAX),
                                           max_length=validation.DEPTH_MAX),
    ("model", "options"): validation.Table(),
    ("privacy", "delta"): validation.Float(0.0, 1.0, low_open=True, high_open=True),
    ("privacy", "accountants"): validation.ListOf(validation.Choice(("rdp", "pld")),
                                                  min_length=1, max_length=2, distinct=True),
    ("privacy", "allow_large_delta"): validation.Bool(),
    ("run", "eval_every"): validation.Int(0),
    ("run", "chunk_size"): validation.Custom(_chunk_size, bad=(-1, 2.5, "x", True, 1e30)),
    ("run", "progress"): validation.Bool(),
    ("run", "agents_on"): validation.Text("a placement name"),   # its choices: resolve
    ("run", "checkpoint_every"): validation.Int(0),
    ("run", "rounds_per_call"): validation.Custom(_rounds_per_call,
                                                  bad=(0, -1, 2.5, "x", True)),
    ("run", "on_nonfinite"): validation.Choice(("stop", "continue")),
    ("run", "compilation_cache"): validation.Text("\"user\", \"off\" or a folder",
                                                  non_empty=True),     # "": not this folder
    ("run", "log"): validation.Custom(_log, bad=("tensorboard", ["tensorboardx"], [3],
                                                 ["wandb", "wandb"])),
    ("run", "wandb_project"): validation.Text("a Weights & Biases project name"),
    ("run", "log_epsilon_every"): validation.Int(0),
    ("run", "mesh"): validation.Choice(("auto", "all", "none")),
    ("run", "distributed"): validation.Custom(_distributed, bad=(3, "x", {"coordinator": 1},
                                                                  {"port": 1})),
    ("algorithm", "name"): validation.Text("an algorithm name"),
}


def fields() -> dict[tuple[str, ...], Any]:
    """:data:`FIELDS` with the ``[train]`` keys (``train.LocalTrainConfig``'s specs)."""
    return {**FIELDS, **{("train", k): spec for k, spec in _train_fields().items()}}


def resolve(raw: dict, overrides: list[str] | tuple[str, ...] = ()) -> dict:
    """Defaults <- file <- overrides, with unknown keys rejected and every key of the fixed
    tables checked by type and range (:func:`fields`; integral floats become ints)."""
    config = copy.deepcopy(raw)
    for assignment in overrides:
        apply_override(config, assignment)
    resolved = _merge(DEFAULTS, config)
    for path, spec in fields().items():
        node = resolved
        for k in path[:-1]:
            if not isinstance(node.get(k), dict):
                raise ConfigError(f"[{k}] must be a table, got {node.get(k)!r}")
            node = node[k]
        node[path[-1]] = spec(".".join(path), node[path[-1]])
    validation.check_choice("run.agents_on", resolved["run"]["agents_on"],
                            ("auto", "device", "host"))
    for table, key in _LATER_DEFAULTS:          # at its default: as configs stored before it
        if resolved[table][key] == DEFAULTS[table][key]:
            del resolved[table][key]
    d = resolved["data"]
    for key, unset in (("validation_split", "pooled"), ("validation_seed", -1)):
        if d[key] != unset and not d["validation_fraction"]:
            raise ConfigError(f"data.{key} = {d[key]!r} needs a validation split: set "
                              f"data.validation_fraction > 0 (e.g. 0.2)")
    return resolved


#: a config (or sweep) file is at most this long
MAX_CONFIG_BYTES = 16 << 20


def read_toml(path: str | Path, what: str = "config file") -> dict:
    """A TOML file as data (``tomllib``: tables and values, nothing executed): a regular file
    (the one named: a symlink is followed) of at most :data:`MAX_CONFIG_BYTES`, UTF-8, nested
    no deeper than the parser can go; anything else is a one-line ConfigError naming it."""
    from fedjax_dp.core import files
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{what} {str(path)!r} does not exist")
    try:
        data = files.read_bytes(path, max_bytes=MAX_CONFIG_BYTES, root="/", what=what)
        return tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigError(f"{what} {str(path)!r} is not UTF-8 text ({e.reason} at byte "
                          f"{e.start})") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{what} {str(path)!r} is not valid TOML: {e}") from None
    except RecursionError:
        raise ConfigError(f"{what} {str(path)!r} is nested too deep to be a config") from None
    except ValueError as e:                       # files.UntrustedFileError: too large
        raise ConfigError(str(e)) from None


def load(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> dict:
    """Read a TOML config file (:func:`read_toml`) and resolve it."""
    return resolve(read_toml(path), overrides)
