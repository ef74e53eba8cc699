"""The :class:`Dataset` container: fixed train / public / test splits of one classification task.

Layout::

    x_train       [n_train, *feature_shape]   float32  records the agents partition among them
    y_train       [n_train]                   int32    labels in [0, num_classes)
    x_public      [n_public, *feature_shape]  float32  the server's UNLABELLED data (queries)
    y_public      [n_public]                  int32    diagnostics only (see below)
    x_test        [n_test, *feature_shape]    float32  held-out evaluation set
    y_test        [n_test]                    int32
    domain_train  [n_train] int64 or None              domain id per record (for by_domain)

A next-token task (``task = NextToken(...)``, :mod:`fedjax_dp.models.tasks`) holds sequences
instead: ``x_* [n, T]`` int32 input token ids and ``y_* [n, T]`` int32 target ids (the next
token; ``pad_id`` where there is none), ``num_classes`` = the vocabulary size.

``y_public`` exists only so that experiments can *report* how accurate a vote or a teacher ensemble
was on the public queries. The public split models data the server holds without labels: algorithms
must never train on, select with, or otherwise read ``y_public``."""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from fedjax_dp.core import validation
from fedjax_dp.models import tasks as tasks_lib


def check_task(task: tasks_lib.Task | None) -> tasks_lib.Task:
    """A dataset's ``task``: None (classification), a Classification or a NextToken task."""
    if task is not None and not isinstance(task, (tasks_lib.Classification, tasks_lib.NextToken)):
        raise ValueError(f"task must be a fedjax_dp.models.tasks.Classification or NextToken "
                         f"(or None), got {type(task).__name__}")
    return tasks_lib.CLASSIFICATION if task is None else task


def store_splits(obj, task: tasks_lib.Task, num_classes: int, splits: tuple[str, ...],
                 feature_shape: tuple | None = None) -> None:
    """Each split ``x_<s>`` / ``y_<s>`` of the frozen ``obj`` checked by ``task.check_split`` and
    stored converted; all share one feature shape (``feature_shape``, else the first split's)."""
    for split in splits:
        xname, yname = f"x_{split}", f"y_{split}"
        x, y = task.check_split((xname, yname), getattr(obj, xname), getattr(obj, yname),
                                num_classes)
        if feature_shape is None:
            feature_shape = x.shape[1:]
        elif x.shape[1:] != feature_shape:
            raise ValueError(f"{xname} has feature shape {x.shape[1:]}, expected "
                             f"{feature_shape} (all splits must share one feature shape)")
        object.__setattr__(obj, xname, x)
        object.__setattr__(obj, yname, y)


def store_domain(obj, reference: str) -> None:
    """``obj.domain_train`` (None, or int64 ``[n_train]`` domain ids, as long as the training
    split ``reference``) checked and stored as int64."""
    if obj.domain_train is None:
        return
    d = np.asarray(obj.domain_train)
    if d.ndim != 1:
        raise ValueError(f"domain_train must be 1-D, got shape {d.shape}")
    validation.check_same_length(("domain_train", reference), d, getattr(obj, reference))
    if d.size and d.dtype.kind not in "iu":
        raise ValueError(f"domain_train must hold integer domain ids, got dtype {d.dtype}")
    object.__setattr__(obj, "domain_train", d.astype(np.int64, copy=False))


@dataclasses.dataclass(frozen=True)
class Dataset:
    """A classification task split into train (the agents' data), public (server) and test sets.

    Features are converted to float32, labels to int32. Construction validates matching x/y lengths,
    one feature shape, labels in ``[0, num_classes)`` and finite features (ValueError). ``task``
    (None: classification): with a ``NextToken`` task x and y are ``[n, T]`` int32 token ids in
    ``[0, num_classes)``."""

    name: str
    x_train: np.ndarray    # [n_train, *feature_shape] float32
    y_train: np.ndarray    # [n_train] int32
    x_public: np.ndarray   # [n_public, *feature_shape] float32 (unlabelled for algorithms)
    y_public: np.ndarray   # [n_public] int32 -- diagnostics only, never for training
    x_test: np.ndarray     # [n_test, *feature_shape] float32
    y_test: np.ndarray     # [n_test] int32
    num_classes: int
    domain_train: np.ndarray | None = None  # [n_train] int64 domain id per training record
    task: tasks_lib.Task | None = None      # None: classification (fedjax_dp.models.tasks)

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name must be a non-empty string, got {self.name!r}")
        num_classes = validation.check_int("num_classes", self.num_classes, minimum=1)
        object.__setattr__(self, "num_classes", num_classes)
        task = check_task(self.task)
        store_splits(self, task, num_classes, ("train", "public", "test"))
        if len(self.x_train) == 0:
            raise ValueError("x_train must hold at least one record, got 0")
        store_domain(self, "x_train")

    @property
    def feature_shape(self) -> tuple[int, ...]:
        """Shape of one record, e.g. ``(8, 8, 1)`` for digits or ``(30,)`` for wbcd."""
        return tuple(int(s) for s in self.x_train.shape[1:])

    @property
    def num_features(self) -> int:
        """Number of scalar features per record (the product of ``feature_shape``)."""
        return int(math.prod(self.feature_shape))

    @property
    def sizes(self) -> dict[str, int]:
        """Number of records per split: ``{"train": ..., "public": ..., "test": ...}``."""
        return {"train": len(self.y_train), "public": len(self.y_public),
                "test": len(self.y_test)}

    def __repr__(self) -> str:  # the default repr would print every array
        s = self.sizes
        return (f"Dataset(name={self.name!r}, feature_shape={self.feature_shape}, "
                f"num_classes={self.num_classes}, "
                + (f"task={self.task.kind}, " if self.task is not None else "")
                + f"train={s['train']}, public={s['public']}, "
                f"test={s['test']}, domains={'yes' if self.domain_train is not None else 'no'})")
