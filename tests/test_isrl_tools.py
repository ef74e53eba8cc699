"""Smoke run of tools/bench_isrl.py at a tiny size (so it cannot rot)."""
import importlib.util
import json
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[1] / "tools"


@pytest.fixture(autouse=True)
def _tools_on_path(monkeypatch):
    """tools/ on ``sys.path`` as when the benchmark runs as a script (``bench_common``)."""
    monkeypatch.syspath_prepend(str(TOOLS))


def test_bench_isrl_smoke(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_isrl", TOOLS / "bench_isrl.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "bench.json"
    record = bench.main(["--silos", "3", "--local-size", "4", "--features", "3", "--hidden",
                         "2", "--batch-size", "2", "--repeats", "1", "--loop-max", "2",
                         "--check-silos-max", "3", "--out", str(out)])
    written = json.loads(out.read_text())
    assert written["runs"] == record["runs"] and [r["silos"] for r in written["runs"]] == [3]
    run, = written["runs"]
    assert run["results_agree"] is True                 # vectorised == loop over silos
    assert run["loop_extrapolated"] and run["loop_silos_timed"] == 2
    for run in written["runs"]:
        for k in ("vectorised_refresh_s", "vectorised_difference_s", "loop_refresh_s",
                  "loop_difference_s"):
            assert run[k] > 0
        assert run["speedup_refresh"] == run["loop_refresh_s"] / run["vectorised_refresh_s"]


def test_bench_isrl_cohort_smoke(tmp_path):
    """``--cohort``: gathered vs masked round at a tiny size (MB-SGD: the cheapest round to
    compile); the two rounds agree."""
    spec = importlib.util.spec_from_file_location("bench_isrl", TOOLS / "bench_isrl.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "cohort.json"
    record = bench.main(["--cohort", "--method", "mb_sgd", "--silos", "4", "--available", "2,9", "--local-size", "4",
                         "--features", "3", "--hidden", "2", "--batch-size", "2", "--repeats",
                         "1", "--out", str(out)])
    written = json.loads(out.read_text())
    assert written["runs"] == record["runs"]
    run, = written["runs"]                                  # M = 9 > N = 4 is skipped
    assert (run["silos"], run["available"]) == (4, 2) and run["results_agree"] is True
    assert run["ratio_refresh"] == run["masked_refresh_s"] / run["gather_refresh_s"] > 0


def test_bench_isrl_rates_smoke(tmp_path):
    """``--rates``: one upload at two sampling rates, sampled records only vs every record; the
    two agree and the ratios are written."""
    spec = importlib.util.spec_from_file_location("bench_isrl", TOOLS / "bench_isrl.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "rates.json"
    record = bench.main(["--rates", "--rate-list", "0.25,1.0", "--available", "2",
                         "--local-size", "8", "--features", "3", "--hidden", "2", "--repeats",
                         "1", "--out", str(out)])
    written = json.loads(out.read_text())
    assert written["runs"] == record["runs"] and [r["rate"] for r in written["runs"]] == [0.25, 1.0]
    for run in written["runs"]:
        assert run["results_agree"] is True
        assert run["sampled_gradient_over_rate_1"] == (run["sampled_gradient_s"]
                                                       / written["runs"][1]["sampled_gradient_s"])
