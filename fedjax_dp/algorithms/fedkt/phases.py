"""FedKT's three phases, written once over a seed axis: a run is the S = 1 case of S seeds.

The phases of Algorithm 1 (the formulas: :mod:`.fedkt`), each a host loop over chunks of P
parties:

* ``teachers`` (lines 3-4): the s*t teacher subsets of every party
  (:func:`.partition.teacher_data_seeds`), the P*s*t teachers trained in ONE compiled call,
  their vote counts on the parties' queries (:func:`.votes.chunk_votes`) and ``z``
  (:func:`.votes.partitions_at_risk`); the teachers are kept only when not :func:`streamed`;
* ``students``: the party labels (L2: ``+ Lap(1/gamma)``, Theorem 3) from the stored votes
  (never the private data), the P*s students trained on them and their classes on the server's
  queries;
* ``final`` (Section 3.3): the consistent vote summed over chunks (exact integers), the server
  labels (L1: ``+ Lap(1/gamma)``, Theorems 1 / 2) and the final model.

Seeds. Each chunk's compiled work runs for all S seeds in one call over a leading seed axis
(:meth:`~.learners.JaxLearner.fit_keyed_seeds`, ``fit_shared_keyed_seeds``, ``predict_seeds``):
vmapped on accelerators; on the CPU a ``lax.map`` over a single run's compiled function, because
a vmap changes the rounding of chunked training and so the vote counts and data-dependent
epsilons (:data:`.learners.SEED_AXIS` overrides). Seed s uses exactly its own run's keys, so
its state and metrics equal its separate run's (bit for bit on the CPU; the timings ``*_s`` are
the batch's). Public sets all seeds share are passed once
(:func:`fedjax_dp.core.seed_axis.share_or_stack`). :func:`unsupported` says why seeds cannot
step together (tree learners, the ``loop`` backend, reused fitted models, or differing configs,
learners, shapes, public sets or query counts).

Scale: P = :func:`.config.party_chunk_size` parties per chunk
(:func:`fedjax_dp.core.agent_stream.chunks`, the last padded with empty parties). Keys do not
depend on the chunking: partition j of party i re-splits with ``split(split, n s)[i s + j]``,
teacher (i, j, k) has index ``(i s + j) t + k`` of :func:`.learners.model_keys`
``(teachers, n s t)``, student (i, j) and its L2 noise index ``i s + j`` of
``model_keys(students, n s)`` / ``split(l2_noise, n s)``. Memory and progress: docs/fedkt.md.

Mesh. With ``runtime.mesh`` (:func:`fedjax_dp.core.agent_mesh`, possibly spanning every device
of every process under ``jax.distributed``) and JAX learners, P is rounded up to a multiple of
the mesh's devices and every chunk of the ``teachers`` and ``students`` phases is a global array
split over them (each process reading only its own parties' rows of host data), its work ONE
``shard_map``: each party's teachers and students train, predict and vote on exactly one device
of one process, with the keys of their global indices, so a mesh run equals the run without one
(votes, labels and predictions exactly; parameters to float tolerance). The votes and
predictions are gathered onto every process's host (``State.values`` as without a mesh); kept
teachers / students (unstreamed runs) are gathered onto each process's default device. The
server's vote is a ``psum`` over the mesh; the final model (one model) trains on every process's
default device. ``agents_per_process`` / ``student_agents_per_process`` (values of the two
phases) count the real parties each process ran. Tree learners and reused models ignore the
mesh (host loop, every process). A chunk's work: :mod:`.chunk_work`; the mesh: :mod:`.mesh`.
"""
from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.algorithms import api
from fedjax_dp.algorithms.fedkt import chunk_work as work_lib
from fedjax_dp.algorithms.fedkt import learners as learners_lib
from fedjax_dp.algorithms.fedkt import mesh as mesh_lib
from fedjax_dp.algorithms.fedkt import partition, votes
from fedjax_dp.algorithms.fedkt.config import Config, party_chunk_size
from fedjax_dp.core import agent_stream, is_on_host, seed_axis, validation
from fedjax_dp.core.lift import num_chunks
from fedjax_dp.models import Model

#: The steps of a run: train the teachers and count their votes; the party labels (noisy at L2),
#: the students and their predictions on the server's queries; the server's consistent vote
#: (noisy at L1) and the final model.
PHASES = ("teachers", "students", "final")
#: The models each phase fits, in phase order.
FITTED = ("teachers", "students", "final")


@dataclasses.dataclass(frozen=True)
class Context:
    """The static part of a FedKT run's state.

    ``fitted`` holds the fitted models of non-JAX learners (not arrays, so not in
    ``State.values``); ``reuse`` the teachers / students given to ``init`` to skip training.
    """

    data: api.FederatedData
    model: Model
    config: Config
    learners: dict                   # {"teachers" / "students" / "final": learner}
    keys: dict                       # {stream: key}
    x_public: jax.Array              # [P, ...]
    party_queries: np.ndarray        # [Qp]
    server_queries: np.ndarray       # [Qs]
    fitted: dict = dataclasses.field(default_factory=dict)
    reuse: dict = dataclasses.field(default_factory=dict)
    runtime: api.Runtime = api.Runtime()


def streamed(state: api.State) -> bool:
    """Whether the run streams its parties (JAX learners: host-resident parties, or more than
    one chunk), so that the teachers' and students' parameters are not kept (:func:`fitted`)."""
    ctx: Context = state.context
    n = ctx.data.num_agents
    return is_on_host(ctx.data.agents) or party_chunk_size(ctx.config, n) < n


def fitted(state: api.State, name: str):
    """The fitted ``teachers`` / ``students`` / ``final`` of a run (after their phase).

    JAX teachers and students are kept only when the run is not :func:`streamed` (else an
    error says so); tree learners always.
    """
    validation.check_choice("name", name, FITTED)
    ctx: Context = state.context
    if state.step <= FITTED.index(name):
        raise ValueError(f"the {name} are fitted in phase {FITTED.index(name)} "
                         f"({PHASES[FITTED.index(name)]!r}); state.step is {state.step}")
    if not learners_lib.is_jax(ctx.learners[name]):
        return ctx.fitted[name]
    if name not in state.values:
        n = ctx.data.num_agents
        where = ("the parties are host-resident" if is_on_host(ctx.data.agents) else
                 f"party_chunk={party_chunk_size(ctx.config, n)} < {n} parties")
        raise ValueError(
            f"the {name}' parameters are not kept: this run streams its parties in chunks "
            f"({where}), and each chunk's {name} are dropped once they have voted / predicted "
            f"(State.values keeps teacher_votes and student_preds); use device-resident parties "
            f"in one chunk (algorithm.party_chunk >= {n}) to keep them")
    return state.values[name]


def unsupported(states: list[api.State]) -> str | None:
    """Why ``states`` (fresh or equally advanced FedKT states, one per seed) cannot step
    together, or None when they can (a single state always can)."""
    if not states:
        return "no seeds"
    ctxs = [st.context for st in states]
    c0 = ctxs[0]
    if any(not isinstance(cx, Context) for cx in ctxs):
        return "not FedKT states"
    if len(states) == 1:
        return None
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
                      ("runtime mesh", lambda cx: cx.runtime.mesh),
                      ("presence of diagnostic public labels",
                       lambda cx: cx.data.y_public is None)):
        if any(get(cx) != get(c0) for cx in ctxs[1:]):
            return f"the seeds differ in the {what}"
    return None


def run_phase(states: list[api.State]) -> tuple[list[api.State], list[dict]]:
    """Phase ``states[0].step`` of every seed (S = ``len(states)`` >= 1, see the module):
    ``(states after it, metrics per seed)``."""
    reason = unsupported(states)
    if reason is not None:
        raise ValueError(f"these FedKT seeds cannot step together: {reason}")
    t = states[0].step
    if not 0 <= t < len(PHASES):
        raise ValueError(f"state.step must be in [0, {len(PHASES)}) (phases {list(PHASES)}), "
                         f"got {t}")
    phase = PHASES[t]
    tic = time.perf_counter()
    out = {"teachers": teachers, "students": students, "final": final}[phase](states)
    seconds = time.perf_counter() - tic
    new, metrics = [], []
    for values, ctx, m in out:
        if phase == "teachers":
            m = {"teachers_s": seconds, **m}
        new.append(api.State(step=t + 1, values=values, context=ctx))
        metrics.append({"phase": phase, **m})
    return new, metrics


# --------------------------------------------------------------------------- helpers

def _key_data(keys: jax.Array) -> np.ndarray:
    return np.asarray(jax.random.key_data(keys))


def _stack_host(arrays: list) -> np.ndarray:
    """The seeds' host arrays ``[S, ...]`` (one seed: a view, no copy)."""
    return np.asarray(arrays[0])[None] if len(arrays) == 1 else np.stack(arrays)


def _with_fitted(ctx: Context, values: dict, name: str, model, keep: bool
                 ) -> tuple[dict, Context]:
    if learners_lib.is_jax(ctx.learners[name]):
        return ({**values, name: model} if keep else values), ctx
    return values, dataclasses.replace(ctx, fitted={**ctx.fitted, name: model})


#: :func:`fedjax_dp.core.seed_axis.unstack_seeds` of device arrays as one compiled call (eager:
#: a slice and a squeeze compiled per leaf shape)
_unstack = jax.jit(seed_axis.unstack_seeds, static_argnums=1)


def _seed_models(learner, models, num: int) -> list:
    """Seed s's fitted models of seed-stacked ``models`` (trees: ``[fitted]``, one seed)."""
    if learners_lib.is_jax(learner):
        return list(_unstack(models, num))
    return list(models)


# --------------------------------------------------------------------------- phases

def _teacher_keys(cx: Context, n: int, s: int, t: int, jax_fit: bool) -> tuple:
    """One seed's per-party host keys its chunks slice: the split keys ``[n, s, 2]`` and (JAX
    fit) the teachers' init / train keys ``[n, s t, 2]``, all of global indices."""
    extra = [_key_data(partition.split_keys(cx.keys["split"], n, s))]
    if jax_fit:
        extra += [_key_data(kk).reshape(n, s * t, -1)
                  for kk in learners_lib.model_keys(cx.keys["teachers"], n * s * t)]
    return tuple(extra)


def teachers(states: list[api.State]) -> list[tuple[dict, Context, dict]]:
    """Train the teachers and keep their votes ``teacher_votes [n, s, Qp, C]`` and ``z [n]``.

    Per chunk of P parties (keys: the module docstring), the P s t teachers trained in one
    call, their votes on the party queries; then the teachers are dropped (kept only
    unstreamed). Tree teachers or reused ones (one seed): one chunk of all n parties.
    With ``runtime.mesh`` (JAX teachers) each chunk is split over the mesh and every party's
    teachers run on one device of one process (:mod:`.mesh`); ``agents_per_process`` (also
    without a mesh) holds the real parties each process trained.
    """
    ctxs = [st.context for st in states]
    ctx, num = ctxs[0], len(states)
    cfg = ctx.config
    n, s, t, c = ctx.data.num_agents, cfg.num_partitions, cfg.num_teachers, ctx.data.num_classes
    jax_fit = learners_lib.is_jax(ctx.learners["teachers"]) and "teachers" not in ctx.reuse
    mesh = ctx.runtime.mesh if jax_fit else None
    size = mesh_lib.chunk_size(party_chunk_size(cfg, n) if jax_fit else n, mesh)
    keep = not (jax_fit and streamed(states[0]))
    xq, xq_axis = seed_axis.share_or_stack([cx.x_public[cx.party_queries] for cx in ctxs])
    impl = jax.random.key_impl(ctx.keys["split"])
    work = (work_lib.teacher_fn(ctx.learners["teachers"], s, t, c, impl, xq_axis, keep, mesh)
            if jax_fit else None)
    xq_in = mesh_lib.replicated(xq, mesh)
    counts = np.empty((num, n, s, len(ctx.party_queries), c), votes.int_dtype(t))
    kept, placed = [], np.zeros(jax.process_count(), np.int64)

    def collect(pending):
        start, real, v = pending
        counts[:, start:start + real] = mesh_lib.to_host(v)[:, :real]
        task.update(1)

    pending = None
    streams = [agent_stream.chunks(cx.data.agents, size, mesh=mesh,
                                   extra=_teacher_keys(cx, n, s, t, jax_fit)) for cx in ctxs]
    with ctx.runtime.progress.task("teachers", total=num_chunks(n, size),
                                   unit="chunk") as task:
        for chunks in zip(*streams):         # one chunk of every seed
            if work is not None:
                v, models = work(tuple(ch.extra for ch in chunks),
                                 tuple(ch.agents for ch in chunks), xq_in)
            else:
                v, models = work_lib.host_teachers(ctx, chunks, xq, xq_axis, impl)
            placed += mesh_lib.parties_per_process(chunks[0], mesh)
            if keep:
                kept.append(mesh_lib.gathered(models, n * s * t, mesh))
            if pending is not None:          # fetch the previous chunk while this one computes
                collect(pending)
            pending = (chunks[0].start, chunks[0].num_real, v)
        if pending is not None:
            collect(pending)
    per_process = mesh_lib.all_processes(placed, mesh)
    return _finish(states, "teachers", kept, keep, num,
                   lambda i: {"teacher_votes": counts[i], "agents_per_process": per_process,
                              "z": votes.partitions_at_risk(counts[i], cfg.gap_threshold)},
                   {"party_chunk": size})


def _finish(states, name: str, kept: list, keep: bool, num: int, values_of, metrics: dict):
    """Every seed's ``(values, context, metrics)`` after phase ``name``: its new values
    (``values_of(seed)``) and its fitted models (kept, or the context's trees)."""
    learner = states[0].context.learners[name]
    per_seed = _seed_models(learner, kept[0], num) if keep else [None] * num
    out = []
    for i, st in enumerate(states):
        values, cx = _with_fitted(st.context, {**st.values, **values_of(i)}, name, per_seed[i],
                                  keep)
        out.append((values, cx, dict(metrics)))
    return out


def _student_arrays(states, n: int, s: int, jax_fit: bool) -> tuple:
    """The host arrays the students phase chunks on axis 1: the seeds' ``teacher_votes
    [S, n, s, Qp, C]``, L2 noise keys ``[S, n, s, 2]`` and (JAX fit) init / train keys."""
    ctxs = [st.context for st in states]
    arrays = [_stack_host([st.values["teacher_votes"] for st in states]),
              _stack_host([_key_data(partition.split_keys(cx.keys["l2_noise"], n, s))
                           for cx in ctxs])]
    if jax_fit:
        per_seed = [[_key_data(kk).reshape(n, s, -1)
                     for kk in learners_lib.model_keys(cx.keys["students"], n * s)]
                    for cx in ctxs]
        arrays += [_stack_host(list(pair)) for pair in zip(*per_seed)]
    return tuple(arrays)


def students(states: list[api.State]) -> list[tuple[dict, Context, dict]]:
    """The party labels (noisy at L2), the students, and their predictions on the server's
    queries ``student_preds [n, s, Qs]`` (what the final phase needs), chunk by chunk.

    Per chunk of P parties: labels from the stored ``teacher_votes`` (:func:`.votes.noisy_labels`),
    the P s students trained on them in one call, their predictions; then the students are
    dropped (kept only unstreamed). The parties' private data is not read. With
    ``runtime.mesh`` (JAX students) each chunk is split over the mesh, every party's labels and
    students on one device (:mod:`.mesh`; ``student_agents_per_process`` as the teachers').
    """
    ctxs = [st.context for st in states]
    ctx, num = ctxs[0], len(states)
    cfg = ctx.config
    n, s = ctx.data.num_agents, cfg.num_partitions
    jax_fit = learners_lib.is_jax(ctx.learners["students"]) and "students" not in ctx.reuse
    mesh = ctx.runtime.mesh if jax_fit else None
    size = mesh_lib.chunk_size(party_chunk_size(cfg, n) if jax_fit else n, mesh)
    keep = not (jax_fit and streamed(states[0]))
    xq, xq_axis = seed_axis.share_or_stack([cx.x_public[cx.party_queries] for cx in ctxs])
    xs, xs_axis = seed_axis.share_or_stack([cx.x_public[cx.server_queries] for cx in ctxs])
    nq, ns = len(ctx.party_queries), len(ctx.server_queries)
    impl = jax.random.key_impl(ctx.keys["l2_noise"])
    work = (work_lib.student_fn(ctx.learners["students"], cfg.level, cfg.gamma, impl, xq_axis,
                                xs_axis, keep, mesh) if jax_fit else None)
    shared = (mesh_lib.replicated(xq, mesh), mesh_lib.replicated(xs, mesh))
    dtype = votes.int_dtype(ctx.data.num_classes)
    labels_all = np.empty((num, n, s, nq), dtype)                              # [S, n, s, Qp]
    preds_all = np.empty((num, n, s, ns), dtype)                               # [S, n, s, Qs]
    kept, placed = [], np.zeros(jax.process_count(), np.int64)
    tic = time.perf_counter()

    def collect(pending):
        start, real, out = pending
        for got, into in zip(out, (labels_all, preds_all)):
            into[:, start:start + real] = \
                mesh_lib.to_host(got).reshape(num, size, s, -1)[:, :real]
        task.update(1)

    pending = None
    with ctx.runtime.progress.task("students", total=num_chunks(n, size),
                                   unit="chunk") as task:
        for chunk in agent_stream.chunks(_student_arrays(states, n, s, jax_fit), size, axis=1,
                                         mesh=mesh):
            labels, preds, models = (
                work(chunk.agents, *shared) if work is not None else
                work_lib.host_students(ctx, chunk.agents, xq, xs, xs_axis, impl))
            placed += mesh_lib.parties_per_process(chunk, mesh, axis=1)
            if keep:
                kept.append(mesh_lib.gathered(models, n * s, mesh))
            if pending is not None:
                collect(pending)
            pending = (chunk.start, chunk.num_real, (labels, preds))
        if pending is not None:
            collect(pending)
    per_process = mesh_lib.all_processes(placed, mesh)
    metrics = {"students_s": time.perf_counter() - tic, "num_party_queries": int(nq)}
    return _finish(states, "students", kept, keep, num,
                   lambda i: {"party_labels": labels_all[i], "student_preds": preds_all[i],
                              "student_agents_per_process": per_process}, metrics)


def server_votes(student_preds: np.ndarray, num_classes: int, size: int, *,
                 on_chunk=None, mesh=None) -> np.ndarray:
    """The consistent-voting histograms ``[S, Qs, C]`` (int32) of S seeds' ``student_preds
    [S, n, s, Qs]``, summed over chunks of ``size`` parties (padding predicts -1: no vote);
    exact integers, so the same for every ``size``. ``on_chunk()`` (optional) after each chunk
    (progress). ``mesh``: every chunk split over it, each device voting its parties and a
    ``psum`` adding them (:func:`.mesh.server_vote_fn`; ``size`` a multiple of its devices)."""
    vote = mesh_lib.server_vote_fn(num_classes, mesh)
    total = None
    for chunk in agent_stream.chunks(np.asarray(student_preds), size, axis=1, fill=-1,
                                     mesh=mesh):
        v = vote(chunk.agents)                                                   # [S, Qs, C]
        total = v if total is None else total + v
        if on_chunk is not None:
            on_chunk()
    return mesh_lib.to_host(total)


def final(states: list[api.State]) -> list[tuple[dict, Context, dict]]:
    """Server: consistent voting on the stored student predictions (noisy at L1), then the final
    model (Section 3.3): the S seeds' votes in one pass over the chunks, their final models in
    one call."""
    ctxs = [st.context for st in states]
    ctx, num = ctxs[0], len(states)
    cfg = ctx.config
    n, c = ctx.data.num_agents, ctx.data.num_classes
    xs, xs_axis = seed_axis.share_or_stack([cx.x_public[cx.server_queries] for cx in ctxs])
    mesh = ctx.runtime.mesh
    size = mesh_lib.chunk_size(party_chunk_size(cfg, n), mesh)
    preds = _stack_host([st.values["student_preds"] for st in states])         # [S, n, s, Qs]
    with ctx.runtime.progress.task("server vote", total=num_chunks(n, size),
                                   unit="chunk") as task:
        svotes = jnp.asarray(server_votes(preds, c, size, on_chunk=task.update,
                                          mesh=mesh))                          # [S, Qs, C]
    if cfg.level == "L1":
        slabels = votes.noisy_labels(jnp.stack([cx.keys["l1_noise"] for cx in ctxs]), svotes,
                                     cfg.gamma)
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
        if learners_lib.is_jax(learner):
            ik, tk = (jnp.stack(ks) for ks in
                      zip(*[learners_lib.model_keys(cx.keys["final"], 1) for cx in ctxs]))
            finals = learner.fit_shared_keyed_seeds(ik, tk, xs, slabels[:, None],
                                                    smask[:, None], x_axis=xs_axis)  # [S, 1..]
        else:                                        # trees: one seed
            finals = [learner.fit_shared(ctx.keys["final"], xs, slabels[0][None],
                                         smask[0][None])]
        task.update(1)
    seconds = time.perf_counter() - tic
    per_seed = _seed_models(learner, finals, num)
    svotes_host, slabels_host = np.asarray(svotes), np.asarray(slabels)
    out = []
    for i, (st, cx) in enumerate(zip(states, ctxs)):
        values = {**st.values, "server_votes": svotes_host[i], "server_labels": slabels_host[i],
                  "server_mask": smask_host[i]}
        values, cx = _with_fitted(cx, values, "final", per_seed[i], True)
        metrics = {"final_s": seconds, "num_server_queries": int(len(cx.server_queries))}
        if cfg.data_dependent or cfg.level == "L0":
            # from the noise-free teacher votes: at L1 / L2 only with the opt-in (the ledger
            # declares it), at L0 (no guarantee) always
            metrics["z"] = int(np.max(values["z"]))
        if cx.data.y_public is not None:
            # covered: the released labels against the PUBLIC set's labels (post-processing)
            truth = np.asarray(cx.data.y_public)[cx.server_queries]
            hit = (values["server_labels"] == truth)[values["server_mask"]]
            metrics["server_label_accuracy"] = float(np.mean(hit))
        out.append((values, cx, metrics))
    return out
