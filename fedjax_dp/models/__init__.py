"""Flax models as pure (init, apply) pairs over a single example."""
from fedjax_dp.models.classifiers import (IMAGE_MODELS, MODEL_OPTIONS, MODELS, SEQUENCE_MODELS,
                                          LeNet, Logistic, MLP, Model, forward_flops,
                                          from_flax, make_model, model_options)
from fedjax_dp.models.image import CNNEmnist, ResNet18GN
from fedjax_dp.models.sequence import LSTMLM, TransformerLM

__all__ = ["CNNEmnist", "IMAGE_MODELS", "LSTMLM", "LeNet", "Logistic", "MLP", "MODELS",
           "MODEL_OPTIONS", "Model", "ResNet18GN", "SEQUENCE_MODELS", "TransformerLM",
           "forward_flops", "from_flax", "make_model", "model_options"]
