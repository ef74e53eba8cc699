"""Bench part: every agent's local training in one compiled call vs a per-agent loop.

N agents each run E minibatch SGD steps of an MLP (the same keys and minibatches in all paths):
``vmap`` (:func:`fedjax_dp.train.train_agents`, one compiled call), ``loop_agent`` (a Python loop
over agents calling one jitted E-step update: N dispatches) and ``loop_step`` (a loop over agents
and steps calling the jitted one-step function: N E dispatches, a client-loop simulator). Loops
over more than ``loop_max`` agents are timed on a prefix and scaled by N / loop_max. The first
and last agents' parameters of ``vmap`` and the step loop must agree (``results_agree``).
"""
from __future__ import annotations

import jax
import numpy as np

from fedjax_dp.bench import common

NAME = "local_training"
TITLE = "all agents' local training (vmapped) vs a per-agent loop and vs the matmul"


def build(sizes: dict):
    """The part's workload: ``(key, params, data, model, config)``: N = ``agents`` agents of
    ``local_size`` records x ``features`` (Gaussian, ``classes`` uniform labels, default 10),
    an MLP with one hidden layer of ``hidden``, E = ``steps`` SGD steps of ``batch_size``."""
    from fedjax_dp.core import from_arrays
    from fedjax_dp.models import make_model
    from fedjax_dp.train import LocalTrainConfig

    n, m, d = sizes["agents"], sizes["local_size"], sizes["features"]
    classes = sizes.get("classes", 10)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, m, d), dtype=np.float32)                   # [N, m, d]
    y = rng.integers(0, classes, (n, m)).astype(np.int32)                 # [N, m]
    data = from_arrays(x, y, np.full((n,), m, np.int32)).on_device()
    model = make_model("mlp", (d,), classes, hidden=(sizes["hidden"],))
    params = model.init(jax.random.key(0))
    cfg = LocalTrainConfig(steps=sizes["steps"], batch_size=sizes["batch_size"],
                           learning_rate=0.05)
    return jax.random.key(1), params, data, model, cfg


def train_vmapped(sizes: dict, chunk_size="auto"):
    """:func:`fedjax_dp.train.train_agents` on :func:`build`'s workload (a callable to time)."""
    from fedjax_dp.train import train_agents
    key, params, data, model, cfg = build(sizes)
    return lambda: train_agents(key, params, data, model, cfg, chunk_size=chunk_size)


def measure(sizes: dict, repeats: int) -> dict:
    from fedjax_dp.models import forward_flops
    from fedjax_dp.train import batch_indices, make_local_step, make_local_update, train_agents

    n, steps, bs = sizes["agents"], sizes["steps"], sizes["batch_size"]
    key, params, data, model, cfg = build(sizes)
    times = {"vmap": common.time_fn(lambda: train_agents(key, params, data, model, cfg),
                                    repeats)}
    vm_params, _ = train_agents(key, params, data, model, cfg)

    looped = min(n, sizes["loop_max"])
    update = jax.jit(make_local_update(model, cfg))
    step, opt = make_local_step(model, cfg)
    step = jax.jit(step)
    draws = jax.jit(batch_indices, static_argnums=(2, 3))      # one dispatch per agent
    keys = jax.random.split(key, n)
    rows = [(keys[i], data.x[i], data.y[i], data.mask[i], data.counts[i])
            for i in sorted({*range(looped - 1), n - 1})]               # + the last agent

    def loop_agent():
        return [update(k, params, xi, yi, mi, ci) for k, xi, yi, mi, ci in rows[:looped]]

    def loop_step(subset):
        out = []
        for k, xi, yi, mi, ci in subset:
            p, s = params, opt.init(params)
            for idx in draws(k, ci, steps, bs):
                p, s, _ = step(p, s, idx, xi, yi, mi, ci)
            out.append(p)
        return out

    scale = n / looped
    loop_repeats = sizes.get("loop_repeats", 1)
    times["loop_agent"] = common.scaled(common.time_fn(loop_agent, loop_repeats), scale)
    times["loop_step"] = common.scaled(common.time_fn(lambda: loop_step(rows[:looped]),
                                                      loop_repeats), scale)
    ends = loop_step([rows[0], rows[-1]])
    agree = all(np.allclose(np.asarray(a)[i], np.asarray(b), rtol=1e-4, atol=1e-5)
                for i, p in ((0, ends[0]), (n - 1, ends[1]))
                for a, b in zip(jax.tree.leaves(vm_params), jax.tree.leaves(p)))
    flops = 3.0 * forward_flops(model, params) * bs * steps * n
    med = times["vmap"]["median_s"]
    return {"name": NAME, "title": TITLE,
            "sizes": {**sizes, "num_params": common.num_params(params), "model_gflop": flops / 1e9},
            "times": times,
            "pairs": {"loop_agent_over_vmap": ("loop_agent", "vmap"),
                      "loop_step_over_vmap": ("loop_step", "vmap")},
            "flops": {"vmap": flops}, "gflops": {"vmap": flops / med / 1e9},
            "checks": {"results_agree": bool(agree), "loop_agents_timed": looped}}
