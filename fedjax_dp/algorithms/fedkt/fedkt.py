"""FedKT: one-shot federated learning by two-tier knowledge transfer (Li, He, Song, IJCAI 2021).

Paper Algorithm 1, with n parties, s partitions per party, t teachers per partition, a public
unlabelled set D_aux at the server, u classes, privacy level L0 / L1 / L2 and Laplace parameter
gamma:

Party side, every party i and partition j (in chunks of P parties, :mod:`.phases`):

    D^i = D^i_{j,1} u ... u D^i_{j,t}        a fresh random re-split of the party's data per j
    T^i_{j,k} = train(D^i_{j,k})              a chunk's P*s*t teachers in ONE compiled call
    v_m(x) = #{k : T^i_{j,k}(x) = m}          teacher votes on the queried public points
    y^i_j(x) = argmax_m v_m(x)                (L2: argmax_m v_m(x) + Lap(1/gamma), Thm 3)
    U^i_j = train(D_aux, y^i_j)               a chunk's P*s students in one compiled call

Server side (consistent voting, Section 3.3):

    v_m(x) = s * #{i : U^i_j(x) = m for every j in [s]}    a party counts only if all its s
                                                            students agree
    y(x) = argmax_m v_m(x)                    (L1: argmax_m v_m(x) + Lap(1/gamma), Thm 1/2)
    final model = train(D_aux, y)

Queries. The noisy tier (the server at L1, the parties at L2) labels only a random
``query_fraction`` of the public set; the other tier, and both at L0, the whole set. Queries no
party votes on are dropped from the final training set except at L1, where dropping them would
depend on the noiseless votes.

This module is the protocol (:mod:`fedjax_dp.algorithms.api`; the package's modules: see
docs/fedkt.md): ``init`` checks the inputs and draws both tiers' queries; three steps
(:data:`PHASES`), whose ``State.values`` are:

* ``teachers``: ``teacher_votes [n, s, Qp, C]`` (noiseless counts, int8 for t <= 127) and
  ``z [n]``; plus ``teachers`` (the parameters ``[n s t, ...]``) when not streamed;
* ``students``: ``party_labels [n, s, Qp]`` (what the students learnt; noisy at L2) and
  ``student_preds [n, s, Qs]`` (their classes on the server's queries); plus ``students`` when
  not streamed;
* ``final``: ``server_votes [Qs, C]`` (the consistent vote, summed over chunks of parties: exact
  integers), ``server_labels``, ``server_mask`` and ``final`` (the final model's parameters).

Mesh. With ``runtime.mesh`` (:func:`fedjax_dp.core.agent_mesh`, under ``jax.distributed`` every
device of every process) the JAX teachers and students of each party train on exactly one device
of one process, which reads only its own parties' rows of host-resident (numpy / memory-mapped)
data; the server's vote is a cross-device ``psum``. The values above are the same as without a
mesh (counts, labels and predictions exactly, parameters to float tolerance) and on every process;
``agents_per_process`` / ``student_agents_per_process`` say how many real parties each process
ran (:mod:`.phases`, :mod:`.mesh`).

Tree ensembles, which are not arrays, live in the context. :func:`step` is the S = 1 case of
:func:`.phases.run_phase`; :func:`batched_step` runs S seeds together (JAX learners only), each
equal to its own run. Keys: named streams of the run key (:data:`STREAMS`); step keys unused.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.algorithms import api
from fedjax_dp.algorithms.fedkt import files, partition, phases, privacy
from fedjax_dp.algorithms.fedkt import learners as learners_lib
from fedjax_dp.algorithms.fedkt.config import Config, make_learners
from fedjax_dp.algorithms.fedkt.phases import PHASES, Context, fitted, streamed
from fedjax_dp.core import rng, validation
from fedjax_dp.core.lift import take_row
from fedjax_dp.core.stacked import check_agents
from fedjax_dp.models import Model
from fedjax_dp.privacy import PrivacyLedger

__all__ = ["Config", "DESCRIPTION", "PHASES", "STREAMS", "USES_LOCAL_TRAIN", "artifacts",
           "batch_plan", "batched_step", "declare_uncovered", "fitted", "init", "ledger",
           "num_steps", "output", "planned_ledger", "step", "streamed"]

DESCRIPTION = ("FedKT: one-shot two-tier knowledge transfer, L0/L1/L2 privacy, any classifier "
               "(Li et al. 2021)")
USES_LOCAL_TRAIN = True
STREAMS = ("split", "teachers", "party_queries", "l2_noise", "students", "server_queries",
           "l1_noise", "final")


def init(key: jax.Array, data: api.FederatedData, model: Model, config: Config,
         runtime: api.Runtime = api.Runtime(), *, teacher=None, student=None, final=None,
         fitted_teachers=None, fitted_students=None) -> api.State:
    """Checks (before any training), the named key streams and the queries of both tiers.

    teacher, student, final: learners (default: :func:`.config.make_learners` with ``model``).
    fitted_teachers / fitted_students: reuse the ``teachers`` / ``students`` of an earlier run
    with the same key, parties, public set, learners, s and t (not L2 students: they learn
    noisy labels). Host-resident parties stay on the host. ``config.centralized``: the parties
    are pooled into one (centralized PATE, :func:`.partition.pool`). ``runtime.mesh``: the
    phases split every chunk of parties over it (the module's "Mesh"); the checks here still
    read every party's counts and features on every process.
    """
    api.check_init(config, Config, data)
    if config.centralized:
        data = dataclasses.replace(data, agents=partition.pool(data.agents), client_ids=None)
    parties, num_classes = data.agents, data.num_classes
    validation.check_int("num_classes", num_classes, minimum=2)
    x_public = data.public_array("the public unlabelled set")
    partition.check_party_sizes(parties.counts, config.num_teachers)
    check_agents(parties, what="to train")   # host data: finite features
    if fitted_students is not None and config.level == "L2":
        raise ValueError("fitted_students cannot be reused at level L2 (students learn the "
                         "noisy labels of this run); pass fitted_students=None")
    if teacher is None or student is None or final is None:
        t_, s_, f_ = make_learners(config, model=model, feature_shape=parties.feature_shape,
                                   num_classes=num_classes, chunk_size=runtime.chunk_size,
                                   backend=runtime.backend)
        teacher, student, final = teacher or t_, student or s_, final or f_
    keys = {name: rng.stream(rng.as_key(key), name) for name in STREAMS}
    num_public = x_public.shape[0]
    party_q = (partition.query_subset(keys["party_queries"], num_public, config.query_fraction)
               if config.level == "L2" else np.arange(num_public))
    server_q = (partition.query_subset(keys["server_queries"], num_public, config.query_fraction)
                if config.level == "L1" else np.arange(num_public))
    reuse = {name: f for name, f in (("teachers", fitted_teachers),
                                     ("students", fitted_students)) if f is not None}
    ctx = Context(data=data, model=model, config=config,
                  learners={"teachers": teacher, "students": student, "final": final},
                  keys=keys, x_public=jnp.asarray(x_public), party_queries=party_q,
                  server_queries=server_q, reuse=reuse, runtime=runtime)
    return api.State(step=0, values={}, context=ctx)


num_steps = api.phase_steps(PHASES)


def step(state: api.State, key: jax.Array | None = None) -> tuple[api.State, dict]:
    """Run the next phase: :func:`.phases.run_phase` of this one run (S = 1). ``key`` is unused:
    each random draw has its named stream of the run key, derived in :func:`init`."""
    (new,), (metrics,) = phases.run_phase([state])
    return new, metrics


def batch_plan(states: list[api.State]) -> bool | None:
    """The batched step's plan: True when S seeds can run their phases together, None when they
    cannot share compiled calls (:func:`.phases.unsupported`: tree learners, reused models,
    differing shapes)."""
    return None if phases.unsupported(states) is not None else True


def batched_step(plan, states: list[api.State], keys=None):
    """The next phase of S seeds together (:func:`.phases.run_phase`, written over a seed axis;
    ``keys`` unused, as in :func:`step`): ``(states, metrics)``."""
    return phases.run_phase(list(states))


def output(state: api.State) -> api.Output:
    """The final model: ``model`` / ``params`` for a JAX learner, else ``predict`` (trees)."""
    if state.step < len(PHASES):
        raise ValueError(f"output needs the finished run (the final model is trained in the last "
                         f"phase); state.step is {state.step}")
    ctx: Context = state.context
    learner, final_fit = ctx.learners["final"], fitted(state, "final")
    if learners_lib.is_jax(learner):
        return api.Output(model=learner.model, params=take_row(final_fit, 0))
    return api.Output(model=ctx.model,
                      predict=lambda x: np.asarray(learner.predict(final_fit, x))[0])


def privacy_units(config: Config) -> tuple[str, ...]:
    """The ``privacy_units`` hook (:class:`fedjax_dp.algorithms.api.Algorithm`): ``party`` and
    ``example`` (none at L0, which adds no noise)."""
    return () if config.level == "L0" else ("party", "example")


def ledger(config: Config, state: api.State) -> tuple[PrivacyLedger, PrivacyLedger]:
    """``(data_dependent, data_independent)`` (:func:`.privacy.ledgers_from_votes` on the run's
    votes), reported side by side, not composed. The first is empty unless
    ``config.data_dependent``; with it, the run's ``z`` and ``votes.npz`` are declared as
    releases neither covers (:func:`declare_uncovered`)."""
    if config.level == "L0":
        return PrivacyLedger(), PrivacyLedger()
    v = {} if state is None else state.values
    need = "server_votes" if config.level == "L1" else "teacher_votes"
    if need not in v:
        raise ValueError(f"the FedKT-{config.level} ledger needs the run's {need} (the state "
                         f"after the {'final' if config.level == 'L1' else 'teachers'} phase)")
    dd, di = privacy.ledgers_from_votes(config, server_votes=v.get("server_votes"),
                                        teacher_votes=v.get("teacher_votes"), z=v.get("z"))
    if not config.data_dependent:
        dd = PrivacyLedger()     # the data-independent guarantee covers every release
    return tuple(declare_uncovered(config, out) for out in (dd, di))


def declare_uncovered(config: Config, out: PrivacyLedger) -> PrivacyLedger:
    """With ``config.data_dependent`` (L1 / L2): the metric ``z`` and ``votes.npz``, released
    beside every guarantee and covered by none (the data-dependent epsilons are declared by the
    ledger holding them). Without it neither is released."""
    if config.data_dependent and config.level != "L0":
        out.declare_uncovered("the count z of partitions at risk (metric z in history)",
                              "computed from the noise-free teacher votes: not private")
        out.declare_uncovered(
            "votes.npz in the run folder (the noise-free vote histograms, the input of "
            "fedjax-dp account fedkt)", "the analysis' input, written without noise: keep it "
            "with the data owner, it is not private to release")
    return out


def planned_ledger(config: Config, state: api.State, key: jax.Array
                   ) -> Callable[[Config], PrivacyLedger]:
    """The :mod:`~fedjax_dp.algorithms.api` calibration hook: before training (``state`` =
    :func:`init`'s), the data-independent ledger of a candidate config differing only in the
    calibrated value: :func:`.privacy.planned_ledger` with the run's query counts (Qs at L1,
    s Qp per party at L2), Laplace compositions that need no votes. L0 adds no noise: an
    error."""
    if config.level == "L0":
        raise ValueError("FedKT-L0 adds no noise: nothing to calibrate (set algorithm.level to "
                         "L1 or L2)")
    ctx: Context = state.context
    nqs, nqp = len(ctx.server_queries), len(ctx.party_queries)
    return lambda cfg: privacy.planned_ledger(cfg, num_server_queries=nqs,
                                              num_party_queries=nqp)


def artifacts(state: api.State, out_dir, run_config: dict) -> dict:
    """With ``out_dir`` and ``algorithm.data_dependent``: the run's noise-free vote histograms as
    ``votes.npz`` (``votes``: L1 the server's ``[Q, C]``, L2 the teachers' ``[n, s, Q, C]``;
    ``z``), so that ``fedjax-dp account fedkt --votes DIR/votes.npz ...`` re-derives the run's
    guarantees (the command is returned as ``account_command``). Votes are the analysis' input,
    not private to release (the ledger declares the file); without the opt-in none is written."""
    level = run_config["algorithm"].get("level", Config.level)
    wanted = run_config["algorithm"].get("data_dependent", Config.data_dependent)
    if out_dir is None or level == "L0" or not wanted:
        return {}
    v = state.values
    votes = v.get("server_votes") if level == "L1" else v.get("teacher_votes")
    if votes is None:
        return {}
    z = int(np.max(v["z"])) if "z" in v else None
    path = files.save_votes(Path(out_dir) / "votes.npz", votes, z)
    a = run_config["algorithm"]
    command = (f"fedjax-dp account fedkt --votes {path} --level {level} "
               f"--gamma {a.get('gamma', Config.gamma)} "
               f"--s {a.get('num_partitions', Config.num_partitions)} "
               f"--t {a.get('num_teachers', Config.num_teachers)} "
               f"--delta {run_config['privacy']['delta']}")
    return {"votes_file": str(path), "account_command": command}
