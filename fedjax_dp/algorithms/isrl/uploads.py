"""What one silo sends: noisy means of clipped per-record gradients (or gradient differences).

Written for ONE silo (``x [n_max, ...]``, ``y [n_max]``, ``mask [n_max]``), lifted over the silo
axis with :func:`fedjax_dp.core.for_each_agent`. Each upload draws a Poisson minibatch (every
real record with probability ``rate`` = p_i) and divides by the FIXED expected batch size
``denom`` = p_i n_i (the realised size would leak).

Gradient upload (MB-SGD, SPIDER refresh, SVRG snapshot, one Local-SGD step):

    u_i = ( sum_j b_ij clip_C(g(w, x_ij)) + N(0, (z C)^2 I) ) / (p_i n_i)                     (1)

Difference upload (SPIDER, paper Alg. 3 l. 9-10; SVRG, Alg. 1 l. 9-10), on the SAME records:

    d_ij = clip_tau( clip_C(g(w, x_ij)) - clip_C(g(w_ref, x_ij)) )
    u_i  = ( sum_j b_ij d_ij + N(0, (z tau)^2 I) ) / (p_i n_i)                                  (2)

with tau <= 2C public (``tau = min(2C, beta_hat ||w - w_ref||)``; clip_C is the projection onto
the C-ball, 1-Lipschitz, so ``||d_ij|| <= beta ||w - w_ref||`` when g is beta-Lipschitz in w and
the outer clip is then a no-op).

``clip_C`` is over the whole parameter vector (global L2 norm). Privacy of one upload (unit: one
record of this silo, relation add/remove it): the sum in (1) moves by at most C, in (2) by at
most tau; noise std z times that: a Poisson-sampled Gaussian mechanism, multiplier z, rate p_i.
``private=False``: no clipping, no noise. Every upload is the private-gradient primitive
:mod:`fedjax_dp.privacy.private_grad`, in passes planned for ``expected`` (None: all rows).
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from fedjax_dp.privacy import batch_selection as bs, noise, shuffle as shuffle_lib
from fedjax_dp.privacy.clipping import clip_by_global_norm, clipped_sum
from fedjax_dp.privacy.private_grad import private_gradient

Params = Any

__all__ = ["sample_records", "gradient_upload", "difference_upload", "encode_reports",
           "shuffled_estimate", "gradient_reports", "difference_reports", "row_plan"]

#: Poisson record selection of one silo (:func:`fedjax_dp.privacy.batch_selection.poisson_weights`).
sample_records = bs.poisson_weights


def row_plan(expected: float | None, num_rows: int) -> bs.RowPlan | None:
    """The padded passes of an upload with expected batch ``expected`` (None: all rows)."""
    return None if expected is None else bs.RowPlan.for_expected(expected, num_rows)


def _upload_stats(stats: dict, private: bool) -> dict:
    return {"batch_size": stats["count"],
            "clipped": stats["clipped"] if private else jnp.zeros(())}


def gradient_upload(loss_fn: Callable, private: bool, expected: float | None = None) -> Callable:
    """``upload(key, params, x, y, mask, rate, denom, clip, z) -> (u [params], stats)``: eq. (1)
    (:func:`fedjax_dp.privacy.private_grad.private_gradient`). ``expected``: the upload's expected
    batch K (plans the gathered passes; None: one pass over all rows)."""

    def upload(key, params, x, y, mask, rate, denom, clip, z):
        u, stats = private_gradient(key, loss_fn, params, x, y, mask, rate, denom, clip,
                                    z * clip, plan=row_plan(expected, mask.shape[0]),
                                    private=private)
        return u, _upload_stats(stats, private)

    return upload


def difference_fn(loss_fn: Callable, params: Params, ref: Params, clip, private: bool):
    """``v(x, y) = (clip_C(g(params; x, y)) - clip_C(g(ref; x, y)), 0)`` (no clip when not
    private): the per-record vector of eq. (2) before its clip at tau."""
    grad = jax.grad(loss_fn)

    def one(x, y):
        g_new, g_ref = grad(params, x, y), grad(ref, x, y)
        if private:
            g_new, _ = clip_by_global_norm(g_new, clip)
            g_ref, _ = clip_by_global_norm(g_ref, clip)
        return jax.tree.map(jnp.subtract, g_new, g_ref), jnp.zeros(())

    return one


def difference_upload(loss_fn: Callable, private: bool, expected: float | None = None) -> Callable:
    """Eq. (2): ``upload(key, params, ref, x, y, mask, rate, denom, clip, tau, z) -> (u, stats)``.
    """

    def upload(key, params, ref, x, y, mask, rate, denom, clip, tau, z):
        k_batch, k_noise = jax.random.split(key)
        w = bs.poisson_weights(k_batch, mask, rate)                           # [n_max]
        summed, stats = clipped_sum(difference_fn(loss_fn, params, ref, clip, private),
                                    (x, y), w, tau if private else jnp.inf,
                                    row_plan(expected, mask.shape[0]))
        u = noise.release(k_noise, summed, z * tau, denom, noise=private)
        return u, _upload_stats(stats, private)

    return upload


# --------------------------------------------------------------------------- shuffle-DP reports
# The local randomiser runs in the silo with the SILO's key; the server sees only the sums over
# all reports (:mod:`fedjax_dp.privacy.shuffle`), so a silo passes the exact int32 sum of its own
# reports (the same whichever silos are computed together).

def encode_reports(key: jax.Array, rows: jax.Array, weights: jax.Array, config) -> jax.Array:
    """One silo's part of the shuffled vector sum: ``sum_j w_j ybar_j`` int32 ``[d]``.

    ``ybar_j = round_rand(K clip(x_j) / C)`` (``x_j = rows[j]``, clip to C in ``config.norm``,
    unbiased randomised rounding to the integers, one uniform per entry from ``key``): the steps
    of :func:`fedjax_dp.privacy.shuffle.shuffle_vector_sum` before the binomial noise, which the
    server-side sum adds once (:func:`shuffled_estimate`). ``weights [n_max]`` 0/1 (the Poisson
    sample; padding rows are 0)."""
    k = config.granularity
    x = shuffle_lib.clip(rows.astype(jnp.float32), config)                  # [n_max, d]
    y = jnp.clip(x * (k / config.clip_norm), -k, k)
    ybar = shuffle_lib.randomized_round(key, y)                             # [n_max, d] int32
    return jnp.sum(ybar * (weights > 0).astype(jnp.int32)[:, None], axis=0)  # [d]


def shuffled_estimate(key: jax.Array, sums: jax.Array, config) -> jax.Array:
    """Server: ``decode(S + B - floor(N / 2))`` ``[d]`` float32 for the integer sums ``S`` of all
    reports (``B ~ Bin(N, 1/2)`` per coordinate, ``N`` = ``config.noise_trials``)."""
    noisy = sums + shuffle_lib.binomial_noise(key, config.noise_trials, sums.shape[-1])
    return shuffle_lib.decode(noisy, config)


def gradient_reports(loss_fn: Callable, config, expected: float | None = None) -> Callable:
    """SDP: ``reports(key, params, x, y, mask, rate) -> (sums [d] int32, stats)``.

    One report per sampled record: its per-record gradient, encoded in the silo
    (:func:`encode_reports`: clip to C = ``config.clip_norm`` in L2 over the whole vector, grid
    C / K, randomised rounding). ``key`` splits into the Poisson-sampling and the rounding key.
    Only the sampled records' gradients are computed
    (:func:`fedjax_dp.privacy.batch_selection.selected_rows`; the others' rows are zero, weight 0).
    """
    clip = config.clip_norm

    def reports(key, params, x, y, mask, rate):
        k_batch, k_round = jax.random.split(key)
        w = sample_records(k_batch, mask, rate)                               # [n_max]
        grad = jax.grad(loss_fn)

        def one(xi, yi):
            row = ravel_pytree(grad(params, xi, yi))[0]                        # [d]
            return row, jnp.linalg.norm(row)

        rows, norms = bs.selected_rows(one, (x, y), w, row_plan(expected, mask.shape[0]))
        return encode_reports(k_round, rows, w, config), {
            "batch_size": jnp.sum(w), "clipped": jnp.sum(w * (norms > clip))}

    return reports


def difference_reports(loss_fn: Callable, config, expected: float | None = None) -> Callable:
    """SDP: ``reports(key, params, ref, x, y, mask, rate, clip, tau) -> (sums [d] int32, stats)``.

    Rows ``(C / tau) clip_tau(clip_C(g(w, x)) - clip_C(g(w_ref, x)))`` (norm <= C, so the
    protocol's clip at C is a no-op and one report moves each coordinate's sum by at most K grid
    steps, as for a gradient report), encoded as in :func:`gradient_reports`; the server
    multiplies the decoded sum by ``tau / C`` (post-processing: tau is public).
    """

    def reports(key, params, ref, x, y, mask, rate, clip, tau):
        k_batch, k_round = jax.random.split(key)
        w = sample_records(k_batch, mask, rate)
        diff = difference_fn(loss_fn, params, ref, clip, True)

        def one(xi, yi):
            d, norm = clip_by_global_norm(diff(xi, yi)[0], tau)
            return ravel_pytree(d)[0] * (clip / jnp.maximum(tau, 1e-30)), norm

        rows, norms = bs.selected_rows(one, (x, y), w, row_plan(expected, mask.shape[0]))
        return encode_reports(k_round, rows, w, config), {
            "batch_size": jnp.sum(w), "clipped": jnp.sum(w * (norms > tau))}

    return reports
