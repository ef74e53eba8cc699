"""ISRL-DP FedProx-SPIDER (Lowy et al., Alg. 3), general phase length q.

Round r (one upload per available silo):

    r mod q == 0:  u_i = noisy mean clipped gradient at w_r over ~K1 records          (refresh)
                   v_r = (1/M) sum_{i in S_r} u_i
    otherwise:     u_i = noisy mean over ~K2 records of
                         clip_tau( clip_C(g(w_r, x)) - clip_C(g(w_{r-1}, x)) )        (difference)
                   v_r = v_{r-1} + (1/M) sum_{i in S_r} u_i
    w_{r+1} = prox_{eta f1}(w_r - eta v_r)

tau_r: :func:`estimators.difference_clip`. The server keeps v, so partial participation works.
q = 2 (alternate refresh and difference rounds) is the authors' run; q = 1 is MB-SGD.

Privacy per silo: refresh uploads (rate min(1, K1/n_i), sensitivity C) and difference uploads
(rate min(1, K2/n_i), sensitivity tau_r) are both Poisson-sampled Gaussian mechanisms with
multiplier z, composed over the rounds the silo was available (the reference code calibrated each
of its two uploads per round to the whole budget).

``accounting = "reference"`` reproduces that sizing (:func:`calibration.reference_calibrate`);
the ledger still composes every upload really sent, so the run reports its TRUE epsilon
(``nominal_epsilon`` keeps the target). The authors' R rounds are ``rounds = 2 R`` here at q = 2.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from fedjax_dp.algorithms.isrl import calibration, engine, estimators
from fedjax_dp.algorithms.isrl.protocol import SPIDER_FIELDS, Algorithm, PrivateConfig
from fedjax_dp.core import validation


@dataclasses.dataclass(frozen=True)
class Rule(engine.UpdateRule):
    """The SPIDER round of the module docstring (state: ``v`` and the previous iterate)."""

    name: str = "spider"
    kinds: tuple[str, ...] = ("refresh", "difference")
    shuffle: bool = True
    differences: bool = True

    def batch_sizes(self, config) -> tuple[int, ...]:
        return (config.batch_size, config.diff_batch_size or config.batch_size)

    def spec_fields(self, config) -> dict:
        return dict(period=config.phase_length, smoothness=config.smoothness)

    def planned(self, config) -> tuple[int, ...]:
        return estimators.refresh_counts(config.rounds, config.phase_length)

    def init_state(self, spec, params) -> dict:
        return dict(prev_params=params, v=jax.tree.map(jnp.zeros_like, params))

    def update(self, r: engine.RoundTools, values: dict) -> engine.Update:
        spec = r.spec
        refresh = estimators.is_refresh(r.t, spec.period)
        tau = estimators.difference_clip(r.w, values["prev_params"], r.clip, spec.smoothness)
        avg, st = jax.lax.cond(refresh, r.gradients(0), r.differences(values["prev_params"], tau))
        v = estimators.spider_update(values["v"], avg, refresh)
        return engine.Update(
            params=estimators.prox_step(r.prox, r.w, v, r.lr), state=dict(prev_params=r.w, v=v),
            uploads=jnp.stack([refresh, ~refresh]).astype(jnp.int32), stats=st,
            metrics={"difference_clip": jnp.where(refresh, jnp.nan, tau)})


RULE = engine.register(Rule())


#: ``algorithm.accounting``: "composed" (every upload composes in the silo's ledger; correct)
#: or "reference" (the reference code's sizing: each upload kind alone meets the target).
ACCOUNTINGS = ("composed", "reference")


@dataclasses.dataclass(frozen=True)
class Config(PrivateConfig):
    """FedProx-SPIDER. phase_length: q. batch_size: K1 (refresh); diff_batch_size: K2
    (difference; None: K1). smoothness: beta_hat of the difference clip (None: clip at 2C).
    accounting: ``"composed"`` (default: z meets the target for all uploads composed) or
    ``"reference"`` (the authors' code: each upload kind alone meets the target; the run's
    ledger reports the true, larger epsilon; needs a calibrated z, not ``noise_multiplier``)."""

    phase_length: int = 2
    diff_batch_size: int | None = None
    smoothness: float | None = None
    accounting: str = "composed"

    FIELDS = {**SPIDER_FIELDS, "accounting": validation.Choice(ACCOUNTINGS)}

    def __post_init__(self):
        super().__post_init__()
        if self.accounting == "reference" and self.noise_multiplier is not None:
            raise ValueError("algorithm.accounting = 'reference' sizes the calibrated noise: "
                             "leave algorithm.noise_multiplier unset (got "
                             f"{self.noise_multiplier})")


@dataclasses.dataclass(frozen=True)
class SpiderAlgorithm(Algorithm):
    """ISRL-DP SPIDER: the family's algorithm plus the ``accounting`` option (module docstring)."""

    def calibrate_silo(self, config, releases: list[tuple[float, int]]) -> float:
        if config.accounting == "reference":
            return calibration.reference_calibrate(config.target_epsilon, config.delta,
                                                   releases, config.accountant)
        return super().calibrate_silo(config, releases)

    def accounting_note(self, config) -> str:
        if config.accounting != "reference":
            return ""
        return (f"; accounting = reference (the ISRL reference code's sizing): z calibrated so "
                f"that EACH upload kind alone meets the nominal epsilon "
                f"{config.target_epsilon:g}; this guarantee composes every upload sent: its "
                f"epsilon is the run's TRUE epsilon, not the nominal one")

    def artifacts(self, state, out_dir, run_config: dict) -> dict:
        """result.json fields of a reference-accounting run: ``accounting`` and
        ``nominal_epsilon`` (the target the noise was sized for, beside the true epsilon in
        ``privacy``); nothing for the default accounting."""
        table = run_config.get("algorithm", {})
        if table.get("accounting", "composed") != "reference":
            return {}
        return {"accounting": "reference",
                "nominal_epsilon": float(table.get("target_epsilon", Config.target_epsilon))}


ISRL_SPIDER = SpiderAlgorithm(
    name="isrl_spider", Config=Config, method=RULE.name, private=True,
    DESCRIPTION="ISRL-DP FedProx-SPIDER, phase length q, smoothness-based difference clip "
                "(Lowy et al. 2023, Alg. 3)")
