"""Partitioners: split a training set among N agents.

Every partitioner is deterministic given ``seed_or_key`` (an int seed or a JAX PRNG key, turned
into a numpy Generator by :func:`fedjax_dp.core.rng.numpy_rng`) and returns ``list[np.ndarray]``:
one sorted int64 index array per agent, pairwise disjoint (each record goes to at most one
agent). Feed the result to :func:`fedjax_dp.core.stacked.from_partition`.

===============  =============================================================  =========
name             rule                                                           covers all
===============  =============================================================  =========
iid              shuffle, then near-equal contiguous chunks                      yes
dirichlet        FedKT / NIID-Bench label skew, Dir(beta) per class              yes
label_shards     each agent holds exactly ``classes_per_agent`` classes          no [1]_
one_class        ``label_shards`` with 1 (or 2) classes per agent                no [1]_
by_domain        agents formed within each domain id                             yes
natural          one agent per client id (the dataset's own clients)             yes
===============  =============================================================  =========

.. [1] all records of every held class are used unless ``samples_per_agent`` caps them;
   classes that no agent holds (fewer agent slots than classes) are left out.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable

import numpy as np

from fedjax_dp.core import validation
from fedjax_dp.core.rng import numpy_rng
from fedjax_dp.core.stacked import RecordRows, record_rows


# ----------------------------------------------------------------------------- input checks

def _rng(seed_or_key: Any) -> np.random.Generator:
    """A numpy Generator from an int seed (>= 0) or a JAX key; ValueError for anything else."""
    if isinstance(seed_or_key, (bool, np.bool_)) or seed_or_key is None:
        raise ValueError(f"seed_or_key must be an int seed or a JAX PRNG key, got {seed_or_key!r}")
    if isinstance(seed_or_key, (int, np.integer)):
        validation.check_int("seed_or_key", seed_or_key, minimum=0)
    try:
        return numpy_rng(seed_or_key)
    except Exception as e:  # not an int and not something jax can read as a key
        raise ValueError(f"seed_or_key must be an int seed or a JAX PRNG key, got "
                         f"{type(seed_or_key).__name__}: {e}") from e


def _ids(name: str, values: Any) -> np.ndarray:
    """A non-empty 1-D integer array (labels or domain ids)."""
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name} must hold at least one record, got 0")
    if arr.dtype.kind == "f" and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
        arr = arr.astype(np.int64)
    if arr.dtype.kind not in "iu":
        raise ValueError(f"{name} must hold integers, got dtype {arr.dtype}")
    return arr.astype(np.int64)


def _labels(labels: Any) -> np.ndarray:
    """Class labels: non-empty, 1-D, integer, >= 0."""
    arr = _ids("labels", labels)
    if arr.min() < 0:
        raise ValueError(f"labels must be >= 0, got minimum {arr.min()}")
    return arr


def _num_agents(num_agents: Any, n: int) -> int:
    return validation.check_int("num_agents", num_agents, minimum=1, maximum=n)


def _finish(parts: list) -> list[np.ndarray]:
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


# ----------------------------------------------------------------------------- partitioners

def iid(labels_or_n: Any, num_agents: int, seed_or_key: Any) -> list[np.ndarray]:
    """Uniformly random partition into ``num_agents`` near-equal parts (sizes differ by <= 1).

    ``labels_or_n`` is the label array (only its length is used) or the record count itself. Covers
    every index exactly once."""
    if isinstance(labels_or_n, (int, np.integer)) and not isinstance(labels_or_n, bool):
        n = validation.check_int("labels_or_n", labels_or_n, minimum=1)
    else:
        n = len(_ids("labels_or_n", labels_or_n))
    num_agents = _num_agents(num_agents, n)
    perm = _rng(seed_or_key).permutation(n)  # [n]
    return _finish(np.array_split(perm, num_agents))


def iid_rows(labels_or_n: Any, num_agents: int, seed_or_key: Any) -> RecordRows:
    """:func:`iid` as its :class:`~fedjax_dp.core.stacked.RecordRows` (``record_rows(iid(...))``,
    the same partition) without the N index arrays: a reshape and one ``sort(axis=1)``."""
    if isinstance(labels_or_n, (int, np.integer)) and not isinstance(labels_or_n, bool):
        n = validation.check_int("labels_or_n", labels_or_n, minimum=1)
    else:
        n = len(_ids("labels_or_n", labels_or_n))
    num_agents = _num_agents(num_agents, n)
    dtype = np.int32 if n < 2 ** 31 else np.int64
    perm = _rng(seed_or_key).permutation(n).astype(dtype)      # [n]
    q, big = divmod(n, num_agents)     # array_split: the first `big` parts hold q + 1 records
    n_max = q + (big > 0)
    records = np.full((num_agents, n_max), -1, dtype)
    if big:
        head = perm[:big * (q + 1)].reshape(big, q + 1)
        head.sort(axis=1)
        records[:big] = head
    tail = perm[big * (q + 1):].reshape(num_agents - big, q)
    tail.sort(axis=1)
    records[big:, :q] = tail
    counts = np.full(num_agents, q, np.int32)
    counts[:big] += 1
    return RecordRows(records=records, counts=counts)


def partition_rows(name: str, labels: Any, num_agents: int, seed_or_key: Any,
                   **kwargs) -> RecordRows:
    """:func:`partition` as :class:`~fedjax_dp.core.stacked.RecordRows` (the same partition:
    ``record_rows(partition(...), len(labels))``); ``iid`` is built without per-agent arrays
    (:func:`iid_rows`)."""
    if name == "iid" and not kwargs:
        return iid_rows(labels, num_agents, seed_or_key)
    parts = partition(name, labels, num_agents, seed_or_key, **kwargs)
    return record_rows(parts, len(labels))


#: The most draws a Dirichlet partition tries for its ``min_size`` (each costs O(records)).
MAX_TRIES = 100_000


def dirichlet(labels: Any, num_agents: int, beta: float, seed_or_key: Any, min_size: int = 10,
              max_tries: int = 1000) -> list[np.ndarray]:
    """FedKT's Dirichlet label-skew partition (the NIID-Bench rule, FedKT spec "Data and defaults").

    For each class k = 0..K-1: shuffle class k's indices, draw ``p ~ Dir(beta * 1_n)``, zero
    ``p_j`` for every agent j that already holds ``>= N / n`` records, renormalise, and split
    the shuffled indices at the cut points ``int(cumsum(p) * n_k)``. The whole draw is repeated
    until every agent holds at least ``min_size`` records. Small ``beta`` gives highly skewed
    label distributions; large ``beta`` approaches IID. Covers every index exactly once.

    Raises ValueError if ``min_size`` is not met within ``max_tries`` draws (or cannot be met at all
    because ``num_agents * min_size`` exceeds the number of records). A draw in which every
    still-eligible agent gets probability exactly 0 (possible for tiny ``beta`` through float
    underflow) counts as a failed draw."""
    labels = _labels(labels)
    n = len(labels)
    num_agents = _num_agents(num_agents, n)
    beta = validation.check_positive("beta", beta, finite=True)
    min_size = validation.check_int("min_size", min_size, minimum=0)
    max_tries = validation.check_int("max_tries", max_tries, minimum=1, maximum=MAX_TRIES)
    if num_agents * min_size > n:
        raise ValueError(f"min_size={min_size} cannot be met: {num_agents} agents x {min_size} "
                         f"records exceeds the {n} records available")
    rng = _rng(seed_or_key)
    num_classes = int(labels.max()) + 1
    class_indices = [np.flatnonzero(labels == k) for k in range(num_classes)]
    cap = n / num_agents  # agents holding >= N/n records get no more

    for _ in range(max_tries):
        chunks: list[list[np.ndarray]] = [[] for _ in range(num_agents)]
        sizes = np.zeros(num_agents, dtype=np.int64)  # [num_agents]
        ok = True
        for k in range(num_classes):
            idx_k = class_indices[k].copy()
            rng.shuffle(idx_k)
            p = rng.dirichlet(np.full(num_agents, beta))  # [num_agents]
            p = p * (sizes < cap)
            total = p.sum()
            if not total > 0:
                ok = False
                break
            p = p / total
            cuts = (np.cumsum(p) * len(idx_k)).astype(int)[:-1]  # [num_agents - 1]
            for j, part in enumerate(np.split(idx_k, cuts)):
                chunks[j].append(part)
                sizes[j] += len(part)
        if ok and sizes.min() >= min_size:
            return _finish([np.concatenate(c) for c in chunks])
    raise ValueError(f"dirichlet partition: min_size={min_size} cannot be met in "
                     f"max_tries={max_tries} draws (beta={beta}, num_agents={num_agents}, "
                     f"{n} records); lower min_size or num_agents, or raise beta")


def label_shards(labels: Any, num_agents: int, classes_per_agent: int, seed_or_key: Any,
                 samples_per_agent: int | None = None) -> list[np.ndarray]:
    """Pathological non-IID split: every agent holds exactly ``classes_per_agent`` classes.

    E.g. 6 of the 10 digits per agent (voting-DPFL's non-IID MNIST). Classes are dealt
    round-robin over one shuffled class order: agent i holds ``order[(i*c + j) mod C]`` for
    j < c, so the c classes are distinct and every class is held by ``floor`` or ``ceil`` of
    ``N*c/C`` agents. Each class's shuffled records are then split disjointly among its holders:
    all of them in near-equal parts by default, or, with ``samples_per_agent = s``, ``s`` records
    per agent spread evenly over its c classes (``s // c`` each, the first ``s % c`` classes one
    more). Raises ValueError when a class has too few records for its holders.
    """
    labels = _labels(labels)
    n = len(labels)
    num_agents = _num_agents(num_agents, n)
    classes = np.unique(labels)  # [C]
    c = validation.check_int("classes_per_agent", classes_per_agent, minimum=1,
                             maximum=len(classes))
    if samples_per_agent is not None:
        samples_per_agent = validation.check_int("samples_per_agent", samples_per_agent,
                                                 minimum=c)
    rng = _rng(seed_or_key)
    order = rng.permutation(classes)  # [C]
    holders: dict[int, list[tuple[int, int]]] = {int(k): [] for k in classes}  # k -> [(agent, j)]
    for i in range(num_agents):
        for j in range(c):
            holders[int(order[(i * c + j) % len(classes)])].append((i, j))

    parts: list[list[np.ndarray]] = [[] for _ in range(num_agents)]
    for k in classes:
        idx_k = rng.permutation(np.flatnonzero(labels == k))
        owners = holders[int(k)]
        if not owners:
            continue
        if samples_per_agent is None:
            if len(idx_k) < len(owners):
                raise ValueError(
                    f"class {k} has {len(idx_k)} records but {len(owners)} agents hold it; "
                    "lower num_agents or classes_per_agent")
            pieces = np.array_split(idx_k, len(owners))
        else:
            base, extra = divmod(samples_per_agent, c)
            demand = [base + (j < extra) for _, j in owners]
            if sum(demand) > len(idx_k):
                raise ValueError(
                    f"class {k} has {len(idx_k)} records but its {len(owners)} holders need "
                    f"{sum(demand)} (samples_per_agent={samples_per_agent}); lower "
                    "samples_per_agent, num_agents or classes_per_agent")
            pieces = np.split(idx_k[:sum(demand)], np.cumsum(demand)[:-1])
        for (i, _), piece in zip(owners, pieces):
            parts[i].append(piece)
    return _finish([np.concatenate(p) for p in parts])


def one_class(labels: Any, num_agents: int, seed_or_key: Any, classes_per_agent: int = 1,
              samples_per_agent: int | None = None) -> list[np.ndarray]:
    """Extreme label skew: each agent holds a single class (or a class pair with 2).

    :func:`label_shards` with ``classes_per_agent`` 1 (default) or 2."""
    classes_per_agent = validation.check_int("classes_per_agent", classes_per_agent, minimum=1,
                                             maximum=2)
    return label_shards(labels, num_agents, classes_per_agent, seed_or_key,
                        samples_per_agent=samples_per_agent)


def by_domain(domains: Any, seed_or_key: Any = None, agents_per_domain: int = 1
              ) -> list[np.ndarray]:
    """Agents formed within domains: each domain's records are split IID among its agents.

    Agents are ordered domain by domain (sorted domain ids), ``agents_per_domain`` per domain, so
    agent ``i`` belongs to domain ``sorted(unique(domains))[i // agents_per_domain]``. Without
    ``seed_or_key`` the split is the contiguous, unshuffled one. Covers every index."""
    domains = _ids("domains", domains)
    per = validation.check_int("agents_per_domain", agents_per_domain, minimum=1)
    rng = None if seed_or_key is None else _rng(seed_or_key)
    parts = []
    for d in np.unique(domains):
        idx = np.flatnonzero(domains == d)
        if len(idx) < per:
            raise ValueError(f"domain {d} has {len(idx)} records, fewer than "
                             f"agents_per_domain={per}")
        if rng is not None:
            idx = rng.permutation(idx)
        parts.extend(np.array_split(idx, per))
    return _finish(parts)


def natural(domains: Any, num_agents: int | None = None) -> list[np.ndarray]:
    """The dataset's own clients as agents: agent ``i`` holds exactly the records whose client id
    is the ``i``-th smallest of ``unique(domains)`` (e.g. ``domain_train`` of
    :func:`fedjax_dp.data.fedprox_synthetic.fedprox_synthetic`: one agent per FedProx device).

    ``num_agents`` (None: the number of clients) must equal the number of distinct client ids.
    Deterministic; covers every index."""
    domains = _ids("domains", domains)
    order = np.argsort(domains, kind="stable")                         # [n] grouped by client
    ids, counts = np.unique(domains, return_counts=True)               # [K], [K]
    if num_agents is not None:
        num_agents = validation.check_int("num_agents", num_agents, minimum=1)
        if num_agents != len(ids):
            raise ValueError(f"num_agents must equal the number of clients ({len(ids)}) for the "
                             f"natural partition (one agent per client id), got {num_agents}")
    return np.split(order.astype(np.int64), np.cumsum(counts)[:-1])


# ----------------------------------------------------------------------------- diagnostics

def class_counts(labels: Any, parts: list[np.ndarray], num_classes: int | None = None
                 ) -> np.ndarray:
    """Per-agent label histogram ``[num_agents, num_classes]`` (int64) of a partition."""
    labels = _labels(labels)
    num_classes = int(labels.max()) + 1 if num_classes is None else num_classes
    return np.stack([np.bincount(labels[np.asarray(p, dtype=np.int64)], minlength=num_classes)
                     for p in parts])


# ----------------------------------------------------------------------------- registry

def _dirichlet_dispatch(labels: Any, num_agents: int, seed_or_key: Any, *, beta: float,
                        min_size: int = 10, max_tries: int = 1000) -> list[np.ndarray]:
    """:func:`dirichlet` behind the common signature (``beta`` by keyword)."""
    return dirichlet(labels, num_agents, beta, seed_or_key, min_size=min_size,
                     max_tries=max_tries)


def _label_shards_dispatch(labels: Any, num_agents: int, seed_or_key: Any, *,
                           classes_per_agent: int,
                           samples_per_agent: int | None = None) -> list[np.ndarray]:
    """:func:`label_shards` behind the common signature (``classes_per_agent`` by keyword)."""
    return label_shards(labels, num_agents, classes_per_agent, seed_or_key,
                        samples_per_agent=samples_per_agent)


def _by_domain_dispatch(labels: Any, num_agents: int, seed_or_key: Any, *,
                        domains: Any) -> list[np.ndarray]:
    """:func:`by_domain` behind the common signature: ``num_agents`` must be a multiple of the
    number of domains, and ``domains`` (one id per record of ``labels``) is required."""
    domains = _ids("domains", domains)
    validation.check_same_length(("domains", "labels"), domains, np.asarray(labels))
    num_domains = len(np.unique(domains))
    num_agents = validation.check_int("num_agents", num_agents, minimum=1)
    if num_agents % num_domains:
        raise ValueError(f"num_agents must be a multiple of the number of domains "
                         f"({num_domains}) for by_domain, got {num_agents}")
    return by_domain(domains, seed_or_key, agents_per_domain=num_agents // num_domains)


def _natural_dispatch(labels: Any, num_agents: int, seed_or_key: Any, *,
                      domains: Any) -> list[np.ndarray]:
    """:func:`natural` behind the common signature (``domains`` required; the seed is unused)."""
    domains = _ids("domains", domains)
    validation.check_same_length(("domains", "labels"), domains, np.asarray(labels))
    return natural(domains, num_agents)


# name -> fn(labels, num_agents, seed_or_key, **kwargs): the uniform signature of `partition`.
PARTITIONS: dict[str, Callable[..., list[np.ndarray]]] = {
    "iid": iid,
    "dirichlet": _dirichlet_dispatch,        # beta=..., optional min_size=, max_tries=
    "label_shards": _label_shards_dispatch,  # classes_per_agent=..., optional samples_per_agent=
    "one_class": one_class,                  # optional classes_per_agent= (1 or 2)
    "by_domain": _by_domain_dispatch,        # domains=...
    "natural": _natural_dispatch,            # domains=... (one agent per client id)
}


def partition(name: str, labels: Any, num_agents: int, seed_or_key: Any,
              **kwargs) -> list[np.ndarray]:
    """Partition by name with one signature: ``PARTITIONS[name](labels, num_agents, seed, **kw)``.

    Examples: ``partition("dirichlet", y, 10, key, beta=0.5)``,
    ``partition("label_shards", y, 10, 0, classes_per_agent=6)``,
    ``partition("by_domain", y, 4, 0, domains=d)`` (4 agents over 2 domains: 2 per domain).
    """
    if not isinstance(name, str) or name not in PARTITIONS:
        raise ValueError(f"unknown partition {name!r}; valid names are {sorted(PARTITIONS)}")
    fn = PARTITIONS[name]
    try:
        inspect.signature(fn).bind(labels, num_agents, seed_or_key, **kwargs)
    except TypeError as e:  # a missing or unexpected keyword argument
        raise ValueError(f"bad arguments for partition {name!r}: {e}") from e
    return fn(labels, num_agents, seed_or_key, **kwargs)
