"""AE-DPFL (voting-dpfl Algorithm 2): private aggregation of all agents' predictions by MPC vote.

1. Every agent i trains a local model f_i on its own data D_i (all N at once: ``train_agents``,
   each from its own initialisation).
2. The server draws Q queries x_1..x_Q from its unlabelled public data D_G (data-independent).
3. Agent i's ballot for x_t is ``onehot(argmax f_i(x_t))`` (or, with ``abstain_below = tau``,
   that one-hot if ``max softmax f_i(x_t) >= tau`` and the zero vector otherwise: the agent
   abstains where its own model is unsure; see :func:`ballot_fn`); it adds ``N(0, sigma^2/N I_C)``; the
   secure sum carries ``N(0, sigma^2 I_C)`` and only ``y_t = argmax`` is released
   (:func:`fedjax_dp.algorithms.voting.mpc_vote`). All agents' predictions on all queries are one
   compiled computation: under ``vmap`` over agents with shared queries, every agent's first
   layer is ``einsum('qd,ndh->nqh')``, i.e. one GEMM ``[Q, d] x [d, N h]``.
4. The server trains the global ("student") model on ``(x_t, y_t)``, t = 1..Q (supervised, the
   paper's choice) -- post-processing of the released labels. Optional
   (``student_semi_supervised = true``): self-training on the rest of D_G with the student's
   confident pseudo-labels (:mod:`fedjax_dp.algorithms.student`); also post-processing of the
   released labels and the server's own public data, so the privacy ledger is unchanged.

Privacy (Theorem 5). Gaussian mechanism on the vote sum, noise std ``sigma``, Q queries composed:

* unit ``agent``, relation add/remove one agent's entire local dataset: the agent's one-hot
  ballot disappears, Delta = 1: ``SelfComposed(Gaussian(sigma), Q)``, RDP ``Q alpha/(2 sigma^2)``;
* unit ``instance``, relation add/remove one training record of one agent: that agent's
  prediction may flip from one class to another, Delta = sqrt(2):
  ``SelfComposed(Gaussian(sigma/sqrt(2)), Q)``, RDP ``Q alpha / sigma^2``.

Both sensitivities hold unchanged with abstention (``abstain_below``): every ballot is still
either a one-hot vector or the zero vector, so removing an agent moves the sum by at most 1 in L2,
and one changed record moves one agent's ballot between one-hot / another one-hot / zero, an L2
change of at most sqrt(2). The ledger is therefore the same for every ``abstain_below``.

Data-dependent (Theorem 7 / PATE 2018 Thm 6): since only the argmax is released, each query's RDP
is bounded by GNMax's using the noise-free vote sums; reported under ``<unit>_data_dependent``
with ``data_dependent: true``. Example: sigma = 25, Q = 500, agent level, delta = 1e-3 gives
epsilon 3.09 (dp-accounting RDP; the paper's 3.6 uses an older RDP-to-DP conversion).
"""
from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.algorithms import student as student_lib
from fedjax_dp.algorithms import voting
from fedjax_dp.core import StackedData, rng, validation
from fedjax_dp.models import Model
from fedjax_dp.privacy import PrivacyLedger
from fedjax_dp.train import LocalTrainConfig, check_trainable, train_agents

Params = Any


@dataclasses.dataclass(frozen=True)
class Config(student_lib.StudentSettings):
    """AE-DPFL. ``local`` trains the agents; the ``student_*`` fields train the global model."""

    sigma: float = 25.0                 # std of the total noise on the vote sum
    num_queries: int = 500              # Q public queries labelled by the vote
    student_steps: int = 500
    student_batch_size: int = 32
    student_learning_rate: float = 0.1
    student_optimizer: str = "sgd"
    # semi-supervised student (self-training on the rest of the public data; no privacy cost)
    student_semi_supervised: bool = False   # False: supervised on the Q queries (paper)
    student_self_training_rounds: int = 2   # pseudo-labelling rounds after the supervised one
    student_confidence: float = 0.8         # keep a pseudo-label if max softmax >= this
    agent_chunk: int | None = None      # agents per chunk in the vote (None: all at once)
    query_chunk: int | None = None      # queries per chunk in the vote (None: all at once)
    data_dependent: bool = True         # also report the GNMax data-dependent epsilon
    # the vote's noise: every agent's share ("per_agent") or the secure sum's at once
    # ("aggregate": same distribution of the released labels; Q C draws instead of N Q C)
    vote_noise: str = "per_agent"
    # abstention: an agent whose max softmax on a query is < this casts the zero ballot
    # (None: never abstain, the paper's rule). Sensitivities unchanged (see ``ballot_fn``).
    abstain_below: float | None = None
    local: LocalTrainConfig = LocalTrainConfig()

    def __post_init__(self):
        voting.check_vote_config(self)
        check_abstain_below("algorithm.abstain_below", self.abstain_below)
        if not isinstance(self.local, LocalTrainConfig):
            raise ValueError("local must be a LocalTrainConfig")
        self.student  # validates the student_* fields
        self.semi_supervised


def check_abstain_below(name: str, value) -> float | None:
    """``None`` or a number in ``(0, 1]`` (NaN, booleans and strings rejected); returns a float."""
    if value is None:
        return None
    ok = not isinstance(value, bool) and isinstance(value, (int, float, np.integer, np.floating))
    if not (ok and 0.0 < float(value) <= 1.0):     # NaN fails the comparison
        raise ValueError(f"{name} must be None (never abstain) or a number in (0, 1] (an agent "
                         f"abstains where its max softmax is below it), got {value!r}")
    return float(value)


@dataclasses.dataclass
class Result:
    params: Params                  # the student (global) model
    agent_params: Params            # [N, ...] local models
    query_indices: np.ndarray       # [Q] indices into the public set
    labels: np.ndarray              # [Q] released labels
    clean_vote_sums: np.ndarray | None   # [Q, C] noise-free sums (privacy analysis only)
    agent_losses: np.ndarray        # [N] mean local training loss
    wall_time_s: float = 0.0


def ballot_fn(model: Model, abstain_below: float | None = None):
    """``(agent params [a, ...], queries [q, ...]) -> ballots [a, q, C]``.

    ``abstain_below = None`` (the paper's rule): agent i's ballot on x is ``onehot(argmax f_i(x))``.
    ``abstain_below = tau`` in ``(0, 1]``: the same one-hot if ``max softmax f_i(x) >= tau``, else
    the zero vector (agent i abstains on x). Note ``max softmax >= 1/C`` always, so ``tau <= 1/C``
    never abstains.

    Sensitivity of the vote sum (per query) is unchanged by abstention, because every ballot is
    one-hot or zero (L2 norm <= 1):

    * agent level (add/remove one agent): the sum gains/loses that agent's ballot, L2 change
      ``<= 1`` -> Delta = 1;
    * instance level (add/remove one record of one agent): only that agent's model, hence only its
      ballot, changes -- between ``e_c``, ``e_c'`` (c' != c) and ``0`` -- and
      ``||e_c - e_c'|| = sqrt(2)``, ``||e_c - 0|| = 1``, so the L2 change is ``<= sqrt(2)`` ->
      Delta = sqrt(2).

    ``vmap(model.logits, (0, None))``: the shared queries meet every agent's first-layer kernel in
    one GEMM. Cached per (model, abstain_below) so the compiled vote is reused.
    """
    return _ballot_fn(model, check_abstain_below("abstain_below", abstain_below))


@functools.lru_cache(maxsize=32)
def _ballot_fn(model: Model, abstain_below: float | None):
    def ballots(params, queries):
        logits = jax.vmap(model.logits, in_axes=(0, None))(params, queries)   # [a, q, C]
        onehot = jax.nn.one_hot(jnp.argmax(logits, -1), model.num_classes, dtype=jnp.float32)
        if abstain_below is None:
            return onehot
        confident = jnp.max(jax.nn.softmax(logits.astype(jnp.float32), -1), -1) >= abstain_below
        return jnp.where(confident[..., None], onehot, 0.0)                   # zero: abstain
    return ballots


def select_queries(key: jax.Array, num_public: int, num_queries: int) -> np.ndarray:
    """Q distinct indices of the public set, uniformly at random (independent of private data)."""
    num_queries = validation.check_int("algorithm.num_queries", num_queries, minimum=1)
    if num_queries > num_public:
        raise ValueError(f"algorithm.num_queries must be <= the number of public records "
                         f"({num_public}), got {num_queries}")
    return np.sort(np.asarray(jax.random.permutation(key, num_public)[:num_queries]))


def train_student(key: jax.Array, model: Model, x: np.ndarray, labels: np.ndarray,
                  config: LocalTrainConfig) -> Params:
    """Train the global model on the pseudo-labelled queries (a one-agent ``train_agents``).

    Supervised only; the semi-supervised student is
    :func:`fedjax_dp.algorithms.student.train_student`.
    """
    return student_lib.train_supervised(key, model, x, labels, config)


def check_run_args(agents: StackedData, model: Model, x_public) -> np.ndarray:
    """Host-side checks shared by the voting algorithms; returns ``x_public`` as an array."""
    if not isinstance(agents, StackedData):
        raise ValueError(f"agents must be a StackedData, got {type(agents).__name__}")
    check_trainable(agents)
    x_public = validation.check_finite_array("x_public", x_public)
    if tuple(x_public.shape[1:]) != agents.feature_shape:
        raise ValueError(f"x_public must have feature shape {agents.feature_shape} (the agents'), "
                         f"got {tuple(x_public.shape[1:])}")
    if tuple(model.feature_shape) != agents.feature_shape:
        raise ValueError(f"model feature shape {model.feature_shape} must equal the agents' "
                         f"{agents.feature_shape}")
    return x_public


def run(key: jax.Array, agents: StackedData, model: Model, config: Config, x_public, *,
        chunk_size: int | str | None = "auto") -> Result:
    """AE-DPFL end to end: train all agents, vote on Q public queries, train the student.

    ``x_public [n_public, *feature_shape]``: the server's unlabelled data (queries come from it).
    Keys: named streams of ``key`` (init, train, queries, vote, student), never reused.
    """
    if not isinstance(config, Config):
        raise ValueError(f"config must be an ae_dpfl.Config, got {type(config).__name__}")
    x_public = check_run_args(agents, model, x_public)
    n = agents.num_agents
    voting.check_vote_args(config.sigma, n, config.num_queries, model.num_classes,
                           config.agent_chunk, config.query_chunk, config.vote_noise)
    qidx = select_queries(rng.stream(key, "queries"), len(x_public), config.num_queries)
    start = time.perf_counter()
    init = jax.vmap(model.init)(rng.split_per_agent(rng.stream(key, "init"), n))   # [N, ...]
    agent_params, losses = train_agents(rng.stream(key, "train"), init, agents, model,
                                        config.local, shared_init=False,
                                        chunk_size=chunk_size)
    queries = jnp.asarray(x_public[qidx])                                           # [Q, ...]
    fn = ballot_fn(model, config.abstain_below)
    labels, clean = voting.run_vote(rng.stream(key, "vote"), fn, agent_params, queries,
                                    config.sigma, num_classes=model.num_classes,
                                    agent_chunk=config.agent_chunk,
                                    query_chunk=config.query_chunk, noise=config.vote_noise,
                                    data_dependent=config.data_dependent)
    student = student_lib.train_student(rng.stream(key, "student"), model, x_public, qidx,
                                        labels, config.student, config.semi_supervised)
    return Result(params=student, agent_params=agent_params, query_indices=qidx, labels=labels,
                  clean_vote_sums=clean, agent_losses=np.asarray(losses),
                  wall_time_s=time.perf_counter() - start)


def sensitivities() -> dict[str, float]:
    """``{'agent': 1, 'instance': sqrt(2)}`` (Theorem 5)."""
    return {unit: voting.vote_sensitivity(unit, "ae") for unit in ("agent", "instance")}


def privacy_ledger(config: Config, num_agents: int,
                   clean_vote_sums: np.ndarray | None = None) -> PrivacyLedger:
    """Agent- and instance-level guarantees (+ data-dependent ones given the noise-free sums)."""
    validation.check_int("num_agents", num_agents, minimum=1)
    return voting.vote_ledger(config.sigma, config.num_queries, sensitivities(),
                              clean_vote_sums=clean_vote_sums, note="AE-DPFL")
