"""Participation stages: who takes part in a round, the neighbouring relation that follows, and
how a per-turn Gaussian release composes over the run under that participation.

``poisson``  every agent independently with rate q (add/remove one agent; amplified by
             sampling: ``SelfComposed(PoissonSampled(q, G(z)), T)``).
``fixed``    a uniformly random subset of exactly C of the N agents (replace one agent;
             ``SelfComposed(SampledWithoutReplacement(N, C, G(z / 2)), T)``, Wang, Balle and
             Kasiviswanathan 2019).
``cyclic``   b participation groups, round t draws from group ``t mod b`` only (b-min-sep
             participation: an agent's turns are at least b rounds apart, at most ceil(T / b)
             of them). Within the group: Poisson with rate q (each agent's group independent and
             uniform; Choquette-Choo et al. NeurIPS 2023's amplified banded MF) or exactly C of
             the group (the groups an even split of a random permutation, so every group holds
             at least floor(N / b) agents; the production DP-FTRL recipe). A Gaussian per turn
             composes over the ceil(T / b) turns, amplified by the within-group draw.

The groups and the coins are independent of the data, so adding (or replacing) an agent changes
no other agent's participation. Every draw comes from the round's sampling key (the coins) or the
run's key (the groups), never from a key used elsewhere.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from fedjax_dp.core import cohort as cohort_lib
from fedjax_dp.core import rng, validation
from fedjax_dp.privacy import accounting
from fedjax_dp.stages.base import Stage, register

__all__ = ["Participation", "Poisson", "Fixed", "Cyclic", "ADD_REMOVE", "REPLACE_ONE"]

ADD_REMOVE = "add/remove one agent's entire local dataset"
REPLACE_ONE = "replace one agent's entire local dataset"


class Participation(Stage):
    """The participation protocol: ``coins(key, N, state) -> [N] bool``, its state (``init``,
    ``advance``), the relation and the sensitivity factor (1 under add/remove, 2 under
    replace-one: an agent's clipped update moves the sum by at most factor x S), ``min_sep`` and
    ``turns(T)`` (the most rounds one agent takes part in) and :meth:`gaussian_event`."""

    KIND: ClassVar[str] = "participation"
    relation: ClassVar[str] = ADD_REMOVE
    factor: ClassVar[float] = 1.0
    min_sep: int = 1

    def init(self, key: jax.Array, num_agents: int) -> Any:
        return ()

    def advance(self, state: Any) -> Any:
        return state

    def coins(self, key: jax.Array, num_agents: int, state: Any) -> jax.Array:
        return cohort_lib.cohort_coins(key, num_agents, self.sampling)

    def turns(self, rounds: int) -> int:
        """The most rounds one agent can take part in: T (every round may draw it)."""
        return int(rounds)

    def pass_size(self, num_agents: int) -> int | None:
        """The host driver's pass (None: :class:`~fedjax_dp.core.cohort.CohortPlan`'s choice)."""
        return None

    def check(self, num_agents: int, rounds: int | None = None) -> None:
        """Refuse, before any work, a draw that cannot be made (or a run nearly always empty)."""
        self.sampling.check(num_agents, rounds)

    @property
    def amplified_banded_rate(self) -> float | None:
        """q where amplified banded MF's analysis applies (Poisson within b-min-sep groups)."""
        return None


@register
@dataclasses.dataclass(frozen=True)
class Poisson(Participation):
    """Every agent independently with probability ``rate`` q."""

    NAME: ClassVar[str] = "poisson"
    CONFIG: ClassVar[str] = 'algorithm.sampling = "poisson", algorithm.sampling_rate = q'
    SUMMARY: ClassVar[str] = "each agent independently with rate q (add/remove; amplified)"
    OPTIONS: ClassVar[dict] = {"sampling_rate": "q in (0, 1]"}
    rate: float = 1.0

    @property
    def sampling(self) -> cohort_lib.Sampling:
        return cohort_lib.Sampling("poisson", rate=self.rate)

    def expected(self, num_agents: int) -> float:
        return self.rate * num_agents

    def gaussian_event(self, z: float, rounds: int, num_agents: int | None):
        """``SelfComposed(PoissonSampled(q, Gaussian(z)), T)`` (q = 1: no sampling)."""
        return accounting.sampled_gaussian_event(z, self.rate, rounds)


@register
@dataclasses.dataclass(frozen=True)
class Fixed(Participation):
    """A uniformly random subset of exactly ``size`` C agents each round."""

    NAME: ClassVar[str] = "fixed"
    CONFIG: ClassVar[str] = 'algorithm.sampling = "fixed", algorithm.cohort_size = C'
    SUMMARY: ClassVar[str] = "exactly C of the N agents (replace-one; amplified, RDP only)"
    OPTIONS: ClassVar[dict] = {"cohort_size": "C in [1, N]"}
    relation: ClassVar[str] = REPLACE_ONE
    factor: ClassVar[float] = 2.0
    size: int = 1

    @property
    def sampling(self) -> cohort_lib.Sampling:
        return cohort_lib.Sampling("fixed", size=self.size)

    def expected(self, num_agents: int) -> float:
        return float(self.size)

    def gaussian_event(self, z: float, rounds: int, num_agents: int | None):
        """``SelfComposed(SampledWithoutReplacement(N, C, Gaussian(z / 2)), T)``."""
        return _wor_event(z, rounds, num_agents, self.size, "N")


def _wor_event(z: float, turns: int, population: int | None, size: int, what: str):
    import dp_accounting
    if population is None:
        raise ValueError(f"the number of agents ({what}) is needed to account fixed-size "
                         f"sampling (C of {what})")
    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.SampledWithoutReplacementDpEvent(
            int(population), int(size), dp_accounting.GaussianDpEvent(z / 2.0)), int(turns))


@register
@dataclasses.dataclass(frozen=True)
class Cyclic(Participation):
    """b participation groups; round t draws group ``t mod b`` with ``within`` (Poisson rate q
    or exactly C). State: ``{"round": int32, "group": [N] int32}``."""

    NAME: ClassVar[str] = "cyclic"
    CONFIG: ClassVar[str] = 'algorithm.min_sep = b (default under correlated noise: its b)'
    SUMMARY: ClassVar[str] = ("b groups, round t draws group t mod b (b-min-sep); Poisson q "
                              "(amplified banded MF) or exactly C within the group")
    OPTIONS: ClassVar[dict] = {"min_sep": "b >= 1, the number of groups (rounds between turns)",
                               "sampling": '"poisson" (rate q) or "fixed" (C of the group)'}
    min_sep: int = 2
    within: cohort_lib.Sampling = cohort_lib.Sampling("poisson", rate=1.0)

    def __post_init__(self):
        validation.check_int("participation.min_sep", self.min_sep, minimum=1)

    @property
    def relation(self) -> str:
        return ADD_REMOVE if self.within.kind == "poisson" else REPLACE_ONE

    @property
    def factor(self) -> float:
        return 1.0 if self.within.kind == "poisson" else 2.0

    @property
    def sampling(self) -> cohort_lib.Sampling:
        return self.within

    def init(self, key: jax.Array, num_agents: int) -> dict:
        """Each agent's group: independent and uniform (Poisson within), or an even split of a
        random permutation (fixed within: every group at least floor(N / b) agents)."""
        k = rng.stream(key, "cohort_groups")
        if self.within.kind == "poisson":
            group = jax.random.randint(k, (num_agents,), 0, self.min_sep, jnp.int32)
        else:
            order = jax.random.permutation(k, num_agents)
            group = jnp.zeros((num_agents,), jnp.int32).at[order].set(
                jnp.arange(num_agents, dtype=jnp.int32) % self.min_sep)
        return {"round": jnp.int32(0), "group": group}

    def advance(self, state: dict) -> dict:
        return {**state, "round": state["round"] + 1}

    def coins(self, key: jax.Array, num_agents: int, state: dict) -> jax.Array:
        member = state["group"] == state["round"] % self.min_sep                    # [N]
        if self.within.kind == "poisson":
            return cohort_lib.cohort_coins(key, num_agents, self.within) & member
        score = jnp.where(member, jax.random.uniform(key, (num_agents,)), 2.0)
        chosen = jax.lax.top_k(-score, self.within.size)[1]
        return jnp.zeros((num_agents,), bool).at[chosen].set(True)

    def turns(self, rounds: int) -> int:
        return -(-int(rounds) // self.min_sep)

    def expected(self, num_agents: int) -> float:
        if self.within.kind == "poisson":
            return self.within.rate * num_agents / self.min_sep
        return float(self.within.size)

    def pass_size(self, num_agents: int) -> int:
        if self.within.kind == "fixed":
            return self.within.size
        mean, q = self.expected(num_agents), self.within.rate
        return min(num_agents, max(1, math.ceil(mean + 2.0 * math.sqrt(mean * (1.0 - q)))))

    def check(self, num_agents: int, rounds: int | None = None) -> None:
        if self.within.kind == "fixed":
            smallest = num_agents // self.min_sep
            if self.within.size > smallest:
                raise ValueError(f"algorithm.cohort_size must be in [1, {smallest}] (the "
                                 f"smallest of the {self.min_sep} participation groups of "
                                 f"{num_agents} agents), got {self.within.size}")
            return
        self.within.check(num_agents, rounds)

    def gaussian_event(self, z: float, rounds: int, num_agents: int | None):
        """A Gaussian per turn over the ceil(T / b) turns: Poisson within
        ``SelfComposed(PoissonSampled(q, G(z)), ceil(T / b))``; fixed within
        ``SelfComposed(SampledWithoutReplacement(floor(N / b), C, G(z / 2)), ceil(T / b))``."""
        k = self.turns(rounds)
        if self.within.kind == "poisson":
            return accounting.sampled_gaussian_event(z, self.within.rate, k)
        smallest = None if num_agents is None else num_agents // self.min_sep
        return _wor_event(z, k, smallest, self.within.size, "N")

    @property
    def amplified_banded_rate(self) -> float | None:
        return self.within.rate if self.within.kind == "poisson" else None
