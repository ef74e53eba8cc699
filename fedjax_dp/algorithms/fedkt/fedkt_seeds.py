"""FedKT seeds in one compiled call per chunk: :func:`seeds_stepper` (the
:mod:`fedjax_dp.algorithms.api` hook that :func:`api.run_seeds` uses).

S runs of FedKT that differ only in their root key (and in the parties their seed's partition
drew) step together, phase by phase: the host loops over the chunks of parties ONCE, and each
chunk's compiled work runs for all S seeds in one call over a leading seed axis
(:meth:`~learners.JaxLearner.fit_keyed_seeds`, ``fit_shared_keyed_seeds``, ``predict_seeds``):
vmapped on accelerators, where the seeds then share every kernel; on the CPU a loop over the
seeds inside the call (``lax.map``) whose body is a single run's compiled function, because a
vmap over the seeds changes the rounding of chunked training (measured on mnist5k: 258 of
600,000 teacher vote counts differed from separate runs, so data-dependent epsilons would too)
and brings no speed there (:data:`learners.SEED_AXIS` overrides the choice):

* ``teachers``: each seed's teacher subsets (an integer gather, one compiled call for the S
  seeds; a seed's split is drawn at its own ``n_max``, then padded with masked rows to the
  largest ``m``, which local training never reads: it samples rows below the subset's count),
  the S x P s t teachers in one call, their predictions on the seeds' party queries and the
  vote counts (one call for the S seeds);
* ``students``: the party labels of S x P s partitions (noisy at L2: the S seeds' groups are
  one batch of :func:`fedkt.noisy_labels`, one key per group, as in a single run), the S x P s
  students in one call and their predictions on the server's queries;
* ``final``: the consistent vote of every seed over the chunks of stored predictions (exact
  integers), the server labels (noisy at L1) and the S final models in one call.

Seed s uses exactly the keys of its separate :func:`fedkt.step` (the named streams of its
``init``), so its state (votes, labels, predictions, kept models) and its metrics equal the
separate run's: bit for bit on the CPU, the models to float tolerance with a vmap (tested; the
timings ``*_s`` are the batch's). A public set, or the public queries of a tier, that all seeds
share is passed once (``in_axes=None``); otherwise the seeds' sets are stacked (L1: the server's
queries, L2 with ``query_fraction < 1``: the parties' queries differ by seed).

:func:`unsupported` says why some seeds cannot be batched, and :func:`seeds_stepper` then returns
None (the caller runs them one by one): a tree learner (fitted in a host loop, not JAX), the
``loop`` backend (the reference path), reused fitted teachers / students, or seeds whose
configs, learners, party counts, feature shapes, classes, public sets or query counts differ.
Host-resident (memory-mapped) parties are streamed per seed in lockstep, like a single run's.
Speed: on a 2-core CPU the batch takes about as long as the separate runs (the model axis
already fills the cores); on an accelerator the vmapped seeds share each kernel launch.
"""
from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.core import agent_stream
from fedjax_dp.algorithms import api
from fedjax_dp.algorithms.fedkt import fedkt
from fedjax_dp.algorithms.fedkt import learners as learners_lib
from fedjax_dp.core import StackedData, is_on_host

__all__ = ["seeds_stepper", "unsupported"]


def unsupported(states: list[api.State]) -> str | None:
    """Why ``states`` (fresh or equally advanced FedKT states, one per seed) cannot step
    together, or None when :func:`seeds_stepper` applies."""
    if not states:
        return "no seeds"
    ctxs = [st.context for st in states]
    c0 = ctxs[0]
    if any(not isinstance(cx, fedkt.Context) for cx in ctxs):
        return "not FedKT states"
    if len({st.step for st in states}) != 1:
        return "the seeds are at different phases"
    if any(cx.config != c0.config for cx in ctxs[1:]):
        return "the seeds' configs differ"
    for name, learner in c0.learners.items():
        if not learners_lib.is_jax(learner):
            return f"the {name} learner {learner.name!r} is not a JAX model (host loop)"
        if learner.backend != "vmap":
            return f"the {name} learner uses backend {learner.backend!r}"
    if any(cx.learners != c0.learners for cx in ctxs[1:]):
        return "the seeds' learners differ"
    if any(cx.reuse for cx in ctxs):
        return "reused fitted teachers / students"
    for what, get in (("number of parties", lambda cx: cx.data.num_agents),
                      ("feature shape", lambda cx: cx.data.feature_shape),
                      ("number of classes", lambda cx: cx.data.num_classes),
                      ("public set shape", lambda cx: tuple(cx.x_public.shape)),
                      ("number of party queries", lambda cx: len(cx.party_queries)),
                      ("number of server queries", lambda cx: len(cx.server_queries)),
                      ("placement of the parties (host / device)",
                       lambda cx: is_on_host(cx.data.agents)),
                      ("presence of diagnostic public labels",
                       lambda cx: cx.data.y_public is None)):
        if any(get(cx) != get(c0) for cx in ctxs[1:]):
            return f"the seeds differ in the {what}"
    return None


def seeds_stepper(states: list[api.State]):
    """``batch(states, keys) -> (states, metrics)``: the next phase of every seed (see the
    module), or None when the seeds cannot share compiled calls (:func:`unsupported`)."""
    if unsupported(states) is not None:
        return None
    return _batch


def _batch(states: list[api.State], keys=None) -> tuple[list[api.State], list[dict]]:
    """Phase ``states[0].step`` of every seed (``keys`` unused, as in :func:`fedkt.step`)."""
    reason = unsupported(states)
    if reason is not None:
        raise ValueError(f"these FedKT seeds cannot step together: {reason}")
    t = states[0].step
    if not 0 <= t < len(fedkt.PHASES):
        raise ValueError(f"state.step must be in [0, {len(fedkt.PHASES)}) (phases "
                         f"{list(fedkt.PHASES)}), got {t}")
    phase = fedkt.PHASES[t]
    tic = time.perf_counter()
    values, metrics = {"teachers": _teachers, "students": _students, "final": _final}[phase](
        states)
    if phase == "teachers":
        metrics = {"teachers_s": time.perf_counter() - tic, **metrics}
    metrics = [{"phase": phase, **m} for m in
               (metrics if isinstance(metrics, list) else [metrics] * len(states))]
    return ([api.State(step=t + 1, values=v, context=st.context)
             for st, v in zip(states, values)], metrics)


# --------------------------------------------------------------------------- helpers

def _share_or_stack(arrays: list) -> tuple[jax.Array, int | None]:
    """``(x, axis)``: the seeds' common array (axis None) or the arrays stacked (axis 0)."""
    first = arrays[0]
    if all(a is first or (a.shape == first.shape and bool(jnp.array_equal(a, first)))
           for a in arrays[1:]):
        return first, None
    return jnp.stack(arrays), 0


def _key_data(keys: jax.Array) -> np.ndarray:
    return np.asarray(jax.random.key_data(keys))


def _seed_chunks(arrays, size: int, fill=0):
    """``(start, num_real, device arrays [S, size, ...])`` per chunk of axis 1 of the host
    ``arrays [S, n, ...]`` (the last chunk padded with ``fill``, as a single run's)."""
    n = arrays[0].shape[1]
    for start in range(0, n, size):
        stop = min(n, start + size)
        block = []
        for a in arrays:
            part = np.asarray(a[:, start:stop])
            if stop - start < size:
                pad = np.full((a.shape[0], size - (stop - start)) + a.shape[2:], fill, a.dtype)
                part = np.concatenate([part, pad], axis=1)
            block.append(part)
        yield start, stop - start, jax.device_put(block)


def _slice(tree, s: int):
    return jax.tree.map(lambda l: l[s], tree)


@functools.partial(jax.jit, static_argnums=(2, 3))
def _teacher_data_seeds(keys: jax.Array, parties: tuple, num_partitions: int,
                        num_teachers: int) -> StackedData:
    """Seed s's :func:`fedkt.teacher_data` of its chunk ``parties[s]`` with ``keys[s] [P, s]``
    (at its own ``n_max``), padded to the seeds' largest ``m`` with masked rows and stacked:
    ``[S, P s t, m, ...]``."""
    m = max(-(-p.max_size // num_teachers) for p in parties)
    out = []
    for i, p in enumerate(parties):
        d = fedkt._teacher_data_keyed_impl(keys[i], p, num_partitions, num_teachers)
        pad = m - d.x.shape[1]
        if pad:
            widen = lambda a: jnp.pad(a, [(0, 0), (0, pad)] + [(0, 0)] * (a.ndim - 2))  # noqa
            d = StackedData(x=widen(d.x), y=widen(d.y), mask=widen(d.mask), counts=d.counts)
        out.append(d)
    return jax.tree.map(lambda *ls: jnp.stack(ls), *out)


# --------------------------------------------------------------------------- phases

def _teachers(states):
    """:func:`fedkt._teachers_phase` of every seed: one pass over the chunks of parties."""
    ctxs = [st.context for st in states]
    ctx = ctxs[0]
    cfg = ctx.config
    num = len(states)
    n, s, t, c = ctx.data.num_agents, cfg.num_partitions, cfg.num_teachers, ctx.data.num_classes
    learner = ctx.learners["teachers"]
    size = fedkt.party_chunk_size(cfg, n)
    keep = not fedkt.streamed(states[0])
    xq, xq_axis = _share_or_stack([cx.x_public[cx.party_queries] for cx in ctxs])
    nq = len(ctx.party_queries)
    impl = jax.random.key_impl(ctx.keys["split"])
    split_kd = np.stack([_key_data(fedkt.split_keys(cx.keys["split"], n, s))
                         for cx in ctxs])                                   # [S, n, s, 2]
    model_kd = [np.stack([_key_data(kk).reshape(n, s * t, -1)
                          for kk in learners_lib.model_keys(cx.keys["teachers"], n * s * t)])
                for cx in ctxs]                                             # 2 x [n, s t, 2]
    model_kd = [np.stack(pair) for pair in zip(*model_kd)]                  # 2 x [S, n, s t, 2]
    votes = np.empty((num, n, s, nq, c), fedkt.int_dtype(t))                # [S, n, s, Qp, C]
    kept = []

    def collect(pending):
        start, real, v = pending
        votes[:, start:start + real] = np.asarray(v)[:, :real]
        task.update(1)

    def keys_of(kd, start, real):          # host key data [S, n, ...] -> device keys [S, size..]
        part = kd[:, start:start + real]
        if real < size:
            part = np.concatenate([part, np.zeros((num, size - real) + part.shape[2:],
                                                  part.dtype)], axis=1)
        return jax.random.wrap_key_data(jax.device_put(part), impl=impl)

    pending = None
    streams = [agent_stream.chunks(cx.data.agents, size) for cx in ctxs]
    with ctx.runtime.progress.task("teachers", total=agent_stream.num_chunks(n, size),
                                   unit="chunk") as task:
        for chunks in zip(*streams):
            start, real = chunks[0].start, chunks[0].num_real
            tdata = _teacher_data_seeds(keys_of(split_kd, start, real),
                                        tuple(ch.agents for ch in chunks), s, t)
            ik, tk = (keys_of(kd, start, real).reshape(num, -1) for kd in model_kd)
            teachers = learner.fit_keyed_seeds(ik, tk, tdata)               # [S, P s t, ...]
            preds = learner.predict_seeds(teachers, xq, x_axis=xq_axis)     # [S, P s t, Qp]
            v = fedkt._chunk_votes(preds.reshape(num * size * s * t, nq), (num * size, s, t),
                                   c).reshape(num, size, s, nq, c)
            if keep:
                kept.append(teachers)
            if pending is not None:          # fetch the previous chunk while this one computes
                collect(pending)
            pending = (start, real, v)
        if pending is not None:
            collect(pending)
    values = []
    for i, st in enumerate(states):
        vi = {**st.values, "teacher_votes": votes[i],
              "z": fedkt.partitions_at_risk(votes[i], cfg.gap_threshold)}
        if keep:
            vi["teachers"] = _slice(kept[0], i)
        values.append(vi)
    return values, {"party_chunk": size}


def _students(states):
    """:func:`fedkt._students_phase` of every seed: one pass over the chunks of parties."""
    ctxs = [st.context for st in states]
    ctx = ctxs[0]
    cfg = ctx.config
    num = len(states)
    n, s, c = ctx.data.num_agents, cfg.num_partitions, ctx.data.num_classes
    learner = ctx.learners["students"]
    size = fedkt.party_chunk_size(cfg, n)
    keep = not fedkt.streamed(states[0])
    xq, xq_axis = _share_or_stack([cx.x_public[cx.party_queries] for cx in ctxs])
    xs, xs_axis = _share_or_stack([cx.x_public[cx.server_queries] for cx in ctxs])
    nq, ns = len(ctx.party_queries), len(ctx.server_queries)
    impl = jax.random.key_impl(ctx.keys["l2_noise"])
    arrays = [np.stack([st.values["teacher_votes"] for st in states]),     # [S, n, s, Qp, C]
              np.stack([_key_data(fedkt.split_keys(cx.keys["l2_noise"], n, s))
                        for cx in ctxs])]                                   # [S, n, s, 2]
    per_seed = [[_key_data(kk).reshape(n, s, -1)
                 for kk in learners_lib.model_keys(cx.keys["students"], n * s)] for cx in ctxs]
    arrays += [np.stack(pair) for pair in zip(*per_seed)]                   # 2 x [S, n, s, 2]
    dtype = fedkt.int_dtype(c)
    labels_all = np.empty((num, n, s, nq), dtype)                           # [S, n, s, Qp]
    preds_all = np.empty((num, n, s, ns), dtype)                            # [S, n, s, Qs]
    kept = []
    tic = time.perf_counter()

    def collect(pending):
        start, real, labels, preds = pending
        labels_all[:, start:start + real] = np.asarray(labels).reshape(num, size, s, -1)[:, :real]
        preds_all[:, start:start + real] = np.asarray(preds).reshape(num, size, s, -1)[:, :real]
        task.update(1)

    pending = None
    with ctx.runtime.progress.task("students", total=agent_stream.num_chunks(n, size),
                                   unit="chunk") as task:
        for start, real, block in _seed_chunks(arrays, size):
            tv = block[0].reshape(num * size * s, nq, c)                    # [S P s, Qp, C]
            if cfg.level == "L2":
                nk = jax.random.wrap_key_data(block[1], impl=impl).reshape(-1)
                labels = fedkt.noisy_labels(nk, tv, cfg.gamma)
            else:
                labels = fedkt._argmax_labels(tv)                           # [S P s, Qp]
            labels = labels.reshape(num, size * s, nq)
            ik, tk = (jax.random.wrap_key_data(b, impl=impl).reshape(num, -1) for b in block[2:])
            students = learner.fit_shared_keyed_seeds(ik, tk, xq, labels,
                                                      jnp.ones(labels.shape, bool),
                                                      x_axis=xq_axis)       # [S, P s, ...]
            preds = learner.predict_seeds(students, xs, x_axis=xs_axis)     # [S, P s, Qs]
            if keep:
                kept.append(students)
            if pending is not None:
                collect(pending)
            pending = (start, real, labels, preds)
        if pending is not None:
            collect(pending)
    values = []
    for i, st in enumerate(states):
        vi = {**st.values, "party_labels": labels_all[i], "student_preds": preds_all[i]}
        if keep:
            vi["students"] = _slice(kept[0], i)
        values.append(vi)
    return values, {"students_s": time.perf_counter() - tic, "num_party_queries": int(nq)}


@functools.partial(jax.jit, static_argnums=1)
def _consistent_votes(preds: jax.Array, num_classes: int) -> jax.Array:
    """``[S, P, s, Qs] -> [S, Qs, C]``: :func:`fedkt.consistent_vote` of every seed's chunk."""
    return jax.vmap(lambda p: fedkt.consistent_vote(p, num_classes))(preds)


def _final(states):
    """:func:`fedkt._final_phase` of every seed: the server votes over one pass of chunks, the
    server labels (noisy at L1) and the S final models in one call."""
    ctxs = [st.context for st in states]
    ctx = ctxs[0]
    cfg = ctx.config
    n, c = ctx.data.num_agents, ctx.data.num_classes
    xs, xs_axis = _share_or_stack([cx.x_public[cx.server_queries] for cx in ctxs])
    size = fedkt.party_chunk_size(cfg, n)
    preds = np.stack([st.values["student_preds"] for st in states])         # [S, n, s, Qs]
    total = None
    with ctx.runtime.progress.task("server vote", total=agent_stream.num_chunks(n, size),
                                   unit="chunk") as task:
        for _, _, (block,) in _seed_chunks([preds], size, fill=-1):
            v = _consistent_votes(block, c)                                  # [S, Qs, C]
            total = v if total is None else total + v
            task.update(1)
    svotes = jnp.asarray(np.asarray(total))                                 # [S, Qs, C]
    if cfg.level == "L1":
        l1 = jnp.stack([cx.keys["l1_noise"] for cx in ctxs])
        slabels = fedkt.noisy_labels(l1, svotes, cfg.gamma)
        smask = jnp.ones(slabels.shape, bool)
    else:
        slabels = jnp.argmax(svotes, -1).astype(jnp.int32)
        smask = jnp.sum(svotes, -1) > 0
    smask_host = np.asarray(smask)
    if not smask_host.any(axis=-1).all():
        raise ValueError("no public query received a consistent vote from any party, so the "
                         "final model has nothing to learn; use more public data or parties")
    tic = time.perf_counter()
    learner = ctx.learners["final"]
    with ctx.runtime.progress.task("final model", total=1, unit="model") as task:
        ik, tk = (jnp.stack(ks) for ks in
                  zip(*[learners_lib.model_keys(cx.keys["final"], 1) for cx in ctxs]))
        finals = learner.fit_shared_keyed_seeds(ik, tk, xs, slabels[:, None], smask[:, None],
                                                x_axis=xs_axis)             # [S, 1, ...]
        task.update(1)
    final_s = time.perf_counter() - tic
    svotes_host, slabels_host = np.asarray(svotes), np.asarray(slabels)
    values, metrics = [], []
    for i, (st, cx) in enumerate(zip(states, ctxs)):
        vi = {**st.values, "server_votes": svotes_host[i], "server_labels": slabels_host[i],
              "server_mask": smask_host[i], "final": _slice(finals, i)}
        mi = {"final_s": final_s, "num_server_queries": int(len(cx.server_queries)),
              "z": int(np.max(vi["z"]))}
        if cx.data.y_public is not None:                 # diagnostics only
            truth = np.asarray(cx.data.y_public)[cx.server_queries]
            mi["server_label_accuracy"] = float(np.mean(
                (vi["server_labels"] == truth)[vi["server_mask"]]))
        values.append(vi)
        metrics.append(mi)
    return values, metrics
