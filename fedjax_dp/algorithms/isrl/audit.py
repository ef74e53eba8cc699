"""Audit harnesses of the ISRL family: one ISRL-DP silo gradient upload, one shuffle-DP release.

Registers ``isrl-upload`` and ``sdp-upload`` with :mod:`fedjax_dp.audit.harness` (what an
:class:`Auditable` is and how it is run) when the family is imported.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.algorithms.isrl import calibration, sdp, uploads
from fedjax_dp.audit.harness import (Auditable, Spec, canary_projection, canary_worlds,
                                     check_gaussian_params, check_scale, flat, register)
from fedjax_dp.core import validation
from fedjax_dp.privacy import PrivacyLedger, shuffle
from fedjax_dp.privacy.shuffle_accounting import make_event

__all__ = ["scalar_loss", "silo_records", "silo_inputs", "isrl_upload_harness",
           "sdp_upload_harness", "SDP_DEFAULT_NOISE_TRIALS"]


def scalar_loss(params, x, y):
    """The tiny linear model of the silo audits: ``0.5 (w x - y)^2`` with ONE weight ``w``
    (``x``, ``y`` scalars; one coordinate, so the shuffle accounting's per-coordinate
    composition is tight). Gradient at ``w = 0``: ``-x y``."""
    return 0.5 * (params["w"][0] * x - y) ** 2


def silo_records(num: int, scale: float, clip: float) -> tuple[np.ndarray, np.ndarray]:
    """Record 0 the canary (gradient ``-scale * clip`` at ``w = 0``); the others zero gradient."""
    x = np.zeros((num,), np.float32)
    y = np.zeros((num,), np.float32)
    x[0], y[0] = 1.0, scale * clip
    return x, y


def silo_inputs(num_records, scale, clip):
    """``(n, x [n], y [n], {neighbour: mask [n]})``: the silo's records (:func:`silo_records`)
    and the two worlds' record masks (D: all present; D': the canary, record 0, removed)."""
    n = validation.check_int("num_records", num_records, minimum=1)
    x, y = silo_records(n, scale, clip)
    return n, jnp.asarray(x), jnp.asarray(y), canary_worlds(n)


def isrl_upload_harness(weaken, *, noise_multiplier, clip_norm, num_records, canary_scale,
                        accountant) -> Auditable:
    """One ISRL-DP gradient upload of one silo (eq. (1), :func:`uploads.gradient_upload` with
    ``private=True``): Poisson records at rate 1, per-record clip to C, ``N(0, (z C)^2)``,
    divided by ``n``. Neighbours: the silo's canary record present vs removed (the library's
    relation, add/remove one record of one silo). Statistic: the upload's projection on the
    canary's clipped gradient. Claimed: :func:`isrl.calibration.silo_event` with one upload at
    rate 1. ``no-clip``: clip ``10 * canary_scale * C`` with noise multiplier scaled so the
    noise std stays ``z C``.
    """
    z, clip, scale = check_gaussian_params(noise_multiplier, clip_norm, canary_scale, accountant)
    n, x, y, worlds = silo_inputs(num_records, scale, clip)
    params = {"w": jnp.zeros((1,), jnp.float32)}
    upload = uploads.gradient_upload(scalar_loss, True)
    run_clip, run_z = clip, z
    if weaken == "no-clip":
        run_clip = 10.0 * scale * clip
        run_z = z * clip / run_clip
    elif weaken == "halve-noise":
        run_z = z / 2

    def release(key, w):
        u, _ = upload(key, w["params"], w["x"], w["y"], w["mask"], 1.0, float(n), w["clip"],
                      w["z"])
        return flat(u)

    inputs = {nb: {"params": params, "x": x, "y": y, "mask": m, "clip": jnp.float32(run_clip),
                   "z": jnp.float32(run_z)} for nb, m in worlds.items()}

    one = canary_projection(scalar_loss, release)     # along the canary's clipped gradient

    def claimed(delta):
        ledger = PrivacyLedger().add_event(calibration.UNIT,
                                           calibration.silo_event(z, [(1.0, 1)]),
                                           relation=calibration.RELATION, sensitivity=clip)
        return ledger.epsilon(calibration.UNIT, delta, accountant)

    params_out = dict(noise_multiplier=z, clip_norm=clip, num_records=n, canary_scale=scale,
                      accountant=accountant, record_sampling_rate=1.0)
    return Auditable("isrl-upload", params_out, weaken, calibration.UNIT, calibration.RELATION,
                     one, inputs, claimed, structure=(n,))


#: ``shuffle_accounting.calibrate_noise_trials(1.0, 1e-5, granularity=8, dimension=1,
#: releases=1)``.
SDP_DEFAULT_NOISE_TRIALS = 3570


def sdp_upload_harness(weaken, *, noise_trials, granularity, clip_norm, num_records,
                       canary_scale) -> Auditable:
    """One shuffle-DP release (:mod:`fedjax_dp.algorithms.isrl.sdp`): the silo's per-record
    gradient reports (:func:`uploads.gradient_reports`: L2 clip to C, grid C / K, randomised
    rounding), then the server's binomial sum (:func:`uploads.shuffled_estimate`,
    ``Bin(N, 1/2)``). One coordinate (the scalar model), records at rate 1. Neighbours: the
    canary report present vs removed. Statistic: the decoded sum, signed along the canary.
    Claimed: ``make_event(config, 1, 1)`` through a ledger (PLD of the binomial pair).
    ``halve-noise``: ``N // 4`` trials (std ``sqrt(N)/2`` halves). (No ``no-clip`` variant: the
    clip and the grid are one config here, so a skipped clip is a different protocol.)
    """
    big_n = validation.check_int("noise_trials", noise_trials, minimum=4,
                                 maximum=shuffle.MAX_NOISE_TRIALS)
    k = validation.check_int("granularity", granularity, minimum=1, maximum=2 ** 12)
    clip = validation.check_positive("clip_norm", clip_norm, finite=True)
    scale = check_scale(canary_scale)
    cfg = shuffle.ShuffleConfig(clip_norm=clip, granularity=k, noise_trials=big_n)
    run_cfg = cfg
    if weaken == "halve-noise":
        run_cfg = cfg.replace(noise_trials=big_n // 4)
    n, x, y, worlds = silo_inputs(num_records, scale, clip)
    params = {"w": jnp.zeros((1,), jnp.float32)}
    reports = uploads.gradient_reports(scalar_loss, run_cfg)

    def one(key, inputs):
        w = inputs
        # The canary's report moves the sum by K grid steps in the sign of its gradient.
        sign = jnp.sign(jax.grad(scalar_loss)(w["params"], w["x"][0], w["y"][0])["w"][0])
        k_silo, k_server = jax.random.split(key)
        sums, _ = reports(k_silo, w["params"], w["x"], w["y"], w["mask"], 1.0)   # [1] int32
        return sign * uploads.shuffled_estimate(k_server, sums, run_cfg)[0]

    inputs = {nb: {"params": params, "x": x, "y": y, "mask": m} for nb, m in worlds.items()}

    def claimed(delta):
        ledger = PrivacyLedger().add_shuffle(sdp.UNIT, make_event(cfg, 1, 1),
                                             relation=sdp.RELATION)
        return ledger.epsilon(sdp.UNIT, delta, "pld")

    params_out = dict(noise_trials=big_n, granularity=k, clip_norm=clip, num_records=n,
                      canary_scale=scale, accountant="pld", record_sampling_rate=1.0)
    return Auditable("sdp-upload", params_out, weaken, sdp.UNIT, sdp.RELATION, one, inputs,
                     claimed, structure=(n, run_cfg))


register("isrl-upload", Spec(
    "one ISRL-DP silo gradient upload (isrl/uploads.gradient_upload), canary record",
    dict(noise_multiplier=3.7, clip_norm=1.0, num_records=4, canary_scale=100.0,
         accountant="pld"),
    ("halve-noise", "no-clip"), isrl_upload_harness,
    applies={"canary_scale": lambda weaken, p: None if weaken == "no-clip" else
             "the canary's gradient is clipped to clip_norm whatever its scale (the scale "
             "matters with weaken='no-clip' only)"}))
register("sdp-upload", Spec(
    "one shuffle-DP release (isrl/uploads.gradient_reports + shuffled_estimate), canary",
    dict(noise_trials=SDP_DEFAULT_NOISE_TRIALS, granularity=8, clip_norm=1.0,
         num_records=4, canary_scale=100.0),
    ("halve-noise",), sdp_upload_harness,
    applies={"canary_scale": lambda weaken, p: "the canary's report is clipped to clip_norm and "
             "rounded to the grid whatever its scale (and sdp-upload has no no-clip variant)",
             "num_records": lambda weaken, p: "the other records' gradients are zero, so their "
             "reports add nothing, and the binomial sum is not divided by the record count"}))
