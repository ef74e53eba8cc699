"""Next-token models of the federated text benchmarks: LSTMs (Shakespeare, StackOverflow) and a
small causal transformer.

Each is a flax module over a batch of token ids ``x [B, T] int32 -> logits [B, T, V]`` (logits at
position t predict token t + 1 and depend only on ``x[:, :t + 1]``);
:func:`fedjax_dp.models.make_model` (names ``"char_lstm"``, ``"word_lstm"``, ``"transformer_lm"``)
wraps them as a pure ``init``/``apply`` pair over ONE sequence: ``apply(params, x [T]) -> [T, V]``,
with ``feature_shape = (T,)`` and ``num_classes = V``. Nothing is shared across examples, so
per-example gradients are ``jax.vmap(jax.grad(loss))``. Padding (id 0, at the end of a
sequence) is not masked inside the model: causal outputs at real positions never see it.

* ``char_lstm`` (:class:`LSTMLM`) — the Shakespeare next-character model of McMahan et al. 2017
  (section 3: 8-dimensional character embedding, two LSTM layers of 256 units, softmax over
  characters) as built by TensorFlow Federated's simulation baselines and used by Reddi et al.
  2021 (vocabulary of 86 characters + pad/oov/bos/eos = 90, sequences of 80): **820,522**
  parameters at default sizes (McMahan et al. report 866,578; their character set or cell
  differed).
* ``word_lstm`` (:class:`LSTMLM` with a projection) — the StackOverflow next-word model of Reddi
  et al. 2021 (appendix on models, after TFF's ``create_recurrent_model``): embedding 96, one
  LSTM of 670 units, a dense projection to 96, and a dense layer to the 10,004-word vocabulary
  (10,000 words + pad, oov, bos, eos): **4,050,748** parameters at default sizes.
* ``transformer_lm`` (:class:`TransformerLM`) — a small pre-LayerNorm causal transformer (Vaswani
  et al. 2017 decoder blocks, learned positions; 2 layers, d_model 128, 4 heads, MLP 512 by
  default: this library's choice, not a published model). LayerNorm is per token.

An LSTM cell (Hochreiter & Schmidhuber 1997, with a forget gate): ``i, f, g, o = W_x x_t + W_h
h_{t-1} + b``; ``c_t = sigma(f) c_{t-1} + sigma(i) tanh(g)``; ``h_t = sigma(o) tanh(c_t)``; its
``4 * (hidden * (input + hidden) + hidden)`` parameters are those of a Keras LSTM (one bias per
gate). Each layer is computed by :func:`lstm_layer`: the input projection ``x_t W_x + b`` of all T
steps is one matmul before the recurrence, and each step one fused ``h_{t-1} W_h [H, 4H]``
matmul; its parameters (:class:`LSTMParams`) are flax's ``nn.RNN(nn.OptimizedLSTMCell(hidden))``
tree with the same initial values (tests/test_lstm_layer.py checks outputs and gradients against
flax's layer).
"""
from __future__ import annotations

from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

#: Option names and defaults (the literature's sizes) of each sequence model.
CHAR_LSTM_DEFAULTS = {"embed_dim": 8, "hidden": 256, "layers": 2, "projection": 0}
WORD_LSTM_DEFAULTS = {"embed_dim": 96, "hidden": 670, "layers": 1, "projection": 96}
TRANSFORMER_LM_DEFAULTS = {"embed_dim": 128, "heads": 4, "layers": 2, "mlp": 512}


class _Dense(nn.Module):
    """The parameters of a dense layer (``kernel [in, features]``, ``bias [features]``), not
    applied: flax's ``DenseParams`` of its LSTM cells, so the tree and the initial values are
    those of ``nn.RNN(nn.OptimizedLSTMCell(hidden))``."""
    features: int
    use_bias: bool
    kernel_init: Callable

    @nn.compact
    def __call__(self, in_features: int) -> tuple[jax.Array, jax.Array | None]:
        kernel = self.param("kernel", self.kernel_init, (in_features, self.features))
        bias = (self.param("bias", nn.initializers.zeros_init(), (self.features,))
                if self.use_bias else None)
        return kernel, bias


class LSTMParams(nn.Module):
    """One LSTM layer's parameters in flax's ``OptimizedLSTMCell`` layout (``i{i,f,g,o}`` input
    kernels, lecun-normal; ``h{i,f,g,o}`` recurrent kernels, orthogonal, with the biases),
    returned fused in gate order i, f, g, o: ``w_in [E, 4H]``, ``w_rec [H, 4H]``, ``b [4H]``."""
    hidden: int

    @nn.compact
    def __call__(self, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:  # x [..., E]
        gates = "ifgo"
        w_in = [_Dense(self.hidden, False, nn.initializers.lecun_normal(), name=f"i{g}")(
            x.shape[-1])[0] for g in gates]
        rec = [_Dense(self.hidden, True, nn.initializers.orthogonal(), name=f"h{g}")(
            self.hidden) for g in gates]
        return (jnp.concatenate(w_in, axis=-1), jnp.concatenate([k for k, _ in rec], axis=-1),
                jnp.concatenate([b for _, b in rec], axis=-1))


def lstm_layer(x: jax.Array, w_in: jax.Array, w_rec: jax.Array, bias: jax.Array) -> jax.Array:
    """An LSTM over ``x [B, T, E]`` from a zero state, ``-> h [B, T, H]`` (module docstring's
    cell). The input projection ``x W_x + b`` of every step is ONE matmul ``[B T, E] x [E, 4H]``
    before the recurrence; each step of the ``lax.scan`` (time-major) is then one fused
    ``h_{t-1} W_h`` ``[B, H] x [H, 4H]`` and the gates' elementwise arithmetic."""
    hidden = w_rec.shape[0]
    z_in = jnp.einsum("bte,eg->tbg", x, w_in) + bias      # [T, B, 4H]

    def step(carry, z_t):
        c, h = carry                                       # [B, H] each
        i, f, g, o = jnp.split(z_t + h @ w_rec, 4, axis=-1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return (c, h), h

    zeros = jnp.zeros(x.shape[:1] + (hidden,), z_in.dtype)
    _, hs = jax.lax.scan(step, (zeros, zeros), z_in)       # [T, B, H]
    return jnp.swapaxes(hs, 0, 1)                          # [B, T, H]


class LSTMLM(nn.Module):
    """Embedding -> ``layers`` LSTMs of ``hidden`` units -> [dense ``projection``] -> dense to V.

    ``projection = 0`` means no projection layer (the Shakespeare model); the StackOverflow model
    projects to 96 (linear, no activation, as in TFF) before the output layer."""
    vocab_size: int
    embed_dim: int = 8
    hidden: int = 256
    layers: int = 2
    projection: int = 0

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:        # x [B, T] int32
        h = nn.Embed(self.vocab_size, self.embed_dim)(x)   # [B, T, E]
        for k in range(self.layers):
            w_in, w_rec, bias = LSTMParams(self.hidden, name=f"OptimizedLSTMCell_{k}")(h)
            h = lstm_layer(h, w_in, w_rec, bias)           # [B, T, hidden]
        if self.projection:
            h = nn.Dense(self.projection)(h)               # [B, T, projection]
        return nn.Dense(self.vocab_size)(h)                # [B, T, V]


class TransformerLM(nn.Module):
    """Causal pre-LN transformer: ``h_0 = E[x] + P[:T]``; per layer
    ``h = h + MHA(LN(h), mask = j <= i)``, ``h = h + W_2 gelu(W_1 LN(h))``; logits ``W LN(h)``."""
    vocab_size: int
    max_len: int
    embed_dim: int = 128
    heads: int = 4
    layers: int = 2
    mlp: int = 512

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:        # x [B, T] int32
        t = x.shape[1]
        pos = self.param("positions", nn.initializers.normal(0.02),
                         (self.max_len, self.embed_dim))   # [T_max, d]
        h = nn.Embed(self.vocab_size, self.embed_dim)(x) + pos[:t]   # [B, T, d]
        mask = nn.make_causal_mask(jnp.ones(x.shape, jnp.int32))      # [B, 1, T, T]
        for _ in range(self.layers):
            a = nn.LayerNorm()(h)
            h = h + nn.MultiHeadDotProductAttention(self.heads, qkv_features=self.embed_dim)(
                a, a, mask=mask)
            m = nn.LayerNorm()(h)
            h = h + nn.Dense(self.embed_dim)(nn.gelu(nn.Dense(self.mlp)(m)))
        return nn.Dense(self.vocab_size)(nn.LayerNorm()(h))   # [B, T, V]
