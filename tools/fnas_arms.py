"""The DP-FNAS discriminative experiment's arms compared (configs/experiments/fnas_discriminative.toml).

Reads the sweep's ``results.jsonl``: per arm (DP search, non-private search, random genotype; the
tied grid key ``algorithm.private+algorithm.fixed_genotype``), 5 genotypes (the run seeds: one
search or one random draw each) x 3 retraining seeds. Reports per arm

* the pooled test accuracy mean and standard deviation over all its runs (genotypes x
  retraining seeds),
* the mean and standard deviation over genotypes of each genotype's mean over its retraining
  seeds (the search's variance, the unit the tests below use), and the mean within-genotype
  standard deviation (the retraining's variance),
* the share of pooling and of parameter-free operations in the derived cells;

and Welch's t-test (two-sided, on the genotype means) of DP vs non-private search (the paper's
claim: close), and of each search arm vs the random genotypes (the control: a search that does
not beat random genotypes cannot support the claim). Writes OUT.json, OUT.md and OUT.png (bars:
pooled mean +- std; dots: the genotype means).

    python tools/fnas_arms.py results/sweeps/fnas_discriminative --out results/fnas/discriminative
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

ARM_KEY = "algorithm.private+algorithm.fixed_genotype"
ARMS = {(True, ""): "DP search", (False, ""): "non-private search",
        (False, "random"): "random genotype"}
POOLING = {"max_pool_3x3", "avg_pool_3x3"}
PARAMETER_FREE = POOLING | {"skip_connect", "none"}


def arm_of(rec: dict) -> str:
    private, fixed = rec["params"][ARM_KEY]
    return ARMS.get((bool(private), str(fixed)), f"private={private}, fixed={fixed}")


def op_shares(genotypes: list[dict]) -> dict:
    """The share of pooling / parameter-free operations over the cells' edges."""
    out = {}
    for cell in ("normal", "reduce"):
        ops = [op for g in genotypes for op, _ in g[cell]]
        out[cell] = {"edges": len(ops),
                     "pooling": sum(o in POOLING for o in ops) / max(len(ops), 1),
                     "parameter_free": sum(o in PARAMETER_FREE for o in ops) / max(len(ops), 1)}
    return out


def welch(a: list[float], b: list[float]) -> dict:
    from scipy import stats
    t, p = stats.ttest_ind(a, b, equal_var=False)
    return {"difference": float(np.mean(a) - np.mean(b)), "t": float(t), "p_value": float(p),
            "n": [len(a), len(b)]}


def summarise(records: list[dict]) -> dict:
    arms: dict[str, dict] = {}
    for r in records:
        a = arms.setdefault(arm_of(r), {"runs": [], "by_genotype": {}, "genotypes": {}})
        acc = float(r["test_accuracy"])
        a["runs"].append(acc)
        a["by_genotype"].setdefault(int(r["seed"]), []).append(acc)
        g = (r.get("extras") or {}).get("genotype")
        if g is not None:
            a["genotypes"][int(r["seed"])] = g
    out = {}
    for name, a in arms.items():
        means = [float(np.mean(v)) for _, v in sorted(a["by_genotype"].items())]
        within = [float(np.std(v, ddof=1)) for v in a["by_genotype"].values() if len(v) > 1]
        out[name] = {
            "runs": len(a["runs"]), "genotypes": len(means),
            "retrain_seeds_per_genotype": sorted({len(v) for v in a["by_genotype"].values()}),
            "pooled_mean": float(np.mean(a["runs"])),
            "pooled_std": float(np.std(a["runs"], ddof=1)) if len(a["runs"]) > 1 else math.nan,
            "genotype_means": means,
            "between_genotype_std": float(np.std(means, ddof=1)) if len(means) > 1 else math.nan,
            "within_genotype_std": float(np.mean(within)) if within else math.nan,
            "op_shares": op_shares(list(a["genotypes"].values())) if a["genotypes"] else None,
            "genotypes_json": {str(k): v for k, v in sorted(a["genotypes"].items())}}
    tests = {}
    names = list(out)
    pairs = [("DP search", "non-private search"), ("DP search", "random genotype"),
             ("non-private search", "random genotype")]
    for x, y in pairs:
        if x in out and y in out and min(out[x]["genotypes"], out[y]["genotypes"]) > 1:
            tests[f"{x} vs {y}"] = welch(out[x]["genotype_means"], out[y]["genotype_means"])
    return {"arms": {n: out[n] for n in names}, "tests": tests}


def markdown(s: dict, source: str, wall: float | None) -> str:
    lines = ["# DP-FNAS discriminative experiment: DP search vs non-private search vs random "
             "genotypes", "",
             f"Source: `{source}` (configs/experiments/fnas_discriminative.toml). Test accuracy "
             "of the retrained networks (every genotype retrained identically and without noise)."
             + (f" Sweep wall time: {wall / 60:.0f} min on the 2-core CPU." if wall else ""), "",
             "| arm | runs | genotypes | pooled mean ± std | genotype means: mean ± std "
             "(between) | within-genotype std | genotype means | pooling share normal / reduce |",
             "|---|---:|---:|---:|---:|---:|---|---:|"]
    for name, a in s["arms"].items():
        sh = a["op_shares"]
        share = (f"{sh['normal']['pooling']:.2f} / {sh['reduce']['pooling']:.2f}"
                 if sh else "-")
        lines.append(
            f"| {name} | {a['runs']} | {a['genotypes']} | {a['pooled_mean']:.3f} ± "
            f"{a['pooled_std']:.3f} | {np.mean(a['genotype_means']):.3f} ± "
            f"{a['between_genotype_std']:.3f} | {a['within_genotype_std']:.3f} | "
            + ", ".join(f"{m:.3f}" for m in a["genotype_means"]) + f" | {share} |")
    lines += ["", "Welch's t-test on the genotype means (two-sided):", "",
              "| comparison | difference | t | p |", "|---|---:|---:|---:|"]
    for name, t in s["tests"].items():
        lines.append(f"| {name} | {t['difference']:+.3f} | {t['t']:.2f} | {t['p_value']:.3f} |")
    return "\n".join(lines) + "\n"


def plot(s: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = list(s["arms"])
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for i, n in enumerate(names):
        a = s["arms"][n]
        ax.bar(i, a["pooled_mean"], yerr=a["pooled_std"], capsize=6, color="C%d" % i,
               alpha=0.6, label=f"{n} (pooled mean ± std)")
        ax.scatter(np.full(len(a["genotype_means"]), i) + np.linspace(-0.2, 0.2,
                   len(a["genotype_means"])), a["genotype_means"], color="k", s=14, zorder=3)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("test accuracy (retrained)")
    ax.set_title("DP-FNAS on digits: dots = genotype means over 3 retrainings", fontsize=9)
    ax.set_ylim(0, 1)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    fig.savefig(path.with_suffix(".svg"))
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("sweep", type=Path, help="the sweep's output folder (its results.jsonl)")
    p.add_argument("--out", type=Path, required=True, help="writes OUT.json, OUT.md, OUT.png")
    p.add_argument("--wall-time-s", type=float, default=None,
                   help="the sweep's wall time, reported in OUT.md")
    a = p.parse_args(argv)
    path = a.sweep / "results.jsonl" if a.sweep.is_dir() else a.sweep
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not records:
        raise SystemExit(f"{path}: no records")
    s = summarise(records)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.with_suffix(".json").write_text(json.dumps({"source": str(a.sweep), **s},
                                                     indent=1) + "\n")
    a.out.with_suffix(".md").write_text(markdown(s, str(a.sweep), a.wall_time_s))
    plot(s, a.out.with_suffix(".png"))
    print(a.out.with_suffix(".md"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
