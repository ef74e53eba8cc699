"""Correlated noise across rounds (DP-FTRL / the matrix mechanism), streamed on the device.

The server's noisy sums ``x_t + sigma (C^-1 Z)_t`` (Z's rows i.i.d. N(0, I_d)) drive SGD, so the
iterates are ``theta_0 + eta A (x + C^-1 Z)`` with A the prefix-sum (lower-triangular ones)
workload: the matrix mechanism ``A = B C`` with ``B = A C^-1``, private because ``C x + Z`` is a
Gaussian mechanism on ``C x`` (Choquette-Choo et al., "(Amplified) Banded Matrix Factorization",
NeurIPS 2023, Section 2; Kairouz et al. ICML 2021 for the tree case). The strategies, their
optimisation, sensitivity and accounting events are jax-privacy's (2.0):

``banded_mf`` (Choquette-Choo et al. 2023): a b-banded lower-triangular Toeplitz C with unit
column norm, optimised for the mean squared error of the prefix sums
(``toeplitz.optimize_banded_toeplitz``). Participation: each agent is assigned, independently and
uniformly, one of b groups (independent of the data, so adding an agent changes no other's
group); round t Poisson-samples group ``t mod b`` with rate q. An agent's rounds are then at least
b apart, its columns of C have disjoint support, and the amplified analysis (their Theorem 4)
gives ``SelfComposed(PoissonSampled(q, Gaussian(z)), ceil(T / b))``
(``jax_privacy.experimental.accounting.amplified_bandmf_event``) under add/remove one agent.

``blt`` (buffered linear Toeplitz; Dvijotham, McMahan, Pillutla, Steinke, Thakurta 2024,
McKenna 2024): C lower-triangular Toeplitz with a BLT inverse (``nbuf`` buffers, O(nbuf d)
state), optimised by ``buffered_toeplitz.optimize`` for b-min-sep participation of at most
k = ceil(T / b) rounds. The same groups; no amplification is claimed: the whole run is one
Gaussian mechanism on ``C x`` with L2 sensitivity ``s = sqrt(max over b-min-sep patterns of
||C u||^2)`` (``toeplitz.minsep_sensitivity_squared``) times the clip, so its event is
``Gaussian(z / s)`` for noise std ``z S``.

``tree`` (tree aggregation, DP-FTRL; Kairouz et al. ICML 2021): jax-privacy 2.0 has no tree, so
:mod:`fedjax_dp.privacy.tree_noise` builds it (a binary tree over each b rounds, restarted every
b rounds, node noises regenerated from the tree's key) and dp-accounting gives its event,
``SelfComposed(SingleEpochTreeAggregation(z, b), ceil(T / b))``; the same groups make every
agent take part at most once per tree.

The noise is generated round by round from the round's key by jax-privacy's streaming ``C^-1``
(``StreamingMatrix``: (b - 1) d numbers of state for banded, ``nbuf d`` for BLT; never a T x d
matrix), carried in the run's values, so the rounds stay fused on the device.
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
from fedjax_dp.privacy import tree_noise

__all__ = ["CorrelatedNoise", "parse", "KINDS", "strategy_coefs", "sensitivity", "dp_event",
           "init_state", "next_noise"]

KINDS = ("banded_mf", "blt", "tree")
OPTIONS = {"kind": f"one of {list(KINDS)}",
           "bands": "b >= 1: banded_mf's bands and the participation cycle (min separation)",
           "min_sep": "b >= 1: blt's and tree's participation cycle (rounds between an agent's "
                      "turns; the tree restarts every b rounds)",
           "optimizer_steps": "the strategy optimisation's L-BFGS steps (>= 1; default 250)",
           "buf_decay": "blt only: a given BLT's buffer decays (0 < theta < 1; no optimisation)",
           "output_scale": "blt only: a given BLT's output scales (> 0), as many as buf_decay"}


@dataclasses.dataclass(frozen=True)
class CorrelatedNoise:
    """The strategy: ``kind`` (:data:`KINDS`), ``cycle`` b (banded_mf's bands; blt's min
    separation: both the number of participation groups), ``rounds`` T (the strategy's size),
    ``optimizer_steps``."""

    kind: str
    cycle: int
    rounds: int = 0
    optimizer_steps: int = 250
    buf_decay: tuple = ()           # a given BLT (blt only): no optimisation
    output_scale: tuple = ()

    @property
    def participations(self) -> int:
        """k = ceil(T / b): the most rounds one agent can take part in."""
        return -(-self.rounds // self.cycle)


def parse(name: str, value: Any) -> CorrelatedNoise | None:
    """``algorithm.noise``: None / ``"independent"`` (fresh noise each round) or a table
    ``{kind = "banded_mf", bands = b}`` / ``{kind = "blt", min_sep = b}`` /
    ``{kind = "tree", min_sep = b}``."""
    value = validation.options_table(
        name, value, OPTIONS, off="independent", cls=CorrelatedNoise, kinds=KINDS,
        accepts='"independent" or a table such as {kind = "banded_mf", bands = 4}')
    if not isinstance(value, dict):
        return value
    kind = value["kind"]
    key = "bands" if kind == "banded_mf" else "min_sep"
    other = "min_sep" if kind == "banded_mf" else "bands"
    if other in value:
        raise ValueError(f"{name}.{other} does not apply to kind {kind!r}; give {name}.{key}")
    cycle = validation.check_int(f"{name}.{key}", value.get(key), minimum=1, exact=True)
    steps = validation.check_int(f"{name}.optimizer_steps", value.get("optimizer_steps", 250),
                                 minimum=1, exact=True)
    blt = {k: value.get(k) for k in ("buf_decay", "output_scale") if k in value}
    if blt:
        if kind != "blt" or len(blt) != 2:
            raise ValueError(f"{name}.buf_decay and {name}.output_scale go together, with "
                             f"kind = \"blt\"")
        ok = all(isinstance(v, list) and v and all(isinstance(x, (int, float)) and
                                                   not isinstance(x, bool) for x in v)
                 for v in blt.values()) and len(blt["buf_decay"]) == len(blt["output_scale"])
        if not ok or not all(0 < x < 1 for x in blt["buf_decay"]) or \
                not all(x > 0 for x in blt["output_scale"]):
            raise ValueError(f"{name}.buf_decay (each in (0, 1)) and {name}.output_scale (each "
                             f"> 0) must be lists of the same length, got {blt}")
        blt = {k: tuple(float(x) for x in v) for k, v in blt.items()}
    return CorrelatedNoise(kind=kind, cycle=cycle, optimizer_steps=steps, **blt)


def check_rounds(name: str, spec: CorrelatedNoise, rounds: int) -> CorrelatedNoise:
    """The strategy for a run of ``rounds`` rounds (b <= T checked, naming ``name``)."""
    if spec.cycle > rounds:
        what = "bands" if spec.kind == "banded_mf" else "min_sep"
        raise ValueError(f"{name}.{what} = {spec.cycle} must be at most algorithm.rounds "
                         f"({rounds})")
    return dataclasses.replace(spec, rounds=int(rounds))


@functools.lru_cache(maxsize=16)
def _strategy(spec: CorrelatedNoise):
    """jax-privacy's optimised strategy: banded Toeplitz coefficients (unit norm), or a BLT
    (optimised in float64, as jax-privacy requires)."""
    from jax_privacy.matrix_factorization import buffered_toeplitz, toeplitz
    if spec.kind == "banded_mf":
        if spec.cycle == 1:
            return np.ones(1)                     # C = I: independent noise
        return np.asarray(toeplitz.optimize_banded_toeplitz(
            spec.rounds, spec.cycle, max_optimizer_steps=spec.optimizer_steps), np.float64)
    with jax.enable_x64(True):
        if spec.buf_decay:
            return buffered_toeplitz.BufferedToeplitz.build(spec.buf_decay, spec.output_scale)
        return buffered_toeplitz.optimize(n=spec.rounds, min_sep=spec.cycle,
                                          max_participations=spec.participations)


def strategy_coefs(spec: CorrelatedNoise) -> np.ndarray:
    """The first column of the lower-triangular Toeplitz C ``[T]`` (its Toeplitz coefficients)."""
    s = _strategy(spec)
    if spec.kind == "banded_mf":
        return np.pad(s, (0, spec.rounds - len(s)))
    with jax.enable_x64(True):
        return np.asarray(s.toeplitz_coefs(spec.rounds), np.float64)


def sensitivity(spec: CorrelatedNoise) -> float:
    """s: the L2 sensitivity (tree: of one tree, sqrt of its levels,
    :func:`fedjax_dp.privacy.tree_noise.levels`) of ``C x`` per unit of clip over b-min-sep
    patterns of at most ceil(T / b) participations (:func:`pattern_sensitivity`)."""
    if spec.kind == "tree":
        return math.sqrt(tree_noise.levels(spec.cycle))
    return pattern_sensitivity(spec, spec.cycle, spec.participations)


@functools.lru_cache(maxsize=64)
def pattern_sensitivity(spec: CorrelatedNoise, min_sep: int, max_participations: int) -> float:
    """s = sqrt(max over participation patterns u (turns at least ``min_sep`` apart, at most
    ``max_participations`` of them) of ||C u||^2): the L2 sensitivity of ``C x`` per unit of
    clip (jax-privacy's ``toeplitz.minsep_sensitivity_squared``, exact for C's non-negative,
    non-increasing Toeplitz coefficients; Theorem 2 of arXiv 2405.13763)."""
    from jax_privacy.matrix_factorization import toeplitz
    with jax.enable_x64(True):
        sq = toeplitz.minsep_sensitivity_squared(jnp.asarray(strategy_coefs(spec)), int(min_sep),
                                                 int(max_participations), n=spec.rounds)
    return math.sqrt(float(sq))


def dp_event(spec: CorrelatedNoise, noise_multiplier: float, sampling_rate: float):
    """The run's event under add/remove one agent, noise std ``z S`` per coordinate per round:
    banded_mf ``amplified_bandmf_event(z, T, b, q)``; blt ``Gaussian(z / s)``."""
    import dp_accounting
    if spec.kind == "tree":
        return tree_noise.dp_event(noise_multiplier, spec.cycle, spec.rounds)
    from jax_privacy.experimental import accounting as jp_accounting
    if spec.kind == "banded_mf":
        return jp_accounting.amplified_bandmf_event(
            noise_multiplier, spec.rounds, num_bands=spec.cycle, sampling_prob=sampling_rate)
    return dp_accounting.GaussianDpEvent(noise_multiplier / sensitivity(spec))


@functools.lru_cache(maxsize=16)
def _inverse(spec: CorrelatedNoise):
    """jax-privacy's streaming C^-1."""
    from jax_privacy.matrix_factorization import toeplitz
    if spec.kind == "banded_mf":
        coef = _strategy(spec)
        return toeplitz.inverse_as_streaming_matrix(jnp.asarray(coef, jnp.float32))
    from jax_privacy.matrix_factorization import buffered_toeplitz
    blt = _strategy(spec)                    # Alg. 3 of arXiv 2408.08868, in float32 on device
    return buffered_toeplitz.StreamingMatrixBuilder(
        buf_decay=np.asarray(blt.buf_decay, np.float32),
        output_scale=np.asarray(blt.output_scale, np.float32)).build_inverse()


def init_state(spec: CorrelatedNoise, dim: int) -> Any:
    """The streaming ``C^-1``'s state for noise vectors of ``dim`` coordinates (tree: its
    root key and round, :func:`fedjax_dp.privacy.tree_noise.init_state`)."""
    if spec.kind == "tree":
        return tree_noise.init_state()
    return _inverse(spec).init_multiply(jax.ShapeDtypeStruct((dim,), jnp.float32))


def next_noise(spec: CorrelatedNoise, key: jax.Array, state: Any, dim: int
               ) -> tuple[jax.Array, Any]:
    """``((C^-1 Z)_t [d], state')`` with ``Z_t ~ N(0, I_d)`` drawn from ``key`` (the round's);
    tree: the increment of the prefix noise (:func:`fedjax_dp.privacy.tree_noise.next_noise`)."""
    if spec.kind == "tree":
        return tree_noise.next_noise(spec.cycle, key, state, dim)
    z = jax.random.normal(key, (dim,), jnp.float32)
    return _inverse(spec).multiply_next(z, state)
