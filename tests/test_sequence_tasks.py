"""Sequence (next-token) tasks through the engine: the per-example loss and per-token accuracies
against loops over examples and positions, the data checks, per-example clipping of sequences,
and FedAvg, DP-FedAvg, DP-FedSGD and ISRL-DP MB-SGD learning a generated next-token rule.

Tiny shapes: T = 6, vocabulary 12, 4 agents, a bigram stand-in model (an embedding and a
dense layer per position) so that the compiled functions stay small.
"""
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dp.algorithms import api, isrl
from fedjax_dp.algorithms.averaging import dp_fedavg, dp_fedsgd, fedavg
from fedjax_dp.core import from_arrays, from_ragged
from fedjax_dp.data import Dataset
from fedjax_dp.privacy import batch_selection, clip_by_global_norm, clipping, private_grad
from fedjax_dp.models import Model, make_model, tasks
from fedjax_dp.train import (LocalTrainConfig, accuracy, cross_entropy, minibatch_loss,
                             per_agent_accuracy)

T, V = 6, 12
PAD, OOV, BOS, EOS = 0, 9, 10, 11
TASK = tasks.NextToken(V, pad_id=PAD, oov_ids=(OOV,), bos_id=BOS, eos_id=EOS)


def _init(key):
    k1, k2 = jax.random.split(key)
    return {"emb": 0.3 * jax.random.normal(k1, (V, 8)), "w": 0.3 * jax.random.normal(k2, (8, V)),
            "b": jnp.zeros((V,))}


def _apply(params, x):                      # x [T] int -> logits [T, V] (a bigram model)
    return params["emb"][x] @ params["w"] + params["b"]


MODEL = Model(init=_init, apply=_apply, name="bigram_test", feature_shape=(T,), num_classes=V,
              task=TASK)


def sequences(rng, n):
    """``n`` sentences of 1..T-1 tokens following the rule t -> t mod 9 + 1 (9 is the OOV id),
    from a random first token: x = [BOS, t_1..t_L, pad..], y = [t_1..t_L, EOS, pad..]."""
    x = np.zeros((n, T), np.int32)
    y = np.zeros((n, T), np.int32)
    for i in range(n):                      # test data generation
        length = int(rng.integers(1, T))
        toks = [(int(rng.integers(0, 9)) + k) % 9 + 1 for k in range(length)]
        x[i, :length + 1] = [BOS] + toks
        y[i, :length + 1] = toks + [EOS]
    return x, y


@pytest.fixture(scope="module")
def fed():
    rng = np.random.default_rng(0)
    pairs = [sequences(rng, n) for n in (10, 7, 12, 9)]
    agents = from_ragged([p[0] for p in pairs], [p[1] for p in pairs], dtype=np.int32)
    return api.FederatedData(agents=agents, num_classes=V)


@jax.jit
def _mean_loss(params, x, y):
    """The mean per-sequence loss over records ``x, y [M, T]`` (compiled once, shared)."""
    return jnp.mean(jax.vmap(cross_entropy(MODEL), in_axes=(None, 0, 0))(params, x, y))


def _real_tokens(data):
    x = np.concatenate([data.local(i)[0] for i in range(data.num_agents)])
    y = np.concatenate([data.local(i)[1] for i in range(data.num_agents)])
    return x, y


# --------------------------------------------------------------------------- loss and metrics

def test_loss_and_token_accuracies_equal_loops():
    rng = np.random.default_rng(1)
    x, y = sequences(rng, 7)
    y[3] = PAD                                            # a record of padding only
    y[1, 2] = OOV
    params = _init(jax.random.key(2))
    loss = jax.jit(cross_entropy(MODEL))
    logits = np.asarray(jax.jit(MODEL.logits)(params, jnp.asarray(x)), np.float64)   # [M, T, V]
    for i in range(len(x)):                               # the loop of eq. (1)
        terms = []
        for t in range(T):
            if y[i, t] != PAD:
                z = logits[i, t]
                terms.append(np.log(np.sum(np.exp(z - z.max()))) + z.max() - z[y[i, t]])
        want = np.mean(terms) if terms else 0.0
        np.testing.assert_allclose(float(loss(params, x[i], y[i])), want, rtol=1e-5, atol=1e-6)
    # the minibatch loss weights records equally (a sequence's loss is its token mean)
    w = np.array([1, 1, 0, 1, 1, 0, 1], np.float32)
    per = np.array([float(loss(params, x[i], y[i])) for i in range(len(x))])
    np.testing.assert_allclose(float(jax.jit(minibatch_loss(MODEL))(params, x, y, w)),
                               np.sum(w * per) / np.sum(w), rtol=1e-5)

    pred = logits.argmax(-1)
    pred[0, :2] = y[0, :2]                                # some hits, including an EOS hit
    pred[0, np.flatnonzero(y[0] == EOS)] = EOS
    counts = {k: [0, 0] for k in ("accuracy", "accuracy_no_oov", "accuracy_no_oov_or_eos")}
    for i in range(len(y)):                               # brute-force token counts
        for t in range(T):
            tok = y[i, t]
            hit = int(pred[i, t] == tok)
            if tok == PAD:
                continue
            counts["accuracy"][0] += hit
            counts["accuracy"][1] += 1
            if tok != OOV:
                counts["accuracy_no_oov"][0] += hit
                counts["accuracy_no_oov"][1] += 1
                if tok != EOS:
                    counts["accuracy_no_oov_or_eos"][0] += hit
                    counts["accuracy_no_oov_or_eos"][1] += 1
    got = TASK.metrics(pred, y)
    for k, (hits, total) in counts.items():
        assert got[k] == pytest.approx(hits / total)
    assert got["num_tokens"] == counts["accuracy"][1]
    assert got["accuracy_no_oov_or_eos"] != got["accuracy"]
    # per token, not the mean of per-sequence accuracies
    per_seq = [np.mean(pred[i][y[i] != PAD] == y[i][y[i] != PAD]) for i in range(len(y))
               if (y[i] != PAD).any()]
    assert got["accuracy"] != pytest.approx(np.mean(per_seq))
    # the evaluation functions and the algorithms' Output agree with the counts
    model_acc = TASK.metrics(logits.argmax(-1), y)["accuracy"]
    assert accuracy(MODEL, params, x, y) == pytest.approx(model_acc)
    assert api.Output(model=MODEL, params=params).score(x, y) == pytest.approx(model_acc)
    stacked = jax.tree.map(lambda a: jnp.stack([a, a]), params)
    np.testing.assert_allclose(per_agent_accuracy(MODEL, stacked, x, y), [model_acc] * 2,
                               rtol=1e-6)


def test_classification_is_the_default_task():
    model = make_model("logistic", (3,), 4)
    assert tasks.of(model) is tasks.CLASSIFICATION and tasks.attach(model, None) is model
    params = model.init(jax.random.key(0))
    x, y = jnp.ones((3,)), jnp.int32(2)
    want = optax.softmax_cross_entropy_with_integer_labels(model.apply(params, x), y)
    assert float(cross_entropy(model)(params, x, y)) == float(want)     # bit-identical


# --------------------------------------------------------------------------- checks

def test_task_and_data_checks():
    d = tasks.to_dict(TASK)
    assert json.loads(json.dumps(d)) == d and tasks.from_dict(d) == TASK
    assert tasks.from_dict({"kind": "classification"}) is tasks.CLASSIFICATION
    for bad, match in [({"kind": "next_token"}, "vocab_size"),
                       ({"kind": "next_token", "vocab_size": 5, "eos": 3}, "unknown"),
                       ({"kind": "bigram"}, "kind"),
                       ({"kind": "next_token", "vocab_size": 5, "pad_id": 5}, "pad_id"),
                       ({"kind": "next_token", "vocab_size": 5, "oov_ids": [1], "eos_id": 1},
                        "distinct")]:
        with pytest.raises(ValueError, match=match):
            tasks.from_dict(bad)
    with pytest.raises(ValueError, match="vocab_size"):
        tasks.attach(make_model("logistic", (T,), V + 1), TASK)

    x, y = sequences(np.random.default_rng(3), 5)
    ds = Dataset("seq", x, y, x[:2], y[:2], x, y, num_classes=V, task=TASK)
    assert ds.x_train.dtype == np.int32 and ds.y_train.shape == (5, T)
    for kwargs, match in [(dict(y_train=y[:, :4]), "same shape"),
                          (dict(y_train=y[:, 0]), r"\[n, T\]"),
                          (dict(x_train=x.astype(np.float32)), "integer token ids"),
                          (dict(y_test=np.full_like(y, V)), r"y_test must be in \[0, 11\]"),
                          (dict(num_classes=V + 1), "vocab_size")]:
        args = dict(name="seq", x_train=x, y_train=y, x_public=x[:2], y_public=y[:2],
                    x_test=x, y_test=y, num_classes=V, task=TASK)
        args.update(kwargs)
        with pytest.raises(ValueError, match=match):
            Dataset(**args)
    # stacked sequences: y [N, n_max, T]; a y whose leading axes do not match is refused
    data = from_arrays(np.stack([x, x]), np.stack([y, y]), np.array([5, 3]))
    assert data.y.shape == (2, 5, T) and data.local(1)[1].shape == (3, T)
    with pytest.raises(ValueError, match="y must have shape"):
        from_arrays(np.stack([x, x]), y, np.array([5, 3]))


# --------------------------------------------------------------------------- clipping

def test_per_sequence_clipping(fed):
    data = fed.agents
    x, y = np.asarray(data.x[2]), np.asarray(data.y[2])          # 12 sequences of one agent
    params = _init(jax.random.key(4))
    loss = cross_entropy(MODEL)
    per_example = jax.jit(lambda p, a, b: clipping.per_example_grads(loss, p, a, b))
    rows = per_example(params, x, y)                             # vmapped over sequences
    grad = jax.jit(jax.grad(loss))
    for i in range(len(x)):                                      # equals one grad per sequence
        g = grad(params, x[i], y[i])
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a[i], b, rtol=1e-5, atol=1e-7),
                     rows, g)
    row_norms = jax.jit(jax.vmap(optax.tree.norm))
    norms = np.asarray(row_norms(rows))
    clip = float(np.median(norms))
    clipped, _ = jax.jit(jax.vmap(clip_by_global_norm, in_axes=(0, None)))(rows, clip)
    after = np.asarray(row_norms(clipped))
    assert np.all(after <= clip * (1 + 1e-5)) and np.any(norms > clip)
    np.testing.assert_allclose(after, np.minimum(norms, clip), rtol=1e-5)
    # the primitive's selected-rows sum equals the loop over the selected sequences
    weights = jnp.asarray(np.arange(len(x)) % 3 == 0, jnp.float32)
    total, stats = jax.jit(lambda w: clipping.clipped_sum(
        private_grad.gradient_fn(loss, params), (x, y), w, clip,
        batch_selection.RowPlan(first=2, step=2)))(weights)
    want = jax.tree.map(lambda c: jnp.tensordot(weights, c, axes=(0, 0)), clipped)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), total, want)
    assert int(stats["count"]) == 4
    # a position whose target is padding does not touch the loss or the gradient
    x2 = x.copy()
    x2[y == PAD] = OOV
    g2 = per_example(params, x2, y)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), rows, g2)


# --------------------------------------------------------------------------- algorithms

LOCAL = LocalTrainConfig(steps=4, batch_size=4, learning_rate=1.0)

CASES = {
    "fedavg": (fedavg, fedavg.Config(rounds=6, local=LOCAL)),
    "dp_fedavg": (dp_fedavg, dp_fedavg.Config(rounds=6, sampling_rate=1.0, clip_norm=2.0,
                                              noise_multiplier=0.1, local=LOCAL)),
    "dp_fedsgd": (dp_fedsgd, dp_fedsgd.Config(rounds=6, clip_norm=1.0, noise_multiplier=0.3,
                                              local=LOCAL)),
    "isrl_mb_sgd": (isrl.ALGORITHMS["isrl_mb_sgd"],
                    isrl.ALGORITHMS["isrl_mb_sgd"].Config(rounds=20, batch_size=8,
                                                          learning_rate=3.0,
                                                          noise_multiplier=0.3)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_algorithms_learn_a_next_token_rule(fed, name):
    algo, cfg = CASES[name]
    key = jax.random.key(5)
    x, y = _real_tokens(fed.agents)
    state = algo.init(key, fed, MODEL, cfg, api.Runtime())
    start = algo.output(state).params
    result = api.run(algo, key, fed, MODEL, cfg, state=state)
    end = algo.output(result.state).params
    before, after = float(_mean_loss(start, x, y)), float(_mean_loss(end, x, y))
    assert after < 0.8 * before, (name, before, after)
    assert accuracy(MODEL, end, x, y) > accuracy(MODEL, start, x, y) + 0.1
