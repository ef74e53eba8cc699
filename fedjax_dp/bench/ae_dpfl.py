"""Bench part: AE-DPFL end to end (:func:`fedjax_dp.algorithms.api.run` of
:mod:`fedjax_dp.algorithms.voting.ae_dpfl`) on N host-resident agents generated in this process,
streamed to the device in chunks. ``end_to_end`` (``first_s``: the compiling call); the agents'
training FLOPs (3 x forward per example) over it give ``end_to_end_fraction_of_matmul``.
"""
from __future__ import annotations

import jax
import numpy as np

from fedjax_dp.bench import common

NAME = "ae_dpfl_end_to_end"
TITLE = "AE-DPFL end to end (train, vote, student) on streamed host agents"


def make_agents(n: int, records: int, features: int, classes: int, seed: int,
                block: int = 1 << 15):
    """Host ``x [n, records, features] float32``, ``y [n, records] int32`` (class means x 0.4 +
    unit Gaussian noise), generated in blocks of agents, and the class means."""
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(classes, features)).astype(np.float32) * 0.4
    x = np.empty((n, records, features), np.float32)
    y = rng.integers(0, classes, size=(n, records)).astype(np.int32)
    for s in range(0, n, block):
        e = min(n, s + block)
        x[s:e] = rng.standard_normal((e - s, records, features), dtype=np.float32)
        x[s:e] += means[y[s:e]]
    return x, y, means


def measure(sizes: dict, repeats: int) -> dict:
    from fedjax_dp.algorithms import api
    from fedjax_dp.algorithms.voting import ae_dpfl
    from fedjax_dp.core import from_arrays
    from fedjax_dp.models import forward_flops, make_model
    from fedjax_dp.train import LocalTrainConfig

    n, records, features, classes = sizes["agents"], sizes["records"], sizes["features"], 10
    x, y, means = make_agents(n, records, features, classes, seed=0)
    agents = from_arrays(x, y, np.full(n, records, np.int32), check=False)
    rng = np.random.default_rng(1)
    y_pub = rng.integers(0, classes, sizes["public"]).astype(np.int32)
    x_pub = means[y_pub] + rng.standard_normal((sizes["public"], features), dtype=np.float32)
    model = make_model("mlp", (features,), classes, hidden=(sizes["hidden"],))
    data = api.FederatedData(agents=agents, num_classes=classes, x_public=x_pub, y_public=y_pub)
    local = LocalTrainConfig(steps=sizes["steps"], batch_size=8, learning_rate=0.1)
    cfg = ae_dpfl.Config(local=local, sigma=20.0, num_queries=sizes["queries"],
                         student_steps=sizes["student_steps"], student_batch_size=32,
                         agent_chunk=sizes.get("agent_chunk"), vote_noise="aggregate")
    key = jax.random.key(0)

    def run():
        done = api.run(ae_dpfl, key, data, model, cfg)
        return done.state.values

    rep = sizes.get("repeats", repeats)
    times = {"end_to_end": common.time_fn(run, rep)}
    params = model.init(jax.random.key(0))
    flops = 3.0 * forward_flops(model, params) * local.batch_size * local.steps * n
    med = times["end_to_end"]["median_s"]
    return {"name": NAME, "title": TITLE,
            "sizes": {**sizes, "data_gb": x.nbytes / 2 ** 30, "train_gflop": flops / 1e9},
            "times": times, "pairs": {}, "flops": {"end_to_end": flops},
            "gflops": {"end_to_end": flops / med / 1e9},
            "rates": {"agents_per_s": n / med}}
