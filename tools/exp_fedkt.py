"""FedKT experiment: the paper's Table 1 (L0 vs one-round baselines) and Table 2 (L1/L2 accuracy
and epsilon vs gamma and the queried fraction) on the offline datasets.
As sweep files: ``configs/experiments/fedkt_*.toml`` (``fedjax-dp sweep FILE``; docs/sweeps.md).

    python tools/exp_fedkt.py --out results/fedkt            # mnist5k, digits, wbcd

Table 1, per dataset and seed (the Dirichlet(0.5) partition and all training keys change with
the seed): FedKT-L0; SOLO (every party alone; mean of the parties' test accuracies);
FedAvg and FedProx (mu = 0.01) restricted to one round (best of the local step counts in
``--fedavg-steps``, all reported in the JSON); centralized PATE (one party holding all training
data, the same s x t teachers, no noise). Same model and optimiser everywhere (Adam lr 1e-3,
weight decay 1e-5, batch 32, as in the paper). wbcd also gets a tree row: decision-tree
teachers, random-forest students / final model (the paper's tabular setting).

Table 2 (seed 0): FedKT-L1 and FedKT-L2 for every gamma x query fraction. The teachers (and at
L1 the students, which learn noiseless labels) are trained once and reused, so the rows differ
only in the noisy tier. Epsilon (delta 1e-5) per unit: data-dependent moments converted by
dp-accounting (RDP), the paper's moments conversion, and the data-independent composition of
pure-DP Laplace queries (PLD).

Outputs: ``OUT/fedkt_results.json``, ``OUT/table1.md``, ``OUT/table2.md``.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import environment  # noqa: E402

from fedjax_dp import data  # noqa: E402
from fedjax_dp.algorithms.fedkt import fedkt, baselines as fb, learners  # noqa: E402
from fedjax_dp.core import from_partition, rng  # noqa: E402
from fedjax_dp.models import make_model  # noqa: E402
from fedjax_dp.train import LocalTrainConfig  # noqa: E402

SETTINGS = {
    "mnist5k": dict(parties=10, model="mlp", hidden=(100, 100), steps=300, student_steps=600,
                    gammas=(0.1, 0.2, 0.5, 1.0), fractions=(0.02, 0.05, 0.1)),
    "digits": dict(parties=5, model="mlp", hidden=(100,), steps=200, student_steps=400,
                   gammas=(0.2, 0.5, 1.0), fractions=(0.05, 0.1, 0.25)),
    "wbcd": dict(parties=5, model="mlp", hidden=(32,), steps=200, student_steps=400,
                 gammas=(0.2, 0.5, 1.0), fractions=(0.1, 0.25, 0.5), trees=True),
}
DELTA = 1e-5


def local_config(steps: int) -> LocalTrainConfig:
    return LocalTrainConfig(steps=steps, batch_size=32, learning_rate=1e-3, optimizer="adam",
                            weight_decay=1e-5)


def setup(name: str, seed: int):
    ds = data.load_dataset(name)
    st = SETTINGS[name]
    idx = data.partition("dirichlet", ds.y_train, st["parties"],
                         rng.stream(rng.as_key(seed), "partition"), beta=0.5)
    return ds, from_partition(ds.x_train, ds.y_train, idx)


def fedkt_config(name: str, level="L0", gamma=0.1, fraction=1.0) -> fedkt.Config:
    st = SETTINGS[name]
    return fedkt.Config(num_partitions=2, num_teachers=5, level=level, gamma=gamma,
                        query_fraction=fraction, local=local_config(st["steps"]),
                        student_steps=st["student_steps"], final_steps=st["student_steps"])


def table1_row(name: str, seed: int, fedavg_steps, trees: bool = False) -> dict:
    ds, parties = setup(name, seed)
    st = SETTINGS[name]
    cfg = fedkt_config(name)
    key = jax.random.key(seed)
    if trees:
        cfg = dataclasses.replace(cfg, teacher="decision_tree", student="random_forest")
    tl, sl, fl = fedkt.make_learners(cfg, model_name=st["model"], hidden=st["hidden"],
                                     feature_shape=ds.feature_shape,
                                     num_classes=ds.num_classes)
    kw = dict(num_classes=ds.num_classes, teacher=tl, student=sl, final=fl)
    tic = time.perf_counter()
    res = fedkt.run(rng.stream(key, "fedkt"), parties, ds.x_public, cfg, **kw)
    row = {"dataset": name, "seed": seed, "parties": parties.num_agents,
           "model": "DT teachers / RF students" if trees else
           f"{st['model']} {'-'.join(map(str, st['hidden']))}",
           "fedkt_l0": res.accuracy(ds.x_test, ds.y_test),
           "fedkt_s": time.perf_counter() - tic, "timings": res.timings,
           "server_label_accuracy": float(np.mean(
               (res.server_labels == ds.y_public[res.server_queries])[res.server_mask]))}
    solo_learner = sl if trees else tl     # trees: a random forest per party; else the model
    solo_learner = dataclasses.replace(solo_learner, train=local_config(st["steps"])) \
        if learners.is_jax(solo_learner) else solo_learner
    accs = fb.solo(rng.stream(key, "solo"), parties, solo_learner, ds.x_test, ds.y_test)
    row["solo_mean"], row["solo_std"] = float(accs.mean()), float(accs.std())
    row["solo_per_party"] = accs.tolist()
    pate = fb.centralized_pate(rng.stream(key, "pate"), parties, ds.x_public, cfg, **kw)
    row["pate"] = pate.accuracy(ds.x_test, ds.y_test)
    if not trees:
        model = make_model(st["model"], ds.feature_shape, ds.num_classes, hidden=st["hidden"])
        for algo, mu in (("fedavg", 0.0), ("fedprox", 0.01)):
            per = {int(e): fb.one_round(rng.stream(key, algo), parties, model, local_config(e),
                                        ds.x_test, ds.y_test, prox_mu=mu)
                   for e in fedavg_steps}
            row[f"{algo}_1round_by_steps"] = per
            row[f"{algo}_1round"] = max(per.values())
    print(json.dumps({k: v for k, v in row.items() if not isinstance(v, (list, dict))}),
          flush=True)
    return row


def table2_rows(name: str, seed: int = 0) -> list[dict]:
    ds, parties = setup(name, seed)
    st = SETTINGS[name]
    base_cfg = fedkt_config(name)
    tl, sl, fl = fedkt.make_learners(base_cfg, model_name=st["model"], hidden=st["hidden"],
                                     feature_shape=ds.feature_shape,
                                     num_classes=ds.num_classes)
    kw = dict(num_classes=ds.num_classes, teacher=tl, student=sl, final=fl)
    key = rng.stream(jax.random.key(seed), "fedkt")
    base = fedkt.run(key, parties, ds.x_public, base_cfg, **kw)
    rows = [{"dataset": name, "level": "L0", "gamma": None, "query_fraction": 1.0,
             "noisy_queries": 0, "accuracy": base.accuracy(ds.x_test, ds.y_test)}]
    for level in ("L1", "L2"):
        for fraction in st["fractions"]:
            for gamma in st["gammas"]:
                cfg = fedkt_config(name, level, gamma, fraction)
                tic = time.perf_counter()
                res = fedkt.run(key, parties, ds.x_public, cfg, fitted_teachers=base.teachers,
                                fitted_students=base.students if level == "L1" else None,
                                **kw)
                summ = fedkt.privacy_summary(res, DELTA)
                row = {"dataset": name, "level": level, "gamma": gamma,
                       "query_fraction": fraction, "noisy_queries": summ["noisy_queries"],
                       "accuracy": res.accuracy(ds.x_test, ds.y_test), "z": summ.get("z"),
                       "seconds": time.perf_counter() - tic, "epsilon": summ["units"]}
                rows.append(row)
                e = summ["units"]
                print(f"{name} {level} gamma={gamma} frac={fraction} acc={row['accuracy']:.3f} "
                      f"party eps dd={e['party']['data_dependent_rdp_epsilon']:.2f} "
                      f"di={e['party']['data_independent_pld_epsilon']:.2f} example eps "
                      f"dd={e['example']['data_dependent_rdp_epsilon']:.2f}", flush=True)
    return rows


ABLATION = {    # FedKT-L0 model choices on mnist5k (teachers = students = final model type)
    "logistic, teachers 300 / students 600 steps": dict(model="logistic", hidden=(),
                                                       steps=300, student_steps=600),
    "mlp 100-100, teachers 100 / students 600 steps": dict(model="mlp", hidden=(100, 100),
                                                          steps=100, student_steps=600),
    "mlp 100-100, teachers 300 / students 600 steps (Table 1)": dict(
        model="mlp", hidden=(100, 100), steps=300, student_steps=600),
    "mlp 200-200, teachers 300 / students 1500 steps": dict(model="mlp", hidden=(200, 200),
                                                           steps=300, student_steps=1500),
}


def ablation_rows(seeds) -> list[dict]:
    """FedKT-L0 on mnist5k (10 parties, Dirichlet 0.5) for several model choices."""
    rows = []
    for label, ch in ABLATION.items():
        accs = []
        for seed in seeds:
            ds, parties = setup("mnist5k", seed)
            cfg = fedkt.Config(num_partitions=2, num_teachers=5, local=local_config(ch["steps"]),
                               student_steps=ch["student_steps"],
                               final_steps=ch["student_steps"])
            res = fedkt.run(rng.stream(jax.random.key(seed), "fedkt"), parties, ds.x_public,
                            cfg, num_classes=10, model_name=ch["model"], hidden=ch["hidden"])
            accs.append(res.accuracy(ds.x_test, ds.y_test))
        rows.append({"choice": label, **ch, "hidden": list(ch["hidden"]), "accuracy": accs})
        print(label, accs, flush=True)
    return rows


def _pm(values) -> str:
    v = np.asarray(values, float)
    return f"{v.mean():.3f}" if len(v) == 1 else f"{v.mean():.3f} ± {v.std():.3f}"


def markdown_table1(rows: list[dict]) -> str:
    out = ["| dataset (parties, model) | seeds | FedKT-L0 | SOLO (mean over parties) | "
           "FedAvg, 1 round | FedProx, 1 round | centralized PATE | FedKT - SOLO | "
           "PATE - FedKT |", "|---|---|---|---|---|---|---|---|---|"]
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["dataset"], r["parties"], r["model"]), []).append(r)
    for (ds, n, model), rs in groups.items():
        get = lambda k: [r[k] for r in rs]                                   # noqa: E731
        fedavg = _pm(get("fedavg_1round")) if "fedavg_1round" in rs[0] else "n/a"
        fedprox = _pm(get("fedprox_1round")) if "fedprox_1round" in rs[0] else "n/a"
        gap_solo = np.subtract(get("fedkt_l0"), get("solo_mean"))
        gap_pate = np.subtract(get("pate"), get("fedkt_l0"))
        out.append(f"| {ds} ({n}, {model}) | {len(rs)} | {_pm(get('fedkt_l0'))} | "
                   f"{_pm(get('solo_mean'))} | {fedavg} | {fedprox} | {_pm(get('pate'))} | "
                   f"{gap_solo.mean():+.3f} | {gap_pate.mean():+.3f} |")
    return "\n".join(out) + "\n"


def markdown_table2(rows: list[dict]) -> str:
    out = ["| dataset | level | gamma | query fraction (queries) | accuracy | party eps: "
           "data-dep. (RDP) / paper moments / data-indep. (PLD) | example eps: data-dep. "
           "(RDP) / data-indep. (PLD) |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["level"] == "L0":
            out.append(f"| {r['dataset']} | L0 | - | 1.0 (no noise) | {r['accuracy']:.3f} | "
                       f"no privacy | no privacy |")
            continue
        p, e = r["epsilon"]["party"], r["epsilon"]["example"]
        out.append(
            f"| {r['dataset']} | {r['level']} | {r['gamma']} | {r['query_fraction']} "
            f"({r['noisy_queries']}) | {r['accuracy']:.3f} | "
            f"{p['data_dependent_rdp_epsilon']:.2f} / {p['moments_epsilon']:.2f} / "
            f"{p['data_independent_pld_epsilon']:.2f} | "
            f"{e['data_dependent_rdp_epsilon']:.2f} / {e['data_independent_pld_epsilon']:.2f} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--datasets", nargs="*", default=list(SETTINGS))
    ap.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    ap.add_argument("--fedavg-steps", type=int, nargs="*", default=[50, 300])
    ap.add_argument("--skip-table2", action="store_true")
    ap.add_argument("--ablation-only", action="store_true",
                    help="only the mnist5k FedKT-L0 model-choice ablation (ablation.md)")
    ap.add_argument("--out", default="results/fedkt")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    if args.ablation_only:
        rows = ablation_rows(args.seeds)
        md = ["| FedKT-L0 model choice (mnist5k, 10 parties, Dirichlet 0.5) | seeds | "
              "test accuracy |", "|---|---|---|"]
        md += [f"| {r['choice']} | {len(r['accuracy'])} | {_pm(r['accuracy'])} |" for r in rows]
        (out / "ablation.md").write_text("\n".join(md) + "\n")
        (out / "ablation.json").write_text(json.dumps(
            {"experiment": "fedkt_ablation", "seeds": args.seeds, "rows": rows,
             "wall_time_s": time.perf_counter() - start, "environment": environment()},
            indent=2))
        print("\n".join(md))
        return {"ablation": rows}
    t1, t2 = [], []
    for name in args.datasets:
        if name not in SETTINGS:
            raise ValueError(f"--datasets must be among {sorted(SETTINGS)}, got {name!r}")
        for seed in args.seeds:
            t1.append(table1_row(name, seed, args.fedavg_steps))
        if SETTINGS[name].get("trees"):
            for seed in args.seeds:
                t1.append(table1_row(name, seed, args.fedavg_steps, trees=True))
        if not args.skip_table2:
            t2.extend(table2_rows(name))
    record = {"experiment": "fedkt", "settings": {k: {kk: list(vv) if isinstance(vv, tuple)
                                                       else vv for kk, vv in v.items()}
                                                  for k, v in SETTINGS.items()},
              "delta": DELTA, "seeds": args.seeds, "table1": t1, "table2": t2,
              "wall_time_s": time.perf_counter() - start, "environment": environment(),
              "command": "python tools/exp_fedkt.py " + " ".join(argv or sys.argv[1:])}
    (out / "fedkt_results.json").write_text(json.dumps(record, indent=2))
    (out / "table1.md").write_text(markdown_table1(t1))
    if t2:
        (out / "table2.md").write_text(markdown_table2(t2))
    print(markdown_table1(t1))
    if t2:
        print(markdown_table2(t2))
    print(f"wrote {out}/fedkt_results.json, table1.md, table2.md "
          f"({record['wall_time_s']:.0f} s)")
    return record


if __name__ == "__main__":
    main()
