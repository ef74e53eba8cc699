"""Secure aggregation, simulated as a real, vectorised code path: fixed point in Z_{2^32}, additive
secret sharing among J talliers (the MPC vote) and pairwise masking (the DP-FedAvg cohort sum).

Three pieces: this module (:class:`SecAggConfig`, the fixed-point ring encoding, the range
check :func:`check_range`, the dropout draws and the ``SecAggOptions`` mixin of the algorithm
Configs); :mod:`fedjax_dp.privacy.secagg_shares` (additive secret sharing among J >= 2
non-colluding talliers that release only the argmax per query: MPC-vote, Dery et al. 2019, as
the voting-dpfl paper's Algorithms 2-3 assume); :mod:`fedjax_dp.privacy.secagg_masks`
(pairwise-mask secure aggregation, Bonawitz et al. 2017, on a k-regular graph, Bell et al. 2020).

Fixed point. A real x is encoded as the ring element ``E(x) = round(x 2^f) mod 2^32`` (``f =
frac_bits``; round-to-nearest, ties to even: deterministic, no key, so the released value is a
deterministic function of the inputs) and a ring element u is decoded as ``D(u) = s(u) 2^-f``
with ``s`` the two's-complement reading of u (``s(u) = u`` if ``u < 2^31`` else ``u - 2^32``).
uint32 arithmetic wraps natively, so ``sum_i E(x_i) mod 2^32`` is computed exactly whatever the
order or chunking, and for N inputs

    D(sum_i E(x_i)) = sum_i x_i + e,     |e| <= N 2^-(f+1)            (each rounding <= 2^-(f+1))

provided the true fixed-point sum lies in the representable range, ``|sum_i round(x_i 2^f)| <
2^31``, i.e. ``|sum_i x_i| < 2^(31-f) - N 2^-(f+1)``. Partial sums may wrap: only the final sum
must be in range. :func:`check_range` raises a ValueError before any work when a caller's bound
on ``|sum|`` does not satisfy this.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.core import validation

__all__ = ["AGGREGATIONS", "RING_BITS", "SecAggConfig", "SecAggOptions", "SecAggFields",
           "check_fields",
           "encode", "decode", "to_signed", "check_range", "max_abs_sum", "resolution",
           "survive", "survivors", "drop_within", "top_up_std"]

#: ``algorithm.aggregation``: the plain float sum (the simulation's default) or secure aggregation.
AGGREGATIONS = ("plain", "secagg")
#: Bits of the ring Z_{2^32} (uint32 arithmetic).
RING_BITS = 32
_MAX_FRAC_BITS = 30                 # 2^(31-f) >= 2: at least the range [-2, 2)


@dataclasses.dataclass(frozen=True)
class SecAggConfig:
    """Secure aggregation settings (validated; hashable, so compiled functions can be cached).

    talliers: J >= 2 non-colluding talliers of the MPC vote (additive shares).
    frac_bits: f in [0, 30], the fixed-point scale 2^f (resolution 2^-f, range |sum| < 2^(31-f)).
    neighbours: k, the degree of the pairwise-masking graph (an even integer >= 2), or None for
      the complete graph (k = N - 1); a k >= N - 1 is the complete graph too.
    dropout: p in [0, 1), the probability that each agent, independently of the others and of
      the data, drops out after masking / sharing (:func:`survive`).
    """

    talliers: int = 2
    frac_bits: int = 16
    neighbours: int | None = None
    dropout: float = 0.0

    def __post_init__(self):
        check_fields(self.talliers, self.frac_bits, self.neighbours, self.dropout,
                     prefix="secagg.")


def check_fields(talliers, frac_bits, neighbours, dropout, *, prefix: str) -> None:
    """Validate the four settings; errors name ``<prefix><field>`` and the allowed range."""
    validation.check_int(f"{prefix}talliers", talliers, minimum=2)
    validation.check_int(f"{prefix}frac_bits", frac_bits, minimum=0, maximum=_MAX_FRAC_BITS)
    if neighbours is not None:
        k = validation.check_int(f"{prefix}neighbours", neighbours, minimum=2)
        if k % 2:
            raise ValueError(f"{prefix}neighbours must be an even integer >= 2 (a k-regular "
                             f"ring graph joins each agent to k/2 agents on either side) or "
                             f"None (complete graph), got {neighbours!r}")
    d = validation.check_number(f"{prefix}dropout", dropout)
    if not 0.0 <= d < 1.0:
        raise ValueError(f"{prefix}dropout must be in [0, 1), got {dropout!r}")


class SecAggOptions:
    """Mixin for algorithm Configs with the fields ``aggregation``, ``secagg_talliers``,
    ``secagg_frac_bits``, ``secagg_neighbours`` and ``secagg_dropout`` (AE-DPFL, kNN-DPFL,
    DP-FedAvg). Call :meth:`check_aggregation` in ``__post_init__``."""

    #: types and ranges of the fields (:func:`fedjax_dp.core.validation.check_config`)
    FIELDS = {"aggregation": validation.Choice(AGGREGATIONS),
              "secagg_talliers": validation.Int(2),
              "secagg_frac_bits": validation.Int(0, _MAX_FRAC_BITS),
              "secagg_neighbours": validation.Int(2, optional=True),
              "secagg_dropout": validation.Float(0.0, 1.0, high_open=True)}

    def check_aggregation(self) -> None:
        validation.check_choice("algorithm.aggregation", self.aggregation, AGGREGATIONS)
        check_fields(self.secagg_talliers, self.secagg_frac_bits, self.secagg_neighbours,
                     self.secagg_dropout, prefix="algorithm.secagg_")
        if self.aggregation == "plain" and float(self.secagg_dropout) > 0:
            raise ValueError("algorithm.secagg_dropout must be 0 with algorithm.aggregation = "
                             f"'plain' (dropouts are simulated by secure aggregation only), got "
                             f"{self.secagg_dropout!r}")

    @property
    def secagg(self) -> SecAggConfig | None:
        """The secure aggregation settings, or None for ``aggregation = "plain"``."""
        if self.aggregation != "secagg":
            return None
        return SecAggConfig(talliers=int(self.secagg_talliers),
                            frac_bits=int(self.secagg_frac_bits),
                            neighbours=None if self.secagg_neighbours is None
                            else int(self.secagg_neighbours),
                            dropout=float(self.secagg_dropout))


@dataclasses.dataclass(frozen=True)
class SecAggFields(SecAggOptions):
    """The secure aggregation fields of a Config (DP-FedAvg, AE-DPFL, kNN-DPFL; their specs and
    checks: :class:`SecAggOptions`), with their defaults.

    docs/secagg.md: ``"plain"`` float sum (default) or ``"secagg"`` (updates / ballots
    secret-shared with ``secagg_frac_bits`` fraction bits). DP-FedAvg: masks on a
    ``secagg_neighbours``-regular graph (None: complete). The votes: among ``secagg_talliers``
    talliers. An agent drops (its shares never arrive; DP-FedAvg: after masking) with probability
    ``secagg_dropout``."""

    aggregation: str = "plain"
    secagg_talliers: int = 2
    secagg_frac_bits: int = 16
    secagg_neighbours: int | None = None
    secagg_dropout: float = 0.0


# --------------------------------------------------------------------------- fixed point

def resolution(frac_bits: int) -> float:
    """``2^-f``: the fixed-point step; each encoding errs by at most half of it."""
    return 2.0 ** -int(frac_bits)


def max_abs_sum(frac_bits: int, num_terms: int) -> float:
    """The largest ``|sum_i x_i|`` of ``num_terms`` reals whose encoded sum cannot overflow:
    ``2^(31-f) - num_terms 2^-(f+1)`` (the rounding of every term included)."""
    return 2.0 ** (RING_BITS - 1 - frac_bits) - num_terms * 2.0 ** -(frac_bits + 1)


def check_range(name: str, bound: float, frac_bits: int, num_terms: int) -> None:
    """ValueError unless a sum of ``num_terms`` values with ``|sum| <= bound`` fits the ring.

    ``name`` says what the bound is (e.g. "algorithm.clip_norm x cohort size"); the message gives
    the largest admissible bound and the fraction bits that would fit."""
    limit = max_abs_sum(frac_bits, num_terms)
    if not bound < limit:
        fit = [f for f in range(_MAX_FRAC_BITS + 1) if bound < max_abs_sum(f, num_terms)]
        hint = (f"; algorithm.secagg_frac_bits <= {max(fit)} would fit" if fit
                else "; no fraction bits fit: the sum is too large for 32 bits")
        raise ValueError(f"secure aggregation would overflow Z_2^32: {name} = {bound:g} must be "
                         f"< 2^(31 - f) - N 2^-(f+1) = {limit:g} for f = {frac_bits} fraction bits "
                         f"and N = {num_terms} terms{hint}")


@functools.partial(jax.jit, static_argnames=("frac_bits",))
def encode(x: jax.Array, frac_bits: int) -> jax.Array:
    """``E(x) = round(x 2^f) mod 2^32`` as uint32 (same shape). Round-to-nearest, ties to even.

    Exact for ``|x| < 2^(31-f)``; outside that range (which :func:`check_range` excludes) the
    value saturates at the int32 limits instead of wrapping.
    """
    y = jnp.round(jnp.asarray(x, jnp.float32) * jnp.float32(2.0 ** frac_bits))
    y = jnp.clip(y, -2.0 ** 31, 2.0 ** 31 - 128.0)        # float32-exact int32 limits
    return jax.lax.bitcast_convert_type(y.astype(jnp.int32), jnp.uint32)


@jax.jit
def to_signed(u: jax.Array) -> jax.Array:
    """The two's-complement reading of ring elements: uint32 -> int32 (``u - 2^32`` if
    ``u >= 2^31``)."""
    return jax.lax.bitcast_convert_type(jnp.asarray(u, jnp.uint32), jnp.int32)


@functools.partial(jax.jit, static_argnames=("frac_bits",))
def decode(u: jax.Array, frac_bits: int) -> jax.Array:
    """``D(u) = to_signed(u) 2^-f`` as float32 (relative error 2^-24 above 2^24 units)."""
    return to_signed(u).astype(jnp.float32) * jnp.float32(2.0 ** -frac_bits)


# --------------------------------------------------------------------------- dropouts

#
# Every agent drops independently with probability p (a Bernoulli coin from its own key,
# ``fold_in(key, id)``): agent i's coin depends neither on the data nor on which or how many
# other agents there are, so two neighbouring datasets (add/remove one agent) can be coupled
# agent by agent -- the shared agents drop alike and only the added agent's own coin differs.
# A fixed number ``floor(p N)`` of dropouts (the earlier design) breaks that: removing an agent
# can leave as many survivors, and the two sums then differ by a swap of two agents (twice the
# sensitivity) and, in the vote, in noise variance (docs/secagg.md, "Dropouts").

@jax.jit
def survive(key: jax.Array, ids: jax.Array, fraction) -> jax.Array:
    """Whether agents ``ids [B]`` deliver: ``bool [B]``, agent i survives unless
    ``uniform(fold_in(key, i)) < fraction`` (float32; the rate equals ``fraction`` to 2^-23).

    One coin per agent from its own key: independent Bernoulli(1 - fraction) survivals, agent i's
    the same whichever other ids are drawn with it (and however they are chunked)."""
    p = jnp.asarray(fraction, jnp.float32)

    def one(i):
        return jax.random.uniform(jax.random.fold_in(key, i), (), jnp.float32) >= p

    return jax.vmap(one)(ids)


def survivors(key: jax.Array, num_agents: int, fraction: float) -> np.ndarray:
    """Host bool mask ``[N]`` of the agents that deliver: :func:`survive` of agents
    ``0..N-1`` (every agent drops independently with probability ``fraction``)."""
    n = validation.check_int("num_agents", num_agents, minimum=1)
    if float(fraction) == 0.0:
        return np.ones((n,), bool)
    return np.asarray(survive(key, jnp.arange(n), jnp.float32(fraction)))


@jax.jit
def drop_within(key: jax.Array, contrib: jax.Array, fraction, ids: jax.Array) -> jax.Array:
    """Traced dropouts inside a pass: ``contrib [B]`` bool -> the survivors ``[B]``: the
    contributing rows whose agent ``ids [B]`` survives its own coin (:func:`survive`)."""
    return contrib & survive(key, ids, fraction)


def top_up_std(sigma: float, num_agents: int, num_survivors: int) -> float:
    """The std of the noise the vote's talliers add inside the MPC when only M of the N agents
    delivered: ``sigma sqrt((N - M) / N)``, the dropped agents' missing shares ``N(0,
    sigma^2/N)``, so that the released sum carries ``N(0, sigma^2)`` whoever drops."""
    n, m = int(num_agents), int(num_survivors)
    if not 0 <= m <= n:
        raise ValueError(f"num_survivors must be in [0, {n}], got {num_survivors!r}")
    return float(sigma) * math.sqrt((n - m) / n)
