"""Bench part: one DP-FNAS search step (Singh et al. 2020, Algorithm 1), K parties vmapped vs a
Python loop over parties.

A DARTS search network (``nodes``, ``cells``, ``channels``) on ``image`` x ``image`` x 1 inputs,
K parties of ``records`` records, expected batch ``batch`` per half, clip 1 and noise 1:
``vmap`` (:func:`fedjax_dp.algorithms.fnas.steps.make_search`) vs ``loop`` (``backend="loop"``).
"""
from __future__ import annotations

import jax
import numpy as np

from fedjax_dp.bench import common

NAME = "dp_fnas_search_step"
TITLE = "a DP-FNAS search step (parties vmapped) vs a loop over parties"


def measure(sizes: dict, repeats: int) -> dict:
    from fedjax_dp.algorithms.fnas import data as fnas_data, steps
    from fedjax_dp.core import from_ragged
    from fedjax_dp.models import darts

    shape = (sizes["image"], sizes["image"], 1)
    space = darts.SearchSpace(nodes=sizes["nodes"], channels=sizes["channels"],
                              cells=sizes["cells"])
    net = darts.search_network(space, shape, 10)
    rng = np.random.default_rng(0)
    k, r = sizes["parties"], sizes["records"]
    agents = from_ragged([rng.random((r,) + shape, np.float32) for _ in range(k)],
                         [rng.integers(0, 10, r) for _ in range(k)])
    data = fnas_data.make_search_data(agents, sizes["batch"])
    mech = steps.Mechanism(clip=1.0, noise=1.0)
    hyper = steps.SearchHyper(weights=mech, arch=mech, second=mech, order="first",
                              total_iterations=100)
    fv = steps.make_search(net, hyper)
    state = fv.init(jax.random.key(0))
    fl = steps.make_search(net, hyper, backend="loop")
    key = jax.random.key(1)
    times = {"vmap": common.time_fn(lambda: fv.step(state, key, data), repeats),
             "loop": common.time_fn(lambda: fl.step(state, key, data), repeats)}
    return {"name": NAME, "title": TITLE,
            "sizes": {**sizes, "num_weights": common.num_params(state.w)}, "times": times,
            "pairs": {"loop_over_vmap": ("loop", "vmap")}}
