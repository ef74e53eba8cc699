"""DP-FNAS search and retraining as pure update functions (dp-fnas paper, Algorithm 1, Eq. 3-7).

``make_search(model, hyper)`` returns an ``init`` / ``step`` pair over an explicit
:class:`SearchState` (one global W and one global alpha on the server, their optimiser states);
``step(state, key, data)`` is one search iteration for all K parties at once (the stacked agent
axis, :func:`fedjax_dp.core.for_each_agent`), compiled once. One iteration (docs/fnas.md):

1. **Weight mechanism** (training half, Eq. 6). Poisson-sample the training records with one
   rate for all parties, ``q = min(1, B / min_j n_j^tr)``; per-example ``grad_W l(W, alpha; x_i)``
   clipped to R^G over the whole W pytree, summed, plus ``N(0, (sigma R^G)^2)``, divided by the
   expected batch ``q n_k^tr``: ``G_k``. Server: W updated on ``G = mean_k G_k``.
2. **Virtual step** ``W' = W - xi G`` from the NOISED G (post-processing: no new access).
3. **Architecture mechanism** (validation half, Eq. 5/7), rate ``min(1, B / min_j n_j^val)``; per
   example ``[grad_alpha l(W', alpha; x_i), grad_W' l(W', alpha; x_i)]`` (first order: only the
   alpha part) clipped to R^H as one vector, summed, plus ``N(0, (tau R^H)^2)``, divided by the
   expected batch: ``(D_k, V_k)``.
4. **Second-order mechanism** (second order only). ``v = mean_k V_k``, ``eps = 0.01 / ||v||``. A
   FRESH Poisson sample of the training records; per example
   ``c_i = (grad_alpha l(W + eps v; x_i) - grad_alpha l(W - eps v; x_i)) / (2 eps)``
   (``'finite_difference'``, DARTS) or exactly ``c_i = d/dW grad_alpha l(W; x_i) . v`` (``'jvp'``),
   clipped to R^C, summed, plus ``N(0, (sigma_c R^C)^2)``, divided by the expected batch: ``C_k``,
   a mechanism on the training records (:mod:`fedjax_dp.algorithms.fnas.privacy`).
5. ``H_k = D_k - xi C_k`` (first order: ``H_k = D_k``); server: alpha updated by Adam on
   ``H = mean_k H_k``.

Without noise and clipping, with ``q = 1`` and ``'jvp'``, H is exactly ``grad_alpha F(alpha)`` of
``F(alpha) = mean_k L_val,k(W - xi grad_W mean_j L_trn,j(W, alpha), alpha)`` (tested).

Keys: per iteration one key per draw kind (weights, architecture, second order), split per party
(party k takes entry k of ``jax.random.split(key, K)``, by its global index), then per party into
a sampling key and a noise key: no key is used twice.

Mesh (``make_search(..., mesh=, num_parties=K)``): the parties' data is split over the mesh's
``agents`` axis (``K_pad = ceil(K / D) D`` rows, rows >= K padding: :mod:`.data`); each device
computes its own parties' mechanisms (:func:`party_mean`: ``shard_map``), the sums over parties
are a cross-device ``psum`` of each device's real parties, divided by K on every device; the
server state stays replicated. Same keys per party, so the same noise: equal results up to the
summation order.

Retraining (``make_retrain``): the same weight mechanism on the fixed network over ALL records of
every party (DP federated SGD), with its own sampling rate, clip norm and noise.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jax.sharding import PartitionSpec as P

from fedjax_dp.core import for_each_agent
from fedjax_dp.core.cohort import masked_sum
from fedjax_dp.core.lift import AGENTS
from fedjax_dp.models.darts import SearchModel
from fedjax_dp.privacy import batch_selection as bs, noise
from fedjax_dp.privacy.clipping import clipped_sum

Params = Any


class PartyData(NamedTuple):
    """One split of the K parties' records, padded: ``x [K, n, ...]``, ``y [K, n]``,
    ``mask [K, n]`` (real rows), ``rate [K]`` Poisson sampling rate, ``denom [K]`` the expected
    batch ``rate * count`` every sum is divided by."""

    x: jax.Array
    y: jax.Array
    mask: jax.Array
    rate: jax.Array
    denom: jax.Array


class SearchData(NamedTuple):
    """The parties' training halves (weights, second order) and validation halves (alpha)."""

    train: PartyData
    val: PartyData


class SearchState(NamedTuple):
    """Server state: global weights W, global alpha, their optimiser states, iterations done."""

    w: Params
    alpha: dict
    w_opt: Any
    a_opt: Any
    t: jax.Array


@dataclasses.dataclass(frozen=True)
class Mechanism:
    """Clip norm and noise multiplier of one Gaussian mechanism (``private=False``: neither)."""

    clip: float
    noise: float
    private: bool = True


@dataclasses.dataclass(frozen=True)
class SearchHyper:
    """Static hyperparameters of the search step (hashable: the compiled step is cached on it)."""

    weights: Mechanism
    arch: Mechanism
    second: Mechanism
    order: str = "first"                    # 'first' | 'second'
    second_order_method: str = "finite_difference"   # | 'jvp'
    xi: float = 0.025                       # virtual step size (DARTS: the weight lr)
    w_lr: float = 0.025
    w_lr_min: float = 0.001
    w_momentum: float = 0.9
    w_weight_decay: float = 3e-4
    total_iterations: int = 1               # length of the cosine schedule
    alpha_lr: float = 3e-4
    alpha_b1: float = 0.5
    alpha_b2: float = 0.999
    alpha_weight_decay: float = 1e-3


def cross_entropy(logits: jax.Array, y: jax.Array) -> jax.Array:
    """``-log softmax(logits)[y]`` for one example."""
    return -jax.nn.log_softmax(logits)[y]


#: Rows per pass of the sampled-rows loop in :func:`noisy_mean`.
CHUNK = 8


def noisy_mean(key: jax.Array, per_example_fn: Callable, x: jax.Array, y: jax.Array,
               mask: jax.Array, rate: jax.Array, denom: jax.Array, mech: Mechanism,
               chunk: int = CHUNK):
    """The Gaussian mechanism of one party on one split (Algorithm 1, "Gaussian mechanism").

    Unit: one record of this split; relation: add/remove one record. Poisson sampling with
    ``rate`` (``bernoulli(rate) & mask``); ``per_example_fn(x_i, y_i) -> (pytree, loss)``;
    each pytree clipped to ``mech.clip`` (global L2 norm), summed: sensitivity ``mech.clip``;
    plus ``N(0, (mech.noise * mech.clip)^2)`` per coordinate; divided by the FIXED expected
    batch ``denom``. Event: ``PoissonSampled(rate, Gaussian(mech.noise))``. Non-private: no
    clipping, no noise. Only sampled rows are computed, ``chunk`` per pass. Returns (noisy mean
    pytree, metrics dict of scalars).
    """
    k_sample, k_noise = jax.random.split(key)
    weights = bs.poisson_weights(k_sample, mask, rate)                           # [n]
    clip = mech.clip if mech.private else jnp.inf
    total, stats = clipped_sum(per_example_fn, (x, y), weights, clip,
                               bs.RowPlan(first=0, step=chunk))
    # i.i.d. N(0, (noise clip)^2) per coordinate, one flat draw (per-leaf draws slow compiling)
    out = noise.release(k_noise, total, mech.noise * mech.clip, denom,
                        noise=mech.private and mech.noise > 0)
    batch = jnp.maximum(stats["count"], 1.0)
    metrics = {"loss": stats["aux"] / batch, "clipped": stats["clipped"] / batch,
               "batch": stats["count"]}
    return out, metrics


def _tree_mean0(tree):
    return jax.tree.map(lambda l: jnp.mean(l, axis=0), tree)


def _axpy(a, x, y):
    """``y + a x`` over pytrees."""
    return jax.tree.map(lambda xi, yi: yi + a * xi, x, y)


def weight_optimizer(h: SearchHyper) -> optax.GradientTransformation:
    """DARTS' weight optimiser: SGD, momentum, weight decay, cosine lr ``w_lr -> w_lr_min``."""
    schedule = optax.cosine_decay_schedule(h.w_lr, max(h.total_iterations, 1),
                                           alpha=h.w_lr_min / h.w_lr)
    return optax.chain(optax.add_decayed_weights(h.w_weight_decay),
                       optax.sgd(schedule, momentum=h.w_momentum))


def alpha_optimizer(h: SearchHyper) -> optax.GradientTransformation:
    """DARTS' architecture optimiser: Adam (b1 0.5, b2 0.999) with L2 weight decay."""
    return optax.chain(optax.add_decayed_weights(h.alpha_weight_decay),
                       optax.adam(h.alpha_lr, b1=h.alpha_b1, b2=h.alpha_b2))


def over_parties(fn: Callable, in_axes: tuple, *, chunk_size: int | None,
                 backend: str) -> Callable:
    """``for_each_agent(fn, in_axes)`` over the party axis, except that ONE party calls ``fn``
    on party 0 and restores the axis: a vmapped batched ``while_loop`` of size 1 (in
    :func:`noisy_mean`) segfaults XLA's CPU runtime in jax 0.10.2. Same values (tested)."""
    lifted = for_each_agent(fn, in_axes, chunk_size=chunk_size, backend=backend)

    def call(*args):
        if backend == "vmap" and jax.tree.leaves(args[0])[0].shape[0] == 1:
            one = fn(*[jax.tree.map(lambda l: l[0], a) if ax == 0 else a
                       for a, ax in zip(args, in_axes)])
            return jax.tree.map(lambda l: l[None], one)
        return lifted(*args)

    return call


def _server(fn: Callable, backend: str) -> Callable:
    """``fn`` (the server's arithmetic between the parties' mechanisms) as ONE compiled call
    with the loop backend, whose step is not jitted as a whole (eager, every op of every leaf
    compiles a program of its own); as it is otherwise (traced into the jitted step)."""
    return jax.jit(fn) if backend == "loop" else fn


def _party_keys(key: jax.Array, num_parties: int, rows: int) -> jax.Array:
    """Party k's key ``jax.random.split(key, num_parties)[k]``, padded to ``rows`` with copies of
    the last (the padding parties' results are selected away)."""
    keys = jax.random.split(key, num_parties)
    if rows > num_parties:
        keys = jnp.concatenate([keys, jnp.repeat(keys[-1:], rows - num_parties, axis=0)])
    return keys


def party_mean(fn: Callable, in_axes: tuple, *, chunk_size: int | None, backend: str,
               mesh: Any = None, num_parties: int | None = None) -> Callable:
    """``call(key, *args)``: the mean over the parties of ``fn(key_k, *args_k)``, with ``key_k``
    party k's entry of ``jax.random.split(key, K)`` and ``in_axes`` the axes of ``args`` (0: a
    leading party axis, None: shared).

    Without ``mesh``: :func:`over_parties` (K = the party axis' length), then the mean. With
    ``mesh``: the party axis holds ``K_pad`` rows (a multiple of the mesh's devices, rows >=
    ``num_parties`` padding) split over ``agents``; each device runs :func:`over_parties` on its
    own rows (``shard_map``, no data moves), sums its real parties (the padding selected away),
    a ``psum`` adds the devices' sums, divided by ``num_parties``: a replicated result.
    """
    axes = (0,) + tuple(in_axes)
    rows = lambda args: next(jax.tree.leaves(a)[0].shape[0] for a, ax in zip(args, in_axes)
                             if ax == 0)
    if mesh is None:
        lifted = over_parties(fn, axes, chunk_size=chunk_size, backend=backend)
        mean = _server(_tree_mean0, backend)
        return lambda key, *args: mean(lifted(jax.random.split(key, rows(args)), *args))
    if num_parties is None or backend != "vmap":
        raise ValueError("party_mean with a mesh needs num_parties and backend='vmap'")
    local_fn = over_parties(fn, axes, chunk_size=chunk_size, backend="vmap")

    def local(where, *args):                  # one device: its rows of every per-party arg
        return jax.lax.psum(masked_sum(local_fn(*args), where), AGENTS)

    specs = (P(AGENTS),) + tuple(P(AGENTS) if ax == 0 else P() for ax in axes)
    summed = jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=P(), check_vma=False)

    def call(key, *args):
        n = rows(args)
        if n % mesh.shape[AGENTS] or n < num_parties:
            raise ValueError(f"party_mean: {n} party rows do not pad {num_parties} parties to a "
                             f"multiple of the mesh's {mesh.shape[AGENTS]} devices")
        where = jnp.arange(n) < num_parties
        total = summed(where, _party_keys(key, num_parties, n), *args)
        return jax.tree.map(lambda l: l / num_parties, total)

    return call


class SearchFns(NamedTuple):
    """init(key) -> SearchState; step(state, key, data) -> (state, metrics);
    gradients(state, key, data) -> (G, H, metrics), the server's noised gradients that ``step``
    feeds to the optimisers."""

    init: Callable
    step: Callable
    gradients: Callable


@functools.lru_cache(maxsize=32)
def make_search(model: SearchModel, h: SearchHyper, *, chunk_size: int | None = None,
                backend: str = "vmap", mesh: Any = None,
                num_parties: int | None = None) -> SearchFns:
    """``init`` / ``step`` (and ``gradients``) of the DP-FNAS search (cached on the arguments).

    One ``step`` is one iteration of Algorithm 1 for all parties, jitted (``backend='loop'``: one
    party at a time, the reference). ``mesh``: the data's party axis split over the mesh (K =
    ``num_parties`` real parties, padded), each party's mechanisms on its own device, the means
    over parties a cross-device ``psum`` (:func:`party_mean`); ``init``'s state is then placed
    replicated by the caller.
    """
    w_tx, a_tx = weight_optimizer(h), alpha_optimizer(h)

    def loss(w, alpha, x, y):
        return cross_entropy(model.apply(w, alpha, x), y)

    grad_w = jax.value_and_grad(loss, argnums=0)
    grad_wa = jax.value_and_grad(loss, argnums=(0, 1))

    def party_weights(key, w, alpha, x, y, mask, rate, denom):
        def per_example(xi, yi):
            value, g = grad_w(w, alpha, xi, yi)
            return g, value
        return noisy_mean(key, per_example, x, y, mask, rate, denom, h.weights)

    def party_arch(key, w_virtual, alpha, x, y, mask, rate, denom):
        def per_example(xi, yi):
            if h.order == "first":
                value, g_alpha = jax.value_and_grad(loss, argnums=1)(w_virtual, alpha, xi, yi)
                return (g_alpha, None), value
            value, (g_w, g_alpha) = grad_wa(w_virtual, alpha, xi, yi)
            return (g_alpha, g_w), value
        return noisy_mean(key, per_example, x, y, mask, rate, denom, h.arch)

    def party_second(key, w, alpha, v, eps, x, y, mask, rate, denom):
        grad_alpha = jax.grad(loss, argnums=1)

        def per_example(xi, yi):
            if h.second_order_method == "jvp":
                _, c = jax.jvp(lambda ww: grad_alpha(ww, alpha, xi, yi), (w,), (v,))
            else:
                plus = grad_alpha(_axpy(eps, v, w), alpha, xi, yi)
                minus = grad_alpha(_axpy(-eps, v, w), alpha, xi, yi)
                c = jax.tree.map(lambda p, m: (p - m) / (2 * eps), plus, minus)
            return c, jnp.zeros(())
        return noisy_mean(key, per_example, x, y, mask, rate, denom, h.second)

    lift = functools.partial(party_mean, chunk_size=chunk_size, backend=backend, mesh=mesh,
                             num_parties=num_parties)
    weights_mean = lift(party_weights, (None, None, 0, 0, 0, 0, 0))
    arch_mean = lift(party_arch, (None, None, 0, 0, 0, 0, 0))
    second_mean = lift(party_second, (None, None, None, None, 0, 0, 0, 0, 0))

    def init(key: jax.Array) -> SearchState:
        kw, ka = jax.random.split(key)
        w, alpha = model.init_weights(kw), model.init_alphas(ka)
        return SearchState(w=w, alpha=alpha, w_opt=w_tx.init(w), a_opt=a_tx.init(alpha),
                           t=jnp.zeros((), jnp.int32))

    axpy = _server(_axpy, backend)
    second_eps = _server(lambda v: 0.01 / jnp.maximum(optax.tree.norm(v), 1e-12), backend)

    def gradients(state: SearchState, key: jax.Array, data: SearchData):
        """(G, H, metrics): the released server gradients of W and alpha of one iteration."""
        tr, va = data.train, data.val
        k_w, k_a, k_c = jax.random.split(key, 3)
        g, m_w = weights_mean(k_w, state.w, state.alpha,                        # server mean
                              tr.x, tr.y, tr.mask, tr.rate, tr.denom)
        w_virtual = axpy(-h.xi, g, state.w)                                     # W' = W - xi G
        (hess, v), m_a = arch_mean(k_a, w_virtual, state.alpha,                 # D, V
                                   va.x, va.y, va.mask, va.rate, va.denom)
        metrics = {"train_loss": m_w["loss"], "val_loss": m_a["loss"],
                   "clipped_w": m_w["clipped"], "clipped_alpha": m_a["clipped"],
                   "batch_train": m_w["batch"], "batch_val": m_a["batch"]}
        if h.order == "second":                                                 # v: noised dW'
            eps = second_eps(v)
            c, m_c = second_mean(k_c, state.w, state.alpha, v, eps,
                                 tr.x, tr.y, tr.mask, tr.rate, tr.denom)
            hess = axpy(-h.xi, c, hess)                                         # H = D - xi C
            metrics["clipped_second"] = m_c["clipped"]
        return g, hess, metrics

    @functools.partial(_server, backend=backend)
    def server_update(state: SearchState, g, hess) -> SearchState:
        w_up, w_opt = w_tx.update(g, state.w_opt, state.w)
        a_up, a_opt = a_tx.update(hess, state.a_opt, state.alpha)
        return SearchState(w=optax.apply_updates(state.w, w_up),
                           alpha=optax.apply_updates(state.alpha, a_up),
                           w_opt=w_opt, a_opt=a_opt, t=state.t + 1)

    def step(state: SearchState, key: jax.Array, data: SearchData):
        g, hess, metrics = gradients(state, key, data)
        return server_update(state, g, hess), metrics

    if backend == "loop":
        return SearchFns(init, step, gradients)
    return SearchFns(init, jax.jit(step), jax.jit(gradients))


class RetrainFns(NamedTuple):
    init: Callable
    step: Callable


class RetrainState(NamedTuple):
    params: Params
    opt: Any
    t: jax.Array


@dataclasses.dataclass(frozen=True)
class RetrainHyper:
    """Retraining of the fixed network: DP federated SGD over all records of every party."""

    mech: Mechanism
    lr: float = 0.05
    lr_min: float = 0.0
    momentum: float = 0.9
    weight_decay: float = 3e-4
    total_iterations: int = 1


@functools.lru_cache(maxsize=32)
def make_retrain(model, h: RetrainHyper, *, chunk_size: int | None = None,
                 backend: str = "vmap", mesh: Any = None,
                 num_parties: int | None = None) -> RetrainFns:
    """``init`` / ``step`` of retraining ``model`` (a :class:`~fedjax_dp.models.Model`).

    step(state, key, data: PartyData) -> (state, metrics): every party's noisy mean clipped
    gradient over a Poisson sample of its records (:func:`noisy_mean`), averaged over parties,
    one SGD-with-momentum step (cosine lr, weight decay) on the server. ``mesh`` /
    ``num_parties``: as :func:`make_search` (each party on its own device, a ``psum``).
    """
    schedule = optax.cosine_decay_schedule(h.lr, max(h.total_iterations, 1),
                                           alpha=h.lr_min / h.lr)
    tx = optax.chain(optax.add_decayed_weights(h.weight_decay),
                     optax.sgd(schedule, momentum=h.momentum))
    grad = jax.value_and_grad(lambda p, x, y: cross_entropy(model.apply(p, x), y))

    def party(key, params, x, y, mask, rate, denom):
        def per_example(xi, yi):
            value, g = grad(params, xi, yi)
            return g, value
        return noisy_mean(key, per_example, x, y, mask, rate, denom, h.mech)

    mean = party_mean(party, (None, 0, 0, 0, 0, 0), chunk_size=chunk_size, backend=backend,
                      mesh=mesh, num_parties=num_parties)

    def init(key):
        params = model.init(key)
        return RetrainState(params=params, opt=tx.init(params), t=jnp.zeros((), jnp.int32))

    def step(state: RetrainState, key: jax.Array, data: PartyData):
        g, m = mean(key, state.params, data.x, data.y, data.mask, data.rate, data.denom)
        up, opt = tx.update(g, state.opt, state.params)
        return (RetrainState(optax.apply_updates(state.params, up), opt, state.t + 1),
                {"retrain_loss": m["loss"], "clipped_retrain": m["clipped"]})

    return RetrainFns(init, step if backend == "loop" else jax.jit(step))
