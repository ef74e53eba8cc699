"""Flax models as pure (init, apply) pairs over a single example."""
from fedjax_dp.models.classifiers import (MODELS, LeNet, Logistic, MLP, Model, forward_flops,
                                          make_model)

__all__ = ["MODELS", "LeNet", "Logistic", "MLP", "Model", "forward_flops", "make_model"]
