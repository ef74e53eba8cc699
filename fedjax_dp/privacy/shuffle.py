"""Shuffle-DP vector summation: randomised rounding to a grid + binomial noise.

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
``est`` is a function of ``S`` and the public config only (:func:`decode`). The ``N`` noise bits
per coordinate are contributed by the participants; their sum is ``Bin(N, 1/2)`` however they
are split, so it is drawn directly. ``N`` is fixed per release, so the noise is
data-independent. Signed grid values are summed (not Cheu et al.'s shift to ``{0..2K}``), so
decoding needs no count of reports and the add/remove relation does not reveal it.

Variance (:func:`estimate_variance`): ``Var(est_j) = (C/K)^2 (sum_i w_i f_ij (1 - f_ij) + N / 4)``
with ``f_ij = y_ij - floor(y_ij)`` (rounding, then noise).

Clipping: the L2 norm by default (the ISRL algorithms' per-record clip; ``||x||_2 <= C``
implies ``|x_j| <= C``, all the grid needs); ``'linf'`` clips each coordinate to ``[-C, C]``
(more signal for the same per-coordinate accounting).

Privacy: :mod:`fedjax_dp.privacy.shuffle_accounting` (the exact PLD of the binomial sum).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.core import validation
from fedjax_dp.privacy.clipping import clip_by_global_norm
from fedjax_dp.privacy.discrete_noise import randomized_round

__all__ = ["NORMS", "NOISE_PROBABILITY", "MAX_NOISE_TRIALS", "ShuffleConfig", "check_config",
           "clip", "randomized_round", "binomial_noise", "shuffle_vector_sum", "shuffle_tree_sum",
           "tree_dimension", "decode", "estimate_variance"]

NORMS = ("l2", "linf")

#: The noise bits are Bernoulli(1/2): the symmetry the dominating-pair proof uses.
NOISE_PROBABILITY = 0.5

#: Noise counts up to this are drawn exactly, bit by bit (popcount of random words).
_MAX_EXACT_BITS = 2 ** 12

#: Largest count drawn from one cdf table (~12 sqrt(N) entries); larger N is a sum of chunks.
_MAX_TABLE_TRIALS = 2 ** 30

#: Largest N the simulator draws (at most 1024 chunks); accounting alone goes up to 2^52.
MAX_NOISE_TRIALS = 2 ** 40

#: Half-width of the enumerated window in units of sqrt(N): Hoeffding gives P(tail) <= e^{-2 Z}.
WINDOW_Z = 35.0


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
        c = validation.check_positive("clip_norm", self.clip_norm, finite=True)
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


def check_config(config: Any) -> ShuffleConfig:
    if not isinstance(config, ShuffleConfig):
        raise ValueError(f"config must be a ShuffleConfig, got {type(config).__name__}")
    return config


def clip(vectors: jax.Array, config: ShuffleConfig) -> jax.Array:
    """Bound each row of ``vectors [n, d]`` by ``C``: ``[n, d]``, every coordinate in ``[-C, C]``.

    ``'l2'``: ``x * min(1, C / ||x||_2)`` per row (:func:`clipping.clip_by_global_norm`, vmapped);
    ``'linf'``: a coordinate clip, ``clip(x, -C, C)``.
    """
    c = config.clip_norm
    if config.norm == "l2":
        vectors = jax.vmap(clip_by_global_norm, in_axes=(0, None))(vectors, c)[0]
    return jnp.clip(vectors, -c, c)   # l2: removes only float rounding above C


@functools.lru_cache(maxsize=8)
def _cdf_table(n: int) -> tuple[int, np.ndarray, np.ndarray]:
    """``(lo, F_hi, F_lo)``: the Bin(n, 1/2) cdf on its window ``lo..hi`` as 64-bit fixed point.

    ``F[k] = floor(2^64 P(B <= lo + k))`` split into two uint32 words (float64 cdf from scipy, so
    exact to ~2^-53); the last entry is ``2^64 - 1``, so the mass above the window (< e^-70) and any
    rounding go to the last outcome, the mass below it to the first."""
    from scipy import stats
    half = math.sqrt(WINDOW_Z * n)
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

    A uniform 64-bit ``U`` (two uint32 words) goes to the first ``k`` with ``F[k] > U`` (vectorised
    binary search on the fixed-point table of :func:`_cdf_table`), so ``P(k) = (F[k] - F[k-1]) /
    2^64``."""
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
      probability is off by at most ~1e-12. ``N`` above 2^30 is a sum of independent chunks of
      2^30 trials plus the remainder, so tables stay below ~400k entries (constants of the
      compiled program). Cost ``O(d log N)`` per chunk.
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
    report). With ``return_sums`` also returns the integer sums ``S [d]`` (int32), the only thing
    the server sees; the estimate is :func:`decode` of them. Pure, jit- and vmap-able; one key,
    split into a rounding and a noise key. Privacy: :func:`fedjax_dp.privacy.shuffle_accounting.make_event` with ``dimension = d``.
    """
    config = check_config(config)
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
