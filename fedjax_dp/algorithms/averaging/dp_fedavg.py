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
``{kind = "tree", min_sep = b}``;
:mod:`fedjax_dp.privacy.correlated_noise`, strategies from jax-privacy): round t adds
``z S (C^-1 Z)_t`` instead of fresh noise, and Poisson-samples (rate q) only the agents of group
``t mod b`` (each agent's group independent and uniform, so the expected cohort is q N / b).
Relation and unit as above; the event is jax-privacy's amplified banded MF event
``SelfComposed(PoissonSampled(q, Gaussian(z)), ceil(T / b))`` (banded_mf) or
``Gaussian(z / s)`` with s the BLT's b-min-sep sensitivity (blt), or dp-accounting's
``SelfComposed(SingleEpochTreeAggregation(z, b), ceil(T / b))`` (tree, restarted every b rounds).
Poisson sampling only.

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
``aggregation = "secagg"`` and ``sampling = "fixed"``; :mod:`fedjax_dp.privacy.distributed_dp`):
no server noise; each agent scales, rotates, rounds and adds a discrete noise share, the secure
sum is taken mod 2^b, and the server unwraps it (a round with fewer than ``min_survivors``
survivors aborts). ``noise_multiplier`` is the central-equivalent z. Relation: replace one
agent's entire local dataset (sensitivity 2 Delta_2 of the rounded, scaled update); the ledger's
entry is the RDP curve of :func:`fedjax_dp.privacy.distributed_accounting.run_rdp`.
"""
from __future__ import annotations

import dataclasses

import dp_accounting
import jax
import numpy as np

from fedjax_dp.algorithms import api
from fedjax_dp.algorithms.averaging import fedavg
from fedjax_dp.algorithms.rounds_protocol import (  # noqa: F401  (the protocol hooks)
    artifacts, multi_step, output, prefetch, rounds_per_call, seed_step, step)
from fedjax_dp.algorithms.secure_rounds import SecAggFields
from fedjax_dp.core import validation
from fedjax_dp.models import Model
from fedjax_dp.privacy import PrivacyLedger, accounting
from fedjax_dp.privacy import adaptive_clip as adaptive_lib
from fedjax_dp.privacy import correlated_noise as correlated_lib
from fedjax_dp.privacy import distributed_accounting
from fedjax_dp.privacy import distributed_dp as distributed_lib

RELATION = "add/remove one agent's entire local dataset"
RELATION_FIXED = "replace one agent's entire local dataset"


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
                  correlated_lib.parse, bad=(3, {"kind": "tree"}, {"kind": "banded_mf"},
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
        if self.weight_cap is not None and self.denominator != "expected":
            raise ValueError("algorithm.weight_cap needs algorithm.denominator = \"expected\" "
                             "(the fixed q W of McMahan et al. 2018's weighted estimator)")
        if self.noise is not None:
            object.__setattr__(self, "noise", correlated_lib.check_rounds(
                "algorithm.noise", self.noise, self.rounds))
            if self.sampling != "poisson" or self.adaptive_clip is not None:
                raise ValueError("algorithm.noise (correlated) needs algorithm.sampling = "
                                 "\"poisson\" and no algorithm.adaptive_clip (their analyses "
                                 "are not composed here)")
        if self.distributed_noise is not None:
            self._check_distributed()
        if self.adaptive_clip is not None and self.noise_multiplier > 0 and \
                self.adaptive_clip.count_noise is not None:  # the paper's default: with N
            adaptive_lib.update_noise_multiplier(self.noise_multiplier,
                                                 self.adaptive_clip.count_noise)


    def _check_distributed(self) -> None:
        """What distributed noise needs, refused before any work with the key named."""
        need = [(self.aggregation == "secagg", "algorithm.aggregation = \"secagg\" (the "
                 "noise shares only add up inside the secure sum)"),
                (self.sampling == "fixed", "algorithm.sampling = \"fixed\" (a cohort of "
                 "exactly cohort_size agents: the shares are sized for it)"),
                (self.adaptive_clip is None and self.noise is None,
                 "no algorithm.adaptive_clip and no correlated algorithm.noise (not composed "
                 "with distributed noise here)"),
                (self.denominator == "expected", "algorithm.denominator = \"expected\""),
                (self.noise_multiplier > 0, "algorithm.noise_multiplier > 0")]
        missing = [why for ok, why in need if not ok]
        if missing:
            raise ValueError("algorithm.distributed_noise needs " + "; ".join(missing))
        n_min = self.distributed_noise.min_survivors
        if n_min is not None and n_min > self.cohort_size:
            raise ValueError(f"algorithm.distributed_noise.min_survivors must be in [1, "
                             f"{self.cohort_size}] (algorithm.cohort_size), got {n_min}")


def round_spec(config: Config) -> fedavg.RoundSpec:
    """The round's mechanism: updates clipped to S = ``clip_norm``, the Gaussian mechanism of
    noise multiplier ``noise_multiplier`` on their sum; the run (:func:`init`) and the ledger
    (:func:`dp_event`) both read it."""
    return fedavg.RoundSpec(sampling=config.participation, server_lr=config.server_lr,
                            clip_norm=config.clip_norm, noise_multiplier=config.noise_multiplier,
                            denominator=config.denominator, secagg=config.secagg,
                            diagnostics=config.diagnostics, adaptive=config.adaptive_clip,
                            correlated=config.noise, weight_cap=config.weight_cap,
                            distributed=config.distributed_noise,
                            server_optimizer=config.server_optimizer)


DESCRIPTION = "DP-FedAvg, agent-level DP (McMahan et al. 2018)"
USES_LOCAL_TRAIN = True

num_steps = fedavg.num_steps


def init(key: jax.Array, data: api.FederatedData, model: Model, config: Config,
         runtime: api.Runtime = api.Runtime()) -> api.State:
    """As :func:`fedavg.init` with the clipped, noised round of :func:`round_spec`."""
    config.participation.check(data.num_agents, config.rounds)    # not every round empty
    return fedavg.init_rounds(key, data, model, config.local, round_spec(config), runtime)


def dp_event(config: Config, num_agents: int | None = None):
    """Poisson: ``SelfComposed(PoissonSampled(q, Gaussian(sigma)), T)`` (sensitivity S under
    add/remove, noise sigma*S). Fixed size C of N: ``SelfComposed(SampledWithoutReplacement(N, C,
    Gaussian(sigma / 2)), T)`` (sensitivity 2S under replace-one). sigma is the noise multiplier
    of the round's mechanism (:func:`round_spec`), the object the run's server uses."""
    z = round_spec(config).noise_multiplier
    if config.distributed_noise is not None:
        raise ValueError("algorithm.distributed_noise has no DpEvent: its guarantee is an RDP "
                         "curve (distributed_rdp; the ledger records it)")
    if config.noise is not None:
        return correlated_lib.dp_event(config.noise, z, config.sampling_rate)
    if config.sampling == "fixed":
        if num_agents is None:
            raise ValueError("num_agents is needed to account fixed-size sampling (C of N)")
        return dp_accounting.SelfComposedDpEvent(
            dp_accounting.SampledWithoutReplacementDpEvent(
                int(num_agents), int(config.cohort_size),
                dp_accounting.GaussianDpEvent(z / 2.0)), config.rounds)
    return accounting.sampled_gaussian_event(z, config.sampling_rate, config.rounds)


def privacy_units(config: Config) -> tuple[str, ...]:
    """The ``privacy_units`` hook (:class:`fedjax_dp.algorithms.api.Algorithm`): ``agent``
    (a fixed-size cohort's ledger needs N, from the state)."""
    return ("agent",)


def ledger(config: Config, state: api.State | None = None) -> PrivacyLedger:
    """Agent-level guarantee of the whole run (independent of the data: no data-dependent part).

    Fixed-size sampling needs the number of agents N: from ``state`` (the run's agents)."""
    out = PrivacyLedger()
    note = "" if config.adaptive_clip is None else ADAPTIVE_NOTE
    if config.weight_cap is not None:
        note = ((note + "; ") if note else "") + (
            f"client-level with unequal records: agent i's clipped update is weighted "
            f"min(n_i / {config.weight_cap:g}, 1) <= 1, so the sensitivity stays S whatever n_i; "
            f"divided by the fixed q W, W = sum_i min(n_i / {config.weight_cap:g}, 1) over the "
            f"population (McMahan et al. 2018), treated as public")
    if config.noise is not None:
        note = ((note + "; ") if note else "") + (
                f"noise correlated across rounds ({config.noise.kind}, b = {config.noise.cycle}, "
                f"T = {config.rounds}): round t adds z S (C^-1 Z)_t and samples group t mod b "
                f"with rate q; the whole run is one (amplified) matrix mechanism, its event "
                f"jax-privacy's (tree: dp-accounting's, a tree per b rounds)")
    if config.distributed_noise is not None:
        if state is None:
            raise ValueError("the run's state is needed to account distributed noise (the "
                             "number of agents N and the model's dimension d)")
        orders, rdp, plan = distributed_rdp(config, state)
        n_min = config.distributed_noise.survivors_needed(config.cohort_size)
        note = ((note + "; ") if note else "") + (
            f"distributed {config.distributed_noise.kind} noise under secure aggregation mod "
            f"2^{plan.bits}: scale gamma = {plan.scale:.4g}, noise variance {plan.total_variance:.4g}"
            f" per coordinate of the integer sum (n_min = {n_min} shares), rounded norm "
            f"Delta_2 = {plan.rounded_norm:.4g} (d' = {plan.padded_dim}); the run's RDP is the "
            f"papers' bound, amplified by sampling without replacement (Wang et al. 2019)")
        out.add_rdp("agent", orders, rdp, relation=RELATION_FIXED, data_dependent=False,
                    sensitivity=2 * config.clip_norm, note=note)
    elif config.sampling == "fixed":
        n = None if state is None else state.context.agents.num_agents
        out.add_event("agent", dp_event(config, n), relation=RELATION_FIXED,
                      sensitivity=2 * config.clip_norm, note=note)
    else:
        out.add_event("agent", dp_event(config), relation=RELATION, sensitivity=config.clip_norm,
                      note=note)
    return declare_uncovered(config, out)


def distributed_rdp(config: Config, state: api.State):
    """``(orders, rdp, plan)``: the run's RDP curve under distributed noise (replace one agent;
    :func:`fedjax_dp.privacy.distributed_accounting.run_rdp` of the round's plan for the model's
    d parameters, C of N agents per round, T rounds)."""
    dn = config.distributed_noise
    params = state.values["params"]
    dim = sum(int(np.prod(np.shape(l))) for l in jax.tree.leaves(params))
    plan = distributed_lib.plan(dn, noise_multiplier=config.noise_multiplier,
                                clip=config.clip_norm, dim=dim, cohort=config.cohort_size)
    orders = distributed_accounting.ORDERS
    rdp = distributed_accounting.run_rdp(
        dn.kind, orders, scaled_clip=config.clip_norm / plan.scale, dim=plan.padded_dim,
        beta=dn.beta, total_variance=plan.total_variance, cohort=config.cohort_size,
        min_survivors=dn.survivors_needed(config.cohort_size),
        population=state.context.agents.num_agents, rounds=config.rounds)
    return orders, rdp, plan


#: the ledger's account of adaptive clipping's two releases per round
ADAPTIVE_NOTE = ("adaptive clipping: each round releases the noised sum of updates clipped to "
                 "C_t (noise z_Delta C_t) and the unclipped count (terms b - 1/2, noise sigma_b); "
                 "on one sampled cohort they are one Gaussian mechanism of the combined "
                 "multiplier z = (z_Delta^-2 + (2 sigma_b)^-2)^-1/2 (Andrew et al. 2021), the "
                 "event's; the sensitivity stated is C_0, the round's is C_t")


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
