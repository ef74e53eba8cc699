"""The server's global ("student") model of the voting algorithms (AE-DPFL and kNN-DPFL).

The server holds unlabelled public data D_G; the vote releases noisy argmax labels ``y_t`` for Q
queries ``x_t`` drawn from it. Two ways to train the student (voting-dpfl spec, AE-DPFL step 4):

* **supervised** (:func:`train_supervised`, the paper's choice and the default): train on the Q
  released pairs ``(x_t, y_t)`` only.
* **semi-supervised self-training** (:func:`train_self_training`, opt-in with
  ``student_semi_supervised = true``): also use the rest of D_G. Round 0 is exactly the supervised
  student. Each of ``rounds`` further rounds predicts the unlabelled public points with the current
  student, keeps those whose softmax confidence is ``>= confidence`` as pseudo-labels, and retrains
  the student (from the same initialisation) on the Q released labels (always kept, never
  overwritten) plus the pseudo-labelled points.

**No privacy cost.** Both are post-processing of the DP release: they read only the released
argmax labels and the server's own public unlabelled data, never the agents' private data, the
noise-free vote sums or the test set, so the ledger is identical with and without self-training.

The training set always has the fixed shape ``[1, Q + U, ...]`` (released rows first, then the
selected pseudo-labelled rows), so every round reuses one compiled ``train_agents``.
:func:`train_students` trains the S students of S seeds together, each equal to its own
:func:`train_student`."""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.core import StackedData, for_each_agent, from_ragged, memory, rng, validation
from fedjax_dp.models import Model
from fedjax_dp.train import LocalTrainConfig, make_local_update, train_agents
from fedjax_dp.train.local import lifted_update

Params = Any


@dataclasses.dataclass(frozen=True)
class SelfTraining:
    """Self-training of the student: ``rounds`` pseudo-labelling rounds at ``confidence``."""

    rounds: int = 2              # pseudo-labelling + retraining rounds after the supervised one
    confidence: float = 0.8      # keep an unlabelled point if max softmax prob >= confidence

    def __post_init__(self):
        check_fields(True, self.rounds, self.confidence)


def check_fields(semi_supervised, rounds, confidence, prefix: str = "algorithm.student_"
                 ) -> None:
    """Validate the ``student_semi_supervised / _self_training_rounds / _confidence`` fields."""
    if not isinstance(semi_supervised, bool):
        raise ValueError(f"{prefix}semi_supervised must be true or false, "
                         f"got {semi_supervised!r}")
    validation.check_int(f"{prefix}self_training_rounds", rounds, minimum=1)
    validation.check_probability(f"{prefix}confidence", confidence)


def from_config(semi_supervised: bool, rounds: int, confidence: float) -> SelfTraining | None:
    """The :class:`SelfTraining` of a voting Config's ``student_*`` fields (None: supervised)."""
    check_fields(semi_supervised, rounds, confidence)
    return SelfTraining(rounds=int(rounds), confidence=float(confidence)) if semi_supervised \
        else None


@dataclasses.dataclass(frozen=True)
class StudentSettings:
    """Mixin for algorithm Configs with ``student_*`` fields (AE-DPFL, kNN-DPFL): the fields and
    their defaults, the student's training configuration and its self-training settings, with
    errors that name the ``algorithm.student_*`` field."""

    student_steps: int = 500
    student_batch_size: int = 32
    student_learning_rate: float = 0.1
    student_optimizer: str = "sgd"
    # semi-supervised student (self-training on the rest of the public data; no privacy cost)
    student_semi_supervised: bool = False   # False: supervised on the Q queries (paper)
    student_self_training_rounds: int = 2   # pseudo-labelling rounds after the supervised one
    student_confidence: float = 0.8         # keep a pseudo-label if max softmax >= this

    #: types and ranges of the fields (:func:`fedjax_dp.core.validation.check_config`)
    FIELDS = {"student_steps": validation.Int(0),
              "student_batch_size": validation.Int(1, validation.BATCH_MAX),
              "student_learning_rate": validation.Float(0.0, low_open=True),
              "student_optimizer": validation.Choice(("sgd", "momentum", "adam")),
              "student_semi_supervised": validation.Bool(),
              "student_self_training_rounds": validation.Int(1),
              "student_confidence": validation.Float(0.0, 1.0, low_open=True)}

    @property
    def semi_supervised(self) -> SelfTraining | None:
        """The student's self-training settings (None: plain supervised, the default)."""
        return from_config(self.student_semi_supervised, self.student_self_training_rounds,
                           self.student_confidence)

    @property
    def student(self) -> LocalTrainConfig:
        """The student's (global model's) training configuration."""
        try:
            return LocalTrainConfig(steps=self.student_steps,
                                    batch_size=self.student_batch_size,
                                    learning_rate=self.student_learning_rate,
                                    optimizer=self.student_optimizer)
        except ValueError as e:
            raise ValueError(str(e).replace("train.", "algorithm.student_")) from None


def train_supervised(key: jax.Array, model: Model, x: np.ndarray, labels: np.ndarray,
                     config: LocalTrainConfig) -> Params:
    """Train the global model on the labelled queries: a one-agent ``train_agents`` from
    ``model.init(k_init)`` with ``k_init, k_train = split(key)``, in ONE compiled call
    (initialisation, the key splits and the training together)."""
    x = np.asarray(x, np.float32)
    labels = np.asarray(labels, dtype=np.int32)
    if len(labels) == 0 or len(x) != len(labels):
        raise ValueError(f"the student needs as many labels as records (>= 1), got {len(x)} "
                         f"records and {len(labels)} labels")
    return _supervised_fn(model, config)(key, x, labels)


@functools.lru_cache(maxsize=32)
def _supervised_fn(model: Model, config: LocalTrainConfig):
    """``(key, x [Q, ...], labels [Q]) -> params``: :func:`train_supervised`'s compiled call
    (the values of ``train_agents(k_train, model.init(k_init), from_ragged([x], [labels]),
    chunk_size=None)[0]``), refused before its first run if it cannot fit."""
    lifted = lifted_update(model, config, True, None, None, "vmap")

    def fn(key, x, y):
        k_init, k_train = jax.random.split(key)
        n = x.shape[0]
        trained, _ = lifted(jax.random.split(k_train, 1), model.init(k_init), x[None], y[None],
                            jnp.ones((1, n), bool), jnp.full((1,), n, jnp.int32))
        return jax.tree.map(lambda l: l[0], trained)

    return memory.checked(jax.jit(fn), what=lambda key, x, y: f"the student's training on "
                          f"{x.shape[0]} labelled queries",
                          drivers=lambda: {"algorithm.student_batch_size": config.batch_size,
                                           **memory.model_driver(model)})


def pseudo_labels(model: Model, params: Params, x: np.ndarray, batch_size: int = 4096
                  ) -> tuple[np.ndarray, np.ndarray]:
    """``(argmax class [U], max softmax probability [U])`` of the student on ``x``."""
    preds, confs = [], []
    for start in range(0, len(x), batch_size):       # host batching over examples (memory)
        p = jax.nn.softmax(model.logits(params, jnp.asarray(x[start:start + batch_size])), -1)
        preds.append(np.asarray(jnp.argmax(p, -1)))
        confs.append(np.asarray(jnp.max(p, -1)))
    if not preds:
        return np.zeros((0,), np.int32), np.zeros((0,), np.float32)
    return np.concatenate(preds).astype(np.int32), np.concatenate(confs)


def train_self_training(key: jax.Array, model: Model, x: np.ndarray, labels: np.ndarray,
                        x_unlabelled: np.ndarray, config: LocalTrainConfig,
                        semi: SelfTraining, *, history: list | None = None,
                        on_round: Callable[[], None] | None = None) -> Params:
    """Self-training student: supervised round 0, then ``semi.rounds`` pseudo-labelling rounds.

    ``x [Q, ...]`` with released ``labels [Q]`` (always in the training set with their released
    labels); ``x_unlabelled [U, ...]`` the rest of the server's public data. Round 0 uses the same
    keys as :func:`train_supervised` (so it IS the supervised student); every round retrains from
    the same initialisation with its own minibatch key. ``history`` (optional list) receives one
    dict per round; ``on_round()`` (optional) is called after each training."""
    if not isinstance(semi, SelfTraining):
        raise ValueError(f"semi must be a student.SelfTraining, got {type(semi).__name__}")
    x = np.asarray(x, np.float32)
    labels = np.asarray(labels, np.int32)
    x_u = np.asarray(x_unlabelled, np.float32)
    if x_u.shape[1:] != x.shape[1:]:
        raise ValueError(f"x_unlabelled must have feature shape {x.shape[1:]}, "
                         f"got {x_u.shape[1:]}")
    k_init, k_train = jax.random.split(key)
    init = model.init(k_init)
    params = train_supervised(key, model, x, labels, config)        # round 0 (== supervised)
    if on_round is not None:
        on_round()
    if len(x_u) == 0:               # nothing to pseudo-label: the later rounds have no work
        if on_round is not None:
            for _ in range(semi.rounds):
                on_round()
        return params
    q, u = len(x), len(x_u)
    x_all = jnp.asarray(np.concatenate([x, x_u])[None])               # [1, Q + U, ...] fixed
    rows = np.arange(q + u)
    for r in range(1, semi.rounds + 1):
        pred, conf = pseudo_labels(model, params, x_u)
        keep, idx, y_all, count = _round_set(labels, pred, conf, semi.confidence)
        data = StackedData(x=x_all[:, idx], y=jnp.asarray(y_all[None]),
                           mask=jnp.asarray((rows < count)[None]),
                           counts=jnp.asarray([count], jnp.int32))
        if history is not None:
            history.append({"round": r, "num_pseudo": count - q, "pseudo_labels": pred,
                            "confidence": conf, "kept": keep})
        trained, _ = train_agents(rng.stream(k_train, f"self_training_{r}"), init, data, model,
                                  config, chunk_size=None)
        params = jax.tree.map(lambda l: l[0], trained)
        if on_round is not None:
            on_round()
    return params


def _round_set(labels: np.ndarray, pred: np.ndarray, conf: np.ndarray, confidence: float
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """A self-training round's set: ``(keep [U], row order [Q + U], labels [Q + U], count)``:
    the Q released rows first, then the pseudo-labelled points kept at ``confidence``, then the
    rest (beyond ``count``, masked out)."""
    q = len(labels)
    keep = conf >= confidence                                         # [U]
    order = np.argsort(~keep, kind="stable")                          # kept points first
    count = q + int(keep.sum())
    idx = np.concatenate([np.arange(q), q + order])                   # released rows first
    return keep, idx, np.concatenate([labels, pred[order]]), count


def train_student(key: jax.Array, model: Model, x_public: np.ndarray, query_indices: np.ndarray,
                  labels: np.ndarray, config: LocalTrainConfig,
                  semi: SelfTraining | None = None, *,
                  on_round: Callable[[], None] | None = None) -> Params:
    """The voting algorithms' student: supervised on the queries, or self-trained on all of D_G.

    ``x_public [P, ...]`` the server's unlabelled data, ``query_indices [Q]`` the voted queries,
    ``labels [Q]`` the released labels. ``semi=None``: :func:`train_supervised` on the queries (the
    paper's choice); otherwise :func:`train_self_training` with the other ``P - Q`` public points
    unlabelled. ``on_round()`` (optional) is called after each training (:func:`num_trainings`)."""
    x_public = np.asarray(x_public)
    qidx = np.asarray(query_indices)
    if semi is None:
        params = train_supervised(key, model, x_public[qidx], labels, config)
        if on_round is not None:
            on_round()
        return params
    rest = np.ones(len(x_public), bool)
    rest[qidx] = False
    return train_self_training(key, model, x_public[qidx], labels, x_public[rest], config, semi,
                               on_round=on_round)


def num_trainings(semi: SelfTraining | None) -> int:
    """How many times :func:`train_student` trains the student (its progress total): 1, or
    ``1 + semi.rounds`` with self-training."""
    return 1 if semi is None else 1 + semi.rounds


# --------------------------------------------------------------------------- S students at once

@functools.lru_cache(maxsize=32)
def _stacked_update(model: Model, config: LocalTrainConfig):
    """``(keys [S], params [S, ...], x [S, n, ...], y, mask, counts) -> (params, loss)``: one
    local update per student, S students as the S agents of one lifted, compiled update."""
    return jax.jit(for_each_agent(make_local_update(model, config), 0))


def _train_stacked(train_keys: list, inits: list, x, y, mask, counts, model: Model,
                   config: LocalTrainConfig) -> list:
    """Student s trains from ``inits[s]`` with ``split(train_keys[s], 1)[0]`` -- the key
    :func:`fedjax_dp.train.train_agents` gives its only agent -- all S in one call."""
    keys = jnp.stack([jax.random.split(k, 1)[0] for k in train_keys])
    init = jax.tree.map(lambda *ls: jnp.stack(ls), *inits)
    trained, _ = _stacked_update(model, config)(keys, init, x, y, mask, counts)
    return [jax.tree.map(lambda l: l[s], trained) for s in range(len(train_keys))]


def train_students(keys: list, model: Model, x_publics: list, query_indices: list,
                   labels: list, config: LocalTrainConfig, semi: SelfTraining | None = None, *,
                   on_round: Callable[[], None] | None = None) -> list:
    """S students (S seeds of a voting run) trained together: student s equals
    ``train_student(keys[s], model, x_publics[s], query_indices[s], labels[s], config, semi)``,
    but every training is ONE compiled call over the S students. The seeds need equal numbers of
    queries and public records. ``on_round()`` is called after each training of all S."""
    num = len(keys)
    if not (len(x_publics) == len(query_indices) == len(labels) == num) or num < 1:
        raise ValueError(f"keys, x_publics, query_indices and labels must have one entry per "
                         f"student (>= 1), got {num}, {len(x_publics)}, {len(query_indices)} "
                         f"and {len(labels)}")
    if semi is not None and not isinstance(semi, SelfTraining):
        raise ValueError(f"semi must be a student.SelfTraining, got {type(semi).__name__}")
    x_publics = [np.asarray(x) for x in x_publics]
    qidx = [np.asarray(i) for i in query_indices]
    labels = [np.asarray(l, np.int32) for l in labels]
    if semi is not None:       # train_self_training's types (its round 0 sees them too)
        x_publics = [x.astype(np.float32) for x in x_publics]
    split = [jax.random.split(k) for k in keys]
    k_init, k_train = [s[0] for s in split], [s[1] for s in split]
    inits = [model.init(k) for k in k_init]
    data = from_ragged([x[i] for x, i in zip(x_publics, qidx)], labels)      # [S, Q, ...]
    params = _train_stacked(k_train, inits, data.x, data.y, data.mask, data.counts, model,
                            config)
    if on_round is not None:
        on_round()
    if semi is None:
        return params
    rest = []
    for x, i in zip(x_publics, qidx):
        r = np.ones(len(x), bool)
        r[i] = False
        rest.append(r)
    if len({int(r.sum()) for r in rest}) != 1:
        raise ValueError("the students' public sets must leave equal numbers of unlabelled "
                         "records")
    x_u = [x[r] for x, r in zip(x_publics, rest)]
    if len(x_u[0]) == 0:
        if on_round is not None:
            for _ in range(semi.rounds):
                on_round()
        return params
    x_all = [jnp.asarray(np.concatenate([x[i], u])[None])
             for x, i, u in zip(x_publics, qidx, x_u)]                          # [1, Q + U, ...]
    rows = np.arange(x_all[0].shape[1])
    for r in range(1, semi.rounds + 1):
        xs, ys, masks, counts = [], [], [], []
        for s in range(num):
            pred, conf = pseudo_labels(model, params[s], x_u[s])
            _, idx, y_all, count = _round_set(labels[s], pred, conf, semi.confidence)
            xs.append(x_all[s][0, idx])
            ys.append(y_all)
            masks.append(rows < count)
            counts.append(count)
        params = _train_stacked([rng.stream(k, f"self_training_{r}") for k in k_train], inits,
                                jnp.stack(xs), jnp.asarray(np.stack(ys)),
                                jnp.asarray(np.stack(masks)), jnp.asarray(counts, jnp.int32),
                                model, config)
        if on_round is not None:
            on_round()
    return params
