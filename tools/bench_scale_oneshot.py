"""Scale benchmark of the one-shot algorithms on host-resident agents streamed in chunks.

AE-DPFL and kNN-DPFL end to end (local training, vote, student), and FedKT (``--algorithms
fedkt``: teachers, students, final model; s x t teachers per party, ``--party-chunk`` parties per
chunk, level L1 on a ``--query-fraction`` of the public set) on synthetic agents generated
with numpy directly into host memory (``records`` x ``features`` float32 per agent, 10 classes,
every agent full), a public set of ``public`` points and Q = ``queries`` queries. Each
(algorithm, N) runs in a fresh subprocess, which reports its wall time (data generation apart)
and its peak resident set size (``resource.getrusage(RUSAGE_SELF).ru_maxrss``) beside the size
of the agents' data. Usage::

    .venv/bin/python tools/bench_scale_oneshot.py            # 1e3 .. 1e6
    .venv/bin/python tools/bench_scale_oneshot.py --agents 1000 10000 --out /tmp/s.json
    .venv/bin/python tools/bench_scale_oneshot.py --algorithms fedkt \
        --agents 100 1000 10000 --records 64 --public 500 --steps 10 \
        --out results/scale/oneshot_fedkt.json

``--paths hand cli`` (default: both) also runs each AE-DPFL N the way a user does:
``fedjax-dp run configs/ae_dpfl/mnist5k.toml --set ...`` as a subprocess (``synthetic`` data of the
same shape, ``iid`` partition, the same local training, vote and student settings, everything
else as the config and the defaults give it: ``run.agents_on = "auto"``), its peak RSS read from
``os.wait4`` of that process and its wall time measured around it (Python start, imports, data
generation, partition and stacking included); rows carry ``"path": "hand"`` or ``"cli"``::

    .venv/bin/python tools/bench_scale_oneshot.py --agents 1000000 \
        --algorithms ae_dpfl --out results/scale/oneshot_cli.json

``run(agents_list, ...)`` is the importable entry point (returns the JSON record).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALGORITHMS = ("ae_dpfl", "knn_dpfl")
CHOICES = ALGORITHMS + ("fedkt",)


def make_agents(num_agents: int, records: int, features: int, classes: int, seed: int,
                block: int = 1 << 15):
    """Host arrays ``x [N, records, features] float32``, ``y [N, records] int32`` and the class
    means: :func:`fedjax_dp.bench.ae_dpfl.make_agents` (the generator of ``fedjax-dp bench``'s
    AE-DPFL part), imported here so the parent process stays free of JAX."""
    from fedjax_dp.bench.ae_dpfl import make_agents as generate
    return generate(num_agents, records, features, classes, seed, block)


def _points(means, num: int, seed: int):
    import numpy as np
    rng = np.random.default_rng(seed)
    y = rng.integers(0, len(means), num).astype(np.int32)
    return (means[y] + rng.standard_normal((num, means.shape[1]), dtype=np.float32)), y


def child(args) -> dict:
    """One (algorithm, N) measurement in this process."""
    import resource

    import jax
    import numpy as np

    from fedjax_dp.core import agent_stream
    from fedjax_dp.algorithms.voting import ae_dpfl, knn_dpfl
    from fedjax_dp.algorithms import api
    from fedjax_dp.core import from_arrays
    from fedjax_dp.models import make_model
    from fedjax_dp.train import LocalTrainConfig, accuracy

    agent_stream.PREFETCH = not args.no_prefetch
    tic = time.perf_counter()
    x, y, means = make_agents(args.agents, args.records, args.features, args.classes, seed=0)
    agents = from_arrays(x, y, np.full(args.agents, args.records, np.int32), check=False)
    x_public, y_public = _points(means, args.public, seed=1)
    x_test, y_test = _points(means, 2000, seed=2)
    gen_s = time.perf_counter() - tic
    model = make_model("mlp", (args.features,), args.classes, hidden=(args.hidden,))
    data = api.FederatedData(agents=agents, num_classes=args.classes, x_public=x_public,
                             y_public=y_public)
    common = dict(sigma=args.sigma, num_queries=args.queries, student_steps=200,
                  student_batch_size=32, agent_chunk=args.chunk, vote_noise=args.vote_noise)
    if args.algorithm == "fedkt":
        return _child_fedkt(args, agents, data, model, x_test, y_test, gen_s)
    if args.algorithm == "ae_dpfl":
        module = ae_dpfl
        cfg = ae_dpfl.Config(local=LocalTrainConfig(steps=args.steps, batch_size=8,
                                                    learning_rate=0.1), **common)
    else:
        module = knn_dpfl
        cfg = knn_dpfl.Config(k=args.k, feature_map="pca", feature_dim=16, **common)
    tic = time.perf_counter()
    done = api.run(module, jax.random.key(0), data, model, cfg,
                   runtime=api.Runtime(chunk_size=None))
    run_s = time.perf_counter() - tic
    out = module.output(done.state)
    phases = {r["phase"]: r for r in done.history}
    return {"algorithm": args.algorithm, "num_agents": args.agents, "wall_s": run_s,
            "generate_s": gen_s,
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "data_bytes": int(agents.nbytes), "agent_chunk": args.chunk,
            "vote_noise": args.vote_noise, "prefetch": not args.no_prefetch,
            "vote_accuracy": phases["vote"].get("vote_accuracy"),
            "test_accuracy": float(accuracy(out.model, out.params, x_test, y_test))}


def _child_fedkt(args, agents, data, model, x_test, y_test, gen_s) -> dict:
    """One FedKT measurement: L1, s x t teachers per party, ``party_chunk`` parties per chunk."""
    import resource

    import jax
    import numpy as np

    from fedjax_dp.algorithms import api
    from fedjax_dp.algorithms.fedkt import fedkt
    from fedjax_dp.train import LocalTrainConfig

    local = LocalTrainConfig(steps=args.steps, batch_size=16, learning_rate=1e-2,
                             optimizer="adam")
    cfg = fedkt.Config(num_partitions=args.partitions, num_teachers=args.teachers, level="L1",
                       gamma=args.gamma, query_fraction=args.query_fraction,
                       student_steps=args.student_steps, final_steps=args.student_steps,
                       party_chunk=args.party_chunk or None, local=local)
    marks = [time.perf_counter()]
    done = api.run(fedkt, jax.random.key(0), data, model, cfg,
                   runtime=api.Runtime(chunk_size=None),
                   on_step=lambda t, record: marks.append(time.perf_counter()))
    run_s = marks[-1] - marks[0]
    out = fedkt.output(done.state)
    phases = {r["phase"]: r for r in done.history}
    v = done.state.values
    kept = sum(a.nbytes for a in (v["teacher_votes"], v["party_labels"], v["student_preds"]))
    return {"algorithm": "fedkt", "num_agents": args.agents, "wall_s": run_s,
            "generate_s": gen_s,
            "phase_s": {p: marks[i + 1] - marks[i] for i, p in enumerate(fedkt.PHASES)},
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "data_bytes": int(agents.nbytes), "kept_votes_bytes": int(kept),
            "party_chunk": phases["teachers"]["party_chunk"],
            "teachers": args.agents * args.partitions * args.teachers,
            "prefetch": not args.no_prefetch,
            "server_label_accuracy": phases["final"].get("server_label_accuracy"),
            "test_accuracy": float(np.mean(out.predict_labels(x_test) == y_test))}


def cli_sets(num_agents: int, records: int, features: int, *, classes: int, public: int,
             queries: int, hidden: int, steps: int, sigma: float, chunk: int,
             vote_noise: str, generator: str = "numpy", agents_on: str = "auto") -> list[str]:
    """The ``--set`` overrides of the command-line AE-DPFL row (the hand-built row's workload on
    ``synthetic`` data); ``generator = "jax"`` draws the agents where they are consumed
    (``dataset_options.generator``), ``agents_on`` other than ``"auto"`` sets
    ``run.agents_on``."""
    gen = "" if generator == "numpy" else f",generator=\"{generator}\""
    where = [] if agents_on == "auto" else [f"run.agents_on=\"{agents_on}\""]
    return [f"data.dataset=synthetic", f"data.num_agents={num_agents}", "data.partition=iid",
            "data.partition_options={}",
            f"data.dataset_options={{num_train={num_agents * records},num_features={features},"
            f"num_classes={classes},num_public={public},num_test=2000{gen}}}", *where,
            f"train.steps={steps}", "train.batch_size=8", "train.learning_rate=0.1",
            f"model.hidden=[{hidden}]", f"algorithm.sigma={sigma}",
            f"algorithm.num_queries={queries}", "algorithm.student_steps=200",
            "algorithm.student_batch_size=32", f"algorithm.agent_chunk={chunk}",
            f"algorithm.vote_noise={vote_noise}"]


def cli_row(num_agents: int, sets: list[str], records: int, features: int,
            timeout: float) -> dict:
    """One ``fedjax-dp run`` of AE-DPFL in a subprocess: wall time and peak RSS of that process."""
    import shutil
    import tempfile
    exe = Path(sys.executable).with_name("fedjax-dp")
    cmd = ([str(exe)] if exe.exists() else [sys.executable, "-m", "fedjax_dp.experiments.cli"])
    folder = Path(tempfile.mkdtemp(prefix="bench_cli_"))
    cmd += ["run", str(ROOT / "configs" / "ae_dpfl" / "mnist5k.toml"), "--quiet",
            "--out", str(folder / "run")]
    for s in sets:
        cmd += ["--set", s]
    try:
        with open(folder / "log", "w") as log:
            tic = time.perf_counter()
            # a fresh persistent compilation cache: every row compiles as a first run does
            env = dict(os.environ, FEDJAX_DP_CACHE_DIR=str(folder / "cache"))
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                    env=env)
            timer = threading.Timer(timeout, proc.kill)
            timer.start()
            try:
                _, status, usage = os.wait4(proc.pid, 0)
            except BaseException:
                proc.kill()
                raise
            finally:
                timer.cancel()
            wall = time.perf_counter() - tic
            proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            return {"algorithm": "ae_dpfl", "path": "cli", "num_agents": num_agents,
                    "error": (folder / "log").read_text()[-2000:]}
        result = json.loads((folder / "run" / "result.json").read_text())
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    data_bytes = num_agents * (records * (features * 4 + 4 + 1) + 4)     # x, y, mask, counts
    phases = {r.get("phase"): r for r in result.get("history", [])}
    timing = result.get("timing", {})
    return {"algorithm": "ae_dpfl", "path": "cli", "num_agents": num_agents,
            "command": "fedjax-dp run configs/ae_dpfl/mnist5k.toml " +
                       " ".join(f"--set {s}" for s in sets),
            "wall_s": wall, "run_wall_s": result["wall_time_s"],
            "setup_s": timing.get("setup_s"), "phase_s": timing.get("round_s"),
            "compilations": timing.get("compilations"), "compile_s": timing.get("compile_s"),
            "compiled": [e["what"] for e in timing.get("listed", [])],
            "peak_rss_bytes": usage.ru_maxrss * 1024, "data_bytes": data_bytes,
            "agents_on": result["config"]["run"]["agents_on"],
            "vote_accuracy": phases.get("vote", {}).get("vote_accuracy"),
            "test_accuracy": result["test_accuracy"]}


def run(agents_list, records: int = 16, features: int = 32, *, algorithms=ALGORITHMS,
        classes: int = 10, public: int = 2000, queries: int = 200, hidden: int = 32,
        steps: int = 5, k: int = 3, sigma: float = 20.0, chunk: int = 4096,
        vote_noise: str = "aggregate", prefetch: bool = True, timeout: float = 3600,
        partitions: int = 2, teachers: int = 3, gamma: float = 0.5,
        query_fraction: float = 0.2, student_steps: int = 50, party_chunk: int = 0,
        paths=("hand", "cli"), generator: str = "numpy", agents_on: str = "auto") -> dict:
    """Every (algorithm, N) in a fresh subprocess; returns ``{"config": ..., "rows": [...]}``.
    FedKT reads ``partitions`` (s), ``teachers`` (t), ``gamma``, ``query_fraction``,
    ``student_steps`` (students and final model) and ``party_chunk`` (0: the default).
    ``paths``: ``"hand"`` (agents built here) and / or ``"cli"`` (AE-DPFL through
    ``fedjax-dp run``, :func:`cli_row`)."""
    rows = []
    for algorithm in algorithms:
        for n in agents_list:
            if "cli" in paths and algorithm == "ae_dpfl":
                sets = cli_sets(n, records, features, classes=classes, public=public,
                                queries=queries, hidden=hidden, steps=steps, sigma=sigma,
                                chunk=chunk, vote_noise=vote_noise, generator=generator,
                                agents_on=agents_on)
                rows.append(cli_row(n, sets, records, features, timeout))
                _print(rows[-1])
            if "hand" not in paths:
                continue
            cmd = [sys.executable, __file__, "--child", "--algorithm", algorithm,
                   "--agents", str(n), "--records", str(records), "--features", str(features),
                   "--classes", str(classes), "--public", str(public), "--queries", str(queries),
                   "--hidden", str(hidden), "--steps", str(steps), "--k", str(k),
                   "--sigma", str(sigma), "--chunk", str(chunk), "--vote-noise", vote_noise,
                   "--partitions", str(partitions), "--teachers", str(teachers),
                   "--gamma", str(gamma), "--query-fraction", str(query_fraction),
                   "--student-steps", str(student_steps), "--party-chunk", str(party_chunk)]
            if not prefetch:
                cmd.append("--no-prefetch")
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            if proc.returncode != 0:
                rows.append({"algorithm": algorithm, "num_agents": n,
                             "error": proc.stderr[-2000:]})
            else:
                rows.append(dict(json.loads(proc.stdout.strip().splitlines()[-1]), path="hand"))
            _print(rows[-1])
    config = dict(records=records, features=features, classes=classes, public=public,
                  queries=queries, hidden=hidden, local_steps=steps, k=k, sigma=sigma,
                  agent_chunk=chunk, vote_noise=vote_noise, prefetch=prefetch,
                  generator=generator, agents_on=agents_on,
                  cpu_count=os.cpu_count(), paths=list(paths))
    if "fedkt" in algorithms:
        config["fedkt"] = dict(level="L1", partitions=partitions, teachers=teachers,
                               gamma=gamma, query_fraction=query_fraction,
                               student_steps=student_steps, party_chunk=party_chunk or None,
                               teacher_batch_size=16, optimizer="adam")
    return {"config": config, "rows": rows}


def _print(r: dict) -> None:
    what = f"{r['algorithm']} ({r.get('path', 'hand')}) N={r['num_agents']}"
    if "error" in r:
        print(f"{what}: FAILED\n{r['error']}", file=sys.stderr, flush=True)
        return
    print(f"{what}: {r['wall_s']:.1f} s, peak RSS {r['peak_rss_bytes'] / 2**30:.2f} GiB, data "
          f"{r['data_bytes'] / 2**30:.2f} GiB ({r['peak_rss_bytes'] / r['data_bytes']:.2f}x), "
          f"test acc {r['test_accuracy']:.3f}", file=sys.stderr, flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--algorithm", default="ae_dpfl", choices=CHOICES)
    ap.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS), choices=CHOICES)
    ap.add_argument("--agents", type=int, nargs="+", default=[1000, 10_000, 100_000, 1_000_000])
    ap.add_argument("--records", type=int, default=16)
    ap.add_argument("--features", type=int, default=32)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--public", type=int, default=2000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--sigma", type=float, default=20.0)
    ap.add_argument("--chunk", type=int, default=4096)
    ap.add_argument("--vote-noise", default="aggregate", choices=("aggregate", "per_agent"))
    ap.add_argument("--generator", default="numpy", choices=("numpy", "jax"),
                    help="the CLI row's synthetic generator (jax: drawn where consumed)")
    ap.add_argument("--agents-on", default="auto", choices=("auto", "host", "device"),
                    help="the CLI row's run.agents_on")
    ap.add_argument("--no-prefetch", action="store_true")
    ap.add_argument("--partitions", type=int, default=2, help="FedKT s")
    ap.add_argument("--teachers", type=int, default=3, help="FedKT t")
    ap.add_argument("--gamma", type=float, default=0.5, help="FedKT Laplace parameter (L1)")
    ap.add_argument("--query-fraction", type=float, default=0.2)
    ap.add_argument("--student-steps", type=int, default=50, help="FedKT students / final")
    ap.add_argument("--party-chunk", type=int, default=0, help="FedKT parties per chunk "
                    "(0: the default, about 4096 teachers' worth)")
    ap.add_argument("--paths", nargs="+", default=["hand", "cli"], choices=("hand", "cli"),
                    help="hand-built agents and / or AE-DPFL through fedjax-dp run")
    ap.add_argument("--out", default=str(ROOT / "results" / "scale" / "oneshot.json"))
    args = ap.parse_args(argv)
    if args.child:
        args.agents = args.agents[0]
        print(json.dumps(child(args)), flush=True)
        return
    record = run(args.agents, args.records, args.features, algorithms=args.algorithms,
                 classes=args.classes, public=args.public, queries=args.queries,
                 hidden=args.hidden, steps=args.steps, k=args.k, sigma=args.sigma,
                 chunk=args.chunk, vote_noise=args.vote_noise, prefetch=not args.no_prefetch,
                 partitions=args.partitions, teachers=args.teachers, gamma=args.gamma,
                 query_fraction=args.query_fraction, student_steps=args.student_steps,
                 party_chunk=args.party_chunk, paths=tuple(args.paths),
                 generator=args.generator, agents_on=args.agents_on)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
