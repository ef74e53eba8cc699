"""Adaptive clipping (Andrew, Thakkar, McMahan, Ramaswamy, "Differentially Private Learning with
Adaptive Clipping", NeurIPS 2021): the clip norm follows a target quantile of the cohort's
update norms.

Round t, clip norm C_t, cohort S_t, expected cohort size m (q N, or C for fixed-size cohorts)::

    b_i      = 1[ ||Delta_i||_2 <= C_t ]                        (the paper's Eq. 2's indicator)
    s_t      = sum_{i in S_t} (b_i - 1/2)  +  N(0, sigma_b^2)   (centred: sensitivity 1/2)
    bbar_t   = s_t / m + 1/2                                    (noisy fraction unclipped)
    C_{t+1}  = C_t exp(-eta_C (bbar_t - gamma))                 (geometric update, Section 3)

and the updates' sum gets ``N(0, (z_Delta C_t)^2 I)``. Both releases are Gaussian mechanisms on
the *same* sampled cohort, so together they are ONE Gaussian mechanism on the vector
``(sum clip(Delta_i), s_t)``: scaling the count's coordinate by ``z_Delta C_t / sigma_b`` makes the
noise isotropic, and one agent moves the vector by at most ``C_t sqrt(1 + z_Delta^2 / (2 sigma_b)^2)``,
so the round's noise multiplier is (the paper's Section 3, "combined" z)::

    z = (z_Delta^-2 + (2 sigma_b)^-2)^(-1/2)      <=>      z_Delta = (z^-2 - (2 sigma_b)^-2)^(-1/2)

The user states the guarantee's z (``algorithm.noise_multiplier``) and sigma_b; the update noise
z_Delta is derived (:func:`update_noise_multiplier`), so the ledger's event is the fixed-clip
event of z: ``SelfComposed(PoissonSampled(q, Gaussian(z)), T)`` under add/remove one agent. C_t is
a function of earlier releases only (post-processing), so a data-dependent clip costs nothing
beyond s_t. The paper's default sigma_b = m / 20 (``count_noise = "default"``).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from fedjax_dp.core import rng, validation

__all__ = ["AdaptiveClip", "parse", "update_noise_multiplier", "centred_unclipped",
           "next_clip_norm", "OPTIONS"]

#: the keys of ``algorithm.adaptive_clip`` and their meaning (named in every refusal)
OPTIONS = {"target_quantile": "gamma in (0, 1), the fraction of updates left unclipped",
           "learning_rate": "eta_C > 0, the geometric update's step",
           "count_noise": "sigma_b >= 0, the std of the unclipped count's noise, or \"default\" "
                          "(m / 20, the paper's choice)",
           "max_clip_norm": "an upper bound on C_t (> 0; needed with secure aggregation)"}


@dataclasses.dataclass(frozen=True)
class AdaptiveClip:
    """The quantile tracker: target quantile gamma, geometric learning rate eta_C, the count's
    noise std sigma_b (None: the paper's m / 20, resolved with the cohort), an optional cap on
    C_t (``max_clip_norm``; secure aggregation bounds its ring by it)."""

    target_quantile: float = 0.5
    learning_rate: float = 0.2
    count_noise: float | None = None
    max_clip_norm: float | None = None

    def count_std(self, expected_cohort: float) -> float:
        """sigma_b: as given, or the paper's ``m / 20``."""
        return expected_cohort / 20.0 if self.count_noise is None else float(self.count_noise)


_POSITIVE = validation.Float(0.0, low_open=True)            # a finite number > 0


def parse(name: str, value: Any) -> AdaptiveClip | None:
    """``algorithm.adaptive_clip``: None / ``false`` (a fixed clip), ``true`` (the paper's
    defaults) or a table of :data:`OPTIONS`; every key checked, named on refusal."""
    if value is True:
        return AdaptiveClip()
    table = validation.options_table(name, value, OPTIONS, off=False, cls=AdaptiveClip,
                                     accepts=f"true, false or a table of {sorted(OPTIONS)}")
    if not isinstance(table, dict):
        return table
    out = {"target_quantile": validation.check_open_unit(
               f"{name}.target_quantile", table.get("target_quantile", 0.5)),
           "learning_rate": _POSITIVE(f"{name}.learning_rate", table.get("learning_rate", 0.2))}
    noise = table.get("count_noise", "default")
    out["count_noise"] = None if noise == "default" else validation.Float(0.0)(
        f"{name}.count_noise", noise)
    cap = table.get("max_clip_norm")
    out["max_clip_norm"] = None if cap is None else _POSITIVE(f"{name}.max_clip_norm", cap)
    return AdaptiveClip(**out)


def update_noise_multiplier(noise_multiplier: float, count_std: float) -> float:
    """z_Delta = (z^-2 - (2 sigma_b)^-2)^(-1/2): the updates' noise multiplier that, with the
    count's noise sigma_b (sensitivity 1/2), makes the round one Gaussian mechanism of multiplier
    z. Needs ``2 sigma_b > z`` (else no update noise can reach z); ``z = 0`` (no privacy): 0."""
    z, sb = float(noise_multiplier), float(count_std)
    if z == 0.0:
        return 0.0
    if not 2.0 * sb > z:
        raise ValueError(f"algorithm.adaptive_clip.count_noise (sigma_b = {sb:g}) must exceed "
                         f"noise_multiplier / 2 = {z / 2:g}: the round's combined noise "
                         f"multiplier z = (z_Delta^-2 + (2 sigma_b)^-2)^-1/2 is below "
                         f"2 sigma_b for every update noise z_Delta")
    return (z ** -2 - (2.0 * sb) ** -2) ** -0.5


def centred_unclipped(norm: jax.Array, clip: jax.Array) -> jax.Array:
    """``b - 1/2`` with ``b = 1[norm <= clip]``: one agent's term of the count (in {-1/2, 1/2})."""
    return jnp.where(norm <= clip, 0.5, -0.5).astype(jnp.float32)


def next_clip_norm(key: jax.Array, clip: jax.Array, centred_sum: jax.Array, denominator,
                   count_std: float, cfg: AdaptiveClip) -> tuple[jax.Array, jax.Array]:
    """``(C_{t+1}, bbar_t)``: the noisy unclipped fraction ``bbar_t = (s + N(0, sigma_b^2)) / m
    + 1/2`` (m: ``denominator``, the round's) and the geometric step
    ``C_t exp(-eta_C (bbar_t - gamma))``, capped at ``max_clip_norm``. ``count_std``: sigma_b
    (:meth:`AdaptiveClip.count_std` of the expected cohort, the ledger's). ``key``: the round's
    noise key; the count draws from its own stream of it (never the updates' draw)."""
    noisy = centred_sum + count_std * jax.random.normal(rng.stream(key, "unclipped_count"), (),
                                                        jnp.float32)
    fraction = noisy / denominator + 0.5
    new = clip * jnp.exp(-cfg.learning_rate * (fraction - cfg.target_quantile))
    if cfg.max_clip_norm is not None:
        new = jnp.minimum(new, cfg.max_clip_norm)
    return new.astype(jnp.float32), fraction
