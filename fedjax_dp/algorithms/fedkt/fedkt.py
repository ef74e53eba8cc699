"""FedKT: one-shot federated learning by two-tier knowledge transfer (Li, He, Song, IJCAI 2021).

Paper Algorithm 1, with n parties, s partitions per party, t teachers per partition, a public
unlabelled set D_aux at the server, u classes, privacy level L0 / L1 / L2 and Laplace parameter
gamma:

Party side, every party i and partition j (in chunks of P parties, see "Scale"):

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

Queries. At L0 the whole public set is labelled on both tiers. The noisy tier labels only a
random ``query_fraction`` of the public set (the paper's 0.1%..2%): the server at L1, the parties
at L2. The other tier labels the whole public set (at L1 the parties' labels are not released;
at L2 the server's vote is post-processing of DP students). Queries no party votes on (an
all-zero histogram) are dropped from the final training set except at L1, where dropping them
would depend on the noiseless votes.

Privacy (Laplace noise of scale 1/gamma on every count; unit and neighbouring relation):

* L1, party level (Theorem 1): replacing one party's data changes its s students, so the server
  histogram moves by at most 2s in L1 norm; each server query is (2 s gamma, 0)-DP.
* L1, example level (Theorem 8): replacing one record changes one teacher per partition of one
  party; a student can change only if some query it learnt from had a top-2 teacher vote gap
  <= 2 (one changed vote plus argmax tie-breaking by index; the paper's ``<= 1`` misses the tie,
  kept as ``gap_threshold=1`` under the name ``paper``). With z the largest number of such
  partitions in any party, consistent voting moves the histogram by 0 (z = 0), s (0 < z < s: a
  party's contribution s e_c appears or vanishes) or 2s (z = s): k = 0, s/2 or s. The paper's
  Theorem 8 uses k = z, which is too small when z < s/2 (kept as :func:`paper_example_k`).
* L2, example level (Theorem 3): each local query is (2 gamma, 0)-DP; the s*Q queries of one
  party compose; parties hold disjoint data, so the guarantee is the worst party's (Theorem 4;
  taken order by order on the RDP curve, valid for every delta).
* L2, party level (Theorem 9/10): each local query is (2 t gamma, 0)-DP, worst party.

Data-dependent moments per query: :mod:`fedjax_dp.privacy.lnmax` (recorded as RDP,
``alpha(l) = l * RDP(l + 1)``); data-independent: ``LaplaceDpEvent`` composition through
dp-accounting (RDP and PLD). Both go in :class:`~fedjax_dp.privacy.PrivacyLedger` objects
(:func:`ledger` of a run, :func:`ledgers_from_votes` of given histograms).

Scale: the parties are streamed in chunks (``algorithm.party_chunk`` = P parties; None: about
:data:`~fedjax_dp.core.agent_stream.DEFAULT_CHUNK` teachers' worth, at most n). Parties
may be host-resident (:func:`fedjax_dp.core.from_arrays`, a memory-mapped ``load_stacked``):
``init`` checks them (every party with >= t records, finite features read in slices) and leaves
them on the host. The ``teachers`` phase copies one chunk of P parties to the device at a time
(the next chunk is read meanwhile, :mod:`fedjax_dp.core.agent_stream`; the last chunk is
padded with empty parties, so one compilation serves all chunks), cuts its s*t teacher subsets,
trains its P*s*t teachers in one compiled call, counts their votes on the parties' queries and
drops them. The ``students`` phase forms the party labels of P parties from the stored votes
(never the private data), trains their P*s students in one call, keeps their predictions on the
server's queries and drops them. Memory: O(P s t params + n s (Qp C + Qp + Qs)) bytes, the last
term compact integers (:func:`int_dtype`). Keys do not depend on the chunking: partition j of
party i re-splits with ``split(split, n s)[i s + j]``, teacher (i, j, k) has index
``(i s + j) t + k`` of :func:`learners.model_keys` ``(teachers, n s t)``, student (i, j) and its
L2 noise index ``i s + j`` of ``model_keys(students, n s)`` / ``split(l2_noise, n s)``: exactly
the keys the unchunked run has always drawn, so every chunking and host- or device-resident data
give the same run (tested; same key, same numbers as before streaming). JAX teachers and students
are kept (``fitted``) only when the run is not streamed (device-resident parties in one chunk).
Tree learners (not JAX, fitted in a host loop) are not streamed: their phases take all n parties
as one chunk and keep the fitted trees.

Protocol (:mod:`fedjax_dp.algorithms.api`): ``init`` checks the inputs and draws both tiers'
queries; three steps (:data:`PHASES`), whose ``State.values`` are:

* ``teachers``: ``teacher_votes [n, s, Qp, C]`` (noiseless counts, int8 for t <= 127) and
  ``z [n]``; plus ``teachers`` (the parameters ``[n s t, ...]``) when not streamed;
* ``students``: ``party_labels [n, s, Qp]`` (what the students learnt; noisy at L2) and
  ``student_preds [n, s, Qs]`` (their classes on the server's queries); plus ``students`` when
  not streamed;
* ``final``: ``server_votes [Qs, C]`` (the consistent vote, summed over chunks of parties: exact
  integers), ``server_labels``, ``server_mask`` and ``final`` (the final model's parameters).

Tree ensembles, which are not arrays, live in the context. ``seeds_stepper`` runs the phases of S
seeds together (one pass over the chunks, each chunk's compiled work vmapped over the seeds; JAX
learners only: :mod:`fedjax_dp.algorithms.fedkt.fedkt_seeds`), so ``fedjax-dp sweep`` runs the seeds of a
cell as one batch with the same results as separate runs. Keys: named streams of the run key
(``split``, ``teachers``, ``party_queries``, ``l2_noise``, ``students``, ``server_queries``,
``l1_noise``, ``final``), as the plain-Python :func:`run` has always used, so the same key gives
the same run; step keys are not used. Progress: ``runtime.progress`` tasks ``teachers`` and
``students`` (one update per chunk of parties), ``server vote`` (one per chunk of the stored
predictions) and ``final model`` (one compiled training, or a tree fit: one unit).
"""
from __future__ import annotations

import dataclasses
import functools
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.core import agent_stream
from fedjax_dp.algorithms import api
from fedjax_dp.algorithms.fedkt import learners as learners_lib
from fedjax_dp.core import StackedData, is_on_host, rng, validation
from fedjax_dp.models import Model
from fedjax_dp.privacy import PrivacyLedger, accounting, lnmax

LEVELS = ("L0", "L1", "L2")
PARTY_RELATION = "replace one party's entire local dataset"
EXAMPLE_RELATION = "replace one training example of one party"


def _check_local(name: str, value: Any) -> Any:
    from fedjax_dp.train import LocalTrainConfig
    return validation.Instance(LocalTrainConfig, optional=True)(name, value)


@dataclasses.dataclass(frozen=True)
class Config:
    """FedKT: ``num_partitions`` (s) x ``num_teachers`` (t) per party, privacy ``level``.

    teacher / student: ``"model"`` (the experiment's [model] table), a JAX model
      (``logistic``, ``mlp``, ``cnn``) or a tree learner (``decision_tree``, ``random_forest``,
      ``gradient_boosting``, ``xgboost``). The final model has the student's type.
    student_steps / final_steps: local steps for students / the final model (0: ``local.steps``).
    gamma: Laplace parameter (noise ``Lap(1/gamma)`` on each count) at L1 / L2.
    query_fraction: fraction of the public set the noisy tier labels (L1 server, L2 parties).
    moment_orders: moments accountant orders l = 1..moment_orders (reference code: 8).
    gap_threshold: a student may change with one record if a query it learnt had a top-2
      teacher gap <= this (2 is correct under index tie-breaking; 1 is the paper's).
    party_chunk: parties per streamed chunk P (JAX learners): each chunk's s*t teachers and s
      students are trained, vote / predict and are dropped (see the module's "Scale"); None:
      :func:`party_chunk_size` (``DEFAULT_CHUNK // (s t)`` parties, at most n). Results do not
      depend on it.
    """

    num_partitions: int = 2
    num_teachers: int = 5
    level: str = "L0"
    gamma: float = 0.05
    query_fraction: float = 1.0
    teacher: str = "model"
    student: str = "model"
    student_steps: int = 0
    final_steps: int = 0
    tree_max_depth: int = 6
    tree_estimators: int = 100
    moment_orders: int = 8
    gap_threshold: int = 2
    party_chunk: int | None = None   # parties per streamed chunk (None: ~4096 teachers' worth)
    local: Any = None                # LocalTrainConfig for the teachers (the [train] table)

    FIELDS = {"num_partitions": validation.Int(1), "num_teachers": validation.Int(1),
              "level": validation.Choice(LEVELS), "gamma": validation.Float(0.0, low_open=True),
              "query_fraction": validation.Float(0.0, 1.0, low_open=True),
              "teacher": validation.Choice(("model",) + learners_lib.LEARNERS),
              "student": validation.Choice(("model",) + learners_lib.LEARNERS),
              "student_steps": validation.Int(0), "final_steps": validation.Int(0),
              "tree_max_depth": validation.Int(1, 1024),
              "tree_estimators": validation.Int(1, 100_000),
              "moment_orders": validation.Int(1, 10_000), "gap_threshold": validation.Int(0),
              "party_chunk": validation.Int(1, optional=True),
              "local": validation.Custom(_check_local)}

    def __post_init__(self):
        validation.check_config(self, "algorithm")
        if self.local is None:
            from fedjax_dp.train import LocalTrainConfig
            object.__setattr__(self, "local", LocalTrainConfig())

    @property
    def orders(self) -> tuple[int, ...]:
        return tuple(range(1, self.moment_orders + 1))


# --------------------------------------------------------------------------- learners

def make_learners(config: Config, *, model_name: str = "mlp", feature_shape, num_classes: int,
                  hidden=(200,), chunk_size: int | str | None = "auto", backend: str = "vmap",
                  model=None):
    """``(teacher, student, final)`` learners for ``config``.

    ``"model"`` means ``model`` (a built :class:`~fedjax_dp.models.Model`) when given, else the
    JAX model ``model_name`` with ``hidden``. Teachers train ``local.steps`` steps, students
    ``student_steps`` and the final model ``final_steps`` (0: ``local.steps``).
    """
    def build(which: str, steps: int):
        train = dataclasses.replace(config.local, steps=steps or config.local.steps)
        if which == "model" and model is not None:
            return learners_lib.JaxLearner(model, train, chunk_size=chunk_size, backend=backend)
        name = model_name if which == "model" else which
        return learners_lib.make_learner(
            name, feature_shape=feature_shape, num_classes=num_classes, train=train,
            hidden=hidden, chunk_size=chunk_size, backend=backend,
            max_depth=config.tree_max_depth, n_estimators=config.tree_estimators)

    return (build(config.teacher, config.local.steps), build(config.student, config.student_steps),
            build(config.student, config.final_steps))


# --------------------------------------------------------------------------- pure pieces

def check_party_sizes(counts, num_teachers: int) -> None:
    """Every party needs at least ``t`` records (one per teacher subset); else a clear error."""
    counts = np.asarray(counts)
    small = np.flatnonzero(counts < num_teachers)
    if small.size:
        i = int(small[0])
        raise ValueError(
            f"party {i} holds {int(counts[i])} records, fewer than num_teachers={num_teachers}: "
            f"each of its t subsets needs at least one record (parties too small: "
            f"{small[:10].tolist()}); lower algorithm.num_teachers or use fewer parties")


def teacher_split(key: jax.Array, count: jax.Array, n_max: int, num_teachers: int):
    """One partition of one party: ``(rows [t, m], sizes [t])`` (Algorithm 1 line 3).

    The party's ``count`` real rows (rows ``0..count-1`` of its padded array) are shuffled and
    cut into ``t`` disjoint contiguous pieces of sizes ``floor((k+1) c / t) - floor(k c / t)``;
    ``rows[k, r]`` is the r-th row of subset k (0 where ``r >= sizes[k]``),
    ``m = ceil(n_max / t)``.
    """
    m = -(-n_max // num_teachers)
    u = jax.random.uniform(key, (n_max,))
    u = jnp.where(jnp.arange(n_max) < count, u, 2.0)           # padding sorts last
    perm = jnp.argsort(u)                                       # [n_max] real rows first
    bounds = (jnp.arange(num_teachers + 1) * count) // num_teachers          # [t + 1]
    pos = bounds[:-1, None] + jnp.arange(m)[None, :]            # [t, m]
    valid = pos < bounds[1:, None]
    rows = jnp.where(valid, perm[jnp.minimum(pos, n_max - 1)], 0)
    return rows.astype(jnp.int32), (bounds[1:] - bounds[:-1]).astype(jnp.int32)


def teacher_data(key: jax.Array, parties: StackedData, num_partitions: int,
                 num_teachers: int) -> StackedData:
    """All teachers' local data, ``[n * s * t, m, ...]`` ordered (party, partition, teacher).

    Partition j of party i uses key ``split(key, n * s)[i * s + j]``: independent re-splits.
    """
    check_party_sizes(parties.counts, num_teachers)
    return _teacher_data(key, parties, num_partitions, num_teachers)


def split_keys(key: jax.Array, num_parties: int, num_partitions: int) -> jax.Array:
    """``[n, s]``: the key of partition j of party i is ``split(key, n * s)[i * s + j]``."""
    return jax.random.split(key, num_parties * num_partitions).reshape(num_parties,
                                                                       num_partitions)


def _teacher_data_impl(key, parties: StackedData, num_partitions: int, num_teachers: int):
    keys = split_keys(key, parties.num_agents, num_partitions)
    return _teacher_data_keyed_impl(keys, parties, num_partitions, num_teachers)


def _teacher_data_keyed_impl(keys, parties: StackedData, num_partitions: int,
                             num_teachers: int):
    """:func:`teacher_data` with the per-(party, partition) keys given (``keys [n, s]``): a chunk
    of parties with its slice of the keys gets the same subsets as the whole population. A
    party without records (padding) gives t empty subsets."""
    n, n_max = parties.num_agents, parties.max_size
    split = jax.vmap(jax.vmap(teacher_split, (0, None, None, None)), (0, 0, None, None))
    rows, sizes = split(keys, parties.counts, n_max, num_teachers)       # [n, s, t, m], [n, s, t]
    m = rows.shape[-1]
    x = jax.vmap(lambda xi, ri: xi[ri])(parties.x, rows)                 # [n, s, t, m, ...]
    y = jax.vmap(lambda yi, ri: yi[ri])(parties.y, rows)                 # [n, s, t, m]
    mask = jnp.arange(m) < sizes[..., None]                              # [n, s, t, m]
    a = n * num_partitions * num_teachers
    return StackedData(x=x.reshape((a, m) + x.shape[4:]), y=y.reshape(a, m),
                       mask=mask.reshape(a, m), counts=sizes.reshape(a))


_teacher_data = jax.jit(_teacher_data_impl, static_argnums=(2, 3))
_teacher_data_keyed = jax.jit(_teacher_data_keyed_impl, static_argnums=(2, 3))


@functools.partial(jax.jit, static_argnums=1)
def vote_counts(preds: jax.Array, num_classes: int) -> jax.Array:
    """``preds [..., t, Q] -> counts [..., Q, C]``: v_m(x) = #{voters predicting m}."""
    return jnp.sum(jax.nn.one_hot(preds, num_classes, dtype=jnp.int32), axis=-3)


@functools.partial(jax.jit, static_argnums=1)
def consistent_vote(student_preds: jax.Array, num_classes: int) -> jax.Array:
    """Server histogram with consistent voting (Section 3.3): ``[n, s, Q] -> [Q, C]`` (int32).

    Party i adds s to class c for query x only if all its s students predict c, else nothing:
    ``v_c(x) = s * #{i : U^i_j(x) = c for all j}``.
    """
    s = student_preds.shape[1]
    first = student_preds[:, 0]                                            # [n, Q]
    agree = jnp.all(student_preds == first[:, None], axis=1)               # [n, Q]
    ballots = jax.nn.one_hot(first, num_classes, dtype=jnp.int32) * agree[..., None]  # [n, Q, C]
    return s * jnp.sum(ballots, axis=0)


@jax.jit
def noisy_labels(keys: jax.Array, counts: jax.Array, gamma: float) -> jax.Array:
    """LNMax for a batch of voting groups: ``argmax_c counts[g, q, c] + Lap(1/gamma)``.

    ``keys [G]`` one key per group (party/partition, or the server), ``counts [G, Q, C]``;
    within a group every query and class draws its own Laplace variable. Returns ``[G, Q]``.
    Per query: L1 sensitivity 2 (one teacher) or 2s (one party at the server) -> (2 gamma, 0)- or
    (2 s gamma, 0)-DP (replace relation).
    """
    def one(key, c):
        noise = jax.random.laplace(key, c.shape, jnp.float32) / gamma
        return jnp.argmax(c.astype(jnp.float32) + noise, axis=-1).astype(jnp.int32)
    return jax.vmap(one)(keys, counts)


def top2_gaps(counts) -> np.ndarray:
    """Gap between the two largest counts, ``[..., C] -> [...]`` (host, exact integers)."""
    c = np.sort(np.asarray(counts), axis=-1)
    return c[..., -1] - c[..., -2]


def partitions_at_risk(teacher_votes, gap_threshold: int = 2) -> np.ndarray:
    """z_i: per party, the number of partitions with a query whose top-2 gap <= threshold.

    ``teacher_votes [n, s, Q, C]`` (noiseless, as the students learnt them) -> ``[n]``.
    """
    risky = np.any(top2_gaps(teacher_votes) <= gap_threshold, axis=-1)   # [n, s]
    return risky.sum(axis=-1)


def example_k(z: int, s: int) -> float:
    """Sensitivity multiplier k (query is (2 k gamma, 0)-DP) at L1, example level, consistent
    voting: 0 if z = 0, s/2 if 0 < z < s (one party's s votes appear or vanish), s if z = s."""
    z = validation.check_int("z", z, minimum=0, maximum=s)
    return 0.0 if z == 0 else (s / 2.0 if z < s else float(s))


def paper_example_k(z: int, s: int) -> float:
    """The paper's Theorem 8 multiplier k = z (too small under consistent voting if z < s/2)."""
    return float(validation.check_int("z", z, minimum=0, maximum=s))


# --------------------------------------------------------------------------- algorithm

@dataclasses.dataclass
class Result:
    """What a FedKT run produced (host/JAX arrays; learners' fitted objects)."""

    final: Any                       # fitted final model (stacked with one model)
    students: Any                    # fitted students [n * s] (None: streamed, not kept)
    teachers: Any                    # fitted teachers [n * s * t] (None: streamed, not kept)
    final_learner: Any
    party_queries: np.ndarray        # [Qp] public indices the parties label
    server_queries: np.ndarray       # [Qs] public indices the server labels
    teacher_votes: np.ndarray        # [n, s, Qp, C] noiseless teacher histograms
    party_labels: np.ndarray         # [n, s, Qp] labels the students learnt (noisy at L2)
    student_preds: np.ndarray        # [n, s, Qs] the students' classes on the server queries
    server_votes: np.ndarray         # [Qs, C] noiseless consistent-voting histogram
    server_labels: np.ndarray        # [Qs] labels the final model learnt (noisy at L1)
    server_mask: np.ndarray          # [Qs] queries kept for the final model
    z: np.ndarray                    # [n] partitions at risk per party (example level, L1)
    config: Config
    num_classes: int
    timings: dict
    state: Any = None                # the protocol state the run ended in

    def predict(self, x) -> np.ndarray:
        """Final model's classes for ``x [M, ...]``."""
        return np.asarray(self.final_learner.predict(self.final, x))[0]

    def accuracy(self, x, y) -> float:
        y = np.asarray(y)
        if y.size == 0:
            raise ValueError("accuracy needs at least one labelled example, got an empty set")
        return float(np.mean(self.predict(x) == y))


def _query_subset(key: jax.Array, num_public: int, fraction: float) -> np.ndarray:
    num = max(1, int(round(fraction * num_public)))
    if num >= num_public:
        return np.arange(num_public)
    return np.sort(np.asarray(jax.random.permutation(key, num_public)[:num]))


# --------------------------------------------------------------------------- the protocol

DESCRIPTION = ("FedKT: one-shot two-tier knowledge transfer, L0/L1/L2 privacy, any classifier "
               "(Li et al. 2021)")
USES_LOCAL_TRAIN = True
#: The steps of a run: train the teachers and count their votes; the party labels (noisy at L2),
#: the students and their predictions on the server's queries; the server's consistent vote
#: (noisy at L1) and the final model.
PHASES = ("teachers", "students", "final")
STREAMS = ("split", "teachers", "party_queries", "l2_noise", "students", "server_queries",
           "l1_noise", "final")
_FITTED = ("teachers", "students", "final")


@dataclasses.dataclass(frozen=True)
class Context:
    """The static part of a FedKT run's state.

    ``fitted`` holds the fitted models of non-JAX learners (tree ensembles are not arrays, so
    they cannot be in ``State.values``; a JAX learner's parameters are in ``values`` when kept,
    see :func:`fitted`); ``reuse`` the teachers / students given to :func:`init` to skip their
    training.
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


def init(key: jax.Array, data: api.FederatedData, model: Model, config: Config,
         runtime: api.Runtime = api.Runtime(), *, teacher=None, student=None, final=None,
         fitted_teachers=None, fitted_students=None) -> api.State:
    """Checks (before any training), the named key streams and the queries of both tiers.

    teacher, student, final: learners (default: :func:`make_learners` with ``model``).
    fitted_teachers / fitted_students: reuse the ``teachers`` / ``students`` of an earlier run
    with the same key, parties, public set, learners, s and t (they do not depend on gamma, the
    level or the query fraction, except L2 students, which learn noisy labels and cannot be
    reused). Sweeps over privacy settings use this. Host-resident parties stay on the host: the
    phases copy them to the device one chunk at a time.
    """
    if not isinstance(config, Config):
        raise ValueError(f"config must be a fedkt.Config, got {type(config).__name__}")
    if not isinstance(data, api.FederatedData):
        raise ValueError(f"data must be an api.FederatedData, got {type(data).__name__}")
    parties, num_classes = data.agents, data.num_classes
    validation.check_int("num_classes", num_classes, minimum=2)
    if data.x_public is None:
        raise ValueError("data.x_public must hold the public unlabelled set, got None")
    x_public = validation.check_finite_array("x_public", data.x_public)
    if x_public.ndim < 2 or x_public.shape[0] == 0:
        raise ValueError(f"x_public must hold at least one public example [P, ...], got shape "
                         f"{x_public.shape}")
    if tuple(x_public.shape[1:]) != parties.feature_shape:
        raise ValueError(f"x_public has feature shape {x_public.shape[1:]}, expected the "
                         f"parties' {parties.feature_shape}")
    check_party_sizes(parties.counts, config.num_teachers)
    agent_stream.check_agents(parties, what="to train")   # host data: finite features
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
    party_q = (_query_subset(keys["party_queries"], num_public, config.query_fraction)
               if config.level == "L2" else np.arange(num_public))
    server_q = (_query_subset(keys["server_queries"], num_public, config.query_fraction)
                if config.level == "L1" else np.arange(num_public))
    reuse = {name: f for name, f in (("teachers", fitted_teachers),
                                     ("students", fitted_students)) if f is not None}
    ctx = Context(data=data, model=model, config=config,
                  learners={"teachers": teacher, "students": student, "final": final},
                  keys=keys, x_public=jnp.asarray(x_public), party_queries=party_q,
                  server_queries=server_q, reuse=reuse, runtime=runtime)
    return api.State(step=0, values={}, context=ctx)


def num_steps(config: Config) -> int:
    return len(PHASES)


def party_chunk_size(config: Config, num_parties: int) -> int:
    """Parties per streamed chunk P: ``config.party_chunk``, or when None
    ``max(1, DEFAULT_CHUNK // (s t))`` (about :data:`agent_stream.DEFAULT_CHUNK` teachers per
    chunk, as AE-DPFL trains that many agents); at most n."""
    if config.party_chunk is not None:
        return min(validation.check_int("algorithm.party_chunk", config.party_chunk,
                                        minimum=1), num_parties)
    per_party = config.num_partitions * config.num_teachers
    return min(num_parties, max(1, agent_stream.DEFAULT_CHUNK // per_party))


def streamed(state: api.State) -> bool:
    """Whether the run streams its parties (JAX learners: host-resident parties, or more than
    one chunk), so that the teachers' and students' parameters are not kept (:func:`fitted`)."""
    ctx: Context = state.context
    n = ctx.data.num_agents
    return is_on_host(ctx.data.agents) or party_chunk_size(ctx.config, n) < n


def fitted(state: api.State, name: str):
    """The fitted ``teachers`` / ``students`` / ``final`` of a run (after their phase).

    JAX teachers and students are kept only when the run is not streamed (device-resident
    parties in one chunk, :func:`streamed`): a streamed run keeps their votes and predictions
    instead (an error says so). Tree learners are always kept (not streamed).
    """
    validation.check_choice("name", name, _FITTED)
    ctx: Context = state.context
    if state.step <= _FITTED.index(name):
        raise ValueError(f"the {name} are fitted in phase {_FITTED.index(name)} "
                         f"({PHASES[_FITTED.index(name)]!r}); state.step is {state.step}")
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


def _with_fitted(ctx: Context, values: dict, name: str, model, keep: bool
                 ) -> tuple[dict, Context]:
    if learners_lib.is_jax(ctx.learners[name]):
        return ({**values, name: model} if keep else values), ctx
    return values, dataclasses.replace(ctx, fitted={**ctx.fitted, name: model})


def int_dtype(max_value: int):
    """The smallest signed integer type holding ``[-1, max_value]`` (compact stored counts and
    class indices; -1 pads)."""
    return np.int8 if max_value <= 127 else np.int16 if max_value <= 32767 else np.int32


def _key_data(keys: jax.Array) -> np.ndarray:
    return np.asarray(jax.random.key_data(keys))


def _wrap(data: jax.Array, impl) -> jax.Array:
    return jax.random.wrap_key_data(data, impl=impl)


def _pad(a: np.ndarray, size: int, fill) -> np.ndarray:
    if len(a) == size:
        return a
    return np.concatenate([a, np.full((size - len(a),) + a.shape[1:], fill, a.dtype)])


def _host_chunks(arrays, size: int, fill=0):
    """``(start, num_real, padded device arrays [size, ...])`` per chunk of the leading axis of
    host ``arrays`` (``fill`` pads the last chunk: one shape, one compilation)."""
    n = len(arrays[0])
    for start in range(0, n, size):
        stop = min(n, start + size)
        yield start, stop - start, jax.device_put(
            [_pad(np.asarray(a[start:stop]), size, fill) for a in arrays])


@functools.partial(jax.jit, static_argnums=(1, 2))
def _chunk_votes(preds: jax.Array, shape: tuple, num_classes: int) -> jax.Array:
    """``preds [P s t, Q]`` -> ``[P, s, Q, C]`` teacher vote counts (int32)."""
    return vote_counts(preds.reshape(shape + (-1,)), num_classes)


def _teachers_phase(state: api.State) -> tuple[dict, Context, dict]:
    """Train the teachers and keep their votes ``teacher_votes [n, s, Qp, C]`` and ``z [n]``.

    Chunk of P parties (host data: copied to the device, the next one read meanwhile): its s*t
    teacher subsets per party (partition j of party i keyed ``split(split, n s)[i s + j]``), its
    P s t teachers trained in one call (teacher (i, j, k) with the keys of index
    ``(i s + j) t + k`` of :func:`learners.model_keys` of the ``teachers`` stream over all
    n s t), their votes on the parties' queries; then the teachers are dropped (kept only
    unstreamed). Tree teachers: one chunk of all n parties (host loop).
    """
    ctx: Context = state.context
    cfg, k, parties = ctx.config, ctx.keys, ctx.data.agents
    n, s, t, c = parties.num_agents, cfg.num_partitions, cfg.num_teachers, ctx.data.num_classes
    learner, reuse = ctx.learners["teachers"], ctx.reuse.get("teachers")
    jax_fit = learners_lib.is_jax(learner) and reuse is None
    size = party_chunk_size(cfg, n) if jax_fit else n
    keep = not (jax_fit and streamed(state))
    xq = ctx.x_public[ctx.party_queries]                                        # [Qp, ...]
    impl = jax.random.key_impl(k["split"])
    extra = [_key_data(split_keys(k["split"], n, s))]                           # [n, s, 2]
    if jax_fit:
        extra += [_key_data(kk).reshape(n, s * t, -1)
                  for kk in learners_lib.model_keys(k["teachers"], n * s * t)]  # [n, s t, 2]
    votes = np.empty((n, s, len(ctx.party_queries), c), int_dtype(t))          # [n, s, Qp, C]
    kept = []

    def collect(pending):
        chunk, v = pending
        votes[chunk.start:chunk.start + chunk.num_real] = np.asarray(v)[:chunk.num_real]
        task.update(1)

    pending = None
    with ctx.runtime.progress.task("teachers", total=agent_stream.num_chunks(n, size),
                                   unit="chunk") as task:
        for chunk in agent_stream.chunks(parties, size, extra=tuple(extra)):
            if reuse is None:
                tdata = _teacher_data_keyed(_wrap(chunk.extra[0], impl), chunk.agents, s, t)
            if reuse is not None:
                teachers = reuse
            elif jax_fit:
                ik, tk = (_wrap(e, impl).reshape(-1) for e in chunk.extra[1:])    # [P s t]
                teachers = learner.fit_keyed(ik, tk, tdata)
            else:
                teachers = learner.fit(k["teachers"], tdata)          # trees: all n at once
            v = _chunk_votes(learner.predict(teachers, xq), (size, s, t), c)       # [P,s,Qp,C]
            if keep:
                kept.append(teachers)
            if pending is not None:          # fetch the previous chunk while this one computes
                collect(pending)
            pending = (chunk, v)
        if pending is not None:
            collect(pending)
    values = {**state.values, "teacher_votes": votes,
              "z": partitions_at_risk(votes, cfg.gap_threshold)}
    values, ctx = _with_fitted(ctx, values, "teachers", kept[0] if kept else None, keep)
    return values, ctx, {"party_chunk": size}


def _students_phase(state: api.State) -> tuple[dict, Context, dict]:
    """The party labels (noisy at L2), the students, and their predictions on the server's
    queries ``student_preds [n, s, Qs]`` (what the final phase needs), chunk by chunk.

    Chunk of P parties: the labels ``y^i_j = argmax_m v_m (+ Lap(1/gamma) at L2, key
    split(l2_noise, n s)[i s + j])`` of its P s partitions from the stored ``teacher_votes``, its
    P s students (keys of index ``i s + j`` of :func:`learners.model_keys` of the ``students``
    stream over all n s) trained on them in one call, their predictions on the server queries;
    then the students are dropped (kept only unstreamed). The parties' private data is not read.
    """
    ctx: Context = state.context
    cfg, k = ctx.config, ctx.keys
    n, s, c = ctx.data.num_agents, cfg.num_partitions, ctx.data.num_classes
    learner, reuse = ctx.learners["students"], ctx.reuse.get("students")
    jax_fit = learners_lib.is_jax(learner) and reuse is None
    size = party_chunk_size(cfg, n) if jax_fit else n
    keep = not (jax_fit and streamed(state))
    xq = ctx.x_public[ctx.party_queries]                                        # [Qp, ...]
    xs = ctx.x_public[ctx.server_queries]                                       # [Qs, ...]
    impl = jax.random.key_impl(k["l2_noise"])
    arrays = [state.values["teacher_votes"],                                    # [n, s, Qp, C]
              _key_data(split_keys(k["l2_noise"], n, s))]                       # [n, s, 2]
    if jax_fit:
        arrays += [_key_data(kk).reshape(n, s, -1)
                   for kk in learners_lib.model_keys(k["students"], n * s)]     # [n, s, 2]
    dtype = int_dtype(c)
    labels_all = np.empty((n, s, len(ctx.party_queries)), dtype)                # [n, s, Qp]
    preds_all = np.empty((n, s, len(ctx.server_queries)), dtype)                # [n, s, Qs]
    kept = []
    tic = time.perf_counter()

    def collect(pending):
        start, num, labels, preds = pending
        labels_all[start:start + num] = np.asarray(labels).reshape(size, s, -1)[:num]
        preds_all[start:start + num] = np.asarray(preds).reshape(size, s, -1)[:num]
        task.update(1)

    pending = None
    with ctx.runtime.progress.task("students", total=agent_stream.num_chunks(n, size),
                                   unit="chunk") as task:
        for start, num, block in _host_chunks(arrays, size):
            tv = block[0].reshape(size * s, -1, c)                              # [P s, Qp, C]
            if cfg.level == "L2":
                labels = noisy_labels(_wrap(block[1], impl).reshape(-1), tv, cfg.gamma)
            else:
                labels = _argmax_labels(tv)                                     # [P s, Qp]
            if reuse is not None:
                students = reuse
            elif jax_fit:
                ik, tk = (_wrap(b, impl).reshape(-1) for b in block[2:])          # [P s]
                students = learner.fit_shared_keyed(ik, tk, xq, labels,
                                                    jnp.ones(labels.shape, bool))
            else:
                students = learner.fit_shared(k["students"], xq, labels,
                                              jnp.ones(labels.shape, bool))    # trees: all n
            preds = learner.predict(students, xs)                               # [P s, Qs]
            if keep:
                kept.append(students)
            if pending is not None:
                collect(pending)
            pending = (start, num, labels, preds)
        if pending is not None:
            collect(pending)
    values = {**state.values, "party_labels": labels_all, "student_preds": preds_all}
    values, ctx = _with_fitted(ctx, values, "students", kept[0] if kept else None, keep)
    return values, ctx, {"students_s": time.perf_counter() - tic,
                         "num_party_queries": int(len(ctx.party_queries))}


@jax.jit
def _argmax_labels(votes: jax.Array) -> jax.Array:
    """Noiseless party labels ``argmax_m v_m``: ``[G, Q, C] -> int32 [G, Q]``."""
    return jnp.argmax(votes, -1).astype(jnp.int32)


def server_votes(student_preds: np.ndarray, num_classes: int, size: int, *,
                 on_chunk=None) -> np.ndarray:
    """The consistent-voting histogram ``[Qs, C]`` (int32) of ``student_preds [n, s, Qs]``,
    summed over chunks of ``size`` parties (padding predicts -1: no vote); exact integers, so
    the same for every ``size``. ``on_chunk()`` (optional) after each chunk (progress)."""
    total = None
    for _, _, (block,) in _host_chunks([student_preds], size, fill=-1):
        v = consistent_vote(block, num_classes)                                 # [Qs, C]
        total = v if total is None else total + v
        if on_chunk is not None:
            on_chunk()
    return np.asarray(total)


def step(state: api.State, key: jax.Array | None = None) -> tuple[api.State, dict]:
    """Run the next phase (``key`` unused: each random draw has its named stream of the run key,
    derived in :func:`init`, so a run equals the plain-Python :func:`run` with that key)."""
    if not 0 <= state.step < len(PHASES):
        raise ValueError(f"state.step must be in [0, {len(PHASES)}) (phases {list(PHASES)}), "
                         f"got {state.step}")
    phase = PHASES[state.step]
    tic = time.perf_counter()
    if phase == "teachers":
        # Party side (Algorithm 1 lines 3-4): teachers and their votes, chunk by chunk.
        values, ctx, metrics = _teachers_phase(state)
        metrics = {"teachers_s": time.perf_counter() - tic, **metrics}
    elif phase == "students":
        # Party labels (noisy at L2), students and their predictions on the server queries.
        values, ctx, metrics = _students_phase(state)
    else:
        values, ctx, metrics = _final_phase(state)
    return api.State(step=state.step + 1, values=values, context=ctx), {"phase": phase,
                                                                       **metrics}


def _final_phase(state: api.State) -> tuple[dict, Context, dict]:
    """Server: consistent voting on the stored student predictions (noisy at L1), then the final
    model (Section 3.3)."""
    ctx: Context = state.context
    cfg, k = ctx.config, ctx.keys
    n, c = ctx.data.num_agents, ctx.data.num_classes
    xs = ctx.x_public[ctx.server_queries]
    size = party_chunk_size(cfg, n)
    with ctx.runtime.progress.task("server vote", total=agent_stream.num_chunks(n, size),
                                   unit="chunk") as task:
        svotes = jnp.asarray(server_votes(state.values["student_preds"], c, size,
                                          on_chunk=task.update))               # [Qs, C]
    if cfg.level == "L1":
        slabels = noisy_labels(k["l1_noise"][None], svotes[None], cfg.gamma)[0]
        smask = jnp.ones(slabels.shape, bool)
    else:
        slabels = jnp.argmax(svotes, -1).astype(jnp.int32)
        smask = jnp.sum(svotes, -1) > 0
    if not bool(jnp.any(smask)):
        raise ValueError("no public query received a consistent vote from any party, so the "
                         "final model has nothing to learn; use more public data or parties")
    tic = time.perf_counter()
    with ctx.runtime.progress.task("final model", total=1, unit="model") as task:
        final_fit = ctx.learners["final"].fit_shared(k["final"], xs, slabels[None], smask[None])
        task.update(1)
    values = {**state.values, "server_votes": np.asarray(svotes),
              "server_labels": np.asarray(slabels), "server_mask": np.asarray(smask)}
    values, ctx = _with_fitted(ctx, values, "final", final_fit, True)
    metrics = {"final_s": time.perf_counter() - tic,
               "num_server_queries": int(len(ctx.server_queries)),
               "z": int(np.max(values["z"]))}
    if ctx.data.y_public is not None:                  # diagnostics only
        truth = np.asarray(ctx.data.y_public)[ctx.server_queries]
        hit = (values["server_labels"] == truth)[values["server_mask"]]
        metrics["server_label_accuracy"] = float(np.mean(hit))
    return values, ctx, metrics


def seeds_stepper(states: list[api.State]):
    """The :mod:`~fedjax_dp.algorithms.api` hook: the phases of S seeds together, each chunk's
    compiled work vmapped over the seeds (:mod:`fedjax_dp.algorithms.fedkt.fedkt_seeds`), or None
    when they cannot share compiled calls (tree learners, reused models, differing shapes)."""
    from fedjax_dp.algorithms.fedkt import fedkt_seeds
    return fedkt_seeds.seeds_stepper(states)


def output(state: api.State) -> api.Output:
    """The final model: ``model`` / ``params`` for a JAX learner, else ``predict`` (trees)."""
    if state.step < len(PHASES):
        raise ValueError(f"output needs the finished run (the final model is trained in the last "
                         f"phase); state.step is {state.step}")
    ctx: Context = state.context
    learner, final_fit = ctx.learners["final"], fitted(state, "final")
    if learners_lib.is_jax(learner):
        return api.Output(model=learner.model, params=jax.tree.map(lambda l: l[0], final_fit))
    return api.Output(model=ctx.model,
                      predict=lambda x: np.asarray(learner.predict(final_fit, x))[0])


def ledger(config: Config, state: api.State) -> tuple[PrivacyLedger, PrivacyLedger]:
    """``(data_dependent, data_independent)`` (:func:`ledgers_from_votes` on the run's votes),
    reported side by side, not composed."""
    if config.level == "L0":
        return PrivacyLedger(), PrivacyLedger()
    v = {} if state is None else state.values
    need = "server_votes" if config.level == "L1" else "teacher_votes"
    if need not in v:
        raise ValueError(f"the FedKT-{config.level} ledger needs the run's {need} (the state "
                         f"after the {'final' if config.level == 'L1' else 'teachers'} phase)")
    dd, di = ledgers_from_votes(config, server_votes=v.get("server_votes"),
                                teacher_votes=v.get("teacher_votes"), z=v.get("z"))
    for out in (dd, di):         # released beside both guarantees, covered by neither
        out.declare_uncovered("the count z of partitions at risk (metric z in history)",
                              "computed from the noise-free teacher votes: not private")
        out.declare_uncovered(
            "votes.npz in the run folder (the noise-free vote histograms, the input of "
            "fedjax-dp account fedkt)", "the analysis' input, written without noise: keep it "
            "with the data owner, it is not private to release")
    return dd, di


def artifacts(state: api.State, out_dir, run_config: dict) -> dict:
    """With ``out_dir``: the run's noise-free vote histograms as ``votes.npz`` (``votes``: L1 the
    server's ``[Q, C]``, L2 the teachers' ``[n, s, Q, C]``; ``z``), so that
    ``fedjax-dp account fedkt --votes DIR/votes.npz ...`` re-derives the run's guarantees (the
    command is returned as ``account_command``). Votes are the analysis' input, not a release."""
    level = run_config["algorithm"].get("level", Config.level)
    if out_dir is None or level == "L0":
        return {}
    v = state.values
    votes = v.get("server_votes") if level == "L1" else v.get("teacher_votes")
    if votes is None:
        return {}
    from pathlib import Path
    path = Path(out_dir) / "votes.npz"
    z = int(np.max(v["z"])) if "z" in v else None
    np.savez_compressed(path, votes=np.asarray(votes),
                        **({"z": np.asarray(z)} if z is not None else {}))
    a = run_config["algorithm"]
    command = (f"fedjax-dp account fedkt --votes {path} --level {level} "
               f"--gamma {a.get('gamma', Config.gamma)} "
               f"--s {a.get('num_partitions', Config.num_partitions)} "
               f"--t {a.get('num_teachers', Config.num_teachers)} "
               f"--delta {run_config['privacy']['delta']}")
    return {"votes_file": str(path), "account_command": command}


def run(key: jax.Array, parties: StackedData, x_public, config: Config, *, num_classes: int,
        teacher=None, student=None, final=None, model_name: str = "mlp", hidden=(200,),
        chunk_size: int | str | None = "auto", fitted_teachers=None,
        fitted_students=None) -> Result:
    """FedKT Algorithm 1 (:func:`api.run` over :data:`PHASES`; parties in chunks of
    ``config.party_chunk``).

    Args:
      key: root key; independent named streams for the splits, teachers, L2 noise, queries,
        students, L1 noise and the final model (no key is used twice).
      parties: the n parties' local data (``StackedData [n, n_max, ...]``).
      x_public: the public unlabelled set ``[P, ...]`` (never its labels).
      teacher: the teachers' learner (default: :func:`make_learners` with the JAX model
        ``model_name`` with ``hidden``).
      student: the students' learner (default as for ``teacher``).
      final: the final model's learner (default as for ``teacher``).
      fitted_teachers: as in :func:`init`.
      fitted_students: as in :func:`init`.
    """
    if not isinstance(config, Config):
        raise ValueError(f"config must be a fedkt.Config, got {type(config).__name__}")
    validation.check_int("num_classes", num_classes, minimum=2)
    x_public = validation.check_finite_array("x_public", x_public)
    if x_public.ndim < 2 or x_public.shape[0] == 0:
        raise ValueError(f"x_public must hold at least one public example [P, ...], got shape "
                         f"{x_public.shape}")
    if tuple(x_public.shape[1:]) != parties.feature_shape:
        raise ValueError(f"x_public has feature shape {x_public.shape[1:]}, expected the "
                         f"parties' {parties.feature_shape}")
    if teacher is None or student is None or final is None:
        t_, s_, f_ = make_learners(config, model_name=model_name,
                                   feature_shape=parties.feature_shape, num_classes=num_classes,
                                   hidden=hidden, chunk_size=chunk_size)
        teacher, student, final = teacher or t_, student or s_, final or f_
    from fedjax_dp.models import make_model
    model = make_model(model_name, parties.feature_shape, num_classes, hidden=tuple(hidden))
    data = api.FederatedData(agents=parties, num_classes=num_classes, x_public=x_public)
    runtime = api.Runtime(chunk_size=chunk_size)
    state = init(key, data, model, config, runtime, teacher=teacher, student=student,
                 final=final, fitted_teachers=fitted_teachers, fitted_students=fitted_students)
    done = api.run(sys.modules[__name__], key, data, model, config, runtime=runtime,
                   state=state)
    st, v = done.state, done.state.values
    ctx: Context = st.context
    timings = {k: r[k] for r in done.history for k in ("teachers_s", "students_s", "final_s")
               if k in r}
    kept = {name: None if learners_lib.is_jax(ctx.learners[name]) and name not in v
            else fitted(st, name) for name in _FITTED}                  # streamed: not kept
    return Result(final=kept["final"], students=kept["students"],
                  teachers=kept["teachers"], final_learner=ctx.learners["final"],
                  party_queries=ctx.party_queries, server_queries=ctx.server_queries,
                  teacher_votes=v["teacher_votes"], party_labels=v["party_labels"],
                  student_preds=v["student_preds"], server_votes=v["server_votes"],
                  server_labels=v["server_labels"], server_mask=v["server_mask"], z=v["z"], config=config,
                  num_classes=num_classes, timings=timings, state=st)


# --------------------------------------------------------------------------- privacy

def _moments(votes, gamma: float, k: float, orders) -> np.ndarray:
    """Summed log moments of LNMax queries with histograms ``votes [..., Q, C]`` -> ``[..., L]``."""
    q = lnmax.lnmax_q(votes, gamma)                                        # [..., Q]
    return lnmax.lnmax_log_moments(q, gamma, z=k, k=k, orders=orders).sum(axis=-2)


def log_moments(level: str, gamma: float, *, server_votes=None, teacher_votes=None,
                num_partitions: int = 2, num_teachers: int = 5, z: int | None = None,
                orders=lnmax.DEFAULT_MOMENT_ORDERS, example_rule: str = "consistent"
                ) -> dict[str, np.ndarray]:
    """Data-dependent total log moments per unit (``{'party': [L], 'example': [L]}``).

    L1: ``server_votes [Q, C]`` (noiseless consistent-voting histograms); party k = s;
    example k from ``z`` (largest number of at-risk partitions of a party; default s, the worst
    case) by :func:`example_k` (``example_rule='paper'``: :func:`paper_example_k`).
    L2: ``teacher_votes [n, s, Q, C]`` (or ``[s, Q, C]``; ``[Q, C]`` means the same histograms
    in each of the s partitions); example k = 1, party
    k = t; queries of one party compose, the worst party counts (per order).
    """
    validation.check_choice("level", level, ("L1", "L2"))
    validation.check_choice("example_rule", example_rule, ("consistent", "paper"))
    s = validation.check_int("num_partitions", num_partitions, minimum=1)
    t = validation.check_int("num_teachers", num_teachers, minimum=1)
    if level == "L1":
        if server_votes is None:
            raise ValueError("server_votes [Q, C] are required at level L1")
        v = np.asarray(server_votes)
        if v.ndim != 2:
            raise ValueError(f"server_votes must have shape [Q, C], got {v.shape}")
        z = s if z is None else validation.check_int("z", z, minimum=0, maximum=s)
        kx = example_k(z, s) if example_rule == "consistent" else paper_example_k(z, s)
        return {"party": _moments(v, gamma, s, orders), "example": _moments(v, gamma, kx, orders)}
    if teacher_votes is None:
        raise ValueError("teacher_votes [n, s, Q, C] are required at level L2")
    v = np.asarray(teacher_votes)
    if v.ndim < 2 or v.ndim > 4:
        raise ValueError(f"teacher_votes must have shape [n, s, Q, C], got {v.shape}")
    if v.ndim == 2:                     # the same histograms in each of the s partitions
        v = np.broadcast_to(v, (s,) + v.shape)
    v = v.reshape((1,) * (4 - v.ndim) + v.shape)                           # [n, s, Q, C]
    if v.shape[1] != s:
        raise ValueError(f"teacher_votes must have num_partitions={s} partitions on axis -3, "
                         f"got shape {v.shape}")
    per_party = {u: _moments(v, gamma, kk, orders).sum(axis=1)              # [n, L]
                 for u, kk in (("example", 1.0), ("party", float(t)))}
    return {u: m.max(axis=0) for u, m in per_party.items()}                 # worst party


def num_noisy_queries(level: str, *, server_queries: int = 0, party_queries: int = 0,
                      num_partitions: int = 2) -> int:
    """Queries one unit's data enters: Qs at L1; s * Qp per party at L2."""
    return server_queries if level == "L1" else num_partitions * party_queries


def data_independent_events(level: str, gamma: float, num_queries: int, *,
                            num_partitions: int, num_teachers: int) -> dict:
    """``{unit: DpEvent}``: composition of pure ``(2 k gamma, 0)``-DP LNMax queries (worst case).

    A query with L1 sensitivity 2k and Laplace scale 1/gamma is ``LaplaceDpEvent(1/(2 k gamma))``.
    L1: k = s for both units (one record can flip all s students). L2: per party s*Q queries,
    k = 1 (example) / t (party); parties are disjoint and identical, so one party's composition
    is the guarantee.
    """
    s, t = num_partitions, num_teachers
    ks = {"party": s, "example": s} if level == "L1" else {"party": t, "example": 1}
    return {u: accounting.laplace_event(1.0 / (2.0 * kk * gamma), num_queries)
            for u, kk in ks.items()}


def ledgers_from_votes(config: Config, *, server_votes=None, teacher_votes=None, z=None,
                    num_server_queries: int | None = None, num_party_queries: int | None = None
                    ) -> tuple[PrivacyLedger, PrivacyLedger]:
    """``(data_dependent, data_independent)`` ledgers with units ``'party'`` and ``'example'``.

    The data-dependent one holds the summed log moments as RDP (``add_rdp`` on orders l + 1,
    ``RDP(l + 1) = alpha(l) / l``); the other the ``LaplaceDpEvent`` compositions (RDP and PLD
    apply). L0 adds no noise: both are empty.
    """
    dd, di = PrivacyLedger(), PrivacyLedger()
    if config.level == "L0":
        return dd, di
    s, t, g = config.num_partitions, config.num_teachers, config.gamma
    moments = log_moments(config.level, g, server_votes=server_votes,
                          teacher_votes=teacher_votes, num_partitions=s, num_teachers=t,
                          z=None if z is None else int(np.max(z)), orders=config.orders)
    if config.level == "L1":
        nq = int(np.asarray(server_votes).shape[0]) if num_server_queries is None \
            else num_server_queries
    else:
        nq_party = int(np.asarray(teacher_votes).shape[-2]) if num_party_queries is None \
            else num_party_queries
        nq = num_noisy_queries("L2", party_queries=nq_party, num_partitions=s)
    events = data_independent_events(config.level, g, nq, num_partitions=s, num_teachers=t)
    for unit, relation in (("party", PARTY_RELATION), ("example", EXAMPLE_RELATION)):
        orders, rdp = lnmax.log_moments_to_rdp(moments[unit], config.orders)
        note = (f"FedKT-{config.level} data-dependent LNMax moments (gamma={g}, s={s}, t={t}, "
                f"{nq} noisy queries per unit); alpha(l) = l * RDP(l+1)")
        dd.add_rdp(unit, orders, rdp, relation=relation, note=note)
        di.add_event(unit, events[unit], relation=relation,
                     note=f"FedKT-{config.level} data-independent: {nq} pure-DP LNMax queries")
    return dd, di


def privacy_summary(result: Result, delta: float) -> dict:
    """Per unit: the paper's ``moments_epsilon``, the RDP conversion of the same moments, and
    the data-independent epsilon (RDP and PLD); plus z and query counts."""
    cfg = result.config
    out: dict[str, Any] = {"level": cfg.level, "gamma": cfg.gamma,
                           "query_fraction": cfg.query_fraction,
                           "noisy_queries": 0, "units": {}}
    if cfg.level == "L0":
        return out
    moments = log_moments(cfg.level, cfg.gamma, server_votes=result.server_votes,
                          teacher_votes=result.teacher_votes, num_partitions=cfg.num_partitions,
                          num_teachers=cfg.num_teachers, z=int(result.z.max()),
                          orders=cfg.orders)
    dd, di = ledgers_from_votes(cfg, server_votes=result.server_votes,
                             teacher_votes=result.teacher_votes, z=result.z)
    out["noisy_queries"] = (len(result.server_queries) if cfg.level == "L1"
                            else len(result.party_queries))
    out["z"] = int(result.z.max())
    for unit in ("party", "example"):
        row = {"moments_epsilon": lnmax.moments_epsilon(moments[unit], delta, cfg.orders),
               "data_dependent_rdp_epsilon": _unit_epsilon(dd, unit, delta, "rdp"),
               "data_independent_rdp_epsilon": _unit_epsilon(di, unit, delta, "rdp"),
               "data_independent_pld_epsilon": _unit_epsilon(di, unit, delta, "pld")}
        out["units"][unit] = row
    return out


def _unit_epsilon(ledger: PrivacyLedger, unit: str, delta: float, accountant: str) -> float:
    return next(r["epsilon"] for r in ledger.report(delta, (accountant,)) if r["unit"] == unit)


def account(votes, *, level: str, gamma: float, delta: float, num_partitions: int = 2,
            num_teachers: int = 5, z: int | None = None, units=("party", "example"),
            moment_orders: int = 8, example_rule: str = "consistent",
            accountants=("rdp", "pld")) -> dict:
    """Epsilon of FedKT-L1/L2 for given noiseless vote histograms, without training.

    ``votes``: L1: the server's consistent-voting histograms ``[Q, C]``; L2: the teachers'
    histograms ``[n, s, Q, C]`` (or ``[s, Q, C]``, ``[Q, C]``). Per unit: the paper's
    ``moments_epsilon``, the dp-accounting conversion of the same moments (RDP) and the
    data-independent guarantee (``LaplaceDpEvent`` composition; RDP and PLD).
    """
    validation.check_choice("level", level, ("L1", "L2"))
    delta = validation.check_open_unit("delta", delta)
    for u in units:
        validation.check_choice("unit", u, ("party", "example"))
    cfg = Config(num_partitions=num_partitions, num_teachers=num_teachers, level=level,
                 gamma=gamma, moment_orders=moment_orders)
    v = np.asarray(votes)
    kw = {"server_votes": v} if level == "L1" else {"teacher_votes": v}
    moments = log_moments(level, gamma, num_partitions=num_partitions,
                          num_teachers=num_teachers, z=z, orders=cfg.orders,
                          example_rule=example_rule, **kw)
    dd, di = ledgers_from_votes(cfg, z=z, **kw)
    nq = v.shape[0] if level == "L1" else num_partitions * v.shape[-2]
    out = {"mechanism": "fedkt", "level": level, "gamma": gamma, "delta": delta,
           "num_partitions": num_partitions, "num_teachers": num_teachers,
           "z": None if level == "L2" else (num_partitions if z is None else int(z)),
           "example_rule": example_rule, "noisy_queries_per_unit": int(nq), "units": {}}
    if example_rule == "paper":   # ledgers follow the correct rule; report the paper's epsilon
        out["note"] = "example_rule='paper' affects moments_epsilon only"
    for unit in units:
        out["units"][unit] = {
            "relation": PARTY_RELATION if unit == "party" else EXAMPLE_RELATION,
            "moments_epsilon": lnmax.moments_epsilon(moments[unit], delta, cfg.orders),
            "data_dependent": {"rdp": _unit_epsilon(dd, unit, delta, "rdp")},
            "data_independent": {a: _unit_epsilon(di, unit, delta, a) for a in accountants},
            "data_independent_event": accounting.event_to_json(
                next(e.event for e in di.entries if e.unit == unit)),
        }
    return out


def load_votes(path) -> tuple[np.ndarray, int | None]:
    """``(votes, z)`` from a ``.npz`` (key ``votes``, optional ``z``) or ``.json`` file
    (``{"votes": [...], "z": ...}`` or a bare nested list)."""
    import json
    from pathlib import Path
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"--votes file {str(p)!r} does not exist")
    if p.suffix == ".npz":
        with np.load(p) as f:
            if "votes" in f.files:
                votes, z = f["votes"], (int(f["z"]) if "z" in f.files else None)
            elif len(f.files) == 1:
                votes, z = f[f.files[0]], None
            else:
                raise ValueError(f"--votes npz must hold an array named 'votes', got {f.files}")
    elif p.suffix == ".json":
        data = json.loads(p.read_text())
        if isinstance(data, dict):
            if "votes" not in data:
                raise ValueError("--votes JSON object must have a 'votes' key")
            votes, z = data["votes"], data.get("z")
        else:
            votes, z = data, None
        votes = np.asarray(votes)
    else:
        raise ValueError(f"--votes must be a .npz or .json file, got {p.suffix!r}")
    if votes.dtype.kind not in "iuf" or votes.ndim < 2:
        raise ValueError(f"votes must be a numeric array [..., Q, C], got shape {votes.shape}")
    return votes, (None if z is None else int(z))
