"""Per-round cost of DP-FedAvg's privacy mechanisms, each run through ``fedjax-dp run``.

Every variant is the same run -- ``configs/dp_fedavg/mnist5k.toml`` (100 IID agents, MLP-200,
10 local SGD steps of batch 16), ``--rounds`` rounds, Poisson cohorts of ``--cohort`` expected
agents -- plus the variant's ``--set`` overrides (:data:`VARIANTS`), run as a user runs it: one
``fedjax-dp run`` subprocess per run (``python -m fedjax_dp.experiments.cli`` where no
``fedjax-dp`` script sits beside the interpreter), ``run.eval_every = 0``,
``run.checkpoint_every = 0``, ``run.compilation_cache = "off"`` (every run compiles, so the
compile figures are comparable and no run profits from an earlier one's cache).

From each run's ``result.json`` (``timing``, written by the runner):

* ``wall_s``: the subprocess, start to exit (imports, data, init, rounds, accounting, writing);
* ``setup_s``: data loading and the model (the runner's ``timing.setup_s``);
* ``init_other_s``: the record's ``wall_time_s`` minus setup and the rounds: the algorithm's
  init (jax-privacy's strategy optimisation for ``banded_mf`` / ``blt`` lands here), the final
  evaluation and the accounting;
* ``first_call_s``: the first compiled call of rounds (its compilation and ``first_call_rounds``
  rounds; with ``run.rounds_per_call = "auto"`` the first call is one round);
  ``compile_s`` / ``compilations``: JAX's own compile log of the whole run (``timing.compile_s``:
  init and jax-privacy's optimisation too); ``compile_rounds_s``: its listed compilations
  (those over ``compilation.LISTED_S``) made while the rounds ran, i.e. the fused rounds' own;
  ``compile_est_s`` = first_call_s - first_call_rounds x the steady median;
* ``round_ms``: the steady state, every round after the first call (``timing.round_s``: each
  call's wall time between finished calls, spread over its rounds): median / min / max / mean
  in milliseconds; ``rounds_per_s`` = 1000 / median (with ``rounds_per_call = "auto"`` the
  calls grow to about 0.5 s each, so the median is the long calls' and min / max mostly come
  from the few short calls after the first);
* ``ratio_to_baseline``: the variant's median over the median of the ``baseline`` runs'
  medians; the baseline is run first, again after every ``--baseline-every`` variants and
  last, so the ratios compare runs of the same process tree on the same machine.

The cohort: ``algorithm.sampling_rate = q = cohort x groups / agents``, ``groups`` = the
variant's participation groups (1; b for correlated noise, whose round t samples only group
t mod b), so every variant trains about ``--cohort`` agents per round; a variant with
``"sampling": "fixed"`` trains exactly ``--cohort`` (``algorithm.cohort_size``). Writes the
JSON after every run (a run killed at its limit keeps the ones before), prints a table at the
end and writes it beside the JSON (``--out X.json``: ``X.txt``).

    python tools/bench_mechanisms.py --rounds 5000 --cohort 20 --deadline 360 --out results/bench/mechanisms.json
    python tools/bench_mechanisms.py --variants baseline,secagg --rounds 20 --cohort 10   # dry run
    python tools/bench_mechanisms.py --add-variant 'secagg_k8|algorithm.aggregation="secagg"|algorithm.secagg_neighbours=8'
    python tools/bench_mechanisms.py --variants baseline,secagg_k4 --add-variant \
        'ddg|algorithm.aggregation="secagg"|algorithm.distributed_noise={kind="ddg", bits=16}|sampling=fixed'
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = "configs/dp_fedavg/mnist5k.toml"

# --------------------------------------------------------------------------------------------
# THE VARIANTS. name -> {"set": the --set overrides added to the common run (TOML values; an
# inline table for a table), "groups": participation groups (default 1; q is multiplied by it),
# "sampling": "poisson" (default: rate q = cohort x groups / agents) or "fixed" (exactly --cohort
# agents a round: algorithm.sampling = "fixed", algorithm.cohort_size = --cohort)}.
# To add one, add an entry here (or pass --add-variant 'name|key=value|key=value' without
# editing; 'groups=b' and 'sampling=fixed' there set those two). "baseline" must stay: the
# ratios are to it.
VARIANTS: dict[str, dict] = {
    # fixed clip S = 1, independent Gaussian noise each round (the shipped config)
    "baseline": {"set": []},
    # Andrew et al. 2021: the clip follows the median update norm (docs/adaptive_clipping.md)
    "adaptive_clip": {"set": ["algorithm.adaptive_clip={target_quantile=0.5, learning_rate=0.2, "
                              "count_noise=3.0}"]},
    # secure aggregation: pairwise masks in fixed point on the complete graph (docs/secagg.md)
    "secagg": {"set": ['algorithm.aggregation="secagg"']},
    # ... and on a 4-regular graph (the masks' cost O(cohort x k x d), not O(cohort^2 x d)), as
    # configs/experiments/bases/distributed_dp_*.toml use
    "secagg_k4": {"set": ['algorithm.aggregation="secagg"', "algorithm.secagg_neighbours=4"]},
    # noise correlated across rounds (docs/correlated_noise.md): 4 groups taking turns; blt last
    # (its strategy optimisation makes it the longest run: under --deadline it is the one cut)
    "banded_mf": {"set": ['algorithm.noise={kind="banded_mf", bands=4}'], "groups": 4},
    "blt": {"set": ['algorithm.noise={kind="blt", min_sep=4}'], "groups": 4},
    # distributed discrete noise under secure aggregation (docs/distributed_dp.md): fixed-size
    # cohorts, so beside secagg on the same fixed cohorts
    "secagg_k4_fixed": {"set": ['algorithm.aggregation="secagg"', "algorithm.secagg_neighbours=4"],
                        "sampling": "fixed"},
    "ddg": {"set": ['algorithm.aggregation="secagg"', "algorithm.secagg_neighbours=4",
                    'algorithm.distributed_noise={kind="ddg", bits=16}'], "sampling": "fixed"},
    "skellam": {"set": ['algorithm.aggregation="secagg"', "algorithm.secagg_neighbours=4",
                        'algorithm.distributed_noise={kind="skellam", bits=16}'],
                "sampling": "fixed"},
}
DEFAULT_VARIANTS = list(VARIANTS)
# --------------------------------------------------------------------------------------------

COMMON = ["run.eval_every=0", "run.checkpoint_every=0", "run.progress=false",
          'run.compilation_cache="off"', 'privacy.accountants=["rdp"]']

PROBE = r"""
import json, importlib.metadata as md
import jax
out = {"jax": jax.__version__, "platform": jax.default_backend(),
       "devices": [f"{d.platform}:{d.id} {d.device_kind}" for d in jax.devices()],
       "device_kind": jax.devices()[0].device_kind, "packages": {}}
for name in ("jaxlib", "jax-cuda13-plugin", "jax-cuda12-plugin", "flax", "optax", "chex",
             "numpy", "scipy", "dp-accounting", "jax-privacy", "dm-tree", "mlxtend", "attrs",
             "typing_extensions", "pydantic"):
    try:
        out["packages"][name] = md.version(name)
    except md.PackageNotFoundError:
        pass
print("PROBE " + json.dumps(out))
"""


def child_env(cache: Path) -> dict:
    """The runs' environment: this one (the children run in the repository root, where
    ``python -m fedjax_dp.experiments.cli`` finds the source tree if the package is not
    installed)."""
    return dict(os.environ, PYTHONUNBUFFERED="1", FEDJAX_DP_CACHE_DIR=str(cache))


def probe(env: dict) -> dict:
    """JAX's version and devices, read in a subprocess (a backend started in this process would
    hold GPU memory while the runs need it)."""
    res = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=300)
    for line in res.stdout.splitlines():
        if line.startswith("PROBE "):
            return json.loads(line[6:])
    return {"error": (res.stderr or res.stdout)[-2000:]}


def cli_cmd() -> list[str]:
    exe = Path(sys.executable).with_name("fedjax-dp")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "fedjax_dp.experiments.cli"]


def parse_added(text: str) -> tuple[str, dict]:
    """``--add-variant 'name|key=value|...'`` (``groups=b`` sets the participation groups)."""
    name, *sets = text.split("|")
    spec: dict = {"set": []}
    for s in sets:
        if s.startswith("groups="):
            spec["groups"] = int(s.split("=", 1)[1])
        elif s.startswith("sampling="):
            spec["sampling"] = s.split("=", 1)[1].strip('"')
        elif s:
            spec["set"].append(s)
    if not name or not spec["set"]:
        sys.exit(f"--add-variant {text!r}: expected 'name|key=value|key=value'")
    return name, spec


def one_run(name: str, spec: dict, args, tmp: Path, env: dict, index: int) -> dict:
    groups = int(spec.get("groups", 1))
    q = args.cohort * groups / args.agents
    if not 0 < q <= 1:
        return {"variant": name, "ok": False,
                "error": f"q = cohort x groups / agents = {args.cohort} x {groups} / "
                         f"{args.agents} = {q:g} is not in (0, 1]; lower --cohort or raise "
                         f"--agents"}
    sampling = spec.get("sampling", "poisson")
    if sampling == "fixed":
        how = ['algorithm.sampling="fixed"', f"algorithm.cohort_size={args.cohort}"]
    elif sampling == "poisson":
        how = [f"algorithm.sampling_rate={q!r}"]
    else:
        return {"variant": name, "ok": False,
                "error": f"sampling {sampling!r}: \"poisson\" or \"fixed\""}
    sets = COMMON + [f"algorithm.rounds={args.rounds}", f"data.num_agents={args.agents}",
                     f"run.rounds_per_call={args.rounds_per_call}"] + how + spec["set"]
    out = tmp / f"run{index:02d}_{name}"
    cmd = cli_cmd() + ["run", str(ROOT / args.config), "--out", str(out), "--quiet"]
    for s in sets:
        cmd += ["--set", s]
    row: dict = {"variant": name, "overrides": spec["set"], "groups": groups,
                 "sampling": sampling, "sampling_rate": q if sampling == "poisson" else None,
                 "command": cmd[len(cli_cmd()):]}
    start = time.perf_counter()
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT,
                             timeout=args.run_timeout)
    except subprocess.TimeoutExpired:
        row.update(ok=False, wall_s=time.perf_counter() - start,
                   error=f"timed out after {args.run_timeout} s")
        return row
    row["wall_s"] = round(time.perf_counter() - start, 3)
    if res.returncode or not (out / "result.json").exists():
        row.update(ok=False, error=f"exit {res.returncode}: {(res.stderr or res.stdout)[-3000:]}")
        return row
    rec = json.loads((out / "result.json").read_text())
    timing = rec["timing"]
    secs = timing["round_s"]
    first_n = 1 if args.rounds_per_call == "auto" else min(int(args.rounds_per_call), len(secs))
    first_call = sum(secs[:first_n])
    steady = [s * 1e3 for s in secs[first_n:]]
    med = statistics.median(steady) if steady else float("nan")
    row.update(
        ok=True, setup_s=timing.get("setup_s"),
        init_other_s=round(rec["wall_time_s"] - timing.get("setup_s", 0) - sum(secs), 3),
        first_call_s=round(first_call, 4), first_call_rounds=first_n,
        compile_s=timing.get("compile_s"), compilations=timing.get("compilations"),
        compile_rounds_s=round(sum(c["seconds"] for c in timing.get("listed", [])
                                   if c.get("step", 0) >= 1), 4),
        compilations_after_first_call=timing.get("compilations_after_first_call"),
        compile_est_s=round(first_call - first_n * med / 1e3, 4) if steady else None,
        steady_rounds=len(steady),
        round_ms={"median": med, "min": min(steady, default=float("nan")),
                  "max": max(steady, default=float("nan")),
                  "mean": statistics.fmean(steady) if steady else float("nan")},
        rounds_per_s=1e3 / med if steady and med > 0 else None,
        steady_s=round(sum(steady) / 1e3, 3),
        record_wall_time_s=rec["wall_time_s"], devices=rec.get("devices"),
        versions=rec.get("versions"), cohort_execution=rec.get("cohort"),
        num_sampled_mean=(statistics.fmean(h["num_sampled"] for h in rec["history"]
                                           if "num_sampled" in h)
                          if any("num_sampled" in h for h in rec["history"]) else None),
        test_accuracy=rec.get("test_accuracy"),
        epsilon=[{k: g.get(k) for k in ("unit", "epsilon", "delta", "accountant")}
                 for g in rec.get("privacy", [])])
    if not args.keep_runs:
        shutil.rmtree(out, ignore_errors=True)
    return row


def schedule(variants: list[str], every: int) -> list[str]:
    """baseline, then the others with baseline again after every ``every`` of them, and last."""
    others = [v for v in variants if v != "baseline"]
    order = ["baseline"]
    for i, v in enumerate(others, 1):
        order.append(v)
        if every and i % every == 0 and i != len(others):
            order.append("baseline")
    if others:
        order.append("baseline")
    return order


def summarise(record: dict) -> None:
    """Per variant: its runs' figures (medians over repeats) and the ratio to the baseline."""
    rows = [r for r in record["runs"] if r.get("ok")]
    base = [r["round_ms"]["median"] for r in rows if r["variant"] == "baseline"]
    base_med = statistics.median(base) if base else None
    record["baseline_round_ms"] = {"runs": base, "median": base_med,
                                   "spread": (max(base) - min(base)) / base_med
                                   if base and base_med else None}
    out = {}
    for r in record["runs"]:
        name = r["variant"]
        out.setdefault(name, {"runs": 0, "failed": 0, "errors": []})
        if not r.get("ok"):
            out[name]["failed"] += 1
            out[name]["errors"].append(r.get("error", "")[-500:])
            continue
        out[name]["runs"] += 1
    for name, v in out.items():
        mine = [r for r in rows if r["variant"] == name]
        if not mine:
            continue
        def med(key):
            vals = [r[key] for r in mine if isinstance(r.get(key), (int, float))]
            return statistics.median(vals) if vals else None
        v.update(
            wall_s=med("wall_s"), setup_s=med("setup_s"), init_other_s=med("init_other_s"),
            first_call_s=med("first_call_s"), compile_s=med("compile_s"),
            compile_rounds_s=med("compile_rounds_s"),
            compile_est_s=med("compile_est_s"),
            compilations_after_first_call=max(r.get("compilations_after_first_call") or 0
                                              for r in mine),
            round_ms={k: statistics.median(r["round_ms"][k] for r in mine)
                      for k in ("median", "min", "max", "mean")},
            ratio_to_baseline=(statistics.median(r["round_ms"]["median"] for r in mine) /
                               base_med if base_med else None),
            ratio_runs=[r["round_ms"]["median"] / base_med for r in mine] if base_med else None,
            test_accuracy=med("test_accuracy"),
            device=record["machine"].get("device_kind"), jax=record["machine"].get("jax"))
    record["variants"] = out


def table(record: dict) -> str:
    head = (f"{'variant':<15}{'runs':>5}{'wall s':>8}{'setup s':>8}{'init+ s':>8}"
            f"{'1st call s':>11}{'compile s':>10}{'(rounds)':>9}{'ms/round med':>13}"
            f"{'min':>10}{'max':>10}{'x base':>8}{'acc':>7}")
    lines = [f"{record['machine'].get('device_kind')} ({record['machine'].get('platform')}), "
             f"jax {record['machine'].get('jax')}; {record['rounds']} rounds, cohort "
             f"{record['cohort']} of {record['agents']}, rounds_per_call "
             f"{record['rounds_per_call']}", head, "-" * len(head)]
    for name, v in record.get("variants", {}).items():
        if "round_ms" not in v:
            last = ((v["errors"] or [""])[-1].strip().splitlines() or [""])[-1]
            lines.append(f"{name:<15}{v['runs']:>5}  FAILED ({v['failed']}x): {last[:200]}")
            continue
        rm = v["round_ms"]

        def f(x, width, digits):
            return f"{x:>{width}.{digits}f}" if isinstance(x, (int, float)) else f"{'-':>{width}}"
        lines.append(f"{name:<15}{v['runs']:>5}{f(v['wall_s'], 8, 1)}{f(v['setup_s'], 8, 1)}"
                     f"{f(v['init_other_s'], 8, 1)}{f(v['first_call_s'], 11, 2)}"
                     f"{f(v['compile_s'], 10, 2)}{f(v['compile_rounds_s'], 9, 2)}"
                     f"{f(rm['median'], 13, 3)}{f(rm['min'], 10, 3)}{f(rm['max'], 10, 3)}"
                     f"{f(v['ratio_to_baseline'], 8, 2)}{f(v['test_accuracy'], 7, 3)}"
                     + (f"  ({v['compilations_after_first_call']} compilations after the "
                        f"first call)" if v["compilations_after_first_call"] else ""))
    b = record.get("baseline_round_ms", {})
    if b.get("runs"):
        lines.append(f"baseline runs: {', '.join(f'{x:.3f}' for x in b['runs'])} ms/round "
                     f"(spread {100 * (b['spread'] or 0):.0f}% of their median)")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                    help=f"comma list of {list(VARIANTS)} (baseline is always run)")
    ap.add_argument("--add-variant", action="append", default=[], metavar="NAME|KEY=V|...",
                    help="one more variant without editing the file ('groups=b': its "
                         "participation groups; 'sampling=fixed': exactly --cohort agents)")
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--cohort", type=int, default=20, help="expected agents per round")
    ap.add_argument("--agents", type=int, default=100, help="data.num_agents (mnist5k: 3000 "
                                                           "training records in all)")
    ap.add_argument("--config", default=CONFIG, help="the DP-FedAvg run config")
    ap.add_argument("--rounds-per-call", default="auto", help='run.rounds_per_call ("auto" or k)')
    ap.add_argument("--repeats", type=int, default=1, help="runs of each non-baseline variant")
    ap.add_argument("--baseline-every", type=int, default=2,
                    help="the baseline again after every N variants (0: first and last only)")
    ap.add_argument("--run-timeout", type=float, default=600, help="seconds per run")
    ap.add_argument("--deadline", type=float, default=0,
                    help="seconds for the whole script: a run that would likely end past it "
                         "(elapsed + the variant's own longest run so far, else the longest "
                         "run so far) is skipped (0: none)")
    ap.add_argument("--keep-runs", default="", help="a folder to keep the runs' outputs in")
    ap.add_argument("--out", default="", help="the JSON (written after every run)")
    args = ap.parse_args()
    if args.rounds_per_call != "auto":
        args.rounds_per_call = int(args.rounds_per_call)
    for text in args.add_variant:
        name, spec = parse_added(text)
        VARIANTS[name] = spec
    names = [v for v in args.variants.split(",") if v]
    names += [parse_added(t)[0] for t in args.add_variant if parse_added(t)[0] not in names]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        sys.exit(f"unknown variant(s) {unknown}; known: {list(VARIANTS)}")
    others = [v for v in names if v != "baseline"] * args.repeats
    order = schedule(["baseline"] + others, args.baseline_every)

    t0 = time.perf_counter()
    keep = Path(args.keep_runs) if args.keep_runs else None
    with tempfile.TemporaryDirectory(prefix="bench_mech_") as raw:
        tmp = keep if keep else Path(raw)
        tmp.mkdir(parents=True, exist_ok=True)
        env = child_env(Path(raw) / "cache")
        machine = probe(env)
        machine.update(host=platform.node(), platform_string=platform.platform(),
                       cpus=os.cpu_count(), python=sys.version.split()[0])
        if shutil.which("nvidia-smi"):
            smi = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
            machine["nvidia_smi"] = smi.stdout.strip()
        print(f"machine: {machine.get('device_kind')} ({machine.get('platform')}), jax "
              f"{machine.get('jax')}; order: {' '.join(order)}", flush=True)
        record = {"tool": "tools/bench_mechanisms.py", "config": args.config,
                  "rounds": args.rounds, "cohort": args.cohort, "agents": args.agents,
                  "rounds_per_call": args.rounds_per_call, "common_overrides": COMMON,
                  "variant_specs": {v: VARIANTS[v] for v in dict.fromkeys(order)},
                  "order": order, "machine": machine, "runs": []}
        walls: dict[str, float] = {}
        for i, name in enumerate(order):
            elapsed = time.perf_counter() - t0
            longest = walls.get(name, max(walls.values(), default=0.0))
            if args.deadline and elapsed + longest > args.deadline:
                record["runs"].append({"variant": name, "ok": False,
                                       "error": f"skipped: {elapsed:.0f} s elapsed + an "
                                                f"expected {longest:.0f} s > --deadline"})
                print(f"[{i + 1}/{len(order)}] {name}: skipped (deadline)", flush=True)
                continue
            row = one_run(name, VARIANTS[name], args, tmp, env, i)
            walls[name] = max(walls.get(name, 0.0), row.get("wall_s") or 0.0)
            record["runs"].append(row)
            if row.get("ok"):
                print(f"[{i + 1}/{len(order)}] {name}: wall {row['wall_s']:.1f} s, first call "
                      f"{row['first_call_s']:.2f} s (compile {row['compile_s']} s), steady "
                      f"{row['round_ms']['median']:.3f} ms/round median over "
                      f"{row['steady_rounds']} rounds", flush=True)
            else:
                print(f"[{i + 1}/{len(order)}] {name}: FAILED {row.get('error', '')[-1500:]}",
                      flush=True)
            summarise(record)
            record["elapsed_s"] = round(time.perf_counter() - t0, 1)
            if args.out:
                Path(args.out).parent.mkdir(parents=True, exist_ok=True)
                Path(args.out).write_text(json.dumps(record, indent=2))
    summarise(record)
    record["elapsed_s"] = round(time.perf_counter() - t0, 1)
    if args.out:
        Path(args.out).write_text(json.dumps(record, indent=2))
    print(table(record), flush=True)
    if args.out:
        Path(args.out).with_suffix(".txt").write_text(table(record) + "\n")
    sys.exit(0 if all(r.get("ok") for r in record["runs"]) else 1)


if __name__ == "__main__":
    main()
