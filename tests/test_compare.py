"""fedjax-dp compare: chosen cells of several sweeps side by side, and the arms of one grid key
with Welch's test on unit means, checked against numpy / scipy on hand-made records."""
from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from scipy import stats

from fedjax_dp.experiments import cli, compare

KEY = "algorithm.private+algorithm.fixed_genotype"


def _records():
    """3 arms x 4 units (seeds) x 3 repeats (retrain_seed), accuracies from a fixed draw."""
    rng = np.random.default_rng(0)
    recs, acc = [], {}
    for arm, shift in (([True, ""], 0.1), ([False, ""], 0.12), ([False, "random"], 0.0)):
        for seed in range(4):
            for rs in range(3):
                a = float(0.5 + shift + rng.normal(0, 0.03))
                acc[json.dumps(arm), seed, rs] = a
                recs.append({"seed": seed, "test_accuracy": a,
                             "params": {KEY: arm, "algorithm.retrain_seed": rs}})
    return recs, acc


def test_arms_statistics_and_welch_tests_match_numpy_and_scipy():
    recs, acc = _records()
    s = compare.arms(recs, KEY, labels=["dp", "search", "random"])
    assert list(s["arms"]) == ["dp", "search", "random"]
    for name, arm in zip(s["arms"], ([True, ""], [False, ""], [False, "random"])):
        a = s["arms"][name]
        runs = [v for (k, _, _), v in acc.items() if k == json.dumps(arm)]
        means = [np.mean([acc[json.dumps(arm), u, r] for r in range(3)]) for u in range(4)]
        assert a["runs"] == 12 and a["units"] == 4 and a["runs_per_unit"] == [3]
        assert a["pooled_mean"] == pytest.approx(np.mean(runs))
        assert a["pooled_std"] == pytest.approx(np.std(runs, ddof=1))
        assert list(a["unit_means"].values()) == pytest.approx(means)
        assert a["between_unit_std"] == pytest.approx(np.std(means, ddof=1))
        assert a["within_unit_std"] == pytest.approx(np.mean(
            [np.std([acc[json.dumps(arm), u, r] for r in range(3)], ddof=1) for u in range(4)]))
    t = s["tests"]["dp vs random"]
    want = stats.ttest_ind(list(s["arms"]["dp"]["unit_means"].values()),
                           list(s["arms"]["random"]["unit_means"].values()), equal_var=False)
    assert (t["t"], t["p_value"]) == pytest.approx((want.statistic, want.pvalue))
    assert set(s["tests"]) == {"dp vs search", "dp vs random", "search vs random"}
    md = compare.arms_markdown(s)
    assert "| dp | 12 | 4 |" in md and "dp vs random" in md


def test_arms_refuses_what_it_cannot_group():
    recs, _ = _records()
    with pytest.raises(ValueError, match="labels: 2 labels for 3 arms"):
        compare.arms(recs, KEY, labels=["a", "b"])
    with pytest.raises(ValueError, match="distinct and non-empty"):    # one arm would hide another
        compare.arms(recs, KEY, labels=["a", "b", "a"])
    with pytest.raises(ValueError, match="distinct and non-empty"):
        compare.arms(recs, KEY, labels=["a", " ", "c"])
    with pytest.raises(ValueError, match="algorithm.nope"):
        compare.arms(recs, "algorithm.nope")


def _selected(folder, algorithm, cells):
    folder.mkdir()
    (folder / "selected.json").write_text(json.dumps([
        {"base": "b", "algorithm": algorithm, "data.num_agents": n, "target_epsilon": e,
         "selected": {"algorithm.rounds": 10}, "n_candidates": 2, "val_accuracy_mean": m,
         "n": 3, "test_accuracy_mean": m, "test_accuracy_std": 0.01, "epsilon_mean": e,
         "epsilon_std": 0.0, "epsilon_unit": "agent", "calibrated_value": 1.0}
        for n, e, m in cells]))
    return folder


def test_selected_table_lines_up_sweeps_and_marks_the_best(tmp_path, capsys):
    a = _selected(tmp_path / "a", "dp_fedavg", [(50, 1.0, 0.6), (50, 4.0, 0.8)])
    b = _selected(tmp_path / "b", "ae_dpfl", [(50, 1.0, 0.7)])
    top = _selected(tmp_path / "top", "fedavg", [(1, None, 0.9)])
    md, data = compare.selected_table([a, b], ceiling=top)
    assert data["row_keys"] == ["data.num_agents", "target_epsilon"]
    assert [r["best"] for r in data["rows"]] == [["ae_dpfl"], ["dp_fedavg"]]
    assert "| 50 | 4.0 | **0.800 ± 0.010** (rounds=10, eps 4) | - |" in md
    assert "Ceiling without privacy" in md and "0.900" in md
    out = tmp_path / "cmp"
    assert cli.main(["compare", "selected", str(a), str(b), "--names", "x,y",
                     "--out", str(out)]) == 0
    assert json.loads((tmp_path / "cmp.json").read_text())["names"] == ["x", "y"]
    assert cli.main(["compare", "selected", str(tmp_path), "--out", str(out)]) == 2
    assert "no selected.json" in capsys.readouterr().err


def test_cli_compare_arms_writes_the_table_the_json_and_the_plot(tmp_path):
    recs, _ = _records()
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    out = tmp_path / "arms"
    assert cli.main(["compare", "arms", str(tmp_path), "--arm", KEY, "--out", str(out)]) == 0
    data = json.loads(out.with_suffix(".json").read_text())
    assert [a["value"] for a in data["arms"].values()] == [[True, ""], [False, ""],
                                                            [False, "random"]]
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    assert "Welch" in out.with_suffix(".md").read_text()


def test_difference_matches_welch_and_the_exact_bootstrap_on_tiny_samples():
    a, b = [0.71, 0.74, 0.69], [0.66, 0.70, 0.61]
    d = compare.difference(a, b, resamples=200_000)
    want = stats.ttest_ind(a, b, equal_var=False)
    assert (d["t"], d["p_value"]) == pytest.approx((want.statistic, want.pvalue))
    assert d["difference"] == pytest.approx(np.mean(a) - np.mean(b)) and d["n"] == [3, 3]
    # the bootstrap's exact law: all 27 x 27 equally likely pairs of resamples, enumerated
    exact = np.sort([np.mean(x) - np.mean(y) for x in itertools.product(a, repeat=3)
                     for y in itertools.product(b, repeat=3)])
    lo, hi = d["interval"]
    assert np.quantile(exact, 0.02) <= lo <= np.quantile(exact, 0.03)
    assert np.quantile(exact, 0.97) <= hi <= np.quantile(exact, 0.98)
    assert d["excludes_zero"] == (lo > 0)
    same = compare.difference([0.5, 0.5], [0.5, 0.5])
    assert np.isnan(same["p_value"]) and same["interval"] == [0.0, 0.0]
    with pytest.raises(ValueError, match="2 or more values"):
        compare.difference([0.5], [0.4, 0.6])


def _sweep_with_runs(folder, cells):
    """A sweep folder with selected.json and results.jsonl: cells (algorithm, epsilon, chosen
    rounds, per-seed accuracies); a second rounds value is a candidate not chosen."""
    folder.mkdir()
    rows, recs = [], []
    for algorithm, e, rounds, accs in cells:
        rows.append({"base": f"b/{algorithm}", "algorithm": algorithm, "target_epsilon": e,
                     "selected": {"algorithm.rounds": rounds}, "n_candidates": 2,
                     "val_accuracy_mean": 0.0, "n": len(accs),
                     "test_accuracy_mean": float(np.mean(accs)),
                     "test_accuracy_std": float(np.std(accs, ddof=1)), "epsilon_mean": e,
                     "epsilon_std": 0.0, "epsilon_unit": "agent", "calibrated_value": 1.0})
        for r in (rounds, rounds + 1):
            for seed, acc in enumerate(accs):
                recs.append({"base": f"b/{algorithm}", "algorithm": algorithm, "seed": seed,
                             "target_epsilon": e, "params": {"algorithm.rounds": r},
                             "test_accuracy": acc if r == rounds else 0.0})
    (folder / "selected.json").write_text(json.dumps(rows))
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return folder


def test_selected_table_tests_every_two_cells_from_the_sweeps_seeds(tmp_path):
    # one sweep holding two algorithms (a column each) beside a sweep of one
    two = _sweep_with_runs(tmp_path / "two", [("x", 1.0, 10, [0.80, 0.82, 0.81]),
                                              ("y", 1.0, 20, [0.70, 0.72, 0.69]),
                                              ("x", 4.0, 10, [0.90, 0.91])])
    one = _sweep_with_runs(tmp_path / "one", [("z", 1.0, 5, [0.79, 0.85, 0.80, 0.83]),
                                              ("z", 4.0, 5, [0.92, 0.90, 0.91])])
    md, data = compare.selected_table([two, one], resamples=2_000)
    assert data["names"] == ["x", "y", "z"]
    row1, row4 = data["rows"]
    assert set(row1["tests"]) == {"x vs y", "x vs z", "y vs z"}
    want = compare.difference([0.80, 0.82, 0.81], [0.79, 0.85, 0.80, 0.83], resamples=2_000)
    assert row1["tests"]["x vs z"] == want
    assert row1["tests"]["x vs y"]["excludes_zero"] and row1["tests"]["x vs y"]["n"] == [3, 3]
    assert row4["tests"] == {}                      # x has 2 seeds at epsilon 4: not tested
    assert row1["tests"]["x vs y"]["p_value"] < 0.05
    assert "| target_epsilon=1.0 | x vs y | +0.107 * |" in md and "Welch p" in md
    assert "| target_epsilon=1.0 | x vs z | -0.008 |" in md        # no star: p > 0.05
    with pytest.raises(ValueError, match="names: 2 names for 3 columns"):
        compare.selected_table([two, one], names=["a", "b"])


def _gaussian_run(algorithm, lr, seed, z, count):
    from fedjax_dp.privacy import accounting
    from dp_accounting import dp_event
    event = dp_event.SelfComposedDpEvent(dp_event.GaussianDpEvent(z), count)
    return {"base": "b", "algorithm": algorithm, "seed": seed, "target_epsilon": 2.0,
            "params": {"train.learning_rate": lr, "data.num_agents": 50}, "test_accuracy": 0.5,
            "privacy": [{"unit": "agent", "accountant": "rdp", "delta": 1e-5,
                         "events": [accounting.event_to_json(event)]}]}


def test_tuning_cost_composes_every_candidate_like_one_gaussian_of_the_summed_rdp():
    from dp_accounting import dp_event, rdp
    # three candidates (learning rates) x two seeds; a cell of other num_agents is not one
    zs = {0.1: (4.0, 10), 0.3: (5.0, 20), 1.0: (3.0, 5)}
    runs = [_gaussian_run("a", lr, seed, *zs[lr]) for lr in zs for seed in (1, 0)]
    runs.append({**_gaussian_run("a", 0.1, 0, 0.5, 1), "params": {"train.learning_rate": 0.1,
                                                                  "data.num_agents": 99}})
    row = {"base": "b", "algorithm": "a", "target_epsilon": 2.0, "data.num_agents": 50,
           "selected": {"train.learning_rate": 0.3}, "epsilon_mean": 2.0,
           "epsilon_unit": "agent"}
    cost = compare.tuning_cost(runs, row)
    # Gaussian RDP alpha / (2 z^2) adds over the compositions: one Gaussian of
    # z = (sum count / z^2)^(-1/2) has the same RDP curve, hence the same epsilon (up to the
    # accountants' grids of orders: the library's is finer than dp-accounting's default)
    z_all = sum(c / z ** 2 for z, c in zs.values()) ** -0.5
    want = rdp.RdpAccountant().compose(dp_event.GaussianDpEvent(z_all)).get_epsilon(1e-5)
    assert cost["candidates"] == 3 and cost["epsilon_all"] == pytest.approx(want, rel=1e-3)
    assert cost["epsilon_one"] == 2.0
    shuffled = [dict(r, privacy=[dict(r["privacy"][0], events=[{
        "class_name": "X", "module_name": "fedjax_dp.privacy.shuffle_accounting"}])])
        for r in runs]
    assert compare.tuning_cost(shuffled, row) is None


def test_tuning_cost_of_a_parallel_ledger_is_its_worst_members_composition():
    from dp_accounting import dp_event, rdp
    from fedjax_dp.privacy import accounting

    def run(lr, zs):       # member m's whole event: a Gaussian of z = zs[m]
        r = _gaussian_run("a", lr, 0, 1.0, 1)
        r["privacy"][0]["parallel"] = [{"num_members": 3, "distinct_members": [
            {"members": [m], "event": accounting.event_to_json(dp_event.GaussianDpEvent(z))}
            for m, z in enumerate(zs)]}]
        return r

    runs = [run(0.1, [2.0, 3.0, 4.0]), run(0.3, [5.0, 1.5, 4.0])]
    row = {"base": "b", "algorithm": "a", "target_epsilon": 2.0, "data.num_agents": 50,
           "selected": {"train.learning_rate": 0.1}, "epsilon_unit": "agent"}
    cost = compare.tuning_cost(runs, row)
    want = max(rdp.RdpAccountant().compose(dp_event.GaussianDpEvent(
        (a ** -2 + b ** -2) ** -0.5)).get_epsilon(1e-5) for a, b in ((2, 5), (3, 1.5), (4, 4)))
    assert cost["members"] == 3 and cost["epsilon_all"] == pytest.approx(want, rel=1e-3)
