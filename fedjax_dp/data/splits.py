"""Deterministic train / public / test splits (shared by the offline sources and file loaders).

A split is a function of the labels and an integer seed only, so every call with the same arguments
returns identical index arrays. Splits are stratified by label when every class has enough records,
and fall back to a plain shuffle otherwise."""
from __future__ import annotations

import numpy as np

from fedjax_dp.core import validation


def holdout(indices: np.ndarray, labels: np.ndarray, num_holdout: int, seed: int,
            stratify: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Split ``indices`` into ``(rest, holdout)`` with ``len(holdout) == num_holdout``."""
    if num_holdout == 0:
        return indices, indices[:0]
    if num_holdout == len(indices):
        return indices[:0], np.random.default_rng(seed).permutation(indices)
    if stratify:
        from sklearn.model_selection import train_test_split   # here only: slow to import
        try:
            rest, held = train_test_split(indices, test_size=num_holdout, random_state=seed,
                                          stratify=labels)
            return np.asarray(rest, np.int64), np.asarray(held, np.int64)
        except ValueError:  # a class too small to stratify: fall back to a plain shuffle
            pass
    perm = np.random.default_rng(seed).permutation(indices)
    return perm[num_holdout:], perm[:num_holdout]


def split_indices(labels: np.ndarray, *, num_test: int, num_public: int, seed: int = 0,
                  stratify: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Indices ``(train, public, test)`` of a fixed split of ``len(labels)`` records.

    The test set is drawn first, then the public set from the remainder; the rest is train. The
    three int64 index arrays are disjoint and cover ``range(len(labels))``."""
    labels = np.asarray(labels)
    n = len(labels)
    if n == 0:
        raise ValueError("labels must hold at least one record, got 0")
    seed = validation.check_int("seed", seed, minimum=0)
    num_test = validation.check_int("num_test", num_test, minimum=0, maximum=n - 1)
    num_public = validation.check_int("num_public", num_public, minimum=0,
                                      maximum=n - 1 - num_test)
    all_idx = np.arange(n, dtype=np.int64)
    rest, test = holdout(all_idx, labels, num_test, seed, stratify)
    train, public = holdout(rest, labels[rest], num_public, seed + 1, stratify)
    return train, public, test


def split_counts(n: int, test_fraction: float, public_fraction: float) -> tuple[int, int]:
    """``(num_test, num_public)`` for ``n`` records, rounding each fraction to a whole count.

    Raises ValueError unless at least one record is left for training."""
    validation.check_probability("test_fraction", test_fraction, allow_zero=True)
    validation.check_probability("public_fraction", public_fraction, allow_zero=True)
    if test_fraction + public_fraction >= 1.0:
        raise ValueError("test_fraction + public_fraction must be < 1 (something must be left "
                         f"for training), got {test_fraction} + {public_fraction}")
    num_test = int(round(n * test_fraction))
    num_public = int(round(n * public_fraction))
    if n - num_test - num_public < 1:
        raise ValueError(f"with {n} records, test_fraction={test_fraction} and "
                         f"public_fraction={public_fraction} leave no training records")
    return num_test, num_public


def per_group_holdout(counts: np.ndarray, scores: np.ndarray, fraction: float
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Hold out ``m_i = max(1, round(fraction n_i))`` records of every group, vectorised.

    The records are laid out group after group (group i: the next ``n_i = counts[i]`` entries of
    ``scores``); group i holds out its ``m_i`` records of smallest score (ties: the earlier one),
    so which records a group holds out depends only on its own records' scores, not on their
    order. Returns ``(held [sum n_i] bool, m [N] int64)``.

    Raises ValueError naming the group when ``m_i >= n_i`` (no record left to it)."""
    counts = np.asarray(counts, np.int64)
    scores = np.asarray(scores)
    validation.check_probability("fraction", fraction)
    if scores.shape != (int(counts.sum()),):
        raise ValueError(f"scores must hold sum(counts) = {int(counts.sum())} values, got shape "
                         f"{scores.shape}")
    m = np.maximum(1, np.round(fraction * counts).astype(np.int64))                  # [N]
    short = np.flatnonzero(m >= counts)
    if short.size:
        i = int(short[0])
        raise ValueError(f"fraction = {fraction} leaves group {i} ({int(counts[i])} records) "
                         f"no record")
    group = np.repeat(np.arange(counts.size), counts)                                # [sum]
    order = np.lexsort((scores, group))             # group by group, by score within a group
    rank = np.arange(group.size) - np.repeat(np.cumsum(counts) - counts, counts)     # sorted
    held = np.zeros(group.size, bool)
    held[order] = rank < np.repeat(m, counts)
    return held, m
