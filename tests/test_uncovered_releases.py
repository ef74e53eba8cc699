"""Every guarantee says whether it covers everything the run releases (issue 21 item 9).

A release no ledger entry accounts for (DP-FedAvg's realised cohort size as the denominator,
diagnostic metrics computed without noise, a data-dependent epsilon, FedKT's vote file) is
declared with ``PrivacyLedger.declare_uncovered``; every guarantee of ``result.json`` then says
``covers_all_releases: false`` and names it in ``not_covered``, the ledger's report carries it and
the printed guarantee line ends with ``[NOT covering: ...]``.
"""
import json
from pathlib import Path

import pytest

from fedjax_dp.algorithms.voting import ae_dpfl, knn_dpfl
from fedjax_dp.algorithms.averaging import dp_fedavg
from fedjax_dp.experiments import config as config_lib
from fedjax_dp.experiments import runner
from fedjax_dp.privacy import PrivacyLedger, accounting
from fedjax_dp.privacy.ledger import Uncovered

DELTA = 1e-5


def _ledger():
    return PrivacyLedger().add_event("agent", accounting.gaussian_event(1.0), relation="add/remove")


def test_ledger_report_says_what_it_does_not_cover():
    covered = _ledger().report(DELTA)
    assert covered and all(g["covers_all_releases"] is True and g["not_covered"] == ""
                           for g in covered)
    lg = _ledger().declare_uncovered("the loss", "computed without noise")
    lg.declare_uncovered("the loss", "computed without noise")          # declared once
    rows = lg.report(DELTA)
    assert all(g["covers_all_releases"] is False for g in rows)
    assert all(g["not_covered"] == "the loss: computed without noise" for g in rows)
    back = PrivacyLedger.from_json(json.loads(json.dumps(lg.to_json())))
    assert back.uncovered == lg.uncovered == (Uncovered("the loss", "computed without noise"),)
    assert _ledger().merged(lg).uncovered == lg.uncovered
    assert PrivacyLedger.from_json({"entries": []}).uncovered == ()    # older ledgers
    with pytest.raises(ValueError, match="release must be a non-empty string"):
        lg.declare_uncovered("", "why")


def test_a_data_dependent_epsilon_is_declared_by_the_ledger_itself():
    lg = _ledger().add_rdp("agent_data_dependent", [2.0, 4.0], [0.1, 0.2], relation="r")
    (u,) = lg.uncovered
    assert "data-dependent epsilon of agent_data_dependent" in u.release
    assert all(not g["covers_all_releases"] for g in lg.report(DELTA, accountants=("rdp",)))


def test_algorithm_ledgers_declare_their_uncovered_releases():
    sampled = dp_fedavg.ledger(dp_fedavg.Config(denominator="sampled", sampling_rate=0.5,
                                                diagnostics=False))
    assert [u.release for u in sampled.uncovered] == [
        "the realised cohort size m_t of every round, the denominator of the update "
        "(denominator = \"sampled\")"]
    assert dp_fedavg.ledger(dp_fedavg.Config(diagnostics=False)).uncovered == ()
    # with every agent in every round (q = 1) the realised size is N: nothing more released
    assert dp_fedavg.ledger(dp_fedavg.Config(denominator="sampled", sampling_rate=1.0,
                                             diagnostics=False)).uncovered == ()
    # the round diagnostics are off by default: the default ledger covers every release
    assert dp_fedavg.ledger(dp_fedavg.Config()).uncovered == ()
    assert "train_loss" in dp_fedavg.ledger(dp_fedavg.Config(diagnostics=True)
                                            ).uncovered[0].release
    # AE-DPFL's local-phase metrics are off by default too (algorithm.diagnostics opts in)
    assert ae_dpfl.ledger(ae_dpfl.Config()).uncovered == ()
    assert "mean_agent_loss" in ae_dpfl.ledger(ae_dpfl.Config(diagnostics=True)
                                               ).uncovered[0].release
    assert knn_dpfl.ledger(knn_dpfl.Config()).uncovered == ()   # before the vote: no margins


def test_guarantee_line_names_what_is_not_covered():
    g = {"unit": "agent", "epsilon": 1.5, "delta": 1e-5, "accountant": "rdp",
         "covers_all_releases": False, "not_covered": "m_t: released without noise"}
    assert runner.guarantee_line(g).endswith("[NOT covering: m_t: released without noise]")
    g.update(covers_all_releases=True, not_covered="")
    assert "NOT covering" not in runner.guarantee_line(g)


def _result(covers: bool, accountants=("rdp", "pld")) -> dict:
    why = "" if covers else ("diagnostic metrics num_sampled (the realised cohort size), "
                             "train_loss and mean_update_norm of every round: computed without "
                             "noise; not private (algorithm.diagnostics = false leaves them out)")
    rows = [{"unit": unit, "epsilon": eps, "delta": 1e-5, "accountant": acc,
             "data_dependent": unit.endswith("dependent"), "covers_all_releases": covers,
             "not_covered": why}
            for unit, eps in (("agent_data_dependent", 1.0), ("agent", 6.872), ("instance", 9.1))
            for acc in accountants]
    return {"test_accuracy": 0.742, "privacy": rows,
            "config": {"privacy": {"accountants": list(accountants)}}}


def test_summary_line_is_short_and_says_coverage_once():
    """The summary line quotes the headline guarantee only (the first data-independent unit,
    the first accountant), says in a few words whether it covers every release, once, and
    stays short; the full report is ``fedjax-dp show DIR`` (runner.report_lines)."""
    out = Path("runs") / "mnist5k" / "20261202-000000"       # the default run folder
    line = runner.summary_line("dp_fedavg", _result(True), out)
    assert line == (f"[dp_fedavg] test accuracy 0.7420; agent: eps=6.872 at delta=1e-05 "
                    f"(rdp, +5 more); covers every release; run folder {out}")
    assert len(line) <= 145
    line = runner.summary_line("dp_fedavg", _result(False), out)
    assert line.endswith(f"; NOT covering every release: fedjax-dp show {out}")
    assert line.count("NOT covering") == 1 and "num_sampled" not in line
    assert len(line) <= 155
    assert "(pld, +5 more)" in runner.summary_line("x", _result(True, ("pld", "rdp")), None)
    report = "\n".join(runner.report_lines(_result(False), out))
    assert report.count("num_sampled") == 1 and report.count("eps=") == 6
    assert "agent: eps=6.872 at delta=1e-05 (rdp)  (headline)" in report
    assert "every guarantee covers every release" in "\n".join(
        runner.report_lines(_result(True), out))
    none = {"test_accuracy": 0.5, "privacy": []}
    assert runner.summary_line("fedavg", none, out) == \
        f"[fedavg] test accuracy 0.5000; no privacy guarantee; run folder {out}"


def _tiny(denominator: str) -> dict:
    return config_lib.resolve({
        "data": {"dataset": "synthetic", "num_agents": 4,
                 "dataset_options": {"num_train": 80, "num_public": 10, "num_test": 20,
                                     "num_features": 4, "num_classes": 3}},
        "model": {"name": "logistic"},
        "train": {"steps": 1, "batch_size": 4},
        "algorithm": {"name": "dp_fedavg", "rounds": 2, "sampling_rate": 0.5,
                      "denominator": denominator, "diagnostics": False},
        "privacy": {"accountants": ["rdp"]},
        "run": {"progress": False, "chunk_size": 0, "checkpoint_every": 0}})


def test_result_json_marks_the_sampled_denominator_guarantee(tmp_path, capsys):
    expected = runner.run(_tiny("expected"), tmp_path / "expected")
    sampled = runner.run(_tiny("sampled"), tmp_path / "sampled", progress=True)
    assert [g["epsilon"] for g in expected["privacy"]] == \
        [g["epsilon"] for g in sampled["privacy"]]          # the same number ...
    assert all(g["covers_all_releases"] is True and g["not_covered"] == ""
               for g in expected["privacy"])
    for g in sampled["privacy"]:                             # ... but not the same guarantee
        assert g["covers_all_releases"] is False
        assert "realised cohort size m_t" in g["not_covered"]
        assert "released through the model without noise" in g["not_covered"]
    on_disk = json.loads((tmp_path / "sampled" / "result.json").read_text())
    assert on_disk["privacy"] == sampled["privacy"]
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith(f"NOT covering every release: fedjax-dp show {tmp_path / 'sampled'}")


def test_the_default_dp_fedavg_run_covers_every_release(tmp_path):
    """Diagnostics are off unless a config opts in: the default run's guarantees cover every
    release and its history has no unnoised metric; opting in changes no epsilon and no model."""
    cfg = _tiny("expected")
    del cfg["algorithm"]["diagnostics"]
    cfg = config_lib.resolve(cfg)
    default = runner.run(cfg, tmp_path / "default")
    assert all(g["covers_all_releases"] is True for g in default["privacy"])
    assert all(set(h) == {"round"} for h in default["history"])
    on = config_lib.resolve({**cfg, "algorithm": {**cfg["algorithm"], "diagnostics": True}})
    opted = runner.run(on, tmp_path / "on")
    assert all(g["covers_all_releases"] is False and "diagnostics" in g["not_covered"]
               for g in opted["privacy"])
    assert [g["epsilon"] for g in opted["privacy"]] == [g["epsilon"] for g in default["privacy"]]
    assert opted["test_accuracy"] == default["test_accuracy"]
    assert "train_loss" in opted["history"][0]
