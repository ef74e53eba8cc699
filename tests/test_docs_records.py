"""The verdicts the docs quote agree with the committed records: every figure below is computed
here from the records (``results.jsonl[.gz]``, ``selected.json``, the ``compare`` outputs) and
must stand, as written here, on the page that quotes it. A record that changes, or a page edited
by hand, fails the test. Reads files only (no run, no compilation)."""
from __future__ import annotations

import functools
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from fedjax_dp.experiments import records

ROOT = Path(__file__).resolve().parents[1]


def _json(path: str):
    return json.loads((ROOT / path).read_text())


def _page(name: str) -> str:
    """A docs page by its name (``audit.md``) or any page by its path from the repository root
    (``results/sweeps/README.md``), its lines joined."""
    path = ROOT / name if "/" in name else ROOT / "docs" / name
    return " ".join(path.read_text().split())


def f3(x: float) -> str:
    return f"{x:.3f}"


def sci(p: float) -> str:
    """1.4e-4 style: one decimal, no zero-padded exponent."""
    mantissa, exponent = f"{p:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def _row(table: dict, **keys) -> dict:
    rows = [r for r in table["rows"] if all(r["row"].get(k) == v for k, v in keys.items())]
    assert len(rows) == 1, keys
    return rows[0]


def _mean(table: dict, name: str, **keys) -> float:
    return _row(table, **keys)["cells"][name]["test_accuracy_mean"]


def _p(table: dict, pair: str, **keys) -> float:
    return _row(table, **keys)["tests"][pair]["p_value"]


# Helpers shared with test_docs_records_pages / _readmes: figures written as a page writes them,
# and a page's table row with its numbers recomputed from a record.

def sig(x: float, n: int = 2) -> str:
    """``x`` to ``n`` significant figures, fixed point, thousands separated: 1,400 / 64 / 1.3 /
    1.0 / 0.49."""
    if x == 0:
        return "0"
    rounded = float(f"{x:.{n}g}")
    decimals = max(0, n - 1 - math.floor(math.log10(abs(rounded))))
    return f"{rounded:,.{decimals}f}"


def dec(n: int):
    """A formatter: ``n`` decimals."""
    return lambda x: f"{x:.{n}f}"


def ms(seconds: float, n: int = 2) -> str:
    return f"{sig(1e3 * seconds, n)} ms"


def span(values, fmt=f3, sep="-") -> str:
    """``min-max`` of the values, each formatted (one figure where the two read the same)."""
    lo, hi = fmt(min(values)), fmt(max(values))
    return lo if lo == hi else f"{lo}{sep}{hi}"


def _text(path: str) -> str:
    return (ROOT / path).read_text()


@functools.lru_cache(maxsize=None)
def _read_once(paths: tuple[str, ...]) -> tuple[dict, ...]:
    return tuple(records.read([Path(p) for p in paths]))


def read(paths) -> list[dict]:
    """``records.read(paths)``, each folder parsed once per process (the claims of the three
    docs-record modules read many folders more than once; 47 MB of records)."""
    return list(_read_once(tuple(str(p) for p in paths)))


def _runs(sweep: str) -> list[dict]:
    return read([ROOT / "results" / "sweeps" / sweep])


def _md_row(path: str, *cells: str, width: int | None = None) -> list[str]:
    """The cells of the one row of a markdown table in ``path`` that starts with ``cells`` (and
    has ``width`` cells, where two tables' rows start alike)."""
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in _text(path).splitlines() if line.startswith("|")]
    found = [r for r in rows if r[:len(cells)] == list(cells) and width in (None, len(r))]
    assert len(found) == 1, (path, cells)
    return found[0]


NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


def like(printed: str, value: float) -> str:
    """``value`` with as many decimals as ``printed`` (and its thousands separator)."""
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    return f"{value:{',' if ',' in printed else ''}.{decimals}f}"


def fill(cell: str, values: list) -> str:
    """The cell with its numbers replaced, in order, by ``values`` written like them (a string as
    it is; None keeps the page's number: a label or a figure checked elsewhere)."""
    found = NUMBER.findall(cell)
    assert len(found) == len(values), (cell, values)
    pieces = NUMBER.split(cell)
    out = pieces[0]
    for printed, value, rest in zip(found, values, pieces[1:]):
        if value is None:
            value = printed
        out += (value if isinstance(value, str) else like(printed, value)) + rest
    return out


def row_claim(page: str, keys: tuple, columns: dict[int, list],
              width: int | None = None) -> tuple[str, str]:
    """The page's table row that starts with ``keys``, its numbers in ``columns`` (column index
    -> values) recomputed from a record: the claim that the page's row reads so."""
    row = _md_row(page if "/" in page else f"docs/{page}", *keys, width=width)
    for i, values in columns.items():
        row[i] = fill(row[i], values)
    return page, f"| {' | '.join(row)} |"


def voting_claims() -> list[tuple[str, str]]:
    hard = _json("results/voting_dpfl/hard_task.json")
    fair = _json("results/voting_dpfl/fair_controls.json")
    big = dict(**{"data.num_agents": 1000})
    knn = [_mean(hard, "knn_dpfl", target_epsilon=e, **big) for e in (1.0, 4.0)]
    sgd = [_mean(hard, "dp_fedsgd", target_epsilon=e, **big) for e in (1.0, 4.0)]
    p_big = [_p(hard, "dp_fedsgd vs knn_dpfl", target_epsilon=e, **big) for e in (1.0, 4.0)]
    crossing = f"{f3(knn[0])} / {f3(knn[1])} against {f3(sgd[0])} / {f3(sgd[1])}"

    def wins(table, a, b):     # cells where a's mean is above b's, and of those p < 0.05
        rows = table["rows"]
        above = [r for r in rows if r["cells"][a]["test_accuracy_mean"]
                 > r["cells"][b]["test_accuracy_mean"]]
        return len(rows), len(above), sum(r["tests"][f"{a} vs {b}"]["p_value"] < 0.05
                                          for r in above)

    def margins(table, a, b):  # the range of a's lead in points where a is ahead
        lead = [100 * (r["cells"][a]["test_accuracy_mean"] - r["cells"][b]["test_accuracy_mean"])
                for r in table["rows"]]
        lead = [x for x in lead if x > 0]
        return f"{min(lead):.1f}-{max(lead):.1f} points"

    n_fa, w_fa, s_fa = wins(fair, "dp_fedavg", "ae_dpfl")
    n_fs, w_fs, s_fs = wins(fair, "dp_fedsgd", "knn_dpfl")
    assert (n_fa, n_fs) == (8, 8)
    n100 = {"data.num_agents": 100}
    knn100 = _row(fair, target_epsilon=1.0, **n100)["cells"]["knn_dpfl"]
    sgd100 = _row(fair, target_epsilon=1.0, **n100)["cells"]["dp_fedsgd"]
    p100 = _p(fair, "dp_fedsgd vs knn_dpfl", target_epsilon=1.0, **n100)
    fa = [_mean(hard, "dp_fedavg", target_epsilon=e, **big) for e in (1.0, 4.0)]
    ae = [_mean(hard, "ae_dpfl", target_epsilon=e, **big) for e in (1.0, 4.0)]
    return [
        ("voting_dpfl.md", f"N = 1,000, {f3(fa[0])} / {f3(fa[1])} against {f3(ae[0])} / "
                           f"{f3(ae[1])}."),
        ("voting_dpfl.md", f"({crossing} at epsilon 1 / 4; p = {sci(p_big[0])}, "
                           f"{sci(p_big[1])})"),
        ("voting_dpfl.md", f"DP-FedAvg beats AE-DPFL in all {w_fa} mnist5k cells (Welch p < 0.05 "
                           f"in {s_fa};"),
        ("voting_dpfl.md", f"DP-FedSGD beats kNN-DPFL in {w_fs} of 8 mnist5k cells (p < 0.05 in "
                           f"{s_fs};"),
        ("reproducibility.md", f"({crossing} at epsilon 1 / 4)"),
        ("index.md", f"kNN-DPFL wins at N = 1,000 agents of 60 training records there "
                     f"({f3(knn[1])} against {f3(sgd[1])} at epsilon 4)"),
        ("index.md", f"DP-FedSGD beats kNN-DPFL in {w_fs} of 8 mnist5k cells"),
        ("voting_dpfl.md", f"the closest cell is N = 100, epsilon 1 "
                           f"({f3(sgd100['test_accuracy_mean'])} ± {f3(sgd100['test_accuracy_std'])} "
                           f"against {f3(knn100['test_accuracy_mean'])} ± "
                           f"{f3(knn100['test_accuracy_std'])} over {knn100['n']} seeds, Welch "
                           f"p = {p100:.2f}: a tie)"),
        ("voting_dpfl.md", f"On mnist5k DP-FedAvg wins all 8 (N, epsilon) cells, by "
                           f"{margins(fair, 'dp_fedavg', 'ae_dpfl')}"),
        ("voting_dpfl.md", f"On mnist5k DP-FedSGD wins {w_fs} of 8 cells, by "
                           f"{margins(fair, 'dp_fedsgd', 'knn_dpfl')}"),
        ("reproducibility.md", f"DP-FedAvg beats AE-DPFL in all 8 mnist5k cells (by "
                               f"{margins(fair, 'dp_fedavg', 'ae_dpfl')})"),
    ]


def crossing_rows() -> list[str]:
    """docs/voting_dpfl.md's crossing table (issue 33): per N (training records per agent), per
    target epsilon, DP-FedSGD's and kNN-DPFL's chosen mean test accuracy on the generated task,
    the leader in bold, and Welch's p of the difference (results/voting_dpfl/hard_task.json)."""
    hard = _json("results/voting_dpfl/hard_task.json")
    records_per_agent = {100: 600, 300: 200, 1000: 60, 3000: 20}
    rows = []
    for n in sorted({r["row"]["data.num_agents"] for r in hard["rows"]}):
        line = f"| {n:,} ({records_per_agent[n]}) |"
        for e in (1.0, 2.0, 4.0, 8.0):
            row = _row(hard, target_epsilon=e, **{"data.num_agents": n})
            sgd, knn = (row["cells"][k]["test_accuracy_mean"] for k in ("dp_fedsgd", "knn_dpfl"))
            a, b = (f"**{f3(sgd)}**", f3(knn)) if sgd > knn else (f3(sgd), f"**{f3(knn)}**")
            p = row["tests"]["dp_fedsgd vs knn_dpfl"]["p_value"]
            line += f" {a} / {b} (p {sci(p) if p < 0.01 else f'{p:.2f}'}) |"
        rows.append(line)
    return rows


def crossing_claims() -> list[tuple[str, str]]:
    """The crossing table, the candidates per chosen cell (reproducibility.md) and the hard-task
    folders' run counts and seconds of runs (results/sweeps/README.md)."""
    def candidates(name):
        return {(r["data.num_agents"], r["target_epsilon"]): r["n_candidates"]
                for r in _json(f"results/sweeps/voting_hard_task_{name}/selected.json")}
    sgd, knn = candidates("dp_fedsgd"), candidates("knn_dpfl")
    fedavg, ae = candidates("dp_fedavg"), candidates("ae_dpfl")
    retuned = {(n, e) for n in (100, 1000) for e in (1.0, 4.0)}
    others = [v for k, v in sgd.items() if k not in retuned]
    assert len(others) == 12

    def span(values):
        values = list(values)
        return f"{min(values)}" if min(values) == max(values) else f"{min(values)}-{max(values)}"

    knn_other = [v for k, v in knn.items() if k not in retuned]
    k_by_n: dict[int, list[int]] = {}              # kNN-DPFL's chosen k per N (every epsilon)
    for r in _json("results/sweeps/voting_hard_task_knn_dpfl/selected.json"):
        k_by_n.setdefault(r["data.num_agents"], []).append(r["selected"]["algorithm.k"])
    names = ("ceiling", "dp_fedavg", "dp_fedsgd", "ae_dpfl", "knn_dpfl")
    runs = [_runs(f"voting_hard_task_{n}") for n in names]
    return [("voting_dpfl.md", row) for row in crossing_rows()] + [
        ("reproducibility.md", f"DP-FedAvg {span(fedavg.values())} (3), AE-DPFL "
                               f"{span(ae.values())} (3), DP-FedSGD {span(sgd[k] for k in retuned)}"
                               f" at N = 100 and 1,000 (epsilon 1 / 4) and {span(others)} in the "
                               f"crossing's other 12 cells (3), kNN-DPFL {span(knn.values())} (3)"),
        ("reproducibility.md", f"on the harder task {span(sgd[k] for k in retuned)} against "
                               f"{span([knn[k] for k in retuned])} at N = 100 and 1,000 "
                               f"(epsilon 1 / 4), {span(others)} against {span(knn_other)} in "
                               f"the crossing's other cells"),
        ("voting_dpfl.md", f"It chooses k = {span(k_by_n[100])} at N = 100, {span(k_by_n[300])} at "
                           f"N = 300, {span(k_by_n[1000])} at N = 1,000 and {span(k_by_n[3000])} "
                           f"at N = 3,000"),
        ("results/sweeps/README.md",
         f"| `voting_hard_task_{{{','.join(names)}}}` | {' / '.join(str(len(r)) for r in runs)} | "
         + " / ".join(f"{sum(x['wall_time_s'] for x in r):,.0f}" for r in runs) + " |")]


def tuning_claims() -> list[tuple[str, str]]:
    fair = _json("results/voting_dpfl/fair_controls.json")

    def cost(name, e):
        return _row(fair, target_epsilon=e, **{"data.num_agents": 50})["tuning_cost"][name]

    c1 = {n: cost(n, 1.0) for n in ("dp_fedavg", "ae_dpfl", "knn_dpfl", "dp_fedsgd")}
    c8 = {n: cost(n, 8.0) for n in c1}
    g = lambda c: f"{c['epsilon_all']:.3g}"                                   # noqa: E731
    return [("reproducibility.md",
             f"DP-FedAvg's {c1['dp_fedavg']['candidates']} candidates compose to epsilon "
             f"{g(c1['dp_fedavg'])}, AE-DPFL's {c1['ae_dpfl']['candidates']} to "
             f"{g(c1['ae_dpfl'])}, kNN-DPFL's {c1['knn_dpfl']['candidates']} to "
             f"{g(c1['knn_dpfl'])} and DP-FedSGD's {c1['dp_fedsgd']['candidates']} to "
             f"{g(c1['dp_fedsgd'])}; at epsilon 8, {g(c8['dp_fedavg'])} / {g(c8['ae_dpfl'])} "
             f"/ {g(c8['knn_dpfl'])} / {g(c8['dp_fedsgd'])}")]


def fnas_claims() -> list[tuple[str, str]]:
    """The DP-FNAS verdict: the discriminative experiment (fixed retraining) and issue 33's cause
    separation (retraining step size chosen on validation), as the verdicts quote them."""
    arms = _json("results/fnas/discriminative.json")
    a, t = arms["arms"], arms["tests"]
    ms = {k: (f3(v["between_unit_mean"]), f3(v["between_unit_std"])) for k, v in a.items()}
    p_dp = f"{t['DP search vs non-private search']['p_value']:.1g}"
    dp, nonp, rand = ms["DP search"], ms["non-private search"], ms["random genotype"]
    c = _json("results/fnas/causes.json")
    ca, ct = c["arms"], c["tests"]
    cm = {k: (f3(v["between_unit_mean"]), f3(v["between_unit_std"])) for k, v in ca.items()}
    cp = lambda pair, n=3: f"{ct[pair]['p_value']:.{n}f}"                      # noqa: E731
    cdp, cnp, crand = (cm["DP search sigma 2"], cm["non-private search"],
                       cm["random genotype"])
    dp_np, dp_rand = (cp("DP search sigma 2 vs non-private search"),
                      cp("DP search sigma 2 vs random genotype"))
    clip_dp = cp("clip-only search vs DP search sigma 2", 2)
    clip_np = cp("clip-only search vs non-private search", 2)
    # the noise sweep: the DP search at sigma 0.5 / 1 / 2 and the smallest p between two of them
    sigmas = " / ".join(cm[f"DP search sigma {x}"][0] for x in ("0.5", "1", "2"))
    p_sigma = min(ct[f"DP search sigma {a} vs DP search sigma {b}"]["p_value"]
                  for a, b in (("2", "1"), ("2", "0.5"), ("1", "0.5")))
    noise = (f"sigma 0.5 / 1 / 2 reaches {sigmas}, every pair p >= "
             f"{math.floor(p_sigma * 100) / 100:.2f}")
    return [
        ("fnas.md", f"The DP search's genotypes reach {dp[0]} ± {dp[1]} against {nonp[0]} ± "
                    f"{nonp[1]} for non-private search (p = {p_dp})"),
        ("fnas.md", f"At the one chosen on validation they reach {cdp[0]} ± {cdp[1]}. The "
                    f"non-private search reaches {cnp[0]} ± {cnp[1]} (p = {dp_np}) and random "
                    f"genotypes {crand[0]} ± {crand[1]} (DP vs random p = {dp_rand})"),
        ("fnas.md", f"The search noise (clip-only vs sigma = 2: p = {clip_dp}; "
                    f"{noise.replace('sigma 0.5 / 1 / 2 reaches', 'sigma = 0.5 / 1 / 2 reach')})"
                    f" and the clipping (clip-only vs non-private: p = {clip_np})"),
        ("fnas.md", f"the DP search at {noise}) nor the clipping (p = {clip_np})"),
        ("fnas.md", f"the DP search's genotypes reach {dp[0]} ± {dp[1]} against {nonp[0]} ± "
                    f"{nonp[1]} for non-private search (Welch p = {p_dp}) and {rand[0]} ± "
                    f"{rand[1]} for random genotypes"),
        ("fnas.md", f"the DP search reaches {cdp[0]} ± {cdp[1]}, non-private search {cnp[0]} ± "
                    f"{cnp[1]} (p = {dp_np}), random genotypes {crand[0]} ± {crand[1]} (DP vs "
                    f"random p = {dp_rand})"),
        ("index.md", f"Retrained at a fixed step size: DP search {dp[0]}, non-private search "
                     f"{nonp[0]} (p = {p_dp}), random genotypes {rand[0]}. Retrained at the step "
                     f"size chosen on validation: DP search {cdp[0]}, non-private {cnp[0]} "
                     f"(p = {dp_np}), random {crand[0]} (DP vs random p = {dp_rand})"),
        ("index.md", f"not the search noise (clip-only vs DP p = {clip_dp}; DP search at "
                     f"{noise.replace(' reaches ', ': ')}) or the clipping (p = {clip_np})"),
        ("reproducibility.md", f"{cdp[0]} vs {cnp[0]} vs {crand[0]} at the step size chosen on "
                               f"validation (p = {dp_np} DP vs non-private, {dp_rand} DP vs "
                               f"random)"),
    ]


def isrl_claims() -> list[tuple[str, str]]:
    sel = {tuple(r["algorithm.phase_length+algorithm.accounting+algorithm.learning_rate+"
                   "algorithm.clip_norm"][:2]): r
           for r in _json("results/sweeps/isrl_reproduction/selected.json")}
    mb, comp, ref = sel[(1, "composed")], sel[(2, "composed")], sel[(2, "reference")]
    tests = _json("results/isrl/reproduction_tests.json")["tests"]
    p_comp = tests["MB-SGD (q=1) vs SPIDER q=2 composed"]["p_value"]
    p_ref = tests["MB-SGD (q=1) vs SPIDER q=2 reference"]["p_value"]
    true_eps = f"{ref['epsilon_mean']:.2f}"
    # the seven-epsilon tables (fedjax-dp compare selected of the isrl_wbcd / isrl_mnist5k_oddeven
    # sweeps): at how many epsilons SPIDER's test error is at or below MB-SGD's
    def at_or_below(ds):
        rows = _json(f"results/isrl/seven_epsilon_{ds}.json")["rows"]
        assert len(rows) == 7
        return sum(r["cells"]["isrl_spider"]["test_accuracy_mean"]
                   >= r["cells"]["isrl_mb_sgd"]["test_accuracy_mean"] for r in rows)

    return [
        ("index.md", f"MB-SGD reaches {f3(mb['test_accuracy_mean'])}, SPIDER "
                     f"{f3(comp['test_accuracy_mean'])} (Welch p = {p_comp:.1g}), and "
                     f"{f3(ref['test_accuracy_mean'])} even under the authors' accounting, which "
                     f"spends {true_eps}x the budget (p = {p_ref:.2g})"),
        ("index.md", f"SPIDER is at or below MB-SGD at {at_or_below('wbcd')} of 7 epsilons on "
                     f"WBCD, {at_or_below('mnist5k_oddeven')} of 7 on mnist5k odd/even"),
        ("reproducibility.md", f"MB-SGD {f3(mb['test_accuracy_mean'])} ± "
                               f"{f3(mb['test_accuracy_std'])} test accuracy; SPIDER (q = 2) as "
                               f"the authors account it {f3(ref['test_accuracy_mean'])} ± "
                               f"{f3(ref['test_accuracy_std'])} at a true epsilon of {true_eps} "
                               f"(Welch p = {p_ref:.2g} against MB-SGD), as it should be "
                               f"accounted {f3(comp['test_accuracy_mean'])} ± "
                               f"{f3(comp['test_accuracy_std'])} (p = {p_comp:.1g})"),
        ("isrl.md", f"({f3(ref['test_accuracy_mean'])} against {f3(mb['test_accuracy_mean'])}; "
                    f"Welch p = {p_ref:.2g} over the 5 seeds"),
    ]


ISRL_NAMES = {"isrl_spider": "ISRL-DP SPIDER", "isrl_prox_pl_svrg": "ISRL-DP Prox-PL-SVRG",
              "isrl_mb_sgd": "ISRL-DP MB-SGD", "isrl_local_sgd": "ISRL-DP Local SGD"}


def isrl_seven_epsilon_claims() -> list[tuple[str, str]]:
    """docs/isrl.md's seven-epsilon tables (test error mean ± std of the chosen cell) and the
    Welch tests of SPIDER against MB-SGD, from the compare outputs of the two sweeps."""
    claims = []
    for ds in ("wbcd", "mnist5k_oddeven"):
        rows = _json(f"results/isrl/seven_epsilon_{ds}.json")["rows"]
        for algo, name in ISRL_NAMES.items():
            cells = [r["cells"][algo] for r in rows]
            claims.append(("isrl.md", f"| {name} | " + " | ".join(
                f"{f3(1 - c['test_accuracy_mean'])} ± {f3(c['test_accuracy_std'])}"
                for c in cells) + " |"))
        tests = [r["tests"].get("isrl_mb_sgd vs isrl_spider") for r in rows]
        won = sum(t["p_value"] < 0.05 and t["difference"] > 0 for t in tests)
        lost = sum(t["p_value"] < 0.05 and t["difference"] < 0 for t in tests)
        claims.append(("isrl.md", f"{ds}: MB-SGD ahead of SPIDER at p < 0.05 at {won} of 7 "
                                  f"epsilons, behind at {lost}"))
    return claims


def isrl_silo_claims() -> list[tuple[str, str]]:
    """ISRL at the paper's silo size: the chosen cells and their Welch p."""
    table = _json("results/isrl/paper_silos.json")
    mb, sp = "ISRL-DP MB-SGD", "ISRL-DP SPIDER"
    rows = [_row(table, target_epsilon=e) for e in (0.75, 3.0, 18.0)]
    acc = lambda r, n: f3(r["cells"][n]["test_accuracy_mean"])              # noqa: E731
    ps = [r["tests"][f"{mb} vs {sp}"]["p_value"] for r in rows]
    fmt = [f"{ps[0]:.1g}", sci(ps[1]), f"{ps[2]:.3f}"]
    claims = [("reproducibility.md",
               f"0.75 / 3 / 18: {' / '.join(acc(r, mb) for r in rows)} against "
               f"{' / '.join(acc(r, sp) for r in rows)} (Welch p = {' / '.join(fmt)};"),
              ("index.md", f"MB-SGD still leads at epsilon 0.75 / 3 / 18 (p = "
                           f"{' / '.join(fmt)})")]
    for r, e, p in zip(rows, ("0.75", "3", "18"), fmt):
        m, s = r["cells"][mb], r["cells"][sp]
        claims.append(("isrl.md", f"| {e} | **{f3(m['test_accuracy_mean'])} ± "
                                  f"{f3(m['test_accuracy_std'])}**"))
        claims.append(("isrl.md", f"| {f3(s['test_accuracy_mean'])} ± "
                                  f"{f3(s['test_accuracy_std'])}"))
        claims.append(("isrl.md", f"| {m['test_accuracy_mean'] - s['test_accuracy_mean']:+.3f}"
                                  f" (p = {p}) |"))
    return claims


def shuffle_claims() -> list[tuple[str, str]]:
    """The L2 analysis' gain over the per-coordinate one, in points, over every SDP row."""
    rows = _json("results/sweeps/isrl_sdp/selected.json")
    acc = {(r["base"], r["target_epsilon"], r["algorithm.shuffle_analysis"]):
           r["test_accuracy_mean"] for r in rows}
    gains = [100 * (acc[b, e, "l2"] - acc[b, e, "per_coordinate"]) for b, e, a in acc
             if a == "l2"]
    span = f"{int(np.floor(min(gains)))}-{int(np.ceil(max(gains)))} points"
    mb = acc["isrl/mnist5k_oddeven_sdp_mb_sgd", 1.0, "l2"]
    return [("shuffle_dp.md", f"the L2 analysis gains {span} everywhere. Its SDP MB-SGD on "
                              f"mnist5k odd/even reaches {f3(mb)} at epsilon 1"),
            ("reproducibility.md", f"the L2 analysis gains {span} of")]


def fedkt_claims() -> list[tuple[str, str]]:
    def cells(path):
        out = {}
        for r in read([ROOT / path]):
            key = (r["dataset"], r["config"]["model"]["name"])
            out.setdefault(key, []).append(r["test_accuracy"])
        return {k: (np.mean(v), np.std(v, ddof=1)) for k, v in out.items()}

    l0 = cells("results/fedkt/table1_seeds")
    solo = cells("results/sweeps/fedkt_table1_solo")
    pate = cells("results/sweeps/fedkt_table1_pate")
    claims = []
    for key, label in ((("mnist5k", "mlp"), "| mnist5k (10, mlp 100-100) |"),
                       (("digits", "mlp"), "| digits (5, mlp 100) |"),
                       (("wbcd", "mlp"), "| wbcd (5, mlp 32) |"),
                       (("wbcd", "logistic"), "| wbcd (5, DT teachers / RF students) |")):
        claims.append(("fedkt.md", f"{label} {f3(l0[key][0])} ± {f3(l0[key][1])} | "
                                   f"{f3(solo[key][0])} ± {f3(solo[key][1])} | "
                                   f"{f3(pate[key][0])} ± {f3(pate[key][1])} |"))
        # the difference columns of the same row, from the unrounded means
        claims.append(("fedkt.md", f"| {l0[key][0] - solo[key][0]:+.3f} | "
                                   f"{pate[key][0] - l0[key][0]:+.3f} |"))
    # FedKT-L0 against the chosen one-round FedAvg / FedProx cells: Welch's p per dataset
    from scipy import stats
    path = [ROOT / "results/fedkt/table1_one_round_seeds"]
    one: dict = {}
    for r in records.selected_records(read(path), records.read_selected(path)):
        one.setdefault((r["dataset"], r["config"]["train"]["prox_mu"]), []).append(
            r["test_accuracy"])
    l0_runs: dict = {}
    for r in read([ROOT / "results/fedkt/table1_seeds"]):
        if r["config"]["model"]["name"] == "mlp":
            l0_runs.setdefault(r["dataset"], []).append(r["test_accuracy"])
    p = {(d, mu): stats.ttest_ind(l0_runs[d], v, equal_var=False).pvalue
         for (d, mu), v in one.items()}
    claims.append(("fedkt.md", f"above both one-round baselines on mnist5k (Welch p "
                               f"{p[('mnist5k', 0.0)]:.3f} / {p[('mnist5k', 0.01)]:.3f})"))
    claims.append(("fedkt.md", f"digits (p {p[('digits', 0.0)]:.2f} / {p[('digits', 0.01)]:.2f}) "
                               f"and wbcd (p {p[('wbcd', 0.0)]:.2f} / {p[('wbcd', 0.01)]:.2f})"))
    # the one-round baselines: the cell chosen on validation, its step count in brackets
    for r in records.read_selected([ROOT / "results/fedkt/table1_one_round_seeds"]):
        if r["algorithm"] == "fedavg":                          # FedAvg and FedProx
            steps = next(iter(r["selected"].values()))
            claims.append(("fedkt.md", f"| {f3(r['test_accuracy_mean'])} ± "
                                       f"{f3(r['test_accuracy_std'])} ({steps}) |"))
    return claims


def adaptive_clip_claims() -> list[tuple[str, str]]:
    """docs/adaptive_clipping.md's table: per clip S (= C_0), fixed and adaptive mean ± std over
    3 seeds, their difference and Welch's p, from the two sweeps' records."""
    from scipy import stats
    claims = []
    for name in ("mnist5k", "synthetic"):
        cells: dict = {}
        for r in read([ROOT / f"results/sweeps/adaptive_clip_{name}"]):
            key = (r["params"]["algorithm.clip_norm"], bool(r["params"]["algorithm.adaptive_clip"]))
            cells.setdefault(key, []).append(r["test_accuracy"])
        for s in sorted({k[0] for k in cells}):
            fixed, adaptive = cells[(s, False)], cells[(s, True)]
            p = stats.ttest_ind(adaptive, fixed, equal_var=False).pvalue
            claims.append(("adaptive_clipping.md",
                           f"| {name} | {s:g} | {f3(np.mean(fixed))} ± {f3(np.std(fixed, ddof=1))} | "
                           f"{f3(np.mean(adaptive))} ± {f3(np.std(adaptive, ddof=1))} | "
                           f"{np.mean(adaptive) - np.mean(fixed):+.3f} | {p:.3f} |"))
    return claims


def correlated_noise_claims() -> list[tuple[str, str]]:
    """docs/correlated_noise.md's table: per population and target epsilon, each arm's mean ±
    std over 3 seeds and Welch's p against independent noise, from the two sweeps' records."""
    from scipy import stats
    claims = []
    for name in ("mnist5k", "synthetic"):
        cells: dict = {}
        for r in read([ROOT / f"results/sweeps/correlated_noise_{name}"]):
            arm = r["base"].rsplit(f"correlated_noise_{name}_", 1)[1]
            cells.setdefault((r["target_epsilon"], arm), []).append(r["test_accuracy"])
        for eps in sorted({k[0] for k in cells}):
            ind = cells[(eps, "independent")]
            row = f"| {name} | {eps:g} | {f3(np.mean(ind))} ± {f3(np.std(ind, ddof=1))} |"
            for arm in ("banded_mf", "blt", "tree"):
                acc = cells[(eps, arm)]
                p = stats.ttest_ind(acc, ind, equal_var=False).pvalue
                row += (f" {f3(np.mean(acc))} ± {f3(np.std(acc, ddof=1))} "
                        f"({np.mean(acc) - np.mean(ind):+.3f}, p {p:.3f}) |")
            claims.append(("correlated_noise.md", row))
            if name == "mnist5k":              # the calibrated noise multipliers
                z = {}
                for r in read([ROOT / "results/sweeps/correlated_noise_mnist5k"]):
                    if r["target_epsilon"] == eps:
                        z[r["base"].rsplit("_mnist5k_", 1)[1]] = r["calibrated"]["value"]
                claims.append(("correlated_noise.md", f"| {eps:g} | {z['independent']:.2f} | "
                                                      f"{z['banded_mf']:.2f} | {z['blt']:.2f} | "
                                                      f"{z['tree']:.2f} |"))
    return claims


def distributed_dp_claims() -> list[tuple[str, str]]:
    """docs/distributed_dp.md's tables: per population, the central arm's calibrated z and
    accuracy, and per bit-width each discrete arm's z and mean ± std (Welch's p against the
    central arm), from the two sweeps' records."""
    from scipy import stats
    claims = []
    for name in ("mnist5k", "synthetic"):
        cells: dict = {}
        zs: dict = {}
        for r in read([ROOT / f"results/sweeps/distributed_dp_{name}"]):
            arm = r["params"]["algorithm.distributed_noise"]
            key = "none" if arm == "none" else (arm["kind"], arm["bits"])
            cells.setdefault(key, []).append(r["test_accuracy"])
            zs[key] = r["calibrated"]["value"]
        ref = cells["none"]
        claims.append(("distributed_dp.md", f"| {name} | central | {zs['none']:.2f} | "
                       f"{f3(np.mean(ref))} ± {f3(np.std(ref, ddof=1))} | | |"))
        for bits in sorted({k[1] for k in cells if k != "none"}):
            row = f"| {name} | {bits} |"
            for kind in ("ddg", "skellam"):
                acc = cells[(kind, bits)]
                p = stats.ttest_ind(acc, ref, equal_var=False).pvalue
                row += (f" {zs[(kind, bits)]:.2f} | {f3(np.mean(acc))} ± "
                        f"{f3(np.std(acc, ddof=1))} ({np.mean(acc) - np.mean(ref):+.3f}, "
                        f"p {p:.3f}) |")
            claims.append(("distributed_dp.md", row))
    return claims


def participation_claims() -> list[tuple[str, str]]:
    """docs/privacy_units.md's table: per population and target epsilon, the Poisson baseline's
    z and mean ± std, and each other arm's (Welch's p against the baseline)."""
    from scipy import stats
    claims = []
    for name, arms in (("mnist5k", ("fixed",)), ("synthetic", ("weighted", "fixed"))):
        cells: dict = {}
        zs: dict = {}
        for r in read([ROOT / f"results/sweeps/participation_{name}"]):
            arm = ("poisson" if r["base"].endswith("_independent")
                   else r["base"].rsplit("_", 1)[1])
            cells.setdefault((r["target_epsilon"], arm), []).append(r["test_accuracy"])
            zs[(r["target_epsilon"], arm)] = r["calibrated"]["value"]
        for eps in sorted({k[0] for k in cells}):
            ref = cells[(eps, "poisson")]
            row = (f"| {name} | {eps:g} | {zs[(eps, 'poisson')]:.2f} | {f3(np.mean(ref))} ± "
                   f"{f3(np.std(ref, ddof=1))} |")
            for arm in ("weighted", "fixed"):
                if arm not in arms:
                    row += " | |"
                    continue
                acc = cells[(eps, arm)]
                p = stats.ttest_ind(acc, ref, equal_var=False).pvalue
                row += (f" {zs[(eps, arm)]:.2f} | {f3(np.mean(acc))} ± {f3(np.std(acc, ddof=1))}"
                        f" ({np.mean(acc) - np.mean(ref):+.3f}, p {p:.3f}) |")
            claims.append(("privacy_units.md", row))
    return claims


def one_run_audit_claims() -> list[tuple[str, str]]:
    """docs/audit.md's one-run figures, from the audit's JSON."""
    r = _json("results/audit/one_run_mnist5k.json")
    return [("audit.md", f"Of {r['canaries']:,} canaries, {r['included']} were included. The "
                         f"lower bound is {r['epsilon_lower_bound']:.2f} against the ledger's "
                         f"{r['claimed_epsilon']:.2f} (RDP, delta 1e-5)"),
            ("audit.md", f"mean score is {r['mean_in_score']:.3f} and the left-out canaries' "
                         f"{r['mean_out_score']:.3f}")]


CLAIMS = (one_run_audit_claims() + correlated_noise_claims() + voting_claims() + crossing_claims() + tuning_claims() + fnas_claims() + isrl_claims() + isrl_seven_epsilon_claims()
          + isrl_silo_claims()
          + shuffle_claims() + fedkt_claims() + adaptive_clip_claims() + distributed_dp_claims()
          + participation_claims())


@pytest.mark.parametrize("page, text", CLAIMS, ids=[f"{p}:{t[:40]}" for p, t in CLAIMS])
def test_page_quotes_the_records(page, text):
    assert " ".join(text.split()) in _page(page), f"docs/{page} does not say: {text}"


def test_every_paper_page_and_the_summaries_have_checked_claims():
    # every other page with results, and that each such page has claims somewhere:
    # test_docs_records_pages.py (RESULT_PAGES, OTHER_PAGES)
    pages = {p for p, _ in CLAIMS}
    assert {"index.md", "reproducibility.md", "voting_dpfl.md", "fnas.md", "isrl.md",
            "shuffle_dp.md", "fedkt.md"} <= pages
