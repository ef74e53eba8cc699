"""What one averaging round does with the agents' updates (:class:`RoundSpec`): sampling, clip
(fixed or adaptive), noise (independent or correlated across rounds), denominator, secure
aggregation; and which of the run's values the round's server reads and sets. The engine that
runs it: :mod:`fedjax_dp.algorithms.rounds`."""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.core import cohort as cohort_lib
from fedjax_dp.core import rng
from fedjax_dp.privacy import adaptive_clip as adaptive_lib
from fedjax_dp.privacy import correlated_noise as correlated_lib
from fedjax_dp.privacy import secagg as secagg_lib

Params = Any

__all__ = ["RoundSpec"]


@dataclasses.dataclass(frozen=True)
class RoundSpec:
    """What one federated-averaging round does with the agents' updates.

    sampling: how the round's participants are drawn (:class:`fedjax_dp.core.cohort.Sampling`).
    clip_norm: clip each agent's update to this global L2 norm S (None: no clipping).
    noise_multiplier: z; the Gaussian mechanism on the *sum* of updates adds N(0, (z S)^2 I)
      once per round (:func:`fedjax_dp.privacy.mechanisms.gaussian_mechanism`, sensitivity S;
      0: no noise). The private algorithms' ledgers read this spec (the mechanism's own object).
    noise_sensitivity: the S the noise is scaled to where it is not ``clip_norm`` (an audit's
      no-clip weakening keeps the noise of the clip it drops); None: ``clip_norm``.
    denominator: ``'sampled'`` divides the sum by the realised number of participants
      (FedAvg; the voting-dpfl paper's Algorithm 1), ``'expected'`` by the fixed q*N or C
      (McMahan et al. 2018's fixed-denominator estimator, needed for DP-FedAvg's guarantee).
    secagg: None (the plain sum) or secure aggregation of the clipped updates
      (:func:`fedjax_dp.privacy.secagg_masks.secure_tree_sum`); needs ``clip_norm`` (the range).
    adaptive: None (the clip is ``clip_norm`` every round) or adaptive clipping
      (:mod:`fedjax_dp.privacy.adaptive_clip`): ``clip_norm`` is C_0, the run's values carry C_t
      (``"clip_norm"``), the agents also sum their centred unclipped bits, and
      ``noise_multiplier`` is the round's combined z (the updates get z_Delta, the count sigma_b).
    correlated: None (fresh noise each round) or noise correlated across rounds
      (:mod:`fedjax_dp.privacy.correlated_noise`): round t adds ``z S (C^-1 Z)_t``, streamed from
      the run's values (``"noise_state"``), and Poisson-samples only the agents of group
      ``t mod b`` (``"cohort_group" [N]``, ``"round"``); fused device path only.
    weight_cap: None (every agent's update counts once) or w-hat: agent i's clipped update is
      weighted by ``w_i = min(n_i / w-hat, 1)`` (n_i its records; McMahan et al. 2018's capped
      weights), so the sensitivity stays S; the expected denominator is then q W with
      ``total_weight`` W = sum_i w_i over the population (set by ``init_rounds``).
    """

    sampling: cohort_lib.Sampling
    server_lr: float
    clip_norm: float | None = None
    noise_multiplier: float = 0.0
    noise_sensitivity: float | None = None
    denominator: str = "sampled"
    secagg: secagg_lib.SecAggConfig | None = None
    diagnostics: bool = True        # False: the server reports no metrics (see Config)
    adaptive: adaptive_lib.AdaptiveClip | None = None
    correlated: correlated_lib.CorrelatedNoise | None = None
    weight_cap: float | None = None
    total_weight: float | None = None

    @property
    def server_keys(self) -> tuple[str, ...]:
        """The run's values a round's server reads and sets: the params, C_t when adaptive, the
        noise stream's state when correlated (the round's *view*)."""
        return (("params",) + (("clip_norm",) if self.adaptive else ())
                + (("noise_state",) if self.correlated else ()))

    def view(self, values: dict) -> Any:
        """What a round reads from the run's values: the params alone, or a dict of
        :attr:`server_keys`."""
        keys = self.server_keys
        return values["params"] if keys == ("params",) else {k: values[k] for k in keys}

    def unview(self, view: Any) -> dict:
        """The values a round's result ``view`` sets (:meth:`view`'s inverse)."""
        return {"params": view} if self.server_keys == ("params",) else dict(view)

    def init_values(self, params: Params, key: jax.Array, num_agents: int) -> dict:
        """The run's first values: the params; C_0 = ``clip_norm`` when adaptive; when
        correlated, the noise stream's state, round 0 and each agent's participation group,
        independent and uniform over the b groups (from ``key``, independent of the data)."""
        values = {"params": params}
        if self.adaptive:
            values["clip_norm"] = jnp.float32(self.clip_norm)
        if self.correlated:
            dim = sum(int(np.prod(l.shape)) for l in jax.tree.leaves(params))
            values["noise_state"] = correlated_lib.init_state(self.correlated, dim)
            values["round"] = jnp.int32(0)
            values["cohort_group"] = jax.random.randint(
                rng.stream(key, "cohort_groups"), (num_agents,), 0, self.correlated.cycle,
                jnp.int32)
        return values

    def expected_cohort(self, num_agents: int) -> float:
        """m: the expected cohort size, q N (or C), over b for cyclic groups (correlated)."""
        m = self.sampling.expected(num_agents)
        if self.weight_cap is not None:             # E[sum of the cohort's weights]: q W
            m = m * self.total_weight / num_agents
        return m / self.correlated.cycle if self.correlated else m

    def weight(self, count: jax.Array) -> jax.Array:
        """An agent's weight ``min(n_i / w-hat, 1)`` (1 without ``weight_cap``)."""
        if self.weight_cap is None:
            return jnp.float32(1.0)
        return jnp.minimum(count.astype(jnp.float32) / self.weight_cap, 1.0)

    def with_weights(self, counts) -> "RoundSpec":
        """The spec with ``total_weight`` W = sum_i min(n_i / w-hat, 1) of a population's
        record counts ``[N]`` (unchanged without ``weight_cap``)."""
        if self.weight_cap is None:
            return self
        w = np.minimum(np.asarray(counts, np.float64) / self.weight_cap, 1.0)
        return dataclasses.replace(self, total_weight=float(w.sum()))

    def cohort_mask(self, values: dict, coins: jax.Array) -> jax.Array:
        """The round's coins ``[N]`` restricted to group ``round mod b`` when correlated."""
        if not self.correlated:
            return coins
        return coins & (values["cohort_group"] == values["round"] % self.correlated.cycle)

    def sum_noise_multiplier(self, num_agents: int) -> float:
        """The updates' noise multiplier: z, or z_Delta = (z^-2 - (2 sigma_b)^-2)^-1/2 when
        adaptive (:func:`fedjax_dp.privacy.adaptive_clip.update_noise_multiplier`)."""
        if self.adaptive is None:
            return self.noise_multiplier
        return adaptive_lib.update_noise_multiplier(
            self.noise_multiplier, self.adaptive.count_std(self.expected_cohort(num_agents)))

    @property
    def l2_sensitivity(self) -> float | None:
        """S, the L2 sensitivity the noise is scaled to (``noise_sensitivity`` or ``clip_norm``)."""
        return self.clip_norm if self.noise_sensitivity is None else self.noise_sensitivity

    @property
    def noise_std(self) -> float:
        """The std of the noise on the sum, ``z S`` (0 without noise)."""
        return self.noise_multiplier * self.l2_sensitivity if self.noise_multiplier else 0.0
