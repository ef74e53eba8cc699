"""Smoke runs of the benchmarks in tools/ at tiny sizes, so they cannot rot; tools/ holds
benchmarks only (each imports the installed package, edits no ``sys.path`` and writes JSON)."""
import importlib.util
import json
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[1] / "tools"


@pytest.fixture(autouse=True)
def _tools_on_path(monkeypatch):
    """tools/ on ``sys.path`` as when a benchmark runs as a script (its folder comes first), so
    that ``from bench_common import ...`` resolves."""
    monkeypatch.syspath_prepend(str(TOOLS))


def test_tools_holds_benchmarks_and_docs_checks_only_without_sys_path_edits():
    for path in TOOLS.glob("*.py"):
        assert path.name.startswith(("bench_", "docs_")), \
            f"{path.name}: tools/ holds benchmarks (bench_*) and docs checks (docs_*) only"
        text = path.read_text()
        assert "sys.path" not in text.replace("no ``sys.path`` edit", ""), path.name
        assert "PYTHONPATH" not in text, path.name


def _load(name):
    spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _small_matmul(monkeypatch, bench):
    """The benchmark's matmul reference (``bench_common.matmul_gflops``, 2048^3 by default) at
    128^3: the same timed matmul, a size that costs nothing next to the smoke run's own work."""
    real = bench.matmul_gflops
    monkeypatch.setattr(bench, "matmul_gflops", lambda: real(128, 3))


def test_bench_local_training_smoke(tmp_path, monkeypatch):
    bench = _load("bench_local_training")
    _small_matmul(monkeypatch, bench)
    out = tmp_path / "bench.json"
    record = bench.main(["--agents", "6", "--local-size", "8", "--features", "5", "--hidden", "4",
                         "--classes", "3", "--steps", "2", "--batch-size", "4", "--repeats", "1",
                         "--chunk-size", "4", "--out", str(out)])
    written = json.loads(out.read_text())
    assert written["results_agree"] is True             # vmapped == per-agent loops
    for key in ("vmap_s", "loop_step_s", "loop_agent_s", "speedup_vs_loop_step",
                "vmap_gflops", "matmul_gflops", "chunked_s"):
        assert written[key] > 0
    assert record["agents"] == 6


def test_bench_knn_vote_smoke(tmp_path, monkeypatch):
    """One tiny configuration in a child process: every timed function, matmul before and after,
    the fractions against the faster of the two, memory above the data."""
    bench = _load("bench_knn_vote")
    _small_matmul(monkeypatch, bench)
    out = tmp_path / "knn.json"
    record = bench.main(["--configs", "24:8:1", "--queries", "16", "--local-size", "12",
                         "--features", "4", "--k", "3", "--repeats", "1",
                         "--what", "clean,vote,vote_aggregate,clean_top_k", "--out", str(out)])
    written = json.loads(out.read_text())
    assert len(written["matmul_gflops_all"]) == 2
    run, = written["runs"]
    assert run["matmul_gflops"] == max(written["matmul_gflops_all"])
    for name in ("clean", "vote", "vote_aggregate", "clean_top_k"):
        assert run[name]["wall_s"] > 0
        assert run[name]["fraction_of_matmul"] == (run[name]["gemm_gflops"]
                                                   / run["matmul_gflops"])
        assert name in run["peak_rss_above_data_mb"]
    assert run["threshold_speedup_vs_top_k"] > 0 and record["runs"] == written["runs"]


def test_every_config_states_the_expected_result_of_results_configs_expected_json():
    """The first line of every shipped config is the one tools/bench_configs.py makes from
    results/configs_expected.json (no run: re-measure with ``--run``)."""
    expected = _load("bench_configs")
    assert expected.check(expected.load()) == []
    entry = {"seed": 0, "cpus": 2, "test_accuracy": 0.7412, "process_time_s": 14.4,
             "headline": {"unit": "agent", "delta": 1e-5, "epsilon": {"rdp": 6.871, "pld": 6.2}}}
    assert expected.line(entry) == ("# Expected (seed 0, 2-core CPU): test accuracy 0.741; agent "
                                    "epsilon 6.87 (RDP) / 6.20 (PLD) at delta 1e-5; ~14 s.")
