"""Bench part: the peers' DP-FedAvg workload, this library's round vs the plain-JAX reference.

The workload of :mod:`fedjax_dp.bench.peers_reference` at each cohort C of ``cohorts``
(docs/bench.md):

* ``ours_C``: :mod:`fedjax_dp.algorithms.averaging.dp_fedavg` with ``sampling = "fixed"``,
  ``train.batching = "stored"`` and the gathered cohort, from the workload's initial weights;
* ``fused_C``: ``rounds`` of the same rounds in ONE compiled call
  (:func:`fedjax_dp.algorithms.fused_rounds.make_fused_rounds`), seconds divided by ``rounds``;
* ``reference_C``: the plain-JAX round.

Seconds per round: ``rounds`` timed rounds after 2 warm-up rounds. At the published sizes the
workload's check (:data:`~fedjax_dp.bench.peers_reference.CHECK_PARAM_NORM`) runs first.
"""
from __future__ import annotations

import dataclasses

import jax
import numpy as np

from fedjax_dp.bench import common, peers_reference as ref

NAME = "peers_dp_fedavg"
TITLE = "the peers' DP-FedAvg workload: this library's round vs the plain-JAX reference"


def _setup(w: ref.Workload):
    from fedjax_dp.algorithms import api
    from fedjax_dp.core import from_arrays
    from fedjax_dp.models import make_model
    from fedjax_dp.train import LocalTrainConfig

    x, y = ref.make_data(w)
    host = from_arrays(x, y.astype(np.int32), np.full((w.clients,), w.examples, np.int32))
    data = api.FederatedData(agents=host.on_device(), num_classes=w.classes)
    model = make_model("mlp", (w.dim,), w.classes, hidden=(w.hidden,))
    local = LocalTrainConfig(steps=w.local_steps, batch_size=w.batch,
                             learning_rate=w.client_lr, batching="stored")
    p = ref.init_params(w)
    params = jax.tree.map(jax.numpy.asarray, {"params": {
        "Dense_0": {"kernel": p["w1"], "bias": p["b1"]},
        "Dense_1": {"kernel": p["w2"], "bias": p["b2"]}}})
    return x, y, data, model, local, params


def _ours_state(w, data, model, local, params, cohort: int, noise: float, rounds: int,
                rounds_per_call: int | str = "auto"):
    from fedjax_dp.algorithms import api
    from fedjax_dp.algorithms.averaging import dp_fedavg
    cfg = dp_fedavg.Config(rounds=rounds, sampling="fixed", cohort_size=cohort,
                           clip_norm=w.clip, noise_multiplier=noise, server_lr=w.server_lr,
                           local=local)
    state = dp_fedavg.init(jax.random.key(1), data, model, cfg,
                           api.Runtime(cohort="gather", rounds_per_call=rounds_per_call))
    return api.State(step=0, values={**state.values, "params": params}, context=state.context)


def check(w: ref.Workload = ref.WORKLOAD) -> dict:
    """One noiseless round of every client from the shared initial weights: this library's
    parameter norm, the reference's, and the published 14.735746."""
    from fedjax_dp.algorithms import api
    from fedjax_dp.algorithms.averaging import dp_fedavg
    x, y, data, model, local, params = _setup(w)
    state = _ours_state(w, data, model, local, params, w.clients, 0.0, 1)
    state, _ = dp_fedavg.step(state, api.step_key(jax.random.key(0), 0))
    p = state.values["params"]["params"]
    ours = ref.param_norm({"w1": p["Dense_0"]["kernel"], "b1": p["Dense_0"]["bias"],
                           "w2": p["Dense_1"]["kernel"], "b2": p["Dense_1"]["bias"]})
    p0 = {k: jax.numpy.asarray(v) for k, v in ref.init_params(w).items()}
    r = ref.make_round(w)(p0, x, y.astype(np.int32), np.arange(w.clients, dtype=np.int32),
                          jax.random.key(0), 0.0)
    theirs = ref.param_norm(r)
    return {"param_norm": ours, "reference_param_norm": theirs,
            "expected_param_norm": ref.CHECK_PARAM_NORM,
            "ok": abs(ours - ref.CHECK_PARAM_NORM) < 1e-4 and abs(theirs - ours) < 1e-4}


def measure(sizes: dict, repeats: int) -> dict:
    from fedjax_dp.algorithms import api
    from fedjax_dp.algorithms.averaging import dp_fedavg

    w = dataclasses.replace(ref.WORKLOAD, clients=sizes["clients"], examples=sizes["examples"])
    published = w == ref.WORKLOAD
    checks = {"published_workload": published}
    if published:
        checks["check"] = check(w)
        if not checks["check"]["ok"]:
            raise RuntimeError(f"the peers' workload check failed: {checks['check']}")
    x, y, data, model, local, params = _setup(w)
    X, Y = jax.numpy.asarray(x), jax.numpy.asarray(y.astype(np.int32))
    round_ref = ref.make_round(w)
    p0 = {k: jax.numpy.asarray(v) for k, v in ref.init_params(w).items()}
    rounds = max(repeats, sizes.get("rounds", repeats))
    key = jax.random.key(0)
    times, pairs = {}, {}
    for c in sizes["cohorts"]:
        state = _ours_state(w, data, model, local, params, c, w.noise_multiplier, rounds + 2)

        def ours_step(s, t):
            s, metrics = dp_fedavg.step(s, api.step_key(key, t))
            common.block((s.values, metrics))           # api.State is not a pytree
            return s

        times[f"ours_{c}"], _ = common.time_rounds(ours_step, state, rounds)
        fused = _ours_state(w, data, model, local, params, c, w.noise_multiplier,
                            rounds * (repeats + 1), rounds_per_call=rounds)

        def fused_call(s, t):
            s, metrics = dp_fedavg.multi_step(s, key, s.step, rounds)
            common.block((s.values, metrics))
            return s

        call, _ = common.time_rounds(fused_call, fused, repeats, warmup=1)
        times[f"fused_{c}"] = {k: (v / rounds if k != "all_s" else [x / rounds for x in v])
                               for k, v in call.items() if v is not None}
        host_rng = np.random.default_rng(123)

        def ref_step(p, t, c=c):
            idx = np.sort(host_rng.choice(w.clients, c, replace=False)).astype(np.int32)
            return round_ref(p, X, Y, idx, jax.random.fold_in(key, t), w.noise_multiplier)

        times[f"reference_{c}"], _ = common.time_rounds(ref_step, p0, rounds)
        pairs[f"ours_over_reference_{c}"] = (f"ours_{c}", f"reference_{c}")
        pairs[f"fused_over_reference_{c}"] = (f"fused_{c}", f"reference_{c}")
    return {"name": NAME, "title": TITLE,
            "sizes": {**sizes, "dim": w.dim, "hidden": w.hidden, "local_steps": w.local_steps,
                      "batch": w.batch, "rounds_timed": rounds},
            "times": times, "pairs": pairs, "checks": checks,
            "reference": "fedjax_dp.bench.peers_reference (jax_ref.py --engine map --chunk 10)"}
