"""Data for the ISRL-DP experiments: mnist5k odd/even (PCA, parity, 25 digit pairs), WBCD."""
import numpy as np
import pytest
import threadpoolctl

from fedjax_dp.data import (DATASETS, class_counts, mnist5k, mnist5k_oddeven, oddeven_pair_id,
                            partition, wbcd)

SEED = 1


@pytest.fixture(scope="module")
def oddeven():
    return mnist5k_oddeven(seed=SEED)


@pytest.fixture(scope="module")
def raw():
    return mnist5k(seed=SEED)           # the same split, images and digit labels


def test_shapes_labels_and_registry(oddeven, raw):
    ds = oddeven
    assert ds.name == "mnist5k_oddeven" and ds.num_classes == 2
    assert (ds.x_train.shape, ds.x_public.shape, ds.x_test.shape) == ((3000, 50), (1000, 50),
                                                                      (1000, 50))
    for split in ("train", "public", "test"):
        np.testing.assert_array_equal(getattr(ds, f"y_{split}"), getattr(raw, f"y_{split}") % 2)
    assert ds.domain_train.shape == (3000,) and ds.domain_train.dtype == np.int64
    assert DATASETS["mnist5k_oddeven"] is mnist5k_oddeven
    assert mnist5k_oddeven(seed=SEED, pca_dim=8).x_test.shape == (1000, 8)
    with pytest.raises(ValueError, match="pca_dim"):
        mnist5k_oddeven(pca_dim=0)
    with pytest.raises(ValueError, match="standardize"):
        mnist5k_oddeven(standardize="yes")


def test_pca_is_fitted_on_the_public_split_only(oddeven, raw):
    # An independent PCA: eigenvectors of the public split's covariance; every split is
    # projected with the public mean and these directions (equal up to each component's sign).
    flat = lambda x: x.reshape(len(x), -1).astype(np.float64)
    pub = flat(raw.x_public)
    mean = pub.mean(0)
    with threadpoolctl.threadpool_limits(limits=1, user_api="blas"):   # small; avoid contention
        vals, vecs = np.linalg.eigh(np.cov(pub, rowvar=False))
    top = vecs[:, np.argsort(vals)[::-1][:50]]                            # [784, 50]
    for split in ("train", "public", "test"):
        want = (flat(getattr(raw, f"x_{split}")) - mean) @ top           # [n, 50]
        got = getattr(oddeven, f"x_{split}").astype(np.float64)
        signs = np.sign(np.sum(want * got, axis=0))
        np.testing.assert_allclose(got, want * signs, atol=2e-3)
    # The PCA's centring is the public mean: public features are centred, the others are not.
    assert np.abs(oddeven.x_public.mean(0)).max() < 1e-4
    assert np.abs(oddeven.x_train.mean(0)).max() > 1e-3
    # Standardised: unit variance on the public split (its statistics only).
    std = mnist5k_oddeven(seed=SEED, standardize=True)
    np.testing.assert_allclose(std.x_public.std(0), 1.0, rtol=1e-4)
    np.testing.assert_allclose(std.x_test * oddeven.x_public.std(0), oddeven.x_test,
                               rtol=1e-4, atol=1e-5)


def test_by_domain_gives_one_even_odd_pair_per_silo(oddeven, raw):
    digits = raw.y_train
    parts = partition("by_domain", oddeven.y_train, 25, 0, domains=oddeven.domain_train)
    assert len(parts) == 25
    assert sorted(np.concatenate(parts).tolist()) == list(range(3000))
    pairs = []
    for part in parts:
        held = np.unique(digits[part])
        assert len(held) == 2 and held[0] % 2 != held[1] % 2      # one even, one odd digit
        even, odd = sorted(held, key=lambda d: d % 2)
        assert np.all(oddeven.domain_train[part] == oddeven_pair_id(even, odd))
        counts = class_counts(oddeven.y_train[part], [np.arange(len(part))], 2)[0]
        assert counts.min() >= 50                                 # ~60 of each digit (300 / 5)
        pairs.append((int(even), int(odd)))
    assert len(set(pairs)) == 25                                  # all (even, odd) pairs
    # Each digit's records are spread over its 5 pairs evenly (round-robin), from the seed.
    for d in range(10):
        sizes = np.bincount(oddeven.domain_train[digits == d], minlength=25)
        assert np.count_nonzero(sizes) == 5 and sizes.max() - sizes[sizes > 0].min() <= 1
    np.testing.assert_array_equal(mnist5k_oddeven(seed=SEED, pca_dim=2).domain_train,
                                  oddeven.domain_train)
    assert not np.array_equal(mnist5k_oddeven(seed=SEED + 1, pca_dim=2).domain_train[:200],
                              oddeven.domain_train[:200])


def test_overlap_silos_hold_every_record_of_their_two_digits(oddeven, raw):
    """The paper's recipe: silo (e, o) holds all training records of digits e and o, so each
    record is in 5 silos; features and labels are copies of the split's."""
    over = mnist5k_oddeven(seed=SEED, silos="overlap")
    assert over.x_train.shape == (5 * 3000, 50) and over.x_test.shape == oddeven.x_test.shape
    parts = partition("by_domain", over.y_train, 25, 0, domains=over.domain_train)
    # map each copy back to its record of the split by its features (distinct PCA rows)
    index = {row.tobytes(): i for i, row in enumerate(oddeven.x_train)}
    source = np.array([index[row.tobytes()] for row in over.x_train])      # [15000]
    np.testing.assert_array_equal(over.y_train, oddeven.y_train[source])
    assert np.all(np.bincount(source, minlength=3000) == 5)
    for part in parts:
        held = np.unique(raw.y_train[source[part]])
        assert len(held) == 2 and held[0] % 2 != held[1] % 2
        want = np.flatnonzero(np.isin(raw.y_train, held))                # every record of both
        assert sorted(source[part].tolist()) == want.tolist()
    with pytest.raises(ValueError, match="silos must be 'split' or 'overlap'"):
        mnist5k_oddeven(silos="all")


def test_wbcd_one_class_two_silos():
    ds = wbcd()
    for seed in (0, 1):
        parts = partition("one_class", ds.y_train, 2, seed)
        labels = sorted(set(np.unique(ds.y_train[p]).tolist()) for p in parts)
        assert labels == [{0}, {1}]                     # one malignant-only, one benign-only
        assert sorted(np.concatenate(parts).tolist()) == list(range(len(ds.y_train)))


# ------------------------------------------------------ per-silo validation split (fixed seed)

def test_per_group_holdout_takes_the_smallest_scores_of_each_group():
    from fedjax_dp.data.splits import per_group_holdout
    scores = np.array([.5, .1, .9, .3, .7, .2, .8, .4])            # groups of 5 and 3
    held, m = per_group_holdout(np.array([5, 3]), scores, 0.4)
    assert m.tolist() == [2, 1]                                     # round(2.0), max(1, round(1.2))
    assert np.flatnonzero(held).tolist() == [1, 3, 5]               # .1, .3 | .2
    perm = np.array([4, 2, 0, 1, 3, 7, 5, 6])                       # order within groups changed
    held2, _ = per_group_holdout(np.array([5, 3]), scores[perm], 0.4)
    assert sorted(perm[held2].tolist()) == [1, 3, 5]                # the same records held out
    with pytest.raises(ValueError, match="group 1"):
        per_group_holdout(np.array([5, 1]), scores[:6], 0.2)        # 1 record: nothing left


def test_per_agent_validation_split_is_fixed_by_validation_seed():
    from fedjax_dp.data import population
    from fedjax_dp.experiments import checkpoint, config as config_lib
    path = "configs/isrl/wbcd_isrl_spider.toml"
    per_agent = ["data.validation_fraction=0.2", "data.validation_split=\"per_agent\""]

    def pop(seed, extra):
        cfg = config_lib.load(path, [f"seed={seed}", "run.agents_on=\"host\""] + extra)
        p = population.build(cfg)
        return p, sorted(map(tuple, np.asarray(p.x_val).round(5).tolist()))

    n = np.sort(np.bincount(wbcd().y_train))                        # [127, 214]
    a, val_a = pop(0, per_agent + ["data.validation_seed=7"])
    b, val_b = pop(1, per_agent + ["data.validation_seed=7"])
    assert np.sort(np.asarray(a.agents.counts)).tolist() == (n - np.round(0.2 * n)).tolist()
    assert len(val_a) == int(np.round(0.2 * n).sum()) and val_a == val_b   # same for every seed
    assert len(a.dataset.y_train) == n.sum() - len(val_a)
    for p in (a, b):                                                # each silo keeps one class
        y, mask = np.asarray(p.agents.y), np.asarray(p.agents.mask)
        assert [len(np.unique(y[i][mask[i]])) for i in range(2)] == [1, 1]
    _, val_c = pop(1, per_agent)                                    # -1: drawn with the seed
    assert val_c != val_a
    # Configs that do not set the new keys keep their fingerprint (earlier sweeps resume).
    cfg = config_lib.load(path)
    old = {k: v for k, v in cfg["data"].items() if k not in ("validation_split",
                                                               "validation_seed")}
    assert checkpoint.fingerprint(cfg) == checkpoint.fingerprint({**cfg, "data": old})
    assert checkpoint.fingerprint(config_lib.load(path, per_agent)) != \
        checkpoint.fingerprint(config_lib.load(path, per_agent[:1]))
    with pytest.raises(ValueError, match=r"data.validation_split must be one of \['per_agent', "
                                         r"'pooled'\]"):
        config_lib.load(path, ["data.validation_fraction=0.2", "data.validation_split=\"x\""])
    with pytest.raises(config_lib.ConfigError, match="data.validation_split = 'per_agent' needs "
                                                     "a validation split"):
        config_lib.load(path, per_agent[1:])
    with pytest.raises(config_lib.ConfigError, match="leaves an agent no training record"):
        population.build(config_lib.load(path, ["data.validation_fraction=0.999",
                                                "data.validation_split=\"per_agent\""]))
