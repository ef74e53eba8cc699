"""DP-FedAvg (Geyer et al. 2017; McMahan et al. 2018), agent-level DP. voting-dpfl Algorithm 1.

Round t:

    S_t          Poisson sampling of agents with probability q (or a uniform C-subset)
    Delta_i      = clip(LocalSGD_E(theta_t; D_i) - theta_t, S)   (global L2 norm <= S)
    theta_{t+1}  = theta_t + eta_s * (sum_{i in S_t} Delta_i + N(0, sigma^2 S^2 I)) / (q N)

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

Secure aggregation (``aggregation = "secagg"``, :mod:`fedjax_dp.privacy.secagg_masks`): each
pass's sum of clipped updates is computed by pairwise masking in fixed point, equal to the plain
sum up to ``M 2^-(f+1)`` per coordinate (M agents); the server still adds the noise (central DP).
Dropouts (``secagg_dropout = p``, coin ``fold_in(k_drop, id)``,
:func:`fedjax_dp.privacy.secagg.drop_within`) leave the ledger an upper bound: see
docs/secagg.md, "Dropouts and their privacy effect".
"""
from __future__ import annotations

import dataclasses

import dp_accounting
import jax

from fedjax_dp.algorithms import api
from fedjax_dp.algorithms.averaging import fedavg
from fedjax_dp.core import validation
from fedjax_dp.models import Model
from fedjax_dp.privacy import PrivacyLedger, accounting, secagg

RELATION = "add/remove one agent's entire local dataset"
RELATION_FIXED = "replace one agent's entire local dataset"


@dataclasses.dataclass(frozen=True)
class Config(fedavg.Config, secagg.SecAggOptions):
    """DP-FedAvg: FedAvg plus update clipping to ``clip_norm`` (S) and noise multiplier sigma."""

    clip_norm: float = 1.0
    noise_multiplier: float = 1.0
    denominator: str = "expected"
    # secure aggregation (docs/secagg.md): "plain" (default) or "secagg" (secagg_frac_bits
    # fraction bits, masks on a secagg_neighbours-regular graph, None: complete; each agent
    # drops after masking with probability secagg_dropout). secagg_talliers: the votes' only.
    aggregation: str = "plain"
    secagg_talliers: int = 2
    secagg_frac_bits: int = 16
    secagg_neighbours: int | None = None
    secagg_dropout: float = 0.0

    FIELDS = {"clip_norm": validation.Float(0.0, low_open=True),
              "noise_multiplier": validation.Float(0.0),
              "denominator": validation.Choice(("expected", "sampled"))}

    def __post_init__(self):
        super().__post_init__()            # checks every field (validation.check_config)
        self.check_aggregation()


def round_spec(config: Config) -> fedavg.RoundSpec:
    """The round's mechanism: updates clipped to S = ``clip_norm``, the Gaussian mechanism of
    noise multiplier ``noise_multiplier`` on their sum; the run (:func:`init`) and the ledger
    (:func:`dp_event`) both read it."""
    return fedavg.RoundSpec(sampling=config.participation, server_lr=config.server_lr,
                            clip_norm=config.clip_norm, noise_multiplier=config.noise_multiplier,
                            denominator=config.denominator, secagg=config.secagg,
                            diagnostics=config.diagnostics)


DESCRIPTION = "DP-FedAvg, agent-level DP (McMahan et al. 2018)"
USES_LOCAL_TRAIN = True

num_steps = fedavg.num_steps
step = fedavg.step
multi_step = fedavg.multi_step            # K rounds fused in one compiled call (rounds.py)
rounds_per_call = fedavg.rounds_per_call
prefetch = fedavg.prefetch
artifacts = fedavg.artifacts
output = fedavg.output


def init(key: jax.Array, data: api.FederatedData, model: Model, config: Config,
         runtime: api.Runtime = api.Runtime()) -> api.State:
    """As :func:`fedavg.init` with the clipped, noised round of :func:`round_spec`."""
    return fedavg.init_rounds(key, data, model, config.local, round_spec(config), runtime)


seed_step = fedavg.seed_step              # S seeds: the fused round vmapped (rounds.seed_step)


def dp_event(config: Config, num_agents: int | None = None):
    """Poisson: ``SelfComposed(PoissonSampled(q, Gaussian(sigma)), T)`` (sensitivity S under
    add/remove, noise sigma*S). Fixed size C of N: ``SelfComposed(SampledWithoutReplacement(N, C,
    Gaussian(sigma / 2)), T)`` (sensitivity 2S under replace-one). sigma is the noise multiplier
    of the round's mechanism (:func:`round_spec`), the object the run's server uses."""
    z = round_spec(config).noise_multiplier
    if config.sampling == "fixed":
        if num_agents is None:
            raise ValueError("num_agents is needed to account fixed-size sampling (C of N)")
        return dp_accounting.SelfComposedDpEvent(
            dp_accounting.SampledWithoutReplacementDpEvent(
                int(num_agents), int(config.cohort_size),
                dp_accounting.GaussianDpEvent(z / 2.0)), config.rounds)
    return accounting.sampled_gaussian_event(z, config.sampling_rate, config.rounds)


def ledger(config: Config, state: api.State | None = None) -> PrivacyLedger:
    """Agent-level guarantee of the whole run (independent of the data: no data-dependent part).

    Fixed-size sampling needs the number of agents N: from ``state`` (the run's agents)."""
    out = PrivacyLedger()
    if config.sampling == "fixed":
        n = None if state is None else state.context.agents.num_agents
        out.add_event("agent", dp_event(config, n), relation=RELATION_FIXED,
                      sensitivity=2 * config.clip_norm)
    else:
        out.add_event("agent", dp_event(config), relation=RELATION, sensitivity=config.clip_norm)
    return declare_uncovered(config, out)


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
