"""Noise: i.i.d. Gaussian / Laplace draws over a shape or a pytree, and the noisy release.

    release = (S + N(0, std^2 I)) / D                    (D a fixed denominator, never |batch|)

Keys: one key per random draw; a pytree gets one independent key per leaf (``jax.random.split``).
Noise scales are checked on the host when concrete: a negative, NaN or infinite value raises
``ValueError`` naming the parameter before any tracing (traced values are not checked).
"""
from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from fedjax_dp.core import rng, validation

__all__ = ["check_scale", "float_dtype", "gaussian_noise", "laplace_noise", "add_noise",
           "release"]


def check_scale(name: str, value: Any, *, positive: bool = False) -> None:
    """Check a noise scale on the host: finite and ``>= 0`` (``> 0`` if ``positive``).

    Tracers are skipped (they have no value yet); concrete arrays are checked elementwise."""
    if isinstance(value, jax.core.Tracer):
        return
    if isinstance(value, (jax.Array, np.ndarray)) and np.ndim(value) > 0:
        arr = validation.check_finite_array(name, value)
        if np.any(arr < 0) or (positive and np.any(arr == 0)):
            bound = "> 0" if positive else ">= 0"
            raise ValueError(f"{name} must be {bound} everywhere, got min {arr.min()!r}")
        return
    if isinstance(value, (jax.Array, np.ndarray)):
        value = np.asarray(value).item()
    check = validation.check_positive if positive else validation.check_nonnegative
    check(name, value, finite=True)


def _is_shape(x: Any) -> bool:
    if isinstance(x, bool):
        return False
    if isinstance(x, (int, np.integer)):
        return True
    return isinstance(x, (tuple, list)) and all(
        isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in x)


def float_dtype(dtype) -> Any:
    """``dtype`` if it is a float type, else JAX's default float type."""
    if dtype is not None and jnp.issubdtype(dtype, jnp.floating):
        return dtype
    return jnp.result_type(float)


_SAMPLERS = {"normal": jax.random.normal, "laplace": jax.random.laplace}


@functools.partial(jax.jit, static_argnames=("kind", "specs", "split"))
def _scaled_noise(key: jax.Array, scale, *, kind: str, specs: tuple, split: bool) -> list:
    """``scale *`` standard noise for each ``(shape, dtype)`` of ``specs`` (compiled per specs)."""
    sample = _SAMPLERS[kind]
    keys = jax.random.split(key, len(specs)) if split else [key]
    return [sample(k, shape, dtype) * jnp.asarray(scale, dtype)
            for k, (shape, dtype) in zip(keys, specs)]


def _noise_like(kind: str, key: jax.Array, shape_or_tree: Any, scale, dtype=None) -> Any:
    """``scale *`` standard noise: one array for a shape, a pytree of arrays for a pytree.

    A bare array (a single-leaf pytree) uses ``key`` directly; a pytree with several leaves gets one
    independent key per leaf (``jax.random.split``)."""
    key = rng.as_key(key)
    if _is_shape(shape_or_tree):
        shape = (int(shape_or_tree),) if isinstance(shape_or_tree, (int, np.integer)) \
            else tuple(int(d) for d in shape_or_tree)
        spec = (shape, jnp.dtype(float_dtype(dtype)))
        return _scaled_noise(key, scale, kind=kind, specs=(spec,), split=False)[0]
    leaves, treedef = jax.tree_util.tree_flatten(shape_or_tree)
    if not leaves:
        return shape_or_tree
    specs = tuple((tuple(jnp.shape(leaf)),
                   jnp.dtype(float_dtype(dtype if dtype is not None
                                         else getattr(leaf, "dtype", None))))
                  for leaf in leaves)
    bare = treedef.num_leaves == 1 and treedef.num_nodes == 1       # a bare array / scalar
    noise = _scaled_noise(key, scale, kind=kind, specs=specs, split=not bare)
    return jax.tree_util.tree_unflatten(treedef, noise)


def gaussian_noise(key: jax.Array, shape_or_tree: Any, std, *, dtype=None) -> Any:
    """Noise ``z ~ N(0, std^2 I)``, i.i.d. over every coordinate.

    ``shape_or_tree`` is either a shape (an int or a tuple/list of ints; the result is one array)
    or a pytree of arrays / ``jax.ShapeDtypeStruct`` (the result is a pytree of the same structure
    and shapes; float leaves keep their dtype, others get JAX's default float). Each leaf of a
    pytree draws from its own key (split from ``key``), so no two leaves share noise.

    ``std`` must be finite and ``>= 0`` (checked on the host unless traced)."""
    check_scale("std", std)
    return _noise_like("normal", key, shape_or_tree, std, dtype)


def laplace_noise(key: jax.Array, shape_or_tree: Any, scale, *, dtype=None) -> Any:
    """Noise i.i.d. ``Laplace(0, b)`` with ``b = scale``: density ``exp(-|x| / b) / (2 b)``.

    Variance ``2 b^2``. ``shape_or_tree`` as in :func:`gaussian_noise` (one key per leaf). ``scale``
    must be finite and ``>= 0``."""
    check_scale("scale", scale)
    return _noise_like("laplace", key, shape_or_tree, scale, dtype)


def add_noise(key: jax.Array, tree: Any, std, *, per_leaf: bool = False) -> Any:
    """``tree + N(0, std^2 I)`` over every coordinate.

    ``per_leaf=False``: ONE flat draw ``std * normal(key, [d])`` over the raveled tree (one
    PRNG call; compiles faster). ``per_leaf=True``: one key per leaf (:func:`gaussian_noise`
    of the tree). Both are i.i.d. ``N(0, std^2)`` per coordinate, in different streams."""
    if per_leaf:
        return jax.tree.map(jnp.add, tree, gaussian_noise(key, tree, std))
    flat, unravel = ravel_pytree(tree)
    return unravel(flat + gaussian_noise(key, flat.shape, std))


def release(key: jax.Array, total: Any, std, denominator, *, noise: bool = True,
            per_leaf: bool = False) -> Any:
    """``(S + N(0, std^2 I)) / D`` (``noise=False``: ``S / D``, the non-private baselines)."""
    if noise:
        total = add_noise(key, total, std, per_leaf=per_leaf)
    return jax.tree.map(lambda s: s / denominator, total)
