"""Clipping stages: each agent's update bounded in L2 norm, the bound the noise is scaled to.

``none``      no clipping (FedAvg): no sensitivity, so no noise stage can follow.
``fixed``     ``Delta_i <- Delta_i min(1, S / ||Delta_i||_2)`` (:mod:`fedjax_dp.privacy.clipping`).
``adaptive``  the clip C_t follows a target quantile of the cohort's norms (Andrew et al.,
              NeurIPS 2021; :mod:`fedjax_dp.privacy.adaptive_clip`): each agent also contributes
              its centred unclipped bit ``b_i - 1/2`` (sensitivity 1/2), the cohort's sum is
              released with noise sigma_b, and C_{t+1} is a function of that release only. The
              count is a second Gaussian release per turn, of multiplier ``2 sigma_b``; the noise
              stage composes it with the update's (:meth:`count_multiplier`).

Either clip may weight agent i's clipped update by ``w_i = min(n_i / w-hat, 1) <= 1``
(``weight_cap``; McMahan et al. 2018's capped weights): the sensitivity stays S.
"""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from fedjax_dp.privacy import adaptive_clip as adaptive_lib
from fedjax_dp.privacy import clipping
from fedjax_dp.stages.base import Stage, register, requires

__all__ = ["Clipping", "NoClip", "FixedClip", "AdaptiveClip"]


class Clipping(Stage):
    """The clipping protocol. ``client(delta, norm, count, state)`` -> the agent's contribution
    (its clipped update, and under adaptive clipping ``(update, b - 1/2)``); ``server(...)``
    the state's next value from the released count; ``clip(state)`` the round's S."""

    KIND: ClassVar[str] = "clipping"
    weight_cap: float | None = None
    adaptive: ClassVar[bool] = False

    def init(self) -> Any:
        return ()

    def requirements(self):
        if self.weight_cap is None:
            return ()
        return (requires("server_update", lambda c: c["server_update"].denominator == "expected",
                         "capped weights (weight_cap) divide the sum by the fixed q W of McMahan "
                         "et al. 2018's weighted estimator (denominator \"expected\")"),)

    def clip(self, state: Any):
        return getattr(self, "norm", None)

    def range_bound(self) -> float | None:
        """The largest clip any round uses (secure aggregation's ring is sized by it)."""
        return getattr(self, "norm", None)

    def weight(self, count: jax.Array) -> jax.Array:
        """An agent's weight ``min(n_i / w-hat, 1)`` (1 without ``weight_cap``)."""
        if self.weight_cap is None:
            return jnp.float32(1.0)
        return jnp.minimum(count.astype(jnp.float32) / self.weight_cap, 1.0)

    def client(self, delta: Any, norm: jax.Array, count: jax.Array, state: Any) -> Any:
        clip = self.clip(state)
        if clip is not None:
            delta = clipping.clip_by_global_norm(delta, clip)[0]
        if self.weight_cap is not None:           # capped record weight: norm still <= S
            w = self.weight(count)
            delta = jax.tree.map(lambda d: d * w, delta)
        return delta

    def split(self, total: Any) -> tuple[Any, Any]:
        """``(update sum, count sum or None)`` of a summed contribution."""
        return total, None

    def count_std(self, expected_cohort: float) -> float | None:
        """sigma_b of the released count (None: no count is released)."""
        return None

    def count_multiplier(self, expected_cohort: float) -> float | None:
        """The count release's Gaussian multiplier ``2 sigma_b`` (sensitivity 1/2), or None."""
        return None

    def server(self, key, state, count_sum, denominator, count_std, *, noised: bool,
               released=None):
        """The clip's next state and metrics from the round's count (fixed: unchanged)."""
        return state, {}


@register
@dataclasses.dataclass(frozen=True)
class NoClip(Clipping):
    NAME: ClassVar[str] = "none"
    CONFIG: ClassVar[str] = 'algorithm.name = "fedavg"'
    SUMMARY: ClassVar[str] = "no clipping (FedAvg): no sensitivity, no noise"
    OPTIONS: ClassVar[dict] = {}
    weight_cap: float | None = None

    def requirements(self):
        return (requires("noise", lambda c: c["noise"].NAME == "none" or
                         c["noise"].sensitivity is not None,
                         "noise needs a bounded update (a clipping stage) to be scaled to "
                         "(only an audit's weakening states its own sensitivity)"),)


@register
@dataclasses.dataclass(frozen=True)
class FixedClip(Clipping):
    NAME: ClassVar[str] = "fixed"
    CONFIG: ClassVar[str] = 'algorithm.clip_norm = S'
    SUMMARY: ClassVar[str] = "clip each update to the global L2 norm S"
    OPTIONS: ClassVar[dict] = {"clip_norm": "S > 0", "weight_cap": "w-hat > 0 or none"}
    norm: float = 1.0
    weight_cap: float | None = None


@register
@dataclasses.dataclass(frozen=True)
class AdaptiveClip(Clipping):
    """Adaptive clipping of initial clip ``norm`` C_0 with the quantile tracker ``tracker``.
    State: ``{"clip_norm": C_t}``."""

    NAME: ClassVar[str] = "adaptive"
    CONFIG: ClassVar[str] = 'algorithm.adaptive_clip = true or {target_quantile = 0.5, ...}'
    SUMMARY: ClassVar[str] = ("clip C_t steered to a quantile by a noisy unclipped count "
                              "(Andrew et al. 2021)")
    OPTIONS: ClassVar[dict] = {"clip_norm": "C_0 > 0", **adaptive_lib.OPTIONS}
    adaptive: ClassVar[bool] = True
    norm: float = 1.0
    tracker: adaptive_lib.AdaptiveClip = adaptive_lib.AdaptiveClip()
    weight_cap: float | None = None

    def init(self) -> dict:
        return {"clip_norm": jnp.float32(self.norm)}

    def clip(self, state: dict):
        return state["clip_norm"]

    def range_bound(self) -> float | None:
        cap = self.tracker.max_clip_norm
        return None if cap is None else max(float(self.norm), float(cap))

    def client(self, delta, norm, count, state):
        clipped = super().client(delta, norm, count, state)
        return clipped, adaptive_lib.centred_unclipped(norm, state["clip_norm"])

    def split(self, total):
        return total

    def count_std(self, expected_cohort: float) -> float:
        return self.tracker.count_std(expected_cohort)

    def count_multiplier(self, expected_cohort: float) -> float:
        return 2.0 * self.count_std(expected_cohort)

    def server(self, key, state, count_sum, denominator, count_std, *, noised: bool,
               released=None):
        """C_{t+1} from the count; ``noised``: the count arrives noised (distributed noise
        added it inside the secure sum), so no central noise is drawn for it; ``released``
        False (an aborted distributed round): the clip stays."""
        clip = state["clip_norm"]
        new, fraction = adaptive_lib.next_clip_norm(key, clip, count_sum, denominator,
                                                    0.0 if noised else count_std, self.tracker)
        if released is not None:
            new = jnp.where(released, new, clip)
        return {"clip_norm": new}, {"clip_norm": clip, "unclipped_fraction": fraction}
