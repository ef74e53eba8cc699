"""Bench part: one ISRL-DP FedProx-SPIDER round over N silos, vectorised vs a loop over silos.

Synthetic data (N silos x ``local_size`` records x ``features``, ``classes`` labels), a
one-hidden-layer MLP, K1 = K2 = ``batch_size``: ``vectorised_refresh`` / ``_difference`` (the
compiled round of :func:`fedjax_dp.algorithms.isrl.engine.make_round`) against ``loop_refresh``
/ ``_difference`` (a Python loop over the jitted one-silo uploads of
:func:`engine.silo_functions`, timed on ``loop_max`` silos and scaled). ``results_agree``: the
vmapped refresh uploads sum to the loop's (unless ``check`` is false).
"""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.bench import common

NAME = "isrl_spider_round"
TITLE = "an ISRL-DP SPIDER round (vectorised) vs a loop over silos"


def measure(sizes: dict, repeats: int) -> dict:
    from fedjax_dp.core.lift import resolve_chunk_size
    from fedjax_dp.privacy.private_grad import per_example_bytes
    from fedjax_dp.algorithms.isrl import engine
    from fedjax_dp.core import StackedData
    from fedjax_dp.models import make_model

    n, size, f, bs = sizes["silos"], sizes["local_size"], sizes["features"], sizes["batch_size"]
    looped = min(n, sizes["loop_max"])
    classes = sizes.get("classes", 2)
    model = make_model("mlp", (f,), classes, hidden=(sizes["hidden"],))
    loss_fn = engine.loss_for(model)
    params = model.init(jax.random.key(0))
    rng = np.random.default_rng(n)
    agents = StackedData(x=jnp.asarray(rng.normal(size=(n, size, f)).astype(np.float32)),
                         y=jnp.asarray(rng.integers(0, classes, size=(n, size)).astype(np.int32)),
                         mask=jnp.ones((n, size), bool), counts=jnp.full((n,), size, jnp.int32))
    sdata = engine.silo_data(agents, (bs, bs))
    spec = engine.RoundSpec(method="spider", num_silos=n, num_available=n, period=2,
                            report_objective=False, batch_sizes=(bs, bs))
    chunk = resolve_chunk_size("auto", num_agents=agents.num_agents,
                               bytes_per_agent=per_example_bytes(params, agents.max_size))
    round_fn = engine.make_round(loss_fn, spec, chunk_size=chunk)
    values0 = engine.initial_values(spec, params, engine.hyper(0.1, 1.0, 1.0))
    key = jax.random.key(0)
    t0 = time.perf_counter()
    values1, _ = common.block(round_fn(key, values0, sdata))              # round 0: refresh
    checks = {"first_call_s": time.perf_counter() - t0, "loop_silos_timed": looped}
    times = {"vectorised_refresh": common.time_fn(lambda: round_fn(key, values0, sdata), repeats),
             "vectorised_difference": common.time_fn(lambda: round_fn(key, values1, sdata),
                                                     repeats)}
    fns = engine.silo_functions(loss_fn, spec)
    grad, diff = jax.jit(fns["gradient"]), jax.jit(fns["difference"])
    add = jax.jit(lambda a, b: jax.tree.map(jnp.add, a, b))
    keys = jax.random.split(key, n)
    p0, p1 = values0["params"], values1["params"]
    r, dn = sdata.rates, sdata.denominators
    silo_args = [(keys[i], agents.x[i], agents.y[i], agents.mask[i], r[i, 0], dn[i, 0], r[i, 1],
                  dn[i, 1]) for i in range(looped)]
    tau = jnp.float32(2.0)

    def loop(kind):
        total = None
        for k, x, y, m, r0, d0, r1, d1 in silo_args:
            u, _ = (grad(k, p0, x, y, m, r0, d0, 1.0, 1.0) if kind == "refresh"
                    else diff(k, p1, p0, x, y, m, r1, d1, 1.0, tau, 1.0))
            total = u if total is None else add(total, u)
        return total

    loop_repeats = sizes.get("loop_repeats", 1)
    for kind in ("refresh", "difference"):
        times[f"loop_{kind}"] = common.scaled(common.time_fn(lambda: loop(kind), loop_repeats),
                                              n / looped)
    if sizes.get("check", True):               # the same uploads: the vmapped sum == the loop's
        lifted = jax.jit(jax.vmap(fns["gradient"], in_axes=(0, None, 0, 0, 0, 0, 0, None, None)))
        u, _ = lifted(keys[:looped], p0, agents.x[:looped], agents.y[:looped],
                      agents.mask[:looped], r[:looped, 0], dn[:looped, 0], 1.0, 1.0)
        checks["results_agree"] = bool(all(
            np.allclose(np.asarray(a).sum(0), np.asarray(b), rtol=1e-4, atol=1e-5)
            for a, b in zip(jax.tree.leaves(u), jax.tree.leaves(loop("refresh")))))
    return {"name": NAME, "title": TITLE,
            "sizes": {**sizes, "chunk_size": chunk, "num_params": common.num_params(params)},
            "times": times,
            "pairs": {f"loop_over_vectorised_{kind}": (f"loop_{kind}", f"vectorised_{kind}")
                      for kind in ("refresh", "difference")},
            "checks": checks}
