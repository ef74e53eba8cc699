"""One interface for every algorithm: ``init`` / ``step`` / ``ledger`` / ``output``
(docs/protocol.md). An algorithm is a module (or any object) exposing pure functions over
explicit state::

    Config                  frozen dataclass of the algorithm's own fields, validated on
                            construction (a bad value raises one line naming the field)
    DESCRIPTION: str        one line for ``fedjax-dp list``
    USES_LOCAL_TRAIN: bool  the config's ``[train]`` table is passed as ``Config.local``

    init(key, data: FederatedData, model: Model, config, runtime: Runtime) -> State
    num_steps(config) -> int                     how many times ``step`` runs (rounds / phases)
    step(state, key) -> (state, metrics)         one round, or one phase of a one-shot method
    ledger(config, state) -> PrivacyLedger | tuple[PrivacyLedger, ...]
    output(state) -> Output                      the final model, for evaluation

and, optionally, the hooks declared with their defaults in :class:`Algorithm`, read by drivers
only through :func:`hooks`. ``State.values`` is a pytree of arrays, so a run can be
checkpointed; :func:`run` is the driver every algorithm shares.

Keys. ``run(algorithm, key, ...)`` passes ``key`` itself to ``init`` and
``fold_in(split(key)[1], t)`` to step t (:func:`step_key`); ``init`` may use ``split(key)[0]``
(the round-based algorithms initialise the model with it) or derive named streams from ``key``
(:func:`fedjax_dp.core.stream`), but never ``split(key)[1]``, which belongs to the steps. No key
is used twice.
"""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Callable, Hashable, Protocol, Sequence

import jax
import numpy as np

from fedjax_dp.algorithms import calls
from fedjax_dp.core import StackedData, validation
from fedjax_dp.core.stacked import from_client_ids
from fedjax_dp.core import progress as progress_lib
from fedjax_dp.models import Model
from fedjax_dp.privacy import UNITS, PrivacyLedger

Params = Any
#: a ready ``on_step`` callback for :func:`run`: one line every ``every`` steps
print_progress = progress_lib.print_progress

__all__ = ["FederatedData", "Runtime", "State", "Output", "Algorithm", "Hooks", "OPTIONAL_HOOKS",
           "hooks", "Result", "step_key", "init_key", "run", "ledgers", "host_value", "check_init",
           "phase_steps", "print_progress"]


@dataclasses.dataclass(frozen=True)
class FederatedData:
    """Everything an algorithm may read about the task.

    agents: the agents' private data, stacked ``x [N, n_max, ...]`` (see :class:`StackedData`).
    x_public: ``[n_public, ...]`` the server's UNLABELLED data (queries of the voting methods,
      FedKT's transfer set), or None. Its labels are never given to an algorithm.
    num_classes: number of classes of the labels.
    y_public: ``[n_public]`` labels of ``x_public`` for DIAGNOSTICS ONLY (e.g. how accurate a
      vote was, reported in metrics): an algorithm must never train on, select with or release
      anything computed from them.
    client_ids: ``[N]`` the client id of each agent (:meth:`from_arrays` sets it: agent ``i`` is
      client ``client_ids[i]``), or None. No algorithm reads it.
    """

    agents: StackedData
    num_classes: int
    x_public: Any = None          # [n_public, *feature_shape] or None
    y_public: Any = None          # [n_public] diagnostics only, or None
    client_ids: Any = None        # [N] agent i's client id, or None

    @classmethod
    def from_arrays(cls, x, y, client_ids, *, num_classes: int, x_public=None,
                    y_public=None) -> "FederatedData":
        """Your own records, one client id per record, as the agents of a federated task.

        Records are grouped by client (ragged clients are padded to the largest one, with the
        mask of :class:`fedjax_dp.core.StackedData`): agent ``i`` is the ``i``-th of the SORTED
        distinct client ids and holds that client's records in their order in ``x``;
        ``.client_ids[i]`` is its id. Vectorised (one stable argsort,
        :func:`fedjax_dp.core.stacked.from_client_ids`).

        Args:
          x: ``[n, *feature_shape]`` finite features, one row per record.
          y: ``[n]`` integer labels in ``[0, num_classes)``.
          client_ids: ``[n]`` each record's client: integers or strings (a list, a numpy array,
            a pandas column).
          num_classes: number of classes.
          x_public: the server's unlabelled data (see the class docstring), or None.
          y_public: its labels, for diagnostics only, or None.

        Bad input (lengths that differ, labels outside ``[0, num_classes)``, features that are
        not finite, ids that are neither integers nor strings) raises one ValueError naming
        the argument.
        """
        validation.check_int("num_classes", num_classes, minimum=1)
        labels = np.asarray(y)
        if labels.size and labels.dtype.kind in "iu" and (
                labels.min() < 0 or labels.max() >= num_classes):
            raise ValueError(f"y must hold labels in [0, {num_classes - 1}] (num_classes = "
                             f"{num_classes}), got labels in [{labels.min()}, {labels.max()}]")
        agents, ids = from_client_ids(x, labels, client_ids)
        return cls(agents=agents, num_classes=num_classes, x_public=x_public, y_public=y_public,
                   client_ids=ids)

    def __post_init__(self):
        if not isinstance(self.agents, StackedData):
            raise ValueError(f"data.agents must be a StackedData, got "
                             f"{type(self.agents).__name__}")
        validation.check_int("data.num_classes", self.num_classes, minimum=1)
        y = self.agents.y                       # padding holds label 0, which is in range
        if np.size(y):
            lo, hi = (int(v) for v in jax.device_get(
                (y.min(), y.max()) if isinstance(y, np.ndarray) else _label_range(y)))
            if lo < 0 or hi >= self.num_classes:
                raise ValueError(f"the agents' labels must be in [0, {self.num_classes - 1}] "
                                 f"(data.num_classes = {self.num_classes}), got labels in "
                                 f"[{lo}, {hi}]")
        if self.client_ids is not None and np.shape(self.client_ids) != (self.num_agents,):
            raise ValueError(f"data.client_ids must hold one id per agent ({self.num_agents}), "
                             f"got shape {np.shape(self.client_ids)}")
        if self.x_public is not None and tuple(np.shape(self.x_public)[1:]) != \
                self.agents.feature_shape:
            raise ValueError(f"data.x_public has feature shape {tuple(np.shape(self.x_public)[1:])}"
                             f" but the agents' records have {self.agents.feature_shape}")

    def public_array(self, holds: str) -> np.ndarray:
        """``x_public`` for a method that reads it: present (else the error says it must hold
        ``holds``), finite, with at least one example ``[P, ...]``; the agents' feature shape is
        checked on construction."""
        if self.x_public is None:
            raise ValueError(f"data.x_public must hold {holds}, got None")
        x_public = validation.check_finite_array("x_public", self.x_public)
        if x_public.ndim < 2 or x_public.shape[0] == 0:
            raise ValueError(f"x_public must hold at least one public example [P, ...], got "
                             f"shape {x_public.shape}")
        return x_public

    @property
    def num_agents(self) -> int:
        return self.agents.num_agents

    @property
    def feature_shape(self) -> tuple[int, ...]:
        return self.agents.feature_shape


@dataclasses.dataclass(frozen=True)
class Runtime:
    """How to execute (never what is computed: every choice gives the same results).

    chunk_size: agents per chunk (``"auto"``: cache-sized on the CPU, none on accelerators;
      None: all agents at once; an int).
    mesh: a ``jax.sharding.Mesh`` with an ``agents`` axis to shard the agent axis, or None.
    backend: ``"vmap"`` or ``"loop"`` (a Python loop over agents: debugging and reference tests).
    cohort: ``"gather"`` (round-based algorithms train only the round's sampled agents) or
      ``"masked"`` (every agent trains and a mask selects the participants: the reference).
    progress: where long steps report progress (:mod:`fedjax_dp.core.progress`; silent by default).
    rounds_per_call: rounds per compiled call of an algorithm with a ``multi_step`` hook:
      ``"auto"`` (:class:`fedjax_dp.algorithms.calls.CallSizer`) or an int k >= 1.
    """

    chunk_size: int | str | None = "auto"
    mesh: Any = None
    backend: str = "vmap"
    cohort: str = "gather"
    progress: Any = progress_lib.SILENT
    rounds_per_call: int | str = "auto"

    def __post_init__(self):
        if self.chunk_size not in ("auto", None):
            validation.check_int("runtime.chunk_size", self.chunk_size, minimum=1)
        if self.rounds_per_call != "auto":
            validation.check_int("runtime.rounds_per_call", self.rounds_per_call, minimum=1)
        validation.check_choice("runtime.backend", self.backend, ("vmap", "loop"))
        validation.check_choice("runtime.cohort", self.cohort, ("gather", "masked"))


@dataclasses.dataclass
class State:
    """What an algorithm carries from one step to the next.

    step: number of steps done.
    values: pytree of arrays (parameters, server / optimiser state, counters): everything a
      checkpoint must save to resume.
    context: static part (data, model, config, compiled functions, host-side bookkeeping); rebuilt
      by ``init``, never saved.
    """

    step: int
    values: Any
    context: Any = None


@dataclasses.dataclass(frozen=True)
class Output:
    """The final model: ``model`` / ``params`` (a JAX model) or ``predict(x [M, ...]) -> [M]``
    (e.g. a tree ensemble). ``model`` is always set (the model the run was configured with when
    the final model is not a JAX model). ``accuracy(x, y) -> float``, optional, replaces the
    default score of :meth:`score` (for a result that is not one model)."""

    model: Model
    params: Params = None
    predict: Callable[[Any], Any] | None = None
    accuracy: Callable[[Any, Any], float] | None = None

    def score(self, x, y) -> float:
        """Accuracy on ``(x [M, ...], y [M])``: ``accuracy(x, y)`` when the output defines it,
        else ``mean(predict_labels(x) == y)`` (a next-token task: per token over ``y != pad``,
        :mod:`fedjax_dp.models.tasks`)."""
        if self.accuracy is not None:
            return float(self.accuracy(x, y))
        from fedjax_dp.models import tasks     # a next-token model: per token over y != pad
        return tasks.of(self.model).accuracy(self.predict_labels(x), y)

    def predict_labels(self, x) -> np.ndarray:
        """Predicted classes ``[M]`` (host array) for ``x [M, ...]``."""
        if self.predict is not None:
            return np.asarray(self.predict(x))
        from fedjax_dp.train import predict         # host batches: no per-shape transfer program
        return np.asarray(predict(self.model, self.params, x))


@jax.jit
def _label_range(y):
    """``(min, max)`` of device-resident labels in one compiled call (eagerly: two)."""
    return y.min(), y.max()


class Algorithm(Protocol):
    """The protocol (structural): an algorithm is a module (or any object) defining these names.

    Required: ``Config``, ``DESCRIPTION``, ``USES_LOCAL_TRAIN``, ``init``, ``num_steps``,
    ``step``, ``ledger``, ``output``. Optional: every name after them (:data:`OPTIONAL_HOOKS`),
    written here with their defaults; drivers read them only through :func:`hooks`.
    """

    Config: type
    DESCRIPTION: str
    USES_LOCAL_TRAIN: bool

    def init(self, key: jax.Array, data: FederatedData, model: Model, config: Any,
             runtime: Runtime) -> State: ...

    def num_steps(self, config: Any) -> int: ...

    def step(self, state: State, key: jax.Array) -> tuple[State, dict]: ...

    def ledger(self, config: Any, state: State) -> PrivacyLedger | tuple: ...

    def output(self, state: State) -> Output: ...

    # ------------------------------------------------------------ optional hooks and defaults
    # What each does, its default and its users: the hook table of docs/protocol.md.

    PHASES: tuple[str, ...] = ()                        # a one-shot method's steps; () rounds
    private: bool = True                                # False: no guarantee (FedAvg, ...)
    seed_dependent_ledger: bool = False                 # True: calibrate every seed alone
    seed_step: Callable[[State], tuple[Callable, Any, Hashable]] | None = None
    multi_step: Callable[[State, jax.Array, int, int], tuple[State, dict]] | None = None
    batch_plan: Callable[[list[State]], Any] | None = None          # with batched_step
    batched_step: Callable[[Any, list[State], list], tuple[list[State], list[dict]]] | None = None
    checkpoint_types: tuple[type, ...] = ()            # named tuples a later state holds

    def rounds_per_call(self, state: State) -> int:
        """The most steps one ``multi_step`` call runs (0: one by one). Default: 0."""

    def prefetch(self, state: State, key: jax.Array) -> None:
        """Prepare step t+1 (its key) once step t is dispatched. Default: nothing."""

    def step_label(self, config: Any, t: int) -> str:
        """Step ``t`` (1-based) named. Default: ``phase t/T NAME`` or ``round t/T``."""

    def artifacts(self, state: State, out_dir: Path | None, run_config: dict) -> dict:
        """Extra run files and ``result.json`` fields. Default: none, ``{}``."""

    def planned_ledger(self, config: Any, state: State,
                       key: jax.Array) -> Callable[[Any], PrivacyLedger | tuple]:
        """The ledger(s) as a function of a calibrated config, before any training. Default:
        ``lambda c: ledger(c, state)``."""

    def privacy_units(self, config: Any) -> tuple[str, ...]:
        """The units of privacy a run of ``config`` reports, before any data (the delta bound,
        :mod:`fedjax_dp.privacy.delta_bound`). Default: the units of ``ledger(config, None)``;
        where that needs the run's state, every documented unit (the tightest bound)."""


@dataclasses.dataclass(frozen=True)
class Hooks:
    """The optional hooks of one algorithm, resolved (its own or :class:`Algorithm`'s default);
    made by :func:`hooks`. ``seed_step`` / ``batch_plan`` / ``batched_step`` stay None when
    absent."""

    PHASES: tuple[str, ...]
    private: bool
    seed_dependent_ledger: bool
    seed_step: Callable[[State], tuple[Callable, Any, Hashable]] | None
    batch_plan: Callable[[list[State]], Any] | None
    batched_step: Callable[[Any, list[State], list], tuple[list[State], list[dict]]] | None
    multi_step: Callable[[State, jax.Array, int, int], tuple[State, dict]] | None
    rounds_per_call: Callable[[State], int]
    prefetch: Callable[[State, jax.Array], None]
    step_label: Callable[[Any, int], str]
    artifacts: Callable[[State, Path | None, dict], dict]
    planned_ledger: Callable[[Any, State, jax.Array], Callable[[Any], PrivacyLedger | tuple]]
    privacy_units: Callable[[Any], tuple[str, ...]]
    checkpoint_types: tuple[type, ...] = ()

    @property
    def can_vmap_seeds(self) -> bool:
        """Whether the seeds of a run can step together (``seed_step`` or ``batched_step``)."""
        return self.seed_step is not None or self.batched_step is not None


#: The optional names of :class:`Algorithm`, in declaration order.
OPTIONAL_HOOKS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Hooks))
_FLAGS = {"private": True, "seed_dependent_ledger": False}


def hooks(algorithm: Algorithm) -> Hooks:
    """Every optional hook of ``algorithm`` (:data:`OPTIONAL_HOOKS`): the one it defines, else
    :class:`Algorithm`'s default. Raises ``ValueError`` naming a hook of the wrong kind."""
    own = {name: getattr(algorithm, name) for name in OPTIONAL_HOOKS if hasattr(algorithm, name)}
    phases = own.get("PHASES", ())
    if not (isinstance(phases, tuple) and all(isinstance(p, str) for p in phases)):
        raise ValueError(f"algorithm.PHASES must be a tuple of str, got {phases!r}")
    flags = {}
    for name, default in _FLAGS.items():
        flags[name] = own.get(name, default)
        if not isinstance(flags[name], bool):
            raise ValueError(f"algorithm.{name} must be a bool, got {flags[name]!r}")
    if (own.get("batch_plan") is None) != (own.get("batched_step") is None):
        raise ValueError("algorithm.batch_plan and algorithm.batched_step are declared together")
    types = own.get("checkpoint_types", ())
    if not (isinstance(types, tuple) and all(isinstance(t, type) and issubclass(t, tuple)
                                             and hasattr(t, "_fields") for t in types)):
        raise ValueError(f"algorithm.checkpoint_types must be a tuple of named-tuple classes, "
                         f"got {types!r}")
    for name in ("seed_step", "batch_plan", "batched_step", "multi_step", "rounds_per_call",
                 "prefetch", "step_label", "artifacts", "planned_ledger", "privacy_units"):
        if own.get(name) is not None and not callable(own[name]):
            raise ValueError(f"algorithm.{name} must be callable, got {own[name]!r}")

    def step_label(config: Any, t: int) -> str:
        total = algorithm.num_steps(config)
        return f"phase {t}/{total} {phases[t - 1]}" if phases else f"round {t}/{total}"

    def planned_ledger(config: Any, state: State, key: jax.Array):
        return lambda candidate: algorithm.ledger(candidate, state)

    def privacy_units(config: Any) -> tuple[str, ...]:
        try:
            found = ledgers(algorithm, config, None)
        except (ValueError, TypeError, AttributeError, KeyError):    # it needs the state
            return tuple(UNITS)
        return tuple(dict.fromkeys(u for ledger in found for u in ledger.units()))

    return Hooks(PHASES=phases, **flags,
                 seed_step=own.get("seed_step"), batch_plan=own.get("batch_plan"),
                 batched_step=own.get("batched_step"),
                 multi_step=own.get("multi_step"),
                 rounds_per_call=own.get("rounds_per_call") or _no_multi_step,
                 prefetch=own.get("prefetch") or _no_prefetch,
                 step_label=own.get("step_label") or step_label,
                 artifacts=own.get("artifacts") or _no_artifacts,
                 planned_ledger=own.get("planned_ledger") or planned_ledger,
                 privacy_units=own.get("privacy_units") or privacy_units,
                 checkpoint_types=types)


def _no_multi_step(state: State) -> int:
    """The default ``rounds_per_call``: 0 (no ``multi_step``: one step per call)."""
    return 0


def _no_prefetch(state: State, key: jax.Array) -> None:
    """The default ``prefetch``: nothing to prepare."""


def _no_artifacts(state: State, out_dir: Path | None, run_config: dict) -> dict:
    """The default ``artifacts``: no extra files, no extra fields."""
    return {}


def check_init(config: Any, config_cls: type, data: Any = None) -> None:
    """The type checks of an ``init`` (and of the drivers): ``config`` must be a ``config_cls``
    and, where given, ``data`` a :class:`FederatedData`. Raises ``ValueError`` naming both."""
    if not isinstance(config, config_cls):
        raise ValueError(f"config must be a {config_cls.__module__}.{config_cls.__qualname__}, "
                         f"got {type(config).__name__}")
    if data is not None and not isinstance(data, FederatedData):
        raise ValueError(f"data must be an api.FederatedData, got {type(data).__name__}")


def phase_steps(phases: tuple[str, ...]) -> Callable[[Any], int]:
    """The ``num_steps`` of a one-shot method: one step per phase, ``len(phases)``."""
    return lambda config: len(phases)


def init_key(key: jax.Array) -> jax.Array:
    """The key a round-based algorithm initialises its model with: ``split(key)[0]``."""
    return jax.random.split(key)[0]


def step_key(key: jax.Array, t: int) -> jax.Array:
    """The key of step ``t`` (0-based) of a run with root ``key``: ``fold_in(split(key)[1], t)``."""
    return _step_key(key, t)


@jax.jit
def _step_key(key, t):
    """One compiled call (``t`` traced: no recompilation per step); eager split + fold_in cost
    three dispatches, measurable next to a small cohort's round."""
    return jax.random.fold_in(jax.random.split(key)[1], t)


def ledgers(algorithm: Algorithm, config: Any, state: State) -> tuple[PrivacyLedger, ...]:
    """``algorithm.ledger`` as a tuple (several ledgers are reported side by side, not composed)."""
    out = algorithm.ledger(config, state)
    return (out,) if isinstance(out, PrivacyLedger) else tuple(out)


@dataclasses.dataclass
class Result:
    """A finished (or interrupted) run: the last state, one record per step, the wall time."""

    state: State
    history: list[dict]
    wall_time_s: float = 0.0


def run(algorithm: Algorithm, key: jax.Array, data: FederatedData, model: Model, config: Any, *,
        runtime: Runtime = Runtime(), evaluate: Callable[[Output], dict] | None = None,
        eval_every: int = 0, on_step: Callable[[int, dict], None] | None = None,
        state: State | None = None, boundaries: Sequence[int] = ()) -> Result:
    """Drive ``algorithm`` from ``init`` (or from ``state``, to resume) to its last step.

    Metrics become host floats; ``evaluate(output)`` runs every ``eval_every`` steps and after the
    last; ``on_step(t + 1, record)`` sees every record (progress display, ``progress.jsonl``,
    checkpoints), so a long run never loses the steps already done; :func:`print_progress` is a
    ready one that prints a line per step. Nothing is printed without one.

    With a ``multi_step`` hook that can run this state, steps run ``runtime.rounds_per_call``
    at a time (:func:`fedjax_dp.algorithms.calls.run_calls`), a call ending at every multiple of
    ``eval_every`` and of each of ``boundaries`` (checkpoints). A record is made once the next
    step (or call) has been dispatched, so the host never stalls the device.
    """
    check_init(config, algorithm.Config)
    validation.check_int("eval_every", eval_every, minimum=0)
    start = time.perf_counter()
    if state is None:
        state = algorithm.init(key, data, model, config, runtime)
    total = algorithm.num_steps(config)
    history: list[dict] = []
    h = hooks(algorithm)
    prefetch = h.prefetch
    pending = None                      # (t, state after step t, its metrics on the device)

    def finish(t: int, done: State, metrics: dict) -> None:
        record = {"round": t + 1, **{k: host_value(v) for k, v in metrics.items()}}
        if evaluate is not None and eval_every and ((t + 1) % eval_every == 0 or t + 1 == total):
            record.update(evaluate(algorithm.output(done)))
        history.append(record)
        if on_step is not None:
            on_step(t + 1, record)

    capacity = h.rounds_per_call(state) if h.multi_step is not None else 0
    if capacity and state.step < total:
        state = calls.run_calls(h.multi_step, capacity, key, state, total, runtime.rounds_per_call,
                           (eval_every, *boundaries), finish)
        return Result(state=state, history=history, wall_time_s=time.perf_counter() - start)
    for t in range(state.step, total):
        state, metrics = algorithm.step(state, step_key(key, t))
        if t + 1 < total:                       # overlaps the dispatched step's compute
            prefetch(state, step_key(key, t + 1))
        if pending is not None:         # step t is dispatched: now wait for step t-1's metrics
            finish(*pending)
        pending = (t, state, metrics)
    if pending is not None:
        finish(*pending)
    return Result(state=state, history=history, wall_time_s=time.perf_counter() - start)


def host_value(value):
    """A metric as a host float (or int / str as given)."""
    if isinstance(value, (int, str)) and not isinstance(value, bool):
        return value
    return float(value)
