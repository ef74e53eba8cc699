"""Flax classifiers: logistic regression, MLP and a LeNet-style CNN; registry of all models.

The benchmark models of :mod:`fedjax_dp.models.image` (``cnn_emnist``, ``resnet18_gn``) and
:mod:`fedjax_dp.models.sequence` (``char_lstm``, ``word_lstm``, ``transformer_lm``; one example is
a token sequence ``x [T] int32`` and ``apply`` returns per-position logits ``[T, V]``) are built
here too, with their size options (:data:`MODEL_OPTIONS`).

Every model is exposed as a :class:`Model`, a pair of pure functions

    init(key) -> params
    apply(params, x) -> logits        x: [*feature_shape] (ONE example), logits: [num_classes]

so per-example gradients are ``jax.vmap(jax.grad(loss), (None, 0, 0))`` and all agents' models are
one params pytree with a leading agent axis (``jax.vmap(model.init)(keys)``)."""
from __future__ import annotations

import functools
import math
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.core import validation
from fedjax_dp.models import image, sequence

Params = Any


class Model(NamedTuple):
    """A pure ``init``/``apply`` pair for one example, plus what it was built from."""

    init: Callable[[jax.Array], Params]
    apply: Callable[[Params, jax.Array], jax.Array]
    name: str
    feature_shape: tuple[int, ...]
    num_classes: int
    #: the learning task (:mod:`fedjax_dp.models.tasks`; None: classification), set by
    #: ``tasks.attach`` from the data: it defines the per-example loss and the accuracy
    task: Any = None

    def logits(self, params: Params, x: jax.Array) -> jax.Array:
        """Batched apply: ``x [B, *feature_shape] -> [B, num_classes]``."""
        return jax.vmap(self.apply, in_axes=(None, 0))(params, x)

    def num_params(self, params: Params) -> int:
        return sum(int(l.size) for l in jax.tree.leaves(params))


class Logistic(nn.Module):
    """Multinomial logistic regression: ``W x + b``."""
    num_classes: int

    @nn.compact
    def __call__(self, x):                    # x [B, *feature_shape]
        x = x.reshape((x.shape[0], -1))
        return nn.Dense(self.num_classes)(x)  # [B, C]


class MLP(nn.Module):
    """Fully connected ReLU network with the given hidden widths."""
    num_classes: int
    hidden: Sequence[int] = (200,)

    @nn.compact
    def __call__(self, x):                    # x [B, *feature_shape]
        x = x.reshape((x.shape[0], -1))
        for width in self.hidden:
            x = nn.relu(nn.Dense(width)(x))
        return nn.Dense(self.num_classes)(x)  # [B, C]


class LeNet(nn.Module):
    """LeNet-style CNN (FedKT's MNIST model): conv 6, conv 16 (5x5, max-pool 2), FC 120, 84."""
    num_classes: int

    @nn.compact
    def __call__(self, x):                    # x [B, H, W, channels]
        x = nn.relu(nn.Conv(6, (5, 5), padding="SAME")(x))
        x = nn.max_pool(x, (2, 2), strides=(2, 2), padding="SAME")
        x = nn.relu(nn.Conv(16, (5, 5), padding="SAME")(x))
        x = nn.max_pool(x, (2, 2), strides=(2, 2), padding="SAME")
        x = x.reshape((x.shape[0], -1))
        x = nn.relu(nn.Dense(120)(x))
        x = nn.relu(nn.Dense(84)(x))
        return nn.Dense(self.num_classes)(x)  # [B, C]


def _wrap(module: nn.Module, name: str, feature_shape: tuple[int, ...], num_classes: int,
          dtype: Any = jnp.float32, *, compiled_init: bool = False) -> Model:
    """``compiled_init``: ``init`` is one compiled program instead of flax's op-by-op eager
    initialisation (seconds for an LSTM or a ResNet); the classic models keep the eager one, so
    their initial parameters stay bit-identical to earlier releases."""
    dummy = np.zeros((1,) + tuple(feature_shape), np.dtype(dtype))  # host: no compilation

    def init(key: jax.Array) -> Params:
        return module.init(key, dummy)

    if compiled_init:
        init = jax.jit(init)

    def apply(params: Params, x: jax.Array) -> jax.Array:
        return module.apply(params, x[None])[0]

    return Model(init=init, apply=apply, name=name, feature_shape=tuple(feature_shape),
                 num_classes=num_classes)


def from_flax(module: Any, example_x: Any, *, name: str | None = None) -> Model:
    """A :class:`Model` from your own Flax module, runnable by every algorithm.

    Args:
      module: a ``flax.linen.Module`` or a ``flax.nnx.Module`` written as Flax modules are:
        ``__call__(x)`` takes a batch ``x [B, *feature_shape]`` and returns logits
        ``[B, num_classes]``; or, for nnx, a function ``rngs -> nnx.Module`` such as the
        module's class when its constructor takes only ``rngs`` (then every key draws fresh
        parameters, see below).
      example_x: a batch of inputs as ``module`` takes them, ``[B >= 1, *feature_shape]`` (e.g.
        ``x_train[:1]``, as for linen's ``module.init(key, x)``); it fixes the feature shape and
        the dtype (float32, or int32 for integer inputs such as token ids).
      name: the model's name (default: the module's class name).

    The result is the pair the library trains (one example, so per-example gradients are a
    ``vmap``): ``apply(params, x) = module(x[None])[0]`` for ``x [*feature_shape]``, and

    * linen: ``init(key) = module.init(key, x)`` on a zero batch, every collection kept (the
      ``params`` and, e.g., batch statistics, which ``apply`` reads but never updates);
    * nnx: the parameters are the module's ``nnx.Param`` variables as a nested dict
      (``nnx.to_pure_dict``); any other state (batch statistics, RNG streams) stays as it was
      built. ``init(key)`` of a module returns ITS parameters for every key (all agents start from
      them); of a function ``rngs -> module``, the parameters of ``function(nnx.Rngs(key))``.

    ``num_classes`` is read from the module's output. A ``module`` that is not a Flax module, an
    ``example_x`` that is not a batch the module takes, or an output that is not ``[batch,
    num_classes >= 2]`` floating logits raises one ValueError naming the argument."""
    x = np.asarray(example_x)
    if x.ndim < 2 or x.shape[0] < 1 or x.dtype.kind not in "biuf":
        raise ValueError(f"example_x must be a numeric batch [B >= 1, *feature_shape] (e.g. "
                         f"x_train[:1]), got shape {x.shape} dtype {x.dtype}")
    dtype = np.int32 if x.dtype.kind in "iu" else np.float32
    feature_shape = tuple(int(s) for s in x.shape[1:])
    if isinstance(module, nn.Module):
        model = _wrap(module, name or type(module).__name__, feature_shape, 2, dtype)
    else:
        model = _wrap_nnx(module, name, feature_shape, dtype)
    batch = np.zeros((2,) + feature_shape, dtype)             # two rows: batch axis != classes
    try:                                   # shapes only: nothing is computed or compiled
        out = jax.eval_shape(lambda p: jax.vmap(model.apply, (None, 0))(p, batch),
                             jax.eval_shape(model.init, jax.random.key(0)))
    except Exception as e:                                    # noqa: BLE001: one line for any
        first = (str(e).strip().splitlines() or [""])[0][:300]
        raise ValueError(f"module cannot be initialised and called on example_x (feature "
                         f"shape {feature_shape}, dtype {np.dtype(dtype).name}): "
                         f"{type(e).__name__}: {first}") from None
    if not (len(out.shape) == 2 and out.shape[1] >= 2 and jnp.issubdtype(out.dtype, jnp.floating)):
        raise ValueError(f"module must return floating logits [batch, num_classes >= 2] for a "
                         f"batch x [batch, *feature_shape]; called on one example of example_x's "
                         f"feature shape {feature_shape} at a time it returned shape "
                         f"{tuple(out.shape[1:])} dtype {out.dtype}, not [num_classes]")
    return model._replace(num_classes=int(out.shape[1]))


def _wrap_nnx(module: Any, name: str | None, feature_shape: tuple[int, ...], dtype) -> Model:
    """:func:`from_flax` for an ``nnx.Module`` or a function ``rngs -> nnx.Module``."""
    from flax import nnx           # here: about 1 s to import, and only an nnx module needs it
    factory = None
    if not isinstance(module, nnx.Module):
        if isinstance(module, type) and issubclass(module, nn.Module):
            raise ValueError(f"module must be a flax.linen.Module instance, got the class "
                             f"{module.__name__}: pass {module.__name__}(...)")
        if not callable(module):
            raise ValueError(f"module must be a flax.linen.Module, a flax.nnx.Module or a "
                             f"function rngs -> nnx.Module, got {type(module).__name__}")
        factory = module
        try:
            module = factory(nnx.Rngs(0))
        except Exception as e:                                # noqa: BLE001: one line for any
            raise ValueError(f"module: calling it with nnx.Rngs(0) failed ({type(e).__name__}:"
                             f" {(str(e).strip().splitlines() or [''])[0][:300]}); it must be a "
                             f"flax.linen.Module, a flax.nnx.Module or a function "
                             f"rngs -> nnx.Module") from None
        if not isinstance(module, nnx.Module):
            raise ValueError(f"module must be a flax.linen.Module, a flax.nnx.Module or a "
                             f"function rngs -> nnx.Module; the function returned "
                             f"{type(module).__name__}")
    graphdef, param_state, rest = nnx.split(module, nnx.Param, ...)
    own = jax.tree.map(np.asarray, nnx.to_pure_dict(param_state))       # host copies

    def init(key: jax.Array) -> Params:
        if factory is None:
            return jax.tree.map(jnp.asarray, own)          # fresh buffers: safe to donate
        return nnx.to_pure_dict(nnx.split(factory(nnx.Rngs(key)), nnx.Param, ...)[1])

    def apply(params: Params, x: jax.Array) -> jax.Array:
        return nnx.merge(graphdef, params, rest)(x[None])[0]

    return Model(init=init, apply=apply, name=name or type(module).__name__,
                 feature_shape=feature_shape, num_classes=2)        # num_classes: from_flax


MODELS = ("logistic", "mlp", "cnn", "cnn_emnist", "resnet18_gn", "char_lstm", "word_lstm",
          "transformer_lm")
#: Models whose example is an image ``[H, W, channels]``.
IMAGE_MODELS = ("cnn", "cnn_emnist", "resnet18_gn")
#: Next-token models: an example is ``x [T] int32`` and ``apply`` returns logits ``[T, V]``.
SEQUENCE_MODELS = ("char_lstm", "word_lstm", "transformer_lm")
#: Size options of the benchmark models and their defaults (the published sizes; see the docs of
#: :mod:`fedjax_dp.models.image` and :mod:`fedjax_dp.models.sequence`).
MODEL_OPTIONS: dict[str, dict[str, Any]] = {
    "cnn_emnist": image.CNN_EMNIST_DEFAULTS,
    "resnet18_gn": image.RESNET18_GN_DEFAULTS,
    "char_lstm": sequence.CHAR_LSTM_DEFAULTS,
    "word_lstm": sequence.WORD_LSTM_DEFAULTS,
    "transformer_lm": sequence.TRANSFORMER_LM_DEFAULTS,
}


def model_options(name: str, options: Mapping[str, Any] | None) -> dict[str, Any]:
    """The validated size options of model ``name``: its defaults (:data:`MODEL_OPTIONS`) updated
    by ``options``. Widths (channels, units, heads) are at most ``validation.WIDTH_MAX``
    (65,536), ``layers``, blocks per stage and the lists' lengths at most
    ``validation.DEPTH_MAX`` (64). Errors name the key as ``model.options.<key>``."""
    validation.check_choice("model.name", name, MODELS)
    options = dict(options or {})
    defaults = MODEL_OPTIONS.get(name, {})
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        allowed = sorted(defaults) if defaults else "none"
        raise ValueError(f"model.options: unknown option(s) {unknown} for model {name!r}; "
                         f"allowed: {allowed}")
    out = {**defaults, **options}
    for key, value in out.items():
        where = f"model.options.{key}"
        if key == "stem":
            validation.check_choice(where, value, image.RESNET_STEMS)
        elif key in ("conv_channels", "stage_blocks"):
            if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not \
                    1 <= len(value) <= validation.DEPTH_MAX:
                raise ValueError(f"{where} must be a list of 1 to {validation.DEPTH_MAX} positive "
                                 f"integers (channels per convolution / blocks per stage), got "
                                 f"{value!r}")
            top = validation.WIDTH_MAX if key == "conv_channels" else validation.DEPTH_MAX
            out[key] = tuple(validation.check_int(f"{where}[]", c, minimum=1, maximum=top)
                             for c in value)
        else:                 # a depth (layers) at most DEPTH_MAX, a width at most WIDTH_MAX
            top = validation.DEPTH_MAX if key == "layers" else validation.WIDTH_MAX
            out[key] = validation.check_int(where, value, minimum=0 if key == "projection" else 1,
                                            maximum=top)
    if name == "resnet18_gn" and out["width"] % out["groups"]:
        raise ValueError(f"model.options.width ({out['width']}) must be a multiple of "
                         f"model.options.groups ({out['groups']}): GroupNorm splits channels")
    if name == "transformer_lm" and out["embed_dim"] % out["heads"]:
        raise ValueError(f"model.options.embed_dim ({out['embed_dim']}) must be a multiple of "
                         f"model.options.heads ({out['heads']})")
    return out


def make_model(name: str, feature_shape: Sequence[int], num_classes: int, *,
               hidden: Sequence[int] = (200,), options: Mapping[str, Any] | None = None) -> Model:
    """Build a registered model by name (one of :data:`MODELS`).

    ``hidden`` is the MLP's layer widths (ignored by the other models); ``options`` sets the size
    options of a benchmark model (:data:`MODEL_OPTIONS`, e.g. ``{"hidden": 32}`` for a narrow
    ``char_lstm``, ``{"width": 4}`` for ``resnet18_gn``); the classic models take none. Image
    models need ``feature_shape = (H, W, channels)``; sequence models ``(T,)`` with ``num_classes``
    the vocabulary size.

    The same arguments give the same :class:`Model` object, so every compiled function keyed on
    the model is compiled once per process."""
    validation.check_choice("model.name", name, MODELS)
    validation.check_int("num_classes", num_classes, minimum=2)
    feature_shape = tuple(int(s) for s in feature_shape)
    if not feature_shape or any(s < 1 for s in feature_shape):
        raise ValueError(f"feature_shape must be a non-empty tuple of positive sizes, "
                         f"got {feature_shape}")
    if name in IMAGE_MODELS and len(feature_shape) != 3:
        raise ValueError(f"model {name!r} needs image features [H, W, channels], got feature "
                         f"shape {feature_shape} (use 'mlp' or 'logistic' for flat features)")
    if name in SEQUENCE_MODELS and len(feature_shape) != 1:
        raise ValueError(f"model {name!r} needs token sequences, feature shape (T,), got "
                         f"{feature_shape}")
    if name == "mlp":
        hidden = tuple(validation.check_int("model.hidden[]", h, minimum=1) for h in hidden)
    else:
        hidden = ()
    opts = tuple(sorted(model_options(name, options).items()))
    return _make_model(name, feature_shape, int(num_classes), hidden, opts)


@functools.lru_cache(maxsize=128)
def _make_model(name: str, feature_shape: tuple[int, ...], num_classes: int,
                hidden: tuple[int, ...], opts: tuple[tuple[str, Any], ...] = ()) -> Model:
    o = dict(opts)
    if name == "logistic":
        module = Logistic(num_classes)
    elif name == "mlp":
        module = MLP(num_classes, hidden)
    elif name == "cnn":
        module = LeNet(num_classes)
    elif name == "cnn_emnist":
        module = image.CNNEmnist(num_classes, **o)
    elif name == "resnet18_gn":
        module = image.ResNet18GN(num_classes, **o)
    elif name == "transformer_lm":
        module = sequence.TransformerLM(num_classes, max_len=feature_shape[0], **o)
    else:                                      # char_lstm, word_lstm
        module = sequence.LSTMLM(num_classes, **o)
    dtype = jnp.int32 if name in SEQUENCE_MODELS else jnp.float32
    return _wrap(module, name, feature_shape, num_classes, dtype,
                 compiled_init=name in MODEL_OPTIONS)


def forward_flops(model: Model, params: Params) -> int:
    """Approximate multiply-add FLOPs (2 per MAC) of one forward pass of one example.

    * ``logistic``, ``mlp``: exact, the sum over Dense kernels of ``2 * fan_in * fan_out``;
      ``cnn``: the same sum, so only its dense layers (its convolutions are not counted).
    * ``char_lstm``, ``word_lstm``: ``2 * T * (sum of the sizes of every matrix but the
      embedding)`` (each LSTM kernel and dense layer is applied once per position; the
      elementwise gate arithmetic and the embedding lookup are not counted).
    * ``cnn_emnist``, ``resnet18_gn``, ``transformer_lm``: XLA's cost analysis of ``apply`` on one
      example (``jit(apply).lower(...).cost_analysis()["flops"]``; convolutions count only the
      taps inside the image, attention is counted). Not used for the LSTMs: XLA counts a
      ``scan`` body once, not once per step.
    """
    if model.name in ("char_lstm", "word_lstm"):
        leaves = jax.tree_util.tree_flatten_with_path(params)[0]
        macs = sum(math.prod(l.shape) for path, l in leaves
                   if l.ndim >= 2 and "Embed" not in jax.tree_util.keystr(path))
        return 2 * model.feature_shape[0] * macs
    if model.name in MODEL_OPTIONS:
        dtype = jnp.int32 if model.name in SEQUENCE_MODELS else jnp.float32
        x = jax.ShapeDtypeStruct(model.feature_shape, dtype)
        cost = jax.jit(model.apply).lower(params, x).cost_analysis()
        if isinstance(cost, (list, tuple)):      # older jax: one dict per computation
            cost = cost[0]
        return int(cost["flops"])
    return sum(2 * math.prod(l.shape) for l in jax.tree.leaves(params) if l.ndim == 2)
