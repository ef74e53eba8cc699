"""Stacked agents: N agents' ragged local datasets as arrays with a leading agent axis.

Layout (the contract every algorithm relies on)::

    x      [N, n_max, *feature_shape]   float   agent i's records in rows [0, counts[i])
    y      [N, n_max]                   int32   labels (0 in padded rows)
    mask   [N, n_max]                   bool    True exactly for rows < counts[i]
    counts [N]                          int32   number of real records per agent

Real records always come first and padding last, so "draw a uniformly random real record" is
``randint(0, counts[i])`` and "is this row real" is ``mask``. Padded rows hold zeros and must never
contribute to a loss, a vote or a neighbour search: every consumer multiplies by or selects on
``mask``.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.core import validation


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class StackedData:
    """Padded local datasets of N agents (a pytree; every leaf has leading axis N)."""

    x: jax.Array       # [N, n_max, *feature_shape]
    y: jax.Array       # [N, n_max]
    mask: jax.Array    # [N, n_max]
    counts: jax.Array  # [N]

    @property
    def num_agents(self) -> int:
        return int(self.x.shape[0])

    @property
    def max_size(self) -> int:
        return int(self.x.shape[1])

    @property
    def feature_shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[2:])

    def agent(self, i: int) -> "StackedData":
        """Agent ``i`` alone, as a one-agent StackedData (for loops in tests and debugging)."""
        return jax.tree.map(lambda a: a[i:i + 1], self)

    def local(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Agent ``i``'s real records (unpadded) as host arrays ``(x [n_i, ...], y [n_i])``."""
        n = int(self.counts[i])
        return np.asarray(self.x[i, :n]), np.asarray(self.y[i, :n])

    def take(self, agent_indices) -> "StackedData":
        """The sub-population of the given agents (gather on the agent axis)."""
        idx = jnp.asarray(agent_indices)
        return jax.tree.map(lambda a: a[idx], self)


def from_ragged(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray], *,
                pad_to: int | None = None, dtype=np.float32,
                allow_empty: bool = False) -> StackedData:
    """Stack a list of per-agent arrays (ragged lengths) into a padded :class:`StackedData`.

    Args:
      xs: N arrays ``[n_i, *feature_shape]`` (same feature shape for all agents).
      ys: N integer label arrays ``[n_i]``.
      pad_to: common length (default: the largest ``n_i``); must be ``>= max n_i``.
      allow_empty: accept agents with no records (they carry an all-False mask).
    """
    if len(xs) == 0:
        raise ValueError("xs must hold at least one agent, got an empty list")
    validation.check_same_length(("xs", "ys"), xs, ys)
    xs = [validation.check_finite_array(f"xs[{i}]", x) for i, x in enumerate(xs)]
    ys = [np.asarray(y) for y in ys]
    feature_shape = xs[0].shape[1:]
    for i, (x, y) in enumerate(zip(xs, ys)):
        if x.shape[1:] != feature_shape:
            raise ValueError(f"xs[{i}] has feature shape {x.shape[1:]}, expected {feature_shape} "
                             "(all agents must share one feature shape)")
        if y.ndim != 1 or y.shape[0] != x.shape[0]:
            raise ValueError(f"ys[{i}] must have shape [{x.shape[0]}] to match xs[{i}], "
                             f"got {y.shape}")
        if y.size and y.dtype.kind not in "iu":
            raise ValueError(f"ys[{i}] must hold integer labels, got dtype {y.dtype}")
        if x.shape[0] == 0 and not allow_empty:
            raise ValueError(f"agent {i} has no records; every agent needs at least one "
                             "(pass allow_empty=True to keep empty agents masked out)")
    counts = np.array([x.shape[0] for x in xs], dtype=np.int32)
    n_max = int(counts.max()) if pad_to is None else validation.check_int(
        "pad_to", pad_to, minimum=int(counts.max()))
    n_max = max(n_max, 1)
    num = len(xs)
    x_out = np.zeros((num, n_max) + tuple(feature_shape), dtype=dtype)
    y_out = np.zeros((num, n_max), dtype=np.int32)
    for i, (x, y) in enumerate(zip(xs, ys)):  # host-side construction, not a hot path
        x_out[i, :len(x)] = x
        y_out[i, :len(y)] = y
    mask = np.arange(n_max)[None, :] < counts[:, None]
    return StackedData(x=jnp.asarray(x_out), y=jnp.asarray(y_out), mask=jnp.asarray(mask),
                       counts=jnp.asarray(counts))


def from_partition(x: np.ndarray, y: np.ndarray, indices: Sequence[np.ndarray], **kwargs
                   ) -> StackedData:
    """Stack the agents of a partition: agent i holds ``x[indices[i]], y[indices[i]]``."""
    x = np.asarray(x)
    y = np.asarray(y)
    validation.check_same_length(("x", "y"), x, y)
    for i, idx in enumerate(indices):
        idx = np.asarray(idx)
        if idx.size and (idx.min() < 0 or idx.max() >= len(x)):
            raise ValueError(f"indices[{i}] must be in [0, {len(x) - 1}]")
    return from_ragged([x[np.asarray(i, dtype=np.int64)] for i in indices],
                       [y[np.asarray(i, dtype=np.int64)] for i in indices], **kwargs)
