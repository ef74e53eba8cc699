"""A dataset whose training features are produced block by block and never held whole.

A :class:`StreamedDataset` is a :class:`~fedjax_dp.data.Dataset` without ``x_train``: it holds the
training labels (``y_train``, ``domain_train``) and the public and test splits, and yields the
training features in record order, in blocks, as often as asked.
:func:`fedjax_dp.core.stack_records` writes such a stream straight into the agents' stacked rows (no
second ``[n_train, ...]`` copy).
:func:`train_blocks` reads either kind of dataset the same way.

A generated source may also draw any of its records directly (``draw``, a
:class:`fedjax_dp.core.stacked.RecordDraw`): then a population is drawn where it is consumed
(:func:`fedjax_dp.core.stacked.stack_drawn`) and :meth:`StreamedDataset.rows` draws only the records
asked for."""
from __future__ import annotations

import dataclasses
from typing import Callable, Iterator

import numpy as np

from fedjax_dp.core import validation
from fedjax_dp.core.stacked import RecordDraw
from fedjax_dp.data import dataset as dataset_lib
from fedjax_dp.data.dataset import Dataset
from fedjax_dp.models import tasks as tasks_lib

#: records per block when a stream is read (4 MiB of float64 features at 32 features)
BLOCK = 1 << 14


@dataclasses.dataclass(frozen=True)
class StreamedDataset:
    """Train (streamed features, held labels) / public / test splits of one classification task.

    ``blocks(size)`` yields float32 ``[<= size, *feature_shape]`` blocks of the training features,
    records ``0 .. n_train - 1`` in order; every call yields the same values whatever ``size``.
    ``task`` as :class:`~fedjax_dp.data.Dataset`'s (None: classification); a next-token task has
    ``y_train [n_train, T]`` and int32 ``[n, T]`` public / test splits, and its blocks are int32
    token ids."""

    name: str
    y_train: np.ndarray                       # [n_train] int32
    blocks: Callable[[int], Iterator[np.ndarray]]
    feature_shape: tuple
    x_public: np.ndarray                      # [n_public, *feature_shape] float32
    y_public: np.ndarray                      # [n_public] int32, diagnostics only
    x_test: np.ndarray                        # [n_test, *feature_shape] float32
    y_test: np.ndarray                        # [n_test] int32
    num_classes: int
    domain_train: np.ndarray | None = None    # [n_train] int64
    task: tasks_lib.Task | None = None        # None: classification (fedjax_dp.models.tasks)
    draw: RecordDraw | None = None            # any record's features directly (the same values)

    def __post_init__(self):
        if self.draw is not None and (self.draw.num_records != len(self.y_train)
                                      or tuple(self.draw.feature_shape) !=
                                      tuple(self.feature_shape)):
            raise ValueError(f"draw must cover the {len(self.y_train)} training records of "
                             f"feature shape {tuple(self.feature_shape)}, got "
                             f"{self.draw.num_records} of {tuple(self.draw.feature_shape)}")
        num_classes = validation.check_int("num_classes", self.num_classes, minimum=1)
        task = dataset_lib.check_task(self.task)
        object.__setattr__(self, "feature_shape", tuple(int(s) for s in self.feature_shape))
        y = (self._sequence_targets(task, num_classes) if isinstance(task, tasks_lib.NextToken)
             else validation.check_labels("y_train", self.y_train, num_classes))  # no copy
        if isinstance(task, tasks_lib.Classification) and (y.ndim != 1 or len(y) == 0):
            raise ValueError(f"y_train must be a non-empty 1-D label array, got {y.shape}")
        object.__setattr__(self, "y_train", y.astype(np.int32, copy=False))
        dataset_lib.store_splits(self, task, num_classes, ("public", "test"), self.feature_shape)
        dataset_lib.store_domain(self, "y_train")

    def _sequence_targets(self, task: tasks_lib.NextToken, num_classes: int) -> np.ndarray:
        """A next-token task's ``y_train [n, T]``, checked like the public and test splits by
        :meth:`~fedjax_dp.models.tasks.NextToken.check_split` (on y alone); ``feature_shape``
        must be ``(T,)``."""
        y = np.asarray(self.y_train)
        if y.ndim != 2 or len(y) == 0:
            raise ValueError(f"y_train must be a non-empty [n, T] array of target ids for a "
                             f"next-token task, got shape {y.shape}")
        _, y = task.check_split(("y_train", "y_train"), y, y, num_classes)
        if self.feature_shape != y.shape[1:]:
            raise ValueError(f"feature_shape {self.feature_shape} must be (T,) = {y.shape[1:]} "
                             f"for a next-token task")
        return y

    sizes = Dataset.sizes

    def subset(self, keep) -> "StreamedDataset":
        """The same task with only the training records ``keep`` (sorted, distinct indices):
        its blocks are the kept rows of this one's, in order (no copy of the features)."""
        keep = np.asarray(keep, dtype=np.int64)
        if keep.size > 1 and np.any(np.diff(keep) <= 0):
            raise ValueError("keep must hold sorted, distinct record indices")
        dom = None if self.domain_train is None else self.domain_train[keep]
        if self.draw is not None:
            draw = self.draw.subset(keep)
            return dataclasses.replace(self, y_train=self.y_train[keep], blocks=drawn_blocks(draw),
                                       domain_train=dom, draw=draw)
        parent = self.blocks

        def blocks(size: int) -> Iterator[np.ndarray]:
            start = 0
            for block in parent(size):
                lo, hi = np.searchsorted(keep, [start, start + len(block)])
                yield block[keep[lo:hi] - start]
                start += len(block)

        return dataclasses.replace(self, y_train=self.y_train[keep], blocks=blocks,
                                   domain_train=dom)

    def rows(self, indices) -> np.ndarray:
        """``x_train[indices]`` (any order), gathered in one pass over the stream."""
        indices = np.asarray(indices, dtype=np.int64)
        if self.draw is not None:                     # only these records are drawn
            return self.draw.rows(indices)
        order = np.argsort(indices, kind="stable")
        wanted = indices[order]
        dtype = np.int32 if isinstance(self.task, tasks_lib.NextToken) else np.float32
        out = np.empty((len(indices),) + self.feature_shape, dtype)
        start = 0
        for block in self.blocks(BLOCK):
            lo, hi = np.searchsorted(wanted, [start, start + len(block)])
            out[order[lo:hi]] = block[wanted[lo:hi] - start]
            start += len(block)
        return out

    def materialize(self) -> Dataset:
        """The whole :class:`Dataset` (the features concatenated: for small streams)."""
        x = np.concatenate(list(self.blocks(BLOCK)))
        return Dataset(name=self.name, x_train=x, y_train=self.y_train, x_public=self.x_public,
                       y_public=self.y_public, x_test=self.x_test, y_test=self.y_test,
                       num_classes=self.num_classes, domain_train=self.domain_train,
                       task=self.task)

    def __repr__(self) -> str:
        s = self.sizes
        return (f"StreamedDataset(name={self.name!r}, feature_shape={self.feature_shape}, "
                f"num_classes={self.num_classes}, train={s['train']}, public={s['public']}, "
                f"test={s['test']})")


def drawn_blocks(draw: RecordDraw) -> Callable[[int], Iterator[np.ndarray]]:
    """``blocks(size)`` of a :class:`~fedjax_dp.core.stacked.RecordDraw`: records
    ``0 .. n - 1`` in order, ``size`` at a time (every block drawn in one compiled shape)."""
    def blocks(size: int) -> Iterator[np.ndarray]:
        size = max(1, min(int(size), draw.num_records))
        inputs = draw.device_inputs()
        for s in range(0, draw.num_records, size):
            e = min(draw.num_records, s + size)
            idx = np.full(size, -1, np.int64)
            idx[:e - s] = np.arange(s, e)
            yield draw.rows(idx, inputs=inputs)[:e - s]
    return blocks


def train_blocks(dataset: Dataset | StreamedDataset, size: int = BLOCK) -> Iterator[np.ndarray]:
    """The training features of either kind of dataset in blocks of ``size`` records (views of
    ``x_train`` for a :class:`Dataset`)."""
    if isinstance(dataset, StreamedDataset):
        yield from dataset.blocks(size)
        return
    for start in range(0, len(dataset.x_train), size):
        yield dataset.x_train[start:start + size]
