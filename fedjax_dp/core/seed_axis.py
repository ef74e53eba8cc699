"""A leading seed axis: S runs' pytrees shared when equal, stacked when they differ.

Several seeds of a sweep step together when each compiled call of one seed is ``jax.vmap``-ed
over a leading seed axis. What the seeds hold in common (the agents' data when the partition does
not depend on the seed, a public set, a feature map) is passed once, unbatched (``in_axes``
None); what differs (keys, parameters, data partitioned per seed) is stacked::

    share_or_stack([t_1, ..., t_S]) = (t_1, None)                 t_s all the same (or equal)
                                    = (stack(t_1, ..., t_S), 0)    otherwise
                                    = (None, None)                 layouts differ: no shared call

The pair is exactly what ``jax.vmap(fn, in_axes=(..., axis, ...))(..., tree, ...)`` needs."""
from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["layout", "same_layout", "share_or_stack", "stack_seeds", "unstack_seeds"]


def layout(tree: Any) -> tuple:
    """``(treedef, ((shape, dtype) per leaf))``: what must agree for trees to share a compiled
    call (hashable)."""
    return (jax.tree.structure(tree),
            tuple((tuple(np.shape(x)), str(getattr(x, "dtype", type(x))))
                  for x in jax.tree.leaves(tree)))


def same_layout(trees: Sequence[Any]) -> bool:
    """Whether ``trees`` have one structure and equal leaf shapes and dtypes."""
    return len({layout(t) for t in trees}) == 1


def share_or_stack(trees: Sequence[Any]) -> tuple[Any, int | None]:
    """``(tree, in_axis)`` for S seeds' pytrees: the first (axis None) when all are the same
    object (not compared: a host memory map is never read whole) or hold equal arrays, else
    the trees stacked on a new leading seed axis (axis 0); ``(None, None)`` when their
    structures, shapes or dtypes differ (they cannot share a compiled call; a tree that is None
    for every seed also gives ``(None, None)``)."""
    if not len(trees):
        raise ValueError("share_or_stack: trees must hold at least one seed's tree, got none")
    if all(t is trees[0] for t in trees[1:]):
        return trees[0], None
    if not same_layout(trees):
        return None, None
    leaves = [jax.tree.leaves(t) for t in trees]
    if all(all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(leaves[0], ls))
           for ls in leaves[1:]):
        return trees[0], None
    return stack_seeds(trees), 0


def stack_seeds(trees: Sequence[Any]) -> Any:
    """S pytrees of equal structure stacked on a new leading seed axis."""
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def unstack_seeds(tree: Any, num: int) -> tuple:
    """The inverse of :func:`stack_seeds`: ``num`` pytrees, seed s the slice ``[s]``."""
    return tuple(jax.tree.map(lambda x, s=s: x[s], tree) for s in range(num))
