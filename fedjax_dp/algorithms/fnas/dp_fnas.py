"""DP-FNAS (Singh et al.; dp-fnas paper Algorithm 1) on the protocol: search, then retrain.

The K parties are the stacked agent axis of :class:`~fedjax_dp.algorithms.api.FederatedData`.
Each party splits its own records deterministically: its first ``ceil(n_k / 2)`` records are its
training half (weights W, and the second-order term), the rest its validation half (the
architecture alpha). Networks: :mod:`fedjax_dp.models.darts`; update functions:
:mod:`.steps`; accounting: :mod:`.privacy`; config: :mod:`.config` (the ``[model]`` table is
not used); the parties' halves: :mod:`.data`.

Steps. Step t < ``search_epochs`` is one search EPOCH: ``ceil(max_k n_k^tr / batch_size)``
iterations of the compiled search step, one per call. The remaining ``retrain_epochs`` steps
retrain the fixed network of the derived genotype from scratch with DP federated SGD over ALL
records of every party. ``output`` is the retrained network (the search network before
retraining starts). An iteration of either phase is :func:`iteration`
``(value, k_epoch, i, data) -> (value, metrics)``.

Seeds (:func:`batch_plan` / :func:`batched_step`): the iterations of S seeds run as ONE call
vmapped over the seeds; retraining needs host work per seed (the derived genotype decides the
network), so seeds with equal genotypes retrain together. A search epoch equal to one run
earlier in the process is replayed (:mod:`.search_memo`), so a grid over ``retrain_seed`` costs
one search.

Mesh (``runtime.mesh``, an ``agents`` mesh, possibly spanning several processes under
``jax.distributed``; needs ``runtime.backend = "vmap"``): the parties' halves and retraining data
are global arrays split over the mesh (:mod:`.data`: each process reads only its own devices'
parties), every iteration runs each party's mechanisms on exactly one device and the means over
parties are a cross-device ``psum`` (:func:`.steps.party_mean`); the server state (W, alpha,
their optimiser states; the retraining state) is replicated on the mesh, so the host reads it
as before. Each party keeps its key (its global index), hence its noise: the results equal a
run without a mesh up to the summation order. ``Context.agents_per_process`` counts the parties
each process handled. Seeds then run one by one (:func:`batch_plan` declines).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import time
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.algorithms import api
from fedjax_dp.algorithms.fnas import privacy as fnas_privacy, search_memo, steps
from fedjax_dp.algorithms.fnas.placement import agents_per_process, compile_checked, replicated_on
from fedjax_dp.algorithms.fnas.config import (RANDOM_GENOTYPE, Config, mechanism,
                                             memory_drivers, search_hyper)
from fedjax_dp.algorithms.fnas.data import (check_parties, host_rates, iterations_per_epoch,
                                           make_retrain_data, make_search_data, split_halves)
from fedjax_dp.core import rng, seed_axis
from fedjax_dp.models import Model, darts
from fedjax_dp.privacy import PrivacyLedger

DESCRIPTION = ("DP-FNAS: federated, differentially private DARTS search of K parties, then DP "
               "retraining of the derived network (instance level, Singh et al.)")
USES_LOCAL_TRAIN = False


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
    rates: dict = dataclasses.field(default_factory=dict)  # host [K] rates: train, val, retrain
    # real parties whose data (and work) each process holds: one entry per process with a mesh
    # (summed over processes they give K), (K,) without (this process runs every party)
    agents_per_process: tuple = ()


def init(key: jax.Array, data: api.FederatedData, model: Model, config: Config,
         runtime: api.Runtime = api.Runtime()) -> api.State:
    """Validate the parties, split their halves, initialise W and alpha (the search step is
    compiled by the first step). ``model`` is not used: the networks come from the config.
    ``runtime.mesh``: the parties' data split over the mesh, the state replicated on it (see
    the module)."""
    api.check_init(config, Config)
    counts = np.asarray(data.agents.counts)
    check_parties(counts)
    mesh = runtime.mesh
    if mesh is not None and runtime.backend != "vmap":
        raise ValueError("DP-FNAS: runtime.mesh needs runtime.backend='vmap' (the loop backend "
                         "is the one-device reference)")
    search_data = make_search_data(data.agents, config.batch_size, mesh)
    retrain_data = make_retrain_data(data.agents, config.retrain_batch_size, mesh)
    n_train, _ = split_halves(counts)
    iters = iterations_per_epoch(n_train, config.batch_size)
    retrain_iters = iterations_per_epoch(counts, config.retrain_batch_size)
    net = darts.search_network(config.space, tuple(data.feature_shape), data.num_classes)
    fns = steps.make_search(net, search_hyper(config, iters * config.search_epochs),
                            backend=runtime.backend, mesh=mesh,
                            num_parties=None if mesh is None else len(counts))
    timings = {"search": 0.0, "retrain": 0.0, "compile_search": 0.0, "compile_retrain": 0.0}
    ctx = Context(config=config, model=net, search_data=search_data, retrain_data=retrain_data,
                  search_fns=fns, search_iterations=iters, retrain_iterations=retrain_iters,
                  runtime=runtime, timings=timings, retrain={},
                  fixed=fixed_genotype(key, config),
                  rates=host_rates(data.agents, config.batch_size, config.retrain_batch_size),
                  agents_per_process=agents_per_process(search_data.train.mask, len(counts),
                                                        mesh))
    state = replicated_on(ctx.runtime.mesh, fns.init(api.init_key(key)))
    return api.State(step=0, values={"search": state}, context=ctx)


def num_steps(config: Config) -> int:
    return config.search_steps + config.retrain_epochs


#: the retraining phase's state, which ``init``'s (the search's) does not hold: a checkpoint
#: of a retraining epoch rebuilds it by this exact name (:mod:`fedjax_dp.experiments.checkpoint`)
checkpoint_types = (steps.RetrainState,)


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

    ``seeds``: vmapped over a leading seed axis of ``value`` and ``k_epoch`` (and of ``data``
    with ``data_axis = 0``), ``i`` shared. ``compiled``: jitted (``runtime.backend = "vmap"``),
    else the plain function (the loop backend). Cached on its arguments.
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
    hyper = steps.RetrainHyper(mech=mechanism(c, "clip_retrain", "noise_retrain", c.retrain_private),
                               lr=c.retrain_lr,
                               total_iterations=ctx.retrain_iterations * c.retrain_epochs)
    return fixed, steps.make_retrain(fixed, hyper, backend=ctx.runtime.backend,
                                     mesh=ctx.runtime.mesh,
                                     num_parties=None if ctx.runtime.mesh is None
                                     else len(ctx.rates["retrain"]))


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
        values["retrain"] = replicated_on(ctx.runtime.mesh, ctx.retrain["fns"].init(k_init))


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
    else:                                      # with a mesh: replicated on it
        value, k_epoch = replicated_on(ctx.runtime.mesh, (values[0][phase], k_epochs[0]))
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
        if not config.diagnostics:     # the iterations' metrics are not private: an opt-in
            metrics[s] = {}
        metrics[s] = dict(metrics[s], phase=0 if phase == "search" else 1,
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
    (the seeds then run one by one) with the loop backend or a mesh, or when the seeds' data
    shapes or epoch lengths differ."""
    if not states or len({s.step for s in states}) != 1:
        return None
    ctxs: list[Context] = [s.context for s in states]
    c0 = ctxs[0]
    if c0.runtime.backend != "vmap" or c0.runtime.mesh is not None:
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
    """Step t of S seeds of one config (``plan`` from :func:`batch_plan`), entry s equal to
    ``step(states[s], keys[s])`` to float tolerance (:func:`_step_seeds`)."""
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
    tr, va, re = ctx.rates["train"], ctx.rates["val"], ctx.rates["retrain"]
    t = ctx.search_iterations * config.search_steps
    t_re = ctx.retrain_iterations * config.retrain_epochs if config.retrain_private else 0
    return [fnas_privacy.record_events(
        rate_train=float(tr[k]), rate_val=float(va[k]), rate_retrain=float(re[k]), iterations=t,
        retrain_iterations=t_re, noise_weights=config.noise_weights, noise_arch=config.noise_arch,
        noise_second=config.noise_second if config.order == "second" else None,
        noise_retrain=config.noise_retrain) for k in range(len(tr))]


def privacy_units(config: Config) -> tuple[str, ...]:
    """The ``privacy_units`` hook (:class:`fedjax_dp.algorithms.api.Algorithm`): ``instance``
    (the per-party ledgers' units are instances too); none when not private."""
    return (fnas_privacy.UNIT,) if config.private else ()


def ledger(config: Config, state: api.State) -> tuple[PrivacyLedger, ...]:
    """Instance-level guarantee of the whole planned run (:func:`.privacy.ledgers`: the worst
    record, then one ledger per party when parties differ). Non-private: empty."""
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
    if config.diagnostics:
        out = tuple(lg.declare_uncovered(*DIAGNOSTICS_UNCOVERED) for lg in out)
    return out


#: The epoch diagnostics (``Config.diagnostics``) as a release the ledgers do not cover
#: (:meth:`PrivacyLedger.declare_uncovered`): ``(release, reason)``. The phase and the timings
#: are reported always (public: the step index and wall-clock seconds).
DIAGNOSTICS_UNCOVERED = (
    "diagnostic metrics train_loss, val_loss, clipped_w, clipped_alpha, clipped_second, "
    "batch_train, batch_val (realised batch sizes), retrain_loss and clipped_retrain of "
    "every epoch (history, progress.jsonl)",
    "computed from the parties' records without noise: not private "
    "(algorithm.diagnostics = false leaves them out)")


def paper_gdp(config: Config, state: api.State, delta: float) -> dict | None:
    """The paper's Theorem 3.1 GDP mu per party and its (epsilon, delta) (None if not private)."""
    if not config.private:
        return None
    ctx: Context = state.context
    return fnas_privacy.paper_gdp(
        rates_train=ctx.rates["train"].tolist(), rates_val=ctx.rates["val"].tolist(),
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
