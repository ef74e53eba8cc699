"""ISRL-DP experiment (Lowy et al. 2023, Figs. 4-5 and 8 in shape): test error vs epsilon.
As sweep files: ``configs/experiments/isrl_*.toml`` (``fedjax-dp sweep FILE``; docs/sweeps.md).

For each dataset (``configs/isrl/<dataset>_<algorithm>.toml`` are the base configs) and each
private algorithm, for every target epsilon (delta = 1/n^2, n = the largest silo's number of
training records, so every silo gets at least that guarantee):

1. every silo's training records are split 80 / 20 into training and VALIDATION records (fixed
   split); the test split is never looked at until the end;
2. the noise multiplier z is calibrated per silo by dp-accounting for that epsilon (it does not
   depend on the step size or the clip norm: the noise std is z times the clip);
3. all (step size x clip norm x seed) runs go through ONE compiled function: the algorithm's round
   (``engine.make_round``) scanned over the R rounds and mapped over the runs (``lax.map`` with a
   batch size, i.e. vmapped chunks of runs), so a whole grid costs one compilation per algorithm;
4. the (step size, clip) with the best mean validation accuracy over seeds is selected, and its
   test error (mean and std over seeds) is reported.

The non-private baselines (MB-SGD, Local SGD) are tuned over the step sizes alone and drawn as
horizontal lines. Seeds change the model initialisation, the record sampling, the silo
availability and the noise; the data split is fixed.

    python tools/exp_isrl.py --out results/isrl                      # both datasets, full grid
    python tools/exp_isrl.py --datasets wbcd --epsilons 1 6 --seeds 2 --quick --out /tmp/isrl

Writes ``results.json`` (every run's validation and test accuracy, the selected hyper-parameters,
the calibrated noise and the achieved epsilon of the worst silo), ``table.md`` and
``test_error_vs_epsilon.png``.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging as absl_logging

ROOT = Path(__file__).resolve().parents[1]

from fedjax_dp.algorithms import api
from fedjax_dp.algorithms import isrl
from fedjax_dp.algorithms.isrl import engine
from fedjax_dp.core import from_ragged, rng
from fedjax_dp.experiments import config as config_lib
from fedjax_dp.experiments import runner
from fedjax_dp.models import make_model

PRIVATE = ("isrl_spider", "isrl_prox_pl_svrg", "isrl_mb_sgd", "isrl_local_sgd")
NON_PRIVATE = ("mb_sgd", "local_sgd")
EPSILONS = (0.75, 1.0, 1.5, 3.0, 6.0, 12.0, 18.0)
LEARNING_RATES = (0.03, 0.1, 0.3, 1.0)
CLIPS = (0.1, 1.0, 5.0)
LABELS = {"isrl_spider": "ISRL-DP SPIDER", "isrl_prox_pl_svrg": "ISRL-DP Prox-PL-SVRG",
          "isrl_mb_sgd": "ISRL-DP MB-SGD", "isrl_local_sgd": "ISRL-DP Local SGD",
          "mb_sgd": "MB-SGD (non-private)", "local_sgd": "Local SGD (non-private)"}


# --------------------------------------------------------------------------- data

CONFIGS = ROOT / "configs" / "isrl"


def load_task(dataset: str, algorithm: str, overrides: list[str]):
    """The base config of (dataset, algorithm), its model and the silos' data split 80/20."""
    path = CONFIGS / f"{dataset}_{algorithm}.toml"
    cfg = config_lib.load(path, overrides)
    plan = runner.plan(cfg)
    ds = runner.load_data(cfg["data"])
    d = cfg["data"]
    root = rng.as_key(cfg["seed"])
    parts = runner.partition_indices(d, ds, rng.stream(root, "partition"))
    split = np.random.default_rng(12345)
    train_x, train_y, val_idx = [], [], []
    for idx in parts:                         # data preparation on the host, not a hot path
        idx = split.permutation(np.asarray(idx))
        n_val = max(1, int(round(0.2 * len(idx))))
        val_idx.append(idx[:n_val])
        train_x.append(ds.x_train[idx[n_val:]])
        train_y.append(ds.y_train[idx[n_val:]])
    agents = from_ragged(train_x, train_y)
    val = np.concatenate(val_idx)
    model = make_model(cfg["model"]["name"], ds.feature_shape, ds.num_classes,
                       hidden=tuple(cfg["model"]["hidden"]))
    return dict(config=cfg, algorithm_config=plan.algorithm_config, agents=agents, model=model,
                x_val=ds.x_train[val], y_val=ds.y_train[val], x_test=ds.x_test,
                y_test=ds.y_test, num_classes=ds.num_classes)


# --------------------------------------------------------------------------- one grid

def run_grid(task: dict, name: str, algorithm_config, lrs, clips, seeds: int, batch: int):
    """Every (lr, clip, seed) run of one algorithm and config in one compiled call.

    Returns (val_acc [L, C, S], test_acc [L, C, S], final upload counts [L, C, S, N, U], z).
    """
    alg = isrl.ALGORITHMS[name]
    model = task["model"]
    fed = api.FederatedData(agents=task["agents"], num_classes=task["num_classes"])
    state = alg.init(jax.random.key(0), fed, model, algorithm_config, api.Runtime(chunk_size=None))
    ctx = state.context
    z = np.asarray(state.values["hyper"]["noise_multiplier"], np.float32)   # [N] rounded up
    lr_g, clip_g, seed_g = np.meshgrid(np.asarray(lrs, np.float32), np.asarray(clips, np.float32),
                                       np.arange(seeds), indexing="ij")
    lr_f, clip_f, seed_f = lr_g.ravel(), clip_g.ravel(), seed_g.ravel()
    keys = jax.vmap(lambda s: jax.random.fold_in(jax.random.key(2023), s))(jnp.asarray(seed_f))
    rounds = alg.num_steps(algorithm_config)
    x_val, y_val = jnp.asarray(task["x_val"]), jnp.asarray(task["y_val"])
    x_test, y_test = jnp.asarray(task["x_test"]), jnp.asarray(task["y_test"])

    runs = _compiled_runs(model, ctx.round_fn, ctx.spec, ctx.data, rounds, batch)
    val, test, uploads = runs(keys, jnp.asarray(lr_f), jnp.asarray(clip_f),
                              jnp.broadcast_to(z, lr_f.shape + z.shape), x_val, y_val, x_test,
                              y_test)
    shape = lr_g.shape
    return (np.asarray(val).reshape(shape), np.asarray(test).reshape(shape),
            np.asarray(uploads).reshape(shape + np.asarray(uploads).shape[1:]), z, ctx)


_RUNS: dict = {}


def _compiled_runs(model, round_fn, spec, data, rounds: int, batch: int):
    """``runs(keys [B], lrs [B], clips [B], zs [B, N], x_val, y_val, x_test, y_test)``: all runs of
    one round function, R rounds each (``lax.scan``), mapped over runs in vmapped chunks of
    ``batch`` (``lax.map``). The per-silo noise multipliers are an argument, so every epsilon of
    an algorithm shares one compilation."""
    cache_key = (model, round_fn, rounds, batch)
    if cache_key in _RUNS:
        return _RUNS[cache_key]

    def accuracy(params, x, y):
        return jnp.mean(jnp.argmax(model.logits(params, x), -1) == y)

    def runs(keys, lrs, clips, zs, x_val, y_val, x_test, y_test):
        def one(args):
            key, lr, clip, z = args
            params = model.init(api.init_key(key))
            hyper = {"learning_rate": lr, "clip_norm": clip, "noise_multiplier": z}   # z [N]
            values = engine.initial_values(spec, params, hyper)

            def body(v, t):
                v, _ = round_fn(api.step_key(key, t), v, data)
                return v, None

            values, _ = jax.lax.scan(body, values, jnp.arange(rounds))
            p = values["params"]
            return accuracy(p, x_val, y_val), accuracy(p, x_test, y_test), values["uploads"]

        return jax.lax.map(one, (keys, lrs, clips, zs), batch_size=batch)

    _RUNS[cache_key] = jax.jit(runs)
    return _RUNS[cache_key]


def select(val: np.ndarray) -> tuple[int, int]:
    """(lr index, clip index) with the best mean validation accuracy over seeds."""
    mean = val.mean(axis=-1)
    i, j = np.unravel_index(np.argmax(mean), mean.shape)
    return int(i), int(j)


def achieved_epsilon(name: str, algorithm_config, ctx, uploads: np.ndarray, delta: float,
                     accountant: str) -> float:
    """Worst silo's epsilon over what it actually released in one run (its ledger)."""
    alg = isrl.ALGORITHMS[name]
    state = api.State(step=0, values={"uploads": uploads}, context=ctx)
    return float(alg.ledger(algorithm_config, state).epsilon("silo_record", delta,
                                                             accountant=accountant))


# --------------------------------------------------------------------------- experiment

def experiment(dataset: str, args) -> dict:
    out = {"dataset": dataset, "private": {}, "non_private": {}}
    base = load_task(dataset, PRIVATE[0], args.set)
    n_max = int(np.max(np.asarray(base["agents"].counts)))
    delta = 1.0 / n_max ** 2
    out.update(delta=delta, num_silos=base["agents"].num_agents,
               num_available=int(base["algorithm_config"].num_available),
               silo_sizes=np.asarray(base["agents"].counts).tolist(),
               num_validation=int(len(base["y_val"])), num_test=int(len(base["y_test"])))
    for name in [a for a in NON_PRIVATE if a in args.algorithms]:
        task = load_task(dataset, name, args.set)
        start = time.perf_counter()
        val, test, _, _, _ = run_grid(task, name, task["algorithm_config"], args.lrs, [1.0],
                                      args.seeds, args.batch)
        i, j = select(val)
        out["non_private"][name] = {
            "learning_rate": args.lrs[i], "val_accuracy": val[i, j].tolist(),
            "test_error_mean": float(1 - test[i, j].mean()),
            "test_error_std": float(test[i, j].std()), "grid_val_mean": val.mean(-1).tolist(),
            "seconds": time.perf_counter() - start}
        print(f"[{dataset}] {name}: test error {1 - test[i, j].mean():.3f} "
              f"(lr {args.lrs[i]})", flush=True)
    for name in [a for a in PRIVATE if a in args.algorithms]:
        task = load_task(dataset, name, args.set)
        rows = []
        for eps in args.epsilons:
            cfg = dataclasses.replace(task["algorithm_config"], target_epsilon=eps, delta=delta,
                                      noise_multiplier=None)
            start = time.perf_counter()
            val, test, uploads, z, ctx = run_grid(task, name, cfg, args.lrs, args.clips,
                                                  args.seeds, args.batch)
            i, j = select(val)
            eps_run = achieved_epsilon(name, cfg, ctx, uploads[i, j, 0], delta, "rdp")
            rows.append({"epsilon": eps, "noise_multiplier": z.tolist(),
                         "achieved_epsilon_rdp_seed0": eps_run,
                         "learning_rate": args.lrs[i], "clip_norm": args.clips[j],
                         "val_accuracy": val[i, j].tolist(), "test_accuracy": test[i, j].tolist(),
                         "test_error_mean": float(1 - test[i, j].mean()),
                         "test_error_std": float(test[i, j].std()),
                         "grid_val_mean": val.mean(-1).tolist(),
                         "seconds": time.perf_counter() - start})
            print(f"[{dataset}] {name} eps={eps:g}: z={z.min():.3f}..{z.max():.3f}, test error "
                  f"{rows[-1]['test_error_mean']:.3f} +- {rows[-1]['test_error_std']:.3f} "
                  f"(lr {args.lrs[i]}, clip {args.clips[j]}; achieved eps {eps_run:.3f}), "
                  f"{rows[-1]['seconds']:.1f} s", flush=True)
        out["private"][name] = rows
    return out


def claim(result: dict) -> tuple[int, int] | None:
    """Epsilons where SPIDER's mean test error is <= MB-SGD's, out of all epsilons (None when
    one of the two was not run)."""
    sp = [r["test_error_mean"] for r in result["private"].get("isrl_spider", [])]
    mb = [r["test_error_mean"] for r in result["private"].get("isrl_mb_sgd", [])]
    if not sp or not mb:
        return None
    return sum(a <= b + 1e-12 for a, b in zip(sp, mb)), len(sp)


def table(results: list[dict], args) -> str:
    lines = [f"# ISRL-DP: test error vs epsilon ({args.seeds} seeds; mean +- std)", "",
             f"Command: `python tools/exp_isrl.py {' '.join(sys.argv[1:])}`", "",
             f"Step sizes {list(args.lrs)}, clip norms {list(args.clips)}, selected on a "
             "validation split (20% of every silo's training records); delta = 1/n^2 with n the "
             "largest silo's training records; noise calibrated per silo by dp-accounting (RDP).",
             ""]
    for res in results:
        eps = args.epsilons
        lines += [f"## {res['dataset']} ({res['num_silos']} silos, M = {res['num_available']} "
                  f"available per round, sizes {res['silo_sizes']}, "
                  f"delta {res['delta']:.2e})", "",
                  "| algorithm | " + " | ".join(f"eps {e:g}" for e in eps) + " |",
                  "|---|" + "---|" * len(eps)]
        for name, rows in res["private"].items():
            lines.append(f"| {LABELS[name]} | " + " | ".join(
                f"{r['test_error_mean']:.3f} ± {r['test_error_std']:.3f}" for r in rows) + " |")
        for name, r in res["non_private"].items():
            lines.append(f"| {LABELS[name]} | " + " | ".join(
                f"{r['test_error_mean']:.3f}" for _ in eps) + " |")
        if claim(res) is None:
            continue
        won, total = claim(res)
        lines += ["", f"SPIDER's test error is at or below ISRL-DP MB-SGD's at {won} of {total} "
                      f"epsilons: the paper's claim {'holds' if 2 * won > total else 'does not hold'}"
                      " here (at most epsilons).", ""]
    return "\n".join(lines) + "\n"


def plot(results: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4.2), squeeze=False)
    for ax, res in zip(axes[0], results):
        for name, rows in res["private"].items():
            e = [r["epsilon"] for r in rows]
            ax.errorbar(e, [r["test_error_mean"] for r in rows],
                        yerr=[r["test_error_std"] for r in rows], marker="o", capsize=3,
                        label=LABELS[name])
        for k, (name, r) in enumerate(res["non_private"].items()):
            ax.axhline(r["test_error_mean"], ls="--", color=f"C{6 + k}", label=LABELS[name])
        ax.set_xscale("log")
        ax.set_xlabel("epsilon per silo (delta = 1/n^2)")
        ax.set_ylabel("test error")
        ax.set_title(f"{res['dataset']}: {res['num_silos']} silos, M = {res['num_available']}")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def replot(out: Path) -> int:
    """table.md and the plot again from ``out/results.json`` with the arguments it was made with
    (``num_available`` read from the base configs where the file predates that field)."""
    saved = json.loads((out / "results.json").read_text())
    args = argparse.Namespace(**{"algorithms": list(PRIVATE + NON_PRIVATE), **saved["args"]})
    sys.argv = [sys.argv[0]] + _argv_of(saved["args"])
    for res in saved["results"]:
        if "num_available" not in res:
            cfg = config_lib.load(CONFIGS / f"{res['dataset']}_{PRIVATE[0]}.toml", args.set)
            res["num_available"] = int(runner.plan(cfg).algorithm_config.num_available)
    (out / "table.md").write_text(table(saved["results"], args))
    plot(saved["results"], out / "test_error_vs_epsilon.png")
    return 0


def _argv_of(saved: dict) -> list[str]:
    """The command line of a saved run (for the table's Command line)."""
    argv = ["--out", saved["out"]]
    defaults = {"datasets": ["wbcd", "mnist5k_oddeven"], "epsilons": list(EPSILONS), "seeds": 3,
                "set": [], "algorithms": list(PRIVATE + NON_PRIVATE), "quick": False}
    for k, default in defaults.items():
        if saved.get(k, default) != default:
            v = saved[k]
            argv += [f"--{k}"] + ([] if isinstance(v, bool) else
                                  [str(x) for x in v] if isinstance(v, list) else [str(v)])
    return argv


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--datasets", nargs="+", default=["wbcd", "mnist5k_oddeven"])
    p.add_argument("--epsilons", nargs="+", type=float, default=list(EPSILONS))
    p.add_argument("--lrs", nargs="+", type=float, default=list(LEARNING_RATES))
    p.add_argument("--clips", nargs="+", type=float, default=list(CLIPS))
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--batch", type=int, default=12, help="runs vmapped together (memory)")
    p.add_argument("--set", nargs="*", default=[], help="overrides for every base config")
    p.add_argument("--algorithms", nargs="+", default=list(PRIVATE + NON_PRIVATE),
                   choices=list(PRIVATE + NON_PRIVATE), help="a subset of the algorithms")
    p.add_argument("--quick", action="store_true", help="2 step sizes, 2 clips (smoke runs)")
    p.add_argument("--configs", type=Path, default=None, help="folder of the base configs "
                   "(default: configs/isrl)")
    p.add_argument("--replot", action="store_true", help="rebuild table.md and the plot from "
                   "OUT/results.json (no runs)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    if args.replot:
        return replot(args.out)
    # dp-accounting warns once per order that its series did not converge at the lowest RDP
    # orders (those orders are then excluded); hundreds of lines per calibration, no information
    absl_logging.set_verbosity(absl_logging.ERROR)
    if args.configs is not None:
        global CONFIGS
        CONFIGS = args.configs
    if args.quick:
        args.lrs, args.clips = args.lrs[1:3], args.clips[:2]
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for ds in args.datasets:
        results.append(experiment(ds, args))
        (args.out / "results.json").write_text(json.dumps(
            {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
             "devices": [str(d) for d in jax.devices()], "results": results}, indent=1))
        (args.out / "table.md").write_text(table(results, args))   # kept after every dataset
    try:
        plot(results, args.out / "test_error_vs_epsilon.png")
    except ImportError:
        print("matplotlib missing: no plot", file=sys.stderr)
    print(table(results, args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
