"""Smoke runs of the benchmarks in tools/ at tiny sizes, so they cannot rot."""
import importlib.util
import json
from pathlib import Path

TOOLS = Path(__file__).resolve().parents[1] / "tools"


def _load(name):
    spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_local_training_smoke(tmp_path):
    bench = _load("bench_local_training")
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
