"""A round's chain of stages: one stage of each kind, checked against every stated requirement
when built, with its state (the tuple of the stages' states) and its composed guarantee.

    chain = Chain(participation=Poisson(0.1), client_update=LocalSteps(update),
                  clipping=AdaptiveClip(1.0), aggregation=PlainSum(),
                  noise=BandedMF(strategy, multiplier=1.2), server_update=OptaxStep("adam"))

The engine (:mod:`fedjax_dp.algorithms.rounds`) reads only the chain; the ledger is the noise
stage's :class:`~fedjax_dp.stages.noise.Account` of the chain (every stage's releases composed
there), with each stage's note.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from fedjax_dp.stages.aggregation import Aggregation
from fedjax_dp.stages.base import KINDS, Stage, check_chain
from fedjax_dp.stages.clipping import Clipping
from fedjax_dp.stages.noise import Account, Noise, Setup, expected_cohort, update_multiplier
from fedjax_dp.stages.participation import Participation
from fedjax_dp.stages.updates import ClientUpdate, ServerUpdate

__all__ = ["Chain", "Setup", "setup_of"]

_TYPES = {"participation": Participation, "client_update": ClientUpdate,
          "clipping": Clipping, "aggregation": Aggregation, "noise": Noise,
          "server_update": ServerUpdate}


@dataclasses.dataclass(frozen=True)
class Chain:
    """One stage of each kind (:data:`~fedjax_dp.stages.base.KINDS`); refused when built if a
    stage's requirement fails (:func:`~fedjax_dp.stages.base.check_chain`). Hashable: compiled
    rounds are cached per chain."""

    participation: Participation
    client_update: ClientUpdate
    clipping: Clipping
    aggregation: Aggregation
    noise: Noise
    server_update: ServerUpdate

    def __post_init__(self):
        for kind, cls in _TYPES.items():
            if not isinstance(getattr(self, kind), cls):
                raise TypeError(f"Chain.{kind} must be a {cls.__name__} stage, got "
                                f"{type(getattr(self, kind)).__name__}")
        check_chain(self)

    def __getitem__(self, kind: str) -> Stage:
        return getattr(self, kind)

    def stages(self) -> tuple[Stage, ...]:
        return tuple(getattr(self, k) for k in KINDS)

    def describe(self) -> str:
        """``participation "poisson" -> ... -> server_update "sgd"``."""
        return " -> ".join(s.label for s in self.stages())

    def init_state(self, key: jax.Array, params: Any, num_agents: int) -> tuple:
        """The run's first stage states, in :data:`KINDS` order (``()`` for a stateless
        stage): the participation's groups (from ``key``), C_0, the noise stream's state for
        the model's d parameters, the server optimizer's ``init(params)``."""
        dim = sum(int(np.prod(np.shape(l))) for l in jax.tree.leaves(params))
        return (self.participation.init(key, num_agents), (), self.clipping.init(), (),
                self.noise.init(dim), self.server_update.init(params))

    def expected_cohort(self, setup: Setup) -> float:
        return expected_cohort(self, setup)

    def update_multiplier(self, setup: Setup) -> float:
        """z_u, the update sum's noise multiplier (:func:`~fedjax_dp.stages.noise.
        update_multiplier`)."""
        if self.noise.multiplier == 0:
            return 0.0
        return update_multiplier(self, setup)

    def account(self, setup: Setup) -> Account | None:
        """The run's guarantee (None without noise), with the stages' notes joined."""
        acc = self.noise.account(self, setup)
        if acc is None:
            return None
        notes = [n for n in (self.clipping_note(setup), acc.note) if n]
        return acc._replace(note="; ".join(notes))

    def clipping_note(self, setup: Setup) -> str:
        clip = self.clipping
        out = []
        if clip.adaptive:
            out.append(ADAPTIVE_NOTE)
        if clip.weight_cap is not None:
            w = f"{clip.weight_cap:g}"
            out.append(f"client-level with unequal records: agent i's clipped update is weighted "
                       f"min(n_i / {w}, 1) <= 1, so the sensitivity stays S whatever n_i; divided "
                       f"by the fixed q W, W = sum_i min(n_i / {w}, 1) over the population "
                       f"(McMahan et al. 2018), treated as public")
        return "; ".join(out)


#: the ledger's account of adaptive clipping's two releases per turn
ADAPTIVE_NOTE = ("adaptive clipping: each round releases the noised sum of updates clipped to "
                 "C_t (noise z_Delta C_t) and the unclipped count (terms b - 1/2, noise sigma_b); "
                 "on one sampled cohort they are one Gaussian mechanism of the combined "
                 "multiplier z = (z_Delta^-2 + (2 sigma_b)^-2)^-1/2 (Andrew et al. 2021), the "
                 "event's; the sensitivity stated is C_0, the round's is C_t")


def setup_of(rounds: int, agents, params: Any = None, clipping: Clipping | None = None) -> Setup:
    """The :class:`Setup` of a run over ``agents`` (a StackedData: N and, under capped
    weights, W = sum_i min(n_i / w-hat, 1)) with the model's ``params`` (d)."""
    n = agents.num_agents
    dim = None if params is None else sum(int(np.prod(np.shape(l)))
                                          for l in jax.tree.leaves(params))
    total = None
    if clipping is not None and clipping.weight_cap is not None:
        counts = np.asarray(agents.counts, np.float64)
        total = float(np.minimum(counts / clipping.weight_cap, 1.0).sum())
    return Setup(n, int(rounds), dim, total)
