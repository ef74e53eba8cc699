"""Noise stages: what the server (or, for distributed noise, each agent) adds to the sum, and the
run's privacy analysis composed from the chain's releases.

The guarantee's multiplier z (``algorithm.noise_multiplier``) is per turn of an agent: every turn
releases the noised update sum and, under adaptive clipping, the noised unclipped count (a second
Gaussian of multiplier ``z_c = 2 sigma_b``). On one cohort the two are one Gaussian mechanism on
the vector (update, count) whose multiplier is ``z = (z_u^-2 + z_c^-2)^-1/2`` (Andrew et al.
2021, Section 3), so the updates carry ``z_u = (z^-2 - z_c^-2)^-1/2`` (:func:`update_multiplier`)
and the event of every noise stage is the one of multiplier z for the chain's participation.

Registered here: ``none`` (no noise; FedAvg) and ``gaussian`` (independent N(0, (z_u S)^2 I) each
round on the sum). The correlated strategies are in :mod:`fedjax_dp.stages.correlated`, the
distributed ones in :mod:`fedjax_dp.stages.distributed`. A new noise stage subclasses
:class:`Noise` (``release``, ``account``, its ``requirements``) in its own module and is listed
once in :mod:`fedjax_dp.stages` (docs/protocol.md, "Adding a noise stage").
"""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, NamedTuple

from fedjax_dp.privacy import adaptive_clip as adaptive_lib
from fedjax_dp.privacy import mechanisms
from fedjax_dp.stages.base import Stage, register

__all__ = ["Setup", "Account", "Noise", "NoNoise", "GaussianNoise", "update_multiplier",
           "count_multiplier"]


class Setup(NamedTuple):
    """What the analysis and the state need of the run: agents N, rounds T, the model's
    parameters d, the population's total capped weight W (None: no ``weight_cap``)."""

    num_agents: int | None
    rounds: int
    dim: int | None = None
    total_weight: float | None = None


class Account(NamedTuple):
    """The run's guarantee as the noise stage composes it: a dp-accounting ``event`` (or an RDP
    curve ``orders`` / ``rdp``), the ``relation`` and ``sensitivity`` stated, and the ``note``."""

    event: Any
    relation: str
    sensitivity: float
    note: str
    orders: Any = None
    rdp: Any = None


def expected_cohort(chain, setup: Setup) -> float:
    """m: the expected cohort size (qN, C, qN / b), times W / N under capped weights."""
    if setup.num_agents is None:
        raise ValueError("the number of agents N is needed for the expected cohort (adaptive "
                         "clipping's default count noise m / 20): account with the run's state")
    m = chain["participation"].expected(setup.num_agents)
    if chain["clipping"].weight_cap is not None:
        if setup.total_weight is None:
            raise ValueError("the population's total capped weight W is needed (weight_cap): "
                             "account with the run's state")
        m = m * setup.total_weight / setup.num_agents
    return m


def count_multiplier(chain, setup: Setup) -> float | None:
    """z_c = 2 sigma_b of the adaptive clip's count release (None without one: then neither N
    nor W is needed)."""
    clip = chain["clipping"]
    if not clip.adaptive:
        return None
    if clip.tracker.count_noise is not None:          # given: no cohort size needed
        return 2.0 * float(clip.tracker.count_noise)
    return clip.count_multiplier(expected_cohort(chain, setup))


def update_multiplier(chain, setup: Setup) -> float:
    """z_u: the update's multiplier, z itself or ``(z^-2 - z_c^-2)^-1/2`` with a count."""
    z, zc = chain["noise"].multiplier, count_multiplier(chain, setup)
    if zc is None:
        return z
    return adaptive_lib.update_noise_multiplier(z, zc / 2.0)


class Noise(Stage):
    """The noise protocol. ``multiplier`` z; ``sensitivity`` the S the noise is scaled to where
    it is not the clip (an audit's weakening that drops the clip keeps its noise; None: the
    clip). ``encodes``: the agents encode and noise their own messages inside the secure sum.
    State: ``init(dim)``; ``release(key, total, scale, z_u, state, chain)`` -> (total, state);
    ``account(chain, setup)`` -> :class:`Account`."""

    KIND: ClassVar[str] = "noise"
    encodes: ClassVar[bool] = False
    correlated: ClassVar[bool] = False
    multiplier: float = 0.0
    sensitivity: float | None = None

    def init(self, dim: int) -> Any:
        return ()

    def note(self, chain, setup: Setup) -> str:
        return ""


@register
@dataclasses.dataclass(frozen=True)
class NoNoise(Noise):
    NAME: ClassVar[str] = "none"
    CONFIG: ClassVar[str] = 'algorithm.name = "fedavg"'
    SUMMARY: ClassVar[str] = "no noise (FedAvg): no guarantee"
    OPTIONS: ClassVar[dict] = {}
    multiplier: float = 0.0
    sensitivity: float | None = None

    def release(self, key, total, scale, z_u, state, chain):
        return total, state

    def account(self, chain, setup: Setup) -> Account | None:
        return None


@register
@dataclasses.dataclass(frozen=True)
class GaussianNoise(Noise):
    """Fresh N(0, (z_u S)^2 I) on the round's sum (:func:`~fedjax_dp.privacy.mechanisms.
    gaussian_mechanism`); the event is the participation's per-turn Gaussian of multiplier z."""

    NAME: ClassVar[str] = "gaussian"
    CONFIG: ClassVar[str] = 'algorithm.noise = "independent", algorithm.noise_multiplier = z'
    SUMMARY: ClassVar[str] = "independent Gaussian noise on each round's sum"
    OPTIONS: ClassVar[dict] = {"noise_multiplier": "z >= 0 (the guarantee's, per turn)"}
    multiplier: float = 1.0
    sensitivity: float | None = None

    def release(self, key, total, scale, z_u, state, chain):
        if z_u > 0:
            total = mechanisms.gaussian_mechanism(key, total, scale, z_u)
        return total, state

    def account(self, chain, setup: Setup) -> Account:
        part = chain["participation"]
        event = part.gaussian_event(self.multiplier, setup.rounds, setup.num_agents)
        return Account(event, part.relation, part.factor * _clip_norm(chain, self), "")


def _clip_norm(chain, noise: Noise) -> float:
    """The S the ledger states (C_0 under adaptive clipping; the weakening's S where given)."""
    if noise.sensitivity is not None:
        return float(noise.sensitivity)
    return float(chain["clipping"].norm)


def compose_with_count(update_event, chain, setup: Setup, turns: int):
    """A non-amplified analysis: the update's event composed with the count's Gaussian per
    turn, ``SelfComposed(Gaussian(z_c / factor), turns)`` (no sampling claimed for either)."""
    import dp_accounting
    zc = count_multiplier(chain, setup)
    if zc is None:
        return update_event
    factor = chain["participation"].factor
    return dp_accounting.ComposedDpEvent([update_event, dp_accounting.SelfComposedDpEvent(
        dp_accounting.GaussianDpEvent(zc / factor), int(turns))])
