"""Shuffle-DP vector summation (randomised rounding to a grid + binomial noise) and its exact PLD.

The vector-summation protocol of Cheu, Joseph, Mao and Peng (2021, "Shuffle private stochastic
convex optimization", the vector version of the sum protocol of Cheu et al. 2019), as used by the
SDP variants of Lowy et al. (ISRL-DP spec, item 6). A trusted shuffler mixes all messages, so the
server sees only the per-coordinate sums; this module simulates exactly that view.

Mechanism (one release, ``n`` reports ``x_i`` in R^d with 0/1 weights ``w_i``; config ``C``
= ``clip_norm``, ``K`` = ``granularity``, ``N`` = ``noise_trials``)::

    x~_i   = clip(x_i)                        ||x~_i||_2 <= C ('l2') or ||x~_i||_inf <= C ('linf')
    y_ij   = K x~_ij / C  in [-K, K]           (the grid has step C / K, 2K + 1 points)
    ybar_ij = floor(y_ij) + Bernoulli(y_ij - floor(y_ij))       unbiased randomised rounding
    S_j    = sum_i w_i ybar_ij + B_j - floor(N / 2),    B_j ~ Bin(N, 1/2) independent   [d] int32
    est_j  = (C / K) (S_j - (N mod 2) / 2)             unbiased for sum_i w_i x~_ij

``S`` (the integer sums, centred by the public constant ``floor(N / 2)``) is all the server sees;
``est`` is a function of ``S`` and the public config only (:func:`decode`). The ``N`` noise bits per
coordinate are Bernoulli(1/2) bits that the protocol's participants contribute (e.g. ``N / n`` per
report slot); a sum of independent binomials with one success probability is binomial, so the
server's view is the same however they are split, and we draw ``Bin(N, 1/2)`` directly. ``N`` is
fixed per release (never a function of how many reports are real), so the noise is
data-independent. Signed grid values are summed (rather than Cheu et al.'s shift to ``{0..2K}``
bits), so decoding needs no count of reports and the add/remove relation does not reveal it.

Variance (:func:`estimate_variance`): ``Var(est_j) = (C/K)^2 (sum_i w_i f_ij (1 - f_ij) + N / 4)``
with ``f_ij = y_ij - floor(y_ij)`` (rounding, then noise).

Clipping: the L2 norm by default, because the ISRL algorithms clip per-record gradients in L2 over
the whole parameter vector (one ``C`` for the Gaussian and the shuffle variants), and
``||x||_2 <= C`` implies ``|x_j| <= C``, which is all the grid needs; ``'linf'`` clips each
coordinate to ``[-C, C]`` (more signal for the same accounting, since the analysis below uses only
the per-coordinate bound).

Privacy (unit: one report = one record; relation: add/remove one report, or replace one report):

* **Sensitivity.** Adding or removing one report changes each ``S_j`` by ``ybar_xj`` in
  ``[-K, K]``; replacing one changes it by ``ybar_xj - ybar_x'j`` in ``[-2K, 2K]``. Integer
  per-coordinate (L-infinity) sensitivity ``s = K`` (add/remove) or ``s = 2K`` (replace)
  (:func:`per_coordinate_sensitivity`).
* **One coordinate is dominated by ``(B + s, B)``, B ~ Bin(N, 1/2).** Fix a neighbouring pair. The
  other reports' rounded values ``R`` are independent of the changed report and of ``B``, so the
  coordinate's pair ``(R + B, R + D + B)`` (``D`` the random change) is a post-processing (add
  ``R``) of ``(B, D + B)``. By joint convexity of the hockey-stick divergence
  ``H_g(P || Q) = sum_o [P(o) - g Q(o)]_+``, ``H_g(D + B || B) <= max_k H_g(k + B || B)`` over
  the integers ``|k| <= s`` in the support of ``D`` (and likewise with the arguments swapped). The
  binomial pmf is log-concave, so ``P(B = o - k) / P(B = o)`` is non-decreasing in ``o`` for
  ``k > 0`` (monotone likelihood ratio): the Neyman-Pearson test of ``B`` against ``B + k`` at
  any level is the same threshold test for every ``k > 0``, and its power grows with ``k``; hence
  the trade-off function of ``(B, B + k)`` is pointwise above that of ``(B, B + s)`` for
  ``0 < k <= s``. With ``p = 1/2``, ``o -> N - o`` maps ``(B - k, B)`` onto ``(B + k, B)``, so
  negative shifts are no worse. Therefore ``H_g`` of every coordinate's pair is at most that of
  ``(B + s, B)`` for every ``g > 0`` and both orders: ``(B + s, B)`` is a dominating pair.
* **d coordinates.** Rounding and noise are independent across coordinates, so one release's
  pair is a product of per-coordinate pairs, each dominated by ``(B + s, B)``; products of
  dominated pairs are dominated by the product of the dominating pairs (product of the
  post-processing kernels). The release is dominated by ``(B + s, B)^{(x) d}``: its PLD is the
  per-coordinate PLD composed ``d`` times. This uses only the L-infinity bound; it is valid for any
  change vector (the L2 bound would give ~sqrt(d) less noise for Gaussian noise, but the rounding
  can move every coordinate by one grid step, and no single dominating pair is known for the
  binomial under an L2 constraint, so we do not claim it).
* **T releases** compose adaptively: the PLD composed ``d * T`` times
  (``self_compose``), as for any dominating pair (Zhu, Dong and Wang 2022, Thm. 10).
* The weights (which reports are real / sampled) may be random but must not depend on the
  neighbouring record's value beyond its presence. Amplification by subsampling is claimed only
  when the event says so (``sampling_probability = q < 1``: each record independently in each
  release with probability q, add/remove): one release's pair ``(P, Q)`` (d coordinates)
  becomes ``((1-q) Q + q P, Q)`` / ``(Q, (1-q) Q + q P)`` before the T releases compose
  (Zhu, Dong and Wang 2022, Thm. 11; computed from the pessimistic PLD of ``(P, Q)``).

The PLD of ``(B + s, B)`` is built EXACTLY from the two binomial pmfs: outcomes with
non-negligible mass are enumerated (a window of ``+- sqrt(35 N)`` around the mean, Hoeffding
tail ``<= e^-70`` per side), the exact mass outside the window (scipy's binomial cdf/sf) and the
mass where the other pmf is 0 become the infinity mass (pessimistic). Two discretisations, both
pessimistic (the reported delta is >= the true one):

* ``'connect_dots'`` (default): Doroshenko et al. 2022, Alg. 1
  (``dp_accounting.pld.pld_pmf.create_pmf_pessimistic_connect_dots``) from the exact
  hockey-stick curve at the rounded losses. Its error does not accumulate over the ``d * T``
  compositions the way rounding every loss up does, so it is the one to use for real ``d``.
* ``'buckets'``: ``dp_accounting.pld.privacy_loss_distribution.from_two_probability_mass_functions``
  (privacy buckets: each loss rounded up to the grid); exact input, but loose after many
  compositions (bias up to ``d T h``).

RDP does not apply: ``B + s`` puts mass where ``B`` has none, so every Renyi divergence is
infinite; the PLD accountant is the one that handles that mass (as ``delta``).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import dp_accounting
import numpy as np
from dp_accounting.pld import pld_pmf
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from fedjax_dp.core import validation
from fedjax_dp.privacy import accounting, shuffle_l2
from fedjax_dp.privacy.shuffle_l2 import ANALYSES

__all__ = [
    "NORMS", "RELATIONS", "METHODS", "ANALYSES", "ShuffleConfig", "BinomialSumEvent", "clip",
    "randomized_round", "binomial_noise", "shuffle_vector_sum", "shuffle_tree_sum",
    "tree_dimension", "decode", "estimate_variance",
    "per_coordinate_sensitivity", "make_event", "coordinate_pmfs", "coordinate_pld", "pld",
    "epsilon", "delta_for_epsilon", "calibrate_noise_trials",
]

NORMS = ("l2", "linf")

#: Neighbouring relations (one report = one record) and the text a ledger records for them.
RELATIONS: dict[str, str] = {
    "add_remove": "add/remove one report",
    "replace": "replace one report",
}

METHODS = ("connect_dots", "buckets")

#: The PLD discretisation used with the other events of a ledger (the PLD accountant's).
DEFAULT_PLD_DISCRETIZATION = accounting.DEFAULT_PLD_DISCRETIZATION

#: The noise bits are Bernoulli(1/2): the symmetry the dominating-pair proof uses.
NOISE_PROBABILITY = 0.5

#: Finite-loss mass below which a composed PLD is replaced by "no privacy" (epsilon = inf).
_NO_PRIVACY_MASS = 1e-10

#: Outcomes whose (upper) mass is below e^this are moved to the infinity mass (pessimistic).
_LOG_TINY = -69.0

#: Noise counts up to this are drawn exactly, bit by bit (popcount of random words).
_MAX_EXACT_BITS = 2 ** 12

#: Largest count drawn from one cdf table (~12 sqrt(N) entries); larger N is a sum of chunks.
_MAX_TABLE_TRIALS = 2 ** 30

#: Largest N the simulator draws (at most 1024 chunks); accounting alone goes up to 2^52.
MAX_NOISE_TRIALS = 2 ** 40

#: Half-width of the enumerated window in units of sqrt(N): Hoeffding gives P(tail) <= e^{-2 Z}.
_WINDOW_Z = 35.0


# =============================================================================== the mechanism

@dataclasses.dataclass(frozen=True)
class ShuffleConfig:
    """The vector-summation protocol's public parameters (hashable: a static argument to jit).

    clip_norm:    C > 0, the bound on each report's norm (``norm``), hence on each coordinate.
    granularity:  K >= 1 integer; coordinates are rounded to the grid ``(C / K) * {-K, ..., K}``.
    noise_trials: N >= 1 integer; Bernoulli(1/2) noise bits per coordinate per release, in total.
    norm:         ``'l2'`` (default) or ``'linf'``: the norm the reports are clipped in.
    """
    clip_norm: float
    granularity: int
    noise_trials: int
    norm: str = "l2"

    def __post_init__(self):
        c = validation.check_positive("clip_norm", self.clip_norm)
        if not math.isfinite(c):
            raise ValueError(f"clip_norm must be finite, got {self.clip_norm!r}")
        object.__setattr__(self, "clip_norm", c)
        object.__setattr__(self, "granularity", validation.check_int(
            "granularity", self.granularity, minimum=1, maximum=2 ** 20))
        object.__setattr__(self, "noise_trials", validation.check_int(
            "noise_trials", self.noise_trials, minimum=1, maximum=MAX_NOISE_TRIALS))
        validation.check_choice("norm", self.norm, NORMS)

    @property
    def step(self) -> float:
        """Grid step ``C / K`` (one integer unit of the sums, in the reports' units)."""
        return self.clip_norm / self.granularity

    def replace(self, **changes) -> "ShuffleConfig":
        return dataclasses.replace(self, **changes)


def _check_config(config: Any) -> ShuffleConfig:
    if not isinstance(config, ShuffleConfig):
        raise ValueError(f"config must be a ShuffleConfig, got {type(config).__name__}")
    return config


def clip(vectors: jax.Array, config: ShuffleConfig) -> jax.Array:
    """Clip each row of ``vectors [n, d]`` to norm ``<= C`` in ``config.norm``: ``[n, d]``.

    ``'l2'``: ``x * min(1, C / ||x||_2)``; ``'linf'``: ``clip(x, -C, C)`` per coordinate.
    Either way every coordinate lies in ``[-C, C]``.
    """
    c = config.clip_norm
    if config.norm == "linf":
        return jnp.clip(vectors, -c, c)
    norms = jnp.linalg.norm(vectors, axis=-1, keepdims=True)            # [n, 1]
    scale = jnp.minimum(1.0, c / jnp.maximum(norms, 1e-30))
    return jnp.clip(vectors * scale, -c, c)   # the clip only removes float rounding above C


def randomized_round(key: jax.Array, y: jax.Array) -> jax.Array:
    """Unbiased randomised rounding to the integers: ``floor(y) + Bernoulli(y - floor(y))``, int32.

    ``E[result] = y``; ``Var = f (1 - f)`` with ``f = y - floor(y)``. One uniform per entry.
    """
    lower = jnp.floor(y)
    up = jax.random.uniform(key, y.shape, dtype=y.dtype) < (y - lower)
    return lower.astype(jnp.int32) + up.astype(jnp.int32)


@functools.lru_cache(maxsize=8)
def _cdf_table(n: int) -> tuple[int, np.ndarray, np.ndarray]:
    """``(lo, F_hi, F_lo)``: the Bin(n, 1/2) cdf on its window ``lo..hi`` as 64-bit fixed point.

    ``F[k] = floor(2^64 P(B <= lo + k))`` split into two uint32 words (float64 cdf from scipy, so
    exact to ~2^-53); the last entry is ``2^64 - 1``, so the mass above the window (< e^-70) and
    any rounding go to the last outcome, the mass below it to the first.
    """
    from scipy import stats
    half = math.sqrt(_WINDOW_Z * n)
    lo, hi = max(0, math.floor(n / 2 - half)), min(n, math.ceil(n / 2 + half))
    cdf = stats.binom.cdf(np.arange(lo, hi + 1), n, NOISE_PROBABILITY)   # [m] float64
    scaled = cdf * 2.0 ** 32
    f_hi = np.floor(scaled)
    f_lo = np.floor((scaled - f_hi) * 2.0 ** 32)
    top = 2.0 ** 32 - 1
    full = f_hi > top                                   # cdf == 1.0 in float64: 2^64 - 1
    f_hi[full], f_lo[full] = top, top
    f_hi[-1] = f_lo[-1] = top
    return lo, f_hi.astype(np.uint32), f_lo.astype(np.uint32)


def _table_draw(key: jax.Array, n: int, dim: int) -> jax.Array:
    """``B - floor(n / 2)`` for ``dim`` draws of ``B ~ Bin(n, 1/2)`` by inverting the cdf table.

    A uniform 64-bit ``U`` (two uint32 words) goes to the first ``k`` with ``F[k] > U``
    (vectorised binary search on the fixed-point table of :func:`_cdf_table`), so
    ``P(k) = (F[k] - F[k-1]) / 2^64``.
    """
    lo, f_hi, f_lo = _cdf_table(n)
    table_hi, table_lo = jnp.asarray(f_hi), jnp.asarray(f_lo)                # [m]
    u = jax.random.bits(key, (2, dim), jnp.uint32)                           # U = (u_hi, u_lo)
    a = jnp.zeros(dim, jnp.int32)                       # the answer lies in [a, b]
    b = jnp.full(dim, len(f_hi) - 1, jnp.int32)
    for _ in range(int(np.ceil(np.log2(len(f_hi)))) + 1):
        mid = (a + b) // 2
        t_hi, t_lo = table_hi[mid], table_lo[mid]
        above = (t_hi > u[0]) | ((t_hi == u[0]) & (t_lo > u[1]))
        a, b = jnp.where(above, a, mid + 1), jnp.where(above, mid, b)
    return a + jnp.int32(lo - n // 2)


def binomial_noise(key: jax.Array, noise_trials: int, dim: int) -> jax.Array:
    """``B_j - floor(N / 2)`` for ``d`` independent ``B_j ~ Bin(N, 1/2)``: int32 ``[d]``.

    * ``N <= 2^12``: exact, the number of ones among ``N`` random bits (popcount of
      ``ceil(N / 32)`` random uint32 words per coordinate).
    * Larger ``N``: inversion of the exact cdf (float64, on the window of mass
      ``1 - e^-70``) held as a 64-bit fixed-point table (:func:`_table_draw`); each outcome's
      probability is off by at most ~1e-12 (scipy's cdf at ``N = 3e8``). ``N`` above 2^30 is
      a sum of independent chunks of 2^30 trials (one draw of ``chunks * d`` from one table)
      plus the remainder, so tables stay below ~400k entries (constants of the compiled
      program). Cost ``O(d log N)`` per chunk: ~4 ms per release at ``d = 3394``,
      ``N = 3e8`` on a CPU.
    """
    noise_trials = int(noise_trials)
    if noise_trials <= _MAX_EXACT_BITS:
        words, rest = divmod(noise_trials, 32)
        bits = jax.random.bits(key, (words + (rest > 0), dim), jnp.uint32)   # [w, d]
        if rest:
            bits = bits.at[-1].set(bits[-1] & jnp.uint32((1 << rest) - 1))
        ones = jax.lax.population_count(bits).astype(jnp.int32).sum(axis=0)  # [d]
        return ones - noise_trials // 2
    full, rest = divmod(noise_trials, _MAX_TABLE_TRIALS)
    if full == 0:
        return _table_draw(key, rest, dim)
    k_full, k_rest = jax.random.split(key)
    total = _table_draw(k_full, _MAX_TABLE_TRIALS, full * dim).reshape(full, dim).sum(axis=0)
    return total + (_table_draw(k_rest, rest, dim) if rest else 0)        # [d]


@functools.partial(jax.jit, static_argnames=("config",))
def _vector_sum(key: jax.Array, vectors: jax.Array, weights: jax.Array,
                config: ShuffleConfig) -> tuple[jax.Array, jax.Array]:
    k_round, k_noise = jax.random.split(key)
    x = clip(vectors.astype(jnp.float32), config)                        # [n, d]
    k = config.granularity
    # [n, d] in [-K, K]; the clip guards the sensitivity against float rounding of x K / C.
    y = jnp.clip(x * (k / config.clip_norm), -k, k)
    ybar = randomized_round(k_round, y)                                  # [n, d] int32
    mask = (weights > 0).astype(jnp.int32)[:, None]                      # [n, 1]
    sums = (ybar * mask).sum(axis=0)                                     # [d]
    sums = sums + binomial_noise(k_noise, config.noise_trials, vectors.shape[1])
    return decode(sums, config), sums


def _check_weights(weights: Any, n: int) -> None:
    if weights.shape != (n,):
        raise ValueError(f"weights must have shape [n] = ({n},), got {tuple(weights.shape)}")
    if isinstance(weights, jax.core.Tracer):
        return                                 # traced (inside jit / vmap): values unknown
    w = np.asarray(weights)
    if w.size and not np.all((w == 0) | (w == 1)):
        raise ValueError("weights must be 0/1 (1 = a real, sampled report), got values "
                         f"{np.unique(w)[:5].tolist()}")


def shuffle_vector_sum(key: jax.Array, vectors: jax.Array, weights: jax.Array,
                       config: ShuffleConfig, *, return_sums: bool = False
                       ) -> jax.Array | tuple[jax.Array, jax.Array]:
    """The shuffled vector sum: the server's unbiased estimate of ``sum_i w_i clip(x_i)``, ``[d]``.

    ``vectors [n, d]`` (one report per row), ``weights [n]`` 0/1 (1 marks a real / sampled
    report; 0-rows contribute nothing). Each report is clipped, scaled to ``[-K, K]`` and
    randomly rounded; binomial noise is added to each coordinate's sum (see the module
    docstring). With ``return_sums`` also returns the integer sums ``S [d]`` (int32), the only
    thing the server sees; the estimate is :func:`decode` of them. Pure, jit- and vmap-able
    (vmap over silos with one key each); one key, split into a rounding and a noise key.
    Privacy: :func:`make_event` / :func:`epsilon` with ``dimension = d``.
    """
    config = _check_config(config)
    if vectors.ndim != 2:
        raise ValueError(f"vectors must have shape [n, d], got shape {tuple(vectors.shape)}")
    _check_weights(weights, vectors.shape[0])
    est, sums = _vector_sum(key, vectors, weights, config)
    return (est, sums) if return_sums else est


def shuffle_tree_sum(key: jax.Array, tree: Any, weights: jax.Array, config: ShuffleConfig, *,
                     return_sums: bool = False) -> Any:
    """:func:`shuffle_vector_sum` of per-record pytrees (leaves ``[n, ...]``, e.g. per-record
    gradients): each record's leaves are raveled into one vector of ``d = tree_dimension(tree)``
    entries (so ``'l2'`` clips over the whole parameter vector), summed, and unraveled into a
    pytree of the leaves' per-record shapes. With ``return_sums``: ``(tree, sums [d])``."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    if not leaves:
        raise ValueError("tree must have at least one leaf")
    n = leaves[0].shape[0]
    if any(leaf.ndim == 0 or leaf.shape[0] != n for leaf in leaves):
        raise ValueError(f"every leaf of tree must have the leading record axis n={n}, got "
                         f"shapes {[tuple(leaf.shape) for leaf in leaves]}")
    flat = jnp.concatenate([leaf.reshape(n, -1).astype(jnp.float32) for leaf in leaves],
                           axis=1)                                        # [n, d]
    est, sums = shuffle_vector_sum(key, flat, weights, config, return_sums=True)
    sizes = [math.prod(leaf.shape[1:]) for leaf in leaves]
    parts = jnp.split(est, np.cumsum(sizes)[:-1].tolist())
    out = jax.tree_util.tree_unflatten(
        treedef, [p.reshape(leaf.shape[1:]) for p, leaf in zip(parts, leaves)])
    return (out, sums) if return_sums else out


def tree_dimension(tree: Any) -> int:
    """``d``: entries per record of a per-record pytree (leaves ``[n, ...]``), for accounting."""
    return int(sum(math.prod(leaf.shape[1:]) for leaf in jax.tree_util.tree_leaves(tree)))


def decode(sums: jax.Array, config: ShuffleConfig) -> jax.Array:
    """Server side: ``(C / K) * (S - (N mod 2) / 2)``, float32 ``[d]`` (removes the noise mean)."""
    offset = 0.5 * (config.noise_trials % 2)
    return (sums.astype(jnp.float32) - offset) * jnp.float32(config.step)


def estimate_variance(vectors: jax.Array, weights: jax.Array, config: ShuffleConfig
                      ) -> jax.Array:
    """``Var(est_j) = (C/K)^2 (sum_i w_i f_ij (1 - f_ij) + N / 4)``, ``f = frac(K clip(x) / C)``."""
    y = clip(jnp.asarray(vectors, jnp.float32), config) * (config.granularity / config.clip_norm)
    f = y - jnp.floor(y)                                                 # [n, d]
    w = (jnp.asarray(weights) > 0).astype(jnp.float32)[:, None]          # [n, 1]
    return config.step ** 2 * ((w * f * (1 - f)).sum(0) + config.noise_trials / 4.0)


# =============================================================================== accounting

def per_coordinate_sensitivity(config: ShuffleConfig, relation: str = "add_remove") -> int:
    """Integer L-infinity sensitivity of the sums: ``K`` (add/remove one report) or ``2K``
    (replace one report)."""
    config = _check_config(config)
    validation.check_choice("relation", relation, tuple(RELATIONS))
    return config.granularity * (2 if relation == "replace" else 1)


@dataclasses.dataclass(frozen=True)
class BinomialSumEvent:
    """``count`` releases of a ``dimension``-coordinate binomial sum: what a ledger records.

    Each coordinate of each release is dominated by the pair ``(B + sensitivity, B)``,
    ``B ~ Bin(noise_trials, 1/2)`` (module docstring); the PLD is that pair's composed
    ``dimension * count`` times. With ``sampling_probability = q < 1`` every record enters each
    release independently with probability ``q`` (Poisson; add/remove only): each release's
    pair is subsampled before the ``count`` releases compose (:func:`pld`).
    ``analysis``: ``'per_coordinate'`` (default: the pair above, Cheu et al.'s analysis) or
    ``'l2'`` (one release's dominating pair from the L2-clipped report's rounded set,
    :mod:`fedjax_dp.privacy.shuffle_l2`; add/remove, ``sensitivity`` = K, L2 clipping).
    JSON: :meth:`to_json` / :meth:`from_json` (``analysis`` written only when ``'l2'``).
    """
    noise_trials: int
    sensitivity: int
    dimension: int
    count: int = 1
    sampling_probability: float = 1.0
    analysis: str = "per_coordinate"

    CLASS_NAME = "BinomialSumEvent"

    def __post_init__(self):
        object.__setattr__(self, "noise_trials", validation.check_int(
            "noise_trials", self.noise_trials, minimum=1, maximum=2 ** 52))
        object.__setattr__(self, "sensitivity", validation.check_int(
            "sensitivity", self.sensitivity, minimum=1))
        object.__setattr__(self, "dimension", validation.check_int(
            "dimension", self.dimension, minimum=1))
        object.__setattr__(self, "count", validation.check_int("count", self.count, minimum=1))
        object.__setattr__(self, "sampling_probability", validation.check_probability(
            "sampling_probability", self.sampling_probability))
        validation.check_choice("analysis", self.analysis, ANALYSES)

    @property
    def compositions(self) -> int:
        return self.dimension * self.count

    def to_json(self) -> dict:
        return {"class_name": self.CLASS_NAME, "module_name": __name__,
                "noise_trials": self.noise_trials, "noise_probability": NOISE_PROBABILITY,
                "sensitivity": self.sensitivity, "dimension": self.dimension,
                "count": self.count, "sampling_probability": self.sampling_probability,
                **({} if self.analysis == "per_coordinate" else {"analysis": self.analysis})}

    @classmethod
    def from_json(cls, data: Mapping) -> "BinomialSumEvent":
        if not isinstance(data, Mapping) or data.get("class_name") != cls.CLASS_NAME:
            raise ValueError(f"data must be a {cls.CLASS_NAME} JSON object, got {data!r}")
        if data.get("noise_probability", NOISE_PROBABILITY) != NOISE_PROBABILITY:
            raise ValueError(f"noise_probability must be {NOISE_PROBABILITY} (the only one this "
                             f"analysis covers), got {data['noise_probability']!r}")
        return cls(noise_trials=data["noise_trials"], sensitivity=data["sensitivity"],
                   dimension=data["dimension"], count=data.get("count", 1),
                   sampling_probability=data.get("sampling_probability", 1.0),
                   analysis=data.get("analysis", "per_coordinate"))


def make_event(config: ShuffleConfig, dimension: int, releases: int = 1,
               relation: str = "add_remove", sampling_probability: float = 1.0,
               analysis: str = "per_coordinate") -> BinomialSumEvent:
    """The event for ``releases`` adaptive releases of :func:`shuffle_vector_sum` on ``[n, d]``.

    ``sampling_probability``: each record is a report of a release independently with this
    probability (Poisson sampling, e.g. the weights of a silo's minibatch); amplification is
    analysed for the add/remove relation only. ``analysis``: ``'per_coordinate'`` or ``'l2'``
    (:mod:`fedjax_dp.privacy.shuffle_l2`; needs ``config.norm == 'l2'`` and add/remove).
    """
    q = validation.check_probability("sampling_probability", sampling_probability)
    _check_analysis(analysis, relation, _check_config(config).norm)
    if q < 1 and relation != "add_remove":
        raise ValueError(f"sampling_probability < 1 needs relation='add_remove' (Poisson "
                         f"subsampling is analysed for add/remove only), got {relation!r}")
    return BinomialSumEvent(noise_trials=config.noise_trials,
                            sensitivity=per_coordinate_sensitivity(config, relation),
                            dimension=dimension, count=releases, sampling_probability=q,
                            analysis=analysis)


def _check_analysis(analysis: str, relation: str, norm: str = "l2") -> None:
    validation.check_choice("analysis", analysis, ANALYSES)
    if analysis == "l2" and relation != "add_remove":
        raise ValueError(f"analysis='l2' covers relation='add_remove' only, got {relation!r}")
    if analysis == "l2" and norm != "l2":
        raise ValueError(f"analysis='l2' needs reports clipped in L2 (config.norm='l2'), got "
                         f"norm={norm!r}")


def _log_binom(o: np.ndarray, n: int) -> np.ndarray:
    from scipy import stats
    return stats.binom.logpmf(o, n, NOISE_PROBABILITY)


def coordinate_pmfs(noise_trials: int, sensitivity: int) -> dict:
    """The dominating pair of one coordinate on its enumerated window (numpy, float64).

    Returns ``outcomes [m]`` (integers ``o``), ``log_upper [m] = log P(B + s = o)``,
    ``log_lower [m] = log P(B = o)``, and ``tail_upper`` / ``tail_lower``: each distribution's
    exact mass outside the window (scipy binomial cdf / sf).
    """
    from scipy import stats
    n = validation.check_int("noise_trials", noise_trials, minimum=1)
    s = validation.check_int("sensitivity", sensitivity, minimum=1)
    half = math.sqrt(_WINDOW_Z * n)
    lo = max(0, math.floor(n / 2 - half))
    hi = min(n + s, math.ceil(n / 2 + s + half))
    o = np.arange(lo, hi + 1, dtype=np.int64)
    tail = lambda shift: float(stats.binom.cdf(lo - 1 - shift, n, NOISE_PROBABILITY)
                               + stats.binom.sf(hi - shift, n, NOISE_PROBABILITY))
    return {"outcomes": o, "log_upper": _log_binom(o - s, n), "log_lower": _log_binom(o, n),
            "tail_upper": tail(s), "tail_lower": tail(0)}


def _connect_dots_pmf(log_p: np.ndarray, log_q: np.ndarray, tail_p: float,
                      interval: float) -> pld_pmf.PLDPmf:
    """Pessimistic connect-the-dots PLD pmf of (upper P, lower Q) from the exact hockey stick.

    ``delta(e) = sum_{l(o) > e} (P(o) - e^e Q(o)) + P(l = inf)`` at the floor / ceil grid
    points of every finite loss ``l(o) = log P(o) - log Q(o)``.
    """
    # Outcomes the lower pmf cannot produce, and upper outcomes of negligible mass (< e^-69),
    # count as infinite loss (pessimistic; it keeps the loss range, hence the grid, short).
    tiny = log_p < _LOG_TINY
    inf_mass = tail_p + float(np.exp(log_p[(np.isneginf(log_q) | tiny)]).sum())
    fin = np.isfinite(log_q) & ~tiny
    loss = log_p[fin] - log_q[fin]
    order = np.argsort(-loss)
    desc = loss[order]
    cum_p = np.concatenate([[0.0], np.cumsum(np.exp(log_p[fin][order]))])
    cum_q = np.concatenate([[0.0], np.cumsum(np.exp(log_q[fin][order]))])
    grid = np.unique(np.concatenate([np.floor(loss / interval), np.ceil(loss / interval)]))
    grid = grid.astype(np.int64) if grid.size else np.zeros(1, np.int64)  # all mass infinite
    eps = grid * interval
    above = np.searchsorted(-desc, -eps, side="left")       # #outcomes with loss > eps
    deltas = cum_p[above] - np.exp(eps) * cum_q[above] + inf_mass
    # Float error only: make the curve non-increasing by raising values (never lowering them).
    deltas = np.clip(np.maximum.accumulate(deltas[::-1])[::-1], inf_mass, 1.0)
    return pld_pmf.create_pmf_pessimistic_connect_dots(interval, grid, deltas)


@functools.lru_cache(maxsize=64)
def coordinate_pld(noise_trials: int, sensitivity: int, *,
                   value_discretization_interval: float = DEFAULT_PLD_DISCRETIZATION,
                   method: str = "connect_dots") -> pld_lib.PrivacyLossDistribution:
    """PLD of one coordinate's dominating pair ``(B + s, B)``, both directions (remove: upper
    ``B + s``; add: upper ``B``), pessimistic. ``method``: ``'connect_dots'`` or ``'buckets'``
    (``from_two_probability_mass_functions``). Cached (PLDs are immutable)."""
    h = validation.check_positive("value_discretization_interval", value_discretization_interval)
    validation.check_choice("method", method, METHODS)
    pm = coordinate_pmfs(noise_trials, sensitivity)
    lp, lq = pm["log_upper"], pm["log_lower"]
    if method == "buckets":
        keys = pm["outcomes"].tolist()
        upper = dict(zip(keys, lp.tolist()))
        lower = dict(zip(keys, lq.tolist()))
        # Each window's outside mass as an outcome of its own distribution only: counted as
        # infinite loss in the direction where it is upper (>= its true contribution).
        upper["outside_upper"] = math.log(pm["tail_upper"]) if pm["tail_upper"] > 0 else -math.inf
        lower["outside_lower"] = math.log(pm["tail_lower"]) if pm["tail_lower"] > 0 else -math.inf
        return pld_lib.from_two_probability_mass_functions(
            lower, upper, pessimistic_estimate=True, value_discretization_interval=h,
            log_mass_truncation_bound=_LOG_TINY, symmetric=False)
    remove = _connect_dots_pmf(lp, lq, pm["tail_upper"], h)
    add = _connect_dots_pmf(lq, lp, pm["tail_lower"], h)
    return pld_lib.PrivacyLossDistribution(remove, add)


def _check_event(event: Any) -> BinomialSumEvent:
    if not isinstance(event, BinomialSumEvent):
        raise ValueError(f"event must be a BinomialSumEvent, got {type(event).__name__}")
    return event


@functools.lru_cache(maxsize=16)
def pld(event: BinomialSumEvent, *,
        value_discretization_interval: float = DEFAULT_PLD_DISCRETIZATION,
        method: str = "connect_dots") -> pld_lib.PrivacyLossDistribution:
    """The event's PLD (cached; PLDs are immutable).

    Without sampling: :func:`coordinate_pld` self-composed ``dimension * count`` times. With
    Poisson sampling ``q < 1``: one release's PLD (``dimension`` compositions) is subsampled
    (:func:`_subsampled`), then self-composed ``count`` times.
    """
    event = _check_event(event)
    h = value_discretization_interval
    q = event.sampling_probability
    if event.analysis == "l2":
        # One release's dominating pair from the L2 analysis, then the same subsampling and
        # composition as below.
        release = shuffle_l2.release_pld(event.noise_trials, event.sensitivity,
                                         event.dimension, h)
        if q < 1:
            release = _subsampled(release, q, h)
        return release if event.count == 1 else release.self_compose(event.count)
    one = coordinate_pld(event.noise_trials, event.sensitivity,
                         value_discretization_interval=h, method=method)
    per_release = event.dimension if q < 1 else event.compositions
    if per_release == 1:
        release = one
    else:
        # Probability that a coordinate's loss is finite (B + s <= N); if the composition has
        # practically none left, dp_accounting's composition breaks down (all mass truncated):
        # every delta < 1 - 1e-10 then has epsilon = inf, and we say so with a degenerate PLD.
        from scipy import stats
        log_finite = float(stats.binom.logcdf(event.noise_trials - event.sensitivity,
                                              event.noise_trials, NOISE_PROBABILITY))
        if per_release * log_finite < math.log(_NO_PRIVACY_MASS) and q == 1:
            return pld_lib.PrivacyLossDistribution.create_from_rounded_probability(
                {0: _NO_PRIVACY_MASS}, 1.0 - _NO_PRIVACY_MASS, h)
        release = one.self_compose(per_release)
    if q == 1:
        return release
    sub = _subsampled(release, q, h)
    return sub if event.count == 1 else sub.self_compose(event.count)


def _subsampled(release: pld_lib.PrivacyLossDistribution, q: float, h: float
                ) -> pld_lib.PrivacyLossDistribution:
    """Poisson subsampling (rate ``q``, add/remove) of a release with dominating pair (P, Q).

    ``release``'s remove-direction PLD (pessimistic, so itself the PLD of a pair (P~, Q~) that
    dominates (P, Q)) gives P~ on the loss grid ``L``, ``Q~(L) = P~(L) e^-L`` and
    ``Q~(-inf) = 1 - sum_L Q~(L)``. Subsampling a dominated mechanism is dominated by
    ``((1-q) Q~ + q P~, Q~)`` (remove) and ``(Q~, (1-q) Q~ + q P~)`` (add) (Zhu, Dong and Wang
    2022, Thm. 11): losses ``log(1 - q + q e^L)`` and ``-log(1 - q + q e^L)``, with masses
    ``P~(L) (q + (1-q) e^-L)`` and ``P~(L) e^-L``; ``Q~(-inf)`` sits at ``log(1-q)`` and
    ``-log(1-q)``; ``P~(inf)`` stays infinite (remove, mass ``q P~(inf)``). Losses are rounded
    up to the grid (pessimistic). Reads the dense pmf's arrays (dp_accounting has no public
    accessor for them: these private fields are why pyproject.toml bounds dp-accounting < 0.7).
    """
    dense = release._pmf_remove.to_dense_pmf()                    # pylint: disable=protected-access
    loss = (dense._lower_loss + np.arange(dense.size)) * dense._discretization  # [m]
    p = np.asarray(dense._probs, dtype=np.float64)                # [m]
    p_inf = float(dense._infinity_mass)
    keep = p > 0
    loss, p = loss[keep], p[keep]
    q_fin = p * np.exp(-loss)                                     # Q~ on finite losses
    q_neg_inf = max(0.0, 1.0 - float(q_fin.sum()))
    log_mix = np.logaddexp(math.log1p(-q), math.log(q) + loss)    # log(1 - q + q e^L)

    def rounded(values: np.ndarray, masses: np.ndarray) -> dict:
        keys, where = np.unique(np.ceil(values / h).astype(np.int64), return_inverse=True)
        return dict(zip(keys.tolist(), np.bincount(where, weights=masses).tolist()))

    remove = rounded(np.append(log_mix, math.log1p(-q)),
                     np.append(p * (q + (1 - q) * np.exp(-loss)), (1 - q) * q_neg_inf))
    add = rounded(np.append(-log_mix, -math.log1p(-q)), np.append(q_fin, q_neg_inf))
    return pld_lib.PrivacyLossDistribution.create_from_rounded_probability(
        remove, q * p_inf, h, pessimistic_estimate=True,
        rounded_probability_mass_function_add=add, infinity_mass_add=0.0, symmetric=False)


def epsilon(config: ShuffleConfig, dimension: int, releases: int, delta: float, *,
            relation: str = "add_remove", method: str = "connect_dots",
            value_discretization_interval: float = DEFAULT_PLD_DISCRETIZATION,
            sampling_probability: float = 1.0, analysis: str = "per_coordinate") -> float:
    """Epsilon at ``delta`` of ``releases`` releases of the ``dimension``-coordinate sum (PLD;
    ``analysis`` ``'per_coordinate'`` or ``'l2'``, see :class:`BinomialSumEvent`)."""
    delta = validation.check_open_unit("delta", delta)
    event = make_event(_check_config(config), dimension, releases, relation,
                       sampling_probability, analysis)
    return float(pld(event, value_discretization_interval=value_discretization_interval,
                     method=method).get_epsilon_for_delta(delta))


def delta_for_epsilon(config: ShuffleConfig, dimension: int, releases: int, epsilon: float, *,
                      relation: str = "add_remove", method: str = "connect_dots",
                      value_discretization_interval: float = DEFAULT_PLD_DISCRETIZATION,
                      analysis: str = "per_coordinate") -> float:
    """Delta at ``epsilon`` (the hockey-stick divergence of the composed PLD, both directions)."""
    epsilon = validation.check_nonnegative("epsilon", epsilon)
    event = make_event(_check_config(config), dimension, releases, relation,
                       analysis=analysis)
    return float(pld(event, value_discretization_interval=value_discretization_interval,
                     method=method).get_delta_for_epsilon(epsilon))


def calibrate_noise_trials(target_epsilon: float, delta: float, *, granularity: int,
                           dimension: int, releases: int, relation: str = "add_remove",
                           max_trials: int = 2 ** 40, rtol: float = 0.0,
                           sampling_probability: float = 1.0,
                           value_discretization_interval: float = DEFAULT_PLD_DISCRETIZATION,
                           analysis: str = "per_coordinate") -> int:
    """Smallest ``N`` with ``epsilon <= target_epsilon`` at ``delta`` (discrete search), for
    ``releases`` releases of ``dimension`` coordinates (Poisson-sampled at
    ``sampling_probability``).

    Epsilon is non-increasing in ``N`` (``Bin(N + 1) = Bin(N) + `` an independent bit: a
    post-processing), so doubling brackets the answer and integer bisection finds it (stopped
    once the bracket is within ``rtol`` relative width; ``rtol = 0``: the exact smallest ``N``).
    The result always meets the target. Raises ``ValueError`` if ``max_trials`` is not enough.
    ``analysis``: ``'per_coordinate'`` or ``'l2'`` (:class:`BinomialSumEvent`; for ``'l2'`` the
    bound is not proven monotone in ``N``, but the returned ``N`` is always one that was
    evaluated and meets the target).
    """
    target = validation.check_positive("target_epsilon", target_epsilon)
    if not math.isfinite(target):
        raise ValueError(f"target_epsilon must be finite, got {target_epsilon!r}")
    delta = validation.check_open_unit("delta", delta)
    k = validation.check_int("granularity", granularity, minimum=1)
    dimension = validation.check_int("dimension", dimension, minimum=1)
    releases = validation.check_int("releases", releases, minimum=1)
    validation.check_choice("relation", relation, tuple(RELATIONS))
    q = validation.check_probability("sampling_probability", sampling_probability)
    if q < 1 and relation != "add_remove":
        raise ValueError(f"sampling_probability < 1 needs relation='add_remove', got "
                         f"{relation!r}")
    max_trials = validation.check_int("max_trials", max_trials, minimum=1,
                                      maximum=MAX_NOISE_TRIALS)
    rtol = validation.check_nonnegative("rtol", rtol)
    _check_analysis(analysis, relation)
    s = k * (2 if relation == "replace" else 1)
    # Largest N with no privacy at all (the L2 analysis needs N >= 2K: shuffle_l2.window).
    floor = 2 * k - 1 if analysis == "l2" else s - 1

    def eps_at(n: int) -> float:
        if n <= floor:
            return math.inf
        return float(pld(BinomialSumEvent(n, s, dimension, releases, q, analysis),
                         value_discretization_interval=value_discretization_interval
                         ).get_epsilon_for_delta(delta))

    # Start from the Gaussian approximation (std sqrt(N)/2, sensitivity s, d*T compositions),
    # then bracket [lo, hi] with eps(lo) > target >= eps(hi) by doubling / halving.
    # (L2: sensitivity max_rounded_l2 grid steps, T compositions.)
    if analysis == "l2":
        z = dp_accounting.get_sigma_gaussian(target, delta) * math.sqrt(releases)
        sens = shuffle_l2.max_rounded_l2(k, dimension)
    else:
        z = dp_accounting.get_sigma_gaussian(target, delta) * math.sqrt(dimension * releases)
        sens = s
    hi = int(min(max_trials, max(floor + 1, math.ceil(4 * (sens * z) ** 2))))
    while eps_at(hi) > target:
        if hi >= max_trials:
            raise ValueError(f"target_epsilon={target:g} is unreachable with noise_trials <= "
                             f"max_trials={max_trials} (epsilon={eps_at(hi):.4g} at delta="
                             f"{delta:g}); raise max_trials or the target")
        hi = min(2 * hi, max_trials)
    lo = max(floor, hi // 2)
    while lo > floor and eps_at(lo) <= target:
        hi, lo = lo, max(floor, lo // 2)                # below floor + 1: no privacy at all
    while hi - lo > max(1.0, rtol * lo):
        mid = (lo + hi) // 2
        if eps_at(mid) <= target:
            hi = mid
        else:
            lo = mid
    return hi
