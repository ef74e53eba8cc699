"""Run under XLA_FLAGS=--xla_force_host_platform_device_count=4 (test_isrl_algorithms.py).

An ISRL-DP SPIDER run (refresh and difference rounds, M of N silos) with the silo axis sharded
over 4 CPU devices (6 silos: padded) equals the single-device run; prints one JSON line.
"""
import json
import sys

import jax
import numpy as np

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from fedjax_dp.algorithms import api, isrl  # noqa: E402
from fedjax_dp.core import agent_mesh, from_ragged  # noqa: E402
from fedjax_dp.models import make_model  # noqa: E402


def main():
    assert jax.device_count() == 4, jax.devices()
    rng = np.random.default_rng(0)
    xs = [rng.normal(size=(n, 5)).astype(np.float32) for n in (12, 9, 15, 10, 8, 11)]
    ys = [(x[:, 0] > 0).astype(np.int32) for x in xs]
    fed = api.FederatedData(agents=from_ragged(xs, ys), num_classes=2)
    model = make_model("mlp", (5,), 2, hidden=(4,))
    algo = isrl.ISRL_SPIDER
    cfg = algo.Config(rounds=3, num_available=4, batch_size=4, noise_multiplier=0.7,
                      smoothness=3.0, report_objective=False)
    plain = api.run(algo, jax.random.key(0), fed, model, cfg, runtime=api.Runtime(chunk_size=None))
    sharded = api.run(algo, jax.random.key(0), fed, model, cfg,
                      runtime=api.Runtime(chunk_size=None, mesh=agent_mesh()))
    same = all(np.allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6) for a, b in
               zip(jax.tree.leaves(plain.state.values), jax.tree.leaves(sharded.state.values)))
    print(json.dumps({"spider_sharded": bool(same)}))


if __name__ == "__main__":
    main()
