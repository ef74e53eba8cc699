"""Local training over stacked agents, evaluation."""
from fedjax_dp.train import optimizers
from fedjax_dp.train.evaluate import accuracy, per_agent_accuracy, predict
from fedjax_dp.train.local import (LocalTrainConfig, check_trainable, cross_entropy,
                                   batch_indices, make_local_step, make_local_update, minibatch_loss,
                                   minibatch_rows, stored_indices, train_agents)

__all__ = ["optimizers", "accuracy", "per_agent_accuracy", "predict",
           "LocalTrainConfig", "batch_indices", "check_trainable", "cross_entropy", "make_local_step",
           "minibatch_rows", "stored_indices", "make_local_update", "minibatch_loss", "train_agents"]
