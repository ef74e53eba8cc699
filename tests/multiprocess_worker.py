"""One process of the 2-process ``jax.distributed`` check (``tests/test_multiprocess.py``).

Launch (what the test runs; every process maps the same population folder)::

    python tests/multiprocess_worker.py write-population POPULATION
    python tests/multiprocess_worker.py POPULATION OUT --process-id 0 --num-processes 2 \\
        --coordinator 127.0.0.1:PORT --local-devices 2 &
    python tests/multiprocess_worker.py POPULATION OUT --process-id 1 --num-processes 2 \\
        --coordinator 127.0.0.1:PORT --local-devices 2

Each process forces ``--local-devices`` CPU devices (``jax_num_cpu_devices``), joins the job with
``jax.distributed.initialize`` (CPU collectives: gloo), and runs over ``agent_mesh()`` -- the
``agents`` axis spans every device of every process:

* DP-FedAvg (:mod:`fedjax_dp.algorithms.averaging.dp_fedavg`) from the memory-mapped population
  (host-resident: each process gathers and transfers only its own devices' cohort rows), and
* AE-DPFL (:mod:`fedjax_dp.algorithms.voting.ae_dpfl`): local training and ballots, chunk by
  chunk, each agent on one of the 4 devices (the chunks split over the mesh), the ballots
  gathered to every process and the vote streamed over them as without a mesh.

Every process writes its results (``OUT/process_<i>.npz``); :func:`run_all` with ``mesh=None``
is the single-process, single-device reference the test compares them with.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROUNDS = 2
NUM_CLASSES = 3
FEATURES = 5


def write_population(folder) -> None:
    """A tiny generated population: 10 agents (not a multiple of 4 devices, so the mesh pads),
    up to 6 records of 5 features, 3 classes; ``public.npy`` holds 12 unlabelled public records
    (AE-DPFL's queries). Written with :func:`fedjax_dp.core.save_stacked` (memory-mapped when
    loaded)."""
    from fedjax_dp.core import from_ragged, save_stacked
    r = np.random.default_rng(0)
    sizes = [3, 6, 4, 5, 2, 6, 3, 4, 5, 6]
    w = r.normal(size=(FEATURES, NUM_CLASSES))
    xs = [r.normal(size=(n, FEATURES)).astype(np.float32) for n in sizes]
    ys = [np.argmax(x @ w, axis=1) for x in xs]
    save_stacked(folder, from_ragged(xs, ys))
    np.save(Path(folder) / "public.npy", r.normal(size=(12, FEATURES)).astype(np.float32))


def run_all(folder, mesh, times: dict | None = None) -> dict[str, np.ndarray]:
    """DP-FedAvg (``ROUNDS`` rounds) and AE-DPFL on the population in ``folder``, with the agent
    axis over ``mesh`` (None: one device). Returns host arrays: the final DP-FedAvg parameters
    (``fedavg/<i>``, leaf order) and per-round train losses; AE-DPFL's released labels, agent
    ballots and noise-free vote sums (``data_dependent``: exact counts, summed over the mesh);
    ``round_compilations``: programs compiled for DP-FedAvg's fused round (1: every round ran
    the first round's program). ``times``: filled with each algorithm's seconds (compiles
    included)."""
    import jax

    from fedjax_dp.algorithms import api
    from fedjax_dp.algorithms.averaging import dp_fedavg
    from fedjax_dp.algorithms.voting import ae_dpfl
    from fedjax_dp.core import load_stacked
    from fedjax_dp.models import make_model
    from fedjax_dp.train import LocalTrainConfig

    agents = load_stacked(folder)                        # memory-mapped: host-resident
    assert isinstance(agents.x, np.memmap), type(agents.x)
    public = np.load(Path(folder) / "public.npy")
    model = make_model("mlp", (FEATURES,), NUM_CLASSES, hidden=(4,))
    local = LocalTrainConfig(steps=2, batch_size=4, learning_rate=0.1)
    runtime = api.Runtime(mesh=mesh, chunk_size=None)
    out, times = {}, {} if times is None else times

    tick = time.perf_counter()
    # fixed-size cohorts of 4 (one bucket: one compilation of the round; 4 = a multiple of the
    # 2 x 2 devices, no padding); the round's noise std is noise_multiplier * clip_norm
    cfg = dp_fedavg.Config(rounds=ROUNDS, sampling="fixed", cohort_size=4, clip_norm=0.5,
                           noise_multiplier=0.8, local=local, diagnostics=True)  # train_loss
    res = api.run(dp_fedavg, jax.random.key(0), api.FederatedData(agents, NUM_CLASSES), model,
                  cfg, runtime=runtime)
    for i, leaf in enumerate(jax.tree.leaves(dp_fedavg.output(res.state).params)):
        out[f"fedavg/{i}"] = np.asarray(jax.device_get(leaf))
    out["fedavg/train_loss"] = np.asarray([h["train_loss"] for h in res.history])
    fused = res.state.context.round_fn.parts[2]               # the one-pass round's jit
    out["round_compilations"] = np.int64(fused._cache_size())  # programs compiled for it
    times["dp_fedavg"] = time.perf_counter() - tick

    tick = time.perf_counter()
    # AE-DPFL's first two phases (local training of every agent, then the MPC vote, sharded
    # over the mesh: needs device-resident agents, whose trained parameters it keeps)
    cfg = ae_dpfl.Config(sigma=1.0, num_queries=8, local=local, data_dependent=True)  # sums
    fed = api.FederatedData(agents.on_device(), NUM_CLASSES, x_public=public)
    state = ae_dpfl.init(jax.random.key(1), fed, model, cfg, runtime)
    for _ in ae_dpfl.PHASES[:2]:
        state, _ = ae_dpfl.step(state)
    out["ae_dpfl/labels"] = np.asarray(state.values["labels"])
    out["ae_dpfl/ballots"] = np.asarray(state.values["agent_ballots"])
    out["ae_dpfl/clean_vote_sums"] = np.asarray(state.values["clean_vote_sums"])   # [Q, C]
    times["ae_dpfl"] = time.perf_counter() - tick
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["write-population"]:                 # write-population FOLDER
        write_population(argv[1])
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("population", help="folder written by write_population (save_stacked)")
    p.add_argument("out", help="folder: process i writes its results to process_<i>.npz")
    p.add_argument("--process-id", type=int, required=True)
    p.add_argument("--num-processes", type=int, required=True)
    p.add_argument("--coordinator", required=True, help="HOST:PORT of process 0's coordinator")
    p.add_argument("--local-devices", type=int, default=2, help="forced CPU devices per process")
    args = p.parse_args(argv)

    start = time.perf_counter()
    import jax
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", args.local_devices)      # before the backend starts
    jax.config.update("jax_cpu_collectives_implementation", "gloo")   # cross-process CPU psum
    jax.distributed.initialize(args.coordinator, num_processes=args.num_processes,
                               process_id=args.process_id, initialization_timeout=60)
    from fedjax_dp.core import agent_mesh
    mesh = agent_mesh()                                  # every device of every process
    times = {"start": time.perf_counter() - start}
    out = run_all(args.population, mesh, times)
    out.update({"process_index": np.int64(jax.process_index()),
                "process_count": np.int64(jax.process_count()),
                "local_devices": np.int64(jax.local_device_count()),
                "mesh_processes": np.asarray(sorted({d.process_index
                                                     for d in mesh.devices.flat}))})
    Path(args.out).mkdir(parents=True, exist_ok=True)
    np.savez(Path(args.out) / f"process_{args.process_id}.npz", **out)
    print("seconds", json.dumps({k: round(v, 2) for k, v in times.items()}), file=sys.stderr)
    jax.distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.exit(main())
