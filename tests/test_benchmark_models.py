"""The benchmark models (FedAvg CNN, GroupNorm ResNet-18, char/word LSTMs, causal transformer):
per-example gradients, shapes, causality, published parameter counts, option errors, FLOPs.

Tiny sizes only (8x8 images, width 4, T = 5, vocabulary 11); the default-size parameter counts
come from ``jax.eval_shape`` (shapes, no initialisation)."""
import math

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dp.models import (MODEL_OPTIONS, SEQUENCE_MODELS, forward_flops, make_model,
                              model_options)

T, V, B = 5, 11, 3
TINY = {
    "cnn_emnist": ((8, 8, 1), 5, {"conv_channels": [4, 8], "dense": 16}),
    # the ResNet's layers (3x3 stem, identity and 1x1-conv shortcuts, GroupNorm, pooling) in two
    # stages of one block (compiling all 18 layers' gradients takes ~10 s on the test machine)
    "resnet18_gn": ((8, 8, 3), 5, {"width": 4, "groups": 2, "stage_blocks": [1, 1]}),
    "char_lstm": ((T,), V, {"embed_dim": 3, "hidden": 6}),
    "word_lstm": ((T,), V, {"embed_dim": 3, "hidden": 6, "projection": 4}),
    "transformer_lm": ((T,), V, {"embed_dim": 8, "heads": 2, "layers": 1, "mlp": 16}),
}
CHANGED = 3          # sequences: x[1] is x[0] with token 3 replaced (the causality check)


def n_params(model) -> int:
    shapes = jax.eval_shape(model.init, jax.random.key(0))
    return sum(math.prod(l.shape) for l in jax.tree.leaves(shapes))


def random_params(model, seed: int):
    """Parameters of the model's shapes (``eval_shape``: no init compile), random values of the
    init's scale (``1 / sqrt(fan_in)`` for matrices, ``1 + noise`` for norm scales)."""
    rng = np.random.default_rng(seed)
    shapes = jax.eval_shape(model.init, jax.random.key(0))

    def fill(path, s):
        if len(s.shape) >= 2:
            return (rng.normal(size=s.shape) / math.sqrt(math.prod(s.shape[:-1]))).astype(s.dtype)
        base = 1.0 if "scale" in jax.tree_util.keystr(path) else 0.0
        return (base + 0.1 * rng.normal(size=s.shape)).astype(s.dtype)
    return jax.tree_util.tree_map_with_path(fill, shapes)


def example_loss(model):
    """Cross-entropy of one example: a label for images, summed over non-pad (y != 0) positions
    for sequences."""
    def loss(params, x, y):
        logits = model.apply(params, x)
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, y)
        return jnp.sum(jnp.where(y != 0, ce, 0.0)) if model.name in SEQUENCE_MODELS else ce
    return loss


def make_batch(name, seed: int):
    shape, classes, _ = TINY[name]
    rng = np.random.default_rng(seed)
    if name in SEQUENCE_MODELS:
        x = rng.integers(1, V, size=(B, T)).astype(np.int32)
        x[1] = x[0]
        x[1, CHANGED] = x[0, CHANGED] % (V - 1) + 1      # another non-pad token
        y = np.concatenate([x[:, 1:], np.zeros((B, 1), np.int32)], axis=1)   # last: pad
        y[2, 2:] = 0                                      # example 2 has two real targets
        return jnp.asarray(x), jnp.asarray(y)
    return (jnp.asarray(rng.normal(size=(B,) + shape), jnp.float32),
            jnp.asarray(rng.integers(0, classes, size=B), jnp.int32))


#: XLA's CPU backend at optimisation level 0 compiles these graphs in about half the time (the
#: results are the same computation; only the machine code is less optimised)
FAST_COMPILE = {"xla_backend_optimization_level": 0}


@pytest.fixture(scope="module", params=sorted(TINY))
def tiny(request):
    """A tiny model of each kind and, from ONE compiled function: the vmapped per-example
    gradients, the same gradients from a sequential loop over single examples (``lax.map`` of
    the unbatched ``grad``) and the batched logits."""
    name = request.param
    shape, classes, options = TINY[name]
    model = make_model(name, shape, classes, options=options)
    params = random_params(model, 1)
    x, y = make_batch(name, 2)
    grad = jax.grad(example_loss(model))

    def everything(params, x, y):
        return (jax.vmap(grad, (None, 0, 0))(params, x, y),
                jax.lax.map(lambda xy: grad(params, *xy), (x, y)),
                model.logits(params, x))
    compiled = jax.jit(everything).lower(params, x, y).compile(compiler_options=FAST_COMPILE)
    return name, model, params, (x, y), compiled(params, x, y)


def test_per_example_gradients_equal_a_loop(tiny):
    name, model, params, _, (vmapped, looped, _) = tiny
    jax.tree.map(lambda v, l: np.testing.assert_allclose(v, l, rtol=2e-4, atol=2e-6),
                 vmapped, looped)
    flat = np.asarray(jax.vmap(lambda g: jax.flatten_util.ravel_pytree(g)[0])(vmapped))
    assert flat.shape == (B, model.num_params(params))
    assert np.isfinite(flat).all()
    # every example has its own gradient (the check above is not comparing constants)
    assert np.abs(flat[0] - flat[1]).max() > 1e-6 and np.abs(flat[1] - flat[2]).max() > 1e-6


def test_shapes_and_batched_logits(tiny):
    name, model, _, _, (_, _, logits) = tiny
    shape, classes, _ = TINY[name]
    expected = (B, T, V) if name in SEQUENCE_MODELS else (B, classes)
    assert logits.shape == expected and model.num_classes == classes
    assert model.feature_shape == shape and np.isfinite(np.asarray(logits)).all()


def test_sequence_models_are_causal(tiny):
    name, _, _, (x, _), (_, _, logits) = tiny
    if name not in SEQUENCE_MODELS:
        pytest.skip("an image model")
    assert int(x[0, CHANGED]) != int(x[1, CHANGED])
    # logits at t < CHANGED see only x[:t + 1], equal in both sequences; at CHANGED they differ
    np.testing.assert_allclose(logits[0, :CHANGED], logits[1, :CHANGED], rtol=1e-6, atol=1e-6)
    assert float(jnp.abs(logits[0, CHANGED:] - logits[1, CHANGED:]).max()) > 1e-6


def lstm(inp: int, hidden: int) -> int:
    """A Keras/flax LSTM layer: four gates, each ``W_x [in, h]``, ``W_h [h, h]``, bias ``[h]``."""
    return 4 * (hidden * (inp + hidden) + hidden)


def test_parameter_counts_at_published_sizes():
    # McMahan et al. 2017, section 3: "1,663,370 total parameters" (MNIST, 28x28, 10 classes)
    assert n_params(make_model("cnn_emnist", (28, 28, 1), 10)) == 1_663_370
    assert n_params(make_model("cnn_emnist", (28, 28, 1), 62)) == 1_663_370 - 5_130 + 512 * 62 + 62
    # CIFAR ResNet-18 (3x3 stem): 11,173,962 with 10 classes; GroupNorm has BatchNorm's 2C
    # affine parameters; CIFAR-100 adds 90 classes to the 512-wide head
    assert n_params(make_model("resnet18_gn", (32, 32, 3), 10)) == 11_173_962
    assert n_params(make_model("resnet18_gn", (32, 32, 3), 100)) == 11_173_962 + 90 * 513
    imagenet = make_model("resnet18_gn", (32, 32, 3), 10, options={"stem": "imagenet"})
    assert n_params(imagenet) == 11_173_962 + (7 * 7 - 3 * 3) * 3 * 64
    # TFF / Reddi et al. 2021 layouts: Shakespeare (V = 90), StackOverflow (V = 10,004)
    char = 90 * 8 + lstm(8, 256) + lstm(256, 256) + 256 * 90 + 90
    assert n_params(make_model("char_lstm", (80,), 90)) == char == 820_522
    word = 10_004 * 96 + lstm(96, 670) + 670 * 96 + 96 + 96 * 10_004 + 10_004
    assert n_params(make_model("word_lstm", (20,), 10_004)) == word == 4_050_748
    # the options change the sizes (defaults are the literature's)
    one_layer = make_model("char_lstm", (80,), 90, options={"layers": 1})
    assert n_params(one_layer) == char - lstm(256, 256)
    assert MODEL_OPTIONS["word_lstm"]["hidden"] == 670


def test_forward_flops_of_benchmark_models():
    m = make_model("cnn_emnist", (8, 8, 1), 5, options={"conv_channels": [4, 8], "dense": 16})
    params = jax.eval_shape(m.init, jax.random.key(0))
    # MACs inside the image of a "same" 5x5 convolution: per axis, 8 pixels see 34 taps of 40,
    # 4 pixels see 14 of 20; then the two dense layers
    macs = 34 * 34 * 1 * 4 + 14 * 14 * 4 * 8 + 2 * 2 * 8 * 16 + 16 * 5
    assert 2 * macs <= forward_flops(m, params) < 1.2 * 2 * macs   # + biases, ReLUs, pooling
    opts = TINY["char_lstm"][2]
    short, long = (make_model("char_lstm", (t,), V, options=opts) for t in (5, 50))
    p = jax.eval_shape(short.init, jax.random.key(0))
    per_token = 4 * 6 * (3 + 6) + 4 * 6 * (6 + 6) + 6 * V          # LSTM kernels, output layer
    assert forward_flops(short, p) == 2 * 5 * per_token
    assert forward_flops(long, p) == 2 * 50 * per_token
    tr = make_model("transformer_lm", (T,), V, options=TINY["transformer_lm"][2])
    assert forward_flops(tr, jax.eval_shape(tr.init, jax.random.key(0))) > 2 * T * (4 * 8 * 8)
    # the classic models keep the dense-layer count
    mlp = make_model("mlp", (10,), 3, hidden=(5,))
    assert forward_flops(mlp, mlp.init(jax.random.key(0))) == 2 * (10 * 5 + 5 * 3)


def test_bad_model_options_are_named():
    with pytest.raises(ValueError, match=r"unknown option.*'depth'.*allowed"):
        make_model("resnet18_gn", (8, 8, 3), 5, options={"depth": 34})
    with pytest.raises(ValueError, match="model.options.width .*multiple of"):
        make_model("resnet18_gn", (8, 8, 3), 5, options={"width": 5})
    with pytest.raises(ValueError, match="model.options.stem"):
        make_model("resnet18_gn", (8, 8, 3), 5, options={"stem": "vit"})
    with pytest.raises(ValueError, match="model.options.hidden"):
        make_model("char_lstm", (T,), V, options={"hidden": 0})
    with pytest.raises(ValueError, match="model.options.embed_dim .*heads"):
        make_model("transformer_lm", (T,), V, options={"embed_dim": 10, "heads": 4})
    with pytest.raises(ValueError, match="model.options.conv_channels"):
        make_model("cnn_emnist", (8, 8, 1), 5, options={"conv_channels": 32})
    with pytest.raises(ValueError, match="unknown option.*none"):
        make_model("mlp", (4,), 3, options={"hidden": 3})
    with pytest.raises(ValueError, match="token sequences"):
        make_model("char_lstm", (8, 8, 1), V)
    with pytest.raises(ValueError, match="image features"):
        make_model("resnet18_gn", (64,), 5)
    assert model_options("word_lstm", {"hidden": 32})["hidden"] == 32
    assert make_model("char_lstm", (T,), V, options={"hidden": 6}) is \
        make_model("char_lstm", (T,), V, options={"hidden": 6, "layers": 2})
