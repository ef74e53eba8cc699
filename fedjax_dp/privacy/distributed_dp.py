"""Distributed DP under secure aggregation: the distributed discrete Gaussian (DDG; Kairouz, Liu,
Steinke, ICML 2021) and the Skellam mechanism (Agarwal, Kairouz, Liu, NeurIPS 2021). No party
adds noise alone: each client adds a small discrete share, and only the modular sum is seen.

One round, for a cohort of m clients (fixed size, drawn without replacement) of which M survive
(DDG paper Algorithm 1 / Skellam paper Algorithm 1 and 2)::

  client i:   x_i   = clip(Delta_i, c) / gamma                     scale (gamma: the plan's)
              u_i   = U x_i = H D pad(x_i) / sqrt(d')               rotation (rotation.py; D public)
              r_i   = conditional_round(u_i, Delta_2)               ||r_i||_2 <= Delta_2 always
              y_i   = r_i + n_i  mod 2^b,  n_i ~ N_Z(0, mu / n_min) (ddg) or Sk(mu / n_min) (skellam)
  secagg:     s     = sum_{i alive} y_i  mod 2^b                    pairwise masks (secagg_masks)
  server:     abort the round (no update, nothing released) if M < n_min; else
              v     = s read in [-2^(b-1), 2^(b-1))                 unwrap
              sum   = gamma U^T v                                   inverse rotation, rescale

The server's view is ``s`` (and the masked inputs, uniform on the ring): nothing else leaves a
client. ``mu`` (the plan's ``total_variance``) is ``(z c / gamma)^2``: with n_min survivors the
noise's std in model units is at least ``z c``, the central Gaussian's of noise multiplier z.

Privacy (:mod:`fedjax_dp.privacy.distributed_accounting`): unit one client, relation *replace one
client's entire data* (the cohort is a fixed-size sample), so the integer sum moves by at most
``2 Delta_2`` in L2 and ``2 min(sqrt(d') Delta_2, Delta_2^2)`` in L1; the noise of M >= n_min
shares bounds the round's RDP (DDG: Kairouz et al. Theorem 1 / Proposition 14 with the sum of M
discrete Gaussians; Skellam: Agarwal et al. Theorem 3.5); sampling m of N without replacement
amplifies it (Wang, Balle, Kasiviswanathan 2019, Theorem 9). Dropouts: each client drops
independently of the data (``secagg_dropout``), so whether the round aborts does not depend on
the data; a dropped client's share is missing, which the M >= n_min rule covers. The modular
wrap, the unwrapping, the rotation's inverse and the rescaling are post-processing. The clip
guarantee and the norm bound hold for every draw: conditional rounding retries until the bound
holds, and the rotation is orthogonal.

Bits, scale and noise come from :func:`fedjax_dp.privacy.distributed_accounting.plan` (scale
from the bit-width b so that the sum of m aligned updates plus noise stays within
``k_stddevs`` standard deviations of the range) and, for a target epsilon,
:func:`~fedjax_dp.privacy.distributed_accounting.calibrate` (the smallest z).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp

from fedjax_dp.core import validation
from fedjax_dp.privacy import discrete_noise, rotation, secagg_masks
from fedjax_dp.privacy import distributed_accounting as accounting_lib

__all__ = ["KINDS", "OPTIONS", "DistributedNoise", "parse", "plan", "client_message",
           "modular_sum", "unwrap", "server_sum"]

KINDS = accounting_lib.KINDS
OPTIONS = {"kind": f"one of {list(KINDS)}",
           "bits": "b in [2, 31]: each coordinate of the secure sum lives in Z_{2^b}",
           "k_stddevs": "k > 0: the range holds the sum's k standard deviations (default 4)",
           "beta": "the conditional rounding's failure probability, in [0, 1) (default e^-0.5)",
           "min_survivors": "n_min in [1, cohort_size]: each share is sized for n_min clients; "
                            "a round with fewer survivors aborts (default: the cohort size)"}


@dataclasses.dataclass(frozen=True)
class DistributedNoise:
    """``algorithm.distributed_noise``: the noise ``kind`` (:data:`KINDS`), the bits b of the
    modular sum, the range's ``k_stddevs``, the rounding's ``beta`` and ``min_survivors``
    (None: the whole cohort)."""

    kind: str
    bits: int = 16
    k_stddevs: float = 4.0
    beta: float = math.exp(-0.5)
    min_survivors: int | None = None

    def survivors_needed(self, cohort: int) -> int:
        """n_min: ``min_survivors`` or the cohort size."""
        return int(cohort) if self.min_survivors is None else int(self.min_survivors)


def parse(name: str, value: Any) -> DistributedNoise | None:
    """None / ``"none"`` (central noise) or a table ``{kind = "skellam", bits = 16, ...}``."""
    value = validation.options_table(
        name, value, OPTIONS, off="none", cls=DistributedNoise, kinds=KINDS,
        accepts='"none" or a table such as {kind = "skellam", bits = 16}')
    if not isinstance(value, dict):
        return value
    kind = value["kind"]
    bits = validation.check_int(f"{name}.bits", value.get("bits", 16), minimum=2, maximum=31)
    k = validation.check_positive(f"{name}.k_stddevs", value.get("k_stddevs", 4.0))
    beta = validation.Float(0.0, 1.0, high_open=True)(f"{name}.beta",
                                                      value.get("beta", math.exp(-0.5)))
    n_min = value.get("min_survivors")
    if n_min is not None:
        n_min = validation.check_int(f"{name}.min_survivors", n_min, minimum=1)
    return DistributedNoise(kind=kind, bits=bits, k_stddevs=float(k), beta=float(beta),
                            min_survivors=n_min)


def plan(spec: DistributedNoise, *, noise_multiplier: float, clip: float, dim: int,
         cohort: int) -> accounting_lib.Plan:
    """The round's scale, noise and norm bound (:func:`distributed_accounting.plan`)."""
    return accounting_lib.plan(spec.kind, noise_multiplier=noise_multiplier, clip=clip, dim=dim,
                               cohort=cohort, bits=spec.bits, k_stddevs=spec.k_stddevs,
                               beta=spec.beta, min_survivors=spec.survivors_needed(cohort))


def _mask(bits: int) -> jnp.uint32:
    return jnp.uint32((1 << bits) - 1)


@functools.partial(jax.jit, static_argnames=("p", "kind", "n_min"))
def client_message(key: jax.Array, x: jax.Array, sign: jax.Array, p: accounting_lib.Plan,
                   kind: str, n_min: int) -> jax.Array:
    """One client's input to the secure sum: ``x [d]`` (its clipped update, flat) -> ``[d']``
    uint32 in ``[0, 2^b)``: scaled, rotated, conditionally rounded, its noise share added,
    reduced mod 2^b. ``key``: the client's own (rounding and noise streams split from it)."""
    k_round, k_noise = jax.random.split(key)
    u = rotation.rotate(x.astype(jnp.float32) / jnp.float32(p.scale), sign)          # [d']
    r = discrete_noise.conditional_round(k_round, u, p.rounded_norm)
    share = p.total_variance / n_min
    if kind == "ddg":
        noise = discrete_noise.discrete_gaussian(k_noise, math.sqrt(share), u.shape)
    else:
        noise = discrete_noise.skellam(k_noise, share, u.shape)
    return jax.lax.bitcast_convert_type(r + noise, jnp.uint32) & _mask(p.bits)


def modular_sum(key: jax.Array, messages: jax.Array, ids: jax.Array, alive: jax.Array,
                bits: int, neighbours: int | None) -> jax.Array:
    """``sum_{b alive} messages_b mod 2^b`` through pairwise masks in Z_{2^32} (2^b divides
    2^32, so the masks cancel mod 2^b too): ``messages [B, d']`` uint32 -> ``[d']`` uint32.
    The server adds the survivors' masked inputs and removes the dropped agents' masks
    (:mod:`fedjax_dp.privacy.secagg_masks`); it never holds an unmasked message."""
    y, nbr = secagg_masks.masked_inputs(key, messages, ids, neighbours)
    received = jnp.sum(jnp.where(alive[:, None], y, jnp.uint32(0)), axis=0, dtype=jnp.uint32)
    total = received - secagg_masks.dropout_correction(key, ids, nbr, alive, messages.shape[1])
    return total & _mask(bits)


def unwrap(total: jax.Array, bits: int) -> jax.Array:
    """Ring elements of Z_{2^b} read in ``[-2^(b-1), 2^(b-1))``: uint32 -> int32 (sign
    extension of the low b bits)."""
    shift = 32 - int(bits)
    return jax.lax.bitcast_convert_type(total << shift, jnp.int32) >> shift


def server_sum(total: jax.Array, sign: jax.Array, p: accounting_lib.Plan, dim: int) -> jax.Array:
    """The server's estimate of the survivors' sum from the modular sum ``total [d']``:
    ``gamma U^T unwrap(total)``, ``[d]`` float32 (rounding and noise included)."""
    v = unwrap(total & _mask(p.bits), p.bits).astype(jnp.float32)
    return rotation.unrotate(v, sign, dim) * jnp.float32(p.scale)
