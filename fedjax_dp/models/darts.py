"""DARTS search space (Liu et al. 2018) as pure functions: primitives, MixedOp, cells, the search
network, architecture variables, genotype derivation and the fixed network built from a genotype.

Used by DP-FNAS (dp-fnas paper, Sec. 2, Eq. 1-5). Layout follows DARTS' CIFAR search space:

* primitives (8): ``none``, ``max_pool_3x3``, ``avg_pool_3x3``, ``skip_connect``,
  ``sep_conv_3x3``, ``sep_conv_5x5``, ``dil_conv_3x3``, ``dil_conv_5x5`` (any subset may be used);
* MixedOp on an edge: ``o(x) = sum_k softmax(alpha_edge)_k * op_k(x)`` (paper Eq. after 2);
* cell: inputs ``s0`` (cell k-2) and ``s1`` (cell k-1), each preprocessed to C channels (1x1
  ReLU-conv-norm, or FactorizedReduce when the previous cell reduced); ``nodes`` intermediate
  nodes, node i = sum of MixedOps over all earlier states (``2 * nodes + nodes (nodes - 1) / 2``
  edges, 14 for 4 nodes); reduction cells use stride 2 on the edges from the two inputs; the cell
  output concatenates its nodes (``nodes * C`` channels);
* network: stem conv 3x3 (``stem_multiplier * C`` channels) + norm, ``cells`` cells with
  reductions at cells ``L // 3`` and ``2 L // 3`` (doubling C), global average pool, linear head;
* architecture variables ``alpha = {"normal": [E, P], "reduce": [E, P]}``, init ``1e-3 N(0, 1)``.

Normalisation. Batch norm mixes the examples of a batch, so a per-example gradient (and hence
per-example clipping, the sensitivity of DP-SGD) is undefined with it. Every norm here is
:func:`per_example_norm`: layer norm over ``(H, W, C)`` of ONE example, without affine
parameters or running statistics, identical in training and evaluation.

The search network is a :class:`SearchModel` (``init_weights(key) -> W``, ``init_alphas(key) ->
alpha``, ``apply(W, alpha, x) -> logits`` for one example), the fixed network a :class:`Model`."""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.core import validation
from fedjax_dp.models.classifiers import Model

Params = Any

#: The 8 DARTS primitives, in DARTS' order.
PRIMITIVES: tuple[str, ...] = ("none", "max_pool_3x3", "avg_pool_3x3", "skip_connect",
                               "sep_conv_3x3", "sep_conv_5x5", "dil_conv_3x3", "dil_conv_5x5")

__all__ = ["PRIMITIVES", "SearchSpace", "SearchModel", "Genotype", "num_edges",
           "reduction_cells", "per_example_norm", "search_network", "init_alphas",
           "derive_genotype", "random_genotype", "fixed_network", "check_primitives",
           "mixed_op_weights"]


# --------------------------------------------------------------------------- validation

def check_primitives(name: str, primitives: Sequence[str]) -> tuple[str, ...]:
    """A non-empty tuple of distinct known primitives with at least one that is not ``none``."""
    if isinstance(primitives, str) or not isinstance(primitives, (list, tuple)):
        raise ValueError(f"{name} must be a list of primitive names from {list(PRIMITIVES)}, "
                         f"got {primitives!r}")
    prims = tuple(primitives)
    for p in prims:
        if p not in PRIMITIVES:
            raise ValueError(f"{name} has unknown primitive {p!r}; allowed: {list(PRIMITIVES)}")
    if len(set(prims)) != len(prims):
        raise ValueError(f"{name} must not repeat a primitive, got {list(prims)}")
    if not [p for p in prims if p != "none"]:
        raise ValueError(f"{name} needs at least one primitive other than 'none', got "
                         f"{list(prims)}")
    return prims


@dataclasses.dataclass(frozen=True)
class SearchSpace:
    """Size of a DARTS search space (hashable: compiled functions are cached on it).

    nodes: intermediate nodes per cell (>= 1); channels: C of the first cells (>= 1);
    cells: number of cells L (>= 1); primitives: the candidate operations;
    stem_multiplier: stem channels = stem_multiplier * C (DARTS: 3).
    """

    nodes: int = 4
    channels: int = 4
    cells: int = 3
    primitives: tuple[str, ...] = PRIMITIVES
    stem_multiplier: int = 3

    def __post_init__(self):
        validation.check_int("nodes", self.nodes, minimum=1)
        validation.check_int("channels", self.channels, minimum=1)
        validation.check_int("cells", self.cells, minimum=1)
        validation.check_int("stem_multiplier", self.stem_multiplier, minimum=1)
        object.__setattr__(self, "primitives", check_primitives("primitives", self.primitives))

    @property
    def num_edges(self) -> int:
        return num_edges(self.nodes)


def num_edges(nodes: int) -> int:
    """Edges of a cell with ``nodes`` intermediate nodes: ``sum_i (i + 2) = 2n + n(n-1)/2``."""
    return 2 * nodes + nodes * (nodes - 1) // 2


def reduction_cells(cells: int) -> tuple[int, ...]:
    """Indices of the reduction cells: ``{L // 3, 2 L // 3}`` (DARTS)."""
    return tuple(sorted({cells // 3, 2 * cells // 3}))


# --------------------------------------------------------------------------- primitives
# Pure JAX on ONE example ``x [H, W, C]``: convolutions are sums of shifted strided slices
# (depthwise) and matmuls (1x1), so the network compiles quickly on the CPU and ``vmap`` over
# examples (per-example gradients) or edges gives plain batched matmuls and elementwise ops
# instead of grouped convolutions (measured: XLA's CPU grouped-convolution path compiled a
# 3-cell search network for ~280 s and ran per-example gradients 7x slower than a batch).

def per_example_norm(x: jax.Array, eps: float = 1e-5) -> jax.Array:
    """Layer norm of ONE example ``x [H, W, C]`` over all its entries; no affine, no running
    statistics (identical in training and evaluation, independent of other examples)."""
    mean = jnp.mean(x)
    var = jnp.mean(jnp.square(x - mean))
    return (x - mean) * jax.lax.rsqrt(var + eps)


def _out_size(n: int, stride: int) -> int:
    return (n - 1) // stride + 1                             # ceil(n / stride)


@functools.lru_cache(maxsize=256)
def _patch_index(h: int, w: int, k: int, stride: int, dilation: int) -> np.ndarray:
    """Static gather indices ``[H' W', k k]`` into the zero-padded, flattened image."""
    p = dilation * (k - 1) // 2
    wp = w + 2 * p
    ho, wo = _out_size(h, stride), _out_size(w, stride)
    rows = (np.arange(ho) * stride)[:, None, None, None] + (np.arange(k) * dilation)[None, None, :,
                                                                                      None]
    cols = (np.arange(wo) * stride)[None, :, None, None] + (np.arange(k) * dilation)[None, None,
                                                                                      None, :]
    return (rows * wp + cols).reshape(ho * wo, k * k).astype(np.int32)


def _patches(x: jax.Array, k: int, stride: int, dilation: int = 1, pad_value: float = 0.0
             ) -> jax.Array:
    """The k x k neighbourhoods of every output pixel ('same' padding): ``[H', W', k k, C]``.

    One static gather (its gradient one scatter-add): compiles in a fraction of the time of
    k*k shifted slices and vmaps over examples and edges into one batched gather.
    """
    h, w, c = x.shape
    p = dilation * (k - 1) // 2
    xp = jnp.pad(x, ((p, p), (p, p), (0, 0)), constant_values=pad_value)
    idx = _patch_index(h, w, k, stride, dilation)
    out = xp.reshape(-1, c)[idx]                                       # [H' W', k k, C]
    return out.reshape(_out_size(h, stride), _out_size(w, stride), k * k, c)


def depthwise_conv(x: jax.Array, w: jax.Array, stride: int = 1, dilation: int = 1) -> jax.Array:
    """Depthwise k x k conv, 'same' padding: ``x [H, W, C]``, ``w [k, k, C]`` -> ``[H', W', C]``."""
    k = w.shape[0]
    return jnp.einsum("hwpc,pc->hwc", _patches(x, k, stride, dilation), w.reshape(k * k, -1))


def conv(x: jax.Array, w: jax.Array, stride: int = 1) -> jax.Array:
    """Dense k x k conv, 'same' padding: ``x [H, W, C]``, ``w [k, k, C, F]`` -> ``[H', W', F]``."""
    k = w.shape[0]
    return jnp.einsum("hwpc,pcf->hwf", _patches(x, k, stride), w.reshape(k * k, *w.shape[2:]))


def _pool(kind: str, x: jax.Array, stride: int) -> jax.Array:
    """3x3 max / average pool, padding 1 (the average excludes the padding)."""
    if kind == "max":
        return jnp.max(_patches(x, 3, stride, pad_value=-jnp.inf), axis=2)
    total = jnp.sum(_patches(x, 3, stride), axis=2)
    count = jnp.sum(_patches(jnp.ones(x.shape[:2] + (1,), x.dtype), 3, stride), axis=2)
    return total / count


def _normal(key, shape, fan_in):
    """LeCun normal init: ``N(0, 1 / fan_in)``."""
    return jax.random.normal(key, shape) / np.sqrt(fan_in)


def _init_op(key, name: str, c: int, stride: int) -> dict:
    """Parameters of primitive ``name`` (C -> C channels); empty for parameter-free ones."""
    ks = jax.random.split(key, 4)
    if name.startswith("sep_conv_"):
        k = int(name[-1])
        return {"dw1": _normal(ks[0], (k, k, c), k * k), "pw1": _normal(ks[1], (c, c), c),
                "dw2": _normal(ks[2], (k, k, c), k * k), "pw2": _normal(ks[3], (c, c), c)}
    if name.startswith("dil_conv_"):
        k = int(name[-1])
        return {"dw": _normal(ks[0], (k, k, c), k * k), "pw": _normal(ks[1], (c, c), c)}
    if name == "skip_connect" and stride == 2:
        return _init_fr(key, c, c)
    return {}


def _init_fr(key, c_in: int, c_out: int) -> dict:
    ka, kb = jax.random.split(key)
    half = c_out // 2
    out = {"a": _normal(ka, (c_in, c_out - half), c_in)}
    if half:
        out["b"] = _normal(kb, (c_in, half), c_in)
    return out


def factorized_reduce(p: dict, x: jax.Array) -> jax.Array:
    """Halve H and W: ReLU, two 1x1 stride-2 convs (the second shifted by one pixel), concat,
    norm. The shifted view is zero-padded at the end, so both have ``ceil(H / 2)`` rows."""
    x = jax.nn.relu(x)
    out = [x[::2, ::2] @ p["a"]]
    if "b" in p:
        shifted = jnp.pad(x[1:, 1:], ((0, 1), (0, 1), (0, 0)))
        out.append(shifted[::2, ::2] @ p["b"])
    return per_example_norm(jnp.concatenate(out, axis=-1))


def _init_rcn(key, c_in: int, c_out: int) -> dict:
    return {"w": _normal(key, (c_in, c_out), c_in)}


def relu_conv_norm(p: dict, x: jax.Array) -> jax.Array:
    """ReLU, 1x1 conv, norm (DARTS' ReLUConvBN preprocessing with a per-example norm)."""
    return per_example_norm(jax.nn.relu(x) @ p["w"])


def apply_op(name: str, p: dict, x: jax.Array, stride: int, *, mixed: bool) -> jax.Array:
    """Primitive ``name`` with parameters ``p`` on ``x [H, W, C]`` -> ``[ceil(H/s), ceil(W/s), C]``.

    sep_conv k: (ReLU, depthwise k, 1x1, norm) twice, the second at stride 1; dil_conv k: ReLU,
    depthwise k dilation 2, 1x1, norm; pools 3x3 pad 1 (followed by a norm inside a MixedOp,
    DARTS' ``BN(affine=False)``); skip at stride 2 is FactorizedReduce; none is zeros.
    """
    if name == "none":
        return jnp.zeros_like(x[::stride, ::stride])
    if name in ("max_pool_3x3", "avg_pool_3x3"):
        y = _pool(name[:3], x, stride)
        return per_example_norm(y) if mixed else y
    if name == "skip_connect":
        return x if stride == 1 else factorized_reduce(p, x)
    if name.startswith("sep_conv_"):
        y = depthwise_conv(jax.nn.relu(x), p["dw1"], stride)
        y = per_example_norm(y @ p["pw1"])
        y = depthwise_conv(jax.nn.relu(y), p["dw2"], 1)
        return per_example_norm(y @ p["pw2"])
    if name.startswith("dil_conv_"):
        y = depthwise_conv(jax.nn.relu(x), p["dw"], stride, dilation=2)
        return per_example_norm(y @ p["pw"])
    raise ValueError(f"primitive must be one of {list(PRIMITIVES)}, got {name!r}")


def mixed_op_weights(alpha: jax.Array) -> jax.Array:
    """MixedOp weights of every edge: ``softmax(alpha, -1)``, rows sum to one. ``[E, P]``."""
    return jax.nn.softmax(alpha, axis=-1)


def init_mixed(key, primitives: tuple[str, ...], c: int, stride: int) -> dict:
    """Initial parameters of one MixedOp edge: ``{primitive name: its op's params}``."""
    keys = jax.random.split(key, len(primitives))
    return {name: _init_op(k, name, c, stride) for k, name in zip(keys, primitives)}


def mixed_op(primitives: tuple[str, ...], stride: int, p: dict, x: jax.Array,
             weights: jax.Array) -> jax.Array:
    """MixedOp (paper Sec. 2): ``sum_k weights[k] op_k(x)``, ``weights = softmax(alpha_edge)``."""
    out = 0.0
    for w, name in zip(weights, primitives):
        out = out + w * apply_op(name, p[name], x, stride, mixed=True)
    return out


def _edge_offset(i: int) -> int:
    """Index of the first incoming edge of node i: ``sum_{m < i} (m + 2)``."""
    return 2 * i + i * (i - 1) // 2


def _stacked(init, key, n: int):
    """``n`` independent parameter sets stacked on a leading axis (edges of one node)."""
    return jax.vmap(init)(jax.random.split(key, n))


def _plan(cells: int, channels: int, stem_multiplier: int, concat_len: int):
    """Per cell: ``(C_prev_prev, C_prev, C, reduction, reduction_prev)``; the last cell's width."""
    reductions = reduction_cells(cells)
    c_pp = c_p = stem_multiplier * channels
    c, red_prev, plan = channels, False, []
    for i in range(cells):
        red = i in reductions
        c = 2 * c if red else c
        plan.append((c_pp, c_p, c, red, red_prev))
        c_pp, c_p, red_prev = c_p, concat_len * c, red
    return plan, c_p


def _init_pre(key, c_pp: int, c_p: int, c: int, red_prev: bool) -> dict:
    k0, k1 = jax.random.split(key)
    return {"pre0": _init_fr(k0, c_pp, c) if red_prev else _init_rcn(k0, c_pp, c),
            "pre1": _init_rcn(k1, c_p, c)}


def _preprocess(cp: dict, s0, s1, red_prev: bool):
    s0 = factorized_reduce(cp["pre0"], s0) if red_prev else relu_conv_norm(cp["pre0"], s0)
    return s0, relu_conv_norm(cp["pre1"], s1)


def _init_stem_head(key, c_in: int, c_stem: int, c_last: int, num_classes: int) -> tuple:
    ks, kh = jax.random.split(key)
    return (_normal(ks, (3, 3, c_in, c_stem), 9 * c_in),
            {"w": _normal(kh, (c_last, num_classes), c_last), "b": jnp.zeros((num_classes,))})


def _init_search_weights(key, space: SearchSpace, c_in: int, num_classes: int) -> dict:
    n, prims = space.nodes, space.primitives
    plan, c_last = _plan(space.cells, space.channels, space.stem_multiplier, n)
    k_sh, *k_cells = jax.random.split(key, space.cells + 1)
    stem, head = _init_stem_head(k_sh, c_in, space.stem_multiplier * space.channels, c_last,
                                 num_classes)
    cells = []
    for kc, (c_pp, c_p, c, red, red_prev) in zip(k_cells, plan):
        k_pre, k_in, *k_inner = jax.random.split(kc, n + 2)
        stride = 2 if red else 1
        cp = _init_pre(k_pre, c_pp, c_p, c, red_prev)
        # input edges of all nodes: [n, 2, ...]; node i's edges from nodes m < i: [i, ...]
        cp["input"] = jax.vmap(lambda k: _stacked(lambda kk: init_mixed(kk, prims, c, stride),
                                                  k, 2))(jax.random.split(k_in, n))
        cp["inner"] = [_stacked(lambda kk: init_mixed(kk, prims, c, 1), k_inner[i], i)
                       for i in range(1, n)]
        cells.append(cp)
    return {"stem": stem, "cells": cells, "head": head}


def _search_cell(space: SearchSpace, cp: dict, s0, s1, weights, red: bool, red_prev: bool):
    """One search cell on one example; ``weights [E, P]`` (softmax of the cell type's alpha).

    The MixedOps of the 2 input edges of every node run as one ``vmap`` (they share s0, s1), and
    node i's edges from earlier nodes as one ``vmap`` over them: a cell compiles ``nodes`` MixedOp
    instances instead of one per edge, with exactly the DARTS computation."""
    n, prims = space.nodes, space.primitives
    s0, s1 = _preprocess(cp, s0, s1, red_prev)
    inputs = jnp.stack([s0, s1])                                        # [2, H, W, C]
    idx = np.array([[_edge_offset(i), _edge_offset(i) + 1] for i in range(n)])   # [n, 2]
    stride = 2 if red else 1
    edge = functools.partial(mixed_op, prims, stride)
    per_node = jax.vmap(jax.vmap(edge, in_axes=(0, 0, 0)), in_axes=(0, None, 0))
    base = per_node(cp["input"], inputs, weights[idx]).sum(axis=1)     # [n, H', W', C]
    inner = jax.vmap(functools.partial(mixed_op, prims, 1), in_axes=(0, 0, 0))
    nodes = []
    for i in range(n):
        node = base[i]
        if i:
            start = _edge_offset(i) + 2
            node = node + inner(cp["inner"][i - 1], jnp.stack(nodes),
                                weights[start:start + i]).sum(axis=0)
        nodes.append(node)
    return jnp.concatenate(nodes, axis=-1)                              # [H', W', n C]


def _head(p: dict, s: jax.Array) -> jax.Array:
    return jnp.mean(s, axis=(0, 1)) @ p["w"] + p["b"]                   # [num_classes]


def _search_apply(space: SearchSpace, weights: dict, alpha: dict, x: jax.Array) -> jax.Array:
    """Logits of the search network for ONE example ``x [H, W, C_in]``."""
    w_normal = mixed_op_weights(alpha["normal"])                        # [E, P]
    w_reduce = mixed_op_weights(alpha["reduce"])                        # [E, P]
    s0 = s1 = per_example_norm(conv(x, weights["stem"]))
    plan, _ = _plan(space.cells, space.channels, space.stem_multiplier, space.nodes)
    for cp, (_, _, _, red, red_prev) in zip(weights["cells"], plan):
        out = _search_cell(space, cp, s0, s1, w_reduce if red else w_normal, red, red_prev)
        s0, s1 = s1, out
    return _head(weights["head"], s1)


class SearchModel(NamedTuple):
    """The search network as pure functions of one example.

    init_weights(key) -> W; init_alphas(key) -> {"normal": [E, P], "reduce": [E, P]}; apply(W,
    alpha, x [*feature_shape]) -> logits [num_classes]."""

    init_weights: Callable[[jax.Array], Params]
    init_alphas: Callable[[jax.Array], dict]
    apply: Callable[[Params, dict, jax.Array], jax.Array]
    space: SearchSpace
    feature_shape: tuple[int, ...]
    num_classes: int

    def logits(self, weights: Params, alpha: dict, x: jax.Array) -> jax.Array:
        """Batched apply: ``x [B, *feature_shape] -> [B, num_classes]``."""
        return jax.vmap(self.apply, in_axes=(None, None, 0))(weights, alpha, x)

    def as_model(self) -> Model:
        """The search network as a :class:`Model` over ``params = {"w": W, "alpha": alpha}``."""
        def init(key):
            kw, ka = jax.random.split(key)
            return {"w": self.init_weights(kw), "alpha": self.init_alphas(ka)}

        return Model(init=init, apply=lambda p, x: self.apply(p["w"], p["alpha"], x),
                     name="darts_search", feature_shape=self.feature_shape,
                     num_classes=self.num_classes)


def _check_image(feature_shape, num_classes) -> tuple[int, ...]:
    """The image shape ``(H, W, C)`` the network reads: an image ``[H, W, C]`` as it is, a
    feature vector ``[D]`` as a ``1 x D x 1`` image (a row of pixels)."""
    shape = tuple(int(s) for s in feature_shape)
    if len(shape) not in (1, 3) or any(s < 1 for s in shape):
        raise ValueError(f"feature_shape must be an image shape [H, W, channels] or a feature "
                         f"vector [D] of positive sizes, got {shape}")
    validation.check_int("num_classes", num_classes, minimum=2)
    return (1, shape[0], 1) if len(shape) == 1 else shape


def _on_image(fn: Callable, image: tuple[int, ...]) -> Callable:
    """``fn(*args, x)`` with the example ``x [*feature_shape]`` reshaped to ``image``."""
    def apply(*args):
        *rest, x = args
        return fn(*rest, jnp.reshape(x, image))
    return apply


def init_alphas(key: jax.Array, space: SearchSpace) -> dict:
    """Architecture variables ``1e-3 * N(0, 1)``: ``{"normal": [E, P], "reduce": [E, P]}``."""
    kn, kr = jax.random.split(key)
    shape = (space.num_edges, len(space.primitives))
    return {"normal": 1e-3 * jax.random.normal(kn, shape),
            "reduce": 1e-3 * jax.random.normal(kr, shape)}


@functools.lru_cache(maxsize=32)
def search_network(space: SearchSpace, feature_shape: Sequence[int], num_classes: int
                   ) -> SearchModel:
    """The DARTS search network of ``space`` for images ``feature_shape = (H, W, C_in)`` (or
    feature vectors ``(D,)``, read as ``1 x D x 1`` images).

    Cached: equal arguments give the same :class:`SearchModel` (so compiled functions keyed on it
    are shared).
    """
    if not isinstance(space, SearchSpace):
        raise ValueError(f"space must be a SearchSpace, got {type(space).__name__}")
    shape = _check_image(tuple(feature_shape), num_classes)
    return SearchModel(
        init_weights=lambda key: _init_search_weights(key, space, shape[-1], num_classes),
        init_alphas=lambda key: init_alphas(key, space),
        apply=_on_image(functools.partial(_search_apply, space), shape),
        space=space, feature_shape=tuple(int(s) for s in feature_shape),
        num_classes=num_classes)


# --------------------------------------------------------------------------- genotypes

class Genotype(NamedTuple):
    """A discrete architecture: per cell type, for each node i two ``(op, input)`` pairs.

    ``input`` j < i + 2 indexes the cell's states (0: s0, 1: s1, 2 + m: node m). ``*_concat`` lists
    the states concatenated into the cell output (all intermediate nodes)."""

    normal: tuple[tuple[str, int], ...]
    normal_concat: tuple[int, ...]
    reduce: tuple[tuple[str, int], ...]
    reduce_concat: tuple[int, ...]

    @property
    def nodes(self) -> int:
        return len(self.normal) // 2

    def to_json(self) -> dict:
        return {"normal": [list(e) for e in self.normal], "normal_concat": list(self.normal_concat),
                "reduce": [list(e) for e in self.reduce], "reduce_concat": list(self.reduce_concat)}

    @classmethod
    def from_json(cls, data: dict | str) -> "Genotype":
        if isinstance(data, str):        # a config's string: data, depth-bounded
            from fedjax_dp.core import files
            data = files.parse_json(data, what="a genotype's JSON", max_depth=8)
        g = cls(normal=tuple((str(o), int(j)) for o, j in data["normal"]),
                normal_concat=tuple(int(i) for i in data["normal_concat"]),
                reduce=tuple((str(o), int(j)) for o, j in data["reduce"]),
                reduce_concat=tuple(int(i) for i in data["reduce_concat"]))
        check_genotype(g)
        return g


def check_genotype(genotype: Genotype) -> Genotype:
    """Each cell: 2 edges per node, inputs j < i + 2, known non-``none`` primitives."""
    for name in ("normal", "reduce"):
        edges = getattr(genotype, name)
        if len(edges) == 0 or len(edges) % 2:
            raise ValueError(f"genotype.{name} must hold two (op, input) pairs per node, got "
                             f"{len(edges)} pairs")
        for k, (op, j) in enumerate(edges):
            if op not in PRIMITIVES or op == "none":
                raise ValueError(f"genotype.{name}[{k}] has op {op!r}; allowed: "
                                 f"{[p for p in PRIMITIVES if p != 'none']}")
            if not 0 <= j < k // 2 + 2:
                raise ValueError(f"genotype.{name}[{k}] input must be in [0, {k // 2 + 1}], "
                                 f"got {j}")
    if len(genotype.normal) != len(genotype.reduce):
        raise ValueError("genotype.normal and genotype.reduce must have the same node count")
    return genotype


def _parse_cell(alpha: np.ndarray, nodes: int, primitives: tuple[str, ...]
                ) -> tuple[tuple[str, int], ...]:
    """DARTS' genotype rule for one cell from its weights ``w = softmax(alpha) [E, P]``."""
    w = np.asarray(jax.nn.softmax(jnp.asarray(alpha, jnp.float32), axis=-1), np.float64)
    keep = np.array([p != "none" for p in primitives])
    candidates = np.where(keep)[0]
    out, start = [], 0
    for i in range(nodes):
        rows = w[start:start + i + 2][:, candidates]          # [i + 2, P'] non-none weights
        strength = rows.max(axis=1)                           # best non-none op of each edge
        edges = np.argsort(-strength, kind="stable")[:2]      # top-2 incoming edges
        for j in sorted(int(e) for e in edges):
            out.append((primitives[int(candidates[int(np.argmax(rows[j]))])], j))
        start += i + 2
    return tuple(out)


def derive_genotype(alpha: dict, space: SearchSpace) -> Genotype:
    """The discrete cell of DARTS (paper Sec. 2: "operations with top-K largest AVs").

    For each node i, among its ``i + 2`` incoming edges keep the 2 whose strongest non-``none``
    softmax weight is largest (ties: lower input index), each with its argmax non-``none`` op.
    """
    concat = tuple(range(2, 2 + space.nodes))
    normal = _parse_cell(np.asarray(alpha["normal"]), space.nodes, space.primitives)
    reduce = _parse_cell(np.asarray(alpha["reduce"]), space.nodes, space.primitives)
    return Genotype(normal=normal, normal_concat=concat, reduce=reduce, reduce_concat=concat)


def random_genotype(seed: int | np.random.Generator, nodes: int,
                    primitives: Sequence[str] = PRIMITIVES) -> Genotype:
    """A uniformly random genotype of the same size: per node two distinct inputs, random ops."""
    validation.check_int("nodes", nodes, minimum=1)
    ops = [p for p in check_primitives("primitives", primitives) if p != "none"]
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)

    def cell():
        out = []
        for i in range(nodes):
            for j in sorted(rng.choice(i + 2, size=2, replace=False).tolist()):
                out.append((ops[int(rng.integers(len(ops)))], int(j)))
        return tuple(out)

    concat = tuple(range(2, 2 + nodes))
    return Genotype(normal=cell(), normal_concat=concat, reduce=cell(), reduce_concat=concat)


def _init_fixed(key, genotype: Genotype, c_in: int, num_classes: int, channels: int,
                cells: int, stem_multiplier: int) -> dict:
    n = genotype.nodes
    plan, c_last = _plan(cells, channels, stem_multiplier, len(genotype.normal_concat))
    k_sh, *k_cells = jax.random.split(key, cells + 1)
    stem, head = _init_stem_head(k_sh, c_in, stem_multiplier * channels, c_last, num_classes)
    out = []
    for kc, (c_pp, c_p, c, red, red_prev) in zip(k_cells, plan):
        edges = genotype.reduce if red else genotype.normal
        k_pre, *k_ops = jax.random.split(kc, 2 * n + 1)
        cp = _init_pre(k_pre, c_pp, c_p, c, red_prev)
        cp["ops"] = [_init_op(k, op, c, 2 if red and j < 2 else 1)
                     for k, (op, j) in zip(k_ops, edges)]
        out.append(cp)
    return {"stem": stem, "cells": out, "head": head}


def _fixed_apply(genotype: Genotype, channels: int, cells: int, stem_multiplier: int,
                 params: dict, x: jax.Array) -> jax.Array:
    """Logits of the genotype's network for ONE example: node i = op_a(h_a) + op_b(h_b)."""
    plan, _ = _plan(cells, channels, stem_multiplier, len(genotype.normal_concat))
    s0 = s1 = per_example_norm(conv(x, params["stem"]))
    for cp, (_, _, _, red, red_prev) in zip(params["cells"], plan):
        edges, concat = (genotype.reduce, genotype.reduce_concat) if red else \
            (genotype.normal, genotype.normal_concat)
        states = list(_preprocess(cp, s0, s1, red_prev))
        for i in range(len(edges) // 2):
            node = 0.0
            for k in (2 * i, 2 * i + 1):
                op, j = edges[k]
                node = node + apply_op(op, cp["ops"][k], states[j], 2 if red and j < 2 else 1,
                                       mixed=False)
            states.append(node)
        s0, s1 = s1, jnp.concatenate([states[i] for i in concat], axis=-1)
    return _head(params["head"], s1)


@functools.lru_cache(maxsize=64)
def fixed_network(genotype: Genotype, feature_shape: Sequence[int], num_classes: int, *,
                  channels: int = 4, cells: int = 3, stem_multiplier: int = 3) -> Model:
    """The network of ``genotype`` for retraining from scratch, as a :class:`Model` (cached)."""
    check_genotype(genotype)
    validation.check_int("channels", channels, minimum=1)
    validation.check_int("cells", cells, minimum=1)
    validation.check_int("stem_multiplier", stem_multiplier, minimum=1)
    shape = _check_image(tuple(feature_shape), num_classes)
    return Model(init=lambda key: _init_fixed(key, genotype, shape[-1], num_classes, channels,
                                              cells, stem_multiplier),
                 apply=_on_image(functools.partial(_fixed_apply, genotype, channels, cells,
                                                   stem_multiplier), shape),
                 name="darts_fixed", feature_shape=tuple(int(s) for s in feature_shape),
                 num_classes=num_classes)
