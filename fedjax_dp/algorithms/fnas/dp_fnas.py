"""DP-FNAS (Singh et al.; dp-fnas paper Algorithm 1) on the algorithm protocol: search, then retrain.

The K parties are the stacked agent axis of :class:`~fedjax_dp.algorithms.api.FederatedData`.
Each party splits its own records deterministically: its first ``ceil(n_k / 2)`` records are its
training half (weights W, and the second-order term), the rest its validation half (the
architecture alpha). The search network, genotype and fixed network come from
:mod:`fedjax_dp.models.darts`, the pure update functions from
:mod:`fedjax_dp.algorithms.fnas.steps`, the accounting from :mod:`fedjax_dp.algorithms.fnas.privacy`.

Steps. Step t < ``search_epochs`` is one search EPOCH: ``ceil(max_k n_k^tr / batch_size)``
iterations of the compiled search step (one iteration per call; the per-call dispatch is far
below the iteration's compute, so a Python loop over iterations costs nothing measurable and the
host synchronises once per epoch for the metrics). The remaining ``retrain_epochs`` steps retrain
the fixed network of the derived genotype from scratch with DP federated SGD over ALL records of
every party. ``output`` is the retrained network (the search network before retraining starts).
An iteration of either phase is one pure function :func:`iteration`
``(value, k_epoch, i, data) -> (value, metrics)``, compiled at the first epoch of its phase.

Seeds (:func:`batch_plan` / :func:`batched_step`, driven by
:func:`fedjax_dp.algorithms.seeds.run_seeds`): the iterations of S seeds of one config run as
ONE call of the same function vmapped over the seeds. Retraining needs host work per seed (the
derived genotype decides the network), so the hook is a batched step, not a pure
``seed_step``: seeds with equal genotypes retrain together.

Search replay (:mod:`fedjax_dp.algorithms.fnas.search_memo`): a search epoch equal to one run
earlier in the process (same config but for the retraining fields, same step key, same data)
is replayed, not recomputed, so a grid over ``retrain_seed`` costs one search.

The ``[model]`` table of an experiment config is not used: the networks are built from the
algorithm's own fields (``nodes``, ``channels``, ``cells``, ``primitives``, ...).

Progress (``runtime.progress``): ``compile search step`` / ``compile retrain step`` (one unit
each, when a step is compiled), and per epoch a ``search`` or ``retrain`` task with one update
per finished iteration (the host waits for iteration i - 1 while iteration i is queued, so the
count is of finished work, never of dispatched calls). :func:`step_label` names an epoch for
the runner's one line per step.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import time
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.algorithms import api
from fedjax_dp.algorithms.fnas import privacy as fnas_privacy
from fedjax_dp.algorithms.fnas import search_memo, steps
from fedjax_dp.core import memory, rng, seed_axis
from fedjax_dp.core import validation
from fedjax_dp.models import Model, darts
from fedjax_dp.privacy import PrivacyLedger

DESCRIPTION = ("DP-FNAS: federated, differentially private DARTS search of K parties, then DP "
               "retraining of the derived network (instance level, Singh et al.)")
USES_LOCAL_TRAIN = False


_v = validation

#: ``Config.fixed_genotype`` value that retrains a random genotype (no search).
RANDOM_GENOTYPE = "random"


@dataclasses.dataclass(frozen=True)
class Config:
    """DP-FNAS search (DARTS space, Algorithm 1) and retraining of the derived network.

    Search space: ``nodes`` (>= 1), ``channels`` (>= 1), ``cells`` (>= 1), ``primitives``
    (subset of the 8 DARTS primitives), ``stem_multiplier``.
    Search: ``search_epochs``, ``batch_size`` B (expected Poisson batch of the smallest party's
    half: rate ``min(1, B / min_k n_k)`` for all parties), ``order`` ('first' | 'second'), ``second_order_method``
    ('finite_difference' | 'jvp'), ``xi`` (virtual step), weight SGD ``w_lr`` (cosine to
    ``w_lr_min``), ``w_momentum``, ``w_weight_decay``; alpha Adam ``alpha_lr``, ``alpha_b1``,
    ``alpha_b2``, ``alpha_weight_decay``.
    Privacy: ``private`` (False: FNAS, no clipping and no noise); clip norms R^G
    ``clip_weights``, R^H ``clip_arch``, R^C ``clip_second`` (> 0) and noise multipliers sigma
    ``noise_weights``, tau ``noise_arch``, ``noise_second`` (>= 0).
    Retraining: ``retrain_epochs``, ``retrain_batch_size``, ``retrain_lr``, ``retrain_channels``
    / ``retrain_cells`` (0: as in the search), ``clip_retrain``, ``noise_retrain``;
    ``fixed_genotype`` (a genotype's JSON): skip the search and retrain that genotype;
    ``"random"`` (:data:`RANDOM_GENOTYPE`): skip the search and retrain a uniformly random
    genotype of the same size (:func:`darts.random_genotype`, drawn from the run's key stream
    ``"random_genotype"``, independent of the data: the paper's searched-vs-random comparison
    is the grid ``algorithm.fixed_genotype = ["", "random"]``).
    ``private_retrain`` (default true): retraining is private when the run is; false retrains
    WITHOUT clipping or noise after a private search (the paper's protocol: its guarantee covers
    the search only; the ledger then covers the search and declares the retrained network
    uncovered). ``retrain_seed`` (default -1: the run's key): >= 0 draws the retraining's
    initialisation, sampling and noise from ``key(retrain_seed)`` instead, so one search (or one
    random genotype, both from the run's seed) is retrained under several retraining seeds.
    """

    nodes: int = 4
    channels: int = 4
    cells: int = 3
    primitives: tuple = darts.PRIMITIVES
    stem_multiplier: int = 3
    search_epochs: int = 10
    batch_size: int = 32
    order: str = "first"
    second_order_method: str = "finite_difference"
    xi: float = 0.025
    w_lr: float = 0.025
    w_lr_min: float = 0.001
    w_momentum: float = 0.9
    w_weight_decay: float = 3e-4
    alpha_lr: float = 3e-4
    alpha_b1: float = 0.5
    alpha_b2: float = 0.999
    alpha_weight_decay: float = 1e-3
    private: bool = True
    clip_weights: float = 1.0
    clip_arch: float = 1.0
    clip_second: float = 1.0
    noise_weights: float = 1.0
    noise_arch: float = 1.0
    noise_second: float = 1.0
    retrain_epochs: int = 10
    retrain_batch_size: int = 32
    retrain_lr: float = 0.05
    retrain_channels: int = 0
    retrain_cells: int = 0
    clip_retrain: float = 1.0
    noise_retrain: float = 1.0
    fixed_genotype: str = ""
    private_retrain: bool = True
    retrain_seed: int = -1

    FIELDS = {"nodes": _v.Int(1, 64), "channels": _v.Int(1, _v.WIDTH_MAX),
              "cells": _v.Int(1, 1024),
              "primitives": _v.Custom(darts.check_primitives, bad=("x", 3)),
              "stem_multiplier": _v.Int(1, 1024), "search_epochs": _v.Int(1),
              "batch_size": _v.Int(1, _v.BATCH_MAX), "order": _v.Choice(("first", "second")),
              "second_order_method": _v.Choice(("finite_difference", "jvp")),
              "xi": _v.Float(0.0), "w_lr": _v.Float(0.0, low_open=True),
              "w_lr_min": _v.Float(0.0, low_open=True), "w_momentum": _v.Float(0.0),
              "w_weight_decay": _v.Float(0.0), "alpha_lr": _v.Float(0.0, low_open=True),
              "alpha_b1": _v.Float(0.0, 1.0), "alpha_b2": _v.Float(0.0, 1.0),
              "alpha_weight_decay": _v.Float(0.0), "private": _v.Bool(),
              "clip_weights": _v.Float(0.0, low_open=True),
              "clip_arch": _v.Float(0.0, low_open=True),
              "clip_second": _v.Float(0.0, low_open=True),
              "noise_weights": _v.Float(0.0), "noise_arch": _v.Float(0.0),
              "noise_second": _v.Float(0.0), "retrain_epochs": _v.Int(0),
              "retrain_batch_size": _v.Int(1, _v.BATCH_MAX),
              "retrain_lr": _v.Float(0.0, low_open=True),
              "retrain_channels": _v.Int(0, _v.WIDTH_MAX), "retrain_cells": _v.Int(0, 1024),
              "clip_retrain": _v.Float(0.0, low_open=True), "noise_retrain": _v.Float(0.0),
              "fixed_genotype": _v.Text("a genotype JSON string, \"random\" or \"\""),
              "private_retrain": _v.Bool(), "retrain_seed": _v.Int(-1)}

    def __post_init__(self):
        validation.check_config(self, "algorithm")
        if self.fixed_genotype == RANDOM_GENOTYPE:
            if self.retrain_epochs < 1:
                raise ValueError("algorithm.retrain_epochs must be >= 1 with a fixed_genotype")
        elif self.fixed_genotype:
            try:
                g = darts.Genotype.from_json(self.fixed_genotype)
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"algorithm.fixed_genotype is not a valid genotype: {e}") from None
            if g.nodes != self.nodes:
                raise ValueError(f"algorithm.fixed_genotype has {g.nodes} nodes but "
                                 f"algorithm.nodes is {self.nodes}")
            if self.retrain_epochs < 1:
                raise ValueError("algorithm.retrain_epochs must be >= 1 with a fixed_genotype")

    @property
    def retrain_private(self) -> bool:
        """Whether retraining clips and adds noise (``private`` and ``private_retrain``)."""
        return self.private and self.private_retrain

    @property
    def search_steps(self) -> int:
        """Search epochs run (0 when ``fixed_genotype`` skips the search)."""
        return 0 if self.fixed_genotype else self.search_epochs

    @property
    def rounds(self) -> int:
        """Total protocol steps (search epochs + retrain epochs), for progress displays."""
        return self.search_steps + self.retrain_epochs

    @property
    def space(self) -> darts.SearchSpace:
        return darts.SearchSpace(nodes=self.nodes, channels=self.channels, cells=self.cells,
                                 primitives=self.primitives, stem_multiplier=self.stem_multiplier)


def _mech(config: Config, clip: str, noise: str, private: bool | None = None
          ) -> steps.Mechanism:
    return steps.Mechanism(clip=float(getattr(config, clip)), noise=float(getattr(config, noise)),
                           private=config.private if private is None else private)


def search_hyper(config: Config, total_iterations: int) -> steps.SearchHyper:
    return steps.SearchHyper(
        weights=_mech(config, "clip_weights", "noise_weights"),
        arch=_mech(config, "clip_arch", "noise_arch"),
        second=_mech(config, "clip_second", "noise_second"),
        order=config.order, second_order_method=config.second_order_method, xi=config.xi,
        w_lr=config.w_lr, w_lr_min=config.w_lr_min, w_momentum=config.w_momentum,
        w_weight_decay=config.w_weight_decay, total_iterations=total_iterations,
        alpha_lr=config.alpha_lr, alpha_b1=config.alpha_b1, alpha_b2=config.alpha_b2,
        alpha_weight_decay=config.alpha_weight_decay)


# --------------------------------------------------------------------------- data

def split_halves(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per party ``(n_train, n_val)``: the first ``ceil(n / 2)`` records train, the rest validate."""
    counts = np.asarray(counts, np.int64)
    n_train = (counts + 1) // 2
    return n_train, counts - n_train


def check_parties(counts: np.ndarray) -> None:
    """Every party needs >= 2 records (one in each half); names ``data.num_agents`` otherwise."""
    counts = np.asarray(counts)
    small = np.flatnonzero(counts < 2)
    if small.size:
        k = int(small[0])
        raise ValueError(f"data.num_agents={len(counts)} is too large for the data: party {k} "
                         f"has {int(counts[k])} record(s), DP-FNAS needs >= 2 per party (one "
                         f"training, one validation record)")


def _party_data(xs: list, ys: list, batch_size: int) -> steps.PartyData:
    """Stack ragged per-party arrays. One Poisson rate for all parties, ``q = min(1, B / min_k
    n_k)`` (the smallest party's expected batch is B), so every party's records take identical
    mechanisms; each party divides by its own expected batch ``q n_k``."""
    counts = np.array([len(y) for y in ys], np.int64)
    n_max = int(counts.max())
    shape = xs[0].shape[1:]
    x = np.zeros((len(xs), n_max) + shape, np.float32)
    y = np.zeros((len(xs), n_max), np.int32)
    for k, (xk, yk) in enumerate(zip(xs, ys)):       # host-side construction, once per run
        x[k, :len(yk)], y[k, :len(yk)] = xk, yk
    mask = np.arange(n_max)[None, :] < counts[:, None]
    rate = np.full(len(ys), min(1.0, batch_size / int(counts.min())))
    return steps.PartyData(x=jnp.asarray(x), y=jnp.asarray(y), mask=jnp.asarray(mask),
                           rate=jnp.asarray(rate, jnp.float32),
                           denom=jnp.asarray(rate * counts, jnp.float32))


def make_search_data(agents, batch_size: int) -> steps.SearchData:
    """The parties' training and validation halves as :class:`steps.SearchData`."""
    counts = np.asarray(agents.counts)
    check_parties(counts)
    n_train, _ = split_halves(counts)
    xs = [np.asarray(agents.x[k, :counts[k]]) for k in range(len(counts))]
    ys = [np.asarray(agents.y[k, :counts[k]]) for k in range(len(counts))]
    train = _party_data([x[:t] for x, t in zip(xs, n_train)],
                        [y[:t] for y, t in zip(ys, n_train)], batch_size)
    val = _party_data([x[t:] for x, t in zip(xs, n_train)],
                      [y[t:] for y, t in zip(ys, n_train)], batch_size)
    return steps.SearchData(train=train, val=val)


def make_retrain_data(agents, batch_size: int) -> steps.PartyData:
    counts = np.asarray(agents.counts)
    return _party_data([np.asarray(agents.x[k, :counts[k]]) for k in range(len(counts))],
                       [np.asarray(agents.y[k, :counts[k]]) for k in range(len(counts))],
                       batch_size)


def iterations_per_epoch(counts: np.ndarray, batch_size: int) -> int:
    """``ceil(max_k n_k / B)``: an epoch is an expected pass over the largest party's records."""
    return max(1, int(math.ceil(int(np.max(counts)) / batch_size)))


# --------------------------------------------------------------------------- protocol

@dataclasses.dataclass
class Context:
    config: Config
    model: darts.SearchModel
    search_data: steps.SearchData
    retrain_data: steps.PartyData
    search_fns: steps.SearchFns
    search_iterations: int                 # per epoch
    retrain_iterations: int                # per epoch
    runtime: api.Runtime
    timings: dict                          # host bookkeeping: cumulative seconds per phase
    retrain: dict                          # lazily built: model, fns, genotype
    compiled: set = dataclasses.field(default_factory=set)   # phases whose call is compiled
    fixed: darts.Genotype | None = None    # the genotype retrained without search, if any
    data_id: str = ""                      # search_memo.fingerprint of search_data (lazy)


_COMPILED: dict = {}


def compile_checked(fn, *args, what: str = "a step", drivers=None) -> tuple[Any, float]:
    """``fn`` (a jitted function) compiled for the shapes of ``args``, and the seconds compiling
    took (0 when an equal run already compiled it: runs with equal configs and shapes share it).
    A new compilation that cannot fit in memory is refused (:func:`memory.check_fits`, naming
    ``what`` and the config keys ``drivers``)."""
    sig = (fn, jax.tree.structure(args),
           tuple((np.shape(a), str(jnp.asarray(a).dtype) if not isinstance(a, jax.Array)
                  else str(a.dtype)) for a in jax.tree.leaves(args)))
    if sig in _COMPILED:
        return _COMPILED[sig], 0.0
    start = time.perf_counter()
    compiled = fn.lower(*args).compile()
    memory.check_fits(compiled, what=what, drivers=drivers)
    _COMPILED[sig] = compiled
    return compiled, time.perf_counter() - start


def memory_drivers(config: Config, phase: str) -> dict:
    """The config keys (-> values) that drive a ``phase`` iteration's memory."""
    if phase == "search":
        return {f"algorithm.{k}": getattr(config, k)
                for k in ("batch_size", "channels", "cells", "nodes")}
    return {"algorithm.retrain_batch_size": config.retrain_batch_size,
            **{f"algorithm.retrain_{k}": getattr(config, f"retrain_{k}") or
               f"0 -> {getattr(config, k)}" for k in ("channels", "cells")}}


def init(key: jax.Array, data: api.FederatedData, model: Model, config: Config,
         runtime: api.Runtime = api.Runtime()) -> api.State:
    """Validate the parties, split their halves, initialise W and alpha (the search step is
    compiled by the first step, for one seed or for the seeds stepped together).

    ``model`` (the experiment's ``[model]``) is not used: the search network comes from config.
    """
    if not isinstance(config, Config):
        raise ValueError(f"config must be a dp_fnas.Config, got {type(config).__name__}")
    counts = np.asarray(data.agents.counts)
    check_parties(counts)
    search_data = make_search_data(data.agents, config.batch_size)
    retrain_data = make_retrain_data(data.agents, config.retrain_batch_size)
    n_train, _ = split_halves(counts)
    iters = iterations_per_epoch(n_train, config.batch_size)
    retrain_iters = iterations_per_epoch(counts, config.retrain_batch_size)
    net = darts.search_network(config.space, tuple(data.feature_shape), data.num_classes)
    fns = steps.make_search(net, search_hyper(config, iters * config.search_epochs),
                            backend=runtime.backend)
    state = fns.init(api.init_key(key))
    timings = {"search": 0.0, "retrain": 0.0, "compile_search": 0.0, "compile_retrain": 0.0}
    ctx = Context(config=config, model=net, search_data=search_data, retrain_data=retrain_data,
                  search_fns=fns, search_iterations=iters, retrain_iterations=retrain_iters,
                  runtime=runtime, timings=timings, retrain={},
                  fixed=fixed_genotype(key, config))
    return api.State(step=0, values={"search": state}, context=ctx)


def num_steps(config: Config) -> int:
    return config.search_steps + config.retrain_epochs


def step_label(config: Config, t: int) -> str:
    """Step ``t`` (1-based) named by its phase: ``search epoch 3/10`` or ``retrain epoch 1/5``."""
    if t <= config.search_steps:
        return f"search epoch {t}/{config.search_steps}"
    return f"retrain epoch {t - config.search_steps}/{config.retrain_epochs}"


@functools.lru_cache(maxsize=64)
def iteration(update: Any, seeds: bool = False, data_axis: int | None = None,
              compiled: bool = True):
    """Iteration ``i`` of an epoch as ONE pure function
    ``fn(value, k_epoch, i, data) -> (value, metrics)``, i.e.
    ``update(value, fold_in(k_epoch, i), data)`` with ``update`` the search step
    (:func:`steps.make_search`) or the retraining step (:func:`steps.make_retrain`).

    ``seeds``: the same function vmapped over a leading seed axis of ``value`` and ``k_epoch``
    (and of ``data`` with ``data_axis = 0``; ``None``: one data for all seeds), ``i`` shared.
    :func:`step` runs one seed and :func:`batched_step` several seeds through this one
    function. ``compiled``: jitted (``runtime.backend = "vmap"``), else the plain function
    (the loop backend's reference runs). Cached: equal arguments give the same function.
    """
    def one(value, k_epoch, i, data):
        return update(value, jax.random.fold_in(k_epoch, i), data)

    fn = jax.vmap(one, in_axes=(0, 0, None, data_axis)) if seeds else one
    return jax.jit(fn) if compiled else fn


def _iterate(progress, name: str, count: int, fn, value, k_epoch, data, records: list):
    """``count`` iterations ``value, m = fn(value, k_epoch, i, data)`` (metrics appended to
    ``records``), reported as task ``name``: iteration i - 1 is waited for (and counted) once
    iteration i is queued, so the device never idles and the bar counts finished iterations."""
    with progress.task(name, total=count, unit="iteration") as task:
        for i in range(count):
            value, m = fn(value, k_epoch, np.int32(i), data)
            if progress.enabled and i:
                jax.block_until_ready(records[-1])          # iteration i - 1 has finished
                task.update(1)
            records.append(m)
        if progress.enabled and count:
            jax.block_until_ready(records[-1])
            task.update(1)
    return value


def fixed_genotype(key: jax.Array, config: Config) -> darts.Genotype | None:
    """The genotype retrained without search: ``config.fixed_genotype`` parsed, a random one of
    ``config.nodes`` nodes over ``config.primitives`` drawn from ``rng.stream(key,
    "random_genotype")`` for :data:`RANDOM_GENOTYPE`, or None (search)."""
    if config.fixed_genotype == RANDOM_GENOTYPE:
        return darts.random_genotype(rng.numpy_rng(rng.stream(key, "random_genotype")),
                                     config.nodes, config.primitives)
    if config.fixed_genotype:
        return darts.Genotype.from_json(config.fixed_genotype)
    return None


def genotype(state: api.State) -> darts.Genotype:
    """The genotype derived from the current global alpha (DARTS rule), or the fixed one."""
    if state.context.fixed is not None:
        return state.context.fixed
    return darts.derive_genotype(state.values["search"].alpha, state.context.config.space)


def _retrain_fns(ctx: Context, geno: darts.Genotype, feature_shape, num_classes):
    c = ctx.config
    fixed = darts.fixed_network(geno, tuple(feature_shape), num_classes,
                                channels=c.retrain_channels or c.channels,
                                cells=c.retrain_cells or c.cells,
                                stem_multiplier=c.stem_multiplier)
    hyper = steps.RetrainHyper(mech=_mech(c, "clip_retrain", "noise_retrain", c.retrain_private),
                               lr=c.retrain_lr,
                               total_iterations=ctx.retrain_iterations * c.retrain_epochs)
    return fixed, steps.make_retrain(fixed, hyper, backend=ctx.runtime.backend)


def _prepare_retrain(state: api.State, values: dict, k_init: jax.Array) -> None:
    """Host work before a retraining epoch of one seed: at the first one (or after a resume),
    derive the genotype and build its network (``ctx.retrain``); initialise the retraining state
    in ``values`` unless a checkpoint holds it."""
    ctx: Context = state.context
    if "fns" not in ctx.retrain:
        geno = genotype(state)
        fixed, fns = _retrain_fns(ctx, geno, ctx.search_data.train.x.shape[2:],
                                  ctx.model.num_classes)
        ctx.retrain.update(model=fixed, fns=fns, genotype=geno)
    if "retrain" not in values:
        values["retrain"] = ctx.retrain["fns"].init(k_init)


def _mean_metrics(records: list[dict], seeds: int | None) -> list[dict]:
    """Epoch means of the iterations' scalar metrics, on the host (one transfer; a device-side
    stack of a variable number of scalars recompiles per length and crashed XLA's CPU compiler
    at 12 operands): one dict, or one per seed when the metrics have a seed axis of ``seeds``."""
    host = jax.device_get(records)
    if seeds is None:
        return [{k: float(np.mean([r[k] for r in host])) for k in host[0]}]
    return [{k: float(np.mean([r[k][s] for r in host])) for k in host[0]}
            for s in range(seeds)]


# the seeds' pytrees stacked / unstacked in one compiled call each (not one per leaf)
_stack = jax.jit(seed_axis.stack_seeds)
_unstack = jax.jit(seed_axis.unstack_seeds, static_argnums=1)


def _epoch(states: list[api.State], values: list[dict], k_epochs: list, phase: str,
           data: Any, data_axis: int | None) -> list[dict]:
    """One epoch of ``phase`` for seeds that share its compiled iteration: ONE seed (``data``
    its own, ``data_axis`` unused) calls :func:`iteration` as it is, several call it vmapped
    over their seed axis (``data`` shared, or stacked with ``data_axis = 0``). Updates
    ``values[s][phase]`` and the seeds' timings; returns each seed's epoch metrics."""
    ctxs: list[Context] = [s.context for s in states]
    ctx = ctxs[0]
    count = ctx.search_iterations if phase == "search" else ctx.retrain_iterations
    update = ctx.search_fns.step if phase == "search" else ctx.retrain["fns"].step
    many = len(states) > 1
    compiled = ctx.runtime.backend == "vmap"
    fn = iteration(update, many, data_axis if many else None, compiled)
    if many:
        value, k_epoch = _stack([v[phase] for v in values]), jnp.stack(k_epochs)
    else:
        value, k_epoch = values[0][phase], k_epochs[0]
    seconds = 0.0
    if compiled:
        args = (value, k_epoch, np.int32(0), data)
        what = f"a {phase} iteration" + (f" of {len(states)} seeds" if many else "")
        drivers = memory_drivers(ctx.config, phase)
        if phase in ctx.compiled:
            fn, seconds = compile_checked(fn, *args, what=what, drivers=drivers)
        else:
            with ctx.runtime.progress.task(f"compile {phase} step", total=1,
                                           unit="step") as task:
                fn, seconds = compile_checked(fn, *args, what=what, drivers=drivers)
                task.update(1)
    start = time.perf_counter()
    records: list = []
    value = _iterate(ctx.runtime.progress, phase, count, fn, value, k_epoch, data, records)
    metrics = _mean_metrics(records, len(states) if many else None)
    for v, new in zip(values, _unstack(value, len(states)) if many else [value]):
        v[phase] = new
    share = (time.perf_counter() - start) / len(states)      # each seed's share of the epoch
    for c in ctxs:
        c.compiled.add(phase)
        c.timings[phase] += share
        c.timings[f"compile_{phase}"] += seconds / len(states)
    return metrics


def _step_seeds(states: list[api.State], keys: list, group_data: Any
                ) -> tuple[list[api.State], list[dict]]:
    """Step t of seeds with equal configs and shapes, all at step t: ``(states, metrics)`` with
    entry s equal to :func:`step` ``(states[s], keys[s])`` (one seed: exactly that).

    Search epochs: all seeds in one group. Retraining epochs: per seed on the host, the genotype
    and its network (:func:`_prepare_retrain`); seeds with equal genotypes (hence the same
    compiled retraining step) form a group. ``group_data(members, phase) -> (data, data_axis)``
    gives a group's data (a group of one: the seed's own data).
    """
    t = states[0].step
    config: Config = states[0].context.config
    if t >= config.search_steps and config.retrain_seed >= 0:
        # retraining keys from their own root (one search retrained under several seeds)
        keys = [api.step_key(jax.random.key(config.retrain_seed), t)] * len(keys)
    splits = [jax.random.split(k) for k in keys]
    k_inits, k_epochs = [s[0] for s in splits], [s[1] for s in splits]
    values = [dict(s.values) for s in states]
    if t < config.search_steps:
        phase, groups = "search", [list(range(len(states)))]
    else:
        phase, by_fns = "retrain", {}
        for s, state in enumerate(states):
            _prepare_retrain(state, values[s], k_inits[s])
            by_fns.setdefault(id(state.context.retrain["fns"]), []).append(s)
        groups = list(by_fns.values())
    metrics: list = [None] * len(states)
    if phase == "search":                      # replay an equal search run earlier, if any
        ids = [_data_id(state.context) for state in states]
        hits = [search_memo.lookup(state.context.config, ids[s], keys[s], t)
                for s, state in enumerate(states)]
        if all(h is not None for h in hits):
            for s, (value, m, seconds) in enumerate(hits):
                values[s]["search"], metrics[s] = value, dict(m)
                states[s].context.timings["search"] += seconds
            groups = []
        before = [state.context.timings["search"] for state in states]
    for members in groups:
        data, axis = group_data(members, phase)
        got = _epoch([states[s] for s in members], [values[s] for s in members],
                     [k_epochs[s] for s in members], phase, data, axis)
        for s, m in zip(members, got):
            metrics[s] = m
            if phase == "search":
                ctx = states[s].context
                search_memo.store(ctx.config, ids[s], keys[s], t, values[s]["search"], m,
                                  ctx.timings["search"] - before[s])
    out = []
    for s, state in enumerate(states):
        ctx: Context = state.context
        metrics[s].update(phase=0 if phase == "search" else 1,
                          search_time_s=ctx.timings["search"],
                          retrain_time_s=ctx.timings["retrain"])
        out.append(api.State(step=t + 1, values=values[s], context=ctx))
    return out, metrics


def _data_id(ctx: Context) -> str:
    """The fingerprint of the parties' search data (computed once per run)."""
    if not ctx.data_id:
        ctx.data_id = search_memo.fingerprint(ctx.search_data)
    return ctx.data_id


def _own_data(ctx: Context, phase: str):
    return (ctx.search_data if phase == "search" else ctx.retrain_data), None


def step(state: api.State, key: jax.Array) -> tuple[api.State, dict]:
    """One search epoch (steps < search_epochs), else one retraining epoch: :func:`iteration`
    ``ceil(max_k n_k / B)`` times (the seeds of :func:`batched_step` run the same function)."""
    (new,), (metrics,) = _step_seeds([state], [key],
                                     lambda members, phase: _own_data(state.context, phase))
    return new, metrics


def batch_plan(states: list[api.State]) -> tuple[list, Callable] | None:
    """What S seeds of one config share, for :func:`batched_step`: ``(contexts, group_data)``
    with ``group_data(members, phase) -> (data, data_axis)`` (the seeds' halves and retraining
    data shared when equal, stacked on a seed axis otherwise; a retraining group's rows). None
    (the seeds then run one by one) with the loop backend, or when the seeds' data shapes or
    epoch lengths differ."""
    if not states or len({s.step for s in states}) != 1:
        return None
    ctxs: list[Context] = [s.context for s in states]
    c0 = ctxs[0]
    if c0.runtime.backend != "vmap":
        return None
    if any(c.config != c0.config or c.model is not c0.model or c.search_fns is not c0.search_fns
           or c.search_iterations != c0.search_iterations
           or c.retrain_iterations != c0.retrain_iterations for c in ctxs[1:]):
        return None
    shared = {}
    for phase in ("search", "retrain"):
        shared[phase] = seed_axis.share_or_stack([_own_data(c, phase)[0] for c in ctxs])
        if shared[phase][0] is None:
            return None
    cache: dict = {}

    def group_data(members: list[int], phase: str):
        if len(members) == 1:
            return _own_data(ctxs[members[0]], phase)
        data, axis = shared[phase]
        if axis is None or len(members) == len(ctxs):
            return data, axis
        key = (phase, tuple(members))
        if key not in cache:                        # a retraining group: its seeds' rows
            rows = np.asarray(members)
            cache[key] = jax.tree.map(lambda x: x[rows], data), axis
        return cache[key]

    return ctxs, group_data


def batched_step(plan: tuple[list, Callable], states: list[api.State], keys: list
                 ) -> tuple[list[api.State], list[dict]]:
    """Step t of S seeds of one config (``plan`` from :func:`batch_plan`), each epoch's
    iterations ONE compiled call vmapped over the seeds (:func:`iteration`), entry s equal to
    ``step(states[s], keys[s])`` to float tolerance (tested). Seeds that derived the same
    genotype retrain together; a seed alone runs as its own :func:`step`."""
    ctxs, group_data = plan
    if len(states) != len(ctxs) or any(s.context is not c for s, c in zip(states, ctxs)):
        raise ValueError("batched_step must get the states its plan was made for")
    return _step_seeds(list(states), list(keys), group_data)


def output(state: api.State) -> api.Output:
    """The retrained fixed network, or (before retraining) the search network with its alpha."""
    ctx: Context = state.context
    if "retrain" in state.values:
        model = ctx.retrain.get("model")
        if model is None:                       # resumed from a checkpoint: rebuild (cached)
            model, _ = _retrain_fns(ctx, genotype(state), ctx.search_data.train.x.shape[2:],
                                    ctx.model.num_classes)
        return api.Output(model=model, params=state.values["retrain"].params)
    s = state.values["search"]
    return api.Output(model=ctx.model.as_model(), params={"w": s.w, "alpha": s.alpha})


def _record_events(config: Config, ctx: Context) -> list[tuple]:
    tr, va, re = (np.asarray(ctx.search_data.train.rate), np.asarray(ctx.search_data.val.rate),
                  np.asarray(ctx.retrain_data.rate))
    t = ctx.search_iterations * config.search_steps
    t_re = ctx.retrain_iterations * config.retrain_epochs if config.retrain_private else 0
    return [fnas_privacy.record_events(
        rate_train=float(tr[k]), rate_val=float(va[k]), rate_retrain=float(re[k]), iterations=t,
        retrain_iterations=t_re, noise_weights=config.noise_weights, noise_arch=config.noise_arch,
        noise_second=config.noise_second if config.order == "second" else None,
        noise_retrain=config.noise_retrain) for k in range(len(tr))]


def ledger(config: Config, state: api.State) -> tuple[PrivacyLedger, ...]:
    """Instance-level guarantee of the whole planned run: the worst record of all parties, then
    one ledger per party when parties differ (see :mod:`fedjax_dp.algorithms.fnas.privacy`;
    with the common sampling rate every party takes identical events and one ledger covers
    each). Non-private: empty."""
    if not config.private:
        return (PrivacyLedger(),)
    note = ("parallel over (party, half): training-half records take the weight mechanism"
            + (", the second-order mechanism" if config.order == "second" else "")
            + " and retraining; validation-half records the architecture mechanism and "
              "retraining")
    if not config.retrain_private:
        note += ("; retraining is NOT private (private_retrain = false): this guarantee covers "
                 "the search (the genotype) only")
    out = fnas_privacy.ledgers(_record_events(config, state.context), note=note)
    if not config.retrain_private:
        out = tuple(lg.declare_uncovered(
            "the retrained network (algorithm.private_retrain = false)",
            "trained on every party's records without clipping or noise: not private")
            for lg in out)
    return tuple(lg.declare_uncovered(
        "diagnostic metrics train_loss, val_loss, clipped_w, clipped_alpha, clipped_second, "
        "batch_train, batch_val (realised batch sizes), retrain_loss and clipped_retrain of "
        "every epoch (history, progress.jsonl)",
        "computed from the parties' records without noise: not private")
        for lg in out)


def paper_gdp(config: Config, state: api.State, delta: float) -> dict | None:
    """The paper's Theorem 3.1 GDP mu per party and its (epsilon, delta) (None if not private)."""
    if not config.private:
        return None
    ctx: Context = state.context
    return fnas_privacy.paper_gdp(
        rates_train=np.asarray(ctx.search_data.train.rate).tolist(),
        rates_val=np.asarray(ctx.search_data.val.rate).tolist(),
        iterations=ctx.search_iterations * config.search_steps,
        noise_weights=config.noise_weights, noise_arch=config.noise_arch, delta=delta)


def artifacts(state: api.State, out_dir: str | Path | None, run_config: dict) -> dict:
    """Extra result fields (genotype, timings, the paper's GDP); with ``out_dir``, also writes
    ``genotype.json`` and ``genotype.png`` (the two cells; needs matplotlib, skipped without)."""
    ctx: Context = state.context
    geno = ctx.retrain.get("genotype") or genotype(state)
    extra = {"genotype": geno.to_json(),
             "search_time_s": ctx.timings["search"], "retrain_time_s": ctx.timings["retrain"],
             "compile_time_s": {"search": ctx.timings["compile_search"],
                                "retrain": ctx.timings["compile_retrain"]},
             "search_iterations": ctx.search_iterations * ctx.config.search_steps,
             "retrain_iterations": ctx.retrain_iterations * ctx.config.retrain_epochs,
             "paper_gdp": paper_gdp(ctx.config, state, run_config["privacy"]["delta"])}
    if out_dir is not None:
        out = Path(out_dir)
        (out / "genotype.json").write_text(json.dumps(geno.to_json(), indent=2))
        try:
            from fedjax_dp.models import genotype_plot
            genotype_plot.plot_genotype(geno, out / "genotype.png")
            extra["genotype_png"] = str(out / "genotype.png")
        except ImportError:                        # matplotlib is the optional 'plot' extra
            extra["genotype_png"] = None
    return extra
