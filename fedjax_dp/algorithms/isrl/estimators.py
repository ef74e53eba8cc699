"""Server-side gradient estimators of the variance-reduced methods (pure updates on pytrees).

``avg`` is always the server's average of the available silos' uploads,
``avg = (1/M) sum_{i in S_r} u_i``; the rounds (SPIDER, paper Alg. 3, l. 6-11, Fang et al. 2018,
phase length q; Prox-SVRG, Alg. 1, l. 5-10, Reddi et al. 2016, epoch length m) are written out
in :mod:`.spider` and :mod:`.svrg`: a refresh / snapshot sets ``v = avg`` of gradient uploads,
otherwise ``v`` adds ``avg`` of difference uploads to ``v_{r-1}`` (SPIDER) or to the snapshot's
``g~`` (SVRG). Then every method steps ``w_{t+1} = prox_{eta f1}(w_t - eta v_t)``
(:func:`prox_step`). Difference clip: ``tau = min(2C, beta_hat ||w - w_ref||)``
(:func:`difference_clip`), public (the server knows both iterates); with no ``beta_hat`` 2C.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from fedjax_dp.algorithms.isrl import prox as prox_lib

Params = Any


def is_refresh(t, period: int):
    """True on the rounds that refresh the estimator: ``t mod period == 0``."""
    return (t % period) == 0


def refresh_counts(rounds: int, period: int) -> tuple[int, int]:
    """``(refresh rounds, other rounds)`` of ``rounds`` rounds: ``ceil(R / period)``, the rest."""
    refresh = -(-rounds // period)
    return (refresh, rounds - refresh)


def spider_update(v: Params, avg: Params, refresh) -> Params:
    """``avg`` on a refresh round, ``v + avg`` otherwise (``refresh`` may be traced)."""
    return jax.tree.map(lambda a, b: jnp.where(refresh, b, a + b), v, avg)


def svrg_update(snapshot_grad: Params, avg: Params, snapshot) -> tuple[Params, Params]:
    """``(g~, v)``: on a snapshot round ``g~ = avg`` and ``v = g~``; otherwise ``g~`` is kept and
    ``v = g~ + avg``."""
    g = jax.tree.map(lambda old, a: jnp.where(snapshot, a, old), snapshot_grad, avg)
    v = jax.tree.map(lambda gs, a: jnp.where(snapshot, gs, gs + a), g, avg)
    return g, v


def difference_clip(params: Params, ref: Params, clip, smoothness: float | None):
    """``tau = min(2C, beta_hat ||params - ref||_2)`` (``2C`` when ``smoothness`` is None)."""
    two_c = 2.0 * clip
    if smoothness is None:
        return jnp.asarray(two_c, jnp.float32)
    dist = optax.tree.norm(jax.tree.map(jnp.subtract, params, ref))
    return jnp.minimum(two_c, smoothness * dist).astype(jnp.float32)


def prox_step(prox: prox_lib.Prox, params: Params, v: Params, lr) -> Params:
    """``prox_{lr f1}(params - lr v)``."""
    return prox_lib.apply(prox, jax.tree.map(lambda w, g: w - lr * g, params, v), lr)
