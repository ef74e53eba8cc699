"""FedKT's configuration, its learners and its chunk size (the bottom of the FedKT package).

:class:`Config` is the ``[algorithm]`` table of a FedKT run; :func:`make_learners` builds the
three tiers' learners (teachers, students, final model) from it; :func:`party_chunk_size` is the
number P of parties whose teachers train in one compiled call (see :mod:`.phases`).
"""
from __future__ import annotations

import dataclasses
from typing import Any

from fedjax_dp.algorithms.fedkt import learners as learners_lib
from fedjax_dp.core import agent_stream, validation
from fedjax_dp.core.lift import resolve_chunk_size
from fedjax_dp.train import LocalTrainConfig

LEVELS = ("L0", "L1", "L2")


def _check_local(name: str, value: Any) -> Any:
    return validation.Instance(LocalTrainConfig, optional=True)(name, value)


@dataclasses.dataclass(frozen=True)
class LearnerOptions:
    """Mixin of FedKT's and SOLO's Configs: the tree learners' depth and number of trees, and
    ``local``, the JAX learners' local training (the [train] table; None: ``LocalTrainConfig()``).
    Checks every field of the Config (:func:`validation.check_config`)."""

    tree_max_depth: int = 6
    tree_estimators: int = 100
    local: Any = None                # LocalTrainConfig (the [train] table)

    FIELDS = {"tree_max_depth": validation.Int(1, 1024),
              "tree_estimators": validation.Int(1, 100_000),
              "local": validation.Custom(_check_local)}

    def __post_init__(self):
        validation.check_config(self, "algorithm")
        if self.local is None:
            object.__setattr__(self, "local", LocalTrainConfig())


def build_learner(config: LearnerOptions, which: str, train: LocalTrainConfig, *, model=None,
                  model_name: str = "mlp", hidden=(200,), feature_shape, num_classes: int,
                  chunk_size: int | str | None = "auto", backend: str = "vmap"):
    """The learner ``which``: ``"model"`` is ``model`` (a built Model) trained with ``train``
    when given, else the JAX model ``model_name``; otherwise :func:`.learners.make_learner` of
    that name, with ``config``'s tree options."""
    if which == "model" and model is not None:
        return learners_lib.JaxLearner(model, train, chunk_size=chunk_size, backend=backend)
    name = model_name if which == "model" else which
    return learners_lib.make_learner(
        name, feature_shape=feature_shape, num_classes=num_classes, train=train, hidden=hidden,
        chunk_size=chunk_size, backend=backend, max_depth=config.tree_max_depth,
        n_estimators=config.tree_estimators)


@dataclasses.dataclass(frozen=True)
class Config(LearnerOptions):
    """FedKT: ``num_partitions`` (s) x ``num_teachers`` (t) per party, privacy ``level``.

    teacher / student: ``"model"`` (the experiment's [model] table), a JAX model
      (``logistic``, ``mlp``, ``cnn``) or a tree learner (``decision_tree``, ``random_forest``,
      ``gradient_boosting``, ``xgboost``). The final model has the student's type.
    student_steps / final_steps: local steps for students / the final model (0: ``local.steps``).
    gamma: Laplace parameter (noise ``Lap(1/gamma)`` on each count) at L1 / L2.
    query_fraction: fraction of the public set the noisy tier labels (L1 server, L2 parties).
    moment_orders: moments accountant orders l = 1..moment_orders (reference code: 8).
    gap_threshold: a student may change with one record if a query it learnt had a top-2
      teacher gap <= this (2 is correct under index tie-breaking; 1 is the paper's).
    party_chunk: parties per streamed chunk P (JAX learners, :mod:`.phases`); None:
      :func:`party_chunk_size`. Results do not depend on it.
    centralized: the paper's "centralized PATE" baseline (Table 1): the parties' records are
      pooled into ONE party before the run (same s x t teachers); needs level L0.
    data_dependent: at L1 / L2 also report the data-dependent (LNMax moments) guarantees, the
      metric ``z`` and the run folder's ``votes.npz`` (their input). All three are computed from
      the noise-free votes, so the ledger then declares them uncovered: an explicit opt-in
      (default false: the run releases only what its data-independent guarantee covers). At L0
      (no guarantee) ``z`` is always reported.
    """

    num_partitions: int = 2
    num_teachers: int = 5
    level: str = "L0"
    gamma: float = 0.05
    query_fraction: float = 1.0
    teacher: str = "model"
    student: str = "model"
    student_steps: int = 0
    final_steps: int = 0
    moment_orders: int = 8
    gap_threshold: int = 2
    party_chunk: int | None = None   # parties per streamed chunk (None: ~4096 teachers' worth)
    centralized: bool = False        # centralized PATE: all records pooled into one party
    data_dependent: bool = False     # the moments guarantees, z, votes.npz: an explicit opt-in

    FIELDS = {"num_partitions": validation.Int(1), "num_teachers": validation.Int(1),
              "level": validation.Choice(LEVELS),
              "gamma": validation.Float(0.0, 1e12, low_open=True),      # float32 on the device
              "query_fraction": validation.Float(0.0, 1.0, low_open=True),
              "teacher": validation.Choice(("model",) + learners_lib.LEARNERS),
              "student": validation.Choice(("model",) + learners_lib.LEARNERS),
              "student_steps": validation.Int(0), "final_steps": validation.Int(0),
              "moment_orders": validation.Int(1, 10_000), "gap_threshold": validation.Int(0),
              "party_chunk": validation.Int(1, optional=True),
              "centralized": validation.Bool(), "data_dependent": validation.Bool()}

    def __post_init__(self):
        super().__post_init__()          # every field; local None -> LocalTrainConfig()
        if self.centralized and self.level != "L0":
            raise ValueError(f"algorithm.centralized = true (centralized PATE, no privacy) needs "
                             f"algorithm.level = \"L0\", got {self.level!r}")

    @property
    def orders(self) -> tuple[int, ...]:
        return tuple(range(1, self.moment_orders + 1))


def make_learners(config: Config, *, model_name: str = "mlp", feature_shape, num_classes: int,
                  hidden=(200,), chunk_size: int | str | None = "auto", backend: str = "vmap",
                  model=None):
    """``(teacher, student, final)`` learners for ``config``.

    ``"model"`` means ``model`` (a built :class:`~fedjax_dp.models.Model`) when given, else the
    JAX model ``model_name`` with ``hidden``. Teachers train ``local.steps`` steps, students
    ``student_steps`` and the final model ``final_steps`` (0: ``local.steps``).
    """
    def build(which: str, steps: int):
        train = dataclasses.replace(config.local, steps=steps or config.local.steps)
        return build_learner(config, which, train, model=model, model_name=model_name,
                             hidden=hidden, feature_shape=feature_shape,
                             num_classes=num_classes, chunk_size=chunk_size, backend=backend)

    return (build(config.teacher, config.local.steps), build(config.student, config.student_steps),
            build(config.student, config.final_steps))


def party_chunk_size(config: Config, num_parties: int) -> int:
    """Parties per streamed chunk P: ``config.party_chunk``, or when None
    ``max(1, DEFAULT_CHUNK // (s t))`` (about :data:`agent_stream.DEFAULT_CHUNK` teachers per
    chunk, as AE-DPFL trains that many agents); at most n (:func:`resolve_chunk_size`)."""
    default = max(1, agent_stream.DEFAULT_CHUNK // (config.num_partitions * config.num_teachers))
    return resolve_chunk_size(config.party_chunk, num_agents=num_parties, default=default,
                              capped=True)
