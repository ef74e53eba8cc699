"""Smoke run of tools/bench_isrl.py at a tiny size (so it cannot rot)."""
import importlib.util
import json
from pathlib import Path

TOOLS = Path(__file__).resolve().parents[1] / "tools"


def test_bench_isrl_smoke(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_isrl", TOOLS / "bench_isrl.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "bench.json"
    record = bench.main(["--silos", "3,6", "--local-size", "4", "--features", "3", "--hidden",
                         "2", "--batch-size", "2", "--repeats", "1", "--loop-max", "4",
                         "--check-silos-max", "3", "--out", str(out)])
    written = json.loads(out.read_text())
    assert written["runs"] == record["runs"] and [r["silos"] for r in written["runs"]] == [3, 6]
    small, large = written["runs"]
    assert small["results_agree"] is True and not small["loop_extrapolated"]
    assert large["loop_extrapolated"] and large["loop_silos_timed"] == 4
    for run in written["runs"]:
        for k in ("vectorised_refresh_s", "vectorised_difference_s", "loop_refresh_s",
                  "loop_difference_s"):
            assert run[k] > 0
        assert run["speedup_refresh"] == run["loop_refresh_s"] / run["vectorised_refresh_s"]
