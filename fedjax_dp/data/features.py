"""Frozen feature maps fitted on PUBLIC data only, shared by every algorithm.

One module holds the fixed maps ``phi`` (voting-dpfl, Sec. 4.2 / Algorithm 3: kNN-DPFL votes on
"data-independent" features):

* ``identity``: ``phi(x) = flatten(x)``;
* ``random_projection``: ``phi(x) = flatten(x) @ G / sqrt(m)``, ``G ~ N(0, 1)^{D x m}`` drawn
  from a key (no data at all);
* ``pca``: ``phi(x) = (flatten(x) - mu) @ V_m``, ``mu`` the mean and ``V_m [D, m]`` the top
  ``m`` right singular vectors of the server's public split ``x_public - mu`` (its SVD);
* ``network`` (``data.features`` only): ``phi(x) = relu(flatten(x) @ W + b)``, the hidden layer
  of a one-hidden-layer MLP (width m) trained, without noise, on the LABELLED records of a
  DIFFERENT public dataset ``source`` (e.g. scikit-learn's ``digits`` for mnist5k, images resized
  to the task's size): a frozen network "pretrained" on disjoint public data, as the paper's
  ImageNet features (:func:`fit_network`).

Users: kNN-DPFL (``algorithm.feature_map``) maps the agents' records and the queries inside its
vote (:meth:`FeatureMap.apply`); ``data.features = {map = "pca", dim = 16}``
(:func:`apply_features`) maps EVERY split once before anything trains, so any algorithm with the
``logistic`` model trains a linear head on the frozen features.

Privacy. The map reads only the public split (``x_public``; ``y_public`` never), public in the
paper's threat model (voting-dpfl Sec. 3): it is a fixed pre-processing of each record, so every
algorithm's privacy accounting is unchanged."""
from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.core import validation
from fedjax_dp.data.dataset import Dataset
from fedjax_dp.data.streamed import StreamedDataset
from fedjax_dp.models import tasks as tasks_lib

FEATURE_MAPS = ("identity", "random_projection", "pca")
#: the maps ``data.features`` takes: :data:`FEATURE_MAPS` and ``network`` (:func:`fit_network`)
DATA_MAPS = FEATURE_MAPS + ("network",)
#: the keys of ``data.features`` (``{}``: no map, the raw features); ``source``, ``steps``,
#: ``learning_rate``: ``map = "network"`` only
OPTIONS = ("map", "dim", "seed", "source", "steps", "learning_rate")
NETWORK_OPTIONS = ("source", "steps", "learning_rate")


class NetworkMap(NamedTuple):
    """``phi(x) = relu(flatten(x) @ matrix + bias)`` (the hidden layer of :func:`fit_network`)."""

    kind: str
    matrix: np.ndarray            # [D, m]
    bias: np.ndarray              # [m]
    source: str

    @property
    def out_dim(self) -> int:
        return int(self.matrix.shape[1])

    def apply(self, x, lead: int) -> jax.Array:
        """``x [*lead_shape, *feature_shape] -> [*lead_shape, m]`` (jax, traceable)."""
        x = jnp.asarray(x, jnp.float32)
        flat = x.reshape(x.shape[:lead] + (-1,))
        return jax.nn.relu(flat @ jnp.asarray(self.matrix) + jnp.asarray(self.bias))

    def transform(self, x) -> np.ndarray:
        """The same map on the host (numpy, float32): ``x [n, *feature_shape] -> [n, m]``."""
        flat = np.asarray(x, np.float32).reshape(len(x), -1)
        return np.maximum(flat @ self.matrix + self.bias, 0.0).astype(np.float32)


def fit_network(x: np.ndarray, y: np.ndarray, num_classes: int, dim: int, key: jax.Array,
                steps: int = 500, learning_rate: float = 0.5, source: str = "") -> NetworkMap:
    """Train ``softmax(relu(x W + b) V + c)`` on labelled PUBLIC records ``(x [n, D], y [n])`` by
    full-batch gradient descent on the mean cross-entropy (``steps`` steps, step size
    ``learning_rate``; Glorot-normal W, V from ``key``, zero biases) and keep its hidden layer
    ``(W [D, m], b [m])`` as the frozen map. Deterministic given its arguments."""
    flat = jnp.asarray(np.asarray(x, np.float32).reshape(len(x), -1))     # [n, D]
    labels = jnp.asarray(y, jnp.int32)                                      # [n]
    d_in = flat.shape[1]
    k1, k2 = jax.random.split(key)
    params = {"w": jax.random.normal(k1, (d_in, dim)) * jnp.sqrt(2.0 / (d_in + dim)),
              "b": jnp.zeros((dim,)),
              "v": jax.random.normal(k2, (dim, num_classes)) * jnp.sqrt(2.0 / (dim + num_classes)),
              "c": jnp.zeros((num_classes,))}

    def loss(p):
        h = jax.nn.relu(flat @ p["w"] + p["b"])                             # [n, m]
        logp = jax.nn.log_softmax(h @ p["v"] + p["c"])                      # [n, C]
        return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=1))

    @jax.jit
    def train(p):
        def body(_, p):
            g = jax.grad(loss)(p)
            return jax.tree.map(lambda a, b: a - learning_rate * b, p, g)
        return jax.lax.fori_loop(0, steps, body, p)

    p = train(params)
    return NetworkMap("network", np.asarray(p["w"], np.float32), np.asarray(p["b"], np.float32),
                      source)


class FeatureMap(NamedTuple):
    """``phi(x) = (flatten(x) - mean) @ matrix`` (``matrix`` None: identity after flattening)."""

    kind: str
    mean: np.ndarray | None       # [D]
    matrix: np.ndarray | None     # [D, m]

    @property
    def out_dim(self) -> int | None:
        return None if self.matrix is None else int(self.matrix.shape[1])

    def apply(self, x, lead: int) -> jax.Array:
        """``x [*lead_shape, *feature_shape]`` (``lead`` leading axes) -> ``[*lead_shape, m]``
        (jax, traceable)."""
        x = jnp.asarray(x, jnp.float32)
        flat = x.reshape(x.shape[:lead] + (-1,))
        if self.mean is not None:
            flat = flat - jnp.asarray(self.mean, jnp.float32)
        if self.matrix is not None:
            flat = flat @ jnp.asarray(self.matrix, jnp.float32)
        return flat

    def transform(self, x) -> np.ndarray:
        """The same map on the host (numpy, float32): ``x [n, *feature_shape] -> [n, m]``."""
        flat = np.asarray(x, np.float32).reshape(len(x), -1)
        if self.mean is not None:
            flat = flat - self.mean.astype(np.float32)
        if self.matrix is not None:
            flat = flat @ self.matrix.astype(np.float32)
        return np.ascontiguousarray(flat, dtype=np.float32)


def fit_feature_map(kind: str, key: jax.Array, x_public, dim: int) -> FeatureMap:
    """A data-independent feature map (never fitted on private data).

    * ``identity``: flatten;
    * ``random_projection``: ``flatten(x) @ G / sqrt(dim)``, ``G ~ N(0, 1)^{D x dim}`` from ``key``;
    * ``pca``: centre with the mean of ``x_public`` and project on its top ``dim`` principal
      directions (SVD of the server's unlabelled public data).
    """
    validation.check_choice("feature_map", kind, FEATURE_MAPS)
    dim = validation.check_int("feature_dim", dim, minimum=1)
    x_public = validation.check_finite_array("x_public", x_public)
    flat = x_public.reshape(len(x_public), -1).astype(np.float64)          # [P, D]
    d_in = flat.shape[1]
    if kind == "identity":
        return FeatureMap("identity", None, None)
    if dim > d_in:
        raise ValueError(f"feature_dim must be <= the input dimension {d_in}, got {dim}")
    if kind == "random_projection":
        g = np.asarray(jax.random.normal(key, (d_in, dim), jnp.float32)) / math.sqrt(dim)
        return FeatureMap("random_projection", None, g.astype(np.float32))
    if dim > len(flat):
        raise ValueError(f"feature_dim must be <= the number of public records ({len(flat)}) "
                         f"for pca, got {dim}")
    mean = flat.mean(axis=0)
    _, _, vt = np.linalg.svd(flat - mean, full_matrices=False)             # vt [r, D]
    return FeatureMap("pca", mean.astype(np.float32), vt[:dim].T.astype(np.float32))


# --------------------------------------------------------------------------- data.features

def check_spec(name: str, value: Any) -> dict:
    """``data.features``: ``{}`` (no map) or ``{map = <DATA_MAPS>, dim = m >= 1, seed = s >= 0}``
    (``dim`` required unless ``map = "identity"``; ``seed`` (default 0) draws the random projection
    or the network's initialisation); ``map = "network"`` also takes ``source`` (a dataset name,
    required), ``steps`` (500) and ``learning_rate`` (0.5). Errors name ``<name>.<key>``."""
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be a table such as {{map = \"pca\", dim = 16}} ({{}}: the "
                         f"raw features), got {value!r}")
    validation.check_keys(name, value, OPTIONS, f"{list(OPTIONS)}")
    if not value:
        return {}
    if "map" not in value:
        raise ValueError(f"{name}.map is required (one of {list(FEATURE_MAPS)})")
    kind = validation.check_choice(f"{name}.map", value["map"], DATA_MAPS)
    out: dict = {"map": kind}
    if kind != "network":
        extra = sorted(set(value) & set(NETWORK_OPTIONS))
        if extra:
            raise ValueError(f"{[f'{name}.{k}' for k in extra]} apply to map = \"network\" "
                             f"only, not {kind!r}")
    else:
        if not isinstance(value.get("source"), str) or not value["source"]:
            raise ValueError(f"{name}.source is required for map = \"network\": a dataset name "
                             f"(a labelled public dataset disjoint from the agents', e.g. "
                             f"\"digits\"), got {value.get('source')!r}")
        out["source"] = value["source"]
        out["steps"] = validation.Int(1, 10 ** 6)(f"{name}.steps", value.get("steps", 500))
        out["learning_rate"] = validation.Float(0.0, 100.0, low_open=True)(
            f"{name}.learning_rate", value.get("learning_rate", 0.5))
    if "dim" in value:
        out["dim"] = validation.Int(1, validation.WIDTH_MAX)(f"{name}.dim", value["dim"])
    elif kind != "identity":
        raise ValueError(f"{name}.dim is required for map = {kind!r} (an integer >= 1)")
    if "seed" in value:
        out["seed"] = validation.Int(0, 2 ** 32 - 1)(f"{name}.seed", value["seed"])
    return out


def fit(spec: dict, x_public, where: str = "data.features") -> FeatureMap | NetworkMap:
    """The map of a checked ``data.features`` table, fitted on ``x_public`` only (the key of a
    random projection: ``jax.random.key(spec.get('seed', 0))``, the same for every run); for
    ``map = "network"`` trained on the labelled ``source`` dataset instead (:func:`network_map`)."""
    spec = check_spec(where, spec)
    key = jax.random.key(spec.get("seed", 0))
    if spec["map"] == "network":
        return network_map(spec, tuple(np.shape(x_public)[1:]), key, where)
    try:
        return fit_feature_map(spec["map"], key, x_public, spec.get("dim", 1))
    except ValueError as e:
        msg = str(e)
        if msg.startswith("feature_dim"):
            raise ValueError(f"{where}.dim{msg[len('feature_dim'):]}") from None
        raise


def network_map(spec: dict, feature_shape: tuple, key: jax.Array,
                where: str = "data.features") -> NetworkMap:
    """:func:`fit_network` on every split of the dataset ``spec['source']`` (train, public and
    test: all of it is public, and disjoint from the agents' data), its images resized to
    ``feature_shape`` when both are images ``(H, W, C)`` with the same C."""
    from fedjax_dp.data.sources import DATASETS, load_dataset, resize_images
    source = spec["source"]
    if source not in DATASETS:
        raise ValueError(f"{where}.source must be a dataset name such as \"digits\", got "
                         f"{source!r}")
    ds = load_dataset(source)
    x = np.concatenate([ds.x_train, ds.x_public, ds.x_test])
    y = np.concatenate([ds.y_train, ds.y_public, ds.y_test])
    if x.shape[1:] != tuple(feature_shape):
        if x.ndim == 4 and len(feature_shape) == 3 and x.shape[-1] == feature_shape[-1]:
            x = resize_images(x, tuple(feature_shape[:2]))
        else:
            raise ValueError(f"{where}.source {source!r} has feature shape {x.shape[1:]}, the "
                             f"task {tuple(feature_shape)} (only images are resized)")
    return fit_network(x, y, ds.num_classes, spec["dim"], key, spec["steps"],
                       spec["learning_rate"], source)


def apply_features(dataset: Dataset | StreamedDataset, phi: FeatureMap | NetworkMap
                   ) -> Dataset | StreamedDataset:
    """Every split of ``dataset`` mapped by ``phi`` (feature shape ``(m,)``); a streamed dataset
    stays streamed (each training block mapped when read). Labels, domains and the name's
    prefix are kept (name ``"<name>+<kind><m>"``)."""
    if isinstance(dataset.task, tasks_lib.NextToken):
        raise ValueError(f"data.features applies to classification data; {dataset.name!r} "
                         f"holds {type(dataset.task).__name__} records")
    m = phi.out_dim if phi.out_dim is not None else int(np.prod(dataset.feature_shape))
    name = f"{dataset.name}+{phi.kind}{m}"
    splits = dict(x_public=phi.transform(dataset.x_public), y_public=dataset.y_public,
                  x_test=phi.transform(dataset.x_test), y_test=dataset.y_test,
                  num_classes=dataset.num_classes, domain_train=dataset.domain_train)
    if isinstance(dataset, Dataset):
        return Dataset(name=name, x_train=phi.transform(dataset.x_train),
                       y_train=dataset.y_train, **splits)
    parent = dataset.blocks

    def blocks(size: int):
        for block in parent(size):
            yield phi.transform(block)                                   # [b, m]
    return StreamedDataset(name=name, y_train=dataset.y_train, blocks=blocks,
                           feature_shape=(m,), **splits)


def frozen(dataset: Dataset | StreamedDataset, spec: dict,
           where: str = "data.features") -> Dataset | StreamedDataset:
    """``dataset`` with ``data.features = spec`` applied (``{}``: unchanged): the map fitted on
    ``dataset.x_public`` only (:func:`fit`), then every split mapped (:func:`apply_features`)."""
    spec = check_spec(where, spec)
    if not spec:
        return dataset
    return apply_features(dataset, fit(spec, dataset.x_public, where))


