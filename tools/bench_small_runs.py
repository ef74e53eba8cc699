"""Shipped configs at the determinism test's size, before and after a change: the stable fields of
each result.json (no timings, versions, paths; ``tests/test_determinism.py``'s ``small`` and
``_stable``), written as JSON, then two such files compared.

    python tools/bench_small_runs.py run OLD before.json      # with OLD's package importable
    python tools/bench_small_runs.py run . after.json
    python tools/bench_small_runs.py compare before.json after.json

``run ROOT OUT`` runs the averaging configs of ROOT (``configs/{fedavg,dp_fedavg,dp_fedsgd}``),
the averaging bases of ``configs/experiments/bases`` (the correlated-noise ones at rounds = 4, b
being 3) and five variants of ``dp_fedavg/mnist5k`` (adaptive clipping, with secure aggregation,
secagg dropouts, fixed-size cohorts, diagnostics). ``results/chains/unchanged_results.json`` is
its record for the chain of stages.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
from pathlib import Path

FAMILIES = ("fedavg", "dp_fedavg", "dp_fedsgd")
VARIANTS = {"adaptive": {"adaptive_clip": True},
            "adaptive_secagg": {"adaptive_clip": {"max_clip_norm": 5.0}, "aggregation": "secagg"},
            "secagg_dropout": {"aggregation": "secagg", "secagg_dropout": 0.1},
            "fixed_adaptive": {"adaptive_clip": True, "sampling": "fixed", "cohort_size": 10},
            "diag": {"diagnostics": True}}


def jobs(root: Path) -> list[tuple[str, Path, dict]]:
    out = [(f"{p.parent.name}/{p.stem}", p, {}) for p in sorted((root / "configs").glob("*/*.toml"))
           if p.parent.name in FAMILIES]
    for p in sorted((root / "configs/experiments/bases").glob("*.toml")):
        if any(f'name = "{a}"' in p.read_text() for a in FAMILIES):
            extra = {"rounds": 4} if p.stem.startswith("correlated_noise") else {}
            out.append((f"bases/{p.stem}", p, extra))
    base = root / "configs/dp_fedavg/mnist5k.toml"
    return out + [(f"mnist5k+{k}", base, v) for k, v in VARIANTS.items()]


def _determinism(root: Path):
    """ROOT's tests/test_determinism.py (its ``small`` and ``_stable``), loaded by path."""
    spec = importlib.util.spec_from_file_location("test_determinism",
                                                  root / "tests" / "test_determinism.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(root: Path, out_path: Path) -> None:
    td = _determinism(root)
    from fedjax_dp.experiments import config as config_lib
    from fedjax_dp.experiments import runner
    out = {}
    for name, path, extra in jobs(root):
        with tempfile.TemporaryDirectory() as d:
            try:
                c = td.small(config_lib.load(path))
                c["algorithm"].update(extra)
                out[name] = td._stable(runner.run(config_lib.resolve(c), Path(d) / "a"))
            except Exception as e:            # a refusal at this size is a result too
                out[name] = {"error": f"{type(e).__name__}: {e}"[:400]}
        print(name, "refused" if "error" in out[name] else "ran", flush=True)
        out_path.write_text(json.dumps(out, indent=1, sort_keys=True, default=str))


def compare(before: Path, after: Path) -> int:
    a, b = json.loads(before.read_text()), json.loads(after.read_text())
    differ = 0
    for name in sorted(set(a) | set(b)):
        x, y = a.get(name), b.get(name)
        keys = [] if x == y else sorted(k for k in set(x or {}) | set(y or {})
                                        if (x or {}).get(k) != (y or {}).get(k))
        differ += bool(keys)
        print(f"{'same' if not keys else 'DIFFERENT: ' + ', '.join(keys):<40} {name}")
    return 1 if differ else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("root", type=Path)
    r.add_argument("out", type=Path)
    c = sub.add_parser("compare")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "run":
        run(args.root.resolve(), args.out)
        return 0
    return compare(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())
