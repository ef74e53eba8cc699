"""The ISRL-DP family on the algorithm protocol (:mod:`fedjax_dp.algorithms.api`).

Every registered algorithm of the family is an :class:`Algorithm` object (the protocol is
structural: ``Config``, ``DESCRIPTION``, ``USES_LOCAL_TRAIN``, ``init``, ``num_steps``, ``step``,
``ledger``, ``output``) around the shared compiled round of :mod:`engine`. The config classes
hold every field of a run (they do not read the ``[train]`` table).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import numpy as np

from fedjax_dp.algorithms import api
from fedjax_dp.algorithms.isrl import availability, calibration, engine
from fedjax_dp.algorithms.isrl import prox as prox_lib
from fedjax_dp.core import memory
from fedjax_dp.core import validation
from fedjax_dp.core.lift import replicate, resolve_chunk_size
from fedjax_dp.models import Model
from fedjax_dp.privacy import PrivacyLedger, accounting, calibration as calib_lib
from fedjax_dp.train import check_trainable
from fedjax_dp.privacy.private_grad import per_example_bytes


# --------------------------------------------------------------------------- configs

@dataclasses.dataclass(frozen=True)
class Config:
    """Fields of every method (the non-private baselines use exactly these).

    rounds: R communication rounds. num_available: M silos available per round (None: all N;
    1 <= M <= N is checked at ``init``, when N is known). learning_rate: eta. batch_size: K, the
    expected number of records of each upload (Poisson rate ``min(1, K / n_i)`` in silo i).
    prox / prox_strength / prox_radius / prox_low / prox_high: f1 (:mod:`prox`).
    report_objective: report F = f0 + f1 at the new iterate every round (a diagnostic over all
    records of all silos; not private). diagnostics: report each round's realised batch size
    ``batch_size`` (and, private members, ``clipped_fraction``). Both are on for the
    non-private baselines here; a private member (:class:`PrivateConfig`, the SDP configs)
    turns both off by default, since its guarantee does not cover them (an explicit opt-in).
    """

    rounds: int = 50
    num_available: int | None = None
    learning_rate: float = 0.1
    batch_size: int = 16
    prox: str = "none"
    prox_strength: float = 0.0
    prox_radius: float = 1.0
    prox_low: float = -1.0
    prox_high: float = 1.0
    report_objective: bool = True
    diagnostics: bool = True

    FIELDS = {"rounds": validation.Int(1), "num_available": validation.Int(1, optional=True),
              "learning_rate": validation.Float(0.0, low_open=True),
              "batch_size": validation.Int(1, validation.BATCH_MAX),
              "prox": validation.Choice(prox_lib.NAMES), "prox_strength": validation.Float(0.0),
              "prox_radius": validation.Float(0.0, low_open=True),
              "prox_low": validation.Float(), "prox_high": validation.Float(),
              "report_objective": validation.Bool(), "diagnostics": validation.Bool()}

    def __post_init__(self):
        validation.check_config(self, "algorithm")     # every field, subclasses' too
        self.make_prox()

    def make_prox(self) -> prox_lib.Prox:
        return prox_lib.Prox(self.prox, self.prox_strength, self.prox_radius, self.prox_low,
                             self.prox_high)


#: Types and ranges of the budget fields of every private member (Gaussian or shuffled).
BUDGET_FIELDS = {"clip_norm": validation.Float(0.0, low_open=True),
                 "target_epsilon": validation.Float(0.0, low_open=True),
                 "delta": validation.Float(0.0, 1.0, low_open=True, high_open=True)}

#: Types and ranges of SPIDER's own fields (ISRL-DP and SDP).
SPIDER_FIELDS = {"phase_length": validation.Int(1),
                 "diff_batch_size": validation.Int(1, validation.BATCH_MAX, optional=True),
                 "smoothness": validation.Float(0.0, low_open=True, optional=True)}


@dataclasses.dataclass(frozen=True)
class PrivateConfig(Config):
    """ISRL-DP fields. clip_norm: C (per-record clip, global L2 norm). target_epsilon / delta:
    each silo's whole transcript is (eps, delta)-DP (delta defaults to ``[privacy].delta`` when
    run from a config file). noise_multiplier: skip calibration and use this z (std / sensitivity
    of every upload). accountant: the dp-accounting accountant of the calibration.
    calibrate_per_silo: each silo gets the smallest z that meets the target for its own sampling
    rates (default), or (false) every silo gets the z of the silo with the largest rates.
    report_objective, diagnostics: off by default (explicit opt-ins; :func:`declare_uncovered`
    declares them when on)."""

    report_objective: bool = False      # the round metrics computed without noise: opt-ins
    diagnostics: bool = False
    clip_norm: float = 1.0
    target_epsilon: float = 1.0
    delta: float = 1e-5
    noise_multiplier: float | None = None
    accountant: str = "rdp"
    calibrate_per_silo: bool = True

    FIELDS = {**BUDGET_FIELDS,
              "noise_multiplier": validation.Float(0.0, accounting.GAUSSIAN_NOISE_RANGE[1],
                                                   optional=True),
              "accountant": validation.Choice(accounting.ACCOUNTANTS),
              "calibrate_per_silo": validation.Bool()}


def declare_uncovered(config, out: PrivacyLedger) -> PrivacyLedger:
    """The round metrics of a private member that no upload accounts for (ISRL-DP and SDP),
    each reported only when its config opts in: realised batch sizes and clipped fractions
    (``diagnostics``), and the objective over all records (``report_objective``).
    ``update_norm``, ``difference_clip`` and ``num_available`` are functions of the released
    iterates and of the data-independent availability: covered, always reported."""
    if config.diagnostics:
        out.declare_uncovered(
            "diagnostic metrics batch_size (the realised Poisson batch sizes) and "
            "clipped_fraction of every round (history, progress.jsonl)",
            "computed from the silos' records without noise: not private "
            "(algorithm.diagnostics = false leaves them out)")
    if config.report_objective:
        out.declare_uncovered(
            "the objective f0 / objective over all silos' records of every round "
            "(report_objective = true)",
            "computed from every record without noise: not private "
            "(algorithm.report_objective = false leaves it out)")
    return out


# --------------------------------------------------------------------------- the algorithm

@dataclasses.dataclass(frozen=True)
class Context:
    """Static part of a run's state."""

    data: engine.SiloData
    model: Model
    spec: engine.RoundSpec
    round_fn: Any
    noise_multiplier: np.ndarray       # [N] z_i of silo i's uploads (0 when non-private)
    rates: np.ndarray                  # [N, U] float64, host copy of data.rates


@dataclasses.dataclass(frozen=True)
class Algorithm:
    """One member of the family: ``method``, a registered update rule's name
    (:func:`engine.rule_for`, whose ``batch_sizes`` / ``spec_fields`` / ``planned`` it reads),
    private or not."""

    name: str
    Config: type
    DESCRIPTION: str
    method: str
    private: bool
    USES_LOCAL_TRAIN: bool = False

    # ----------------------------------------------------------------- per-method plans
    @property
    def rule(self) -> engine.UpdateRule:
        """The method's update rule (registered by its module: :mod:`mb_sgd`, ...)."""
        return engine.rule_for(self.method)

    def batch_sizes(self, config) -> tuple[int, ...]:
        return self.rule.batch_sizes(config)

    def spec_fields(self, config) -> dict:
        return self.rule.spec_fields(config)

    def planned(self, config) -> tuple[int, ...]:
        return self.rule.planned(config)

    # ----------------------------------------------------------------- protocol
    def noise_multiplier(self, config, rates: np.ndarray) -> np.ndarray:
        """z ``[N]``: the config's, or calibrated per silo (one calibration per distinct row of
        rates; ``calibrate_per_silo = false``: one z for the largest rate of each kind)."""
        n = rates.shape[0]
        if not self.private:
            return np.zeros(n)
        if config.noise_multiplier is not None:
            return np.full(n, float(config.noise_multiplier))
        planned = self.planned(config)
        if not config.calibrate_per_silo:
            rows = np.broadcast_to(np.max(rates, axis=0), rates.shape)
        else:
            rows = rates
        # one calibration per DISTINCT row of rates (host side, once per run; equal-size silos
        # share one), then every silo reads its row's z
        distinct, inverse = np.unique(np.asarray(rows, np.float64), axis=0, return_inverse=True)
        z = np.array([self.calibrate_silo(config, list(zip(row, planned)))
                      for row in distinct.tolist()])
        return z[np.reshape(inverse, -1)]

    def calibrate_silo(self, config, releases: list[tuple[float, int]]) -> float:
        """z of one silo whose planned transcript is ``releases`` ``[(rate, count)]`` per kind:
        the smallest meeting the target for all kinds composed (:func:`calibration.calibrate`).
        SPIDER's ``accounting = "reference"`` overrides it (:mod:`spider`)."""
        return calibration.calibrate(config.target_epsilon, config.delta, releases,
                                     config.accountant)

    def accounting_note(self, config) -> str:
        """Extra words for the ledger's note (default none; SPIDER's reference accounting)."""
        return ""

    def init(self, key: jax.Array, data: api.FederatedData, model: Model, config,
             runtime: api.Runtime = api.Runtime(), *, loss_fn=None) -> api.State:
        """Validate against the data, calibrate the noise, compile the round (once per spec).
        ``loss_fn(params, x, y)``: per-record loss (default: the model's cross-entropy)."""
        api.check_init(config, self.Config)
        agents = data.agents if isinstance(data, api.FederatedData) else data
        check_trainable(agents)
        n = agents.num_agents
        m = n if config.num_available is None else availability.check(config.num_available, n)
        sdata = engine.silo_data(agents, self.batch_sizes(config))
        rates = np.asarray(engine.sampling_plan(np.asarray(agents.counts),
                                                self.batch_sizes(config))[0])
        params = model.init(api.init_key(key))
        z, extra = self.mechanism(config, rates, params)
        spec = engine.RoundSpec(method=self.method, num_silos=n, num_available=m,
                                prox=config.make_prox(), private=self.private,
                                report_objective=config.report_objective,
                                diagnostics=config.diagnostics,
                                batch_sizes=tuple(int(k) for k in self.batch_sizes(config)),
                                **self.spec_fields(config), **extra)
        chunk = resolve_chunk_size(runtime.chunk_size, num_agents=agents.num_agents,
                                   bytes_per_agent=per_example_bytes(params, agents.max_size))
        if self.rule.differences and chunk is not None:
            chunk = max(1, chunk // 2)          # two per-record gradients per silo
        round_fn = engine.make_round(loss_fn or engine.loss_for(model), spec, chunk_size=chunk,
                                     mesh=runtime.mesh, backend=runtime.backend,
                                     cohort=runtime.cohort)
        # refused before its first run if it cannot fit (fedjax_dp.core.memory)
        round_fn = memory.checked(round_fn, what=f"a round of {m} of {n} silos", drivers=(
            lambda: {"run.chunk_size": memory.chunk_driver(runtime.chunk_size, chunk),
                     "algorithm.num_available": m, **memory.model_driver(model, params)}))
        clip = config.clip_norm if self.private else math.inf
        values = engine.initial_values(spec, params, engine.hyper(config.learning_rate, clip, z))
        if runtime.mesh is not None:
            # replicated on the mesh, as the round returns them: round 2 runs round 1's program
            # (not a second compilation for inputs placed otherwise)
            values = replicate(values, runtime.mesh)
        return api.State(step=0, values=values,
                         context=Context(data=sdata, model=model, spec=spec, round_fn=round_fn,
                                         noise_multiplier=z, rates=rates))

    def mechanism(self, config, rates: np.ndarray, params) -> tuple[float, dict]:
        """``(z, extra RoundSpec fields)``: the Gaussian noise multiplier
        (:meth:`noise_multiplier`), no extra fields."""
        return self.noise_multiplier(config, rates), {}

    def num_steps(self, config) -> int:
        return config.rounds

    def step(self, state: api.State, key: jax.Array) -> tuple[api.State, dict]:
        ctx: Context = state.context
        values, metrics = ctx.round_fn(key, state.values, ctx.data)
        return api.State(step=state.step + 1, values=values, context=ctx), metrics

    def seed_step(self, state: api.State):
        """``(round_fn, data, spec)``: the round as a pure function of ``(key, values, data)``,
        vmapped over seeds by :func:`fedjax_dp.algorithms.seeds.run_seeds`."""
        ctx: Context = state.context
        return ctx.round_fn, ctx.data, ctx.spec

    def output(self, state: api.State) -> api.Output:
        return api.Output(model=state.context.model, params=state.values["params"])

    def privacy_units(self, config) -> tuple[str, ...]:
        """The ``privacy_units`` hook: ``silo_record`` (none for the non-private baselines)."""
        return (calibration.UNIT,) if self.private else ()

    def ledger(self, config, state: api.State) -> PrivacyLedger:
        """What each silo released (``state.values["uploads"]``), worst silo by parallel
        composition; empty for the non-private baselines."""
        if not self.private:
            return PrivacyLedger()
        if state is None:
            raise ValueError("state must be the run's state (its upload counts feed the ledger)")
        ctx: Context = state.context
        counts = np.asarray(state.values["uploads"], np.int64)                 # [N, U]
        hyper = state.values.get("hyper", {}) if isinstance(state.values, dict) else {}
        z = np.asarray(hyper["noise_multiplier"] if "noise_multiplier" in hyper
                       else ctx.noise_multiplier, np.float64)   # the run's own z (per silo)
        z = np.broadcast_to(z, (counts.shape[0],))
        events = [calibration.silo_event(float(zi), list(zip(r, c)))
                  for zi, r, c in zip(z.tolist(), ctx.rates.tolist(), counts.tolist())]
        keep = calib_lib.worst_members(ctx.rates, counts, z)
        kinds = ", ".join(ctx.spec.kinds)
        sens = ("sensitivity C for gradient uploads, tau = min(2C, beta_hat ||w - w_ref||) <= 2C "
                "for difference uploads (noise std z times it)" if self.rule.differences
                else "sensitivity C (noise std z C)")
        note = (f"{self.name}: each silo composes its own uploads ({kinds}; {sens}; Poisson record "
                f"sampling, noise multipliers {z.min():.6g}..{z.max():.6g}, no amplification from "
                f"silo availability); worst silo by parallel composition; members = silos "
                f"{keep.tolist()[:20]}{' ...' if len(keep) > 20 else ''} (the others are "
                f"dominated in rates, counts and noise){self.accounting_note(config)}")
        return declare_uncovered(config, PrivacyLedger()).add_parallel(
            calibration.UNIT, [events[i] for i in keep], relation=calibration.RELATION,
            sensitivity=config.clip_norm, note=note)
