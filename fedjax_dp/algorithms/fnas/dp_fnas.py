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
import json
import math
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.algorithms import api
from fedjax_dp.algorithms.fnas import privacy as fnas_privacy
from fedjax_dp.algorithms.fnas import steps
from fedjax_dp.core import validation
from fedjax_dp.models import Model, darts
from fedjax_dp.privacy import PrivacyLedger

DESCRIPTION = ("DP-FNAS: federated, differentially private DARTS search of K parties, then DP "
               "retraining of the derived network (instance level, Singh et al.)")
USES_LOCAL_TRAIN = False


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
    ``fixed_genotype`` (a genotype's JSON): skip the search and retrain that genotype.
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

    def __post_init__(self):
        v = validation
        v.check_int("algorithm.nodes", self.nodes, minimum=1)
        v.check_int("algorithm.channels", self.channels, minimum=1)
        v.check_int("algorithm.cells", self.cells, minimum=1)
        object.__setattr__(self, "primitives",
                           darts.check_primitives("algorithm.primitives", self.primitives))
        v.check_int("algorithm.stem_multiplier", self.stem_multiplier, minimum=1)
        v.check_int("algorithm.search_epochs", self.search_epochs, minimum=1)
        v.check_int("algorithm.batch_size", self.batch_size, minimum=1)
        v.check_choice("algorithm.order", self.order, ("first", "second"))
        v.check_choice("algorithm.second_order_method", self.second_order_method,
                       ("finite_difference", "jvp"))
        for name in ("xi", "w_weight_decay", "alpha_weight_decay", "w_momentum"):
            v.check_nonnegative(f"algorithm.{name}", getattr(self, name))
        for name in ("w_lr", "w_lr_min", "alpha_lr", "retrain_lr"):
            v.check_positive(f"algorithm.{name}", getattr(self, name))
        for name in ("alpha_b1", "alpha_b2"):
            v.check_probability(f"algorithm.{name}", getattr(self, name), allow_zero=True)
        if not isinstance(self.private, bool):
            raise ValueError(f"algorithm.private must be true or false, got {self.private!r}")
        for name in ("clip_weights", "clip_arch", "clip_second", "clip_retrain"):
            c = v.check_positive(f"algorithm.{name}", getattr(self, name))
            if not math.isfinite(c):
                raise ValueError(f"algorithm.{name} must be finite, got {c!r}")
        for name in ("noise_weights", "noise_arch", "noise_second", "noise_retrain"):
            v.check_nonnegative(f"algorithm.{name}", getattr(self, name))
        v.check_int("algorithm.retrain_epochs", self.retrain_epochs, minimum=0)
        v.check_int("algorithm.retrain_batch_size", self.retrain_batch_size, minimum=1)
        v.check_int("algorithm.retrain_channels", self.retrain_channels, minimum=0)
        v.check_int("algorithm.retrain_cells", self.retrain_cells, minimum=0)
        if not isinstance(self.fixed_genotype, str):
            raise ValueError(f"algorithm.fixed_genotype must be a genotype JSON string or \"\", "
                             f"got {self.fixed_genotype!r}")
        if self.fixed_genotype:
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


def _mech(config: Config, clip: str, noise: str) -> steps.Mechanism:
    return steps.Mechanism(clip=float(getattr(config, clip)), noise=float(getattr(config, noise)),
                           private=config.private)


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
    search_step: Any
    search_iterations: int                 # per epoch
    retrain_iterations: int                # per epoch
    runtime: api.Runtime
    timings: dict                          # host bookkeeping: cumulative seconds per phase
    retrain: dict                          # lazily built: model, step


_COMPILED: dict = {}


def _compiled(fn, *args) -> tuple[Any, float]:
    """``fn`` (a jitted function) compiled for the shapes of ``args``, and the seconds compiling
    took (0 when an equal run already compiled it: runs with equal configs and shapes share it)."""
    sig = (fn, jax.tree.structure(args),
           tuple((np.shape(a), str(jnp.asarray(a).dtype) if not isinstance(a, jax.Array)
                  else str(a.dtype)) for a in jax.tree.leaves(args)))
    if sig in _COMPILED:
        return _COMPILED[sig], 0.0
    start = time.perf_counter()
    _COMPILED[sig] = fn.lower(*args).compile()
    return _COMPILED[sig], time.perf_counter() - start


def init(key: jax.Array, data: api.FederatedData, model: Model, config: Config,
         runtime: api.Runtime = api.Runtime()) -> api.State:
    """Validate the parties, split their halves, initialise W and alpha, compile the search step.

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
    step_fn = fns.step
    if runtime.backend == "vmap" and config.search_steps:
        with runtime.progress.task("compile search step", total=1, unit="step") as task:
            step_fn, timings["compile_search"] = _compiled(fns.step, state, jax.random.key(0),
                                                           search_data)
            task.update(1)
    ctx = Context(config=config, model=net, search_data=search_data, retrain_data=retrain_data,
                  search_step=step_fn, search_iterations=iters, retrain_iterations=retrain_iters,
                  runtime=runtime, timings=timings, retrain={})
    return api.State(step=0, values={"search": state}, context=ctx)


def num_steps(config: Config) -> int:
    return config.search_steps + config.retrain_epochs


def step_label(config: Config, t: int) -> str:
    """Step ``t`` (1-based) named by its phase: ``search epoch 3/10`` or ``retrain epoch 1/5``."""
    if t <= config.search_steps:
        return f"search epoch {t}/{config.search_steps}"
    return f"retrain epoch {t - config.search_steps}/{config.retrain_epochs}"


def _iterate(progress, name: str, count: int, fn, value, k_iter, data, records: list):
    """``count`` iterations ``value, m = fn(value, fold_in(k_iter, i), data)`` (metrics appended
    to ``records``), reported as task ``name``: iteration i - 1 is waited for (and counted) once
    iteration i is queued, so the device never idles and the bar counts finished iterations."""
    with progress.task(name, total=count, unit="iteration") as task:
        for i in range(count):
            value, m = fn(value, jax.random.fold_in(k_iter, i), data)
            if progress.enabled and i:
                jax.block_until_ready(records[-1])          # iteration i - 1 has finished
                task.update(1)
            records.append(m)
        if progress.enabled and count:
            jax.block_until_ready(records[-1])
            task.update(1)
    return value


def genotype(state: api.State) -> darts.Genotype:
    """The genotype derived from the current global alpha (DARTS rule), or the fixed one."""
    if state.context.config.fixed_genotype:
        return darts.Genotype.from_json(state.context.config.fixed_genotype)
    return darts.derive_genotype(state.values["search"].alpha, state.context.config.space)


def _retrain_fns(ctx: Context, geno: darts.Genotype, feature_shape, num_classes):
    c = ctx.config
    fixed = darts.fixed_network(geno, tuple(feature_shape), num_classes,
                                channels=c.retrain_channels or c.channels,
                                cells=c.retrain_cells or c.cells,
                                stem_multiplier=c.stem_multiplier)
    hyper = steps.RetrainHyper(mech=_mech(c, "clip_retrain", "noise_retrain"), lr=c.retrain_lr,
                               total_iterations=ctx.retrain_iterations * c.retrain_epochs)
    return fixed, steps.make_retrain(fixed, hyper, backend=ctx.runtime.backend)


def _mean_metrics(records: list[dict]) -> dict:
    """Epoch means of the iterations' scalar metrics, on the host (one transfer; a device-side
    stack of a variable number of scalars recompiles per length and crashed XLA's CPU compiler
    at 12 operands)."""
    host = jax.device_get(records)
    return {k: float(np.mean([r[k] for r in host])) for k in host[0]}


def step(state: api.State, key: jax.Array) -> tuple[api.State, dict]:
    """One search epoch (steps < search_epochs), else one retraining epoch."""
    ctx: Context = state.context
    k_init, k_iter = jax.random.split(key)
    values = dict(state.values)
    start = time.perf_counter()
    records = []
    if state.step < ctx.config.search_steps:
        values["search"] = _iterate(ctx.runtime.progress, "search", ctx.search_iterations,
                                    ctx.search_step, values["search"], k_iter, ctx.search_data,
                                    records)
        metrics = _mean_metrics(records)
        ctx.timings["search"] += time.perf_counter() - start
        metrics["phase"] = 0
    else:
        if "step" not in ctx.retrain:     # first retraining step, or resumed from a checkpoint
            geno = genotype(state)
            feature_shape = ctx.search_data.train.x.shape[2:]
            fixed, fns = _retrain_fns(ctx, geno, feature_shape, ctx.model.num_classes)
            if "retrain" not in values:
                values["retrain"] = fns.init(k_init)
            step_fn = fns.step
            if ctx.runtime.backend == "vmap":
                with ctx.runtime.progress.task("compile retrain step", total=1,
                                               unit="step") as task:
                    step_fn, ctx.timings["compile_retrain"] = _compiled(
                        fns.step, values["retrain"], k_iter, ctx.retrain_data)
                    task.update(1)
            ctx.retrain.update(model=fixed, step=step_fn, genotype=geno)
        values["retrain"] = _iterate(ctx.runtime.progress, "retrain", ctx.retrain_iterations,
                                     ctx.retrain["step"], values["retrain"], k_iter,
                                     ctx.retrain_data, records)
        metrics = _mean_metrics(records)
        ctx.timings["retrain"] += time.perf_counter() - start
        metrics["phase"] = 1
    metrics.update(search_time_s=ctx.timings["search"], retrain_time_s=ctx.timings["retrain"])
    return api.State(step=state.step + 1, values=values, context=ctx), metrics


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
    t_re = ctx.retrain_iterations * config.retrain_epochs
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
    return fnas_privacy.ledgers(_record_events(config, state.context), note=note)


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
