"""A run's population from its resolved ``[data]`` table: load -> hold out -> partition -> stack,
the agents' records copied once, into ``x [N, n_max, ...]`` (docs/scale.md):

* a streamed source generates its features block by block into the agents' rows
  (:func:`fedjax_dp.core.stack_records`) or draws them where they are consumed
  (:func:`fedjax_dp.core.stacked.stack_drawn`); other sources' rows are gathered in blocks;
* the validation hold-out (``data.validation_fraction``) comes from the whole training split
  (``"pooled"``) or from every agent's records (``"per_agent"``, :func:`hold_out_per_agent`);
* ``data.dataset = "stacked:PATH"`` reads a population saved by :func:`save`, memory-mapped
  (:func:`load_population`);
* the population is placed by ``run.agents_on`` (:func:`fedjax_dp.core.place`); every placement
  gives the same results.
"""
from __future__ import annotations

import ctypes
import dataclasses
import inspect
import json
import os
from pathlib import Path
from typing import Any

import jax
import numpy as np

from fedjax_dp import data as data_lib
from fedjax_dp.core import (StackedData, auto_placement, load_stacked, place, record_rows, rng,
                            save_stacked, stack_records)
from fedjax_dp.core.stacked import stack_drawn
from fedjax_dp.core.validation import ConfigError
from fedjax_dp.data import splits

SERVER_FILE = "server.npz"
_STACKED_FILES = ("x.npy", "y.npy", "counts.npy")
#: a converted population's clients.json (its client ids) is at most this long
MAX_META_BYTES = 256 << 20

AnyDataset = data_lib.Dataset | data_lib.StreamedDataset


@dataclasses.dataclass
class Population:
    """The data of a run: the task's splits (``dataset``: name, public and test splits, training
    labels), the stacked agents, and the held-out validation records (or None)."""

    dataset: AnyDataset
    agents: StackedData
    x_val: Any = None               # [n_val, ...]
    y_val: Any = None               # [n_val]


def _resized(ds: data_lib.Dataset, size: int) -> data_lib.Dataset:
    if ds.x_train.ndim != 4:
        raise ConfigError(f"data.image_size applies to image datasets [n, H, W, C]; "
                          f"{ds.name!r} has feature shape {ds.feature_shape}")
    r = data_lib.resize_images
    return data_lib.Dataset(name=ds.name, x_train=r(ds.x_train, size), y_train=ds.y_train,
                            x_public=r(ds.x_public, size), y_public=ds.y_public,
                            x_test=r(ds.x_test, size), y_test=ds.y_test,
                            num_classes=ds.num_classes, domain_train=ds.domain_train)


def _load(name: str, options: dict, where: str, *, stream: bool = False) -> AnyDataset:
    """``load_dataset(name, **options)`` (its :data:`~fedjax_dp.data.STREAMED` form with
    ``stream``); an option the source does not take names ``where``."""
    if name.startswith(data_lib.STACKED_PREFIX):
        raise ConfigError(f"{where.rsplit('_options', 1)[0]} = {name!r}: a stacked "
                          f"population can only be data.dataset")
    streamed = data_lib.STREAMED.get(name) if stream else None
    _check_call(streamed or data_lib.DATASETS.get(name), (), options, where, name)
    if streamed is not None:
        return streamed(**options)
    return data_lib.load_dataset(name, **options)


def _check_call(fn: Any, args: tuple, options: dict, where: str, name: str, *,
                partial: bool = False) -> None:
    """``fn(*args, **options)`` binds (``partial``: but for arguments supplied later), else a
    ConfigError naming ``where``; ``fn`` None: nothing to check."""
    if fn is None:
        return
    sig = inspect.signature(fn)
    try:
        (sig.bind_partial if partial else sig.bind)(*args, **options)
    except TypeError as e:
        params = list(sig.parameters)[len(args):]
        raise ConfigError(f"{where} for {name!r}: {e}; it accepts {params}") from None


def _check_stacked_keys(d: dict) -> None:
    """The ``[data]`` keys a stacked population cannot honour are unset."""
    for key, unset in (("dataset_options", {}), ("image_size", 0), ("validation_fraction", 0),
                       ("features", {})):
        if d.get(key, unset) != unset:
            raise ConfigError(f"data.{key} cannot be used with a stacked population "
                              f"(data.dataset = {d['dataset']!r}); got {d[key]!r}")


def check_options(d: dict) -> None:
    """The option tables of a resolved ``[data]`` table against the source and partition they
    are passed to, before anything is loaded: an option they do not take names its key (a
    sweep's dry run and every cell's plan catch a typo, not the cell that loads); so does a
    table whose source is not used (server options without a server dataset, a stacked
    population's options)."""
    if d["dataset"].startswith(data_lib.STACKED_PREFIX):
        _check_stacked_keys(d)
    if d.get("server_dataset_options") and not d.get("server_dataset"):
        raise ConfigError(f"data.server_dataset_options needs data.server_dataset (the "
                          f"dataset they are passed to), got {d['server_dataset_options']!r}")
    _check_call(data_lib.DATASETS.get(d["dataset"]), (), d["dataset_options"],
                "data.dataset_options", d["dataset"])
    if d.get("server_dataset"):
        _check_call(data_lib.DATASETS.get(d["server_dataset"]), (),
                    d.get("server_dataset_options", {}), "data.server_dataset_options",
                    d["server_dataset"])
    _check_call(data_lib.PARTITIONS.get(d["partition"]), (None, None, None),
                d["partition_options"], "data.partition_options", d["partition"],
                partial=True)              # by_domain / natural: their domains come from the data


def load_data(d: dict, *, stream: bool = False) -> AnyDataset:
    """The dataset of a resolved ``[data]`` table (a :class:`~fedjax_dp.data.StreamedDataset`
    with ``stream`` when the source can stream and no ``image_size`` is asked).

    ``data.image_size = s > 0`` resizes every split to ``s x s`` (bilinear,
    :func:`fedjax_dp.data.resize_images`). ``data.server_dataset = name`` makes a cross-domain
    task: the agents partition ``data.dataset``'s training split, and the server's public
    (unlabelled) and test splits come from ``name`` (loaded with ``data.server_dataset_options``);
    both must have the same classes and, after resizing, the same feature shape. The result is
    named ``"<dataset>-><server_dataset>"``.
    """
    size = d.get("image_size", 0)
    ds = _load(d["dataset"], d["dataset_options"], "data.dataset_options",
               stream=stream and not size)
    if size:
        ds = _resized(ds, size)
    server = d.get("server_dataset", "")
    if not server:
        return ds
    srv = _server(d, ds.num_classes, tuple(ds.feature_shape))
    return dataclasses.replace(ds, name=f"{ds.name}->{srv.name}", x_public=srv.x_public,
                               y_public=srv.y_public, x_test=srv.x_test, y_test=srv.y_test)


def _server(d: dict, num_classes: int | None, feature_shape: tuple) -> data_lib.Dataset:
    """``data.server_dataset`` (resized by ``data.image_size``), checked against the agents'
    classes (``num_classes``; None: any) and feature shape."""
    server, size = d["server_dataset"], d.get("image_size", 0)
    srv = _load(server, d.get("server_dataset_options", {}), "data.server_dataset_options")
    if size:
        srv = _resized(srv, size)
    if num_classes is not None and srv.num_classes != num_classes:
        raise ConfigError(f"data.server_dataset {server!r} has {srv.num_classes} "
                          f"classes but data.dataset has {num_classes}")
    if srv.feature_shape != feature_shape:
        raise ConfigError(
            f"data.server_dataset {server!r} has feature shape {srv.feature_shape} but "
            f"data.dataset has {feature_shape}; set data.image_size to a common size")
    return srv


def partition_indices(d: dict, dataset: AnyDataset, key) -> list:
    """The agents' training-record indices for a resolved ``[data]`` table.

    ``partition = "by_domain"`` uses the dataset's own training domains (e.g. mnist5k_oddeven's
    (even, odd) digit pairs) unless ``partition_options.domains`` is given; so does ``partition =
    "natural"`` (one agent per client id, e.g. fedprox_synthetic's clients)."""
    options = dict(d["partition_options"])
    if d["partition"] in ("by_domain", "natural") and "domains" not in options:
        if dataset.domain_train is None:
            raise ConfigError(f"data.partition = \"{d['partition']}\" needs a dataset with "
                              f"training domains (client ids); {dataset.name!r} has none")
        options["domains"] = dataset.domain_train
    try:
        return data_lib.partition(d["partition"], dataset.y_train, d["num_agents"], key,
                                  **options)
    except ValueError as e:            # name the config key the partitioner's argument came from
        msg = str(e)
        if msg.startswith("num_agents"):
            raise ConfigError(f"data.{msg}") from None
        first = msg.split(" ", 1)[0]
        if first in options:
            raise ConfigError(f"data.partition_options.{msg}") from None
        raise


def hold_out(dataset: AnyDataset, fraction: float, key) -> tuple[AnyDataset, np.ndarray,
                                                                 np.ndarray]:
    """``(dataset without the held-out records, x_val, y_val)``: ``round(fraction n)`` (>= 1)
    training records drawn uniformly with ``key``; the rest keep their order. A streamed
    dataset's features are not copied: its stream skips the held-out records."""
    n = len(dataset.y_train)
    m = max(1, int(round(fraction * n)))
    if m >= n:
        raise ConfigError(f"data.validation_fraction = {fraction} leaves no training record of {n}")
    perm = np.asarray(jax.random.permutation(key, n))
    return _without(dataset, perm[:m], np.sort(perm[m:]))


def hold_out_per_agent(dataset: AnyDataset, parts: list, fraction: float, key
                       ) -> tuple[AnyDataset, list, np.ndarray, np.ndarray]:
    """``data.validation_split = "per_agent"``: every agent holds out
    ``m_i = max(1, round(fraction n_i))`` of its own ``n_i`` records (the partition ``parts`` is
    drawn first, on the whole training split).

    Record r gets a score ``u_r ~ U[0, 1)`` (``jax.random.uniform(key, [n])[r]``) and agent i holds
    out its m_i records of smallest score (:func:`fedjax_dp.data.splits.per_group_holdout`), so the
    held-out records depend only on ``key`` and each agent's set of records. Returns ``(dataset
    without the held-out records, the agents' remaining records as indices into it (each agent's in
    its partition order), x_val, y_val)``; the validation records are pooled, agent after agent."""
    counts = np.fromiter((np.size(q) for q in parts), np.int64, count=len(parts))     # [N]
    flat = np.concatenate([np.asarray(q, np.int64) for q in parts])                  # [sum]
    n = len(dataset.y_train)
    scores = np.asarray(jax.random.uniform(key, (n,)))[flat]
    try:
        held, m = splits.per_group_holdout(counts, scores, fraction)
    except ValueError as e:
        raise ConfigError(
            f"data.validation_fraction = {fraction} with data.validation_split = \"per_agent\" "
            f"leaves an agent no training record ({str(e).replace('group', 'agent')}); lower "
            f"the fraction or use data.validation_split = \"pooled\"") from None
    val = flat[held]
    kept = np.ones(n, bool)
    kept[val] = False
    new_index = np.cumsum(kept) - 1                                 # [n] old -> new index
    rest = new_index[flat[~held]]
    reduced, x_val, y_val = _without(dataset, val, np.flatnonzero(kept))
    return reduced, np.split(rest, np.cumsum(counts - m)[:-1]), x_val, y_val


def _without(dataset: AnyDataset, val: np.ndarray, keep: np.ndarray
             ) -> tuple[AnyDataset, np.ndarray, np.ndarray]:
    """``(dataset with only the training records keep (sorted), x_train[val], y_train[val])``."""
    if isinstance(dataset, data_lib.StreamedDataset):
        return dataset.subset(keep), dataset.rows(val), dataset.y_train[val]
    dom = None if dataset.domain_train is None else dataset.domain_train[keep]
    reduced = data_lib.Dataset(name=dataset.name, x_train=dataset.x_train[keep],
                               y_train=dataset.y_train[keep], x_public=dataset.x_public,
                               y_public=dataset.y_public, x_test=dataset.x_test,
                               y_test=dataset.y_test, num_classes=dataset.num_classes,
                               domain_train=dom)
    return reduced, dataset.x_train[val], dataset.y_train[val]


def frozen_features(dataset: AnyDataset, spec: dict) -> AnyDataset:
    """``data.features`` (``{}``: ``dataset`` unchanged): a fixed map fitted on the PUBLIC split
    only, every split mapped before the hold-out and the partition
    (:func:`fedjax_dp.data.features.frozen`). The public split is not private under the
    papers' threat model, so no algorithm's privacy accounting changes."""
    if not spec:
        return dataset
    from fedjax_dp.data import features
    try:
        return features.frozen(dataset, spec)
    except ValueError as e:
        raise ConfigError(str(e).splitlines()[0]) from None


_SOURCE_KEYS = ("dataset", "dataset_options", "image_size", "server_dataset",
                "server_dataset_options", "features")
_SOURCE_MEMO: dict[str, AnyDataset] = {}
_SOURCE_MEMO_BYTES = 256 << 20


def _source(d: dict) -> AnyDataset:
    """``frozen_features(load_data(d, stream=True), d["features"])``, memoised (one entry) on the
    ``[data]`` keys it reads, so the runs of a sweep that share a dataset load it and fit its
    features once. Not memoised: streamed sources and splits over 256 MiB (kept alive past the
    hold-out, they would raise the run's peak memory). The memoised splits are made read-only."""
    key = json.dumps({k: d.get(k) for k in _SOURCE_KEYS}, sort_keys=True, default=str)
    if key in _SOURCE_MEMO:
        return _SOURCE_MEMO[key]
    dataset = frozen_features(load_data(d, stream=True), d.get("features", {}))
    x = getattr(dataset, "x_train", None)
    if getattr(dataset, "draw", None) is None and isinstance(x, np.ndarray) \
            and x.nbytes <= _SOURCE_MEMO_BYTES:
        for f in dataclasses.fields(dataset):                  # shared: a write would leak
            v = getattr(dataset, f.name)
            if isinstance(v, np.ndarray):
                v.setflags(write=False)
        _SOURCE_MEMO.clear()
        _SOURCE_MEMO[key] = dataset
    return dataset


def build(config: dict, *, path=None) -> Population:
    """The population of a resolved config, placed by ``run.agents_on`` (the seed's root key
    drives the hold-out and the partition). ``path``: write the agents there as memory-mapped
    ``.npy`` files (:func:`save`) instead of host memory."""
    d = config["data"]
    if d["dataset"].startswith(data_lib.STACKED_PREFIX):
        if path is not None:
            raise ConfigError("a stacked population is saved already")
        dataset, agents = load_population(d)
        return Population(dataset=dataset, agents=place(agents, config["run"]["agents_on"]))
    root = rng.as_key(config["seed"])
    dataset = _source(d)
    x_val = y_val = None
    fraction = d.get("validation_fraction", 0.0)
    per_agent = d.get("validation_split", "pooled") == "per_agent"
    seed = d.get("validation_seed", -1)                          # -1: the run's seed
    val_key = rng.stream(root if seed < 0 else rng.as_key(seed), "validation")
    if fraction and not per_agent:
        dataset, x_val, y_val = hold_out(dataset, fraction, val_key)
    part_key = rng.stream(root, "partition")
    if fraction and per_agent:
        parts = partition_indices(d, dataset, part_key)
        dataset, parts, x_val, y_val = hold_out_per_agent(dataset, parts, fraction, val_key)
        rows = record_rows(parts, len(dataset.y_train))
        del parts                                                  # the N index arrays freed
        _trim_heap()
    else:
        rows = partition_rows(d, dataset, part_key)
    draw = getattr(dataset, "draw", None)
    if draw is not None and path is None:
        # generated where consumed: on the device (device-resident agents) or chunk by chunk
        # on the device into host rows; never a stream of all records on the host
        on = config["run"]["agents_on"]
        if on == "auto":
            on = auto_placement(_stacked_bytes(rows, dataset))
        agents = stack_drawn(draw, dataset.y_train, rows, on=on, check=False)  # rows: valid
        return Population(dataset=dataset, agents=agents, x_val=x_val, y_val=y_val)
    agents = stack_records(data_lib.train_blocks(dataset), dataset.y_train, rows, path=path)
    del rows
    if path is None:
        agents = place(agents, config["run"]["agents_on"])
    return Population(dataset=dataset, agents=agents, x_val=x_val, y_val=y_val)


def _stacked_bytes(rows, dataset: AnyDataset) -> int:
    """The bytes of the stacked arrays of ``rows`` (float32 features, int32 labels, a bool mask,
    int32 counts): what ``run.agents_on = "auto"`` weighs (:func:`fedjax_dp.core.auto_placement`).
    """
    slots = rows.num_agents * rows.n_max
    return slots * (4 * int(np.prod(dataset.feature_shape)) + 4 + 1) + 4 * rows.num_agents


def partition_rows(d: dict, dataset: AnyDataset, key):
    """:func:`partition_indices` as :class:`~fedjax_dp.core.stacked.RecordRows` (the same
    partition; ``iid`` without the N index arrays, :func:`fedjax_dp.data.partition.iid_rows`)."""
    if d["partition"] == "iid" and not d["partition_options"]:
        try:
            return data_lib.partition_rows("iid", dataset.y_train, d["num_agents"], key)
        except ValueError as e:
            msg = str(e)
            if msg.startswith("num_agents"):
                raise ConfigError(f"data.{msg}") from None
            raise
    parts = partition_indices(d, dataset, key)
    rows = record_rows(parts, len(dataset.y_train))
    del parts                                                      # the N index arrays freed
    _trim_heap()
    return rows


def _trim_heap() -> None:
    """Hand freed heap pages back to the OS (glibc ``malloc_trim``; elsewhere nothing): the N
    small index arrays of a partition of many agents leave ~0.2 GB of holes at N = 10^6 that the
    stacked arrays (one large mapping) cannot reuse."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def save(config: dict, path) -> Population:
    """Build a config's population straight into the folder ``path`` (memory-mapped ``x.npy``,
    ``y.npy``, ``counts.npy``) with the server's splits in ``server.npz`` beside it, for
    ``data.dataset = "stacked:PATH"``. Returns the (memory-mapped) population."""
    pop = build(config, path=path)
    write_server(path, pop.dataset)
    return pop


def write_server(path, dataset: AnyDataset) -> None:
    """``path/server.npz``: the public and test splits, ``num_classes`` and the name of
    ``dataset`` (what a stacked population needs beside its agents)."""
    Path(path).mkdir(parents=True, exist_ok=True)
    np.savez(Path(path) / SERVER_FILE, x_public=dataset.x_public, y_public=dataset.y_public,
             x_test=dataset.x_test, y_test=dataset.y_test,
             num_classes=np.int64(dataset.num_classes), name=np.str_(dataset.name))


def save_population(path, agents: StackedData, dataset: AnyDataset) -> None:
    """Save already stacked ``agents`` (:func:`fedjax_dp.core.save_stacked`) and ``dataset``'s
    server splits beside them, for ``data.dataset = "stacked:PATH"``."""
    save_stacked(path, agents)
    write_server(path, dataset)


def load_population(d: dict) -> tuple[data_lib.StreamedDataset, StackedData]:
    """``(splits, agents)`` of ``data.dataset = "stacked:PATH"`` (memory-mapped agents; the
    splits' training records are the agents' real rows). One-line ConfigErrors name the key."""
    spec = d["dataset"]
    folder = Path(spec[len(data_lib.STACKED_PREFIX):]).expanduser()
    where = f"data.dataset = {spec!r}"
    if not folder.exists():
        raise ConfigError(f"{where}: {str(folder)!r} does not exist "
                          f"(a relative path is read from {str(Path.cwd())!r})")
    missing = [n for n in _STACKED_FILES if not (folder / n).is_file()]
    if missing:
        raise ConfigError(f"{where}: {str(folder)!r} is not a stacked population (missing "
                          f"{', '.join(missing)}; write one with fedjax_dp.data.population.save "
                          f"or fedjax_dp.core.save_stacked)")
    _check_stacked_keys(d)
    _check_files(folder, where)
    try:
        agents = load_stacked(folder)
    except (ValueError, OSError, EOFError) as e:
        raise ConfigError(f"{where}: {str(folder)!r} is not a valid stacked "
                          f"population: {str(e).splitlines()[0]}") from None
    if np.dtype(agents.x.dtype).kind not in "biuf":
        raise ConfigError(f"{where}: {str(folder / 'x.npy')!r} holds {agents.x.dtype} "
                          f"features; a population's features are numbers (float32 or int32)")
    check_converted(folder, agents, where)
    if agents.num_agents != d["num_agents"]:
        raise ConfigError(f"data.num_agents = {d['num_agents']} but {where} holds "
                          f"{agents.num_agents} agents; set data.num_agents={agents.num_agents}")
    if d.get("server_dataset", ""):
        srv = _server(d, None, agents.feature_shape)
        splits = dict(x_public=srv.x_public, y_public=srv.y_public, x_test=srv.x_test,
                      y_test=srv.y_test, num_classes=srv.num_classes,
                      name=f"{folder.name}->{srv.name}")
    elif (folder / SERVER_FILE).is_file():
        splits = _read_server(folder / SERVER_FILE, where)
    else:
        raise ConfigError(f"{where}: {str(folder)!r} holds no {SERVER_FILE} (the "
                          f"public and test splits; population.save writes it); "
                          f"set data.server_dataset to take them from a dataset")
    mask = np.asarray(agents.mask)

    def blocks(size: int):
        step = max(1, size // max(1, agents.max_size))
        for a in range(0, agents.num_agents, step):
            yield np.asarray(agents.x[a:a + step])[mask[a:a + step]]

    task = _task(folder, where)
    if task is not None:
        splits["task"] = task
    try:
        dataset = data_lib.StreamedDataset(y_train=np.asarray(agents.y)[mask], blocks=blocks,
                                           feature_shape=agents.feature_shape, **splits)
    except ValueError as e:
        raise ConfigError(f"{where}: {str(e).splitlines()[0]}") from None
    return dataset, agents


def _check_files(folder: Path, where: str) -> None:
    """The population's files are regular files inside ``folder``: a symlink out of it is
    refused (:func:`fedjax_dp.core.files.regular_file`), naming the file."""
    from fedjax_dp.core import files
    for name in (*_STACKED_FILES, SERVER_FILE, "clients.json", "task.json"):
        path = folder / name
        if name in _STACKED_FILES or os.path.lexists(path):
            try:
                files.regular_file(path, root=folder, what="population file")
            except ValueError as e:
                raise ConfigError(f"{where}: {e}") from None


def _read_server(path: Path, where: str) -> dict:
    """The public and test splits of ``server.npz`` (arrays only: ``allow_pickle=False``, its
    declared size at most the memory this host has free), or a one-line ConfigError."""
    import zipfile
    from fedjax_dp.core import memory
    try:
        with zipfile.ZipFile(path) as zf:
            size = sum(i.file_size for i in zf.infolist())
        free = memory._host_available()
        if free is not None and size > free:
            raise ValueError(f"its arrays take {memory.format_bytes(size)}, more than the "
                             f"{memory.format_bytes(free)} of memory free")
        with np.load(path, allow_pickle=False) as z:
            splits = {k: z[k] for k in ("x_public", "y_public", "x_test", "y_test")}
            for k, v in splits.items():
                if v.dtype.kind not in "biuf" or v.ndim < 1:
                    raise ValueError(f"{k} is a {v.dtype} array of shape {list(v.shape)}, not "
                                     f"records")
            num_classes, name = z["num_classes"], z["name"]
            if num_classes.shape != () or num_classes.dtype.kind not in "iu" or \
                    name.shape != () or name.dtype.kind != "U":
                raise ValueError("num_classes must be one integer and name one string")
            splits.update(num_classes=int(num_classes), name=str(name))
    except KeyError as e:
        raise ConfigError(f"{where}: {str(path)!r} has no array {e} (the public and test "
                          f"splits; population.save writes them)") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise ConfigError(f"{where}: {str(path)!r} is not a server split archive: "
                          f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    return splits


def check_converted(folder: Path, agents: StackedData, where: str) -> None:
    """A converted population read back agrees with its ``clients.json`` (when it has one):
    the number of client ids, ``clients``, ``train_records``, ``n_max`` and ``feature_shape``
    stated there are the memory-mapped arrays' (a folder edited, or mixed from two conversions,
    is refused naming the file, the key and both values)."""
    path = folder / "clients.json"
    if not path.is_file():
        return
    from fedjax_dp.core import files
    try:
        meta = files.read_json(path, max_bytes=MAX_META_BYTES, root=folder,
                               what="population file", expect=dict)
    except ValueError as e:
        raise ConfigError(f"{where}: {e}") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("train"), list):
        raise ConfigError(f"{where}: {str(path)!r} must be a table holding the 'train' list "
                          f"of client ids")
    held = {"train": (len(meta["train"]), agents.num_agents, "agents (x.npy's first axis)"),
            "clients": (meta.get("clients"), agents.num_agents, "agents"),
            "train_records": (meta.get("train_records"), int(np.asarray(agents.counts).sum()),
                              "records (the sum of counts.npy)"),
            "n_max": (meta.get("n_max"), agents.max_size, "rows per agent (x.npy's 2nd axis)"),
            "feature_shape": (meta.get("feature_shape"), list(agents.feature_shape),
                              "as x.npy's feature shape")}
    for key, (stated, actual, what) in held.items():
        if key in meta and stated != actual:
            shown = f"{stated} client ids" if key == "train" else f"{key} = {stated!r}"
            raise ConfigError(f"{where}: {str(path)!r} states {shown} but the arrays hold "
                              f"{actual} {what}: the folder's files disagree (convert again)")


def _task(folder: Path, where: str):
    """The task saved beside a stacked population (``task.json``, written by
    ``fedjax-dp data convert`` for next-token data), or None (classification)."""
    if not (folder / "task.json").is_file():
        return None
    from fedjax_dp.models import tasks
    try:
        return tasks.load(folder)
    except ValueError as e:
        raise ConfigError(f"{where}: {str(e).splitlines()[0]}") from None
