"""One chunk's work in the FedKT phases (:mod:`.phases`): what a chunk of P parties computes.

* :func:`teacher_fn`: the JAX teachers of a chunk (their subsets, training, predictions on the
  party queries and vote counts), :func:`host_teachers` the reused or tree ones;
* :func:`student_fn`: a chunk's party labels (:func:`party_labels`, LNMax at L2), the JAX
  students trained on them and their predictions on the server queries, :func:`host_students`
  the reused or tree ones.

Without a mesh :func:`teacher_fn` / :func:`student_fn` return the chunk's work as a plain
function whose steps are their own compiled calls (the single-device path); with one, the same
function as ONE ``jit(shard_map)`` over the party axis (:func:`.mesh.over_mesh`): each device
computes its own parties, so every party's teachers and students run on exactly one device.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from fedjax_dp.algorithms.fedkt import learners as learners_lib
from fedjax_dp.algorithms.fedkt import mesh as mesh_lib
from fedjax_dp.algorithms.fedkt import partition, votes
from fedjax_dp.core.lift import AGENTS


def wrap(data: jax.Array, impl) -> jax.Array:
    """Typed keys of the key data ``data`` (``impl``: the run key's implementation)."""
    return jax.random.wrap_key_data(data, impl=impl)


def predict(learner, models, x, x_axis) -> jax.Array:
    """``int32 [S, A, M]``: seed-stacked JAX ``models`` or one seed's fitted trees ``[models]``."""
    if learners_lib.is_jax(learner):
        return learner.predict_seeds(models, x, x_axis=x_axis)
    return learner.predict(models[0], x)[None]


def reused(learner, fitted_models):
    """Reused fitted models with a seed axis of 1 (a single run)."""
    if learners_lib.is_jax(learner):
        return jax.tree.map(lambda leaf: jnp.asarray(leaf)[None], fitted_models)
    return [fitted_models]


def teacher_votes(preds, num: int, size: int, s: int, t: int, c: int) -> jax.Array:
    """``[S, P s t, Qp]`` teacher predictions -> vote counts ``[S, P, s, Qp, C]``."""
    nq = preds.shape[-1]
    return votes.chunk_votes(preds.reshape(num * size * s * t, nq), (num * size, s, t),
                             c).reshape(num, size, s, nq, c)


@functools.lru_cache(maxsize=16)
def teacher_fn(learner, s: int, t: int, c: int, impl, xq_axis, keep: bool, mesh):
    """One chunk's JAX teachers: ``(extras, parties, xq) -> (votes [S, P, s, Qp, C], models
    [S, P s t, ...] or None)`` from every seed's chunk keys (``.phases._teacher_keys``) and parties
    ``[P, ...]``; with ``mesh`` one ``shard_map`` over the party axis (:mod:`.mesh`)."""
    def work(extras, parties, xq):
        num, size = len(parties), parties[0].num_agents
        ex = [jnp.stack([e[i] for e in extras]) for i in range(len(extras[0]))]
        tdata = partition.teacher_data_seeds(wrap(ex[0], impl), parties, s, t)
        ik, tk = (wrap(e, impl).reshape(num, -1) for e in ex[1:])             # [S, P s t]
        models = learner.fit_keyed_seeds(ik, tk, tdata)                          # [S, P s t..]
        preds = learner.predict_seeds(models, xq, x_axis=xq_axis)                # [S, P s t, Qp]
        return teacher_votes(preds, num, size, s, t, c), (models if keep else None)

    split = P(None, AGENTS)
    return mesh_lib.over_mesh(work, mesh, (P(AGENTS), P(AGENTS), P()), (split, split))


def host_teachers(ctx, chunks, xq, xq_axis, impl):
    """One chunk of reused or tree teachers (one seed, all n parties): ``(votes, models)``."""
    cfg, learner = ctx.config, ctx.learners["teachers"]
    s, t, reuse = cfg.num_partitions, cfg.num_teachers, ctx.reuse.get("teachers")
    if reuse is not None:
        models = reused(learner, reuse)
    else:                                    # trees: all n at once, one seed
        keys = wrap(jnp.stack([ch.extra[0] for ch in chunks]), impl)
        tdata = partition.teacher_data_seeds(keys, tuple(ch.agents for ch in chunks), s, t)
        models = [learner.fit(ctx.keys["teachers"], jax.tree.map(lambda leaf: leaf[0], tdata))]
    preds = predict(learner, models, xq, xq_axis)                              # [S, P s t, Qp]
    return teacher_votes(preds, len(chunks), len(chunks[0].valid), s, t,
                          ctx.data.num_classes), models


def party_labels(block, level: str, gamma: float, impl) -> jax.Array:
    """``int32 [S, P s, Qp]``: the labels a chunk's students learn from its stored teacher votes
    ``block[0] [S, P, s, Qp, C]`` (L2: LNMax with the (party, partition) keys ``block[1]``)."""
    num, size, s, nq, c = block[0].shape
    tv = block[0].reshape(num * size * s, nq, c)                               # [S P s, Qp, C]
    if level == "L2":
        labels = votes.noisy_labels(wrap(block[1], impl).reshape(-1), tv, gamma)
    else:
        labels = votes.argmax_labels(tv)                                       # [S P s, Qp]
    return labels.reshape(num, size * s, nq)


@functools.lru_cache(maxsize=16)
def student_fn(learner, level: str, gamma: float, impl, xq_axis, xs_axis, keep: bool, mesh):
    """One chunk's JAX students: ``(block, xq, xs) -> (labels [S, P s, Qp], preds
    [S, P s, Qs], models or None)`` from the chunk's stored votes and keys ``block`` (axis 1
    the parties); with ``mesh`` one ``shard_map`` over the party axis (:mod:`.mesh`)."""
    def work(block, xq, xs):
        num = block[0].shape[0]
        labels = party_labels(block, level, gamma, impl)
        ones = jnp.ones(labels.shape, bool)
        ik, tk = (wrap(b, impl).reshape(num, -1) for b in block[2:])           # [S, P s]
        models = learner.fit_shared_keyed_seeds(ik, tk, xq, labels, ones,
                                                x_axis=xq_axis)                # [S, P s, ...]
        preds = learner.predict_seeds(models, xs, x_axis=xs_axis)               # [S, P s, Qs]
        return labels, preds, (models if keep else None)

    split = P(None, AGENTS)
    return mesh_lib.over_mesh(work, mesh, (split, P(), P()), (split, split, split))


def host_students(ctx, block, xq, xs, xs_axis, impl):
    """One chunk of reused or tree students (one seed, all n parties): ``(labels, preds,
    models)``."""
    learner, reuse = ctx.learners["students"], ctx.reuse.get("students")
    labels = party_labels(block, ctx.config.level, ctx.config.gamma, impl)
    if reuse is not None:
        models = reused(learner, reuse)
    else:                                    # trees: all n at once, one seed
        ones = jnp.ones(labels.shape, bool)
        models = [learner.fit_shared(ctx.keys["students"], xq, labels[0], ones[0])]
    return labels, predict(learner, models, xs, xs_axis), models
