"""Run one experiment from a resolved config and write ``result.json``.

Order of work: validate everything (config tables, dataset and partition names, algorithm fields)
-> load data -> partition -> stack -> train -> evaluate -> account -> write. Each finished round is
appended to ``progress.jsonl`` in the output folder as it completes, so an interrupted run keeps
what it computed.
"""
from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import math
import platform
import sys
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from fedjax_dp import data as data_lib
from fedjax_dp.algorithms import api
from fedjax_dp.algorithms.api import FederatedData
from fedjax_dp.core import from_partition, rng
from fedjax_dp.experiments import config as config_lib
from fedjax_dp.experiments import registry
from fedjax_dp.models import make_model
from fedjax_dp.train import LocalTrainConfig, accuracy

_PACKAGES = ("fedjax-dp", "jax", "jaxlib", "flax", "optax", "chex", "numpy", "scipy",
             "dp-accounting", "scikit-learn")


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


@dataclasses.dataclass
class Plan:
    """Everything validated from a resolved config, before any data is loaded or trained on."""

    config: dict
    entry: Any                                   # an algorithm module (or a legacy entry)
    algorithm_config: Any
    local: LocalTrainConfig


def plan(config: dict) -> Plan:
    """Validate a resolved config completely; raise ``ValueError`` naming the bad key."""
    d = config["data"]
    if d["dataset"] not in data_lib.DATASETS:
        raise config_lib.ConfigError(f"data.dataset must be one of {sorted(data_lib.DATASETS)}, "
                                     f"got {d['dataset']!r}")
    if d["partition"] not in data_lib.PARTITIONS:
        raise config_lib.ConfigError(f"data.partition must be one of "
                                     f"{sorted(data_lib.PARTITIONS)}, got {d['partition']!r}")
    from fedjax_dp.models import MODELS
    if config["model"]["name"] not in MODELS:
        raise config_lib.ConfigError(f"model.name must be one of {list(MODELS)}, "
                                     f"got {config['model']['name']!r}")
    server = d.get("server_dataset", "")
    if server and server not in data_lib.DATASETS:
        raise config_lib.ConfigError(f"data.server_dataset must be \"\" or one of "
                                     f"{sorted(data_lib.DATASETS)}, got {server!r}")
    algo = dict(config["algorithm"])
    entry = registry.get(algo.pop("name"))
    local = config_lib.build_dataclass(LocalTrainConfig, config["train"], "train")
    extra = {"local": local} if registry.uses_local_train(entry) else {}
    algorithm_config = config_lib.build_dataclass(registry.config_class(entry), algo, "algorithm",
                                                  **extra)
    return Plan(config=config, entry=entry, algorithm_config=algorithm_config, local=local)


def _resized(ds: data_lib.Dataset, size: int) -> data_lib.Dataset:
    if ds.x_train.ndim != 4:
        raise config_lib.ConfigError(f"data.image_size applies to image datasets [n, H, W, C]; "
                                     f"{ds.name!r} has feature shape {ds.feature_shape}")
    r = data_lib.resize_images
    return data_lib.Dataset(name=ds.name, x_train=r(ds.x_train, size), y_train=ds.y_train,
                            x_public=r(ds.x_public, size), y_public=ds.y_public,
                            x_test=r(ds.x_test, size), y_test=ds.y_test,
                            num_classes=ds.num_classes, domain_train=ds.domain_train)


def load_data(d: dict) -> data_lib.Dataset:
    """The dataset of a resolved ``[data]`` table.

    ``data.image_size = s > 0`` resizes every split to ``s x s`` (bilinear,
    :func:`fedjax_dp.data.resize_images`). ``data.server_dataset = name`` makes a cross-domain
    task: the agents partition ``data.dataset``'s training split, and the server's public
    (unlabelled) and test splits come from ``name`` (loaded with ``data.server_dataset_options``);
    both must have the same classes and, after resizing, the same feature shape. The result is
    named ``"<dataset>-><server_dataset>"``.
    """
    ds = data_lib.load_dataset(d["dataset"], **d["dataset_options"])
    size = d.get("image_size", 0)
    if size:
        ds = _resized(ds, size)
    server = d.get("server_dataset", "")
    if not server:
        return ds
    srv = data_lib.load_dataset(server, **d.get("server_dataset_options", {}))
    if size:
        srv = _resized(srv, size)
    if srv.num_classes != ds.num_classes:
        raise config_lib.ConfigError(f"data.server_dataset {server!r} has {srv.num_classes} "
                                     f"classes but data.dataset has {ds.num_classes}")
    if srv.feature_shape != ds.feature_shape:
        raise config_lib.ConfigError(
            f"data.server_dataset {server!r} has feature shape {srv.feature_shape} but "
            f"data.dataset has {ds.feature_shape}; set data.image_size to a common size")
    return data_lib.Dataset(name=f"{ds.name}->{srv.name}", x_train=ds.x_train,
                            y_train=ds.y_train, x_public=srv.x_public, y_public=srv.y_public,
                            x_test=srv.x_test, y_test=srv.y_test, num_classes=ds.num_classes,
                            domain_train=ds.domain_train)


def _jsonable(x):
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if hasattr(x, "item") and getattr(x, "ndim", 1) == 0:
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None          # strict JSON: an infinite epsilon (no guarantee) is written as null
    return x


def run(config: dict, out_dir: str | Path | None = None, *, progress: bool | None = None
        ) -> dict:
    """Run a resolved config; return the result record (also written to ``out_dir``)."""
    p = plan(config)
    show = config["run"]["progress"] if progress is None else progress
    out = Path(out_dir) if out_dir is not None else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "progress.jsonl").write_text("")
    start = time.perf_counter()
    seed = config["seed"]
    root = rng.as_key(seed)
    d = config["data"]
    dataset = load_data(d)
    indices = data_lib.partition(d["partition"], dataset.y_train, d["num_agents"],
                                 rng.stream(root, "partition"), **d["partition_options"])
    agents = from_partition(dataset.x_train, dataset.y_train, indices)
    model = make_model(config["model"]["name"], dataset.feature_shape, dataset.num_classes,
                       hidden=tuple(config["model"]["hidden"]))
    rounds_total = getattr(p.algorithm_config, "rounds", None)
    name = config["algorithm"]["name"]

    def on_round(t: int, record: dict) -> None:
        if out is not None:
            with open(out / "progress.jsonl", "a") as f:
                f.write(json.dumps(_jsonable(record)) + "\n")
        if show:
            shown = " ".join(f"{k}={v:.4g}" for k, v in record.items()
                             if k != "round" and isinstance(v, float))
            total = f"/{rounds_total}" if rounds_total else ""
            print(f"[{name}] round {t}{total} {shown}", file=sys.stderr, flush=True)

    chunk = config["run"]["chunk_size"] or None          # 0 -> all agents at once
    key = rng.stream(root, "algorithm")
    extra_fields: dict = {}        # from an algorithm's optional artifacts(state, out, config)
    if registry.is_protocol(p.entry):
        fed = FederatedData(agents=agents, num_classes=dataset.num_classes,
                            x_public=dataset.x_public, y_public=dataset.y_public)
        x_test, y_test = dataset.x_test, dataset.y_test

        def evaluate(output):
            return {"test_accuracy": float(np.mean(output.predict_labels(x_test) == y_test))}

        done = api.run(p.entry, key, fed, model, p.algorithm_config,
                       runtime=api.Runtime(chunk_size=chunk), evaluate=evaluate,
                       eval_every=config["run"]["eval_every"], on_step=on_round)
        output = p.entry.output(done.state)
        test_acc = float(np.mean(output.predict_labels(x_test) == y_test))
        ledgers = api.ledgers(p.entry, p.algorithm_config, done.state)
        history = done.history
        hook = getattr(p.entry, "artifacts", None)     # optional: extra files and result fields
        if hook is not None:
            extra_fields = hook(done.state, out, config) or {}
    else:
        ctx = registry.Context(key=key, dataset=dataset, agents=agents,
                               model=model, local=p.local, config=p.algorithm_config,
                               eval_every=config["run"]["eval_every"], chunk_size=chunk,
                               on_round=on_round)
        outcome = p.entry.execute(ctx)
        if getattr(outcome, "predict", None) is not None:   # non-JAX final model (e.g. trees)
            test_acc = float(np.mean(np.asarray(outcome.predict(dataset.x_test))
                                     == dataset.y_test))
        else:
            test_acc = accuracy(outcome.model, outcome.params, dataset.x_test, dataset.y_test)
        ledgers = (outcome.ledger, *getattr(outcome, "extra_ledgers", ()))
        history = outcome.history
    delta = config["privacy"]["delta"]
    privacy = []
    for ledger in ledgers:                                  # reported side by side, not composed
        privacy += ledger.report(delta, accountants=tuple(config["privacy"]["accountants"]))
    result = {
        "algorithm": name,
        "dataset": dataset.name,
        "num_agents": agents.num_agents,
        "test_accuracy": test_acc,
        "privacy": privacy,
        "wall_time_s": time.perf_counter() - start,
        "seed": seed,
        "config": config,
        "versions": versions(),
        "devices": [str(dv) for dv in jax.devices()],
        "history": history,
    }
    result.update({k: v for k, v in extra_fields.items() if k not in result})
    result = _jsonable(result)
    if out is not None:
        (out / "result.json").write_text(json.dumps(result, indent=2, allow_nan=False))
    if show:
        eps = ", ".join(f"{g['unit']}: eps={g['epsilon']:.4g} ({g['accountant']})"
                        for g in privacy) or "no privacy guarantee"
        print(f"[{name}] test accuracy {test_acc:.4f}; {eps}", file=sys.stderr)
    return result
