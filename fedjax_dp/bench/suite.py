"""``fedjax-dp bench``: the headline measurements in one process, one JSON and one table.

    fedjax-dp bench [--suite quick|full] [--out FILE] [--only NAME,NAME] [--population DIR]

Runs the parts in :data:`PARTS` at the sizes of the suite (:data:`SUITES`; ``tiny`` is the
tests' size, hidden from the command's help), then writes ``FILE.json`` and ``FILE.md``. A
float32 matmul is timed before the first part and after every part; a part's ratios against it
use the faster of the two around it. What is measured and recorded: docs/bench.md.
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

from fedjax_dp.bench import (ae_dpfl, char_lstm, common, dp_sgd, fnas, isrl, knn_vote,
                             local_training, peers)
from fedjax_dp.core import compilation

#: the parts, in the order they run
PARTS = {m.NAME: m for m in (local_training, peers, dp_sgd, knn_vote, isrl, fnas, ae_dpfl,
                             char_lstm)}

#: sizes of every part per suite; ``repeats``: timed calls per function; ``matmul``: its n
SUITES: dict[str, dict] = {
    "tiny": {
        "repeats": 1, "matmul": 64,
        local_training.NAME: dict(agents=8, local_size=8, features=4, hidden=8, steps=2,
                                  batch_size=4, loop_max=8),
        peers.NAME: dict(clients=16, examples=16, cohorts=[4], rounds=1),
        dp_sgd.NAME: dict(model="mlp", feature_shape=[8], hidden=[8], batch_size=8),
        knn_vote.NAME: dict(agents=4, local_size=8, queries=4, features=4, k=2),
        isrl.NAME: dict(silos=4, local_size=8, features=4, hidden=4, batch_size=4, loop_max=4),
        fnas.NAME: dict(nodes=1, channels=2, cells=1, image=4, parties=2, records=8, batch=4),
        ae_dpfl.NAME: dict(agents=32, records=4, features=4, hidden=4, steps=1, public=32,
                           queries=8, student_steps=2, repeats=1),
        # the flax layer is compared with the library's in tests/test_lstm_layer.py
        char_lstm.NAME: dict(clients=4, seq=4, vocab=6, hidden=2, cohorts=[2], local_steps=1,
                             batch=2, variants=["library", "hand_scan"]),
    },
    "quick": {
        "repeats": 3, "matmul": 1024,
        local_training.NAME: dict(agents=1000, local_size=64, features=64, hidden=128, steps=20,
                                  batch_size=32, loop_max=100, loop_repeats=3),
        peers.NAME: dict(clients=1000, examples=64, cohorts=[10, 100, 1000], rounds=5),
        dp_sgd.NAME: dict(model="cnn", feature_shape=[28, 28, 1], batch_size=64, repeats=20),
        knn_vote.NAME: dict(agents=200, local_size=600, queries=500, features=64, k=30),
        isrl.NAME: dict(silos=200, local_size=16, features=10, hidden=16, batch_size=8,
                        loop_max=200, loop_repeats=3),
        fnas.NAME: dict(nodes=1, channels=4, cells=1, image=8, parties=4, records=32, batch=8),
        ae_dpfl.NAME: dict(agents=10_000, records=16, features=32, hidden=32, steps=5,
                           public=2000, queries=200, student_steps=200, repeats=1),
        # TFF's Shakespeare char-LSTM (820,522 parameters at V = 90), 4 local steps of batch 4
        char_lstm.NAME: dict(clients=200, seq=80, vocab=90, hidden=256, cohorts=[10],
                             local_steps=4, batch=4),
    },
}


def _with(base: dict, **changes: dict) -> dict:
    """``base`` with some parts' sizes updated (``changes``: part name -> the sizes it changes)."""
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in base.items()}
    for name, sizes in changes.items():
        if isinstance(sizes, dict):
            out[name].update(sizes)
        else:
            out[name] = sizes
    return out


SUITES["full"] = _with(SUITES["quick"], repeats=5, matmul=2048, **{
    local_training.NAME: dict(agents=10_000, loop_max=500),
    peers.NAME: dict(rounds=10),
    dp_sgd.NAME: dict(batch_size=128),
    knn_vote.NAME: dict(agents=1000, queries=1000),
    isrl.NAME: dict(silos=1000, loop_max=1000),
    fnas.NAME: dict(nodes=2, parties=8, records=64, batch=16),
    ae_dpfl.NAME: dict(agents=100_000),
    char_lstm.NAME: dict(cohorts=[10, 100])})


#: the suites a user picks (``tiny`` is for the tests: ``sizes="tiny"``)
USER_SUITES = ("quick", "full")


def check_request(suite: str, only: list[str] | None, sizes: str | None = None,
                  population: str | Path | None = None) -> list[str]:
    """The parts to run; a clear error for an unknown suite, sizes or part, or a population
    folder that is not a converted population (before any work)."""
    if population is not None and not all((Path(population) / f"{n}.npy").is_file()
                                          for n in ("x", "y", "counts")):
        raise ValueError(f"--population must be a converted population folder (fedjax-dp data "
                         f"convert ...: x.npy, y.npy, counts.npy), got {str(population)!r}")
    if suite not in USER_SUITES:
        raise ValueError(f"--suite must be one of {list(USER_SUITES)}, got {suite!r}")
    if sizes is not None and sizes not in SUITES:
        raise ValueError(f"--sizes must be one of {sorted(SUITES)}, got {sizes!r}")
    names = list(PARTS) if not only else list(only)
    unknown = [n for n in names if n not in PARTS]
    if unknown:
        raise ValueError(f"--only: unknown part(s) {unknown}; the parts are {list(PARTS)}")
    return names


def run(suite: str = "quick", out: str | Path | None = None, *, only: list[str] | None = None,
        sizes: str | None = None, population: str | Path | None = None, log=print) -> dict:
    """Run the suite's parts in this process; write ``out.json`` and ``out.md`` when ``out``.

    ``sizes``: another suite's sizes (``"tiny"``: the tests' sizes); default the suite's own.
    ``population``: a converted text population folder (``fedjax-dp data convert
    gutenberg_shakespeare``) whose clients the char-LSTM part runs on, in place of synthetic
    ones."""
    names = check_request(suite, only, sizes, population)
    sizes_name = sizes or suite
    sizes = _with(SUITES[sizes_name])
    if population is not None:
        sizes[char_lstm.NAME]["population"] = str(population)
    repeats = sizes["repeats"]
    start = time.perf_counter()
    record = {"command": "fedjax-dp bench", "suite": suite, "sizes": sizes_name,
              "device": common.device_description(),
              "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    mm = [common.matmul(sizes["matmul"], max(repeats, 3))]
    log(f"matmul {sizes['matmul']}^3: {mm[0]['gflops']:.1f} GFLOP/s")
    parts = []
    for name in names:
        load = common.load_average()
        t0, c0 = time.perf_counter(), time.process_time()
        with compilation.CompileLog() as compiles:
            try:
                rec = PARTS[name].measure(dict(sizes[name]), sizes[name].get("repeats", repeats))
            except Exception as e:                          # recorded; the others still run
                rec = {"name": name, "title": PARTS[name].TITLE, "sizes": sizes[name],
                       "error": f"{type(e).__name__}: {e}"}
        if "error" not in rec:
            pairs = rec.pop("pairs")
            rec["ratios"] = common.ratios(rec["times"], pairs, "median_s")
            rec["ratios_of_minima"] = common.ratios(rec["times"], pairs, "min_s")
            rec["ratio_pairs"] = pairs
        rec["wall_s"] = time.perf_counter() - t0
        rec["process_cpu_s"] = time.process_time() - c0
        summary = compiles.summary()
        rec["compilations"] = {"count": summary["compilations"], "seconds": summary["compile_s"]}
        rec["load_average_before_after"] = [load, common.load_average()]
        parts.append(rec)
        ratios = rec.get("error") or json.dumps({k: round(v, 3)
                                                 for k, v in rec["ratios"].items()})
        log(f"{name}: {rec['wall_s']:.1f} s (cpu {rec['process_cpu_s']:.1f} s, "
            f"{summary['compilations']} compilations {summary['compile_s']:.1f} s) {ratios}")
        mm.append(common.matmul(sizes["matmul"], max(repeats, 3)))       # after every part
        if "flops" in rec and "error" not in rec:
            # this part's reference: the faster of the matmuls just before and just after it
            ref = rec["matmul_gflops"] = max(mm[-2]["gflops"], mm[-1]["gflops"])
            for label, flops in rec["flops"].items():
                for stat, key in (("median_s", "ratios"), ("min_s", "ratios_of_minima")):
                    rec[key][f"{label}_fraction_of_matmul"] = (
                        flops / rec["times"][label][stat] / 1e9 / ref)
    record.update(matmul={"before": mm[0], "after": mm[-1], "gflops": max(m["gflops"] for m in mm),
                          "all_gflops": [m["gflops"] for m in mm]}, parts=parts,
                  total_s=time.perf_counter() - start,
                  errors=[r["name"] for r in parts if "error" in r])
    if out is not None:
        write(record, out)
    return record


def _fmt(v: float) -> str:
    if not math.isfinite(v):
        return str(v)
    return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"


def _sizes_text(sizes: dict) -> str:
    keep = [f"{k}={v}" for k, v in sizes.items()
            if k not in ("repeats", "loop_repeats") and not isinstance(v, float)]
    return ", ".join(keep).replace("|", "/")


def markdown(record: dict) -> str:
    """The table: one row per ratio (measurement, ratio, value, the timings' medians, sizes)."""
    d = record["device"]
    title = f"fedjax-dp bench --suite {record['suite']}"
    if record.get("sizes", record["suite"]) != record["suite"]:
        title += f" --sizes {record['sizes']}"
    lines = [f"# {title}", "",
             f"Device: {d['platform']} ({d['device_kind']}) x {d['device_count']}, "
             f"{d['cpu_count']} CPUs ({d['cpu_model']}), jax {d['jax']}; load average at the "
             f"start {d['load_average']}; started {record['started']}, took "
             f"{record['total_s']:.0f} s. Float32 matmul {record['matmul']['before']['n']}^3: "
             f"{record['matmul']['gflops']:.1f} GFLOP/s at best (timed before the first part "
             "and after each; a part's fractions use the two around it).", "",
             "Every value is a ratio of timings taken in this run, after a warm-up call: of "
             "the medians over the repeats, and of the minima (less sensitive to other "
             "processes on a shared machine).", "",
             "| measurement | ratio | of medians | of minima | medians (s) | sizes |",
             "|---|---|---|---|---|---|"]
    for rec in record["parts"]:
        if "error" in rec:
            lines.append(f"| {rec['name']} | ERROR | - | - | {rec['error'][:120]} | |")
            continue
        med = ", ".join(f"{k} {_fmt(t['median_s'])}" for k, t in rec["times"].items())
        for i, (k, v) in enumerate(rec["ratios"].items()):
            lines.append(f"| {rec['name']} | {k} | {_fmt(v)} | "
                         f"{_fmt(rec['ratios_of_minima'][k])} | {med if i == 0 else ''} | "
                         f"{_sizes_text(rec['sizes']) if i == 0 else ''} |")
    return "\n".join(lines) + "\n"


def write(record: dict, out: str | Path) -> tuple[Path, Path]:
    """``out.json`` and ``out.md`` (a ``.json`` / ``.md`` suffix of ``out`` is dropped)."""
    out = Path(out)
    if out.suffix in (".json", ".md"):
        out = out.with_suffix("")
    out.parent.mkdir(parents=True, exist_ok=True)
    js, md = out.with_name(out.name + ".json"), out.with_name(out.name + ".md")
    from fedjax_dp.core import files                 # atomic: a reader sees a whole file
    files.write_text(js, json.dumps(record, indent=2) + "\n")
    files.write_text(md, markdown(record))
    return js, md
