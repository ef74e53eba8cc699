"""Client-level DP-FedAvg when agents hold different numbers of records: capped record weights
(McMahan et al. 2018) against a per-agent loop, the sensitivity kept at S, the ledger's event
unchanged and its unit stated."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dp.algorithms import api
from fedjax_dp.algorithms.averaging import dp_fedavg
from fedjax_dp.core import cohort, from_ragged
from fedjax_dp.models import make_model
from fedjax_dp.train import LocalTrainConfig, make_local_update

LOCAL = LocalTrainConfig(steps=2, batch_size=4, learning_rate=0.2)
SIZES = [2, 4, 6, 8, 10, 3]
CAP = 5.0


@pytest.fixture(scope="module")
def setup():
    r = np.random.default_rng(7)
    ys = [r.integers(0, 3, size=n) for n in SIZES]
    xs = [r.normal(size=(len(y), 5)).astype(np.float32) + y[:, None] for y in ys]
    model = make_model("mlp", (5,), 3, hidden=(6,))
    return api.FederatedData(agents=from_ragged(xs, ys), num_classes=3), model


def test_weighted_round_equals_the_per_agent_loop(setup):
    fed, model = setup
    cfg = dp_fedavg.Config(rounds=1, sampling_rate=0.7, clip_norm=0.05, noise_multiplier=0.0,
                           server_lr=1.0, local=LOCAL, weight_cap=CAP)
    key = jax.random.key(3)
    got = api.run(dp_fedavg, key, fed, model, cfg).state.values["params"]
    params = model.init(api.init_key(key))
    k_sample, k_train, _ = jax.random.split(api.step_key(key, 0), 3)
    update = jax.jit(make_local_update(model, LOCAL))
    data = fed.agents
    weights = [min(n / CAP, 1.0) for n in SIZES]               # 0.4 0.8 1 1 1 0.6
    total = jax.tree.map(jnp.zeros_like, params)
    contributions = []
    for i in cohort.sample_cohort(k_sample, len(SIZES), cohort.Sampling("poisson", rate=0.7)):
        local, _ = update(jax.random.fold_in(k_train, int(i)), params, data.x[i], data.y[i],
                          data.mask[i], data.counts[i])
        delta = jax.tree.map(jnp.subtract, local, params)
        scale = min(1.0, 0.05 / float(optax.tree.norm(delta))) * weights[i]
        contributions.append(float(optax.tree.norm(delta)) * scale)
        total = jax.tree.map(lambda t, d: t + d * scale, total, delta)
    want = jax.tree.map(lambda p, t: p + t / (0.7 * sum(weights)), params, total)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), got, want)
    assert max(contributions) <= 0.05 + 1e-7 and min(contributions) < 0.05   # <= S, some less


def test_ledger_event_unchanged_and_unit_stated(setup):
    base = dict(rounds=4, sampling_rate=0.5, clip_norm=1.0, noise_multiplier=1.2, local=LOCAL)
    weighted = dp_fedavg.ledger(dp_fedavg.Config(**base, weight_cap=CAP))
    plain = dp_fedavg.ledger(dp_fedavg.Config(**base))
    assert weighted.entries[0].event == plain.entries[0].event
    assert weighted.epsilon("agent", 1e-5) == plain.epsilon("agent", 1e-5)
    assert "whatever n_i" in weighted.entries[0].note
    with pytest.raises(ValueError, match="denominator"):
        dp_fedavg.Config(**base, weight_cap=CAP, denominator="sampled")
    with pytest.raises(ValueError, match="weight_cap"):
        dp_fedavg.Config(**base, weight_cap=0.0)
