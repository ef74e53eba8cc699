"""DP-FNAS retraining options of the discriminative experiment
(configs/experiments/fnas_discriminative.toml): ``private_retrain = false`` retrains a privately
searched genotype without clipping or noise (the paper's protocol; the ledger covers the search
only and says so), and ``retrain_seed`` draws the retraining from its own key, independent of
the run's seed (one search retrained under several seeds).

Tiny shapes as in tests/test_fnas_seeds.py (4x4 images, 2 channels, 1 node, 1 cell).
"""
import dataclasses
import json

import jax
import numpy as np
import pytest

from fedjax_dp.algorithms import api
from fedjax_dp.algorithms.fnas import dp_fnas
from fedjax_dp.core import from_ragged

SHAPE, CLASSES = (4, 4, 1), 3
PRIMS = ("none", "skip_connect", "avg_pool_3x3")
TINY = dp_fnas.Config(nodes=1, channels=2, cells=1, primitives=PRIMS, stem_multiplier=1,
                      search_epochs=1, batch_size=2, retrain_epochs=2, retrain_batch_size=2)
GENOTYPE = json.dumps(dp_fnas.fixed_genotype(
    jax.random.key(0), dataclasses.replace(TINY, fixed_genotype="random")).to_json())


def tiny_data(n: int = 6) -> api.FederatedData:
    rng = np.random.default_rng(0)
    xs = [rng.normal(size=(n,) + SHAPE).astype(np.float32) for _ in range(2)]
    ys = [rng.integers(0, CLASSES, n) for _ in range(2)]
    return api.FederatedData(agents=from_ragged(xs, ys), num_classes=CLASSES)


def retrained(config: dp_fnas.Config, seed: int) -> list[np.ndarray]:
    """The retrained parameters of a run of ``config`` with root key ``key(seed)``."""
    key = jax.random.key(seed)
    state = dp_fnas.init(key, tiny_data(), None, config)
    for t in range(dp_fnas.num_steps(config)):
        state, _ = dp_fnas.step(state, api.step_key(key, t))
    return [np.asarray(x) for x in jax.tree.leaves(state.values["retrain"].params)]


def test_non_private_retraining_with_its_own_seed():
    """A private run with private_retrain = false retrains exactly as a non-private run (same
    genotype, same retrain_seed) even under another run seed; another retrain_seed gives other
    parameters."""
    fixed = dataclasses.replace(TINY, fixed_genotype=GENOTYPE, retrain_seed=0)
    plain = retrained(dataclasses.replace(fixed, private=True, private_retrain=False), seed=1)
    for a, b in zip(plain, retrained(dataclasses.replace(fixed, private=False), seed=2),
                    strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    other_seed = retrained(dataclasses.replace(fixed, private=False, retrain_seed=1), seed=2)
    assert any(not np.allclose(a, b) for a, b in zip(plain, other_seed))


def test_ledger_covers_the_search_only_without_private_retraining():
    cfg = dataclasses.replace(TINY, private=True, private_retrain=False)
    state = dp_fnas.init(jax.random.key(0), tiny_data(), None, cfg)
    ledger, = dp_fnas.ledger(cfg, state)
    search_only, = dp_fnas.ledger(dataclasses.replace(TINY, retrain_epochs=0), state)
    with_retrain, = dp_fnas.ledger(TINY, state)
    eps = ledger.epsilon("instance", 1e-5)
    assert eps == pytest.approx(search_only.epsilon("instance", 1e-5), rel=1e-12)
    assert eps < with_retrain.epsilon("instance", 1e-5)
    assert any("retrained network" in u.release for u in ledger.uncovered)
    assert not any("retrained network" in u.release for u in with_retrain.uncovered)


@pytest.mark.parametrize("kwargs, name", [(dict(private_retrain="no"), "algorithm.private_retrain"),
                                          (dict(retrain_seed=-2), "algorithm.retrain_seed")])
def test_bad_retraining_options_are_refused(kwargs, name):
    with pytest.raises(ValueError, match=name):
        dp_fnas.Config(**kwargs)


def search_alpha(config: dp_fnas.Config, seed: int) -> tuple[list[np.ndarray], list]:
    """The search's final alpha and the search epochs' losses of a run of ``config``."""
    key = jax.random.key(seed)
    state = dp_fnas.init(key, tiny_data(), None, config)
    losses = []
    for t in range(dp_fnas.num_steps(config)):
        state, m = dp_fnas.step(state, api.step_key(key, t))
        if t < config.search_steps:
            losses.append(m["loss"] if "loss" in m else sorted(m.items()))
    return [np.asarray(a) for a in jax.tree.leaves(state.values["search"].alpha)], losses


def test_a_search_retrained_under_another_seed_is_replayed_not_recomputed(monkeypatch):
    """Runs that differ only in retraining share the search: the second run replays the first
    one's search epochs (no search iteration runs) and ends with the same alpha as a search
    computed from scratch; a run with another seed or another search setting recomputes."""
    from fedjax_dp.algorithms.fnas import search_memo
    cfg = dataclasses.replace(TINY, search_epochs=2, private=True, private_retrain=False,
                              retrain_seed=0)
    search_memo.clear()
    fresh, fresh_losses = search_alpha(cfg, seed=3)
    epochs = []
    real_epoch = dp_fnas._epoch
    monkeypatch.setattr(dp_fnas, "_epoch", lambda states, values, k, phase, *a:
                        epochs.append(phase) or real_epoch(states, values, k, phase, *a))
    replayed, replayed_losses = search_alpha(dataclasses.replace(cfg, retrain_seed=1), seed=3)
    assert epochs == ["retrain", "retrain"]                    # the search was replayed
    for a, b in zip(replayed, fresh, strict=True):
        np.testing.assert_array_equal(a, b)
    assert replayed_losses == fresh_losses
    epochs.clear()
    search_alpha(dataclasses.replace(cfg, retrain_seed=1), seed=4)       # another search key
    assert epochs.count("search") == 2
    epochs.clear()
    search_alpha(dataclasses.replace(cfg, noise_arch=0.5), seed=4)       # another search
    assert epochs.count("search") == 2
    search_memo.clear()
    epochs.clear()
    again, _ = search_alpha(dataclasses.replace(cfg, retrain_seed=2), seed=3)
    assert epochs.count("search") == 2                         # cleared: recomputed, equal
    for a, b in zip(again, fresh, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    # past its memory budget the memo stores nothing: the next run recomputes (and is equal)
    search_memo.clear()
    monkeypatch.setattr(search_memo, "max_bytes", lambda: 0)
    search_alpha(dataclasses.replace(cfg, retrain_seed=0), seed=3)
    epochs.clear()
    capped, _ = search_alpha(dataclasses.replace(cfg, retrain_seed=1), seed=3)
    assert epochs.count("search") == 2
    for a, b in zip(capped, fresh, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_the_memo_keeps_the_seeds_of_one_search_config_side_by_side():
    """Seeds stepped together store epoch t one after the other, each with its own data: all
    are kept (a new search config clears them)."""
    from fedjax_dp.algorithms.fnas import search_memo
    search_memo.clear()
    keys = [jax.random.key(s) for s in range(3)]
    for s, k in enumerate(keys):
        search_memo.store(TINY, f"data{s}", k, 0, {"w": np.full(2, s, np.float32)}, {"m": s}, 1.0)
    for s, k in enumerate(keys):
        value, metrics, _ = search_memo.lookup(dataclasses.replace(TINY, retrain_seed=5),
                                               f"data{s}", k, 0)
        assert float(value["w"][0]) == s and metrics == {"m": s}
    assert search_memo.lookup(TINY, "data0", keys[1], 0) is None       # another key
    search_memo.store(dataclasses.replace(TINY, noise_arch=3.0), "data0", keys[0], 0,
                      {"w": np.zeros(2, np.float32)}, {}, 1.0)
    assert search_memo.lookup(TINY, "data1", keys[1], 0) is None       # cleared
    search_memo.clear()
