"""Learning tasks: what a record's label is, its per-example loss, its accuracy, its checks.

A task is a small frozen value that travels with the data (``Dataset.task``; a converted
population's ``task.json``) and with the model (``Model.task``, set by :func:`attach`):

``Classification()`` (the default)::

    x [*feature_shape] float32,  y [] int32 in [0, C),  logits = f(x) [C]
    l(x, y)  = -log softmax(logits)_y
    accuracy = mean over examples of [argmax logits = y]

``NextToken(vocab_size, pad_id, oov_ids, bos_id, eos_id)`` (next-character / next-word
prediction, TFF's Shakespeare and StackOverflow tasks)::

    x [T] int32 input token ids,  y [T] int32 target ids (the next token),  logits = f(x) [T, V]
    m_t      = [y_t != pad]                                         the real (non-padding) tokens
    l(x, y)  = sum_t m_t (-log softmax(logits_t)_{y_t}) / max(1, sum_t m_t)              (1)

The per-example loss (1) is the MEAN over the sequence's real tokens, not the sum: one record
(one sequence) is the unit of privacy, and its gradient, an average of per-token gradients, is
bounded like one classification example's, so a clip norm C means the same whatever the
sequence length. A sequence of padding only has loss 0 and gradient 0.

Accuracy is per TOKEN (counts summed over all examples and positions, then divided), over three
token sets, as TFF's StackOverflow next-word task reports it (Reddi et al. 2021, "Adaptive
Federated Optimization": ``accuracy_with_oov``, ``accuracy_no_oov``,
``accuracy_no_oov_or_eos``)::

    accuracy                = sum [pred = y] m / sum m                       m = [y != pad]
    accuracy_no_oov         = the same over m & [y not in oov_ids]
    accuracy_no_oov_or_eos  = the same over m & [y not in oov_ids] & [y != eos]
    num_tokens              = sum m
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_dp.core import validation

__all__ = ["Classification", "NextToken", "Task", "CLASSIFICATION", "TASK_FILE", "of", "attach",
           "from_dict", "to_dict", "load", "save"]

#: The file beside a converted stacked population that holds its task (:func:`save`).
TASK_FILE = "task.json"


@dataclasses.dataclass(frozen=True)
class Classification:
    """One label per record: ``y [n]`` ints in ``[0, num_classes)``, features float32."""

    kind = "classification"

    def example_loss(self, logits: jax.Array, y: jax.Array) -> jax.Array:
        """``-log softmax(logits)_y`` for ``logits [C]``, ``y []``: a scalar."""
        return optax.softmax_cross_entropy_with_integer_labels(logits, y)

    def check_split(self, names: tuple[str, str], x: Any, y: Any, num_classes: int
                    ) -> tuple[np.ndarray, np.ndarray]:
        """``(x float32 [n, *feature_shape], y int32 [n])`` of one split, checked."""
        xname, yname = names
        x = validation.check_finite_array(xname, x)
        y = np.asarray(y)
        if x.ndim < 2:
            raise ValueError(f"{xname} must have shape [n, *feature_shape] (ndim >= 2), "
                             f"got shape {x.shape}")
        if y.ndim != 1:
            raise ValueError(f"{yname} must be a 1-D label array, got shape {y.shape}")
        validation.check_same_length((xname, yname), x, y)
        if y.size == 0:  # an empty split: any dtype is fine
            y = y.astype(np.int32)
        y = validation.check_labels(yname, y, num_classes)
        return x.astype(np.float32, copy=False), y.astype(np.int32, copy=False)

    def accuracy(self, pred: Any, y: Any) -> float:
        """``mean(pred == y)`` over examples (host)."""
        return float(np.mean(np.asarray(pred) == np.asarray(y)))

    def metrics(self, pred: Any, y: Any) -> dict[str, float]:
        """``{"accuracy": ...}``."""
        return {"accuracy": self.accuracy(pred, y)}


CLASSIFICATION = Classification()


@dataclasses.dataclass(frozen=True)
class NextToken:
    """Next-token prediction over a vocabulary of ``vocab_size`` ids (see the module docstring).

    pad_id: the padding id (in x and y; a target equal to it is not a token).
    oov_ids: the out-of-vocabulary bucket ids (excluded by ``accuracy_no_oov``).
    bos_id / eos_id: beginning / end of sentence ids, or None (``eos_id`` is excluded by
      ``accuracy_no_oov_or_eos``).
    """

    vocab_size: int
    pad_id: int = 0
    oov_ids: tuple[int, ...] = ()
    bos_id: int | None = None
    eos_id: int | None = None

    kind = "next_token"

    def __post_init__(self):
        v = validation.check_int("task.vocab_size", self.vocab_size, minimum=2)
        object.__setattr__(self, "vocab_size", v)
        ids = {"pad_id": validation.check_int("task.pad_id", self.pad_id, minimum=0,
                                              maximum=v - 1)}
        if isinstance(self.oov_ids, (int, np.integer)) or not isinstance(
                self.oov_ids, (list, tuple, np.ndarray)):
            raise ValueError(f"task.oov_ids must be a list of token ids in [0, {v - 1}], got "
                             f"{self.oov_ids!r}")
        oov = tuple(validation.check_int("task.oov_ids[]", i, minimum=0, maximum=v - 1)
                    for i in self.oov_ids)
        object.__setattr__(self, "oov_ids", oov)
        object.__setattr__(self, "pad_id", ids["pad_id"])
        for name in ("bos_id", "eos_id"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, validation.check_int(
                    f"task.{name}", value, minimum=0, maximum=v - 1))
        special = [("pad_id", self.pad_id)] + [("oov_ids", i) for i in oov] + [
            (n, getattr(self, n)) for n in ("bos_id", "eos_id") if getattr(self, n) is not None]
        seen: dict[int, str] = {}
        for name, i in special:
            if i in seen:
                raise ValueError(f"task.{name} = {i} is also task.{seen[i]}: the special token "
                                 f"ids must be distinct")
            seen[i] = name

    # ------------------------------------------------------------------ loss

    def example_loss(self, logits: jax.Array, y: jax.Array) -> jax.Array:
        """Equation (1): the mean cross-entropy over the real tokens of ONE sequence,
        ``logits [T, V]``, ``y [T]`` -> scalar."""
        per_token = optax.softmax_cross_entropy_with_integer_labels(logits, y)       # [T]
        real = (y != self.pad_id).astype(per_token.dtype)                            # [T]
        return jnp.sum(real * per_token) / jnp.maximum(jnp.sum(real), 1.0)

    # ------------------------------------------------------------------ checks

    def check_split(self, names: tuple[str, str], x: Any, y: Any, num_classes: int
                    ) -> tuple[np.ndarray, np.ndarray]:
        """``(x int32 [n, T], y int32 [n, T])`` of one split: integer token ids in
        ``[0, vocab_size)``, ``num_classes == vocab_size``."""
        xname, yname = names
        if num_classes != self.vocab_size:
            raise ValueError(f"num_classes ({num_classes}) must equal the task's vocab_size "
                             f"({self.vocab_size}) for a next-token task")
        x, y = np.asarray(x), np.asarray(y)
        for name, a in ((xname, x), (yname, y)):
            if a.ndim != 2:
                raise ValueError(f"{name} must have shape [n, T] (token ids of n sequences of "
                                 f"length T) for a next-token task, got shape {a.shape}")
            if a.size and a.dtype.kind not in "iu":
                raise ValueError(f"{name} must hold integer token ids, got dtype {a.dtype}")
        if x.shape != y.shape:
            raise ValueError(f"{xname} and {yname} must have the same shape [n, T], got "
                             f"{x.shape} and {y.shape}")
        x = validation.check_labels(xname, x.astype(np.int64, copy=False), self.vocab_size)
        y = validation.check_labels(yname, y.astype(np.int64, copy=False), self.vocab_size)
        return x.astype(np.int32), y.astype(np.int32)

    # ------------------------------------------------------------------ accuracy

    def token_masks(self, y: Any) -> dict[str, np.ndarray]:
        """The token sets of the three accuracies, boolean arrays shaped like ``y`` (host)."""
        y = np.asarray(y)
        real = y != self.pad_id
        no_oov = real & ~np.isin(y, np.asarray(self.oov_ids, dtype=y.dtype))
        no_eos = no_oov if self.eos_id is None else no_oov & (y != self.eos_id)
        return {"accuracy": real, "accuracy_no_oov": no_oov, "accuracy_no_oov_or_eos": no_eos}

    def metrics(self, pred: Any, y: Any) -> dict[str, float]:
        """Per-token accuracies (counts summed over examples and positions, then divided; 0
        when a set is empty) and ``num_tokens`` (the real tokens), for predictions
        ``pred [M, T]`` and targets ``y [M, T]``."""
        pred, y = np.asarray(pred), np.asarray(y)
        if pred.shape != y.shape:
            raise ValueError(f"predictions have shape {pred.shape} but the targets {y.shape}")
        hit = pred == y
        out: dict[str, float] = {}
        for name, m in self.token_masks(y).items():
            total = int(np.count_nonzero(m))
            out[name] = float(np.count_nonzero(hit & m)) / total if total else 0.0
        out["num_tokens"] = int(np.count_nonzero(y != self.pad_id))
        return out

    def accuracy(self, pred: Any, y: Any) -> float:
        """The per-token accuracy over the real tokens (``metrics(...)["accuracy"]``)."""
        return self.metrics(pred, y)["accuracy"]


Task = Classification | NextToken


def of(model: Any) -> Task:
    """The task of ``model`` (its ``task`` field; :data:`CLASSIFICATION` when it has none)."""
    task = getattr(model, "task", None)
    return CLASSIFICATION if task is None else task


def attach(model: Any, task: Task | None) -> Any:
    """``model`` with ``task`` (a :class:`~fedjax_dp.models.Model` is a NamedTuple: a copy with
    the field replaced). Classification (or None) returns ``model`` itself, unchanged."""
    if task is None or isinstance(task, Classification):
        return model
    if not isinstance(task, NextToken):
        raise ValueError(f"task must be a Classification or NextToken, got {type(task).__name__}")
    if getattr(model, "num_classes", task.vocab_size) != task.vocab_size:
        raise ValueError(f"model {getattr(model, 'name', '?')!r} has {model.num_classes} outputs "
                         f"but the task's vocab_size is {task.vocab_size}")
    return model._replace(task=task)


def to_dict(task: Task | None) -> dict:
    """The JSON form: ``{"kind": "classification"}`` or ``{"kind": "next_token",
    "vocab_size", "pad_id", "oov_ids", "bos_id", "eos_id"}``."""
    if task is None or isinstance(task, Classification):
        return {"kind": "classification"}
    return {"kind": "next_token", "vocab_size": task.vocab_size, "pad_id": task.pad_id,
            "oov_ids": list(task.oov_ids), "bos_id": task.bos_id, "eos_id": task.eos_id}


def from_dict(d: dict, where: str = "task") -> Task:
    """The task of :func:`to_dict`'s form (``where`` names its source in errors)."""
    if not isinstance(d, dict) or d.get("kind") not in ("classification", "next_token"):
        raise ValueError(f"{where} must be a table with kind = 'classification' or "
                         f"'next_token', got {d!r}")
    if d["kind"] == "classification":
        extra = sorted(set(d) - {"kind"})
        if extra:
            raise ValueError(f"{where}: a classification task takes no fields, got {extra}")
        return CLASSIFICATION
    fields = {"vocab_size", "pad_id", "oov_ids", "bos_id", "eos_id"}
    extra = sorted(set(d) - fields - {"kind"})
    if extra:
        raise ValueError(f"{where}: unknown next_token fields {extra}; allowed {sorted(fields)}")
    if "vocab_size" not in d:
        raise ValueError(f"{where}: a next_token task needs vocab_size")
    kwargs = {k: d[k] for k in fields if k in d}
    if "oov_ids" in kwargs and isinstance(kwargs["oov_ids"], list):
        kwargs["oov_ids"] = tuple(kwargs["oov_ids"])
    return NextToken(**kwargs)


#: a task file is a few ids: at most this long
MAX_TASK_BYTES = 1 << 20


def save(folder, task: Task | None) -> Path:
    """Write ``folder/task.json`` (:data:`TASK_FILE`) atomically; returns its path."""
    from fedjax_dp.core import files
    path = Path(folder) / TASK_FILE
    files.write_text(path, json.dumps(to_dict(task), indent=1))
    return path


def load(folder) -> Task:
    """The task saved in ``folder/task.json``; :data:`CLASSIFICATION` when there is none. Read
    as data (:func:`fedjax_dp.core.files.read_json`): a regular file in ``folder`` (a symlink
    out of it is refused), at most :data:`MAX_TASK_BYTES`, a JSON object; a ValueError names
    the file."""
    from fedjax_dp.core import files
    path = Path(folder) / TASK_FILE
    if not os.path.lexists(path):
        return CLASSIFICATION
    d = files.read_json(path, max_bytes=MAX_TASK_BYTES, max_depth=4, root=folder,
                        what="task file", expect=dict)
    return from_dict(d, where=str(path))
