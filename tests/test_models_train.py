import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dp.core import from_ragged
from fedjax_dp.models import forward_flops, make_model
from fedjax_dp.privacy.clipping import clipped_grad_sum
from fedjax_dp.train import (LocalTrainConfig, accuracy, cross_entropy, make_local_update,
                             per_agent_accuracy, train_agents)

CFG = LocalTrainConfig(steps=4, batch_size=4, learning_rate=0.1)


@pytest.fixture(scope="module")
def tiny():
    """5 agents with ragged data (3 classes, 6 features) and a small MLP."""
    r = np.random.default_rng(0)
    sizes = [3, 7, 5, 1, 6]
    means = r.normal(size=(3, 6)) * 2
    ys = [r.integers(0, 3, size=n) for n in sizes]
    xs = [(means[y] + r.normal(size=(len(y), 6))).astype(np.float32) for y in ys]
    model = make_model("mlp", (6,), 3, hidden=(8,))
    return from_ragged(xs, ys), model, model.init(jax.random.key(0))


@pytest.mark.parametrize("name,shape", [("logistic", (30,)), ("mlp", (8, 8, 1)),
                                        ("cnn", (8, 8, 1))])
def test_models_apply_one_example(name, shape):
    m = make_model(name, shape, 4)
    p = jax.jit(m.init)(jax.random.key(0))
    batch = jnp.asarray(np.random.default_rng(0).normal(size=(3,) + shape), jnp.float32)

    @jax.jit                                          # one compiled program (eager: per op)
    def run(p, batch):
        # per-example gradients are vmap(grad)
        g = jax.vmap(jax.grad(cross_entropy(m)), (None, 0, 0))(p, batch, jnp.array([0, 1, 2]))
        return m.apply(p, jnp.zeros(shape)), m.logits(p, batch), m.apply(p, batch[1]), g
    out, logits, one, g = run(p, batch)
    assert out.shape == (4,)
    np.testing.assert_allclose(logits[1], one, rtol=1e-5, atol=1e-6)
    assert all(l.shape[0] == 3 for l in jax.tree.leaves(g))


def test_model_errors_and_flops():
    with pytest.raises(ValueError, match="model.name"):
        make_model("resnet", (8,), 3)
    with pytest.raises(ValueError, match="cnn"):
        make_model("cnn", (64,), 3)
    with pytest.raises(ValueError, match="num_classes"):
        make_model("mlp", (4,), 1)
    m = make_model("mlp", (10,), 3, hidden=(5,))
    assert forward_flops(m, m.init(jax.random.key(0))) == 2 * (10 * 5 + 5 * 3)


def test_local_train_config_validation():
    with pytest.raises(ValueError, match="train.learning_rate"):
        LocalTrainConfig(learning_rate=-1.0)
    with pytest.raises(ValueError, match="train.optimizer"):
        LocalTrainConfig(optimizer="lbfgs")
    with pytest.raises(ValueError, match="train.batch_size"):
        LocalTrainConfig(batch_size=0)


def _close(a, b, tol=1e-5):
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=tol, atol=tol), a, b)


def test_vmapped_training_equals_per_agent_loop(tiny):
    data, model, params = tiny
    key = jax.random.key(1)
    vm = train_agents(key, params, data, model, CFG)
    lp = train_agents(key, params, data, model, CFG, backend="loop")
    _close(vm, lp)
    # and equals calling the one-agent update by hand with agent i's key
    update = jax.jit(make_local_update(model, CFG))
    keys = jax.random.split(key, data.num_agents)
    i = 3
    p_i, l_i = update(keys[i], params, data.x[i], data.y[i], data.mask[i], data.counts[i])
    _close(jax.tree.map(lambda l: l[i], vm[0]), p_i)
    # agents really trained differently
    assert not np.allclose(vm[0]["params"]["Dense_0"]["kernel"][0],
                           vm[0]["params"]["Dense_0"]["kernel"][1])


def test_chunked_training_equals_plain(tiny):
    data, model, params = tiny
    key = jax.random.key(2)
    plain = train_agents(key, params, data, model, CFG)
    _close(train_agents(key, params, data, model, CFG, chunk_size=2), plain)


def test_stored_batching_is_plain_sgd_over_the_records_in_order(tiny):
    """``batching = "stored"``: step t trains on rows (t B + b) mod count, the same for every
    key; checked against plain SGD written out with numpy indexing and optax's gradient."""
    data, model, params = tiny
    cfg = LocalTrainConfig(steps=5, batch_size=3, learning_rate=0.1, batching="stored")
    with pytest.raises(ValueError, match="train.batching"):
        LocalTrainConfig(batching="shuffled")
    update = jax.jit(make_local_update(model, cfg))
    loss = lambda p, x, y: jnp.mean(cross_entropy(model)(p, x, y) if x.ndim == 1 else
                                    jax.vmap(cross_entropy(model), (None, 0, 0))(p, x, y))
    sgd = jax.jit(lambda p, x, y: jax.tree.map(lambda pl, gl: pl - cfg.learning_rate * gl, p,
                                               jax.grad(loss)(p, x, y)))
    for i in (1, 3):                              # 7 records (cycled twice), 1 record
        n = int(data.counts[i])
        want = params
        for t in range(cfg.steps):
            rows = np.arange(t * cfg.batch_size, (t + 1) * cfg.batch_size) % n
            want = sgd(want, data.x[i][rows], data.y[i][rows])
        got, _ = update(jax.random.key(7), params, data.x[i], data.y[i], data.mask[i],
                        data.counts[i])
        other, _ = update(jax.random.key(8), params, data.x[i], data.y[i], data.mask[i],
                          data.counts[i])
        _close(got, want)
        _close(got, other, tol=0)                 # the key is not read
    # the default draws with replacement: keys matter
    drawn = [train_agents(jax.random.key(k), params, data, model, CFG)[0] for k in (7, 8)]
    assert not np.allclose(jax.tree.leaves(drawn[0])[0], jax.tree.leaves(drawn[1])[0])


def test_stacked_init_per_agent(tiny):
    data, model, _ = tiny
    stacked = jax.jit(jax.vmap(model.init))(jax.random.split(jax.random.key(3), data.num_agents))
    p, _ = train_agents(jax.random.key(4), stacked, data, model, CFG, shared_init=False)
    assert jax.tree.leaves(p)[0].shape[0] == data.num_agents


def test_padding_never_contributes(tiny):
    data, model, params = tiny
    poisoned = jax.tree.map(lambda l: l, data)
    pad = ~data.mask
    x = jnp.where(pad[..., None], 1e6, data.x)
    y = jnp.where(pad, 2, data.y)
    poisoned = type(data)(x=x, y=y, mask=data.mask, counts=data.counts)
    key = jax.random.key(5)
    _close(train_agents(key, params, poisoned, model, CFG),
           train_agents(key, params, data, model, CFG))


def test_empty_agent_rejected_before_training(tiny):
    _, model, params = tiny
    d = from_ragged([np.ones((2, 6)), np.ones((0, 6))], [np.zeros(2, int), np.zeros(0, int)],
                    allow_empty=True)
    with pytest.raises(ValueError, match=r"agents \[1\] have no records"):
        train_agents(jax.random.key(0), params, d, model, CFG)


def test_training_learns_and_evaluation(tiny):
    data, model, params = tiny
    r = np.random.default_rng(0)
    means = np.random.default_rng(0).normal(size=(3, 6)) * 2
    yt = r.integers(0, 3, 300)
    xt = (means[yt] + r.normal(size=(300, 6))).astype(np.float32)
    cfg = LocalTrainConfig(steps=150, batch_size=8, learning_rate=0.1)
    big = from_ragged([xt[:150], xt[150:]], [yt[:150], yt[150:]])
    p, losses = train_agents(jax.random.key(6), params, big, model, cfg)
    accs = per_agent_accuracy(model, p, xt, yt)
    assert accs.shape == (2,) and np.all(accs > 0.8)
    assert accuracy(model, jax.tree.map(lambda l: l[0], p), xt, yt) == pytest.approx(accs[0])
    assert accuracy(model, params, xt, yt) < 0.8


def test_clipped_grad_sum_matches_loop(tiny):
    data, model, params = tiny
    loss = cross_entropy(model)
    x, y = data.x[1], data.y[1]
    w = data.mask[1].astype(jnp.float32).at[2].set(0.0)
    clip = 0.3
    clipped = jax.jit(clipped_grad_sum, static_argnums=0)      # compiled (eager: per op)
    summed, norms = clipped(loss, params, x, y, w, clip)
    expect = jax.tree.map(lambda l: np.zeros(l.shape, np.float64), params)
    grad = jax.jit(jax.grad(loss))                  # one example at a time (compiled once)
    for b in range(x.shape[0]):
        g = jax.tree.map(np.asarray, grad(params, x[b], y[b]))
        n = float(np.sqrt(sum(float(np.sum(l.astype(np.float64) ** 2))
                              for l in jax.tree.leaves(g))))
        assert norms[b] == pytest.approx(n, rel=1e-4)
        s = float(w[b]) * min(1.0, clip / n)
        expect = jax.tree.map(lambda e, gl: e + s * gl, expect, g)
    _close(summed, expect, tol=1e-5)
    # each example's contribution is within the clip norm: the sum's sensitivity is clip
    one, _ = clipped(loss, params, x[:1], y[:1], jnp.ones(1), clip)
    assert float(optax.tree.norm(one)) <= clip + 1e-6


def test_auto_chunk_size_is_cache_sized_and_results_identical(tiny):
    from fedjax_dp.core import auto_chunk_size
    from fedjax_dp.core.lift import agent_bytes, resolve_chunk_size
    from fedjax_dp.privacy.private_grad import per_example_bytes
    assert auto_chunk_size(1 << 20, 1000) == 8                 # 8 MiB budget / 1 MiB per agent
    assert auto_chunk_size(1 << 10, 1000) is None              # everything fits: no chunking
    assert auto_chunk_size(1 << 15, 1000) is None              # 256 per chunk: < 4 chunks
    assert auto_chunk_size(1 << 16, 1000, budget_bytes=1 << 20) == 16
    data, model, params = tiny
    assert resolve_chunk_size(None, bytes_per_agent=1, num_agents=5) is None
    assert resolve_chunk_size(2, bytes_per_agent=1, num_agents=5) == 2
    one = sum(l.size * 4 for l in jax.tree.leaves(params))
    stacked = jax.tree.map(lambda l: jnp.stack([l] * 5), params)
    assert agent_bytes(stacked, 5) == agent_bytes(params, 5) == agent_bytes(params) == one
    assert per_example_bytes(params, 7) == 10 * one
    assert resolve_chunk_size("auto", bytes_per_agent=1 << 20, num_agents=1000) == \
        auto_chunk_size(1 << 20, 1000) == 8


def test_predict_is_one_compiled_program_equal_to_the_eager_logits():
    """``predict``: batches of one shape (the last padded and cut), equal to the argmax of the
    model's logits on all rows at once."""
    from fedjax_dp.train import predict
    model = make_model("mlp", (5,), 3, hidden=(7,))
    params = model.init(jax.random.key(0))
    x = np.random.default_rng(0).normal(size=(23, 5)).astype(np.float32)
    want = np.argmax(np.asarray(model.logits(params, x)), -1)
    for batch in (4, 23, 100):
        got = predict(model, params, x, batch_size=batch)
        assert isinstance(got, np.ndarray)
        np.testing.assert_array_equal(got, want)
    assert predict(model, params, x[:0]).shape == (0,)
