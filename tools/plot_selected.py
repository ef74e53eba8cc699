"""Plot and tabulate sweeps' ``selected.json`` (grid point chosen on val_accuracy, test accuracy).

    .venv/bin/python tools/plot_selected.py results/voting_dpfl/paper_scale/*_n100 \
        --out results/voting_dpfl/paper_scale/selected_n100

Writes STEM.png (one panel per privacy unit: test accuracy mean +- std over seeds against the
target epsilon, one line per algorithm) and STEM.md (the rows of every sweep, one table).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweeps", nargs="+", help="sweep output folders holding selected.json")
    ap.add_argument("--out", required=True, help="output stem (STEM.png, STEM.md)")
    ap.add_argument("--title", default="")
    a = ap.parse_args()
    rows = [dict(r, sweep=Path(d).name) for d in a.sweeps
            for r in json.loads((Path(d) / "selected.json").read_text())]
    units = sorted({r["epsilon_unit"] for r in rows})
    fig, axes = plt.subplots(1, len(units), figsize=(5 * len(units), 4), squeeze=False)
    for ax, unit in zip(axes[0], units):
        for algo in sorted({r["algorithm"] for r in rows if r["epsilon_unit"] == unit}):
            rs = sorted((r for r in rows if r["algorithm"] == algo and r["epsilon_unit"] == unit),
                        key=lambda r: r["target_epsilon"])
            ax.errorbar([r["target_epsilon"] for r in rs], [r["test_accuracy_mean"] for r in rs],
                        yerr=[r["test_accuracy_std"] or 0 for r in rs], marker="o", capsize=4,
                        label=algo)
        ax.set(xscale="log", xlabel=f"target epsilon ({unit} level)", ylabel="test accuracy",
               title=f"{a.title} {unit} level".strip())
        ts = sorted({r["target_epsilon"] for r in rows if r["epsilon_unit"] == unit})
        ax.set_xticks(ts, [f"{t:g}" for t in ts], minor=False)
        ax.minorticks_off()
        ax.legend()
    fig.tight_layout()
    fig.savefig(f"{a.out}.png", dpi=120)
    lines = ["| sweep | algorithm | unit | target eps | selected | val acc (mean) | "
             "test acc (mean ± std, n seeds) | calibrated noise |", "|---" * 8 + "|"]
    for r in sorted(rows, key=lambda r: (r["epsilon_unit"], r["target_epsilon"], r["algorithm"])):
        sel = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in r["selected"].items())
        lines.append(f"| {r['sweep']} | {r['algorithm']} | {r['epsilon_unit']} | "
                     f"{r['target_epsilon']:g} | {sel} | {r['val_accuracy_mean']:.3f} | "
                     f"{r['test_accuracy_mean']:.3f} ± {r['test_accuracy_std'] or 0:.3f} "
                     f"({r['n']}) | {r['calibrated_value']:.4g} |")
    Path(f"{a.out}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
