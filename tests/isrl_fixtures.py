"""Tiny shared fixtures of the ISRL tests (one dataset and model: few distinct compiled shapes)."""
import numpy as np

from fedjax_dp.algorithms import api
from fedjax_dp.core import from_ragged
from fedjax_dp.models import make_model

_rng = np.random.default_rng(0)
_xs = [_rng.normal(size=(n, 5)).astype(np.float32) for n in (12, 9, 15, 10)]
_ys = [(x[:, 0] + 0.3 * x[:, 1] > 0).astype(np.int32) for x in _xs]
AGENTS = from_ragged(_xs, _ys)
FED = api.FederatedData(agents=AGENTS, num_classes=2)
MODEL = make_model("mlp", (5,), 2, hidden=(4,))
