"""The compiled round of every ISRL-DP method: one pure ``round(key, values, data)``.

    round(key, values, data: SiloData) -> (values, metrics)

``values`` is the whole mutable state (a pytree of arrays; see :func:`initial_values`), ``data``
the silos' stacked records and their record-sampling plan. Static choices (method, M, prox, q, ...)
live in :class:`RoundSpec` and are compiled in; the hyper-parameters a sweep tunes (step size,
clip norm, noise multiplier) are arrays in ``values["hyper"]``, so one compiled round vmaps over
many seeds / step sizes / clips.

Round r (every method):

    k_avail, k_silos, k_extra = split(key, 3)
    S_r      = M silos uniformly at random: ids [M] (availability.available_ids(k_avail))
    gather   the cohort's rows of every per-silo array into [M, ...] buffers: records x, y, mask,
             sampling plan (rates, denominators), noise multipliers z, silo keys
             (silo i's key is split(k_silos, N)[i], whichever silos are gathered with it)
    u_i      = silo i's upload (uploads.py) for the M gathered silos, in one vmapped (or chunked /
             sharded) call
    avg      = (1/M) sum_{i in S_r} u_i                                                 secure sum
    v_r      = the method's estimator: avg (MB-SGD), SPIDER or SVRG update (estimators.py)
    w_{r+1}  = prox_{eta f1}(w_r - eta v_r)
    scatter  uploads[ids] += this round's releases per kind

Local SGD instead runs K local noisy prox-SGD steps in every available silo from w_r (each step an
upload of eq. (1) of :mod:`uploads`, kept inside the silo) and averages the M local models.
Each method's :class:`UpdateRule` lives in its module (:mod:`mb_sgd`, :mod:`spider`,
:mod:`svrg`, :mod:`local_sgd`), looked up by ``RoundSpec.method`` at compile time.

A round computes M uploads, not N (a static-shape gather; what stays O(N) is bookkeeping and the
optional ``report_objective``: docs/isrl.md). ``make_round(..., cohort="masked")`` is the
reference: all N silos compute their upload (same keys) and a mask keeps the M available ones;
it equals the gathered round up to float summation order (tested for every method).

``values["uploads"][i, u]`` counts silo i's releases of kind u (what its ledger composes).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree

from fedjax_dp.algorithms.isrl import availability, estimators, uploads
from fedjax_dp.algorithms.isrl import prox as prox_lib
from fedjax_dp.core import StackedData, agent_sum, for_each_agent
from fedjax_dp.core.cohort import masked_sum, take_rows

Params = Any

class Update(NamedTuple):
    """What a method's update rule returns for one round.

    params: w_{r+1}. state: the method's own entries of ``values`` that change (e.g. SPIDER's
    ``v``). uploads: int32 ``[U]``, the releases of each kind one available silo made this round.
    stats: the silos' summed upload stats (``batch_size``, ``clipped``). metrics: extra round
    metrics (e.g. ``difference_clip``).
    """

    params: Params
    state: dict
    uploads: jax.Array
    stats: dict
    metrics: dict


@dataclasses.dataclass(frozen=True)
class RoundTools:
    """What a round hands a method's update rule (built inside the compiled round).

    w, t, lr, clip: the iterate, the round index and the hyper-parameters. prox: f1. k_extra: a
    key the rule may use (never used by the uploads). spec: the round's static description.
    gradients(col) / differences(ref, tau): thunks ``() -> (avg, stats)``, the server's average
    of the available silos' gradient (eq. (1) of :mod:`uploads`, kind column ``col``) or
    difference (eq. (2), column 1) uploads. local(): ``(local models [M, ...], stats)``, K local
    noisy prox-SGD steps in every available silo. average(tree): ``(1/M) sum_{i in S_r}``.
    """

    w: Params
    t: jax.Array
    lr: jax.Array
    clip: jax.Array
    prox: prox_lib.Prox
    k_extra: jax.Array
    spec: Any
    gradients: Callable
    differences: Callable
    local: Callable
    average: Callable


@dataclasses.dataclass(frozen=True)
class UpdateRule:
    """One ISRL method: its upload kinds, its per-config plans and its server update.

    name: the method (``RoundSpec.method``). kinds: the upload kinds (columns of
    ``values["uploads"]`` and ``SiloData.rates``). shuffle: the SDP variant exists (the shuffled
    vector sum replaces the Gaussian uploads). differences: the method sends difference uploads
    (two per-record gradients per record; sensitivity tau <= 2C).
    """

    name: str
    kinds: tuple[str, ...]
    shuffle: bool = False
    differences: bool = False

    def batch_sizes(self, config) -> tuple[int, ...]:
        """K of each upload kind (config fields)."""
        return (config.batch_size,)

    def spec_fields(self, config) -> dict:
        """The method's static :class:`RoundSpec` fields."""
        return {}

    def planned(self, config) -> tuple[int, ...]:
        """Uploads of each kind of a silo available every round (what z is calibrated for)."""
        return (config.rounds,)

    def init_state(self, spec: "RoundSpec", params: Params) -> dict:
        """The method's own entries of ``values`` before round 0."""
        return {}

    def update(self, r: RoundTools, values: dict) -> Update:
        """One round's server update (pure; traced inside the compiled round)."""
        raise NotImplementedError


#: name -> update rule (filled by the method modules, :func:`register`).
RULES: dict[str, UpdateRule] = {}


def register(rule: UpdateRule) -> UpdateRule:
    """Add ``rule`` under ``rule.name`` (a method module does this once, on import)."""
    if rule.name in RULES and RULES[rule.name] != rule:
        raise ValueError(f"ISRL method {rule.name!r} is registered twice")
    RULES[rule.name] = rule
    return rule


def rule_for(method: str) -> UpdateRule:
    """The update rule of ``method`` (a registered name)."""
    if method not in RULES:
        raise ValueError(f"method must be one of {sorted(RULES)}, got {method!r}")
    return RULES[method]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SiloData:
    """The silos' records and record-sampling plan (a pytree, leading axis N everywhere).

    rates [N, U]: Poisson rate p_iu of silo i's records in an upload of kind u.
    denominators [N, U]: the fixed expected batch size p_iu n_i each upload divides by.
    """

    agents: StackedData
    rates: jax.Array
    denominators: jax.Array


def sampling_plan(counts, batch_sizes) -> tuple[np.ndarray, np.ndarray]:
    """``(rates, denominators)`` ``[N, U]`` float64: ``p_iu = min(1, K_u / n_i)``, ``p_iu n_i``."""
    n = np.asarray(counts, np.float64).reshape(-1, 1)                      # [N, 1]
    k = np.asarray(batch_sizes, np.float64).reshape(1, -1)                 # [1, U]
    rates = np.minimum(1.0, k / n)
    return rates, rates * n


def silo_data(agents: StackedData, batch_sizes) -> SiloData:
    rates, denoms = sampling_plan(np.asarray(agents.counts), batch_sizes)
    return SiloData(agents=agents, rates=jnp.asarray(rates, jnp.float32),
                    denominators=jnp.asarray(denoms, jnp.float32))


@dataclasses.dataclass(frozen=True)
class RoundSpec:
    """Static description of a round (hashable: the compiled round is cached on it).

    period: q (SPIDER phase length) or m (SVRG epoch length). restart_every: Prox-PL-SVRG restarts
    from a uniformly random iterate every this many rounds (0: never). smoothness: beta_hat of
    the difference clip (None: 2C). private=False: no clipping, no noise. shuffle: a
    :class:`fedjax_dp.privacy.shuffle.ShuffleConfig` replaces the silos' Gaussian uploads by the
    shuffled vector sum of all available silos' per-record reports (SDP MB-SGD / SPIDER).
    batch_sizes: the expected batch K_u of each upload kind, the passes' plan (empty: one pass
    over all n_max rows, same values). report_objective / diagnostics: the round also reports
    ``f0``, ``f1``, ``objective`` / ``batch_size`` and (private) ``clipped_fraction``, computed
    without noise (the protocol's private configs leave them off by default).
    """

    method: str
    num_silos: int
    num_available: int
    prox: prox_lib.Prox = prox_lib.Prox()
    private: bool = True
    period: int = 1
    restart_every: int = 0
    local_steps: int = 1
    smoothness: float | None = None
    report_objective: bool = True
    diagnostics: bool = True       # realised batch sizes, clipped fractions
    shuffle: Any = None            # a privacy.shuffle.ShuffleConfig: the SDP variants
    batch_sizes: tuple[int, ...] = ()    # expected batch K of each upload kind (() : unplanned)

    @property
    def rule(self) -> UpdateRule:
        return rule_for(self.method)

    @property
    def kinds(self) -> tuple[str, ...]:
        return self.rule.kinds


def hyper(learning_rate: float, clip_norm: float, noise_multiplier) -> dict:
    """``values["hyper"]``: float32 (vmap over them to sweep). ``noise_multiplier``: a scalar or
    one z per silo ``[N]`` (:func:`initial_values` broadcasts it to ``[N]``).

    The noise multipliers are rounded UP to float32 (the noise drawn is never below the
    calibrated one; the ledger reads these values back)."""
    z64 = np.asarray(noise_multiplier, np.float64)
    z = z64.astype(np.float32)
    z = np.where(z.astype(np.float64) < z64, np.nextafter(z, np.float32(np.inf)), z)
    return {"learning_rate": jnp.float32(learning_rate), "clip_norm": jnp.float32(clip_norm),
            "noise_multiplier": jnp.asarray(z, jnp.float32)}


def initial_values(spec: RoundSpec, params: Params, hyper_values: dict) -> dict:
    """The state before round 0 (pure, so it can be vmapped over initial parameters)."""
    hyper_values = dict(hyper_values)
    hyper_values["noise_multiplier"] = jnp.broadcast_to(
        hyper_values["noise_multiplier"], (spec.num_silos,))                   # [N]
    values = {"params": params, "round": jnp.zeros((), jnp.int32),
              "uploads": jnp.zeros((spec.num_silos, len(spec.kinds)), jnp.int32),
              "hyper": hyper_values}
    values.update(spec.rule.init_state(spec, params))
    return values


@functools.lru_cache(maxsize=None)
def loss_for(model) -> Callable:
    """The per-record cross-entropy of ``model`` (one function object per model, for caching)."""
    from fedjax_dp.train import cross_entropy
    return cross_entropy(model)


def expected(spec: RoundSpec, kind: int) -> int | None:
    """The expected batch K of upload kind ``kind`` (None when ``spec.batch_sizes`` has none)."""
    return spec.batch_sizes[kind] if kind < len(spec.batch_sizes) else None


def silo_functions(loss_fn: Callable, spec: RoundSpec) -> dict[str, Callable]:
    """The one-silo functions a round lifts over the silo axis (each pure, for ONE silo):

    gradient(key, params, x, y, mask, rate, denom, clip, z) -> (u, stats)      uploads eq. (1)
    difference(key, params, ref, x, y, mask, rate, denom, clip, tau, z) -> (u, stats)   eq. (2)
    local_sgd(key, params, x, y, mask, rate, denom, clip, z, lr) -> (params, stats): K local
        noisy prox-SGD steps (step k uses ``split(key, K)[k]``)
    loss(params, x, y, mask) -> mean loss over the silo's real records (f0's term)
    """
    gradient = uploads.gradient_upload(loss_fn, spec.private, expected(spec, 0))
    prox = spec.prox

    def local_sgd(key, params, x, y, mask, rate, denom, clip, z, lr):
        def body(p, k):
            u, st = gradient(k, p, x, y, mask, rate, denom, clip, z)
            return estimators.prox_step(prox, p, u, lr), st

        p, st = jax.lax.scan(body, params, jax.random.split(key, spec.local_steps))
        return p, jax.tree.map(jnp.sum, st)

    def loss(params, x, y, mask):
        losses = jax.vmap(loss_fn, in_axes=(None, 0, 0))(params, x, y)        # [n_max]
        w = mask.astype(losses.dtype)
        return jnp.sum(w * losses) / jnp.maximum(jnp.sum(w), 1.0)

    return {"gradient": gradient,
            "difference": uploads.difference_upload(loss_fn, spec.private, expected(spec, 1)),
            "local_sgd": local_sgd, "loss": loss}


COHORTS = ("gather", "masked")


class SiloCalls(NamedTuple):
    """The one-silo functions of :func:`silo_functions` lifted over the silo axis (z per silo,
    ``[N]``: each silo's noise is calibrated for its own transcript); the SDP report functions
    (``spec.shuffle``) or None."""

    gradient: Callable
    difference: Callable
    local_sgd: Callable
    loss: Callable
    gradient_reports: Callable | None
    difference_reports: Callable | None


def silo_calls(loss_fn: Callable, spec: RoundSpec, lift: Callable) -> SiloCalls:
    """:class:`SiloCalls` of ``spec``, each lifted by ``lift(fn, in_axes)``; ``ValueError`` if
    ``spec.shuffle`` is set for a method without an SDP variant."""
    one = silo_functions(loss_fn, spec)
    grad_up = lift(one["gradient"], (0, None, 0, 0, 0, 0, 0, None, 0))
    diff_up = lift(one["difference"], (0, None, None, 0, 0, 0, 0, 0, None, None, 0))
    local_up = lift(one["local_sgd"], (0, None, 0, 0, 0, 0, 0, None, 0, None))
    objective = lift(one["loss"], (None, 0, 0, 0))
    grad_rep = diff_rep = None
    if spec.shuffle is not None:
        if not spec.rule.shuffle:
            raise ValueError(f"shuffle applies to methods "
                             f"{sorted(n for n, r in RULES.items() if r.shuffle)}, got "
                             f"{spec.method!r}")
        grad_rep = lift(uploads.gradient_reports(loss_fn, spec.shuffle, expected(spec, 0)),
                        (0, None, 0, 0, 0, 0))
        diff_rep = lift(uploads.difference_reports(loss_fn, spec.shuffle, expected(spec, 1)),
                        (0, None, None, 0, 0, 0, 0, None, None))
    return SiloCalls(gradient=grad_up, difference=diff_up, local_sgd=local_up, loss=objective,
                     gradient_reports=grad_rep, difference_reports=diff_rep)


class RoundCohort(NamedTuple):
    """A round's silos: ``rows(tree)`` the rows of a per-silo array the round computes on,
    ``total(tree)`` their sum over the available silos. ``'gather'``: ``ids [M]`` the available
    silos, ``rows`` takes them, ``total`` sums the M rows (``avail`` None). ``'masked'``: every
    silo's row, ``avail [N]`` the availability mask ``total`` keeps (``ids`` None)."""

    rows: Callable
    total: Callable
    ids: jax.Array | None
    avail: jax.Array | None


def draw_cohort(k_avail, spec: RoundSpec, gather: bool) -> RoundCohort:
    """This round's :class:`RoundCohort`: M silos uniformly at random (:mod:`availability`)."""
    n = spec.num_silos
    if gather:
        # the cohort: rows ids [M] of every per-silo array (a static-shape gather)
        ids = availability.available_ids(k_avail, n, spec.num_available)         # [M]
        return RoundCohort(rows=functools.partial(take_rows, ids=ids),
                           total=agent_sum, ids=ids, avail=None)              # sums M rows
    avail = availability.available_mask(k_avail, n, spec.num_available)          # [N]
    return RoundCohort(rows=lambda tree: tree,
                       total=functools.partial(masked_sum, valid=avail > 0), ids=None,
                       avail=avail)


def round_tools(calls: SiloCalls, spec: RoundSpec, values: dict, data: SiloData,
                cohort: RoundCohort, silo_keys, k_extra) -> RoundTools:
    """The :class:`RoundTools` of one round: the cohort's rows of the silos' keys, records,
    sampling plan and noise multipliers, and the uploads' thunks over them."""
    h = values["hyper"]
    lr, clip = h["learning_rate"], h["clip_norm"]
    w, t = values["params"], values["round"]
    rows, total, m = cohort.rows, cohort.total, float(spec.num_available)
    keys = rows(silo_keys)                                                     # [M] or [N]
    a = rows(data.agents)
    rates, denoms = rows(data.rates), rows(data.denominators)
    z = rows(h["noise_multiplier"])                                            # z [M] or [N]
    unravel = ravel_pytree(w)[1]

    def average(tree):
        return jax.tree.map(lambda l: l / m, total(tree))

    def gradients(col):
        """(avg, stats): the server's average of the silos' gradient uploads."""
        if spec.shuffle is not None:
            return lambda: shuffled(*calls.gradient_reports(keys, w, a.x, a.y, a.mask,
                                                            rates[:, col]),
                                    denoms[:, col], 1.0)

        def run():
            u, st = calls.gradient(keys, w, a.x, a.y, a.mask, rates[:, col], denoms[:, col],
                                   clip, z)
            return average(u), st
        return run

    def differences(ref, tau):
        if spec.shuffle is not None:
            return lambda: shuffled(*calls.difference_reports(keys, w, ref, a.x, a.y, a.mask,
                                                              rates[:, 1], clip, tau),
                                    denoms[:, 1], tau / clip)

        def run():
            u, st = calls.difference(keys, w, ref, a.x, a.y, a.mask, rates[:, 1], denoms[:, 1],
                                     clip, tau, z)
            return average(u), st
        return run

    def shuffled(sums, st, denom, scale):
        """SDP: the available silos' encoded reports (integer sums ``[., d]``, each silo's
        computed in the silo with its own key) go through ONE shuffled vector sum (the server
        sees only the per-coordinate integer sums plus binomial noise); decoded, rescaled by
        ``scale`` and divided by the expected number of reports ``sum_{i in S_r} p_i n_i``."""
        est = uploads.shuffled_estimate(jax.random.fold_in(k_extra, 1), total(sums),
                                        spec.shuffle)                        # [d]
        return unravel(est * scale / total(denom)), st

    def local():
        return calls.local_sgd(keys, w, a.x, a.y, a.mask, rates[:, 0], denoms[:, 0], clip, z, lr)

    return RoundTools(w=w, t=t, lr=lr, clip=clip, prox=spec.prox, k_extra=k_extra, spec=spec,
                      gradients=gradients, differences=differences, local=local,
                      average=average)


def finish_round(calls: SiloCalls, spec: RoundSpec, values: dict, data: SiloData,
                 cohort: RoundCohort, out: Update) -> tuple[dict, dict]:
    """``(values, metrics)`` after the method's update ``out``: w_{r+1}, the method's state, the
    round index, the scattered upload counters and the round metrics."""
    w, t = values["params"], values["round"]
    new = dict(values)
    new.update(out.state)
    metrics = dict(out.metrics)
    new_w, inc, st = out.params, out.uploads, out.stats
    new["params"] = new_w
    new["round"] = t + 1
    gather = cohort.ids is not None
    if gather:       # scatter back: only the M available silos' counters move (ids distinct)
        new["uploads"] = values["uploads"].at[cohort.ids].add(inc[None, :])
    else:
        new["uploads"] = (values["uploads"]
                          + cohort.avail.astype(jnp.int32)[:, None] * inc[None, :])
    num = jnp.float32(float(spec.num_available)) if gather else jnp.sum(cohort.avail)
    metrics["num_available"] = num
    if spec.diagnostics:
        st = cohort.total(st)
        metrics["batch_size"] = st["batch_size"] / (num * spec.local_steps)
        if spec.private:
            metrics["clipped_fraction"] = st["clipped"] / jnp.maximum(st["batch_size"], 1.0)
    metrics["update_norm"] = optax.tree.norm(jax.tree.map(jnp.subtract, new_w, w))
    if spec.report_objective:
        # a diagnostic over ALL silos' records (a forward pass of every silo, no gradients)
        full = data.agents
        f0 = jnp.mean(calls.loss(new_w, full.x, full.y, full.mask))
        f1 = prox_lib.value(spec.prox, new_w)
        metrics.update(f0=f0, f1=f1, objective=f0 + f1)
    return new, metrics


@functools.lru_cache(maxsize=64)
def make_round(loss_fn: Callable, spec: RoundSpec, *, chunk_size: int | None = None, mesh=None,
               backend: str = "vmap", cohort: str = "gather") -> Callable:
    """The jitted round of ``spec`` with per-record loss ``loss_fn(params, x, y)``.

    ``cohort``: ``'gather'`` (M uploads) or ``'masked'`` (N uploads, a mask keeps the M
    available ones: the reference). ``backend='loop'``: a Python loop over the silos (unrolled
    when traced; :func:`fedjax_dp.core.for_each_agent`), the vectorised path's reference. With a
    ``mesh`` the padding rows of the silo axis are dropped before any sum.

    The round (the module's "Round r"): :func:`draw_cohort`, :func:`round_tools` for the
    method's :meth:`UpdateRule.update`, then :func:`finish_round`.
    """
    if cohort not in COHORTS:
        raise ValueError(f"runtime.cohort must be one of {COHORTS}, got {cohort!r}")
    lift = functools.partial(for_each_agent, chunk_size=chunk_size, mesh=mesh, backend=backend)
    calls = silo_calls(loss_fn, spec, lift)
    rule = spec.rule
    gather = cohort == "gather"

    def round_fn(key, values, data: SiloData):
        k_avail, k_silos, k_extra = jax.random.split(key, 3)
        silo_keys = jax.random.split(k_silos, spec.num_silos)  # [N]: silo i's key is silo_keys[i]
        drawn = draw_cohort(k_avail, spec, gather)
        tools = round_tools(calls, spec, values, data, drawn, silo_keys, k_extra)
        out = rule.update(tools, values)                     # the method's own update rule
        return finish_round(calls, spec, values, data, drawn, out)

    return jax.jit(round_fn)
