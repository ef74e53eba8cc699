"""Run one experiment from a resolved config and write ``result.json``.

Order of work: validate everything (config tables, dataset and partition names, algorithm fields,
the output folder) -> load data -> partition -> stack -> train -> evaluate -> account -> write.

The output folder of a run holds ``config.json`` (the resolved config, written first),
``progress.jsonl`` (one line per finished round, appended as it completes), ``checkpoints/``
(every ``run.checkpoint_every`` rounds of a round-based algorithm,
:mod:`fedjax_dp.experiments.checkpoint`) and, at the end, ``result.json``. A folder that already
holds a run is never written over: :func:`run` refuses it, and ``resume=True`` continues the run it
holds from its last checkpoint (the same parameters, history and ledger as an uninterrupted run).
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
from fedjax_dp.core import from_partition, rng, validation
from fedjax_dp.core import progress as progress_lib
from fedjax_dp.experiments import checkpoint as checkpoint_lib
from fedjax_dp.experiments import config as config_lib
from fedjax_dp.experiments import registry
from fedjax_dp.models import make_model
from fedjax_dp.train import LocalTrainConfig

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
    entry: Any                                   # an algorithm module (fedjax_dp.algorithms.api)
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
    hidden = config["model"]["hidden"]
    if not isinstance(hidden, list):
        raise config_lib.ConfigError(f"model.hidden must be a list of layer widths, e.g. [200], "
                                     f"got {hidden!r}")
    for h in hidden:
        validation.check_int("model.hidden[]", h, minimum=1)
    server = d.get("server_dataset", "")
    if server and server not in data_lib.DATASETS:
        raise config_lib.ConfigError(f"data.server_dataset must be \"\" or one of "
                                     f"{sorted(data_lib.DATASETS)}, got {server!r}")
    algo = dict(config["algorithm"])
    entry = registry.get(algo.pop("name"))
    local = config_lib.build_dataclass(LocalTrainConfig, config["train"], "train")
    extra = {"local": local} if entry.USES_LOCAL_TRAIN else {}
    algo_fields = {f.name for f in dataclasses.fields(entry.Config)}
    if "delta" in algo_fields and "delta" not in algo:
        algo["delta"] = config["privacy"]["delta"]      # a target delta defaults to [privacy]'s
    algorithm_config = config_lib.build_dataclass(entry.Config, algo, "algorithm", **extra)
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


def _load(name: str, options: dict, where: str) -> data_lib.Dataset:
    """``load_dataset(name, **options)``; an option the source does not take names ``where``."""
    import inspect
    source = data_lib.DATASETS.get(name)
    if source is not None:
        try:
            inspect.signature(source).bind(**options)
        except TypeError as e:
            params = [q for q in inspect.signature(source).parameters]
            raise config_lib.ConfigError(f"{where} for {name!r}: {e}; it accepts {params}"
                                         ) from None
    return data_lib.load_dataset(name, **options)


def load_data(d: dict) -> data_lib.Dataset:
    """The dataset of a resolved ``[data]`` table.

    ``data.image_size = s > 0`` resizes every split to ``s x s`` (bilinear,
    :func:`fedjax_dp.data.resize_images`). ``data.server_dataset = name`` makes a cross-domain
    task: the agents partition ``data.dataset``'s training split, and the server's public
    (unlabelled) and test splits come from ``name`` (loaded with ``data.server_dataset_options``);
    both must have the same classes and, after resizing, the same feature shape. The result is
    named ``"<dataset>-><server_dataset>"``.
    """
    ds = _load(d["dataset"], d["dataset_options"], "data.dataset_options")
    size = d.get("image_size", 0)
    if size:
        ds = _resized(ds, size)
    server = d.get("server_dataset", "")
    if not server:
        return ds
    srv = _load(server, d.get("server_dataset_options", {}), "data.server_dataset_options")
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


def partition_indices(d: dict, dataset: data_lib.Dataset, key) -> list:
    """The agents' training-record indices for a resolved ``[data]`` table.

    ``partition = "by_domain"`` uses the dataset's own training domains (e.g. mnist5k_oddeven's
    (even, odd) digit pairs) unless ``partition_options.domains`` is given.
    """
    options = dict(d["partition_options"])
    if d["partition"] == "by_domain" and "domains" not in options:
        if dataset.domain_train is None:
            raise config_lib.ConfigError(f"data.partition = \"by_domain\" needs a dataset with "
                                         f"training domains; {dataset.name!r} has none")
        options["domains"] = dataset.domain_train
    try:
        return data_lib.partition(d["partition"], dataset.y_train, d["num_agents"], key,
                                  **options)
    except ValueError as e:            # name the config key the partitioner's argument came from
        msg = str(e)
        if msg.startswith("num_agents"):
            raise config_lib.ConfigError(f"data.{msg}") from None
        first = msg.split(" ", 1)[0]
        if first in options:
            raise config_lib.ConfigError(f"data.partition_options.{msg}") from None
        raise


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


def guarantee_line(g: dict) -> str:
    """One printed guarantee: unit, epsilon at delta, accountant, and whether it depends on the
    data (a data-dependent epsilon is itself not private to release). An infinite epsilon
    (``None`` in ``result.json``) prints as ``inf``."""
    kind = ", data-dependent" if g.get("data_dependent") else ""
    eps = g["epsilon"]
    eps = "inf" if eps is None or not math.isfinite(eps) else f"{eps:.4g}"
    return f"{g['unit']}: eps={eps} at delta={g['delta']:.3g} ({g['accountant']}{kind})"


def summary_line(name: str, result: dict, out: Path | None) -> str:
    """The line printed at the end of a run: test accuracy, every guarantee
    (:func:`guarantee_line`) and the run's folder."""
    eps = "; ".join(guarantee_line(g) for g in result["privacy"]) or "no privacy guarantee"
    where = f"; run folder {out}" if out is not None else ""
    return f"[{name}] test accuracy {result['test_accuracy']:.4f}; {eps}{where}"


#: files that mark a folder as holding a run
RUN_FILES = ("config.json", "progress.jsonl", "result.json", checkpoint_lib.FOLDER)


def holds_run(out: Path) -> list[str]:
    """The run files already in ``out`` (empty: free to use)."""
    return [name for name in RUN_FILES if (out / name).exists()]


def prepare_out(out: Path, *, resume: bool = False) -> None:
    """Check the output folder before any work: writable, and (unless resuming) holding no run.

    Raises ``ValueError`` naming ``--out`` (a run's results are never overwritten)."""
    if out.exists() and not out.is_dir():
        raise config_lib.ConfigError(f"--out {str(out)!r} is a file, not a folder")
    if resume:
        if not (out / "config.json").is_file():
            raise config_lib.ConfigError(f"--resume {str(out)!r} holds no run (no config.json)")
        if (out / "result.json").exists():
            raise config_lib.ConfigError(f"--resume {str(out)!r}: that run has finished "
                                         f"(result.json exists); nothing to resume")
    else:
        found = holds_run(out) if out.is_dir() else []
        if found:
            raise config_lib.ConfigError(
                f"--out {str(out)!r} already holds a run ({', '.join(found)}); choose a new "
                f"folder (or omit --out for a fresh one), or continue it with --resume")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write_test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise config_lib.ConfigError(f"--out {str(out)!r} is not a writable folder "
                                     f"({e.strerror or e})") from None


def fresh_out(base: str | Path, name: str) -> Path:
    """A new folder ``base/name/<UTC time>[-k]`` for a run without ``--out`` (never an earlier
    run's)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    root = Path(base) / name
    out, k = root / stamp, 1
    while out.exists():
        out, k = root / f"{stamp}-{k}", k + 1
    return out


def _append_progress(out: Path, record: dict) -> None:
    with open(out / "progress.jsonl", "a") as f:
        f.write(json.dumps(_jsonable(record)) + "\n")


def run(config: dict, out_dir: str | Path | None = None, *, progress: bool | None = None,
        resume: bool = False) -> dict:
    """Run a resolved config; return the result record (also written to ``out_dir``).

    ``resume=True``: continue the run held in ``out_dir`` (same config, except the execution keys
    :data:`checkpoint.EXECUTION_KEYS`) from its last checkpoint; without one it starts over.
    """
    p = plan(config)
    show = config["run"]["progress"] if progress is None else progress
    out = Path(out_dir) if out_dir is not None else None
    if resume and out is None:
        raise config_lib.ConfigError("resume needs the run's folder (--resume DIR)")
    restart = None                               # the checkpoint a resumed run starts from
    created = out is not None and not out.exists()
    if out is not None:
        prepare_out(out, resume=resume)
        if resume:
            restart = checkpoint_lib.latest(out)
            if restart is not None:
                checkpoint_lib.check_config(restart, config)
            elif checkpoint_lib.fingerprint(json.loads((out / "config.json").read_text())) != \
                    checkpoint_lib.fingerprint(config):
                raise checkpoint_lib.CheckpointError(
                    f"--resume {str(out)!r} holds a run of a different config")
        (out / "config.json").write_text(json.dumps(_jsonable(config), indent=2))
        (out / "progress.jsonl").write_text("")
    try:
        return _run(p, config, out, show, restart)
    except BaseException:
        progress_file = None if out is None else out / "progress.jsonl"
        if out is not None and not resume and not checkpoint_lib.latest(out) and \
                not (progress_file.exists() and progress_file.read_text().strip()):
            # failed before any round (bad data, k above a record count, ...): leave no run
            # behind, so the same --out can be used once the input is fixed
            for name in ("config.json", "progress.jsonl"):
                (out / name).unlink(missing_ok=True)
            if created and not any(out.iterdir()):
                out.rmdir()
        raise


@dataclasses.dataclass
class Setup:
    """A run's inputs, built from its resolved config: the data (partitioned and stacked, with the
    server's public split), the model, and the root key the algorithm is driven with."""

    dataset: data_lib.Dataset
    fed: FederatedData
    model: Any
    key: jax.Array                  # rng.stream(seed's root, "algorithm")
    x_val: Any = None               # [n_val, ...] held-out training records (validation_fraction)
    y_val: Any = None               # [n_val]

    def evaluate(self, output: api.Output) -> dict:
        """``test_accuracy`` (and ``val_accuracy`` with a validation split) of a model."""
        out = {"test_accuracy": float(np.mean(output.predict_labels(self.dataset.x_test)
                                              == self.dataset.y_test))}
        if self.x_val is not None:
            out["val_accuracy"] = float(np.mean(output.predict_labels(self.x_val) == self.y_val))
        return out


def hold_out(dataset: data_lib.Dataset, fraction: float, key
             ) -> tuple[data_lib.Dataset, np.ndarray, np.ndarray]:
    """``(dataset without the held-out records, x_val, y_val)``: ``round(fraction n)`` (>= 1)
    training records drawn uniformly with ``key``; the rest keep their order."""
    n = len(dataset.y_train)
    m = max(1, int(round(fraction * n)))
    if m >= n:
        raise config_lib.ConfigError(f"data.validation_fraction = {fraction} leaves no training "
                                     f"record of {n}")
    perm = np.asarray(jax.random.permutation(key, n))
    val, keep = perm[:m], np.sort(perm[m:])
    dom = None if dataset.domain_train is None else dataset.domain_train[keep]
    reduced = data_lib.Dataset(name=dataset.name, x_train=dataset.x_train[keep],
                               y_train=dataset.y_train[keep], x_public=dataset.x_public,
                               y_public=dataset.y_public, x_test=dataset.x_test,
                               y_test=dataset.y_test, num_classes=dataset.num_classes,
                               domain_train=dom)
    return reduced, dataset.x_train[val], dataset.y_train[val]


def setup(config: dict) -> Setup:
    """Load, partition and stack the data and build the model of a resolved config (the seed's
    root key drives the partition and the algorithm's key)."""
    root = rng.as_key(config["seed"])
    d = config["data"]
    dataset = load_data(d)
    x_val = y_val = None
    if d.get("validation_fraction", 0.0):
        dataset, x_val, y_val = hold_out(dataset, d["validation_fraction"],
                                         rng.stream(root, "validation"))
    indices = partition_indices(d, dataset, rng.stream(root, "partition"))
    agents = from_partition(dataset.x_train, dataset.y_train, indices)
    if config["run"]["agents_on"] == "host":          # only cohorts / chunks go to the device
        agents = agents.on_host()
    model = make_model(config["model"]["name"], dataset.feature_shape, dataset.num_classes,
                       hidden=tuple(config["model"]["hidden"]))
    fed = FederatedData(agents=agents, num_classes=dataset.num_classes,
                        x_public=dataset.x_public, y_public=dataset.y_public)
    return Setup(dataset=dataset, fed=fed, model=model, key=rng.stream(root, "algorithm"),
                 x_val=x_val, y_val=y_val)


def _run(p: Plan, config: dict, out: Path | None, show: bool, restart: Path | None) -> dict:
    start = time.perf_counter()
    s = setup(config)
    model, fed, key = s.model, s.fed, s.key
    steps_total = p.entry.num_steps(p.algorithm_config)
    phases = getattr(p.entry, "PHASES", None)             # one-shot: the steps are phases
    label = getattr(p.entry, "step_label", None)          # optional: names a round-based step
    name = config["algorithm"]["name"]

    reporter = progress_lib.bar(show)         # a live bar on a terminal, silent otherwise
    bar_task = None

    every = config["run"]["checkpoint_every"] if not phases else 0   # round-based runs only
    history_so_far: list[dict] = []
    latest_state: list = []                      # the state after the last finished step

    def on_round(t: int, record: dict) -> None:
        history_so_far.append(_jsonable(record))
        if out is not None:
            _append_progress(out, record)
            if every and t % every == 0 and t < steps_total and latest_state:
                state = latest_state[0]
                checkpoint_lib.save(out, state, config=config, history=history_so_far,
                                    ledgers=[lg.to_json() for lg in
                                             api.ledgers(p.entry, p.algorithm_config, state)])
        if bar_task is not None:
            bar_task.set(**{k: v for k, v in record.items()
                            if k != "round" and isinstance(v, float)})
            bar_task.update(1)
        elif show:
            shown = " ".join(f"{k}={v:.4g}" for k, v in record.items()
                             if k != "round" and isinstance(v, float))
            if phases:
                what = f"phase {t}/{steps_total} {phases[t - 1]}"
            elif label is not None:                          # e.g. DP-FNAS's search / retrain
                what = label(p.algorithm_config, t)
            else:
                what = f"round {t}/{steps_total}"
            print(f"[{name}] {what} {shown}", file=sys.stderr, flush=True)

    chunk = config["run"]["chunk_size"] or None          # 0 -> all agents at once
    evaluate = s.evaluate

    # run.eval_every evaluates the model between rounds; a one-shot method's phases before the
    # last have no model yet, so it is evaluated once, at the end
    eval_every = 0 if phases else config["run"]["eval_every"]
    with reporter.task(name, total=steps_total, unit="phase" if phases else "round") as bar_task:
        if not reporter.enabled:
            bar_task = None
        runtime = api.Runtime(chunk_size=chunk, progress=reporter)
        start_state = None
        if restart is not None:
            fresh = p.entry.init(key, fed, model, p.algorithm_config, runtime)
            start_state, meta = checkpoint_lib.restore(restart, fresh, config)
            history_so_far.extend(meta["history"])
            for record in meta["history"]:
                _append_progress(out, record)
            if bar_task is not None:
                bar_task.update(start_state.step)
        done = api.run(_Tracking(p.entry, latest_state), key, fed, model, p.algorithm_config,
                       runtime=runtime, evaluate=evaluate, eval_every=eval_every,
                       on_step=on_round, state=start_state)
    result = result_record(p, config, s, done.state, history_so_far, out,
                           time.perf_counter() - start)
    if show:
        print(summary_line(name, result, out), file=sys.stderr)
    return result


def result_record(p: Plan, config: dict, s: Setup, state: api.State, history: list[dict],
                  out: Path | None, wall_time_s: float) -> dict:
    """The ``result.json`` record of a finished run (written to ``out`` when given): the final
    model's test accuracy, every ledger's guarantees, the history, versions."""
    output = p.entry.output(state)
    scores = s.evaluate(output)
    test_acc = scores["test_accuracy"]
    ledgers = api.ledgers(p.entry, p.algorithm_config, state)
    hook = getattr(p.entry, "artifacts", None)     # optional: extra files and result fields
    extra_fields = (hook(state, out, config) or {}) if hook is not None else {}
    delta = config["privacy"]["delta"]
    privacy = []
    for ledger in ledgers:                                  # reported side by side, not composed
        privacy += ledger.report(delta, accountants=tuple(config["privacy"]["accountants"]))
    result = {
        "algorithm": config["algorithm"]["name"],
        "dataset": s.dataset.name,
        "num_agents": s.fed.num_agents,
        "test_accuracy": test_acc,
        **({"val_accuracy": scores["val_accuracy"]} if "val_accuracy" in scores else {}),
        "privacy": privacy,
        "wall_time_s": wall_time_s,
        "seed": config["seed"],
        "config": config,
        "versions": versions(),
        "devices": [str(dv) for dv in jax.devices()],
        "history": history,
    }
    result.update({k: v for k, v in extra_fields.items() if k not in result})
    result = _jsonable(result)
    if out is not None:
        (out / "result.json").write_text(json.dumps(result, indent=2, allow_nan=False))
    return result


def run_seeds(configs: list[dict], *, progress: bool = False) -> list[dict] | None:
    """Runs of resolved configs that differ only in ``seed``, all seeds of each step in ONE
    vmapped compiled call (:func:`api.run_seeds`); the result records equal :func:`run`'s for
    each config (to float tolerance; ``vmapped_seeds`` gives S, ``wall_time_s`` the batch's
    time / S). Returns None when the algorithm or the seeds' data do not allow it (run them one
    by one). Nothing is written: a sweep stores the records."""
    if not configs:
        raise ValueError("configs must hold at least one config")
    strip = [{k: v for k, v in c.items() if k != "seed"} for c in configs]
    if any(json.dumps(c, sort_keys=True) != json.dumps(strip[0], sort_keys=True)
           for c in strip[1:]):
        raise ValueError("run_seeds: the configs must differ only in seed")
    p = plan(configs[0])
    if not api.can_vmap_seeds(p.entry):
        return None
    phases = getattr(p.entry, "PHASES", None)     # one-shot: evaluated once, at the end
    start = time.perf_counter()
    setups = [setup(c) for c in configs]
    config = configs[0]
    model = setups[0].model

    def evaluate(output, s):
        return setups[s].evaluate(output)

    reporter = progress_lib.bar(progress)
    steps_total = p.entry.num_steps(p.algorithm_config)
    name = config["algorithm"]["name"]
    with reporter.task(f"{name} x{len(configs)} seeds", total=steps_total, unit="phase" if phases else "round") as task:
        runtime = api.Runtime(chunk_size=config["run"]["chunk_size"] or None, progress=reporter)
        done = api.run_seeds(p.entry, [s.key for s in setups], [s.fed for s in setups], model,
                             p.algorithm_config, runtime=runtime, evaluate=evaluate,
                             eval_every=0 if phases else config["run"]["eval_every"],
                             on_step=lambda t, records: task.update(1))
    if done is None:
        return None
    wall = (time.perf_counter() - start) / len(configs)
    results = []
    for c, s, r in zip(configs, setups, done):
        rec = result_record(p, c, s, r.state, [_jsonable(h) for h in r.history], None, wall)
        rec["vmapped_seeds"] = len(configs)
        results.append(rec)
    return results


class _Tracking:
    """``algorithm`` whose ``step`` also keeps the latest state in ``cell[0]`` (for checkpoints
    taken in ``on_step``, which sees only the record)."""

    def __init__(self, algorithm, cell: list):
        self._algorithm, self._cell = algorithm, cell

    def __getattr__(self, name):
        return getattr(self._algorithm, name)

    def step(self, state, key):
        state, metrics = self._algorithm.step(state, key)
        self._cell[:] = [state]
        return state, metrics
