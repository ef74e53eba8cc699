"""The figures of the other docs pages with results (benchmarks, audits, devices, the paper
pages' tables beyond ``test_docs_records``) agree with the committed records: as there, every
figure below is computed here from a record under ``results/`` and must stand, as written here,
on the page that quotes it; a figure with no committed record must be marked so on the page
(``NO_RECORD``). ``RESULT_PAGES`` lists every docs page and results README with results: each
must have checked claims (here, in ``test_docs_records`` or in ``test_docs_records_readmes``),
and every page must be listed there or in ``OTHER_PAGES``. Reads files only."""
from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

from fedjax_dp.experiments import records
from test_docs_records import CLAIMS as RESULTS_CLAIMS
from test_docs_records import (ROOT, _json, _md_row, _page, _runs, _text, dec, f3, ms, read, sci,
                               sig, span)
from test_docs_records_readmes import CLAIMS as README_CLAIMS


# --- docs/secagg.md: the benchmark table (results/secagg/bench.json) ------------------------------

def secagg_claims() -> list[tuple[str, str]]:
    b = _json("results/secagg/bench.json")
    claims = []
    for v in b["vote"]:
        assert v["same_labels"]
        size = ("same" if v is not b["vote"][0] else
                f"N = {v['agents']:,}, Q = {v['queries']}, C = {v['classes']}, chunks of "
                f"{v['agent_chunk']}")
        claims.append(("secagg.md", f"| streamed vote, J = {v['talliers']} | {size} | "
                                    f"{sig(v['plain_s'])} s | {sig(v['secagg_s'])} s | "
                                    f"{sig(v['ratio'])} |"))
    for s in b["sum"]:
        k = s["neighbours"]
        name = f"k = {k}" if k != "complete" else f"complete (k = {s['agents'] - 1})"
        size = (f"B = {s['agents']} agents, d = {s['dim']:,}" if s is b["sum"][0] else "same")
        secure = ms(s["secagg_s"]) if s["secagg_s"] < 1 else f"{s['secagg_s']:.2f} s"
        claims.append(("secagg.md", f"| cohort sum, {name} | {size} | {ms(s['plain_s'])} | "
                                    f"{secure} | {sig(s['ratio'])} |"))
    plain, secure = b["round"]
    k = secure["aggregation"].split("=")[1]
    claims.append(("secagg.md", f"| DP-FedAvg round, k = {k} | {secure['agents']} agents, MLP "
                                f"32-64-10 ({secure['params']:,} params), 4 local steps | "
                                f"{ms(plain['round_s'], 1)} | {ms(secure['round_s'])} | "
                                f"{sig(secure['ratio_to_plain'])} |"))
    error = max(s["max_abs_error"] for s in b["sum"])
    claims.append(("secagg.md", f"the cohort sums' largest error was {sci(error)} against the "
                                f"bound `B 2^-(f+1)` = {sci(b['sum'][0]['error_bound'])}"))
    v2, v3 = b["vote"]
    claims.append(("secagg.md", f"The plain vote's two timings differ by "
                                f"{v2['plain_s'] / v3['plain_s']:.0f}x from contention alone"))
    return claims


# --- docs/audit.md: the audit table and the figures around it -------------------------------------

def audit_claims() -> list[tuple[str, str]]:
    a = _json("results/audit/audit.json")
    rows = a["results"]
    claims = [("audit.md", f"{a['trials']:,} trials per world, seed {a['seed']}, confidence "
                           f"{rows[0]['confidence']}; {a['total_wall_time_s']:.0f} s on a 2-core "
                           f"CPU")]
    for r in rows:
        verdict = "yes" if r["consistent"] else "**no: caught**"
        claims.append(("audit.md", f"| {r['mechanism']} | {r['weaken'] or 'real'} | {r['unit']} | "
                                   f"{r['claimed_epsilon']:.3f} | {r['epsilon_lower_bound']:.3f} | "
                                   f"{r['trials']:,} | {verdict} |"))
    real = [r["epsilon_lower_bound"] for r in rows if r["weaken"] is None]
    saturated = [r["epsilon_lower_bound"] for r in rows if r["weaken"] == "no-clip"]
    claims.append(("audit.md", f"no bound can exceed ~{max(saturated):.1f}"))
    claims.append(("audit.md", f"the bound reaches {span(real, dec(2))} at 1M "
                               f"trials"))
    sgd = {r["weaken"]: r for r in rows if r["mechanism"] == "dp-sgd-step"}
    for weaken in (None, "halve-noise"):
        r = sgd[weaken]
        claims.append(("audit.md", f'{{ "epsilon_lower_bound": {r["epsilon_lower_bound"]:.3f}, '
                                   f'"claimed_epsilon": {r["claimed_epsilon"]:.3f}, ..., '
                                   f'"consistent": {str(r["consistent"]).lower()} }}'))
    sigma = {r["params"]["sigma"] for r in rows if r["mechanism"] == "gaussian-vote"}
    assert sigma == {3.7}
    claims.append(("audit.md", f"(noise multiplier {sigma.pop()} -> 1.85: epsilon "
                               f"{sgd[None]['claimed_epsilon']:.2f} -> 2.17"))
    one = _json("results/audit/one_run_mnist5k.json")
    claims.append(("audit.md", f"config: {one['real_agents']} agents, {one['rounds']} rounds"))
    claims.append(("audit.md", f"at {100 * (1 - one['significance']):.0f}% confidence"))
    return claims


# --- docs/devices.md: the CPU defaults, the selftest line, the GPU's XLA flag ---------------------

def _selftest_line(path: str, case: str) -> dict:
    line = next(x for x in _text(path).splitlines() if f" {case} " in x)
    m = re.search(r"acc (\S+)/(\S+)\s+eps (\S+)\s+\|p\|_1 (\S+)/(\S+)\s+\|p\|_2 (\S+)/(\S+)", line)
    return dict(zip(("acc", "acc_cpu", "eps", "p1", "p1_cpu", "p2", "p2_cpu"), m.groups()))


def devices_claims() -> list[tuple[str, str]]:
    cpu = _json("results/bench/cpu_2core.json")["device"]
    gpu = _json("results/bench/h200-2026-11-27/devices.json")
    d = cpu["defaults"]
    shown = " ".join(f"{k} = {v}" for k, v in d.items())
    claims = [("devices.md", f"jax {cpu['jax']}: platform {cpu['platform']}, "
                             f"{cpu['device_count']} device(s), {cpu['process_count']} "
                             f"process(es)"),
              ("devices.md", f"defaults (fedjax_dp.core.defaults, docs/devices.md): {shown} "),
              ("devices.md", f"fits {d['chunk_budget_bytes'] // 2**20} MiB of cache; no chunking "
                             f"with fewer than {d['min_chunks']} chunks"),
              ("devices.md", f"host above {d['placement_host_bytes'] // 2**20} MiB")]
    g = gpu["defaults"]
    assert g["chunk_budget_bytes"] * 4 == g["placement_host_bytes"] * 4 == g["device_memory"]
    assert (g["seed_axis"], g["knn_method"]) == ("vmap", "top_k")
    claims += [("devices.md", "no chunking while the agents' working set fits 1/4 of the device "
                              "memory"),
               ("devices.md", "| host above 1/4 of the device memory |")]
    xla = gpu["xla_workarounds"]
    flag = xla["flags"][0]
    assert flag["status"] == "applied" and flag["in_effect"]
    claims.append(("devices.md", f"`XLA flags for platform {xla['platform']} (decided at import, "
                                 f"before any backend started): XLA_FLAGS='{xla['xla_flags']}'`"))
    reason = flag["reason"]
    for pattern in (r"from \d+ to \d+ TFLOP/s", r"\(16 vs\. 8\)", r"exit \d+", r"jax [\d.]+"):
        claims.append(("devices.md", re.search(pattern, reason).group(0)))
    st = _selftest_line("results/bench/h200-2026-11-27/selftest.txt", "dp_fedavg")
    claims.append(("devices.md", f"PASS averaging dp_fedavg acc {st['acc_cpu']}/{st['acc_cpu']} "
                                 f"eps {st['eps']} |p|_1 {st['p1_cpu']}/{st['p1_cpu']} "
                                 f"|p|_2 {st['p2_cpu']}/{st['p2_cpu']}"))
    summary = _text("results/bench/h200-2026-11-27/selftest.txt").splitlines()[-1]
    tolerances = re.search(r"tolerances: [^;]+", summary).group(0)
    claims.append(("devices.md", f"selftest: 9/9 passed (PASS) on cpu:0 vs cpu:0; {tolerances};"))
    return claims


# --- docs/bench.md: the 2-core CPU run's sizes and the busy matmul --------------------------------

def bench_claims() -> list[tuple[str, str]]:
    b = _json("results/bench/cpu_2core.json")
    parts = {p["name"]: p for p in b["parts"]}
    peers = parts["peers_dp_fedavg"]["checks"]["check"]
    published = parts["dp_sgd_step"]["published"]
    lo, hi = published["pytorch_naive"]
    claims = [
        ("bench.md", f"(noiseless all-client round: parameter norm "
                     f"{peers['expected_param_norm']})"),
        ("bench.md", f"(published: about {published['jax']}x in JAX, {lo}-{hi:g}x in naive "
                     f"PyTorch)"),
        ("bench.md", f"A float32 matmul (`n`^3: quick 1024, full {b['matmul']['before']['n']})"),
        ("bench.md", f"N = 10,000 (quick) / {parts['ae_dpfl_end_to_end']['sizes']['agents']:,} "
                     f"(full)"),
        ("bench.md", f"(quick: 3, full: {len(parts['local_training']['times']['vmap']['all_s'])}; "
                     f"the DP-SGD step {parts['dp_sgd_step']['sizes']['repeats']})"),
    ]
    runs = _json("results/bench/kernels_cpu_2026-11-27.json")["bench_runs"].values()
    gflops = [g for r in runs for g in r["matmul_gflops"]]
    loads = [x[0] for r in runs for p in r["parts"] for x in p["load_average_before_after"]]
    claims.append(("bench.md", f"`kernels_cpu_2026-11-27.json` has it at "
                               f"{span(gflops, dec(0))} GFLOP/s under load "
                               f"{span(loads, dec(1))})"))
    return claims


# --- docs/performance.md and docs/getting_started.md ----------------------------------------------

def performance_claims() -> list[tuple[str, str]]:
    """The page's own table has no record (NO_RECORD); it points to the committed bench part."""
    p = next(p for p in _json("results/bench/cpu_2core.json")["parts"]
             if p["name"] == "local_training")
    return [("performance.md", f"{p['sizes']['agents']:,} agents, MLP "
                               f"64-{p['sizes']['hidden']}-10: "
                               f"loop over agents {p['ratios']['loop_agent_over_vmap']:.2f}x, loop "
                               f"over agents and steps {p['ratios']['loop_step_over_vmap']:.2f}x "
                               f"the vectorised path, of medians, under load)")]


def getting_started_claims() -> list[tuple[str, str]]:
    expected = _json("results/configs_expected.json")
    fedavg = expected["configs/fedavg/mnist5k.toml"]
    dp = expected["configs/dp_fedavg/mnist5k.toml"]
    eps = dp["headline"]["epsilon"]
    fnas = expected["configs/fnas/digits_dp.toml"]
    bench = _json("results/isrl/bench_isrl.json")["runs"]
    speedups = [r[k] for r in bench for k in ("speedup_refresh", "speedup_difference")]
    def at_or_below(ds):
        rows = _json(f"results/isrl/seven_epsilon_{ds}.json")["rows"]
        return sum(r["cells"]["isrl_spider"]["test_accuracy_mean"]
                   >= r["cells"]["isrl_mb_sgd"]["test_accuracy_mean"] for r in rows)

    return [
        ("getting_started.md", f"| `fedjax-dp run configs/fedavg/mnist5k.toml` | "
                               f"{f3(fedavg['test_accuracy'])} | none |"),
        ("getting_started.md", f"| `fedjax-dp run configs/dp_fedavg/mnist5k.toml` | "
                               f"{f3(dp['test_accuracy'])} | {eps['rdp']:.2f} (RDP), "
                               f"{eps['pld']:.2f} (PLD) |"),
        *[("getting_started.md", f"| `fedjax-dp run configs/dp_fedavg/mnist5k_{v}.toml` | "
                                 f"{f3(e['test_accuracy'])} | {e['headline']['epsilon']['rdp']:.2f}"
                                 f" (RDP), {e['headline']['epsilon']['pld']:.2f} (PLD) |")
          for v, e in ((v, expected[f"configs/dp_fedavg/mnist5k_{v}.toml"])
                       for v in ("fedavgm", "fedadam", "fedyogi"))],
        ("getting_started.md", f"`epsilon {eps['rdp']:.2f} (agent level, RDP)`"),
        ("getting_started.md", f"reaches {f3(fnas['test_accuracy'])} test accuracy at epsilon "
                               f"{fnas['headline']['epsilon']['pld']:.1f} (PLD, delta 1e-5"),
        ("getting_started.md", f"({at_or_below('wbcd')} of 7 epsilons on WBCD, "
                               f"{at_or_below('mnist5k_oddeven')} of 7 on mnist5k odd/even)"),
        ("getting_started.md", f"({span(speedups, sig)}x <!-- not run by the tests: a "
                               f"benchmark: minutes on 2 cores --> on 2 CPU cores"),
    ]


# --- docs/shuffle_dp.md: the shipped configs' per-coordinate column and the SDP re-run table ------

def shuffle_tables_claims() -> list[tuple[str, str]]:
    expected = _json("results/configs_expected.json")
    claims = []
    for name in ("wbcd_sdp_mb_sgd", "wbcd_sdp_spider", "mnist5k_oddeven_sdp_mb_sgd",
                 "mnist5k_oddeven_sdp_spider"):
        e = expected[f"configs/isrl/{name}.toml"]
        row = _md_row("docs/shuffle_dp.md", f"isrl/{name}")   # the hand-measured cells kept
        row[4] = f"{e['headline']['epsilon']['pld']:.2f}"
        row[7] = f"{f3(e['test_accuracy'])} / {row[7].split(' / ')[1]}"
        claims.append(("shuffle_dp.md", f"| {' | '.join(row)} |"))
    rows = _json("results/sweeps/isrl_sdp/selected.json")
    cell = {(r["base"], r["target_epsilon"], r["algorithm.shuffle_analysis"]): r for r in rows}
    for base, eps, analysis in cell:
        if analysis != "l2":
            continue
        per, l2 = cell[base, eps, "per_coordinate"], cell[base, eps, "l2"]
        text = [f"{f3(r['test_accuracy_mean'])} ± {f3(r['test_accuracy_std'])}" for r in (per, l2)]
        best = int(l2["test_accuracy_mean"] > per["test_accuracy_mean"])
        text[best] = f"**{text[best]}**"
        claims.append(("shuffle_dp.md", f"| {base.split('/')[1]} | {eps:g} | {text[0]} | "
                                        f"{text[1]} |"))
    runs = _runs("isrl_sdp")
    claims.append(("shuffle_dp.md", f"{len(runs)} runs, 48 minutes (wall time noted by hand)"))
    claims.append(("shuffle_dp.md", f"({sum(r['wall_time_s'] for r in runs):,.0f} s of runs in "
                                    f"the records"))
    return claims


# --- docs/fnas.md: Tables 1 and 2, searched vs random, the discriminative experiment --------------

def fnas_page_claims() -> list[tuple[str, str]]:
    page = "fnas.md"
    expected = _json("results/configs_expected.json")["configs/fnas/digits_dp.toml"]
    claims = [(page, f"({f3(expected['test_accuracy'])} at epsilon "
                     f"{expected['headline']['epsilon']['pld']:.1f}, PLD, delta 1e-5;")]
    pld = lambda r: next(e["epsilon"] for e in r["privacy"] if e["accountant"] == "pld")  # noqa
    t1 = {(r["params"]["data.num_agents"], r["params"]["algorithm.private"]): r
          for r in _runs("fnas_table1")}
    for k in (1, 2, 4, 8):
        dp, nodp = t1[k, True], t1[k, False]
        claims.append((page, f"| {k} | {f3(dp['test_accuracy'])} | {dp['epsilon']:.2f} / "
                             f"{pld(dp):.2f} | {f3(nodp['test_accuracy'])} |"))
    t2 = _runs("fnas_table2")
    diag = sorted((r for r in t2 if r["params"]["algorithm.noise_weights"]
                   == r["params"]["algorithm.noise_arch"]),
                  key=lambda r: r["params"]["algorithm.noise_weights"])
    errors = {f3(1 - r["test_accuracy"]) for r in diag}
    assert len(errors) == 1
    claims.append((page, f"Test error {errors.pop()} at every noise level, epsilon (RDP / PLD) "
                         + ", ".join(f"{r['epsilon']:.1f} / {pld(r):.1f}" for r in diag)))
    off = [r for r in t2 if f3(1 - r["test_accuracy"]) != f3(1 - diag[0]["test_accuracy"])]
    assert len(off) == 1
    p = off[0]["params"]
    claims.append((page, f"off the diagonal only sigma = {p['algorithm.noise_weights']:g}, tau = "
                         f"{p['algorithm.noise_arch']:g} ended elsewhere, error "
                         f"{f3(1 - off[0]['test_accuracy'])}"))
    rand = _runs("fnas_random_genotypes")
    arms = {}
    for g, label in (("", "searched (DP search, then DP retraining)"),
                     ("random", "random of the same size (DP retraining only)")):
        runs = sorted((r for r in rand if r["params"]["algorithm.fixed_genotype"] == g),
                      key=lambda r: r["seed"])
        acc = [r["test_accuracy"] for r in runs]
        arms[g] = acc
        claims.append((page, f"| {label} | {', '.join(f3(a) for a in acc)} | "
                             f"{f3(np.mean(acc))} ± {f3(np.std(acc, ddof=1))} | "
                             f"{runs[0]['epsilon']:.2f}"))
    gap = np.mean(arms[""]) - np.mean(arms["random"])
    se = math.sqrt(sum(np.var(a, ddof=1) / len(a) for a in arms.values()))
    claims.append((page, f"by {gap:.2f} with a standard error of {se:.3f}"))
    claims.append((page, f"(3 seeds, 12-30 noised search iterations: {f3(np.mean(arms['']))} ± "
                         f"{f3(np.std(arms[''], ddof=1))} vs {f3(np.mean(arms['random']))} ± "
                         f"{f3(np.std(arms['random'], ddof=1))})"))
    for path in ("results/fnas/results.json", "results/fnas/long/results.json"):
        rv = _json(path)["random_vs_searched"]
        claims.append((page, f"{f3(rv['searched']['mean'])} ± {f3(rv['searched']['std'])} "
                             f"against {f3(rv['random']['mean'])} ± {f3(rv['random']['std'])}"))
    # the discriminative experiment (results/fnas/discriminative.json and the sweep's records)
    d = _json("results/fnas/discriminative.json")
    runs = _runs("fnas_discriminative")
    by_arm = {}
    for r in runs:
        by_arm.setdefault(tuple(r["params"]["algorithm.private+algorithm.fixed_genotype"]),
                          {})[r["seed"]] = r["extras"]["genotype"]
    value = {name: tuple(a["value"]) for name, a in d["arms"].items()}
    for name, a in d["arms"].items():
        genotypes = by_arm[value[name]].values()
        share = [np.mean([np.mean(["pool" in op for op, _ in g[cell]]) for g in genotypes])
                 for cell in ("normal", "reduce")]
        means = ", ".join(f3(a["unit_means"][u]) for u in sorted(a["unit_means"]))
        claims.append((page, f"| {name} | {a['runs']} | {f3(a['pooled_mean'])} ± "
                             f"{f3(a['pooled_std'])} | {f3(a['between_unit_mean'])} ± "
                             f"{f3(a['between_unit_std'])} | {means} | {share[0]:.2f} / "
                             f"{share[1]:.2f} |"))
    t = d["tests"]
    p = lambda name: t[name]["p_value"]                                       # noqa: E731
    diff = lambda name: f"{t[name]['difference']:.3f}"                        # noqa: E731
    claims.append((page, f"DP vs non-private search {diff('DP search vs non-private search')} "
                         f"(p = {p('DP search vs non-private search'):.3f}); DP search vs random "
                         f"{diff('DP search vs random genotype')} (p < 0.001); "
                         f"non-private search vs random "
                         f"{diff('non-private search vs random genotype')} "
                         f"(p = {p('non-private search vs random genotype'):.2f})"))
    assert p("DP search vs random genotype") < 0.001
    within = [a["within_unit_std"] for a in d["arms"].values()]
    dp_units = list(d["arms"]["DP search"]["unit_means"].values())
    dp_eps = {e["epsilon"] for r in runs if r["params"][
        "algorithm.private+algorithm.fixed_genotype"][0] for e in r["privacy"]
        if e["accountant"] == "rdp"}
    search = sorted({r["extras"]["search_time_s"] for r in runs if r["extras"]["search_time_s"]})
    claims += [
        (page, f"retrainings differ by {span(within, f3)} (std)"),
        (page, f"retrained without noise these networks reach {span(dp_units, dec(2))}"),
        (page, f"its within-genotype spread ({f3(d['arms']['DP search']['within_unit_std'])})"),
        (page, f"search epsilon of the DP arm {dp_eps.pop():.1f} at delta 1e-5, RDP"),
        (page, f"{len(runs)} runs, {sum(r['wall_time_s'] for r in runs):,.0f} s of runs"),
        (page, f"took {search[0]:.0f} s, and {search[2]:.0f} s when run again for the second "
               f"retraining seed, the non-private one {search[1]:.0f} s"),
    ]
    return claims


# --- docs/isrl.md: the test-error tables, the reproduction and the paper-silo tables --------------

ISRL_NAMES = {"isrl_spider": "ISRL-DP SPIDER", "isrl_prox_pl_svrg": "ISRL-DP Prox-PL-SVRG",
              "isrl_mb_sgd": "ISRL-DP MB-SGD", "isrl_local_sgd": "ISRL-DP Local SGD",
              "mb_sgd": "MB-SGD (non-private)", "local_sgd": "Local SGD (non-private)"}


# --- docs/fnas.md: which part loses the accuracy (issue 33; results/fnas/causes.json) -------------

FNAS_ARM = "algorithm.private+algorithm.noise_weights+algorithm.noise_arch+algorithm.fixed_genotype"


def _fnas_eps(runs: list[dict]) -> str:
    """An arm's search epsilon as the page writes it: RDP at delta 1e-5, infinite without noise,
    none without a private search."""
    if not runs[0]["params"][FNAS_ARM][0]:
        return "none (no private search)"
    eps = {e["epsilon"] for r in runs for e in r["privacy"] if e["accountant"] == "rdp"}
    return "infinite (no noise)" if eps == {None} else f"{eps.pop():.1f}"


def fnas_causes_claims() -> list[tuple[str, str]]:
    page = "fnas.md"
    runs = _runs("fnas_causes")
    chosen = {tuple(r[FNAS_ARM]): r["selected"]["algorithm.retrain_lr"]
              for r in _json("results/sweeps/fnas_causes/selected.json")}
    d = _json("results/fnas/causes.json")
    claims = []
    for name, a in d["arms"].items():
        arm = tuple(a["value"])
        mine = [r for r in runs if tuple(r["params"][FNAS_ARM]) == arm]
        lr = chosen[arm]
        sel = [r for r in mine if r["params"]["algorithm.retrain_lr"] == lr]
        at01 = [r["test_accuracy"] for r in mine if r["params"]["algorithm.retrain_lr"] == 0.1]
        lrs = sorted({r["params"]["algorithm.retrain_lr"] for r in mine})
        share = [np.mean([np.mean(["pool" in op for op, _ in r["extras"]["genotype"][c]])
                          for r in sel]) for c in ("normal", "reduce")]
        means = ", ".join(f3(a["unit_means"][u]) for u in sorted(a["unit_means"]))
        assert a["units"] == len(sel)
        claims.append((page, f"| {name} | {a['units']} | {_fnas_eps(sel)} | "
                             f"{', '.join(f'{x:g}' for x in lrs)} | {lr:g} | "
                             f"{f3(a['between_unit_mean'])} ± {f3(a['between_unit_std'])} | "
                             f"{means} | {f3(np.mean(at01))} ± {f3(np.std(at01, ddof=1))} | "
                             f"{share[0]:.2f} / {share[1]:.2f} |"))
    for pair, t in d["tests"].items():
        p = t["p_value"]
        claims.append((page, f"{pair}: {t['difference']:+.3f} (p = "
                             f"{sci(p) if p < 0.001 else f'{p:.3f}'})"))
    # the learning-rate edge, checked on the genotypes (fnas_causes_lr_edge)
    edge = _runs("fnas_causes_lr_edge")
    genos = {g: i for i, g in enumerate(dict.fromkeys(
        r["params"]["algorithm.fixed_genotype"] for r in edge))}
    for label, part in (("clip-only", range(0, 5)), ("sigma = 2", range(5, 10))):
        val = {lr: np.mean([r["val_accuracy"] for r in edge
                            if genos[r["params"]["algorithm.fixed_genotype"]] in part
                            and r["params"]["algorithm.retrain_lr"] == lr]) for lr in (0.01, 0.03)}
        claims.append((page, f"{label} genotypes: mean validation accuracy {f3(val[0.01])} at "
                             f"0.01 against {f3(val[0.03])} at 0.03"))
    # the sigma = 1 arm chose 0.01, its smallest rate: checked the same way (0.003 against 0.01)
    edge = _runs("fnas_causes_lr_edge_sigma1")
    val = {lr: np.mean([r["val_accuracy"] for r in edge
                        if r["params"]["algorithm.retrain_lr"] == lr]) for lr in (0.003, 0.01)}
    claims.append((page, f"sigma = 1 genotypes: mean validation accuracy {f3(val[0.003])} at "
                         f"0.003 against {f3(val[0.01])} at 0.01"))
    return claims


def _isrl_results(path: str = "results/isrl/results.json") -> dict:
    return {d["dataset"]: d for d in _json(path)["results"]}


def isrl_page_claims() -> list[tuple[str, str]]:
    page = "isrl.md"
    claims = []
    # the seven-epsilon tables themselves: test_docs_records.isrl_seven_epsilon_claims (the
    # sweeps); the former script's results.json still gives the silos and the variants below
    results = _isrl_results()
    wbcd = results["wbcd"]
    claims += [(page, f"training sizes {wbcd['silo_sizes'][0]} and {wbcd['silo_sizes'][1]}, "
                      f"delta {wbcd['delta']:.2e}):"),
               (page, f"delta {results['mnist5k_oddeven']['delta']:.2e}):")]
    # beta_hat = 1, and M = 12 of 25 (results/isrl/spider_smoothness_1, results/isrl/m12)
    mnist = results["mnist5k_oddeven"]["private"]
    smooth = _isrl_results("results/isrl/spider_smoothness_1/results.json")[
        "mnist5k_oddeven"]["private"]["isrl_spider"]
    pick = lambda rows: " / ".join(f3(r["test_error_mean"]) for r in rows     # noqa: E731
                                   if r["epsilon"] in (0.75, 6.0, 18.0))
    gain = max(b["test_error_mean"] - s["test_error_mean"]
               for s, b in zip(smooth, mnist["isrl_spider"]))
    assert all(s["test_error_mean"] > m["test_error_mean"]
               for s, m in zip(smooth, mnist["isrl_mb_sgd"]))
    claims.append((page, f"beta_hat = 1 lowers SPIDER's error by up to {gain:.3f} ({pick(smooth)} "
                         f"at eps 0.75 / 6 / 18 on mnist, vs {pick(mnist['isrl_spider'])} without)"
                         f" but it stays above MB-SGD's ({pick(mnist['isrl_mb_sgd'])}) everywhere"))
    m12 = _isrl_results("results/isrl/m12/results.json")["mnist5k_oddeven"]
    loss = {a: [m["test_error_mean"] - b["test_error_mean"] for m, b in zip(rows, mnist[a])]
            for a, rows in m12["private"].items()}
    assert all(s["test_error_mean"] > m["test_error_mean"] for s, m in
               zip(m12["private"]["isrl_spider"], m12["private"]["isrl_mb_sgd"]))
    achieved = next(r for r in m12["private"]["isrl_mb_sgd"] if r["epsilon"] == 1.0)
    claims += [
        (page, f"every private method's error rises by "
               f"{span([np.mean(v) for v in loss.values()], dec(2))} on average over "
               f"the 7 epsilons ({span([x for v in loss.values() for x in v], f3)} at one "
               f"epsilon)"),
        (page, f"(e.g. {achieved['achieved_epsilon_rdp_seed0']:.2f} for a target of 1)"),
    ]
    # the reproduction: stage 1 (step size x C) and stage 2 (K x R)
    key = "algorithm.phase_length+algorithm.accounting+algorithm.learning_rate+algorithm.clip_norm"
    variants = ((1, "composed", "q = 1: ISRL-DP MB-SGD"),
                (2, "composed", "q = 2 SPIDER, composed (as it should be run)"),
                (2, "reference", "q = 2 SPIDER, reference (as the authors ran it)"),
                (4, "composed", "q = 4 SPIDER, composed"),
                (4, "reference", "q = 4 SPIDER, reference"))
    sel = {tuple(r[key][:2]): r for r in _json("results/sweeps/isrl_reproduction/selected.json")}
    best = max(r["test_accuracy_mean"] for r in sel.values())
    most = max(r["epsilon_mean"] for r in sel.values())
    for q, acc, label in variants:
        r = sel[q, acc]
        a = f"{f3(r['test_accuracy_mean'])} ± {f3(r['test_accuracy_std'])}"
        e = f"{r['epsilon_mean']:.2f}"
        claims.append((page, f"| {label} | {r[key][2]:g}, {r[key][3]:g} | "
                             f"{r['selected']['algorithm.batch_size']}, "
                             f"{r['selected']['algorithm.rounds']} | "
                             f"{f'**{a}**' if r['test_accuracy_mean'] == best else a} | "
                             f"{f3(1 - r['test_accuracy_mean'])} | "
                             f"{f'**{e}**' if r['epsilon_mean'] == most else e} |"))
    stage1 = {tuple(r["algorithm.phase_length+algorithm.accounting"]): r for r in
              _json("results/sweeps/isrl_reproduction_lr_clip/selected.json")}
    claims.append((page, "R = 50: " + " / ".join(f3(stage1[q, a]["test_accuracy_mean"])
                                                 for q, a, _ in variants) + ")"))
    val = {}
    for r in _runs("isrl_reproduction_lr_clip"):
        p = r["params"]
        k = tuple(p["algorithm.phase_length+algorithm.accounting"]) + (
            p["algorithm.learning_rate"], p["algorithm.clip_norm"])
        val.setdefault(k, []).append(r["val_accuracy"])
    ridge = ", ".join(f"{f3(np.mean(val[2, 'composed', s, c]))} at ({s:g}, {c:g})"
                      for s, c in ((1.0, 0.3), (3.0, 0.1), (10.0, 0.03)))
    claims.append((page, f"x C = 0.3 ({ridge[:ridge.rindex(', ')]}, "
                         f"{ridge[ridge.rindex(', ') + 2:]}):"))
    kval = {}
    for r in _runs("isrl_reproduction"):
        p = r["params"]
        if tuple(p[key][:2]) == (1, "composed") and p["algorithm.rounds"] == 100:
            kval.setdefault(p["algorithm.batch_size"], []).append(r["val_accuracy"])
    claims.append((page, f"(validation accuracy {np.mean(kval[64]):.4f} at K = 64 against "
                         f"{np.mean(kval[96]):.4f} at 96 for q = 1)"))
    tests = _json("results/isrl/reproduction_tests.json")["tests"]
    ref = tests["MB-SGD (q=1) vs SPIDER q=2 reference"]
    q2, q4 = (tests[f"MB-SGD (q=1) vs SPIDER q={q} composed"] for q in (2, 4))
    mb, r2 = sel[1, "composed"], sel[2, "reference"]
    claims += [
        (page, f"SPIDER spends {r2['epsilon_mean']:.2f}x the privacy and is still "
               f"{100 * ref['difference']:.1f} points below MB-SGD ({f3(r2['test_accuracy_mean'])} "
               f"against {f3(mb['test_accuracy_mean'])}; Welch p = {ref['p_value']:.3f} over the 5 "
               f"seeds, bootstrap interval of the difference [{ref['interval'][0]:+.3f}, "
               f"{ref['interval'][1]:+.3f}])"),
        (page, f"SPIDER is {100 * q2['difference']:.1f} (q = 2, p = {q2['p_value']:.3f}) and "
               f"{100 * q4['difference']:.1f} (q = 4, p = {sci(q4['p_value'])}) points below "
               f"MB-SGD"),
    ]
    for name, stage in (("isrl_reproduction_lr_clip", "stage 1 28 min"),
                        ("isrl_reproduction", "stage 2 66 min")):
        runs = _runs(name)
        claims.append((page, f"{stage} ({len(runs):,} runs, "
                             f"{sum(r['wall_time_s'] for r in runs):,.0f} s of runs)"))
    # at the paper's silo size (results/isrl/paper_silos.json)
    silos = _json("results/isrl/paper_silos.json")
    for row in silos["rows"]:
        cells = row["cells"]
        mb, sp = cells["ISRL-DP MB-SGD"], cells["ISRL-DP SPIDER"]
        chosen = lambda c: (f"({c['selected']['algorithm.learning_rate']:g}, "      # noqa: E731
                            f"{c['selected']['algorithm.clip_norm']:g})")
        claims.append((page, f"| {row['row']['target_epsilon']:g} | **"
                             f"{f3(mb['test_accuracy_mean'])} ± {f3(mb['test_accuracy_std'])}** "
                             f"{chosen(mb)} | {f3(sp['test_accuracy_mean'])} ± "
                             f"{f3(sp['test_accuracy_std'])} {chosen(sp)} |"))
    low = silos["rows"][0]["cells"]["ISRL-DP SPIDER"]
    runs = _runs("isrl_paper_silos")
    cost = [r["tuning_cost"]["ISRL-DP MB-SGD"]["epsilon_all"] for r in silos["rows"]]
    other = [r for r in runs if r["target_epsilon"] == 0.75 and r["base"].endswith("spider")
             and r["params"].get("algorithm.learning_rate") == 0.3
             and r["params"].get("algorithm.clip_norm") == 1.0]
    claims += [
        (page, f"(validation {low['val_accuracy_mean']:.5f} against "
               f"{np.mean([r['val_accuracy'] for r in other]):.5f} at step size 0.3, C 1"),
        (page, f"the {len(runs)} runs took {np.mean([r['wall_time_s'] for r in runs]):.1f} s on "
               f"average ({sum(r['wall_time_s'] for r in runs):,.0f} s of runs"),
        (page, f"would cost epsilon {cost[0]:.2f} / {cost[1]:.2f} / {cost[2]:.1f} instead of "
               f"0.75 / 3 / 18"),
    ]
    # the benchmark summary
    bench = _json("results/isrl/bench_isrl.json")["runs"]
    cohort = _json("results/isrl/bench_cohort.json")["runs"]
    rates = _json("results/private_grad/bench_upload_rates.json")["runs"][0]
    big = [r[k] for r in bench if r["silos"] >= 1000 for k in ("speedup_refresh",
                                                                "speedup_difference")]
    masked = [r[k] for r in cohort for k in ("ratio_refresh", "ratio_difference")]
    shares = [rates["sampled_gradient_over_rate_1"], rates["sampled_difference_over_rate_1"]]
    claims += [(page, f"({span(big, sig)}x at 1,000-10,000 silos)"),
               (page, f"({span(masked, dec(0))}x)"),
               (page, f"({span(shares, f3)} of the p = 1 time at p = 0.01;")]
    return claims


# --- docs/fedkt.md: Table 2's selected rows and the figures around Table 1 ------------------------

def fedkt_page_claims() -> list[tuple[str, str]]:
    page = "fedkt.md"
    claims = []

    def eps(r, unit, dependent, accountant):
        return next(e["epsilon"] for e in r["privacy"] if e["unit"] == unit
                    and e["data_dependent"] == dependent and e["accountant"] == accountant)

    rows = {(ds, r["params"]["algorithm.level"], r["params"]["algorithm.gamma"],
             r["params"]["algorithm.query_fraction"]): r
            for ds in ("mnist5k", "digits", "wbcd") for r in _runs(f"fedkt_table2_{ds}")}
    for line in _text("docs/fedkt.md").splitlines():
        m = re.match(r"\| (mnist5k|digits|wbcd) \| (L1|L2) \| ([\d.]+) \| ([\d.]+) \((\d+)\) \|",
                     line)
        if not m:
            continue
        r = rows[m[1], m[2], float(m[3]), float(m[4])]
        cells = " | ".join(f"{eps(r, u, True, 'rdp'):.2f} / {eps(r, u, False, 'pld'):.2f}"
                           for u in ("party", "example"))
        claims.append((page, f"{m[0]} {f3(r['test_accuracy'])} | {cells} |"))
    assert len(claims) == 8
    best = lambda r: min(e["epsilon"] for e in r["privacy"])                  # noqa: E731
    low = [r for (ds, *_), r in rows.items() if ds == "wbcd" and best(r) <= 20]
    good = [r for r in low if r["test_accuracy"] >= 0.8]
    (bad,) = [r for r in low if r["test_accuracy"] < 0.8]
    assert (bad["params"]["algorithm.level"], bad["params"]["algorithm.query_fraction"],
            bad["params"]["algorithm.gamma"]) == ("L1", 0.1, 0.2)
    claims.append((page, f"only the 2-class wbcd reaches "
                         f"{span([r['test_accuracy'] for r in good], dec(2))} at a "
                         f"best reported epsilon (any unit) of "
                         f"{span([best(r) for r in good], sig)}, in {len(good)} of its "
                         f"{len(low)} rows below 20 (the seventh, L1 / 10% / gamma 0.2, stays at "
                         f"{bad['test_accuracy']:.2f})"))
    claims.append((page, f"only the 2-class wbcd reaches "
                         f"{span([r['test_accuracy'] for r in good], dec(2))} at a best reported "
                         f"epsilon of {span([best(r) for r in good], sig)} |"))

    def cells(path):
        out = {}
        for r in read([ROOT / path]):
            key = (r["dataset"], r["config"]["model"]["name"])
            out.setdefault(key, []).append(r["test_accuracy"])
        return {k: np.mean(v) for k, v in out.items()}

    l0, solo = cells("results/fedkt/table1_seeds"), cells("results/sweeps/fedkt_table1_solo")
    pate = cells("results/sweeps/fedkt_table1_pate")
    gains = [100 * (l0[k] - solo[k]) for k in l0]
    claims += [(page, f"FedKT-L0 beats SOLO on every dataset (by {span(gains, dec(0))} "
                      f"points)"),
               (page, f"SOLO (`fedkt_table1_solo.toml`, 2026-11-25) is "
                      f"{span(gains, dec(0))} points below FedKT-L0 on every row"),
               (page, f"It is {100 * (pate['mnist5k', 'mlp'] - l0['mnist5k', 'mlp']):.0f} points "
                      f"below centralized PATE on mnist5k")]
    # the one-round baselines (chosen on validation) and their step grid on digits
    path = [ROOT / "results/fedkt/table1_one_round_seeds"]
    one = {(r["base"].rsplit("_", 1)[1], r["train.prox_mu"]): r["test_accuracy_mean"]
           for r in records.read_selected(path)}
    pair = lambda d: f"{f3(one[d, 0.0])} / {f3(one[d, 0.01])}"               # noqa: E731
    claims.append((page, f"they are ahead of it on digits ({pair('digits')} vs "
                         f"{f3(l0['digits', 'mlp'])}, p 0.52 / 0.71) and on wbcd "
                         f"({pair('wbcd')} vs {f3(l0['wbcd', 'mlp'])}), none significant"))
    grid: dict = {}
    for r in read(path):
        if r["dataset"] == "digits":
            k = (r["params"]["train.prox_mu"], r["params"]["train.steps"])
            grid.setdefault(k, []).append(r)
    mean = lambda k, f: np.mean([r[f] for r in grid[k]])                      # noqa: E731
    claims += [
        (page, f"digits FedProx (10,000, validation {mean((0.01, 10000), 'val_accuracy'):.3f} "
               f"against {mean((0.01, 3000), 'val_accuracy'):.3f} at 3,000"),
        (page, f"({mean((0.0, 300), 'test_accuracy'):.3f} / "
               f"{mean((0.01, 300), 'test_accuracy'):.3f} at 300 steps)"),
    ]
    # the server's labels (FedKT-L0's records) and the ablation (results/sweeps/fedkt_ablation)
    label = {}
    for r in read([ROOT / "results/fedkt/table1_seeds"]):
        if r["config"]["model"]["name"] == "mlp":
            label.setdefault(r["dataset"], []).append(
                100 * r["history"][-1]["server_label_accuracy"])
    pct = lambda d: span(label[d], dec(0))                      # noqa: E731
    claims.append((page, f"(the server's labels are {pct('mnist5k')}% correct on mnist5k's public "
                         f"set, {pct('digits')}% on digits')"))
    ablation = {}
    for r in _runs("fedkt_ablation"):
        ablation.setdefault(r["base"], []).append(r["test_accuracy"])
    ms_ = lambda b: f"{f3(np.mean(ablation[b]))} ± {f3(np.std(ablation[b], ddof=1))}"  # noqa
    claims.append((page, f"logistic {ms_('bases/fedkt_ablation_logistic')}, MLP 100-100 with 100 "
                         f"teacher steps {ms_('bases/fedkt_ablation_mlp_100_steps')}, with 300 "
                         f"(the Table 1 setting) {ms_('fedkt/mnist5k')}, MLP 200-200 with 1500 "
                         f"student steps {ms_('bases/fedkt_ablation_mlp_200_200')}"))
    # the removed script's SOLO column (results/fedkt/table1.md) and the shipped L0 config
    old = {key: _md_row("results/fedkt/table1.md", label)[3].split(" ± ")[0] for key, label in
           ((("mnist5k", "mlp"), "mnist5k (10, mlp 100-100)"), (("digits", "mlp"),
            "digits (5, mlp 100)"), (("wbcd", "mlp"), "wbcd (5, mlp 32)"),
            (("wbcd", "logistic"), "wbcd (5, DT teachers / RF students)"))}
    l0_config = _json("results/configs_expected.json")["configs/fedkt/mnist5k.toml"]
    claims += [(page, f"gave mnist5k {old['mnist5k', 'mlp']}, wbcd {old['wbcd', 'mlp']} / "
                      f"{old['wbcd', 'logistic']}, within one standard deviation of these, and "
                      f"digits {old['digits', 'mlp']} against {f3(solo['digits', 'mlp'])}"),
               (page, f"`fedjax-dp run configs/fedkt/mnist5k.toml` (seed 0) gives "
                      f"{f3(l0_config['test_accuracy'])}")]
    return claims


# --- docs/optimizers.md: the server optimizers at equal epsilon ------------------------------------

#: the sweep's server steps as docs/optimizers.md names them
SERVER_STEPS = {"sgd": "plain step (DP-FedAvg: sgd, rate 1)",
                "sgd_0.1": "FedAvgM (sgd 0.1, momentum 0.9)",
                "adam_0.01": "FedAdam (adam 0.01, eps 1e-3)",
                "yogi_0.01": "FedYogi (yogi 0.01, eps 1e-3)"}


def server_optimizer_claims() -> list[tuple[str, str]]:
    cells, eps = {}, {}
    for r in _runs("server_optimizer_mnist5k"):
        opt = r["params"]["algorithm.server_optimizer"]
        name = opt if isinstance(opt, str) else f"{opt['name']}_{opt['learning_rate']:g}"
        z = r["params"]["algorithm.noise_multiplier"]
        cells.setdefault((SERVER_STEPS[name], z), []).append(r["test_accuracy"])
        eps.setdefault(z, set()).add(round(r["epsilon"], 2))
    assert all(len(e) == 1 for e in eps.values())          # equal epsilon in every cell of a z
    return [("optimizers.md", f"| {label} | {z:g} | {next(iter(eps[z])):.2f} | "
                              f"{np.mean(a):.3f} ± {np.std(a, ddof=1):.3f} |")
            for (label, z), a in sorted(cells.items(), key=lambda c: (-c[0][1], c[0][0]))]


# --- docs/adaptive_clipping.md: the figures read off the table ------------------------------------

def adaptive_clip_text_claims() -> list[tuple[str, str]]:
    from scipy import stats
    page = "adaptive_clipping.md"
    cells, eps, norms, first = {}, {}, [], []
    for name in ("mnist5k", "synthetic"):
        for r in _runs(f"adaptive_clip_{name}"):
            key = (name, r["params"]["algorithm.clip_norm"],
                   bool(r["params"]["algorithm.adaptive_clip"]))
            cells.setdefault(key, []).append(r["test_accuracy"])
            eps.setdefault(name, set()).add((round(r["epsilon"], 2), r["delta"]))
            if name == "mnist5k":
                first.append(r["history"][0]["mean_update_norm"])
                if key[1:] == (0.3, False):
                    norms += [h["mean_update_norm"] for h in r["history"]]
    (m_eps, m_delta), = eps["mnist5k"]
    (s_eps, s_delta), = eps["synthetic"]
    mean = lambda k: np.mean(cells[k])                                         # noqa: E731
    p = lambda a, b: stats.ttest_ind(cells[a], cells[b], equal_var=False).pvalue  # noqa: E731
    clips = lambda n: sorted({k[1] for k in cells if k[0] == n})             # noqa: E731
    adaptive = lambda n: [mean((n, c, True)) for c in clips(n)]              # noqa: E731
    fixed = lambda n: [mean((n, c, False)) for c in clips(n)]                # noqa: E731
    best_s = max(clips("synthetic"), key=lambda c: mean(("synthetic", c, False)))
    best_m = max(clips("mnist5k"), key=lambda c: mean(("mnist5k", c, False)))
    return [
        (page, f"agent epsilon {m_eps:.2f} (PLD, delta {m_delta:.0e}".replace("e-0", "e-")),
        (page, f"agent epsilon {s_eps:.2f} (PLD, delta {s_delta:.0e}".replace("e-0", "e-")),
        (page, f"it reaches {f3(min(adaptive('synthetic')))} to {f3(max(adaptive('synthetic')))}. "
               f"The fixed clip spans {f3(min(fixed('synthetic')))} to "
               f"{f3(max(fixed('synthetic')))} over the same values, and its best value "
               f"(S = {best_s:g}) is level with adaptive (p = "
               f"{p(('synthetic', best_s, True), ('synthetic', best_s, False)):.2f})"),
        (page, f"(their mean norm is about {np.mean(first):.1f} in the first round and "
               f"{np.mean(norms):.1f} over the S = {best_m:g} runs, the history's "
               f"`mean_update_norm`) and reaches {f3(mean(('mnist5k', best_m, False)))}"),
        (page, f"stays between {f3(min(adaptive('mnist5k')))} and {f3(max(adaptive('mnist5k')))} "
               f"from every start, significantly below that best fixed clip (p = "
               f"{p(('mnist5k', best_m, True), ('mnist5k', best_m, False)):.3f}). Against a "
               f"fixed clip near the median (S = 1), it is level (p = "
               f"{p(('mnist5k', 1.0, True), ('mnist5k', 1.0, False)):.2f})"),
    ]


# --- docs/privacy_units.md and docs/distributed_dp.md: the participation figures ------------------

def participation_text_claims() -> list[tuple[str, str]]:
    z, acc = {}, {}
    for name in ("mnist5k", "synthetic"):
        for r in _runs(f"participation_{name}"):
            arm = ("poisson" if r["base"].endswith("_independent")
                   else r["base"].rsplit("_", 1)[1])
            key = (name, r["target_epsilon"])
            z[key + (arm,)] = r["calibrated"]["value"]
            acc.setdefault(key + (arm,), []).append(r["test_accuracy"])
    cells = {k[:2] for k in z}
    ratio = [z[k + ("fixed",)] / z[k + ("poisson",)] for k in cells]
    drop = [np.mean(acc[k + ("poisson",)]) - np.mean(acc[k + ("fixed",)]) for k in cells]
    times = f"{span(ratio, dec(1), ' to ')} times the noise multiplier"
    central = {}
    for name in ("mnist5k", "synthetic"):
        central[name] = {r["calibrated"]["value"] for r in _runs(f"distributed_dp_{name}")
                         if r["params"]["algorithm.distributed_noise"] == "none"}.pop()
    config = _json("results/configs_expected.json")["configs/dp_fedavg/mnist5k.toml"]
    eps = config["headline"]["epsilon"]
    return [
        ("privacy_units.md", f"They need {times}"),
        ("privacy_units.md", f"Accuracy drops by {span(drop, dec(2), ' to ')}."),
        ("privacy_units.md", f'"epsilon": {eps["rdp"]:.2f}, "delta": 1e-05, "accountant": "rdp"'),
        ("privacy_units.md", f"# {eps['pld']:.2f} for the PLD row above"),
        ("distributed_dp.md", f"fixed cohorts need {times} at equal epsilon"),
        ("distributed_dp.md", f"(z 1.90 against {central['mnist5k']:.3f}; 3.65 against "
                              f"{central['synthetic']:.3f})"),
        ("distributed_dp.md", f"dp-accounting's Gaussian needs z = "
                              f"{z['mnist5k', 6.0, 'fixed']:.2f} and the general bound"),
    ]


# --- docs/scale.md --------------------------------------------------------------------------------

def scale_page_claims() -> list[tuple[str, str]]:
    page = "scale.md"
    cli = _json("results/scale/oneshot_cli.json")["rows"][0]
    check = _json("results/scale/bench_scale.json")["peers"]["check"]
    gpu = _json("results/bench/h200-2026-11-27/ae_dpfl_1e7_cli.json")
    options = gpu["config_overrides"]["dataset_options"]
    features = options["num_train"] * options["num_features"] * 4
    scale = gpu["num_agents"] / cli["num_agents"]          # the same agents, 10x as many
    return [
        (page, f"holds {cli['num_agents']:,} agents x 16 records x 32 features "
               f"({cli['data_bytes'] / 2 ** 30:.2f} GiB with labels and masks)"),
        (page, f"reference parameter norm, {check['expected_param_norm']} (it does: "
               f"{check['param_norm']}, loss {check['loss_all']})"),
        (page, f"holds {features / 1e9:.1f} GB of features on the device "
               f"({scale * cli['data_bytes'] / 1e9:.1f} GB with labels and masks"),
        (page, f"(44.3 s, {gpu['timing']['compilations']} compilations, 8.9 GB peak host RSS"),
    ]


def _selected_folders() -> list:
    return sorted(p.parent for p in (ROOT / "results" / "sweeps").glob("*/selected.json"))


def _reselect(folder) -> tuple[list, list]:
    """(committed selected.json rows, the same selection recomputed from the folder's records)."""
    from fedjax_dp.experiments import sweep
    rows = _json(str((folder / "selected.json").relative_to(ROOT)))
    metric = next(k[:-5] for k in rows[0] if k.endswith("_mean")
                  and k not in ("test_accuracy_mean", "epsilon_mean"))
    return rows, sweep.select(_runs(folder.name), metric, list(rows[0]["selected"]))


def grid_edge_claims() -> list[tuple[str, str]]:
    """docs/reproducibility.md's table of the selections at a grid edge, one row per sweep
    folder with a selection: its cells, how many sit at an edge, and which keys and sides
    (``sweep.grid_edges``), recomputed from the records."""
    claims = []
    for folder in _selected_folders():
        _, rows = _reselect(folder)
        sides: dict[str, int] = {}
        for r in rows:
            for e in filter(None, r["at_edge"].split("; ")):
                sides[e] = sides.get(e, 0) + 1
        edges = ", ".join(f"{k} ({n})" for k, n in sorted(sides.items())) or "none"
        claims.append(("reproducibility.md",
                       f"| `{folder.name}` | {len(rows)} | "
                       f"{sum(bool(r['at_edge']) for r in rows)} | {edges} |"))
    return claims


@pytest.mark.parametrize("folder", _selected_folders(), ids=lambda f: f.name)
def test_selected_json_is_the_selection_of_its_records(folder):
    """Every committed selection, with its at_edge field, is what the records select today."""
    committed, recomputed = _reselect(folder)
    assert committed == json.loads(json.dumps(recomputed)), folder.name


def robustness_claims() -> list[tuple[str, str]]:
    """docs/runs.md's signal-storm and disk-full figures, from their records (every try
    stopped in one line and resumed to the uninterrupted result, or the claim is not made)."""
    storm = _json("results/robustness/signal_storm.json")
    s = storm["summary"]
    assert s["all_stopped_ok"] and s["all_resumed_equal"]
    assert set(s["aimed"].values()) == {s["tries_per_signal"] // 2}       # five per phase
    full = _json("results/robustness/disk_full.json")["summary"]
    assert full["all_one_line"] and full["all_resumed_equal"]
    assert full["all_results_absent_or_valid"]
    n = 2 * s["tries_per_signal"]
    return [
        ("runs.md", f"sends SIGINT and SIGTERM {s['tries_per_signal']} times each to a small run, "
                    f"five in each phase"),
        ("runs.md", f"{n} of {n} ended in one line with "
                    f"{' / '.join(str(c) for c in s['exit_status'])} and resumed to the "
                    f"uninterrupted run's result"),
    ]


# --- docs/benchmarks/shakespeare.md: Reddi et al.'s row and DP-FL on the Gutenberg text ---------

#: the server steps of configs/experiments/shakespeare_server_optimizers.toml as the page names
#: them, with Reddi et al.'s Table 2 Shakespeare cell where the page quotes one
REDDI_ROW = {"sgd": ("FedAvg", "sgd 1", "56.9"),
             "sgd_0.316": ("FedAvgM", "sgd 0.316, momentum 0.9", "not quoted"),
             "adam_0.01": ("FedAdam", "adam 0.01, tau 1e-3", "57.0"),
             "yogi_0.01": ("FedYogi", "yogi 0.01, tau 1e-3", "not quoted"),
             "adagrad_0.316": ("FedAdagrad", "adagrad 0.316, tau 0.1", "not quoted")}


def _optimizer_name(opt) -> str:
    return opt if isinstance(opt, str) else f"{opt['name']}_{opt['learning_rate']:g}"


def _pct(a) -> str:
    """mean ± sample std in percent, one decimal (3 seeds)."""
    return f"{100 * np.mean(a):.1f} ± {100 * np.std(a, ddof=1):.1f}"


def shakespeare_reproduction_claims() -> list[tuple[str, str]]:
    page = "docs/benchmarks/shakespeare.md"
    cells: dict = {}
    for r in _runs("shakespeare_server_optimizers"):
        cells.setdefault(_optimizer_name(r["params"]["algorithm.server_optimizer"]), []).append(r)
    assert set(cells) == set(REDDI_ROW) and all(len(v) == 3 for v in cells.values())
    claims = []
    for name, (label, step, paper) in REDDI_ROW.items():
        runs = cells[name]
        assert sorted(r["seed"] for r in runs) == [0, 1, 2] and not any(r["privacy"] for r in runs)
        at = {h["round"]: [] for h in runs[0]["history"] if "test_accuracy" in h}
        for r in runs:
            for h in r["history"]:
                if "test_accuracy" in h:
                    at[h["round"]].append(h["test_accuracy"])
        curve = " / ".join(_pct(at[t]) for t in sorted(at))
        claims.append((page, f"| {label} | {step} | {paper} | "
                             f"{_pct([r['test_accuracy'] for r in runs])} | {curve} |"))
    mean = {k: 100 * np.mean([r["test_accuracy"] for r in v]) for k, v in cells.items()}
    gains = []
    for runs in cells.values():
        by_round = {}
        for r in runs:
            for h in r["history"]:
                if "test_accuracy" in h:
                    by_round.setdefault(h["round"], []).append(h["test_accuracy"])
        gains.append(100 * (np.mean(by_round[150]) - np.mean(by_round[100])))
    assert max(100 * np.std([r["test_accuracy"] for r in v], ddof=1)
               for v in cells.values()) < 1
    wall = np.mean([r["wall_time_s"] for v in cells.values() for r in v])
    first = [r["history"][0]["mean_update_norm"] for v in cells.values() for r in v]
    later = [h["mean_update_norm"] for v in cells.values() for r in v for h in r["history"]
             if h["round"] >= 50 and "mean_update_norm" in h]
    claims.append((page, f"mean update norm is {min(first):.2f}-{max(first):.2f} in round 1, "
                         f"with a median of {np.median(later):.2f} from round 50 on"))
    claims += [
        (page, f"FedAvg {56.9 - mean['sgd']:.1f} points below its cell, FedAdam "
               f"{57.0 - mean['adam_0.01']:.1f} points below its cell"),
        (page, f"the curves still climb {min(gains):.1f}-{max(gains):.1f} points from round 100 "
               f"to round 150"),
        (page, f"FedAvgM by {mean['sgd_0.316'] - mean['sgd']:.1f} points and FedAdam by "
               f"{mean['adam_0.01'] - mean['sgd']:.1f} points over FedAvg at round 150"),
        (page, f"A run takes {wall:.0f} s on this CPU"),
    ]
    dp: dict = {}
    for r in _runs("shakespeare_dp"):
        key = (_optimizer_name(r["params"]["algorithm.server_optimizer"]), r["target_epsilon"])
        dp.setdefault(key, []).append(r)
    for r in _runs("shakespeare_dp_mechanisms"):
        arm = "adaptive_clip" if "adaptive" in r["base"] else "banded_mf"
        dp.setdefault((arm, r["target_epsilon"]), []).append(r)
    labels = {"sgd": "DP-FedAvg (sgd 1)", "adam_0.01": "DP-FedAdam (adam 0.01, tau 1e-3)",
              "adaptive_clip": "DP-FedAdam, adaptive clipping",
              "banded_mf": "DP-FedAdam, banded MF (3 bands)"}
    for (name, target), runs in sorted(dp.items(), key=lambda c: (c[0][1], list(labels).index(
            c[0][0]))):
        assert len(runs) == 3 and all(abs(r["epsilon"] - target) <= 0.01 * target for r in runs)
        z = {round(r["calibrated"]["value"], 3) for r in runs}
        assert len(z) == 1
        claims.append((page, f"| {target:g} | {labels[name]} | {next(iter(z)):.3f} | "
                             f"{_pct([r['test_accuracy'] for r in runs])} |"))
    reference = _runs("shakespeare_dp_reference")
    assert len(reference) == 3 and all(r["epsilon"] is None and
                                       r["config"]["algorithm"]["noise_multiplier"] == 0.0
                                       for r in reference)
    claims.append((page, f"| none | DP-FedAvg's rounds without noise (z = 0) | 0 | "
                         f"{_pct([r['test_accuracy'] for r in reference])} |"))
    acc = {k: 100 * np.mean([r["test_accuracy"] for r in v]) for k, v in dp.items()}
    loss = {k: np.mean([r["history"][-1]["train_loss"] for r in v]) for k, v in dp.items()}
    fedavg = [acc["sgd", t] for t in (2.0, 5.0, 10.0)]
    fedadam = [acc["adam_0.01", t] for t in (2.0, 5.0, 10.0)]
    z = {k: v[0]["calibrated"]["value"] for k, v in dp.items()}
    assert np.std([r["test_accuracy"] for r in dp["banded_mf", 5.0]]) < 1e-3   # one predictor
    claims += [
        (page, f"{min(fedavg):.1f}-{max(fedavg):.1f}% against "
               f"{100 * np.mean([r['test_accuracy'] for r in reference]):.1f}% at z = 0"),
        (page, f"(35.1% after 150 rounds of 10 clients)"),
        (page, f"falls far behind, at {min(fedadam):.1f}-{max(fedadam):.1f}%"),
        (page, f"({acc['adaptive_clip', 5.0]:.1f}% against {acc['adam_0.01', 5.0]:.1f}% at "
               f"epsilon 5)"),
        (page, f"it always predicts the space, {acc['banded_mf', 5.0]:.1f}% of the test targets, "
               f"and its training loss ends near {loss['banded_mf', 5.0]:.1f} where DP-FedAvg's "
               f"reaches {loss['sgd', 5.0]:.1f}"),
        (page, f"same epsilon ({z['banded_mf', 5.0]:.3f} against {z['adam_0.01', 5.0]:.3f})"),
    ]
    assert f"{np.mean([r['test_accuracy'] for r in cells['sgd']]) * 100:.1f}" == "35.1"
    return claims

# --- docs/benchmarks/shakespeare.md: the Gutenberg conversion's statistics --------------------

def shakespeare_data_claims() -> list[tuple[str, str]]:
    r = _json("results/benchmarks/shakespeare_gutenberg_stats.json")
    st, leaf, page = r["statistics"], r["published"]["leaf"], "docs/benchmarks/shakespeare.md"
    spu = st["samples_per_user"]
    assert (leaf["users"], leaf["samples"]) == (1129, 4226158)
    assert r["differences"]["users"] == st["users"] - 1129
    assert len(r["source"]["texts"]) == st["texts"] == 42 and st["plays"] == 37
    gb = r["conversion"]["clients"] * r["conversion"]["n_max"] * 80 * 4 / 1e9
    claims = [
        (page, f"| users (one per role in a play) | {st['users']:,} | 1,129 | 715 |"),
        (page, f"| samples (80-character windows) | {st['samples']:,} | 4,226,158 |"),
        (page, f"| samples per user: mean, std | {spu['mean']:,.1f}, {spu['std']:,.1f} | "
               f"3,743.2, 6,212.26 |"),
        (page, f"| samples per user: min / median / max | {spu['min']:,} / {spu['median']:,.0f} "
               f"/ {spu['max']:,} |"),
        (page, f"| roles found / dropped (two lines or fewer) / dropped (no sample) | "
               f"{st['roles']:,} / {st['roles_dropped_two_lines_or_fewer']} / "
               f"{st['roles_dropped_no_sample']} |"),
        (page, f"| texts without a role (dropped) | {len(st['texts_dropped'])}: "
               f"{', '.join(st['texts_dropped'])} |"),
        (page, f"land {st['users'] - 1129:+d} users and "
               f"{100 * (st['samples'] / 4226158 - 1):+.1f}% samples from LEAF"),
        (page, f"the {st['texts']} Gutenberg texts in modern spelling, of which {st['plays']} are "
               f"plays"),
        (page, f"pads every client to the largest one ({r['conversion']['n_max']:,} windows), so "
               f"`x.npy` and `y.npy` are {gb:.1f} GB each"),
    ]
    for (kind, f), sp in ((k.split("_"), v) for k, v in r["splits"].items()):
        tr, te = sp["train"], sp["test"]
        leaf_note = " (LEAF: 660 users)" if (kind, f) == ("sample", "0.9") else ""
        default = " (the default)" if (kind, f) == ("sample", "0.8") else ""
        claims.append((page, f"| {kind}, {f}{default} | {tr['clients']:,}{leaf_note} | "
                             f"{tr['samples']:,} | {te['clients']:,} | {te['samples']:,} |"))
    claims.append((page, f"with `--tf 0.9` (LEAF's script default) "
                         f"{r['splits']['sample_0.9']['train']['clients']} clients keep test "
                         f"samples here"))
    q = r["splits"]["sample_0.8"]["train"]["samples_per_client"]
    assert q == st["split"]["train"]["samples_per_client"]
    claims.append((page, f"Samples per training client in the default split (sample, 0.8): min "
                         f"{q['min']:,}, p10 {q['p10']:,}, p25 {q['p25']:,}, median "
                         f"{q['median']:,}, p75 {q['p75']:,}, p90 {q['p90']:,}, max "
                         f"{q['max']:,}"))
    return claims

CLAIMS = (secagg_claims() + audit_claims() + devices_claims() + bench_claims()
          + performance_claims() + getting_started_claims() + shuffle_tables_claims()
          + fnas_page_claims() + fnas_causes_claims() + isrl_page_claims() + fedkt_page_claims()
          + adaptive_clip_text_claims() + participation_text_claims() + scale_page_claims()
          + grid_edge_claims() + robustness_claims() + server_optimizer_claims()
          + shakespeare_data_claims() + shakespeare_reproduction_claims())

# Figures a page quotes with no committed record behind them: the page must say so, in these
# words (a record committed later replaces the sentence with a claim above).
NO_RECORD = [
    ("audit.md", "the 2.17 was computed by hand with the accountant and is in no committed record"),
    ("devices.md", "the driver as noted by hand in that session: no committed record holds it"),
    ("devices.md", "checked by hand on 2026-11-27 with jax 0.10.2, versions not kept in a "
                   "committed record"),
    ("devices.md", "its timings and the summary's 62.7 s were measured by hand on the 2-core CPU "
                   "and are in no committed record"),
    ("devices.md", "these times measured by hand, no committed record"),
    ("devices.md", "(measured by hand, no committed record: 1000 agents x 20 steps of an MLP"),
    ("bench.md", "the matmul reached 86-99 GFLOP/s, against about 435 idle, in runs measured by "
                 "hand and not committed"),
    ("performance.md", "No record of this table is committed"),
    ("getting_started.md", "the accuracy and time from a run by hand, in no committed record"),
    ("getting_started.md", "the centralised reference was measured by hand and is in no "
                           "committed record"),
    ("shuffle_dp.md", "the other columns were measured by hand and are in no committed record"),
    ("shuffle_dp.md", "these ratios computed by hand, in no committed record"),
    ("shuffle_dp.md", "no record of this table or of the sampled figure below is committed"),
    ("shuffle_dp.md", "48 minutes (wall time noted by hand)"),
    ("fnas.md", "loaded machine; measured by hand, no committed record)"),
    ("fnas.md", "a 5-seed search of 60 epochs, noted by hand)"),
    ("fnas.md", "from 00:12 to 02:17 (noted by hand, not in the records)"),
    ("isrl.md", "these ratios were computed by hand with the accountant, no committed record"),
    ("fedkt.md", "a run by hand whose records were not committed"),
    ("fedkt.md", "(timed by hand, no committed record)"),
    ("fedkt.md", "(the command's output, by hand: no committed record)"),
    ("distributed_dp.md", "the general bound's z, here and in the match above, computed by hand: "
                          "no committed record"),
    ("scale.md", "the 44.3 s and the 8.9 GB noted by hand, not in the run's record"),
    ("sweeps.md", "(timed by hand, no committed record)"),
    ("tracking.md", "(measured by hand on a loaded 2-core CPU, no committed record)"),
    ("runs.md", "(its output and the figures below noted by hand, no committed record)"),
    ("own_model_and_data.md", "(run by hand, no committed record)"),
]

# Every page with a results table or a figure taken from a committed record.
RESULT_PAGES = {
    "index.md", "reproducibility.md", "voting_dpfl.md", "fnas.md", "isrl.md", "fedkt.md",
    "shuffle_dp.md", "adaptive_clipping.md", "audit.md", "correlated_noise.md",
    "distributed_dp.md", "privacy_units.md", "secagg.md", "devices.md", "bench.md",
    "performance.md", "getting_started.md", "results/sweeps/README.md", "optimizers.md",
    "results/bench/README.md", "results/private_grad/README.md", "results/isrl/README.md",
    "results/fedkt/README.md", "results/scale/README.md", "results/fnas/README.md",
    "scale.md", "results/bench/h200-2026-11-27/README.md",
    "results/bench/h200-2026-11-27-rooms/README.md", "results/voting_dpfl/README.md",
    "runs.md",
}

# Every other docs page and results README, and why it has no checked figure.
OTHER_PAGES = {
    "protocol.md": "the algorithm protocol: no results",
    "mechanisms.md": "which stages compose: a table generated from the stages' requirements "
                     "(tests/test_stage_matrix.py checks it is current); no results",
    "sweeps.md": "the sweep and plot commands: example output; one timing (NO_RECORD)",
    "tracking.md": "experiment trackers: one accounting cost (NO_RECORD)",
    "own_model_and_data.md": "your own model and data: the example's full-size output (NO_RECORD)",
    "results/plots/README.md": "an example figure of fedjax-dp plot and its command: it draws a "
                               "committed sweep's records and states no result of its own",
}


def _pages() -> set[str]:
    docs = {p.name for p in (ROOT / "docs").glob("*.md")}
    readmes = {str(p.relative_to(ROOT)) for p in (ROOT / "results").rglob("README.md")}
    return docs | readmes


@pytest.mark.parametrize("page, text", CLAIMS, ids=[f"{p}:{t[:40]}" for p, t in CLAIMS])
def test_page_quotes_the_records(page, text):
    assert " ".join(text.split()) in _page(page), f"{page} does not say: {text}"


@pytest.mark.parametrize("page, text", NO_RECORD, ids=[f"{p}:{t[:40]}" for p, t in NO_RECORD])
def test_page_says_which_figures_have_no_record(page, text):
    assert " ".join(text.split()) in _page(page), f"{page} does not say: {text}"


@pytest.mark.parametrize("page", sorted(RESULT_PAGES))
def test_every_page_with_results_has_checked_claims(page):
    checked = {p for p, _ in RESULTS_CLAIMS + README_CLAIMS + CLAIMS}
    assert page in checked, f"{page} has results but no claim checks them against a record"


def test_every_page_is_listed_as_with_or_without_results():
    assert not RESULT_PAGES & set(OTHER_PAGES)
    assert _pages() == RESULT_PAGES | set(OTHER_PAGES), (
        "a docs page or results README is in neither RESULT_PAGES nor OTHER_PAGES: "
        f"{sorted(_pages() ^ (RESULT_PAGES | set(OTHER_PAGES)))}")
