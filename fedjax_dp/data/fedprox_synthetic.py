"""FedProx's Synthetic(alpha, beta): per-client logistic-regression data with natural clients.

Li, Sahu, Zaheer, Sanjabi, Talwalkar and Smith, "Federated Optimization in Heterogeneous Networks",
MLSys 2020, Section 5.1 ("Synthetic data") and the appendix's dataset details; the generator as
published in the authors' repository (``data/synthetic_{0_0,0.5_0.5,1_1}/generate_synthetic.py``,
``data/synthetic_iid/generate_iid.py``). For client ``k = 0..K-1`` (``K = num_clients``,
``d = num_features``, ``C = num_classes``)::

    n_k  = floor(exp(N(4, 2^2))) + 50               records (lognormal sizes, a power-law tail)
    u_k ~ N(0, alpha^2),  W_k ~ N(u_k, 1) [d, C],  b_k ~ N(u_k, 1) [C]      (model heterogeneity)
    B_k ~ N(0, beta^2),   v_k ~ N(B_k, 1) [d]                              (feature heterogeneity)
    x   ~ N(v_k, Sigma),  Sigma = diag(j^-1.2), j = 1..d
    y   = argmax_c softmax(x W_k + b_k)_c = argmax_c (x W_k + b_k)_c

``N(m, s)`` in the paper is numpy's ``normal(m, s)``: ``alpha`` and ``beta`` are STANDARD
DEVIATIONS. The IID variant (``iid=True``, the published ``synthetic_iid``) shares one
``W ~ N(0, 1) [d, C]``, ``b ~ N(0, 1) [C]`` among all clients and has ``v_k = 0``; it has no
``alpha`` or ``beta``.

Note: ``u_k`` shifts every class's logit by the same amount ``u_k (sum_j x_j + 1)``, so
``alpha`` never changes a label (Synthetic(0, b) and Synthetic(a, b) hold the same records and
labels with the same seed); the clients' models still differ through the noise of ``W_k`` and
``b_k``.

Splits. Each client's first ``floor(train_fraction n_k)`` records (published: ``int(0.9 n_k)``) are
training records, the rest its test records. ``x_train`` holds the clients' training records client
after client (``domain_train`` = the client id, for the ``natural`` partition); ``x_test`` pools
every client's test records (FedProx's reported test accuracy). The PUBLIC split (the server's
unlabelled data, which FedProx does not have) is the records of ``public_clients`` further clients
drawn like the others from their own random stream, so changing ``public_clients`` changes none of
the clients' records."""
from __future__ import annotations

import numpy as np

from fedjax_dp.core import validation
from fedjax_dp.data.dataset import Dataset

#: published constants: n_k = floor(exp(N(SIZE_MU, SIZE_SIGMA^2))) + MIN_SIZE
SIZE_MU, SIZE_SIGMA, MIN_SIZE = 4.0, 2.0, 50
#: the covariance of x is diag(j^-COV_EXPONENT), j = 1..d
COV_EXPONENT = 1.2
#: published per-client train fraction (int(0.9 n_k) training records)
TRAIN_FRACTION = 0.9
_BLOCK = 4096   # records per block when computing labels (bounds the [b, d, C] gather)


def feature_variances(num_features: int) -> np.ndarray:
    """``[d]`` diagonal of Sigma: ``j^-1.2`` for ``j = 1..d`` (FedProx Section 5.1)."""
    num_features = validation.check_int("num_features", num_features, minimum=1)
    return np.arange(1, num_features + 1, dtype=np.float64) ** -COV_EXPONENT


def _clients(rng: np.random.Generator, num_clients: int, num_features: int, num_classes: int,
             alpha: float, beta: float, iid: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(x [n, d] float64, y [n] int32, sizes [K] int64)`` of ``num_clients`` clients, records
    client after client. Every draw is a standard normal scaled afterwards, so ``alpha`` and
    ``beta`` change the scale of ``u`` and ``B`` but not the other draws."""
    K, d, C = num_clients, num_features, num_classes
    sizes = (np.floor(np.exp(SIZE_MU + SIZE_SIGMA * rng.standard_normal(K))).astype(np.int64)
             + MIN_SIZE)                                                    # [K]
    u = alpha * rng.standard_normal(K)                                      # [K]
    B = beta * rng.standard_normal(K)                                       # [K]
    v = B[:, None] + rng.standard_normal((K, d))                            # [K, d]
    W = u[:, None, None] + rng.standard_normal((K, d, C))                   # [K, d, C]
    b = u[:, None] + rng.standard_normal((K, C))                            # [K, C]
    if iid:                                # published synthetic_iid: one model, v_k = 0
        W = np.broadcast_to(rng.standard_normal((d, C)), (K, d, C))
        b = np.broadcast_to(rng.standard_normal(C), (K, C))
        v = np.zeros((K, d))
    client = np.repeat(np.arange(K), sizes)                                 # [n]
    x = v[client] + np.sqrt(feature_variances(d)) * rng.standard_normal((len(client), d))
    y = np.empty(len(client), dtype=np.int32)                               # [n]
    for s in range(0, len(client), _BLOCK):                                 # blocks of records
        c = client[s:s + _BLOCK]
        logits = np.einsum("nd,ndc->nc", x[s:s + _BLOCK], W[c]) + b[c]     # [blk, C]
        y[s:s + _BLOCK] = np.argmax(logits, axis=1)
    return x, y, sizes


def _check_spread(name: str, value, iid: bool) -> float:
    """``alpha`` / ``beta``: a finite std >= 0 (None: 1 for the non-IID data, 0 for IID)."""
    if value is None:
        return 0.0 if iid else 1.0
    v = validation.check_nonnegative(name, value, finite=True)
    if iid and v != 0:
        raise ValueError(f"{name} must be 0 or unset with iid=True (the published IID variant "
                         f"shares one model and has v_k = 0), got {value!r}")
    return v


def fedprox_synthetic(alpha: float | None = None, beta: float | None = None,
                      num_clients: int = 30, num_features: int = 60, num_classes: int = 10,
                      iid: bool = False, seed: int = 0, *,
                      train_fraction: float = TRAIN_FRACTION,
                      public_clients: int = 3) -> Dataset:
    """FedProx's Synthetic(alpha, beta) (Li et al. 2020, Section 5.1) as a :class:`Dataset`.

    See the module docstring for the formulas and splits. ``alpha`` and ``beta`` (standard
    deviations of ``u_k`` and ``B_k``, >= 0) default to 1, i.e. Synthetic(1, 1); with ``iid=True``
    they must be left unset (or 0). ``domain_train[i]`` is the client (0..K-1) of training record
    ``i``. Deterministic in ``seed``. The dataset is named ``"fedprox_synthetic(alpha,beta)"`` or
    ``"fedprox_synthetic(iid)"``."""
    if not isinstance(iid, (bool, np.bool_)):
        raise ValueError(f"iid must be a bool, got {iid!r}")
    iid = bool(iid)
    alpha = _check_spread("alpha", alpha, iid)
    beta = _check_spread("beta", beta, iid)
    num_clients = validation.check_int("num_clients", num_clients, minimum=1)
    num_features = validation.check_int("num_features", num_features, minimum=1,
                                        maximum=validation.WIDTH_MAX)
    num_classes = validation.check_int("num_classes", num_classes, minimum=2,
                                       maximum=validation.WIDTH_MAX)
    seed = validation.check_int("seed", seed, minimum=0)
    train_fraction = validation.check_number("train_fraction", train_fraction)
    if not 1.0 / MIN_SIZE <= train_fraction < 1.0:
        raise ValueError(f"train_fraction must be in [{1.0 / MIN_SIZE}, 1) (every client keeps "
                         f">= 1 training and >= 1 test record of its >= {MIN_SIZE}), got "
                         f"{train_fraction!r}")
    public_clients = validation.check_int("public_clients", public_clients, minimum=0)

    own, public = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    x, y, sizes = _clients(own, num_clients, num_features, num_classes, alpha, beta, iid)
    n_train = np.floor(train_fraction * sizes).astype(np.int64)            # [K]
    start = np.cumsum(sizes) - sizes                                        # [K]
    rank = np.arange(len(y)) - np.repeat(start, sizes)                      # [n] index in client
    is_train = rank < np.repeat(n_train, sizes)                             # [n]
    client = np.repeat(np.arange(num_clients, dtype=np.int64), sizes)       # [n]
    if public_clients:
        x_pub, y_pub, _ = _clients(public, public_clients, num_features, num_classes, alpha,
                                   beta, iid)
    else:
        x_pub, y_pub = np.zeros((0, num_features)), np.zeros(0, np.int32)
    name = "fedprox_synthetic(iid)" if iid else f"fedprox_synthetic({alpha:g},{beta:g})"
    return Dataset(name=name, x_train=x[is_train], y_train=y[is_train], x_public=x_pub,
                   y_public=y_pub, x_test=x[~is_train], y_test=y[~is_train],
                   num_classes=num_classes, domain_train=client[is_train])
