"""fedjax_dp.experiments.plots and ``fedjax-dp plot`` / ``run --plot`` on hand-made records (no
training)."""
from __future__ import annotations

import json
import subprocess
import sys
import warnings

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from fedjax_dp.experiments import cli, plots, records  # noqa: E402

ALGOS = ("dp_fedavg", "ae_dpfl")
EPSILONS = (8.0, 2.0)            # deliberately not sorted
SEEDS = (0, 1, 2)


def _record(algorithm, epsilon, seed, acc, history=None, **extra):
    rec = {"algorithm": algorithm, "dataset": "digits", "num_agents": 10, "seed": seed,
           "params": {"algorithm.noise_multiplier": 10.0 / epsilon if epsilon else None},
           "target_epsilon": epsilon, "calibrated": None, "test_accuracy": acc,
           "epsilon": epsilon, "epsilon_unit": "agent", "epsilon_accountant": "rdp",
           "delta": 1e-5, "privacy": [],
           "history": history if history is not None else
           [{"round": t, "loss": 1.0 / t + 0.01 * seed} for t in (1, 2, 3)],
           "wall_time_s": 1.0, "config": {"algorithm": {"name": algorithm, "rounds": 3}},
           "run_id": f"{algorithm}-{epsilon}-{seed}", "sweep": "hand"}
    rec.update(extra)
    return rec


@pytest.fixture
def grid():
    """3 seeds x 2 epsilons x 2 algorithms, accuracies from a fixed random draw."""
    rng = np.random.default_rng(0)
    recs, acc = [], {}
    for a in ALGOS:
        for e in EPSILONS:
            for s in SEEDS:
                acc[a, e, s] = float(rng.uniform(0.3, 0.9))
                recs.append(_record(a, e, s, acc[a, e, s]))
    return recs, acc


def _write_jsonl(path, recs):
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def _check_files(paths):
    """STEM.png, STEM.svg and STEM.pdf, each a real file of its kind."""
    png, svg, pdf = map(__import__("pathlib").Path, paths)
    assert (png.suffix, svg.suffix, pdf.suffix) == (".png", ".svg", ".pdf")
    assert png.with_suffix("") == svg.with_suffix("") == pdf.with_suffix("")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 1000
    assert "<svg" in svg.read_text()
    assert pdf.read_bytes()[:5] == b"%PDF-" and pdf.stat().st_size > 1000


# --------------------------------------------------------------------------- summarize

def test_summarize_mean_std_match_numpy(grid):
    recs, acc = grid
    rows = plots.summarize(recs, "epsilon", "test_accuracy", hue="algorithm")
    assert [(r["hue"], r["x"]) for r in rows] == [(a, e) for a in sorted(ALGOS)
                                                  for e in sorted(EPSILONS)]
    for r in rows:
        v = np.array([acc[r["hue"], r["x"], s] for s in SEEDS])
        assert r["n"] == 3
        assert r["mean"] == pytest.approx(v.mean())
        assert r["std"] == pytest.approx(v.std(ddof=1))
    # no hue: one group per x, over both algorithms
    rows = plots.summarize(recs, "epsilon", "test_accuracy")
    assert [r["hue"] for r in rows] == [None, None] and [r["n"] for r in rows] == [6, 6]
    v = np.array([acc[a, 2.0, s] for a in ALGOS for s in SEEDS])
    assert rows[0]["mean"] == pytest.approx(v.mean())
    assert rows[0]["std"] == pytest.approx(v.std(ddof=1))


def test_summarize_single_record_std_zero_numeric_order_and_params(grid):
    recs, _ = grid
    one = [_record("a", e, 0, 0.5) for e in (10.0, 2.0, 0.5)]
    rows = plots.summarize(one, "epsilon", "test_accuracy")
    assert [r["x"] for r in rows] == [0.5, 2.0, 10.0]        # numerically, not as text
    assert all(r["std"] == 0.0 and r["n"] == 1 for r in rows)
    # a swept key is found in params; a dotted path in the config
    rows = plots.summarize(recs, "algorithm.noise_multiplier", "test_accuracy", hue="seed")
    assert {r["x"] for r in rows} == {1.25, 5.0} and [r["hue"] for r in rows][:2] == [0, 0]
    rows = plots.summarize(recs, "algorithm.rounds", "test_accuracy")
    assert len(rows) == 1 and rows[0]["n"] == 12


def test_a_hue_of_two_fields_joined_by_plus_is_a_line_per_pair(grid):
    """``--hue algorithm+target_epsilon``: one line per (method, epsilon) pair, each over its own
    seeds; an unknown part names the field."""
    recs, acc = grid
    rows = plots.summarize(recs, "num_agents", "test_accuracy", hue="algorithm+target_epsilon")
    assert sorted(r["hue"] for r in rows) == sorted(f"{a}, {e}" for a in ALGOS for e in EPSILONS)
    for r in rows:
        a, e = r["hue"].split(", ")
        assert r["n"] == 3
        assert r["mean"] == pytest.approx(np.mean([acc[a, float(e), s] for s in SEEDS]))
    with pytest.raises(ValueError, match="no_such_key"):
        plots.summarize(recs, "num_agents", "test_accuracy", hue="algorithm+no_such_key")


def test_summarize_drops_missing_x_with_a_count(grid):
    recs, _ = grid
    recs = recs + [_record("fedavg", None, s, 0.9) for s in SEEDS]      # no privacy: no epsilon
    with pytest.warns(UserWarning, match="3 of 15 records"):
        rows = plots.summarize(recs, "epsilon", "test_accuracy", hue="algorithm")
    assert "fedavg" not in {r["hue"] for r in rows} and len(rows) == 4


def test_errors_name_the_parameter(grid):
    recs, _ = grid
    with pytest.raises(ValueError, match=r"^y: unknown field 'acc'.*'test_accuracy'.*"
                                         r"params \['algorithm.noise_multiplier'\]"):
        plots.summarize(recs, "epsilon", "acc")
    with pytest.raises(ValueError, match=r"^x: unknown field 'eps'"):
        plots.summarize(recs, "eps", "test_accuracy")
    with pytest.raises(ValueError, match=r"^hue: unknown field 'algo'"):
        plots.summarize(recs, "epsilon", "test_accuracy", hue="algo")
    with pytest.raises(ValueError, match=r"^y: field 'algorithm' is not numeric"):
        plots.summarize(recs, "epsilon", "algorithm")
    with pytest.raises(ValueError, match=r"^records: no records"):
        plots.summarize([], "epsilon", "test_accuracy")
    with pytest.raises(ValueError, match=r"^records: no records"):
        plots.plot_xy([], "epsilon", "test_accuracy", None, "unused")
    with pytest.raises(ValueError, match=r"^y: no record's history has the metric 'acc'.*"
                                         r"\['loss'\]"):
        plots.summarize_curves(recs, "acc")
    with pytest.raises(ValueError, match=r"^logx"):
        plots.plot_xy([_record("a", 1.0, 0, 0.5, seed_x=0.0)], "seed_x", "test_accuracy",
                      None, "unused", logx=True)


# --------------------------------------------------------------------------- drawing

def test_plot_xy_writes_png_and_svg(grid, tmp_path):
    recs, _ = grid
    paths = plots.plot_xy(recs, "epsilon", "test_accuracy", "algorithm", tmp_path / "a" / "fig",
                          title="accuracy vs privacy")
    assert paths == [str(tmp_path / "a" / f"fig.{e}") for e in ("png", "svg", "pdf")]
    _check_files(paths)
    svg = (tmp_path / "a" / "fig.svg").read_text()
    assert "accuracy vs privacy" in svg          # text drawn as paths, named in a comment
    # categorical x, no hue
    _check_files(plots.plot_xy(recs, "algorithm", "test_accuracy", None, tmp_path / "cat"))


def test_curves_of_different_lengths(tmp_path):
    # seed s logs loss for rounds 1..3+s, test_accuracy every second round
    recs = [_record("a", 1.0, s, 0.5, history=[
        {"round": t, "loss": 1.0 / t + 0.1 * s, **({"test_accuracy": 0.1 * t + 0.01 * s}
                                                   if t % 2 == 0 else {})}
        for t in range(1, 4 + s)]) for s in SEEDS]
    rows = plots.summarize_curves(recs, "loss")
    assert [r["round"] for r in rows] == [1, 2, 3, 4, 5]
    assert [r["n"] for r in rows] == [3, 3, 3, 2, 1]
    for r in rows:
        v = np.array([1.0 / r["round"] + 0.1 * s for s in SEEDS if r["round"] <= 3 + s])
        assert r["mean"] == pytest.approx(v.mean())
        assert r["std"] == pytest.approx(v.std(ddof=1) if v.size > 1 else 0.0)
    rows = plots.summarize_curves(recs, "test_accuracy")
    assert [(r["round"], r["n"]) for r in rows] == [(2, 3), (4, 2)]
    assert plots.default_curve_metric(recs) == "test_accuracy"
    assert plots.default_curve_metric([_record("a", 1.0, 0, 0.5)]) == "loss"
    _check_files(plots.plot_curves(recs, "loss", hue="seed", out_stem=tmp_path / "c"))
    _check_files(plots.plot_curves(recs, "test_accuracy", out_stem=tmp_path / "d"))


def test_plotting_imports_matplotlib_lazily():
    code = ("import sys, fedjax_dp.experiments.plots, fedjax_dp.experiments.cli; "
            "cli = sys.modules['fedjax_dp.experiments.cli']; cli.build_parser(); "
            "assert 'matplotlib' not in sys.modules and 'jax' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


# --------------------------------------------------------------------------- CLI

def test_cli_plot_end_to_end(grid, tmp_path, capsys):
    recs, _ = grid
    (tmp_path / "sweep").mkdir()
    results = _write_jsonl(tmp_path / "sweep" / "results.jsonl", recs)
    assert cli.main(["plot", str(results)]) == 0
    out = json.loads(capsys.readouterr().out)
    stem = tmp_path / "sweep" / "plot_test_accuracy_vs_epsilon"
    assert out == {"written": [f"{stem}.{e}" for e in ("png", "svg", "pdf")], "records": 12}
    _check_files(out["written"])
    # a folder, a swept key on x, no hue, an explicit stem and title
    assert cli.main(["plot", str(tmp_path / "sweep"), "--x", "algorithm.noise_multiplier",
                     "--hue", "none", "--no-logx", "--out", str(tmp_path / "nm.png"),
                     "--title", "T"]) == 0
    assert json.loads(capsys.readouterr().out)["written"] == [str(tmp_path / f"nm.{e}")
                                                              for e in ("png", "svg", "pdf")]
    # training curves: default metric (loss: no test_accuracy in the history)
    assert cli.main(["plot", str(results), "--curve"]) == 0
    written = json.loads(capsys.readouterr().out)["written"]
    assert written[0] == str(tmp_path / "sweep" / "plot_loss_vs_round.png")
    _check_files(written)


def test_cli_plot_reads_a_hand_written_result_json(tmp_path, capsys):
    result = {"algorithm": "dp_fedavg", "dataset": "digits", "num_agents": 10, "seed": 0,
              "test_accuracy": 0.8, "wall_time_s": 2.0,
              "privacy": [{"unit": "agent", "relation": "add_remove", "epsilon": 3.5,
                           "delta": 1e-5, "accountant": "rdp", "data_dependent": False,
                           "events": []}],
              "config": {"privacy": {"delta": 1e-5, "accountants": ["rdp"]}},
              "history": [{"round": t, "loss": 1.0 / t} for t in (1, 2, 3, 4)]}
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "result.json").write_text(json.dumps(result))
    assert cli.main(["plot", str(run_dir / "result.json")]) == 0
    _check_files(json.loads(capsys.readouterr().out)["written"])
    assert cli.main(["plot", str(run_dir), "--curve", "--y", "loss"]) == 0
    _check_files(json.loads(capsys.readouterr().out)["written"])


def test_cli_plot_errors_exit_2_with_one_line(grid, tmp_path, capsys):
    recs, _ = grid
    results = _write_jsonl(tmp_path / "results.jsonl", recs)
    assert cli.main(["plot", str(results), "--y", "acc"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedjax-dp: error: --y: unknown field 'acc'") and err.count("\n") == 1
    assert cli.main(["plot", str(results), "--hue", "nope"]) == 2
    assert "--hue: unknown field 'nope'" in capsys.readouterr().err
    assert cli.main(["plot", str(results), "--curve", "--x", "epsilon"]) == 2
    assert "--x does not apply with --curve" in capsys.readouterr().err
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert cli.main(["plot", str(empty)]) == 2
    assert "hold no records" in capsys.readouterr().err
    assert cli.main(["plot", str(tmp_path / "missing.jsonl")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not list(tmp_path.glob("plot_*"))
    # records without epsilon are dropped with a warning line, not an error
    _write_jsonl(results, recs + [_record("fedavg", None, 0, 0.9)])
    assert cli.main(["plot", str(results)]) == 0
    assert capsys.readouterr().err == ("fedjax-dp: warning: 1 of 13 records have no 'epsilon' "
                                       "or no 'test_accuracy' and are left out\n")


# --------------------------------------------------------------------------- run --plot

def _result(history):
    return {"algorithm": "dp_fedavg", "dataset": "digits", "num_agents": 10, "seed": 0,
            "test_accuracy": 0.8, "privacy": [], "config": {}, "history": history}


def test_run_plot_training_curve(tmp_path, capsys):
    assert cli.build_parser().parse_args(["run", "c.toml", "--plot"]).plot is True
    assert cli.build_parser().parse_args(["run", "c.toml"]).plot is False
    with_eval = [{"round": t, "loss": 1.0 / t, **({"test_accuracy": 0.2 * t} if t % 2 else {})}
                 for t in range(1, 6)]
    paths = plots.plot_run(_result(with_eval), tmp_path / "a")
    assert paths == [str(tmp_path / "a" / f"training_curve.{e}") for e in ("png", "svg", "pdf")]
    _check_files(paths)
    assert plots.default_curve_metric([records.from_result(_result(with_eval))]) == \
        "test_accuracy"
    # no eval_every: the first numeric metric; a phase name (text) is skipped
    no_eval = [{"round": t, "phase": "train", "loss": 1.0 / t} for t in (1, 2)]
    assert plots.default_curve_metric([records.from_result(_result(no_eval))]) == "loss"
    _check_files(cli.plot_run(_result(no_eval), tmp_path / "b"))
    # nothing to draw: the run still succeeded, so a warning and no files
    assert cli.plot_run(_result([]), tmp_path / "c") is None
    assert "warning: --plot: no training curve written" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()
    with warnings.catch_warnings():
        warnings.simplefilter("error")       # a single run's curve warns about nothing
        plots.plot_run(_result(with_eval), tmp_path / "d")


def test_a_gzipped_results_file_reads_as_the_plain_one(grid, tmp_path):
    """Large committed sweeps are stored as results.jsonl.gz: its folder, or the file, reads
    to the same records as the plain results.jsonl."""
    import gzip
    recs, _ = grid
    text = "".join(json.dumps(r) + "\n" for r in recs)
    plain, packed = tmp_path / "plain", tmp_path / "packed"
    plain.mkdir(), packed.mkdir()
    (plain / "results.jsonl").write_text(text)
    (packed / "results.jsonl.gz").write_bytes(gzip.compress(text.encode()))
    assert records.read([packed]) == records.read([plain]) == recs
    assert records.read([packed / "results.jsonl.gz"]) == recs


def test_reference_records_are_a_band_not_a_line(grid, tmp_path, capsys):
    """--reference KEY=VALUE takes a baseline arm out of the lines (its mean +- std becomes a
    horizontal band); a value no record has, or every record has, is refused naming it."""
    recs, acc = grid
    base = [_record("central", None, s, 0.5 + 0.1 * s) for s in SEEDS]
    others, matching = plots.split_reference(recs + base, ("algorithm", "central"))
    assert matching == base and others == recs
    _check_files(plots.plot_xy(recs + base, "epsilon", "test_accuracy", "algorithm",
                               tmp_path / "ref", reference=("algorithm", "central")))
    with pytest.raises(ValueError, match="reference: no record has algorithm = 'x'"):
        plots.split_reference(recs, ("algorithm", "x"))
    results = _write_jsonl(tmp_path / "results.jsonl", recs + base)
    assert cli.main(["plot", str(results), "--reference", "algorithm=central",
                     "--out", str(tmp_path / "cli")]) == 0
    assert (tmp_path / "cli.png").exists() and "warning" not in capsys.readouterr().err
    assert cli.main(["plot", str(results), "--reference", "algorithm"]) == 2
    assert "--reference: expected KEY=VALUE" in capsys.readouterr().err


# --------------------------------------------------------------------------- a figure for a paper

def _texts(svg_path) -> list[str]:
    """The texts an SVG draws (matplotlib draws text as paths and names each in a comment)."""
    import re
    return re.findall(r"<!-- (.*?) -->", __import__("pathlib").Path(svg_path).read_text(), re.S)


def test_every_registered_algorithm_has_a_display_name():
    from fedjax_dp.algorithms import registry
    assert set(registry.names()) <= set(plots.ALGORITHM_NAMES)
    assert plots.display_name("dp_fedavg") == "DP-FedAvg"
    assert plots.display_name("knn_dpfl") == "kNN-DPFL"
    assert plots.display_name("test_accuracy") == "Test accuracy"
    assert plots.display_name("mean_update_norm") == "Mean update norm"    # snake_case in words
    assert plots.display_name("algorithm.num_queries") == "algorithm.num_queries"   # as it is
    assert plots.display_name("test_accuracy", {"test_accuracy": "Acc."}) == "Acc."


def test_legend_entries_from_hue_values():
    assert plots.hue_text("algorithm", "ae_dpfl") == "AE-DPFL"
    assert plots.hue_text("algorithm", "my_method") == "my_method"       # unknown: as it is
    assert plots.hue_text("setting", "ae_dpfl num_agents=100") == "AE-DPFL, N = 100"
    assert (plots.hue_text("setting", "dp_fedavg (digits) num_agents=50 rounds=[1, 2]")
            == "DP-FedAvg (digits), N = 50, rounds = [1, 2]")
    assert plots.hue_text("algorithm+target_epsilon", "dp_fedavg, 8.0") == "DP-FedAvg, ε = 8"
    assert plots.hue_text("algorithm.noise_multiplier", 1.5) == "σ = 1.5"
    assert plots.hue_text("seed", 0) == "seed = 0"
    assert (plots.hue_text("algorithm.server_optimizer",
                           '{"learning_rate": 0.01, "name": "adam"}') == "adam (learning rate 0.01)")
    # an override by the value's text, or by the algorithm inside a setting
    assert plots.hue_text("algorithm", "dp_fedavg", {"dp_fedavg": "Ours"}) == "Ours"
    assert plots.hue_text("setting", "ae_dpfl num_agents=100", {"ae_dpfl": "AE"}) == "AE, N = 100"
    assert plots.hue_text("setting", "ae_dpfl num_agents=100",
                          {"ae_dpfl num_agents=100": "one line"}) == "one line"


def test_delta_on_the_epsilon_axis_from_the_records(grid):
    recs, _ = grid
    assert plots.axis_label(recs, "epsilon") == "ε (agent, δ = 1e-05)"
    assert plots.axis_label(recs, "target_epsilon") == "Target ε (agent, δ = 1e-05)"
    assert plots.axis_label(recs, "test_accuracy") == "Test accuracy"
    assert plots.axis_label(recs, "epsilon", {"epsilon": "eps"}) == "eps (agent, δ = 1e-05)"
    # the headline guarantee's own delta wins over the config's; differing deltas as a range
    own = _record("a", 1.0, 0, 0.5, epsilon_unit="silo_record", privacy=[
        {"unit": "silo_record", "accountant": "rdp", "epsilon": 1.0, "delta": 1.085e-4}])
    assert plots.axis_label([own], "epsilon") == "ε (silo record, δ = 0.0001085)"
    two = [_record("a", 1.0, 0, 0.5, delta=2.1e-5), _record("a", 2.0, 0, 0.5, delta=6.9e-5)]
    assert plots.axis_label(two, "epsilon") == "ε (agent, δ = 2.1e-05–6.9e-05)"


def test_the_figure_for_a_paper(grid, tmp_path):
    """One column of a two-column paper: 3.3 x 2.4 in, display names, delta on the epsilon
    axis, the statistic in the legend's title, few plain ticks on the log axis, TrueType fonts
    in the PDF; the same figure gives the same files."""
    recs, _ = grid
    paths = plots.plot_xy(recs, "epsilon", "test_accuracy", "algorithm", tmp_path / "fig")
    _check_files(paths)
    texts = _texts(paths[1])
    for want in ("DP-FedAvg", "AE-DPFL", "Test accuracy", "ε (agent, δ = 1e-05)",
                 "mean ± std over 3 seeds"):
        assert want in texts, (want, texts)
    assert "dp_fedavg" not in texts and "test_accuracy" not in texts
    assert [t for t in texts if t in ("2", "8")] == ["2", "8"]      # ticks at the x values
    svg = __import__("pathlib").Path(paths[1]).read_text()
    assert 'width="237.6pt" height="172.8pt"' in svg                # 3.3 x 2.4 inches
    pdf = __import__("pathlib").Path(paths[2]).read_bytes()
    assert b"Type3" not in pdf and b"CIDFontType2" in pdf
    again = plots.plot_xy(recs, "epsilon", "test_accuracy", "algorithm", tmp_path / "again")
    for a, b in zip(paths, again):
        assert open(a, "rb").read() == open(b, "rb").read()
    # no legend (one line): the statistic goes on the y axis; a point pooling several runs of
    # one seed (both algorithms here) says runs, not seeds
    texts = _texts(plots.plot_xy(recs, "epsilon", "test_accuracy", None, tmp_path / "one")[1])
    assert {"Test accuracy", "(mean ± std over 6 runs)"} <= set(texts)


def test_log_axis_ticks_are_few_and_plain(tmp_path):
    wide = [_record("a", e, 0, 0.5) for e in (13.98, 24.57, 71.58, 139.25, 700.1, 1712.3)]
    texts = _texts(plots.plot_xy(wide, "epsilon", "test_accuracy", None, tmp_path / "w")[1])
    ticks = [t for t in texts if t.replace(".", "").isdigit()]
    xticks = [t for t in ticks if float(t) >= 10]
    assert xticks == ["20", "50", "100", "200", "500", "1000", "2000"]   # 1-2-5, no "9 10"
    narrow = [_record("a", e, 0, 0.5) for e in (6.2, 11.63)]
    texts = _texts(plots.plot_xy(narrow, "epsilon", "test_accuracy", None, tmp_path / "n")[1])
    assert {"6", "8", "10"} <= set(texts)


def test_labels_override_the_display_names(grid, tmp_path, capsys):
    recs, _ = grid
    labels = {"dp_fedavg": "Ours", "test_accuracy": "Accuracy", "epsilon": "Privacy ε"}
    texts = _texts(plots.plot_xy(recs, "epsilon", "test_accuracy", "algorithm", tmp_path / "o",
                                 labels=labels)[1])
    assert {"Ours", "AE-DPFL", "Accuracy", "Privacy ε (agent, δ = 1e-05)"} <= set(texts)
    assert "DP-FedAvg" not in texts and "Test accuracy" not in texts
    texts = _texts(plots.plot_curves(recs, "loss", "algorithm", tmp_path / "c",
                                     labels={"loss": "Loss", "ae_dpfl": "Voting"})[1])
    assert {"Loss", "Voting", "DP-FedAvg", "Round", "mean ± std over 6 runs"} <= set(texts)
    with pytest.raises(ValueError, match="labels must map"):
        plots.plot_xy(recs, "epsilon", "test_accuracy", "algorithm", tmp_path / "x",
                      labels={"a": 1})
    # from the command line: --label KEY=TEXT, repeatable; a malformed one refused in one line
    results = _write_jsonl(tmp_path / "results.jsonl", recs)
    assert cli.main(["plot", str(results), "--label", "dp_fedavg=Ours", "--label",
                     "test_accuracy=Accuracy", "--out", str(tmp_path / "cli")]) == 0
    written = json.loads(capsys.readouterr().out)["written"]
    assert {"Ours", "Accuracy"} <= set(_texts(written[1]))
    assert cli.main(["plot", str(results), "--label", "dp_fedavg"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedjax-dp: error: --label: expected KEY=TEXT") and err.count("\n") == 1
