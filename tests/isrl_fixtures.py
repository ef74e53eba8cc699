"""Tiny shared fixtures of the ISRL tests (one dataset and model: few distinct compiled shapes).

``run_case(name, ...)`` runs one of :data:`CASES` through ``api.run`` once per argument tuple
(cached), so the test modules share their runs and compiled rounds.
"""
import functools

import jax
import numpy as np

from fedjax_dp.algorithms import api, isrl
from fedjax_dp.core import from_ragged
from fedjax_dp.models import make_model

_rng = np.random.default_rng(0)
_xs = [_rng.normal(size=(n, 5)).astype(np.float32) for n in (12, 9, 15, 10)]
_ys = [(x[:, 0] + 0.3 * x[:, 1] > 0).astype(np.int32) for x in _xs]
AGENTS = from_ragged(_xs, _ys)
FED = api.FederatedData(agents=AGENTS, num_classes=2)
MODEL = make_model("mlp", (5,), 2, hidden=(4,))

_SMALL = dict(rounds=3, batch_size=4, learning_rate=0.3, num_available=2)

#: algorithm name -> config fields (4 silos, M < N in every case).
CASES = {
    "isrl_spider": dict(rounds=3, num_available=3, batch_size=4, diff_batch_size=6,
                        phase_length=2, smoothness=3.0, noise_multiplier=0.7,
                        learning_rate=0.3, prox="l2_ball", prox_radius=2.0),
    "isrl_local_sgd": dict(rounds=2, num_available=3, batch_size=4, local_steps=2,
                           noise_multiplier=0.7, learning_rate=0.3, prox="l1",
                           prox_strength=0.01),
    "isrl_mb_sgd": dict(_SMALL, noise_multiplier=0.5),
    "isrl_prox_pl_svrg": dict(_SMALL, noise_multiplier=0.5, epoch_length=1, restart_every=2),
    "local_sgd": dict(_SMALL, local_steps=2),
}


def config(name):
    """The case's config with the round diagnostics on (the private members' opt-ins: the tests
    read the objective and the realised batch sizes)."""
    return isrl.ALGORITHMS[name].Config(**{"report_objective": True, "diagnostics": True,
                                           **CASES[name]})


@functools.lru_cache(maxsize=None)
def run_case(name, seed=0, chunk_size=None, backend="vmap", cohort="gather"):
    rt = api.Runtime(chunk_size=chunk_size, backend=backend, cohort=cohort)
    return api.run(isrl.ALGORITHMS[name], jax.random.key(seed), FED, MODEL, config(name),
                   runtime=rt)
