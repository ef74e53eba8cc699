"""Learners: train many independent classifiers at once and let them vote (FedKT's any classifier).

A learner trains ``A`` independent models and predicts with all of them::

    fit(key, data: StackedData [A, n_max, ...]) -> fitted        # model a on its own records
    fit_shared(key, x [Q, ...], y [A, Q], mask [A, Q]) -> fitted  # all models on one input set
    predict(fitted, x [M, ...]) -> int32 [A, M]                   # every model's class per row
    take(fitted, index) -> fitted of one model (a = index)

* :class:`JaxLearner` (the default): a flax model from :func:`fedjax_dp.models.make_model`; all
  ``A`` models train in ONE compiled call, each from its own initialisation and minibatch
  stream. ``fit_keyed_seeds``, ``fit_shared_keyed_seeds`` and ``predict_seeds`` take a leading
  seed axis (S runs in one call; why looped on the CPU: :mod:`.phases`).
* :class:`SklearnLearner`: scikit-learn trees or xgboost (the ``trees`` extra), fitted in a host
  loop (the documented exception to "no loops over agents"). Features are flattened.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.core import StackedData, for_each_agent, numpy_rng, validation
from fedjax_dp.core import defaults as defaults_lib
from fedjax_dp.models import Model, make_model
from fedjax_dp.train import LocalTrainConfig, check_trainable, make_local_update
from fedjax_dp.core.lift import add_leading_axis, resolve_chunk_size, take_row, training_bytes
from fedjax_dp.train.local import lifted_update

JAX_MODELS = ("logistic", "mlp", "cnn")
TREE_MODELS = ("decision_tree", "random_forest", "gradient_boosting", "xgboost")
LEARNERS = JAX_MODELS + TREE_MODELS


@dataclasses.dataclass(frozen=True)
class JaxLearner:
    """``A`` flax models trained at once (vmap over the model axis).

    ``chunk_size``: models per chunk (``"auto"``: CPU-cache sized; None: all at once);
    ``backend="loop"``: a Python loop over models calling the same jitted one-model function
    (reference for tests and benchmarks; identical results).
    """

    model: Model
    train: LocalTrainConfig
    chunk_size: int | str | None = "auto"
    backend: str = "vmap"
    vectorised = True

    def __post_init__(self):
        validation.check_choice("backend", self.backend, ("vmap", "loop"))

    @property
    def name(self) -> str:
        return self.model.name

    def _chunk(self, params, num: int) -> int | None:
        """Models per chunk for ``num`` models of ``params`` (params, gradient and update each)."""
        return resolve_chunk_size(self.chunk_size, bytes_per_agent=training_bytes(params, num),
                                  num_agents=num)

    def init(self, key: jax.Array, num: int):
        """``num`` independent initialisations, stacked ``[num, ...]``."""
        return _init_fn(self.model)(jax.random.split(key, num))

    def fit(self, key: jax.Array, data: StackedData):
        """Model a trains on agent a's records of ``data``; returns stacked params ``[A, ...]``."""
        check_trainable(data)
        return self.fit_keyed(*model_keys(key, data.num_agents), data)

    def fit_keyed(self, init_keys: jax.Array, train_keys: jax.Array, data: StackedData):
        """:meth:`fit` with model a's keys given: ``model.init(init_keys[a])``, then training
        with ``train_keys[a]``, so a slice of the keys trains the same models as the full call
        (streaming). Agents without records (padding) give unused parameters."""
        params = _init_fn(self.model)(init_keys)
        chunk = self._chunk(params, data.num_agents)
        fn = lifted_update(self.model, self.train, False, chunk, None, self.backend)
        params, _ = fn(train_keys, params, data.x, data.y, data.mask, data.counts)
        return params

    def fit_shared(self, key: jax.Array, x, y, mask):
        """Model a trains on ``(x, y[a])`` weighted by ``mask[a]`` (x is shared, not copied)."""
        return self.fit_shared_keyed(*model_keys(key, np.shape(y)[0]), x, y, mask)

    def fit_shared_keyed(self, init_keys: jax.Array, train_keys: jax.Array, x, y, mask):
        """:meth:`fit_shared` with model a's keys given (as :meth:`fit_keyed`)."""
        x = jnp.asarray(x)
        y = jnp.asarray(y, jnp.int32)
        mask = jnp.asarray(mask, bool)
        num = y.shape[0]
        params = _init_fn(self.model)(init_keys)
        chunk = self._chunk(params, num)
        fn = _shared_update(self.model, self.train, chunk, self.backend)
        count = jnp.asarray(x.shape[0], jnp.int32)
        params, _ = fn(train_keys, params, x, y, mask, count)
        return params

    def predict(self, params, x) -> jax.Array:
        """``int32 [A, M]``: every model's predicted class for every row of ``x [M, ...]``."""
        x = jnp.asarray(x)
        num = jax.tree.leaves(params)[0].shape[0]
        chunk = self._chunk(params, num)
        return _predict_fn(self.model, chunk, self.backend)(params, x)

    def take(self, params, index: int):
        return jax.tree.map(lambda l: l[index:index + 1], params)

    # S runs (seeds) at once: every array gains a leading seed axis; seed s's models are those
    # of the method without ``_seeds`` on its slice. ``seed_axis``: "vmap" (equal to separate
    # calls to float tolerance), "map" (a loop inside ONE compiled call: bit for bit equal) or
    # "auto" (:data:`SEED_AXIS`).

    def fit_keyed_seeds(self, init_keys: jax.Array, train_keys: jax.Array, data: StackedData, *,
                        seed_axis: str = "auto"):
        """:meth:`fit_keyed` of S seeds: ``init_keys`` / ``train_keys [S, A]``, ``data
        [S, A, ...]`` -> params ``[S, A, ...]`` (seed s: ``fit_keyed(init_keys[s], ...)``; one
        seed: that call itself)."""
        mode = resolve_seed_axis(seed_axis)
        if init_keys.shape[0] == 1:
            return add_leading_axis(self.fit_keyed(init_keys[0], train_keys[0],
                                                   take_row(data, 0)))
        params = _over_seeds(_init_fn(self.model), (0,), mode)(init_keys)
        chunk = self._chunk(_one_seed(params), init_keys.shape[1])
        fn = lifted_update(self.model, self.train, False, chunk, None, self.backend)
        params, _ = _over_seeds(fn, (0,) * 6, mode)(train_keys, params, data.x, data.y,
                                                   data.mask, data.counts)
        return params

    def fit_shared_keyed_seeds(self, init_keys: jax.Array, train_keys: jax.Array, x, y, mask, *,
                               x_axis: int | None = None, seed_axis: str = "auto"):
        """:meth:`fit_shared_keyed` of S seeds: keys ``[S, A]``, ``y`` / ``mask [S, A, Q]``;
        ``x [Q, ...]`` shared by the seeds (``x_axis=None``) or ``[S, Q, ...]`` (``x_axis=0``;
        one seed: that call itself)."""
        mode = resolve_seed_axis(seed_axis)
        if init_keys.shape[0] == 1:
            y0, mask0 = take_row((jnp.asarray(y), jnp.asarray(mask)), 0)
            return add_leading_axis(self.fit_shared_keyed(
                init_keys[0], train_keys[0], x if x_axis is None else take_row(x, 0), y0,
                mask0))
        x = jnp.asarray(x)
        y = jnp.asarray(y, jnp.int32)
        mask = jnp.asarray(mask, bool)
        params = _over_seeds(_init_fn(self.model), (0,), mode)(init_keys)
        chunk = self._chunk(_one_seed(params), y.shape[1])
        fn = _shared_update(self.model, self.train, chunk, self.backend)
        count = jnp.asarray(x.shape[0 if x_axis is None else 1], jnp.int32)
        params, _ = _over_seeds(fn, (0, 0, x_axis, 0, 0, None), mode)(train_keys, params, x, y,
                                                                     mask, count)
        return params

    def predict_seeds(self, params, x, *, x_axis: int | None = None,
                      seed_axis: str = "auto") -> jax.Array:
        """:meth:`predict` of S seeds: params ``[S, A, ...]``, ``x [M, ...]`` shared
        (``x_axis=None``) or ``[S, M, ...]`` -> ``int32 [S, A, M]`` (one seed: :meth:`predict`)."""
        mode = resolve_seed_axis(seed_axis)
        x = jnp.asarray(x)
        if jax.tree.leaves(params)[0].shape[0] == 1:
            return add_leading_axis(self.predict(take_row(params, 0),
                                                 x if x_axis is None else take_row(x, 0)))
        one = _one_seed(params)
        chunk = self._chunk(one, jax.tree.leaves(one)[0].shape[0])
        fn = _predict_fn(self.model, chunk, self.backend)
        return _over_seeds(fn, (0, x_axis), mode)(params, x)


#: How the ``*_seeds`` methods run the seed axis for ``"auto"`` (None: the ``seed_axis`` of
#: :func:`fedjax_dp.core.defaults.defaults`).
SEED_AXIS: str | None = None


def resolve_seed_axis(seed_axis: str) -> str:
    """``"map"`` or ``"vmap"`` for ``seed_axis`` (``"auto"``: :data:`SEED_AXIS`, else the
    device's default, :func:`fedjax_dp.core.defaults.defaults`)."""
    validation.check_choice("seed_axis", seed_axis, ("auto", "map", "vmap"))
    if seed_axis != "auto":
        return seed_axis
    if SEED_AXIS is not None:
        return validation.check_choice("learners.SEED_AXIS", SEED_AXIS, ("map", "vmap"))
    return defaults_lib.defaults().seed_axis


def model_keys(key: jax.Array, num: int) -> tuple[jax.Array, jax.Array]:
    """``(init_keys [num], train_keys [num])`` of :meth:`JaxLearner.fit` with root ``key``:
    model a starts from ``split(split(key)[0], num)[a]`` and trains with
    ``split(split(key)[1], num)[a]``."""
    k_init, k_train = jax.random.split(key)
    return jax.random.split(k_init, num), jax.random.split(k_train, num)


@functools.lru_cache(maxsize=32)
def _init_fn(model: Model):
    """``keys [A] -> stacked params [A, ...]``, compiled once per model (flax init op by op
    under a bare vmap compiles dozens of tiny programs)."""
    return jax.jit(jax.vmap(model.init))


@functools.lru_cache(maxsize=32)
def _shared_update(model: Model, config: LocalTrainConfig, chunk_size, backend):
    """All models train on one shared input set with per-model labels and masks (compiled once)."""
    update = make_local_update(model, config)

    def one(key, params, x, y, mask, count):
        return update(key, params, x, y, mask, count)

    lifted = for_each_agent(one, (0, 0, None, 0, 0, None), chunk_size=chunk_size,
                            backend=backend)
    return lifted if backend == "loop" else jax.jit(lifted)


@functools.lru_cache(maxsize=32)
def _predict_fn(model: Model, chunk_size, backend):
    def one(params, x):                                  # x [M, ...] shared
        return jnp.argmax(model.logits(params, x), -1).astype(jnp.int32)   # [M]

    lifted = for_each_agent(one, (0, None), chunk_size=chunk_size, backend=backend)
    return lifted if backend == "loop" else jax.jit(lifted)


def _one_seed(params):
    """The shapes of one seed's slice of seed-stacked ``params`` (for the chunk size)."""
    return jax.tree.map(lambda l: jax.ShapeDtypeStruct(l.shape[1:], l.dtype), params)


@functools.lru_cache(maxsize=64)
def _over_seeds(fn, in_axes: tuple, mode: str):
    """``fn`` (one seed's compiled function) over a leading seed axis of the arguments with
    ``in_axes`` 0 (None: shared), compiled once: :func:`for_each_agent` with ``backend`` mode
    ("vmap", or "map": a loop whose body is ``fn`` itself)."""
    return jax.jit(for_each_agent(fn, in_axes, backend=mode))


class _Constant:
    """A fitted 'model' for a training set holding a single class (some libraries refuse it)."""

    def __init__(self, label: int):
        self.label = int(label)

    def predict(self, x):
        return np.full(len(x), self.label, dtype=np.int64)


class _Relabelled:
    """Wraps an estimator fitted on labels re-indexed 0..K-1 (xgboost needs consecutive ids)."""

    def __init__(self, est, classes: np.ndarray):
        self.est, self.classes = est, classes

    def predict(self, x):
        return self.classes[np.asarray(self.est.predict(x)).astype(np.int64)]


@dataclasses.dataclass(frozen=True)
class SklearnLearner:
    """Tree learners fitted in a host loop (FedKT's Adult / cod-rna models).

    ``kind``: ``decision_tree`` | ``random_forest`` | ``gradient_boosting`` | ``xgboost`` (needs
    the ``trees`` extra: ``pip install -e '.[trees]'``). ``max_depth`` (paper: 6) and
    ``n_estimators`` (paper: 100 trees) apply where the estimator has them.
    """

    kind: str
    num_classes: int
    max_depth: int = 6
    n_estimators: int = 100
    vectorised = False

    def __post_init__(self):
        validation.check_choice("learner", self.kind, TREE_MODELS)
        validation.check_int("num_classes", self.num_classes, minimum=2)
        validation.check_int("tree_max_depth", self.max_depth, minimum=1)
        validation.check_int("tree_estimators", self.n_estimators, minimum=1)
        if self.kind == "xgboost":
            try:
                import xgboost  # noqa: F401
            except ImportError:
                raise ValueError("learner 'xgboost' needs the optional xgboost package "
                                 "(pip install -e '.[trees]'); use 'gradient_boosting' instead"
                                 ) from None

    @property
    def name(self) -> str:
        return self.kind

    def _estimator(self, seed: int, num_rows: int):
        if self.kind == "decision_tree":
            from sklearn.tree import DecisionTreeClassifier
            return DecisionTreeClassifier(max_depth=self.max_depth, random_state=seed)
        if self.kind == "random_forest":
            from sklearn.ensemble import RandomForestClassifier
            return RandomForestClassifier(n_estimators=self.n_estimators,
                                          max_depth=self.max_depth, random_state=seed, n_jobs=1)
        if self.kind == "gradient_boosting":
            from sklearn.ensemble import HistGradientBoostingClassifier
            # sklearn's default min_samples_leaf=20 cannot split a small teacher subset at all
            return HistGradientBoostingClassifier(
                max_depth=self.max_depth, max_iter=self.n_estimators, random_state=seed,
                min_samples_leaf=max(1, min(20, num_rows // 10)))
        import xgboost
        return xgboost.XGBClassifier(n_estimators=self.n_estimators, max_depth=self.max_depth,
                                     random_state=seed, n_jobs=1)

    def _fit_one(self, seed: int, x: np.ndarray, y: np.ndarray):
        x = x.reshape(len(x), -1)
        classes = np.unique(y)
        if len(classes) == 1:
            return _Constant(classes[0])
        est = self._estimator(seed, len(x))
        if self.kind == "xgboost":
            est.fit(x, np.searchsorted(classes, y))
            return _Relabelled(est, classes)
        return est.fit(x, y)

    def fit(self, key: jax.Array, data: StackedData) -> list:
        """One estimator per agent of ``data``, fitted on its real records (host loop)."""
        seeds = numpy_rng(key).integers(0, 2 ** 31 - 1, size=data.num_agents)
        x, y, counts = np.asarray(data.x), np.asarray(data.y), np.asarray(data.counts)
        return [self._fit_one(int(seeds[a]), x[a, :counts[a]], y[a, :counts[a]])
                for a in range(data.num_agents)]          # host loop: trees are not JAX

    def fit_shared(self, key: jax.Array, x, y, mask) -> list:
        """Estimator a fitted on the rows of ``x`` where ``mask[a]``, labels ``y[a]``."""
        x, y, mask = np.asarray(x), np.asarray(y), np.asarray(mask, bool)
        seeds = numpy_rng(key).integers(0, 2 ** 31 - 1, size=y.shape[0])
        return [self._fit_one(int(seeds[a]), x[mask[a]], y[a][mask[a]])
                for a in range(y.shape[0])]

    def predict(self, fitted: list, x) -> jax.Array:
        x = np.asarray(x).reshape(len(x), -1)
        return jnp.asarray(np.stack([np.asarray(m.predict(x)) for m in fitted]).astype(np.int32))

    def take(self, fitted: list, index: int) -> list:
        return fitted[index:index + 1]


def make_learner(name: str, *, feature_shape, num_classes: int, train: LocalTrainConfig,
                 hidden=(200,), chunk_size: int | str | None = "auto", backend: str = "vmap",
                 max_depth: int = 6, n_estimators: int = 100):
    """A learner by name: ``logistic`` / ``mlp`` / ``cnn`` (JAX) or a tree model."""
    validation.check_choice("learner", name, LEARNERS)
    if name in JAX_MODELS:
        model = make_model(name, feature_shape, num_classes, hidden=tuple(hidden))
        return JaxLearner(model, train, chunk_size=chunk_size, backend=backend)
    return SklearnLearner(name, num_classes, max_depth=max_depth, n_estimators=n_estimators)


def is_jax(learner: Any) -> bool:
    return isinstance(learner, JaxLearner)
