"""DP-FedAvg (Geyer et al. 2017; McMahan et al. 2018), agent-level DP. voting-dpfl Algorithm 1.

Round t:

    S_t          Poisson sampling of agents with probability q (or a uniform C-subset)
    Delta_i      = clip(LocalSGD_E(theta_t; D_i) - theta_t, S)   (global L2 norm <= S)
    theta_{t+1}  = theta_t + eta_s * (sum_{i in S_t} Delta_i + N(0, sigma^2 S^2 I)) / (q N)

With ``server_optimizer`` (:mod:`fedjax_dp.algorithms.averaging.fedavg`; Reddi et al. 2021,
Algorithm 1) the noised mean ``Delta_t = (sum + noise) / (q N)`` is a pseudo-gradient:
``theta_{t+1} = theta_t + opt.update(-Delta_t, s_t, theta_t)``; it reads only the release, so
the event below is the same with or without it.

Privacy. Unit: one agent. Neighbouring relation: add or remove one agent's entire local dataset.
The sum of clipped updates has L2 sensitivity S; the noise std is sigma*S, i.e. noise multiplier
sigma; agents are Poisson-subsampled with rate q; T rounds compose. The dp-accounting event is
``SelfComposed(PoissonSampled(q, Gaussian(sigma)), T)``.

Fixed-size sampling (``sampling = "fixed"``, exactly C of the N agents each round) is analysed
for the *replace-one* relation (replace one agent's entire local dataset; Wang, Balle and
Kasiviswanathan 2019): sensitivity 2S, so the event is
``SelfComposed(SampledWithoutReplacement(N, C, Gaussian(sigma / 2)), T)`` (RDP accountant only;
dp-accounting's PLD does not support sampling without replacement).

The division is by the *fixed* expected cohort size q*N (McMahan 2018): the realised count m_t
(the paper's Algorithm 1 line 6, ``denominator='sampled'``) would also release m_t, which the
analysis does not cover. Adding N(0, sigma^2 S^2) once to the sum equals, in distribution, each
sampled agent adding N(0, sigma^2 S^2 / m_t) (line 4 of NoisyUpdate) and summing.

Adaptive clipping (``adaptive_clip = {target_quantile, learning_rate, count_noise,
max_clip_norm}``, Andrew et al. 2021; :mod:`fedjax_dp.privacy.adaptive_clip`): S becomes C_t,
``clip_norm`` is C_0, the cohort also releases a noisy count of unclipped updates (std sigma_b,
sensitivity 1/2) that steers C_t to the target quantile; ``noise_multiplier`` is the round's
*combined* z, the updates carrying z_Delta = (z^-2 - (2 sigma_b)^-2)^-1/2, so the event above is
unchanged (both releases are one Gaussian mechanism on one sampled cohort; relation and unit as
above, sensitivity C_t per round, and 2 C_t for fixed-size cohorts).

Correlated noise (``noise = {kind = "banded_mf", bands = b}``, ``{kind = "blt", min_sep = b}`` or
``{kind = "tree", min_sep = b}``; :mod:`fedjax_dp.stages.correlated`, strategies from
jax-privacy): round t adds ``z S (C^-1 Z)_t`` instead of fresh noise. By default the agents are
split into b participation groups and round t draws from group ``t mod b`` (``min_sep``, the
noise's b); banded MF with Poisson sampling within the groups is amplified (jax-privacy's
``SelfComposed(PoissonSampled(q, Gaussian(z)), ceil(T / b))``), every other participation is
analysed without amplification over its min-sep patterns (``Gaussian(z / (f s))``), and the tree
is dp-accounting's ``SelfComposed(SingleEpochTreeAggregation(z, b), ceil(T / b))``.

Every combination of these mechanisms is a chain of stages (:func:`chain`, :mod:`fedjax_dp.stages`):
adaptive clipping with any noise, secure aggregation with central or distributed noise, any
participation with any central noise, any server optimizer. A combination a stage's stated
requirement forbids is refused in one line naming both stages (docs/mechanisms.md).

Agents with different numbers of records (``weight_cap = w``): agent i's clipped update is
weighted ``min(n_i / w, 1)`` and the sum divided by the fixed ``q W``, ``W = sum_i min(n_i / w,
1)`` (McMahan et al. 2018's capped weights); every weight is at most 1, so the sensitivity (S)
and the event are those above, whatever n_i.

Secure aggregation (``aggregation = "secagg"``, :mod:`fedjax_dp.privacy.secagg_masks`): each
pass's sum of clipped updates is computed by pairwise masking in fixed point, equal to the plain
sum up to ``M 2^-(f+1)`` per coordinate (M agents); the server still adds the noise (central DP).
Dropouts (``secagg_dropout = p``, coin ``fold_in(k_drop, id)``,
:func:`fedjax_dp.privacy.secagg.drop_within`) leave the ledger an upper bound: see
docs/secagg.md, "Dropouts and their privacy effect".

Distributed DP (``distributed_noise = {kind = "ddg" | "skellam", bits = b}`` with
``aggregation = "secagg"`` and ``sampling = "fixed"``; :mod:`fedjax_dp.stages.distributed`):
no server noise; each agent scales, rotates, rounds and adds a discrete noise share, the secure
sum is taken mod 2^b, and the server unwraps it (a round with fewer than ``min_survivors``
survivors aborts). ``noise_multiplier`` is the central-equivalent z. Relation: replace one
agent's entire local dataset (sensitivity 2 Delta_2 of the rounded, scaled update); the ledger's
entry is the RDP curve of :func:`fedjax_dp.privacy.distributed_accounting.run_rdp` (with adaptive
clipping the unclipped count is summed in its own secure sum with its own discrete shares and its
RDP added to the round's).
"""
from __future__ import annotations

import dataclasses

import jax

from fedjax_dp.algorithms import api, rounds
from fedjax_dp.algorithms.averaging import fedavg
from fedjax_dp.algorithms.rounds_protocol import (  # noqa: F401  (the protocol hooks)
    artifacts, multi_step, output, prefetch, rounds_per_call, seed_step, step)
from fedjax_dp.core import validation
from fedjax_dp.models import Model
from fedjax_dp.privacy import PrivacyLedger, accounting
from fedjax_dp.privacy import adaptive_clip as adaptive_lib
from fedjax_dp.privacy import correlated_noise as correlated_lib
from fedjax_dp.privacy import distributed_dp as distributed_lib
from fedjax_dp.privacy.secagg import SecAggFields
from fedjax_dp.stages import (Chain, Setup, aggregation, clipping, correlated, distributed,
                              noise, participation, setup_of, updates)
from fedjax_dp.stages.base import StageConflict, registered
from fedjax_dp.stages.chain import ADAPTIVE_NOTE  # noqa: F401  (the ledger's adaptive note)

RELATION = participation.ADD_REMOVE
RELATION_FIXED = participation.REPLACE_ONE


def _parse_noise(name: str, value):
    """``algorithm.noise``: ``"independent"``, a correlated strategy's table, a table whose
    ``kind`` is another registered noise stage (its ``from_table``), or from Python a
    :class:`~fedjax_dp.stages.noise.Noise` stage itself (its multiplier is the config's)."""
    if isinstance(value, noise.Noise):
        return value
    kind = value.get("kind") if isinstance(value, dict) else None
    cls = registered("noise").get(kind) if kind not in correlated_lib.KINDS else None
    if cls is not None and hasattr(cls, "from_table"):
        return cls.from_table(name, value)
    return correlated_lib.parse(name, value)


@dataclasses.dataclass(frozen=True)
class Config(fedavg.Config, SecAggFields):
    """DP-FedAvg: FedAvg plus update clipping to ``clip_norm`` (S) and noise multiplier sigma.

    ``diagnostics`` is off by default: the round metrics are computed without noise, so the
    reported epsilon covers every release only without them; ``true`` reports them and every
    guarantee then says ``covers_all_releases: false`` (:func:`declare_uncovered`)."""

    clip_norm: float = 1.0
    noise_multiplier: float = 1.0
    denominator: str = "expected"
    diagnostics: bool = False       # the non-private round metrics: an explicit opt-in
    # adaptive clipping (Andrew et al. 2021): None / false, true (the paper's defaults) or a
    # table of privacy.adaptive_clip.OPTIONS; clip_norm is then the first round's clip C_0
    adaptive_clip: adaptive_lib.AdaptiveClip | None = None
    # noise across rounds: "independent" (fresh each round) or a correlated strategy table,
    # {kind = "banded_mf", bands = b} / {kind = "blt" | "tree", min_sep = b} (correlated_noise)
    noise: correlated_lib.CorrelatedNoise | None = None
    # client-level weighting by records: None (every agent once) or w-hat, each update weighted
    # min(n_i / w-hat, 1) (McMahan et al. 2018); needs denominator = "expected"
    weight_cap: float | None = None
    # distributed DP under secure aggregation: "none" (the server adds the noise) or a table
    # {kind = "ddg" | "skellam", bits = b, k_stddevs, beta, min_survivors} (privacy.distributed_dp)
    distributed_noise: distributed_lib.DistributedNoise | None = None

    FIELDS = {"weight_cap": validation.Float(0.0, low_open=True, optional=True),
              "distributed_noise": validation.Custom(
                  distributed_lib.parse, bad=(3, {"kind": "gauss"}, {"kind": "ddg", "bits": 1},
                                              {"kind": "skellam", "beta": 1.0},
                                              {"kind": "ddg", "bit": 16})),
              "noise": validation.Custom(
                  _parse_noise, bad=(3, {"kind": "tree"}, {"kind": "banded_mf"},
                                             {"kind": "banded_mf", "bands": 0},
                                             {"kind": "blt", "bands": 2})),
              "adaptive_clip": validation.Custom(
                  adaptive_lib.parse, bad=(3, "x", {"target_quantile": 1.5},
                                           {"learning_rate": 0}, {"count_noise": -1},
                                           {"quantile": 0.5})),
              "clip_norm": validation.Float(0.0, low_open=True),
              "noise_multiplier": validation.Float(0.0, accounting.GAUSSIAN_NOISE_RANGE[1]),
              "denominator": validation.Choice(("expected", "sampled"))}

    def __post_init__(self):
        super().__post_init__()            # checks every field (validation.check_config)
        self.check_aggregation()
        if isinstance(self.noise, correlated_lib.CorrelatedNoise):
            object.__setattr__(self, "noise", correlated_lib.check_rounds(
                "algorithm.noise", self.noise, self.rounds))
        n_min = None if self.distributed_noise is None else self.distributed_noise.min_survivors
        if n_min is not None and self.sampling == "fixed" and n_min > self.cohort_size:
            raise ValueError(f"algorithm.distributed_noise.min_survivors must be in [1, "
                             f"{self.cohort_size}] (algorithm.cohort_size), got {n_min}")
        if self.distributed_noise is not None and not self.noise_multiplier > 0:
            raise ValueError("algorithm.distributed_noise needs algorithm.noise_multiplier > 0 "
                             "(the central-equivalent z of the agents' discrete noise)")
        if self.adaptive_clip is not None and self.noise_multiplier > 0 and \
                self.adaptive_clip.count_noise is not None:  # the paper's default: with N
            adaptive_lib.update_noise_multiplier(self.noise_multiplier,
                                                 self.adaptive_clip.count_noise)
        chain(self)                        # every stage's requirement, before any work


def clipping_stage(config: Config) -> clipping.Clipping:
    """Fixed clip S = ``clip_norm``, or adaptive clipping from C_0 = ``clip_norm``."""
    if config.adaptive_clip is None:
        return clipping.FixedClip(norm=float(config.clip_norm), weight_cap=config.weight_cap)
    return clipping.AdaptiveClip(norm=float(config.clip_norm), tracker=config.adaptive_clip,
                                 weight_cap=config.weight_cap)


_CORRELATED = {"banded_mf": correlated.BandedMF, "blt": correlated.BLT, "tree": correlated.Tree}
_DISTRIBUTED = {"ddg": distributed.DDG, "skellam": distributed.Skellam}


def noise_stage(config: Config) -> noise.Noise:
    """Independent Gaussian, a correlated strategy, or distributed noise, of multiplier z."""
    z = float(config.noise_multiplier)
    if isinstance(config.noise, noise.Noise):        # a stage given from Python
        own = dataclasses.replace(config.noise, multiplier=z)
    else:
        own = None if config.noise is None else _CORRELATED[config.noise.kind](
            strategy=config.noise, multiplier=z)
    if config.distributed_noise is not None and own is not None:
        a = own
        b = _DISTRIBUTED[config.distributed_noise.kind](spec=config.distributed_noise,
                                                        multiplier=z)
        raise StageConflict(f"{a.label} with {b.label}: a round has one noise stage; noise "
                            f"correlated across rounds needs a party that holds the noise state "
                            f"across rounds, and distributed DP has no such party by definition")
    if config.distributed_noise is not None:
        return _DISTRIBUTED[config.distributed_noise.kind](spec=config.distributed_noise,
                                                           multiplier=z)
    return own if own is not None else noise.GaussianNoise(multiplier=z)


def chain(config: Config, model: Model | None = None) -> Chain:
    """DP-FedAvg's round: the config's participation (b groups by default under correlated
    noise), E local steps, the clip, the sum, the noise, the server's step over the expected
    cohort (``model`` None: the chain checked without a client); the run (:func:`init`) and the
    ledger (:func:`ledger`) both read it."""
    noise_ = noise_stage(config)
    default_b = config.noise.cycle if isinstance(config.noise, correlated_lib.CorrelatedNoise) \
        else None
    client = updates.LocalSteps(None if model is None
                                else rounds.local_sgd_update(model, config.local))
    agg = aggregation.PlainSum() if config.secagg is None else aggregation.SecureSum(config.secagg)
    return Chain(participation=fedavg.participation_stage(config, default_b),
                 client_update=client, clipping=clipping_stage(config), aggregation=agg,
                 noise=noise_, server_update=fedavg.server_stage(config, config.denominator))


DESCRIPTION = "DP-FedAvg, agent-level DP (McMahan et al. 2018)"
USES_LOCAL_TRAIN = True

num_steps = fedavg.num_steps


def init(key: jax.Array, data: api.FederatedData, model: Model, config: Config,
         runtime: api.Runtime = api.Runtime()) -> api.State:
    """As :func:`fedavg.init` with DP-FedAvg's chain (:func:`chain`)."""
    return fedavg.init_rounds(key, data, model, chain(config, model), config.rounds, runtime,
                              local=config.local, diagnostics=config.diagnostics)


def _setup(config: Config, state: api.State | None, num_agents: int | None = None) -> Setup:
    """The ledger's :class:`~fedjax_dp.stages.Setup`: N, d and W from the run's state."""
    if state is None:
        return Setup(num_agents, int(config.rounds))
    return setup_of(config.rounds, state.context.agents, state.values["params"],
                    clipping_stage(config))


def dp_event(config: Config, num_agents: int | None = None):
    """The run's event, composed by the chain's stages (:meth:`Chain.account`): e.g. Poisson
    ``SelfComposed(PoissonSampled(q, Gaussian(z)), T)``, fixed size C of N
    ``SelfComposed(SampledWithoutReplacement(N, C, Gaussian(z / 2)), T)``."""
    if config.distributed_noise is not None:
        raise ValueError("algorithm.distributed_noise has no DpEvent: its guarantee is an RDP "
                         "curve (distributed_rdp; the ledger records it)")
    return chain(config).account(Setup(num_agents, int(config.rounds))).event


def privacy_units(config: Config) -> tuple[str, ...]:
    """The ``privacy_units`` hook (:class:`fedjax_dp.algorithms.api.Algorithm`): ``agent``
    (a fixed-size cohort's ledger needs N, from the state)."""
    return ("agent",)


def ledger(config: Config, state: api.State | None = None) -> PrivacyLedger:
    """Agent-level guarantee of the whole run, composed from the chain's stages (independent
    of the data: no data-dependent part). Fixed-size sampling and distributed noise need the
    run's ``state`` (N; the model's d)."""
    if config.distributed_noise is not None and state is None:
        raise ValueError("the run's state is needed to account distributed noise (the "
                         "number of agents N and the model's dimension d)")
    acc = chain(config).account(_setup(config, state))
    out = PrivacyLedger()
    if acc.event is None:
        out.add_rdp("agent", acc.orders, acc.rdp, relation=acc.relation, data_dependent=False,
                    sensitivity=acc.sensitivity, note=acc.note)
    else:
        out.add_event("agent", acc.event, relation=acc.relation, sensitivity=acc.sensitivity,
                      note=acc.note)
    return declare_uncovered(config, out)


def distributed_rdp(config: Config, state: api.State):
    """``(orders, rdp, plan)``: the run's RDP curve under distributed noise (replace one agent;
    :func:`fedjax_dp.privacy.distributed_accounting.run_rdp` of the round's plan for the model's
    d parameters, C of N agents per round, T rounds)."""
    c = chain(config)
    return c.noise.run_rdp(c, _setup(config, state))


def declare_uncovered(config: Config, out: PrivacyLedger) -> PrivacyLedger:
    """What a run releases that the sampled-Gaussian analysis does not cover: the round
    diagnostics (``config.diagnostics``) and, with ``denominator = "sampled"`` under Poisson
    sampling (q < 1), the realised cohort size m_t that divides every round's noisy sum."""
    if config.diagnostics:
        out.declare_uncovered(*fedavg.DIAGNOSTICS_UNCOVERED)
    if config.denominator == "sampled" and config.sampling == "poisson" and \
            config.sampling_rate < 1:
        out.declare_uncovered(
            "the realised cohort size m_t of every round, the denominator of the update "
            "(denominator = \"sampled\")",
            "released through the model without noise; the sampled-Gaussian analysis covers the "
            "fixed denominator q N (denominator = \"expected\") only")
    return out
