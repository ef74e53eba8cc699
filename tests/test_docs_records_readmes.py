"""The figures of the results folders' READMEs agree with the committed records they describe:
as in ``test_docs_records``, every figure below is computed here from a record under
``results/`` and must stand, as written here, on the README that quotes it; a figure with no
committed record must be marked so on the page (``NO_RECORD``). Reads files only."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest

from test_docs_records import (_json, _md_row, _page, _runs, _text, dec, f3, like, row_claim,
                               sci, sig, span)


# --- results/bench/README.md: the 2-core CPU run, the command line's round, the kernels note ------

def bench_readme_claims() -> list[tuple[str, str]]:
    page = "results/bench/README.md"
    b = _json("results/bench/cpu_2core.json")
    parts = {p["name"]: p for p in b["parts"]}
    claims = []
    for p in b["parts"]:
        for name, value in p["ratios"].items():
            claims.append((page, f"| {p['name']} | `{name}` | {value:.3g} | "
                                 f"{p['ratios_of_minima'][name]:.3g} |"))
    loads = [p["load_average_before_after"][0][0] for p in b["parts"]]
    loads.append(b["parts"][-1]["load_average_before_after"][1][0])
    gflops = b["matmul"]["all_gflops"]
    ae = parts["ae_dpfl_end_to_end"]
    peers = parts["peers_dp_fedavg"]["checks"]["check"]
    dp_sgd = parts["dp_sgd_step"]
    dp_sgd_ratios = [dp_sgd["ratios_of_minima"]["private_over_non_private"],
                     dp_sgd["ratios"]["private_over_non_private"]]
    claims += [
        (page, f"at the start of each part and at the end: {', '.join(f'{x:.1f}' for x in loads)}"
               f" (2 cores)"),
        (page, f"reached {span(gflops, dec(0))} GFLOP/s"),
        (page, f"Started {b['started']}, took {b['total_s']:.0f} s."),
        (page, f"{ae['times']['end_to_end']['median_s']:.1f} s end to end after a warm-up run "
               f"({ae['times']['end_to_end']['first_s']:.1f} s for the first, compiling run), "
               f"{ae['rates']['agents_per_s']:.0f} agents/s."),
        (page, f"parameter norm {peers['param_norm']:.6f}, expected "
               f"{peers['expected_param_norm']}"),
        (page, f"(this run: {span(dp_sgd_ratios, dec(1))}x"),
    ]
    # the command line's round on the CPU (cli_rounds_cpu_2026-11-27.json)
    cli = _json("results/bench/cli_rounds_cpu_2026-11-27.json")
    r10, r1000 = cli["rates"]["0.01"], cli["rates"]["1.0"]
    assert r10["compilations_after_first_call"] == r1000["compilations_after_first_call"] == 0
    load = [cli["machine"]["load_avg"][0], cli["load_avg_end"][0]]
    claims += [
        (page, f"q = 0.01 (cohort {r10['cohort']}) {1e3 * r10['cli_s_per_round']:.2f} vs "
               f"{1e3 * r10['reference_median_s']:.2f} ms ({r10['cli_over_reference']:.2f}x), "
               f"q = 1 (cohort {r1000['cohort']:,}) {1e3 * r1000['cli_s_per_round']:.0f} vs "
               f"{1e3 * r1000['reference_median_s']:.0f} ms ({r1000['cli_over_reference']:.2f}x)"),
        (page, f"(load average {round(min(load))}-{round(max(load))} on 2 cores"),
    ]
    # the char-LSTM round (char_lstm/quick_cpu_2026-12-02.json)
    lstm = _json("results/bench/char_lstm/quick_cpu_2026-12-02.json")["parts"][0]
    assert lstm["name"] == "char_lstm_round"
    t = lstm["times"]
    claims.append((page, "Seconds per round, median (min): the library (`char_lstm`, its "
                         f"`lstm_layer`) {t['library_c10']['median_s']:.2f} "
                         f"({t['library_c10']['min_s']:.2f})"))
    claims.append((page, f"layer {t['flax_layer_c10']['median_s']:.2f} "
                         f"({t['flax_layer_c10']['min_s']:.2f}), a hand-written"))
    claims.append((page, f"round {t['hand_scan_c10']['median_s']:.2f} "
                         f"({t['hand_scan_c10']['min_s']:.2f})."))
    for name, value in lstm["ratios"].items():
        claims.append((page, f"`{name}` {value:.3f} / {lstm['ratios_of_minima'][name]:.3f}"))
    # the kernels note (kernels_cpu_2026-11-27.json and .md)
    ab = _json("results/bench/kernels_cpu_2026-11-27.json")["in_process_ab"]["dp_sgd_step_b128"]
    wall = ab["seconds"]["wall_median"]
    note = "results/bench/kernels_cpu_2026-11-27.md"

    def medians(row, column):      # the medians of a "median (min); median (min)" cell
        return [float(x) for x in re.findall(r"([\d.]+) \(", _md_row(note, row)[column])]

    before = (medians("one process, private / non-private, wall: median (min)", 1)
              + medians("one process, private / non-private, CPU: median (min)", 1))
    after = (medians("one process, private / non-private, wall: median (min)", 2)
             + medians("one process, private / non-private, CPU: median (min)", 2))
    knn = medians("one process, 200 agents x 500 queries, after / before: CPU median (min)", 2)
    one = dec(1)                                                # noqa: E731
    claims.append((page, f"DP-SGD private / non-private {span(before, one)} -> "
                         f"{span(after, one)} (after / before "
                         f"{wall['private_after'] / wall['private_before']:.2f}); the kNN vote "
                         f"unchanged on the CPU ({span(knn, dec(2))}"))
    return claims


# --- results/sweeps/README.md (not its voting rows: those sweeps are being re-run) ----------------

def _sweep_row(name: str, runs: list[dict]) -> str:
    return f"| `{name}` | {len(runs):,} | {sum(r['wall_time_s'] for r in runs):,.0f} |"


def _pld_party(r: dict) -> float:
    return next(e["epsilon"] for e in r["privacy"] if e["unit"] == "party"
                and e["accountant"] == "pld" and not e["data_dependent"])


def sweeps_readme_claims() -> list[tuple[str, str]]:
    page = "results/sweeps/README.md"
    claims = []
    # FedKT Table 2: the sweep against the removed script's table (results/fedkt/table2.md)
    script = "results/fedkt/table2.md"
    for ds in ("wbcd", "digits", "mnist5k"):
        runs = _runs(f"fedkt_table2_{ds}")
        claims.append((page, _sweep_row(f"fedkt_table2_{ds}", runs)))
        cells = {}
        for r in runs:
            p = r["params"]
            q = p["algorithm.query_fraction"]
            row = next(x for x in _text(script).splitlines() if x.startswith(
                f"| {ds} | {p['algorithm.level']} | {p['algorithm.gamma']} | {q} ("))
            row = [c.strip() for c in row.strip("|").split("|")]
            cells[(p["algorithm.level"], q, p["algorithm.gamma"])] = (r, float(row[4]),
                                                                    row[5].split(" / ")[2])
            assert f"{_pld_party(r):.2f}" == row[5].split(" / ")[2]   # the same PLD epsilon
        moved = {k: abs(round(r["test_accuracy"], 3) - acc) for k, (r, acc, _) in cells.items()}
        if ds == "wbcd":
            r, acc, pld = cells[("L1", 0.1, 0.2)]
            worst = max(moved, key=moved.get)
            assert worst == ("L2", 0.1, 0.2)
            r2, acc2, _ = cells[worst]
            claims += [(page, f"(e.g. L1, 10% of the public set, gamma 0.2: {pld} in both)"),
                       (page, f"except L2 / 10% / gamma 0.2 ({f3(r2['test_accuracy'])} against "
                              f"{f3(acc2)})")]
        if ds == "digits":
            r, _, pld = cells[("L1", 0.05, 0.2)]
            rdp_over = max(r["epsilon"] / _pld_party(r) - 1 for r, _, _ in cells.values())
            claims.append((page, f"the data-independent party epsilons (PLD) agree again ({pld} "
                                 f"in both at L1 / 5% / 0.2; the sweep's headline is RDP, up to "
                                 f"{100 * rdp_over:.1f}% above: {r['epsilon']:.2f} there), "
                                 f"accuracies move by up to {max(moved.values()):.2f} in either "
                                 f"direction"))
    # ISRL baselines against results/isrl/results.json's non-private rows
    base = {r["base"]: r for r in _json("results/sweeps/isrl_baselines/selected.json")}
    old = {d["dataset"]: d["non_private"] for d in _json("results/isrl/results.json")["results"]}
    acc = lambda b: f3(base[f"isrl/{b}"]["test_accuracy_mean"])               # noqa: E731
    was = lambda d, a: f3(1 - old[d][a]["test_error_mean"])                   # noqa: E731
    claims += [(page, _sweep_row("isrl_baselines", _runs("isrl_baselines"))),
               (page, f"test accuracy {acc('wbcd_mb_sgd')} / {acc('wbcd_local_sgd')} on wbcd "
                      f"(script {was('wbcd', 'mb_sgd')} / {was('wbcd', 'local_sgd')}), "
                      f"{acc('mnist5k_oddeven_mb_sgd')} / {acc('mnist5k_oddeven_local_sgd')} on "
                      f"mnist5k odd-even (script MB-SGD {was('mnist5k_oddeven', 'mb_sgd')})")]
    # DP-FNAS Tables 1 and 2 and the random genotypes against results/fnas/table.md
    table = "results/fnas/table.md"
    t1 = _runs("fnas_table1")
    moved = [abs(round(r["test_accuracy"], 3) - float(_md_row(
        table, str(r["params"]["data.num_agents"]), str(r["params"]["algorithm.private"]))[2]))
        for r in t1]
    k = {(r["params"]["data.num_agents"], r["params"]["algorithm.private"]): r for r in t1}
    claims += [(page, _sweep_row("fnas_table1", t1)),
               (page, f"test accuracy within {max(moved):.3f} at every K (e.g. K = 4 private: "
                      f"{f3(k[4, True]['test_accuracy'])} in both); the sweep's headline epsilon "
                      f"is RDP ({k[1, True]['epsilon']:.2f} at K = 1), the script's PLD "
                      f"({_md_row(table, '1', 'True')[3]}, also in the sweep's `privacy` list)")]
    assert f"{[e for e in k[1, True]['privacy'] if e['accountant'] == 'pld'][0]['epsilon']:.2f}" \
        == _md_row(table, "1", "True")[3]
    t2 = _runs("fnas_table2")
    diag = {r["params"]["algorithm.noise_weights"]: r for r in t2
            if r["params"]["algorithm.noise_weights"] == r["params"]["algorithm.noise_arch"]}
    errors = [_md_row(table, s)[1] for s in ("1.0", "2.0")]
    assert {f3(1 - float(e)) for e in errors} == {f3(diag[s]["test_accuracy"]) for s in (1, 2)}
    claims += [(page, _sweep_row("fnas_table2", t2)),
               (page, f"test accuracy {f3(diag[1.0]['test_accuracy'])} at sigma = tau = 1 and 2 "
                      f"in both"),
               (page, f"epsilon RDP {diag[1.0]['epsilon']:.2f} / {diag[2.0]['epsilon']:.2f} "
                      f"against the script's PLD {_md_row(table, '1.0')[2]} / "
                      f"{_md_row(table, '2.0')[2]}")]
    rand = _runs("fnas_random_genotypes")
    arm = {g: [r["test_accuracy"] for r in rand if r["params"]["algorithm.fixed_genotype"] == g]
           for g in ("", "random")}
    ms_ = lambda v: f"{f3(np.mean(v))} ± {f3(np.std(v, ddof=1))}"            # noqa: E731
    claims += [(page, _sweep_row("fnas_random_genotypes", rand)),
               (page, f"{ms_(arm[''])} against {ms_(arm['random'])} (the script: "
                      f"{_md_row(table, 'searched')[1]} against {_md_row(table, 'random')[1]})")]
    # issue 25's and 33's sweeps (the non-voting rows)
    for name in ("isrl_reproduction_lr_clip", "isrl_reproduction", "isrl_sdp",
                 "fnas_discriminative", "fnas_causes", "fnas_causes_lr_edge", "isrl_wbcd",
                 "isrl_mnist5k_oddeven"):
        claims.append((page, _sweep_row(name, _runs(name))))
    sel = {tuple(r["algorithm.phase_length+algorithm.accounting+algorithm.learning_rate+"
                   "algorithm.clip_norm"][:2]): r
           for r in _json("results/sweeps/isrl_reproduction/selected.json")}
    mb, comp, ref = sel[(1, "composed")], sel[(2, "composed")], sel[(2, "reference")]
    claims.append((page, f"MB-SGD {f3(mb['test_accuracy_mean'])}, SPIDER "
                         f"{f3(comp['test_accuracy_mean'])} (correct) / "
                         f"{f3(ref['test_accuracy_mean'])} (authors' accounting, true eps "
                         f"{ref['epsilon_mean']:.2f})"))
    sdp = {(r["base"], r["target_epsilon"], r["algorithm.shuffle_analysis"]):
           r["test_accuracy_mean"] for r in _json("results/sweeps/isrl_sdp/selected.json")}
    gains = [100 * (sdp[b, e, "l2"] - sdp[b, e, "per_coordinate"]) for b, e, a in sdp
             if a == "l2"]
    claims.append((page, f"L2 +{int(np.floor(min(gains)))}-{int(np.ceil(max(gains)))} points"))
    fnas = _json("results/fnas/discriminative.json")["arms"]
    claims.append((page, f"DP search {f3(fnas['DP search']['between_unit_mean'])}, non-private "
                         f"{f3(fnas['non-private search']['between_unit_mean'])}, random "
                         f"genotypes {f3(fnas['random genotype']['between_unit_mean'])}"))
    silos = _runs("isrl_paper_silos")
    tests = _json("results/isrl/paper_silos.json")
    ps = [next(r for r in tests["rows"] if r["row"]["target_epsilon"] == e)["tests"][
        "ISRL-DP MB-SGD vs ISRL-DP SPIDER"]["p_value"] for e in (0.75, 3.0, 18.0)]
    claims += [(page, f"| `isrl_paper_silos` | {len(silos):,} (4 invocations"),
               (page, f"| {sum(r['wall_time_s'] for r in silos):,.0f} | about 35 min"),
               (page, f"(p = {ps[0]:.1g} / {sci(ps[1])} / {ps[2]:.3f};")]
    return claims


# --- results/private_grad, isrl and fedkt READMEs -------------------------------------------------

def private_grad_claims() -> list[tuple[str, str]]:
    page = "results/private_grad/README.md"
    b = _json("results/private_grad/bench_upload_rates.json")
    claims = []
    for r in b["runs"]:
        assert r["results_agree"]
        claims.append(row_claim(page, (f"{r['rate']}",), {
            1: [r["expected_batch"]], 2: [1e3 * r["sampled_gradient_s"]],
            3: [r["sampled_gradient_over_rate_1"]], 4: [1e3 * r["sampled_difference_s"]],
            5: [r["sampled_difference_over_rate_1"]],
            6: [1e3 * r["all_records_gradient_s"], 1e3 * r["all_records_difference_s"]],
            7: [r["all_records_over_sampled_gradient"],
                r["all_records_over_sampled_difference"]]}))
    low = b["runs"][0]
    falls = [1 / low["sampled_gradient_over_rate_1"], 1 / low["sampled_difference_over_rate_1"]]
    shares = [low["sampled_gradient_over_rate_1"], low["sampled_difference_over_rate_1"]]
    all_diff = [1e3 * r["all_records_difference_s"] for r in b["runs"]]
    load = b["load_average_1m"]
    claims += [
        (page, f"the upload falls {span(falls, dec(0))}x "
               f"({span(shares, f3)} of the p = 1 time"),
        (page, f"(load average {load[0]:.1f} before, {load[1]:.1f} after)"),
        (page, f"p: {span(all_diff, dec(0))} ms in this run)"),
        (page, f"ONE ISRL-DP upload of {b['silos']} silos (vmapped, as in a round) of "
               f"n = {b['local_size']} records each, {b['model']} ({b['num_params']} parameters)"),
    ]
    # the same figures quoted in results/isrl/README.md
    rows = {r["rate"]: r for r in b["runs"]}
    g = " / ".join(f3(rows[p]["sampled_gradient_over_rate_1"]) for p in (0.01, 0.05, 0.2))
    d = " / ".join(like(x, rows[p]["sampled_difference_over_rate_1"])
                   for x, p in zip(("0.014", "0.028", "0.22"), (0.01, 0.05, 0.2)))
    x = " / ".join(f"{rows[p]['all_records_over_sampled_gradient']:.0f}x"
                   for p in (0.01, 0.05, 0.2))
    claims.append(("results/isrl/README.md", f"takes {g} of its p = 1 time (difference upload "
                                             f"{d})"))
    claims.append(("results/isrl/README.md", f"({x} the sampled upload)"))
    return claims


def isrl_readme_claims() -> list[tuple[str, str]]:
    page = "results/isrl/README.md"
    claims = []
    bench = _json("results/isrl/bench_isrl.json")
    for r in bench["runs"]:
        assert r.get("results_agree", True)
        claims.append(row_claim(page, (f"{r['silos']:,}",), {
            1: [1e3 * r["vectorised_refresh_s"], 1e3 * r["vectorised_difference_s"]],
            2: [1e3 * r["loop_refresh_s"], 1e3 * r["loop_difference_s"]],
            3: [r["speedup_refresh"], r["speedup_difference"]]}, width=4))
        if r["loop_extrapolated"]:
            claims.append((page, f"{1e3 * r['loop_difference_s']:,.0f} ms (extrapolated)"))
    cohort = _json("results/isrl/bench_cohort.json")
    for r in cohort["runs"]:
        assert r["results_agree"]
        claims.append(row_claim(page, (f"{r['silos']:,}", f"{r['available']}"), {
            2: [1e3 * r["gather_refresh_s"], 1e3 * r["gather_difference_s"]],
            3: [1e3 * r["masked_refresh_s"], 1e3 * r["masked_difference_s"]],
            4: [r["ratio_refresh"], r["ratio_difference"]]}))
    load = cohort["load_average_1m"]
    chunk = {r["chunk_size"] for r in cohort["runs"] if r["silos"] == 10_000}
    claims += [(page, f"(load average {load[0]:.1f} before, {load[1]:.1f} after;"),
               (page, f"at N = 10,000 it runs chunks of {chunk.pop()} silos")]
    return claims


def fedkt_readme_claims() -> list[tuple[str, str]]:
    page = "results/fedkt/README.md"
    gib, mib = 2 ** 30, 2 ** 20
    scale = _json("results/scale/oneshot_fedkt.json")
    claims = []
    for r in scale["rows"]:
        key = f"{r['num_agents']:,}" + (f", `--party-chunk {r['party_chunk']}` (one chunk)"
                                        if "note" in r else "")
        ph = r["phase_s"]
        claims.append(row_claim(page, (key,), {
            1: [r["teachers"]], 2: [math.ceil(r["num_agents"] / r["party_chunk"])],
            3: [r["wall_s"], ph["teachers"], ph["students"], ph["final"]],
            4: [r["peak_rss_bytes"] / gib], 5: [r["data_bytes"] / mib],
            6: [r["kept_votes_bytes"] / mib]}))
    rows = scale["rows"]
    chunked, whole = rows[2], rows[3]
    fl = scale["config"]["fedkt"]
    per_chunk = rows[1]["party_chunk"]
    claims += [
        (page, f"({per_chunk} parties = {per_chunk * fl['partitions'] * fl['teachers']:,} "
               f"teachers per chunk)"),
        (page, f"the peak RSS grows by "
               f"{(chunked['peak_rss_bytes'] - rows[1]['peak_rss_bytes']) / gib:.2f} GiB"),
        (page, f"peak at {whole['peak_rss_bytes'] / gib:.2f} GiB, "
               f"{whole['peak_rss_bytes'] / chunked['peak_rss_bytes']:.1f}x more"),
        (page, f"(server labels {100 * whole['server_label_accuracy']:.1f}% correct, test "
               f"accuracy {f3(whole['test_accuracy'])} in both)"),
        (page, f"Test accuracy is {span([r['test_accuracy'] for r in rows], dec(2))}"),
        (page, f"{span([100 * r['server_label_accuracy'] for r in rows], dec(0))}% "
               f"correct)"),
    ]
    assert whole["server_label_accuracy"] == chunked["server_label_accuracy"]
    assert whole["test_accuracy"] == chunked["test_accuracy"]
    for name, key in (("bench_teachers", "mnist5k, 10 x 2 x 5, MLP 100-100, 300 steps"),
                      ("bench_teachers_tabular", "Adult-like tabular (14 features), 50 x 2 x 5, "
                       "MLP 32, 300 steps (`--dataset synthetic --parties 50 --hidden 32`)")):
        t = _json(f"results/fedkt/{name}.json")
        sec, best = t["seconds"], t["speedup_vs_loop"]["best"]
        fastest = min(("vectorised_auto_chunk", "vectorised_no_chunk"), key=sec.get)
        claims.append(row_claim(page, (key,), {
            1: [t["teachers"]], 2: [sec["vectorised_auto_chunk"]],
            3: [sec["vectorised_no_chunk"]], 4: [sec["loop"]], 5: [best],
            6: [t["achieved_gflops"][fastest], t["achieved_gflops"]["loop"],
                t["matmul_gflops_same_run"]]}))
    t = _json("results/fedkt/bench_teachers.json")
    agree = t["public_prediction_agreement_vs_no_chunk"]
    claims.append((page, f"agree on {100 * agree['vectorised_auto_chunk']:.2f}% / "
                         f"{100 * agree['vectorised_no_chunk']:.0f}%; Adam amplifies round-off "
                         f"over "
                         f"{t['steps']} steps, max parameter drift "
                         f"{max(t['max_abs_param_diff_vs_no_chunk'].values()):.2f})"))
    return claims


# --- results/scale/README.md ----------------------------------------------------------------------

def scale_readme_claims() -> list[tuple[str, str]]:
    page = "results/scale/README.md"
    gib = 2 ** 30
    b = _json("results/scale/bench_scale.json")
    peers = b["peers"]
    reps = peers["repeats"]
    claims = [(page, f"a large matmul reaches {b['matmul_gflops']:.0f} GFLOP/s on this machine"),
              (page, f"parameter norm {peers['check']['param_norm']} (reference "
                     f"{peers['check']['expected_param_norm']}), loss "
                     f"{peers['check']['loss_all']}")]
    for c in ("10", "100", "1000"):
        each = lambda key: [r[key][c] for r in reps]                         # noqa: E731
        claims.append(row_claim(page, (f"{int(c):,}",), {
            1: each("ours_gathered_s"), 2: [float(np.median(each("ours_masked_s")))],
            3: each("jax_ref_map10_s"), 4: each("fedjax_0.0.17_s"),
            5: each("ratio_vs_jax_ref"), 6: each("fedjax_over_ours"),
            7: [peers["fedjax_quoted_over_ours"][c]]}, width=8))
        assert [r["compiled_pass_sizes"][c] for r in reps] == [[int(c)]] * 3
    big = [r["ratio_vs_jax_ref"]["1000"] for r in reps]
    fedjax = [r["fedjax_0.0.17_s"]["1000"] for r in reps]
    over = [r["fedjax_over_ours"]["1000"] for r in reps]
    claims += [
        (page, "Cohort 10 costs " + ", ".join(f"1/{1 / r['smallest_over_largest_cohort']:.0f}"
                                              for r in reps[:2])
         + f" and 1/{1 / reps[2]['smallest_over_largest_cohort']:.0f} of cohort 1,000"),
        (page, f"the round is {span(big, dec(2))}x the plain-JAX reference's time"),
        (page, f"fedjax took {span(fedjax, dec(2))} s at C = 1,000 in this run"),
        (page, f"rather than {span(over, dec(0))}x"),
    ]
    # DP-FedAvg over 10^3 ... 10^6 agents
    pop = b["population"]
    for r in pop:
        claims.append(row_claim(page, (f"10^{round(math.log10(r['num_agents']))}",), {
            1: [r["round_s_median"]], 2: r["compiled_pass_sizes"], 3: [r["data_gb"]],
            4: [r["peak_rss_gb"]]}, width=5))
    claims.append((page, f"A round at N = 10^6 costs "
                         f"{pop[-1]['round_s_median'] / pop[0]['round_s_median']:.2f}x the round "
                         f"at "
                         f"N = 10^3"))
    # AE-DPFL and kNN-DPFL end to end
    name = {"ae_dpfl": "AE-DPFL", "knn_dpfl": "kNN-DPFL"}
    for r in b["oneshot"]["rows"]:
        ratio = r["peak_rss_bytes"] / r["data_bytes"]
        claims.append(row_claim(page, (name[r["algorithm"]],
                                       f"10^{round(math.log10(r['num_agents']))}"), {
            2: [r["wall_s"]], 3: [r["data_bytes"] / gib], 4: [r["peak_rss_bytes"] / gib],
            5: [ratio] if r["num_agents"] >= 100_000 else []}))
    base = min(r["peak_rss_bytes"] for r in b["oneshot"]["rows"]) / gib
    claims.append((page, f"(its baseline RSS is ~{base:.2f} GiB"))
    # AE-DPFL from the command line
    cli = _json("results/scale/oneshot_cli.json")["rows"]
    quiet = _json("results/scale/oneshot_cli_quiet.json")["rows"][0]
    for key, r in (("`fedjax-dp run`", cli[0]),
                   ("`fedjax-dp run`, quiet machine (`oneshot_cli_quiet.json`, `--paths cli`)",
                    quiet), ("hand-built", cli[1])):
        extra = r["setup_s"] if "setup_s" in r else r["generate_s"]
        claims.append(row_claim(page, (key, "10^6"), {
            2: [r["wall_s"], extra], 3: [r["data_bytes"] / gib], 4: [r["peak_rss_bytes"] / gib],
            5: [r["peak_rss_bytes"] / r["data_bytes"]]}))
    # issue 30: the fixed set of programs (two quiet windows per row)
    rows = _json("results/scale/oneshot_cli_issue30.json")["rows"]
    quiet = [r for r in rows if r["window"].startswith("quiet ") and r["num_agents"] == 1_000_000]
    labels = {"before (c28e924), numpy, host": "before: c28e924, numpy generator, agents_on auto",
              "after, numpy (the default), host": "after (abc4956): numpy generator (default)",
              "after, jax, host (`auto`)": "after (abc4956): generator jax, agents_on auto",
              "after, jax, device": "after (abc4956): generator jax, agents_on device"}
    for key, label in labels.items():
        w = sorted((r for r in quiet if r["label"].startswith(label)), key=lambda r: r["window"])
        assert len(w) == 2 and len({r["compilations"] for r in w}) == 1
        claims.append(row_claim(page, (key,), {
            1: [r["wall_s"] for r in w], 2: [r["setup_s"] for r in w],
            3: [w[0]["compilations"]] + [r["compile_s"] for r in w],
            4: [r["peak_rss_bytes"] / gib for r in w],
            5: [np.mean([r["peak_rss_bytes"] / r["data_bytes"] for r in w])]}))
    two = next(r for r in rows if r["num_agents"] == 2_000_000)
    claims.append(row_claim(page, ("after, jax, device, **2 x 10^6 agents**",), {
        1: [two["wall_s"]], 2: [two["setup_s"]], 3: [two["compilations"], two["compile_s"]],
        4: [two["peak_rss_bytes"] / gib], 5: [two["peak_rss_bytes"] / two["data_bytes"]]}))
    every = {r["vote_accuracy"] for r in quiet}
    assert len(every) == 1
    loaded = [r for r in rows if r["window"].startswith("loaded") and r["num_agents"] == 1_000_000]
    claims += [
        (page, f"Every run's vote accuracy is {every.pop():.2f} ({two['vote_accuracy']:.3f} at "
               f"2 x 10^6)"),
        (page, f"Features alone are {quiet[0]['features_bytes'] / gib:.2f} GiB "
               f"({quiet[0]['data_bytes'] / gib:.2f} GiB with labels and masks)"),
        (page, f"(phase 0, {span([r['phase_s'][0] for r in quiet], dec(0))} s of it "
               f"on two cores)"),
        (page, f"before {loaded[0]['wall_s']:,.0f} s (setup {loaded[0]['setup_s']:.1f} s, "
               f"{loaded[0]['compilations']} compilations), after (numpy) "
               f"{loaded[1]['wall_s']:.0f} s (setup {loaded[1]['setup_s']:.1f} s, "
               f"{loaded[1]['compilations']})"),
    ]
    gpu = _json("results/bench/h200-2026-11-27/ae_dpfl_1e7_cli.json")
    claims.append((page, f"noted by hand ({gpu['timing']['compilations']} compilations; the "
                         f"run's own `wall_time_s`, {gpu['wall_time_s']:.1f} s, is in the record)"))
    # DP-FedAvg rounds through the command line
    for sampling, key, cohort in (("fixed", "fixed C, stored order (the tool's workload)", "10"),
                                  ("fixed", "fixed C, stored order", "1,000"),
                                  ("poisson", "Poisson q = C / N, uniform batches", "~10"),
                                  ("poisson", "Poisson q = C / N, uniform batches", "~1,000")):
        r = b["cli"][sampling][cohort.strip("~").replace(",", "")]
        ratios = [r["cli_over_tool"]]
        if cohort == "~10":
            ratios.append(r["cli_median_round_s"] / r["tool_gathered_s"])
        claims.append(row_claim(page, (key, cohort), {
            2: [r["cli_s_per_round"]], 3: [r["cli_median_round_s"]], 4: [r["tool_gathered_s"]],
            5: ratios}))
    claims.append((page, f"{b['cli']['poisson']['10']['compilations']} compiled functions "
                         f"against 37 in the 30-round run"))
    quoted = peers["fedjax_0.0.17_s_quoted"]
    claims.append((page, f"fedjax quoted ({quoted['10']} / {quoted['100']} / {quoted['1000']} s)"))
    return claims


# --- results/fnas/README.md -----------------------------------------------------------------------

def fnas_readme_claims() -> list[tuple[str, str]]:
    page = "results/fnas/README.md"
    expected = _json("results/configs_expected.json")
    dp, nodp, mnist = (expected[f"configs/fnas/{n}.toml"] for n in
                       ("digits_dp", "digits_nodp", "mnist5k_dp"))
    eps = lambda e: f"{e['headline']['epsilon']['pld']:.{1 if e is dp else 2}f} (PLD) / " \
                    f"{e['headline']['epsilon']['rdp']:.{1 if e is dp else 2}f} (RDP)"  # noqa
    claims = [
        (page, f"(digits DP {f3(dp['test_accuracy'])} at {eps(dp)}; no-DP "
               f"{f3(nodp['test_accuracy'])})"),
        (page, f"`digits_dp` {dp['wall_time_s']:.0f} s in the runner"),
        (page, f"`digits_nodp` {math.floor(nodp['wall_time_s'] + 0.5)} s, and "
               f"`configs/fnas/mnist5k_dp.toml` "
               f"{mnist['wall_time_s']:.0f} s with test accuracy {f3(mnist['test_accuracy'])} at "
               f"epsilon {eps(mnist)}"),
        (page, f"DP run: test accuracy {f3(dp['test_accuracy'])}; epsilon {eps(dp)}"),
        (page, f"and reached {f3(nodp['test_accuracy'])}, below the DP run"),
    ]
    b = _json("results/fnas/bench_fnas.json")
    s, g = b["search_step"], b["per_example_grads"]
    claims += [
        row_claim(page, (f"one DP search iteration, K = {s['parties']} parties",), {
            1: [s["vmap_s"]], 2: [s["loop_s"]], 3: [s["loop_over_vmap"]],
            4: [b["compile_search_step_s"], b["compile_loop_parties_s"]]}),
        row_claim(page, (f"{g['examples']} per-example gradients, `vmap(grad)` vs a loop over "
                         f"examples",), {
            1: [g["vmap_s"]], 2: [g["loop_s"]], 3: [g["loop_over_vmap"]],
            4: [g["compile_vmap_s"], g["compile_one_s"]]}),
        (page, f"{b['num_weights']:,} weights"),
        (page, f"`vmap(grad)` is {g['loop_over_vmap']:.1f}x faster than a loop"),
    ]
    quick = _json("results/fnas/results.json")
    t1 = {(r["parties"], r["private"]): r for r in quick["table1"]}
    for k in (1, 2, 4, 8):
        r, n = t1[k, True], t1[k, False]
        claims.append((page, f"| {k} | {f3(r['test_accuracy'])} | {r['epsilon_pld']:.2f} / "
                             f"{r['epsilon_rdp']:.2f} | {r['paper_gdp_epsilon']:.2f} | "
                             f"{f3(n['test_accuracy'])} |"))
    t2 = quick["table2"]
    claims.append((page, f"noise multiplier {t2[0]['noise']} -> error {f3(t2[0]['error'])} (eps "
                         f"{t2[0]['epsilon_pld']:.1f}); {t2[1]['noise']} -> error "
                         f"{f3(t2[1]['error'])} (eps {t2[1]['epsilon_pld']:.1f})"))

    def arm(rv, name):
        runs = ", ".join(f3(r["test_accuracy"]) for r in rv[name]["runs"])
        return f"{f3(rv[name]['mean'])} +- {f3(rv[name]['std'])} ({runs})"

    rv = quick["random_vs_searched"]
    searched = [r["test_accuracy"] for r in rv["searched"]["runs"]]
    claims += [(page, f"searched genotype {arm(rv, 'searched')}, random genotypes of the same "
                      f"size {arm(rv, 'random')}"),
               (page, f"({span(searched, dec(2))})".replace("-", " to "))]
    long = _json("results/fnas/long/results.json")
    lt = {r["private"]: r for r in long["table1"]}
    r = lt[True]
    claims += [
        (page, f"| DP-FNAS, K = 4 | {f3(r['test_accuracy'])} | {r['epsilon_pld']:.2f} / "
               f"{r['epsilon_rdp']:.2f} | {r['paper_gdp_epsilon']:.2f} |"),
        (page, f"| FNAS (no DP), K = 4 | {f3(lt[False]['test_accuracy'])} | - | - |"),
        (page, f"| searched genotype (DP), DP retraining, seeds 1-3 | "
               f"{arm(long['random_vs_searched'], 'searched')} |"),
        (page, f"| random genotypes of the same size, DP retraining, seeds 1-3 | "
               f"{arm(long['random_vs_searched'], 'random')} |"),
        (page, f"took {r['search_time_s']:.0f} s and ~{r['retrain_time_s']:.0f} s"),
    ]
    return claims


# --- the GPU runs' READMEs (results/bench/h200-2026-11-27*/) --------------------------------------

def _bench_part(path: str, name: str) -> dict:
    return next(p for p in _json(path)["parts"] if p["name"] == name)


def _selftest_seconds(folder: str) -> str:
    last = _text(f"{folder}/selftest.txt").splitlines()[-1]
    assert last.startswith("selftest: 9/9 passed (PASS) on cuda:0 vs cpu:0")
    seconds = float(re.search(r"; ([\d.]+) s$", last).group(1))
    return f"{seconds:.0f} s"


def h200_readme_claims() -> list[tuple[str, str]]:
    first, rooms = "results/bench/h200-2026-11-27", "results/bench/h200-2026-11-27-rooms"
    page = f"{first}/README.md"
    tolerances = "(epsilon 1e-9 rel, checksums 1e-3 rel, accuracy 0.05 abs)"
    peers = _bench_part(f"{first}/bench_full.json", "peers_dp_fedavg")
    ratio, t = peers["ratios"], {k: 1e3 * v["median_s"] for k, v in peers["times"].items()}
    cli = _json(f"{first}/cli_rounds_3030.json")["rates"]
    c10, c100 = cli["0.01"], cli["0.1"]
    knn = _bench_part(f"{first}/bench_full.json", "knn_vote")
    sgd = _bench_part(f"{first}/bench_full.json", "dp_sgd_step")
    gpu = _json(f"{first}/ae_dpfl_1e7_cli.json")
    opts = gpu["config_overrides"]["dataset_options"]
    claims = [
        (page, f"| `fedjax-dp selftest` | 9/9 PASS, cuda:0 vs cpu:0 {tolerances}, "
               f"{_selftest_seconds(first)} |"),
        (page, f"every part ran ({_json(f'{first}/bench_full.json')['total_s']:.0f} s)"),
        row_claim(page, ("peers' DP-FedAvg, rounds fused (bench part, K = 10 rounds per call) / "
                         "reference",), {1: [
                             None, ratio["fused_over_reference_10"], t["fused_10"],
                             t["reference_10"],
                             None, ratio["fused_over_reference_100"], t["fused_100"],
                             t["reference_100"], None, ratio["fused_over_reference_1000"],
                             t["fused_1000"], t["reference_1000"]]}),
        row_claim(page, ("the same, one round per call",), {1: [
            None, ratio["ours_over_reference_10"], None, ratio["ours_over_reference_100"], None,
            ratio["ours_over_reference_1000"]]}),
        row_claim(page, ("the command line's round, peers' shapes, Poisson q "
                         "(`tools/bench_cli_rounds.py`, 30 vs 3,030 rounds)",), {1: [
            None, 1e3 * c10["cli_s_per_round"], 1e3 * c10["cli_median_round_s"],
            1e3 * c10["reference_median_s"],
            c10["cli_median_round_s"] / c10["reference_median_s"], None,
            1e3 * c100["cli_s_per_round"], 1e3 * c100["cli_median_round_s"],
            1e3 * c100["reference_median_s"],
            c100["cli_median_round_s"] / c100["reference_median_s"],
            sig(1 / c100["cli_median_round_s"])]}),
        row_claim(page, ("AE-DPFL, 10^7 synthetic agents (16 records x 32 features, drawn on the "
                         "device) through `fedjax-dp run`",), {1: [
            None, gpu["wall_time_s"], gpu["timing"]["setup_s"], gpu["timing"]["compilations"],
            None, opts["num_train"] * opts["num_features"] * 4 / 1e9, gpu["test_accuracy"]]}),
        row_claim(page, ("kNN vote (1,000 agents x 600 points x 1,000 queries x 64)",), {1: [
            1e3 * knn["times"]["vote"]["median_s"], 100 * knn["ratios"]["vote_fraction_of_matmul"],
            1e3 * knn["times"]["distances"]["median_s"],
            100 * knn["ratios"]["distances_fraction_of_matmul"]]}),
        row_claim(page, ("DP-SGD step, private / non-private (CNN, batch 128)",), {1: [
            sgd["ratios"]["private_over_non_private"],
            sgd["ratios"]["per_example_norms_over_non_private"]]}),
        (page, f"({1e3 * c10['cli_s_per_round']:.2f}-{1e3 * c100['cli_s_per_round']:.2f} "
               f"ms/round)"),
    ]
    assert all(r["compilations_after_first_call"] == 0 for r in cli.values())
    assert _json(f"{first}/cli_rounds_330.json")["rates"]["0.01"]["cli_s_per_round"] < 0
    # the rooms re-check
    page = f"{rooms}/README.md"
    after = _bench_part(f"{rooms}/bench_full.json", "peers_dp_fedavg")["ratios"]
    cli = _json(f"{rooms}/cli_rounds_3030.json")["rates"]
    c10, c100 = cli["0.01"], cli["0.1"]
    short = _json(f"{rooms}/cli_rounds_330.json")
    s10, s100 = short["rates"]["0.01"], short["rates"]["0.1"]
    before = _json(f"{first}/cli_rounds_3030.json")["rates"]
    reps = [_json(f"{rooms}/cli_rounds_3030_q001_rep{i}.json")["rates"]["0.01"]
            for i in (1, 2, 3)]
    claims += [
        (page, f"| `fedjax-dp selftest` | 9/9 PASS, cuda:0 vs cpu:0 {tolerances}, "
               f"{_selftest_seconds(rooms)} |"),
        (page, f"every part ran ({_json(f'{rooms}/bench_full.json')['total_s']:.0f} s)"),
        row_claim(page, ("peers' DP-FedAvg, fused rounds / reference (bench part)",), {1: [
            None, after["fused_over_reference_10"], None, after["fused_over_reference_100"],
            None, after["fused_over_reference_1000"], ratio["fused_over_reference_10"],
            ratio["fused_over_reference_100"], ratio["fused_over_reference_1000"]]}),
        row_claim(page, ("the command line's round, peers' shapes, Poisson q "
                         "(`tools/bench_cli_rounds.py`, 30 vs 3,030 rounds)",), {1: [
            None, 1e3 * c10["cli_median_round_s"], 1e3 * c10["reference_median_s"],
            c10["cli_median_round_s"] / c10["reference_median_s"], None,
            1e3 * c100["cli_median_round_s"], 1e3 * c100["reference_median_s"],
            c100["cli_median_round_s"] / c100["reference_median_s"],
            1e3 * before["0.01"]["cli_median_round_s"],
            1e3 * before["0.1"]["cli_median_round_s"]]}),
        row_claim(page, ("the same by the wall-time difference of the two runs",), {1: [
            None, 1e3 * c10["cli_s_per_round"], c10["cli_over_reference"], None,
            1e3 * c100["cli_s_per_round"], c100["cli_over_reference"],
            1e3 * before["0.01"]["cli_s_per_round"], 1e3 * before["0.1"]["cli_s_per_round"]]}),
        row_claim(page, ("the same over 30 vs 330 rounds",), {1: [
            1e3 * s10["cli_s_per_round"], s10["cli_long_wall_s"] - s10["cli_short_wall_s"], None,
            1e3 * s10["cli_median_round_s"], 1e3 * s100["cli_median_round_s"]]}),
        (page, " / ".join(f"{1e3 * r['cli_s_per_round']:.2f}" for r in reps)
         + " ms per round (reference " + " / ".join(f"{1e3 * r['reference_median_s']:.2f}"
                                                    for r in reps)
         + " ms: " + " / ".join(f"{r['cli_over_reference']:.2f}x" for r in reps)
         + "; median `round_s` " + " / ".join(f"{1e3 * r['cli_median_round_s']:.2f}"
                                              for r in reps) + " ms)"),
        (page, f"the four pairs span "
               f"{span([1e3 * r['cli_s_per_round'] for r in reps + [c10]], dec(2))}"
               f" ms, all above the single pair measured before the restructure "
               f"({1e3 * before['0.01']['cli_s_per_round']:.3f} ms)"),
    ]
    return claims


# --- results/voting_dpfl/README.md: the shipped configs (not the sweeps being re-run) -------------

def voting_readme_claims() -> list[tuple[str, str]]:
    page = "results/voting_dpfl/README.md"
    expected = _json("results/configs_expected.json")
    claims = []
    for config in ("ae_dpfl/mnist5k", "knn_dpfl/mnist5k", "ae_dpfl/mnist5k_to_digits"):
        e = expected[f"configs/{config}.toml"]
        g = {(x["unit"], x["accountant"]): x["epsilon"] for x in e["guarantees"]}
        row = _md_row(page, f"`configs/{config}.toml`")
        row[2] = f3(e["test_accuracy"])
        row[4] = re.sub(r"(agent|instance) [\d.]+ / [\d.]+", lambda m: (
            f"{m[1]} {g[m[1], 'rdp']:.2f} / {g[m[1], 'pld']:.2f}"), row[4])
        row[5] = re.sub(r"(agent|instance) [\d.]+", lambda m: (
            f"{m[1]} {g[m[1] + '_data_dependent', 'rdp']:.2f}"), row[5])
        claims.append((page, f"| {' | '.join(row)} |"))
    return claims


CLAIMS = (bench_readme_claims() + sweeps_readme_claims() + private_grad_claims()
          + isrl_readme_claims() + fedkt_readme_claims() + scale_readme_claims()
          + fnas_readme_claims() + h200_readme_claims() + voting_readme_claims())

# Figures a README quotes with no committed record behind them: it must say so, in these words.
NO_RECORD = [
    ("results/sweeps/README.md", "the wall times were noted by hand and are in no record"),
    ("results/bench/README.md", "a figure measured by hand and in no committed record"),
    ("results/bench/README.md", "(both from runs whose records were not committed here)"),
    ("results/fedkt/README.md", "that run's JSON was not kept: no committed record"),
    ("results/scale/README.md", "0.333 s (noted by hand, no committed record)"),
    ("results/scale/README.md", "a run not kept as a record"),
    ("results/scale/README.md", "measured before this folder's records were kept: no committed "
                                "record"),
    ("results/scale/README.md", "9x and 5x the data (runs by hand, no committed record)"),
    ("results/scale/README.md", "(a run by hand, no committed record)"),
    ("results/scale/README.md", "the 37 read off that run and not recorded"),
    ("results/scale/README.md", "(measured by hand: a key fetch behind a 0.2 s matmul"),
    ("results/scale/README.md", "44.3 s of process wall time, noted by hand"),
    ("results/bench/h200-2026-11-27/README.md", "(the wall and the RSS noted by hand, not in the "
                                                "record)"),
    ("results/bench/h200-2026-11-27/README.md", "(timed in the session by hand: no record file)"),
    ("results/bench/h200-2026-11-27-rooms/README.md", "(read off the run by hand: `stages.txt` "
                                                      "keeps only the stage's exit and its 108 s)"),
    ("results/fnas/README.md", "the times of this table and of the no-DP run below were noted by "
                               "hand, no committed record"),
    ("results/fnas/README.md", "these four noted by hand, not in the record"),
    ("results/fnas/README.md", "(the GDP and the iteration time from the run's output, by hand: "
                               "no committed record)"),
    ("results/fnas/README.md", "(these test times noted by hand, no committed record)"),
    ("results/voting_dpfl/README.md", "the vote accuracies and wall times were noted by hand, in "
                                      "no committed record"),
]


@pytest.mark.parametrize("page, text", CLAIMS, ids=[f"{p}:{t[:40]}" for p, t in CLAIMS])
def test_readme_quotes_the_records(page, text):
    assert " ".join(text.split()) in _page(page), f"{page} does not say: {text}"


@pytest.mark.parametrize("page, text", NO_RECORD, ids=[f"{p}:{t[:40]}" for p, t in NO_RECORD])
def test_readme_says_which_figures_have_no_record(page, text):
    assert " ".join(text.split()) in _page(page), f"{page} does not say: {text}"
