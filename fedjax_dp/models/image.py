"""Image models of the federated benchmarks: the FedAvg paper's CNN and a GroupNorm ResNet-18.

Both are flax modules over a batch ``x [B, H, W, channels]``; :func:`fedjax_dp.models.make_model`
(names ``"cnn_emnist"`` and ``"resnet18_gn"``) wraps them as a pure ``init``/``apply`` pair over ONE
example. Neither has a layer that mixes examples (no BatchNorm, no dropout), so per-example
gradients are exactly ``jax.vmap(jax.grad(loss))``.

* :class:`CNNEmnist` — McMahan et al. 2017, "Communication-Efficient Learning of Deep Networks
  from Decentralized Data", section 3 ("CNN"): two 5x5 convolutions (32 then 64 channels, "same"
  padding), each followed by 2x2 max pooling, a 512-unit ReLU layer and a softmax output. This is
  TensorFlow Federated's ``create_original_fedavg_cnn_model`` (the EMNIST model of the TFF
  simulation baselines).
  **1,663,370** parameters for 10 classes on 28x28x1 (the paper's figure), 1,690,046 for 62.
* :class:`ResNet18GN` — He et al. 2016's ResNet-18 (basic blocks [2, 2, 2, 2], widths
  64/128/256/512) with every BatchNorm replaced by GroupNorm (Wu & He 2018), as Hsieh et al.
  2020 ("The Non-IID Data Quagmire", the section on batch normalisation) recommend for federated
  training and Reddi et al. 2021 ("Adaptive Federated Optimization", section 5 and the appendix on
  models: ResNet-18 "replacing batch norm with group norm", two groups) use for CIFAR-100.
  ``stem="cifar"`` (default): one 3x3 stride-1 convolution, no pooling; ``stem="imagenet"``: He
  et al.'s 7x7 stride-2 convolution and 3x3 stride-2 max pooling. **11,220,132** parameters for
  100 classes with the CIFAR stem. Convolutions have no bias (a norm layer follows each one).
"""
from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax

#: Option names and defaults (the literature's sizes) of each image model.
CNN_EMNIST_DEFAULTS = {"conv_channels": (32, 64), "dense": 512}
RESNET18_GN_DEFAULTS = {"width": 64, "groups": 2, "stem": "cifar", "stage_blocks": (2, 2, 2, 2)}
RESNET_STEMS = ("cifar", "imagenet")


class CNNEmnist(nn.Module):
    """McMahan et al. 2017 (section 3) CNN: [conv5x5 -> ReLU -> maxpool2x2] x 2 -> FC ReLU -> FC.

    ``logits = W_out relu(W_fc flatten(pool(relu(conv2(pool(relu(conv1(x))))))))`` (softmax is in
    the loss)."""
    num_classes: int
    conv_channels: Sequence[int] = (32, 64)
    dense: int = 512

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:       # x [B, H, W, channels]
        for ch in self.conv_channels:
            x = nn.relu(nn.Conv(ch, (5, 5), padding="SAME")(x))
            x = nn.max_pool(x, (2, 2), strides=(2, 2), padding="SAME")
        x = x.reshape((x.shape[0], -1))                   # [B, H/4 * W/4 * 64]
        x = nn.relu(nn.Dense(self.dense)(x))              # [B, 512]
        return nn.Dense(self.num_classes)(x)              # [B, C]


class _BasicBlock(nn.Module):
    """ResNet basic block (He et al. 2016, figure 2) with GroupNorm:
    ``y = relu(GN(conv3x3(relu(GN(conv3x3_s(x))))) + shortcut(x))``, where the shortcut is the
    identity, or a 1x1 stride-s convolution + GN when the shape changes ("option B")."""
    features: int
    strides: int
    groups: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:       # x [B, H, W, C_in]
        s = (self.strides, self.strides)
        y = nn.Conv(self.features, (3, 3), s, padding=((1, 1), (1, 1)), use_bias=False)(x)
        y = nn.relu(nn.GroupNorm(num_groups=self.groups)(y))
        y = nn.Conv(self.features, (3, 3), padding=((1, 1), (1, 1)), use_bias=False)(y)
        y = nn.GroupNorm(num_groups=self.groups)(y)
        if self.strides != 1 or x.shape[-1] != self.features:
            x = nn.Conv(self.features, (1, 1), s, use_bias=False)(x)
            x = nn.GroupNorm(num_groups=self.groups)(x)
        return nn.relu(y + x)                             # [B, H/s, W/s, features]


class ResNet18GN(nn.Module):
    """ResNet-18 with GroupNorm (``groups`` groups per norm layer, Reddi et al. 2021 use 2).

    Stages of two basic blocks with ``width * (1, 2, 4, 8)`` channels (stride 1, 2, 2, 2), global
    average pooling and a linear classifier; ``stage_blocks`` (default ``(2, 2, 2, 2)``) sets the
    number of stages and of blocks per stage. Each GroupNorm normalises one example's activations
    over (H, W, channels of a group): ``(a - mean_g) / sqrt(var_g + 1e-6) * gamma + beta`` (Wu & He
    2018, eq. 1), so nothing is shared across examples."""
    num_classes: int
    width: int = 64
    groups: int = 2
    stem: str = "cifar"
    stage_blocks: Sequence[int] = (2, 2, 2, 2)

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:       # x [B, H, W, channels]
        if self.stem == "cifar":
            x = nn.Conv(self.width, (3, 3), padding=((1, 1), (1, 1)), use_bias=False)(x)
            x = nn.relu(nn.GroupNorm(num_groups=self.groups)(x))
        else:                                             # "imagenet"
            x = nn.Conv(self.width, (7, 7), (2, 2), padding=((3, 3), (3, 3)),
                        use_bias=False)(x)
            x = nn.relu(nn.GroupNorm(num_groups=self.groups)(x))
            x = nn.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
        for stage, blocks in enumerate(self.stage_blocks):
            for block in range(blocks):
                strides = 2 if stage > 0 and block == 0 else 1
                x = _BasicBlock(self.width * 2 ** stage, strides, self.groups)(x)
        x = x.mean(axis=(1, 2))                           # [B, width * 2**(stages - 1)]
        return nn.Dense(self.num_classes)(x)              # [B, C]
