"""Optimizers by name (fedjax_dp.train.optimizers) on both sides of an averaging round.

The clients' ``train.optimizer`` and the server's ``algorithm.server_optimizer`` take a name, a
table of any optax optimizer's keyword arguments (checked against its signature before any
work, one line naming the key) or an ``optax.GradientTransformation``. The server step follows
Reddi et al. 2021, Algorithm 1, checked against the optimizer applied by hand to the plain
round's mean update; ``sgd(1)`` is the plain step bit for bit; the optimizer's state goes
through fused calls, chunks, host-resident agents and seeds, and never changes the ledger."""
import dataclasses

import jax
import numpy as np
import optax
import pytest

from fedjax_dp.algorithms import api, rounds, seeds
from fedjax_dp.algorithms.averaging import dp_fedavg, dp_fedsgd
from fedjax_dp.core import from_ragged
from fedjax_dp.models import make_model
from fedjax_dp.train import LocalTrainConfig, optimizers, train_agents

LOCAL = LocalTrainConfig(steps=2, batch_size=4)
ADAM = {"name": "adam", "learning_rate": 0.05, "eps": 1e-3}
SIZES = [4, 6, 3, 5, 6, 2, 5, 4]


@pytest.fixture(scope="module")
def tiny():
    rs = np.random.default_rng(0)
    ys = [rs.integers(0, 3, size=n) for n in SIZES]
    xs = [rs.normal(size=(len(y), 5)).astype(np.float32) + y[:, None] for y in ys]
    fed = api.FederatedData(agents=from_ragged(xs, ys), num_classes=3)
    return fed, make_model("mlp", (5,), 3, hidden=(6,))


def _config(**kw):
    base = dict(rounds=3, sampling_rate=0.5, clip_norm=1.0, noise_multiplier=1.0, local=LOCAL)
    return dp_fedavg.Config(**{**base, **kw})


def _params(module, fed, model, config, runtime=api.Runtime(), key=0):
    result = api.run(module, jax.random.key(key), fed, model, config, runtime=runtime)
    return result.state


# ------------------------------------------------------------------ names, tables, refusals

@pytest.mark.parametrize("value,match", [
    ("adamx", "train.optimizer must name an optax optimizer .*did you mean adamax"),
    (3, "train.optimizer must be an optimizer name"),
    ({"learning_rate": 0.1}, "train.optimizer.name is missing"),
    ({"name": "adamw", "learning_rate": 1e-3, "weight_decayy": 1e-4},
     r"unknown key train.optimizer.weight_decayy: optax.adamw takes \[.*'weight_decay'"),
    ({"name": "adamw", "learning_rate": 1e-3, "weight_decay": "big"},
     "train.optimizer.weight_decay must be a number"),
    ({"name": "sgd", "learning_rate": 0.1, "nesterov": 1}, "train.optimizer.nesterov must be a "
                                                           "boolean"),
    ({"name": "adam"}, "train.optimizer.learning_rate is required by optax.adam"),
    ({"name": "adam", "learning_rate": 0.1, "mu_dtype": "x"}, "train.optimizer.mu_dtype cannot "
                                                              "be set from a config"),
    ({"name": "lbfgs", "learning_rate": 0.1}, "does not run as a round's optimizer"),
    ({"name": "momentum", "learning_rate": 0.1}, "is a shorthand of the string form"),
])
def test_a_bad_optimizer_is_refused_in_one_line_naming_the_key(value, match):
    with pytest.raises(ValueError, match=match) as info:
        LocalTrainConfig(optimizer=value)
    assert len(str(info.value).splitlines()) == 1


def test_server_optimizer_refusals():
    with pytest.raises(ValueError, match=r"algorithm.server_optimizer.b3: optax.adam"):
        _config(server_optimizer={**ADAM, "b3": 0.5})
    with pytest.raises(ValueError, match="algorithm.server_lr = 0.5 is not read with "
                                         r"algorithm.server_optimizer = optax.adam\("):
        _config(server_optimizer=ADAM, server_lr=0.5)
    with pytest.raises(ValueError, match="train.learning_rate = 0.5 is not read with"):
        LocalTrainConfig(learning_rate=0.5, optimizer=optax.sgd(0.1))
    _config(server_optimizer="momentum", server_lr=0.5)     # a name's rate is server_lr


def test_names_resolve_as_the_shorthands_always_did():
    assert {"sgd", "adam", "adamw", "adagrad", "yogi", "lamb", "rmsprop", "momentum"} <= \
        set(optimizers.names())
    assert "apply_updates" not in optimizers.names() and "chain" in optimizers.names()
    spec = optimizers.parse("k", {"name": "adamw", "learning_rate": 1e-3, "weight_decay": 1e-4})
    assert spec == optimizers.Named("adamw", (("learning_rate", 1e-3), ("weight_decay", 1e-4)))
    assert hash(LocalTrainConfig(optimizer=spec)) == hash(LocalTrainConfig(optimizer=spec.table()))
    params = {"w": np.ones(3, np.float32)}
    grads = {"w": np.array([1.0, -2.0, 0.5], np.float32)}
    for value, direct in [("sgd", optax.sgd(0.1)), ("adam", optax.adam(0.1)),
                          ("momentum", optax.sgd(0.1, momentum=0.9)),
                          ("yogi", optax.yogi(0.1)), (spec, optax.adamw(1e-3, weight_decay=1e-4))]:
        opt = optimizers.resolve(optimizers.parse("k", value), 0.1)
        got = opt.update(grads, opt.init(params), params)[0]["w"]
        want = direct.update(grads, direct.init(params), params)[0]["w"]
        np.testing.assert_array_equal(got, want)


def test_clients_take_a_table_or_a_transformation(tiny):
    fed, model = tiny
    params = model.init(jax.random.key(1))
    out = {}
    for name, opt in [("table", {"name": "adamw", "learning_rate": 1e-2, "weight_decay": 1e-3}),
                      ("optax", optax.adamw(1e-2, weight_decay=1e-3))]:
        cfg = LocalTrainConfig(steps=2, batch_size=4, optimizer=opt)
        out[name] = train_agents(jax.random.key(2), params, fed.agents, model, cfg,
                                 chunk_size=None)[0]
    jax.tree.map(np.testing.assert_array_equal, out["table"], out["optax"])


# ------------------------------------------------------------------ the server's step

@pytest.mark.parametrize("module", [dp_fedavg, dp_fedsgd], ids=["dp_fedavg", "dp_fedsgd"])
def test_server_sgd_1_is_the_plain_step_bit_for_bit(tiny, module):
    fed, model = tiny
    cfg = (_config(rounds=2) if module is dp_fedavg else
           dp_fedsgd.Config(rounds=2, sampling_rate=0.5, local=LOCAL, noise_multiplier=1.0))
    plain = _params(module, fed, model, cfg).values["params"]
    for opt in ("sgd", {"name": "sgd", "learning_rate": 1.0}, optax.sgd(1.0)):
        state = _params(module, fed, model, dataclasses.replace(cfg, server_optimizer=opt))
        jax.tree.map(np.testing.assert_array_equal, state.values["params"], plain)


def test_server_adam_is_algorithm_1_of_reddi_et_al(tiny):
    """theta_{t+1} = theta_t + adam.update(-Delta_t), Delta_t the plain round's mean update from
    theta_t with the round's key (the same cohort, training and noise)."""
    fed, model = tiny
    cfg = _config(server_optimizer=ADAM)
    key = jax.random.key(3)
    state = dp_fedavg.init(key, fed, model, cfg)
    plain_state = dp_fedavg.init(key, fed, model, _config())
    plain = plain_state.context.round_fn
    opt = optax.adam(0.05, eps=1e-3)
    theta, s = state.values["params"], opt.init(state.values["params"])
    for t in range(3):
        k_t = api.step_key(key, t)
        moved, _ = plain.one({**plain_state.values, "params": theta}, k_t)
        delta = jax.tree.map(np.subtract, moved["params"], theta)
        u, s = opt.update(jax.tree.map(np.negative, delta), s, theta)
        theta = optax.apply_updates(theta, u)
        state, _ = dp_fedavg.step(state, k_t)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
                     state.values["params"], theta)
    assert int(state.values["stages"][5][0].count) == 3


def test_server_state_through_fused_calls_chunks_host_agents_and_seeds(tiny):
    """The server's momentum through fused calls of 3 rounds over chunks of 2 agents, and the
    rounds on host-resident agents, equal one round per call (:func:`dp_fedavg.step`); two
    seeds stepped together equal each seed stepped alone."""
    fed, model = tiny
    cfg = _config(server_optimizer={"name": "sgd", "learning_rate": 0.7, "momentum": 0.9})
    close = lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)  # noqa: E731
    keys = [jax.random.key(s) for s in (0, 1)]
    states = [dp_fedavg.init(k, fed, model, cfg) for k in keys]
    alone = [dp_fedavg.init(k, fed, model, cfg) for k in keys]
    batch = seeds.seed_batch(dp_fedavg, states)
    for t in range(cfg.rounds):
        step_keys = [api.step_key(k, t) for k in keys]
        alone = [dp_fedavg.step(a, k)[0] for a, k in zip(alone, step_keys)]
        if t < 2:
            states, _ = batch(states, step_keys)
            for s, a in zip(states, alone):
                jax.tree.map(close, s.values, a.values)
    want = alone[0].values                       # key 0, one round per call
    for runtime, data in [(api.Runtime(rounds_per_call=3, chunk_size=2), fed),
                          (api.Runtime(), dataclasses.replace(fed, agents=fed.agents.on_host()))]:
        got = _params(dp_fedavg, data, model, cfg, runtime).values
        jax.tree.map(close, got, want)


NOISES = {
    "gaussian": {},
    "adaptive_clip": {"adaptive_clip": {"target_quantile": 0.5, "learning_rate": 0.3,
                                        "count_noise": 2.0}},
    "banded_mf": {"noise": {"kind": "banded_mf", "bands": 2}},
    "blt": {"noise": {"kind": "blt", "min_sep": 2, "buf_decay": [0.9, 0.4],   # given: no
                      "output_scale": [0.2, 0.3]}},                          # optimisation
    "tree": {"noise": {"kind": "tree", "min_sep": 2}},
    "secagg": {"aggregation": "secagg", "sampling": "fixed", "cohort_size": 4},
    "ddg": {"aggregation": "secagg", "sampling": "fixed", "cohort_size": 4,
            "distributed_noise": {"kind": "ddg", "bits": 16}},
    "skellam": {"aggregation": "secagg", "sampling": "fixed", "cohort_size": 4,
                "distributed_noise": {"kind": "skellam", "bits": 16}},
}


@pytest.mark.parametrize("extra", NOISES.values(), ids=NOISES.keys())
def test_every_noise_takes_server_adam_and_the_ledger_is_unchanged(tiny, extra):
    """Post-processing of the private release: the same epsilon with and without it. Each
    config's initial state holds the server's Adam state (the chain's last stage) and gives the
    ledger N and d; each noise's rounds with a server Adam run end to end in
    tests/test_stage_matrix.py (its cover holds every pair noise x adam and asserts finite,
    moved parameters and Adam's count)."""
    fed, model = tiny
    cfg = _config(rounds=2, **extra)
    state = dp_fedavg.init(jax.random.key(0), fed, model,
                           dataclasses.replace(cfg, server_optimizer=ADAM))
    assert isinstance(state.values["stages"][5][0], optax.ScaleByAdamState)   # the server's
    report = dp_fedavg.ledger(dataclasses.replace(cfg, server_optimizer=ADAM), state)
    assert report.report(delta=1e-3) == dp_fedavg.ledger(cfg, state).report(delta=1e-3)
    assert report.epsilon("agent", delta=1e-3) > 0


def test_a_divergence_names_the_tables_rates():
    from fedjax_dp.experiments import runner
    msg = runner.divergence_message(
        {"train": {"learning_rate": 0.1, "optimizer": {"name": "adamw", "learning_rate": 0.02}},
         "algorithm": {"server_lr": 1.0, "server_optimizer": {"name": "adam",
                                                             "learning_rate": 3.0}}},
        2, "train_loss")
    assert "train.optimizer.learning_rate (0.02)" in msg and "train.learning_rate" not in msg
    assert "algorithm.server_optimizer.learning_rate (3)" in msg
