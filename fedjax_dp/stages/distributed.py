"""Distributed noise stages under secure aggregation (:mod:`fedjax_dp.privacy.distributed_dp`):
each agent scales, rotates, rounds and noises its own clipped update with a discrete share
(``ddg``: discrete Gaussian, Kairouz et al. ICML 2021; ``skellam``: Agarwal et al. NeurIPS 2021),
the secure sum is taken mod 2^b, the server unwraps it; a round with fewer than n_min survivors
aborts (no release). No party holds noise across rounds, so no distributed noise is correlated.

Relation: replace one agent's entire local dataset (sensitivity 2 Delta_2 of the rounded, scaled
update); the run's RDP is :func:`~fedjax_dp.privacy.distributed_accounting.run_rdp` for C of N
agents sampled without replacement each round.

Under adaptive clipping each agent's update is divided by the public C_t before encoding (norm at
most 1; the plan is made for clip 1 and the server multiplies back, so the noise follows C_t as the
central mechanism's does), and its centred unclipped bit, doubled to an integer in {-1, +1}, is
summed in its own secure sum mod 2^b with its own discrete shares of total variance
``(2 sigma_b)^2`` (the count's noise sigma_b). The round's base RDP is the sum of the two
releases' (:func:`~fedjax_dp.privacy.distributed_accounting.count_round_rdp`), amplified once by
the sampling.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from fedjax_dp.core import rng
from fedjax_dp.privacy import discrete_noise, distributed_accounting, rotation
from fedjax_dp.privacy import distributed_dp as distributed_lib
from fedjax_dp.stages.base import register, requires
from fedjax_dp.stages.noise import Account, Noise, Setup, update_multiplier
from fedjax_dp.stages.participation import REPLACE_ONE

__all__ = ["DistributedNoise", "DDG", "Skellam"]


class DistributedNoise(Noise):
    """``spec``: :class:`~fedjax_dp.privacy.distributed_dp.DistributedNoise` (kind, bits, ...);
    ``multiplier``: the central-equivalent z."""

    encodes: ClassVar[bool] = True

    def requirements(self):
        return (
            requires("aggregation", lambda c: c["aggregation"].secure,
                     "distributed noise shares only add up inside the secure sum (aggregation "
                     "\"secagg\")"),
            requires("participation", lambda c: c["participation"].NAME == "fixed",
                     "the shares are sized for a cohort of exactly C agents and the analysis "
                     "samples C of N without replacement each round (participation \"fixed\")"),
            requires("server_update", lambda c: c["server_update"].denominator == "expected",
                     "the update is divided by the fixed cohort size C (denominator "
                     "\"expected\"): the realised survivors are not released"),
            requires("clipping", lambda c: c["clipping"].NAME != "none" and
                     c["clipping"].weight_cap is None,
                     "the shares are sized for a clipped, unit-weight update (no weight_cap)"))

    def _cohort(self, chain) -> int:
        return int(chain["participation"].size)

    def plan(self, chain, dim: int, z_u: float):
        """The round's scale, noise and norm bound for ``dim`` parameters and the update's
        multiplier ``z_u`` (clip 1 when the updates are divided by an adaptive C_t)."""
        clip = chain["clipping"]
        return distributed_lib.plan(self.spec, noise_multiplier=z_u,
                                    clip=1.0 if clip.adaptive else clip.norm, dim=dim,
                                    cohort=self._cohort(chain))

    def count_variance(self, chain) -> float | None:
        """The count's total noise variance (2 sigma_b)^2 in its {-1, +1} units (None: no count)."""
        std = chain["clipping"].count_std(float(self._cohort(chain)))
        return None if std is None else (2.0 * std) ** 2

    def check_plan(self, chain, dim: int, z_u: float) -> None:
        """Bits that cannot hold the sums (update and count) refused before any work."""
        try:
            self.plan(chain, dim, z_u)
        except ValueError as e:
            raise ValueError(f"algorithm.distributed_noise: {e}") from None
        var = self.count_variance(chain)
        if var is None:
            return
        n_min = self.spec.survivors_needed(self._cohort(chain))
        if self.NAME == "ddg" and var / n_min < 0.25:
            raise ValueError(f"algorithm.adaptive_clip.count_noise: each of the {n_min} ddg "
                             f"count shares needs std >= 0.5 (Proposition 14), i.e. sigma_b >= "
                             f"{0.25 * math.sqrt(n_min):.4g}")
        span = self._cohort(chain) + self.spec.k_stddevs * math.sqrt(var)
        if span >= 2 ** (self.spec.bits - 1):
            raise ValueError(f"algorithm.distributed_noise.bits = {self.spec.bits} cannot hold "
                             f"the unclipped count (|sum| up to {span:.4g}); raise bits")

    def encoded_sum(self, k_train, k_mask, contributions, ids, alive, secagg, chain, clip,
                    z_u):
        """The modular sums of the pass's messages: ``[d']`` uint32 (and the count's ``[1]``)."""
        deltas, centred = chain["clipping"].split(contributions)
        flat = jax.vmap(lambda t: ravel_pytree(t)[0])(deltas)                        # [B, d]
        if chain["clipping"].adaptive:
            flat = flat / clip
        plan = self.plan(chain, flat.shape[1], z_u)
        sign = rotation.signs(rng.stream(k_train, "rotation"), flat.shape[1])
        k_client = rng.stream(k_train, "distributed_noise")
        n_min = self.spec.survivors_needed(self._cohort(chain))
        msgs = jax.vmap(lambda i, x: distributed_lib.client_message(                 # [B, d']
            jax.random.fold_in(k_client, i), x, sign, plan, self.spec.kind, n_min))(ids, flat)
        total = distributed_lib.modular_sum(k_mask, msgs, ids, alive, plan.bits,
                                            secagg.neighbours)
        if centred is None:
            return total
        share = self.count_variance(chain) / n_min
        return total, self._count_sum(k_train, centred, ids, alive, secagg, share)

    def _count_sum(self, k_train, centred, ids, alive, secagg, share):
        """The count's modular sum ``[1]``: each agent's ``2 (b - 1/2)`` plus its share."""
        k_noise = rng.stream(k_train, "count_noise")

        def message(i, c):
            k = jax.random.fold_in(k_noise, i)
            if self.spec.kind == "ddg":
                noise = discrete_noise.discrete_gaussian(k, math.sqrt(share), (1,))
            else:
                noise = discrete_noise.skellam(k, share, (1,))
            v = jnp.round(2.0 * c).astype(jnp.int32).reshape(1) + noise
            return jax.lax.bitcast_convert_type(v, jnp.uint32) & jnp.uint32(
                (1 << self.spec.bits) - 1)

        msgs = jax.vmap(message)(ids, centred)                                       # [B, 1]
        k_mask = jax.random.fold_in(rng.stream(k_train, "secagg_count"), ids[0])
        return distributed_lib.modular_sum(k_mask, msgs, ids, alive, self.spec.bits,
                                           secagg.neighbours)

    def decode(self, k_train, params, total, num_sampled, chain, clip, z_u):
        """``(estimate, count or None, released)``: the survivors' sum from the modular sum (a
        pytree like ``params``; times C_t when divided by it), the noised centred count, and
        whether the round was released (public: it depends on the dropouts alone)."""
        _, unravel = ravel_pytree(params)
        dim = sum(int(math.prod(l.shape)) for l in jax.tree.leaves(params))
        plan = self.plan(chain, dim, z_u)
        sign = rotation.signs(rng.stream(k_train, "rotation"), dim)
        released = num_sampled >= self.spec.survivors_needed(self._cohort(chain))
        update, count = (total, None) if not chain["clipping"].adaptive else total
        flat = jnp.where(released, distributed_lib.server_sum(update, sign, plan, dim), 0.0)
        if chain["clipping"].adaptive:
            flat = flat * clip
            count = jnp.where(released, distributed_lib.unwrap(count, self.spec.bits)[0]
                              .astype(jnp.float32) / 2.0, 0.0)
        return unravel(flat), count, released

    def account(self, chain, setup: Setup) -> Account:
        """The run's RDP curve (replace one agent; C of N sampled without replacement)."""
        orders, rdp, plan = self.run_rdp(chain, setup)
        n_min = self.spec.survivors_needed(self._cohort(chain))
        count = "" if self.count_variance(chain) is None else (
            "; each round also releases the adaptive clip's count in its own secure sum with "
            "discrete shares of total variance (2 sigma_b)^2, composed in the round's RDP")
        note = (f"distributed {self.spec.kind} noise under secure aggregation mod 2^{plan.bits}: "
                f"scale gamma = {plan.scale:.4g}, noise variance {plan.total_variance:.4g} per "
                f"coordinate of the integer sum (n_min = {n_min} shares), rounded norm Delta_2 = "
                f"{plan.rounded_norm:.4g} (d' = {plan.padded_dim}); the run's RDP is the papers' "
                f"bound, amplified by sampling without replacement (Wang et al. 2019){count}")
        clip = chain["clipping"].norm if self.sensitivity is None else self.sensitivity
        return Account(None, REPLACE_ONE, 2 * float(clip), note, orders=orders, rdp=rdp)

    def run_rdp(self, chain, setup: Setup):
        """``(orders, rdp, plan)`` for the model's d parameters, C of N, T rounds."""
        plan = self.plan(chain, setup.dim, update_multiplier(chain, setup))
        cohort = self._cohort(chain)
        clip = 1.0 if chain["clipping"].adaptive else chain["clipping"].norm
        orders = distributed_accounting.ORDERS
        rdp = distributed_accounting.run_rdp(
            self.spec.kind, orders, scaled_clip=clip / plan.scale, dim=plan.padded_dim,
            beta=self.spec.beta, total_variance=plan.total_variance, cohort=cohort,
            min_survivors=self.spec.survivors_needed(cohort), population=setup.num_agents,
            rounds=setup.rounds, count_variance=self.count_variance(chain))
        return orders, rdp, plan



@register
@dataclasses.dataclass(frozen=True)
class DDG(DistributedNoise):
    NAME: ClassVar[str] = "ddg"
    CONFIG: ClassVar[str] = 'algorithm.distributed_noise = {kind = "ddg", bits = 16}'
    SUMMARY: ClassVar[str] = "distributed discrete Gaussian shares in the secure sum mod 2^b"
    OPTIONS: ClassVar[dict] = {k: v for k, v in distributed_lib.OPTIONS.items() if k != "kind"}
    spec: distributed_lib.DistributedNoise = distributed_lib.DistributedNoise("ddg")
    multiplier: float = 1.0
    sensitivity: float | None = None


@register
@dataclasses.dataclass(frozen=True)
class Skellam(DistributedNoise):
    NAME: ClassVar[str] = "skellam"
    CONFIG: ClassVar[str] = 'algorithm.distributed_noise = {kind = "skellam", bits = 16}'
    SUMMARY: ClassVar[str] = "distributed Skellam shares in the secure sum mod 2^b"
    OPTIONS: ClassVar[dict] = {k: v for k, v in distributed_lib.OPTIONS.items() if k != "kind"}
    spec: distributed_lib.DistributedNoise = distributed_lib.DistributedNoise("skellam")
    multiplier: float = 1.0
    sensitivity: float | None = None

