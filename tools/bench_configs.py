"""Benchmark of every shipped config (accuracy, headline epsilon, wall time of the whole
command): ``results/configs_expected.json`` (JSON) and the ``# Expected (...)`` line at the top of
each ``configs/*/*.toml``.

    python tools/bench_configs.py                    # check: every config's comment line
                                                        # matches the JSON (prints mismatches)
    python tools/bench_configs.py --run [CONFIG ...] # run the configs (default: all, FNAS
                                                        # last), one at a time, and rewrite their
                                                        # entries in the JSON; then check
    python tools/bench_configs.py --write-comments   # put the JSON's line into each config

A run is ``fedjax-dp run CONFIG --quiet --out DIR`` in a subprocess (prefix the command with
``nice`` on a shared machine); its entry holds the test accuracy, the headline guarantee (the
first data-independent unit, :func:`fedjax_dp.experiments.records.headline`) with its epsilon
under every accountant of the run, and the wall time of the whole command (import, data,
compilation, training, accounting) beside the runner's own ``wall_time_s``. ``--run`` also
reports where the accuracy or an epsilon changed from the JSON's previous entry (runs are
deterministic for a given seed and machine, so a change means the code changed the result).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JSON = ROOT / "results" / "configs_expected.json"
PREFIX = "# Expected "


def configs() -> list[str]:
    """Every shipped run config, relative to the repository; the (slow) FNAS ones last (not
    configs/experiments: sweeps; not configs/benchmarks: they read the user's converted data)."""
    paths = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "configs").glob("*/*.toml")
                   if p.parent.name not in ("experiments", "benchmarks"))
    return sorted(paths, key=lambda p: p.startswith("configs/fnas/"))


def _fmt_eps(eps: float | None) -> str:
    if eps is None:
        return "inf"
    return f"{eps:.2f}" if eps < 10 else f"{eps:.1f}" if eps < 100 else f"{eps:.0f}"


def _fmt_delta(delta: float) -> str:
    """``1e-5``, ``6.9e-5``, ``0.001`` -> ``1e-3`` (two significant digits, short exponent)."""
    mantissa, exponent = f"{delta:.1e}".split("e")
    mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa}e{int(exponent)}"


def _fmt_time(seconds: float) -> str:
    if seconds < 100:
        return f"~{max(1, round(seconds))} s"
    return f"~{seconds / 60:.0f} min" if seconds >= 150 else f"~{round(seconds, -1):.0f} s"


def line(entry: dict) -> str:
    """The config's comment line for a JSON entry."""
    parts = [f"test accuracy {entry['test_accuracy']:.3f}"]
    h = entry.get("headline")
    if h is None:
        parts.append("no privacy guarantee")
    else:
        eps = " / ".join(f"{_fmt_eps(e)} ({acc.upper()})" for acc, e in h["epsilon"].items())
        parts.append(f"{h['unit']} epsilon {eps} at delta {_fmt_delta(h['delta'])}")
    parts.append(f"{_fmt_time(entry['process_time_s'])}.")
    return f"{PREFIX}(seed {entry['seed']}, {entry['cpus']}-core CPU): " + "; ".join(parts)


def entry_of(result: dict, process_time_s: float) -> dict:
    """The JSON entry of a finished run's ``result.json``."""
    from fedjax_dp.experiments import records
    config = result["config"]
    accountants = tuple(config["privacy"]["accountants"])
    eps, unit, _ = records.headline(result["privacy"], accountants)
    headline = None
    if unit is not None:
        rows = [g for g in result["privacy"] if g["unit"] == unit and not g["data_dependent"]]
        rows.sort(key=lambda g: accountants.index(g["accountant"])
                  if g["accountant"] in accountants else len(accountants))
        headline = {"unit": unit, "delta": rows[0]["delta"],
                    "epsilon": {g["accountant"]: g["epsilon"] for g in rows}}
    return {"seed": result["seed"], "cpus": os.cpu_count(), "algorithm": result["algorithm"],
            "dataset": result["dataset"], "test_accuracy": result["test_accuracy"],
            "headline": headline,
            "guarantees": [{k: g[k] for k in ("unit", "accountant", "epsilon", "delta",
                                              "data_dependent")} for g in result["privacy"]],
            "wall_time_s": round(result["wall_time_s"], 1),
            "process_time_s": round(process_time_s, 1),
            "measured": time.strftime("%Y-%m-%d", time.gmtime())}


def load() -> dict:
    return json.loads(JSON.read_text()) if JSON.exists() else {}


def save(table: dict) -> None:
    JSON.parent.mkdir(parents=True, exist_ok=True)
    ordered = {k: table[k] for k in configs() if k in table}
    ordered.update({k: v for k, v in table.items() if k not in ordered})
    JSON.write_text(json.dumps(ordered, indent=2) + "\n")


def run_one(config: str, timeout: float, keep: Path | None = None) -> dict:
    """``fedjax-dp run CONFIG --quiet`` in a subprocess; its JSON entry. ``keep``: write the run
    to ``keep/<algorithm folder>_<config name>`` (a fresh folder) instead of a temporary one."""
    exe = Path(sys.executable).parent / "fedjax-dp"
    command = [str(exe)] if exe.exists() else [sys.executable, "-m",
                                               "fedjax_dp.experiments.cli"]
    with tempfile.TemporaryDirectory(prefix="expected_") as tmp:
        name = "_".join(Path(config).with_suffix("").parts[-2:])
        out = Path(tmp) / "run" if keep is None else Path(keep) / name
        start = time.perf_counter()
        done = subprocess.run(command + ["run", str(ROOT / config), "--quiet", "--out",
                                         str(out)], timeout=timeout, cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode:
            raise RuntimeError(f"exit {done.returncode}: {done.stderr.strip()[-2000:]}")
        elapsed = time.perf_counter() - start
        return entry_of(json.loads((out / "result.json").read_text()), elapsed)


def changed(old: dict | None, new: dict) -> list[str]:
    """What differs in the results (not the timings) between two entries of one config."""
    if old is None:
        return []
    out = []
    if old["test_accuracy"] != new["test_accuracy"]:
        out.append(f"test accuracy {old['test_accuracy']} -> {new['test_accuracy']}")
    key = lambda g: (g["unit"], g["accountant"])                          # noqa: E731
    was = {key(g): g["epsilon"] for g in old.get("guarantees", [])}
    for g in new["guarantees"]:
        if key(g) in was and was[key(g)] != g["epsilon"]:
            out.append(f"{g['unit']} epsilon ({g['accountant']}) {was[key(g)]} -> {g['epsilon']}")
    return out


def comment_line(config: str) -> str | None:
    for text in (ROOT / config).read_text().splitlines():
        if text.startswith(PREFIX):
            return text
    return None


def check(table: dict) -> list[str]:
    """Mismatches between the configs' comment lines and the JSON (one message each)."""
    problems = []
    for config in configs():
        if config not in table:
            problems.append(f"{config}: no entry in {JSON.relative_to(ROOT)} (run --run {config})")
            continue
        want, got = line(table[config]), comment_line(config)
        if got != want:
            problems.append(f"{config}:\n  comment: {got}\n  json:    {want}")
    for config in sorted(set(table) - set(configs())):
        problems.append(f"{config}: in the JSON but no such config")
    return problems


def write_comments(table: dict) -> None:
    """Put (or replace) each config's ``# Expected`` line as its first line."""
    for config in configs():
        if config not in table:
            continue
        path = ROOT / config
        lines = [t for t in path.read_text().splitlines() if not t.startswith(PREFIX)]
        path.write_text("\n".join([line(table[config])] + lines) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", nargs="*", metavar="CONFIG", default=None,
                    help="run these configs (none given: all) and rewrite their JSON entries")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per config")
    ap.add_argument("--keep", type=Path, default=None, metavar="DIR",
                    help="keep the runs' folders under DIR (default: temporary folders)")
    ap.add_argument("--write-comments", action="store_true",
                    help="write the JSON's line at the top of every config")
    args = ap.parse_args(argv)
    table = load()
    if args.run is not None:
        todo = [str(Path(c)) for c in args.run] or configs()
        for config in todo:
            try:
                entry = run_one(config, args.timeout, args.keep)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                print(f"{config}: FAILED ({e})", file=sys.stderr, flush=True)
                continue
            diff = changed(table.get(config), entry)
            table[config] = entry
            save(table)                                   # keep what finished
            print(f"{config}: {line(entry)}" + (f"  CHANGED: {'; '.join(diff)}" if diff else ""),
                  flush=True)
    if args.write_comments:
        write_comments(table)
    problems = check(table)
    for p in problems:
        print(p)
    print(f"{len(configs()) - len(problems)} / {len(configs())} configs match "
          f"{JSON.relative_to(ROOT)}" if problems else
          f"all {len(configs())} configs match {JSON.relative_to(ROOT)}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
