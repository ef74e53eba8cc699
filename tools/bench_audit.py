"""Audit every registered mechanism and its weakened variants; write the table of docs/audit.md.

    python tools/bench_audit.py --out results/audit            # ~1-2 minutes on a laptop CPU

For each mechanism of :data:`fedjax_dp.audit.MECHANISMS`, at its default parameters (claims of
about epsilon = 1 at delta = 1e-5): the real mechanism and each weakened variant (audited
against the real claim), ``--trials`` runs per world, seed ``--seed``, confidence 0.95. The
same numbers come out of ``fedjax-dp audit MECHANISM --trials N [--weaken W]``.

Outputs: ``OUT/audit.json`` (every AuditResult, wall times, environment) and ``OUT/audit.md``
(the table).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from bench_common import environment, write_json  # tools/, the script's folder

from fedjax_dp.algorithms import registry
from fedjax_dp.audit import MECHANISMS, audit

registry.algorithms()                  # imports every family: their audit harnesses register


def table(rows: list[dict]) -> str:
    lines = ["| mechanism | variant | unit | claimed eps | empirical lower bound "
             "| trials per world "
             "| consistent |", "|---|---|---|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['mechanism']} | {r['weaken'] or 'real'} | {r['unit']} | "
                     f"{r['claimed_epsilon']:.3f} | {r['epsilon_lower_bound']:.3f} | "
                     f"{r['trials']:,} | {'yes' if r['consistent'] else '**no: caught**'} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="results/audit")
    parser.add_argument("--trials", type=int, default=1_000_000)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rows = []
    start = time.perf_counter()
    for name, spec in MECHANISMS.items():
        for weaken in (None,) + tuple(spec.weakenings):
            t0 = time.perf_counter()
            r = audit(name, trials=args.trials, delta=args.delta, seed=args.seed, weaken=weaken)
            row = {**r.to_json(), "wall_time_s": round(time.perf_counter() - t0, 2)}
            rows.append(row)
            print(f"{name:16s} {weaken or 'real':12s} claimed {r.claimed_epsilon:.3f} "
                  f"lower bound {r.epsilon_lower_bound:.3f} ({row['wall_time_s']} s)", flush=True)
    record = {"command": "python tools/bench_audit.py " + " ".join(argv or sys.argv[1:]),
              "trials": args.trials, "delta": args.delta, "seed": args.seed,
              "total_wall_time_s": round(time.perf_counter() - start, 1),
              "environment": environment(), "results": rows}
    out = Path(args.out)
    write_json(out / "audit.json", record)
    (out / "audit.md").write_text(table(rows))
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
