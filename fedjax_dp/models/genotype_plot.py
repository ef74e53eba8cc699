"""Render a DARTS genotype's two cells (normal, reduce) as a PNG with matplotlib (optional extra).

Nodes: the cell inputs ``c_{k-2}``, ``c_{k-1}``, the intermediate nodes ``0..n-1`` and the output
``c_{k}`` (concatenation, dashed edges); every kept edge is an arrow labelled with its operation.
"""
from __future__ import annotations

from pathlib import Path

from fedjax_dp.models.darts import Genotype, check_genotype


def _draw_cell(ax, edges, concat, title: str) -> None:
    n = len(edges) // 2
    pos = {0: (0.0, 1.0), 1: (0.0, -1.0)}
    for i in range(n):
        pos[2 + i] = (1.0 + i, 0.8 if i % 2 == 0 else -0.8)
    out = (n + 1.5, 0.0)
    names = {0: "c_{k-2}", 1: "c_{k-1}", **{2 + i: str(i) for i in range(n)}}
    for k, (op, j) in enumerate(edges):
        src, dst = pos[j], pos[2 + k // 2]
        ax.annotate("", xy=dst, xytext=src,
                    arrowprops=dict(arrowstyle="->", color="tab:blue", shrinkA=14, shrinkB=14))
        mx, my = (src[0] + dst[0]) / 2, (src[1] + dst[1]) / 2 + (0.12 if k % 2 else -0.12)
        ax.text(mx, my, op, fontsize=7, ha="center", va="center",
                bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.8))
    for i in concat:
        ax.annotate("", xy=out, xytext=pos[i],
                    arrowprops=dict(arrowstyle="->", color="gray", linestyle="--", shrinkA=14,
                                    shrinkB=14))
    for idx, (x, y) in pos.items():
        color = "tab:green" if idx < 2 else "lightblue"
        ax.text(x, y, names[idx], ha="center", va="center", fontsize=9,
                bbox=dict(boxstyle="round", fc=color, ec="black"))
    ax.text(*out, "c_{k}", ha="center", va="center", fontsize=9,
            bbox=dict(boxstyle="round", fc="khaki", ec="black"))
    ax.set_xlim(-0.6, n + 2.1)
    ax.set_ylim(-1.5, 1.5)
    ax.set_title(title)
    ax.axis("off")


def plot_genotype(genotype: Genotype, path: str | Path) -> Path:
    """Write the normal and reduction cells of ``genotype`` side by side to ``path`` (PNG)."""
    check_genotype(genotype)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = genotype.nodes
    fig, axes = plt.subplots(1, 2, figsize=(2.2 * (n + 2), 3.2))
    _draw_cell(axes[0], genotype.normal, genotype.normal_concat, "normal cell")
    _draw_cell(axes[1], genotype.reduce, genotype.reduce_concat, "reduction cell")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
