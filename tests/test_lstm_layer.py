"""The library's LSTM layer (input projection hoisted out of the recurrence, fused gates) is
flax's ``nn.RNN(nn.OptimizedLSTMCell(hidden))``: the same parameter tree and initial values, the
same outputs and gradients (float summation order only)."""
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.bench.char_lstm import FlaxLayerLM as FlaxLSTMLM   # flax's nn.RNN layers
from fedjax_dp.models import sequence


def test_lstm_layer_equals_flax_optimized_lstm_cell():
    options = dict(embed_dim=3, hidden=5, layers=2, projection=4)   # E != H != projection
    ours, flax_ref = sequence.LSTMLM(11, **options), FlaxLSTMLM(11, **options)
    x = jax.random.randint(jax.random.key(1), (3, 7), 0, 11)           # [B, T]
    p_ours = ours.init(jax.random.key(0), x)
    p_ref = flax_ref.init(jax.random.key(0), x)
    assert jax.tree.structure(p_ours) == jax.tree.structure(p_ref)
    for a, b in zip(jax.tree.leaves(p_ours), jax.tree.leaves(p_ref)):
        np.testing.assert_array_equal(a, b)
    # distinct biases, so a gate taken out of order would show
    p = jax.tree.map(lambda l: l + 0.1 * jax.random.normal(jax.random.key(2), l.shape), p_ref)
    np.testing.assert_allclose(ours.apply(p, x), flax_ref.apply(p, x), rtol=1e-5, atol=1e-6)
    y = jnp.roll(x, -1, axis=1)

    def loss(module, params):
        logits = module.apply(params, x)
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[..., None], -1))

    g_ours = jax.grad(lambda q: loss(ours, q))(p)
    g_ref = jax.grad(lambda q: loss(flax_ref, q))(p)
    for a, b in zip(jax.tree.leaves(g_ours), jax.tree.leaves(g_ref)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    # the output at position t depends on x[:, :t + 1] only (causal)
    x2 = x.at[:, 4:].set((x[:, 4:] + 1) % 11)
    np.testing.assert_allclose(ours.apply(p, x2)[:, :4], ours.apply(p, x)[:, :4], atol=1e-6)
