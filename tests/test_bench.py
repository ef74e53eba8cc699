"""``fedjax-dp bench``: the quick suite at tiny sizes, every part, writes one JSON and one table
of finite, positive ratios; the command's errors, and the benchmark
reference's workload equals the peers' own definition when their folder is present."""
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

from fedjax_dp.experiments import cli

PEERS = Path(os.environ.get("FEDJAX_DP_PEERS", Path(__file__).resolve().parents[2] / "shared"
                            / "peers"))


def _check_outputs(stem: Path, parts) -> dict:
    record = json.loads(stem.with_name(stem.name + ".json").read_text())
    table = stem.with_name(stem.name + ".md").read_text()
    assert record["errors"] == []
    assert [p["name"] for p in record["parts"]] == list(parts)
    dev = record["device"]
    assert dev["platform"] == "cpu" and dev["cpu_count"] >= 1 and dev["device_kind"]
    assert record["matmul"]["gflops"] > 0
    assert len(record["matmul"]["all_gflops"]) == len(record["parts"]) + 1
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    for part in record["parts"]:
        assert part["ratios"], part["name"]
        assert part["ratios_of_minima"].keys() == part["ratios"].keys()
        for name, value in part["ratios"].items():
            for v in (value, part["ratios_of_minima"][name]):
                assert math.isfinite(v) and v > 0, (part["name"], name, v)
            assert any(r.startswith(f"| {part['name']} | {name} |") for r in rows), name
        for label, t in part["times"].items():
            assert 0 < t["min_s"] <= t["median_s"], (part["name"], label)
        assert part["compilations"]["count"] >= 1          # the warm-up compiled something
    return record


def test_bench_quick_suite_tiny_through_the_cli(tmp_path, capsys):
    """``fedjax-dp bench --suite quick`` with every part, at tiny sizes."""
    from fedjax_dp import bench
    stem = tmp_path / "bench"
    rc = cli.main(["bench", "--suite", "quick", "--sizes", "tiny", "--out", str(stem)])
    assert rc == 0
    record = _check_outputs(stem, bench.PARTS)
    assert record["suite"] == "quick" and record["sizes"] == "tiny"
    assert "| dp_sgd_step | private_over_non_private |" in capsys.readouterr().out
    names = [p["name"] for p in record["parts"]]
    assert record["parts"][names.index("local_training")]["checks"]["results_agree"]
    i = names.index("knn_vote")
    knn = record["parts"][i]
    # the vote's fraction of the matmul is its GEMM FLOPs over its time over the matmul's speed
    around = record["matmul"]["all_gflops"][i:i + 2]             # timed before and after it
    assert knn["matmul_gflops"] == max(around)
    expected = knn["sizes"]["gemm_gflop"] / knn["times"]["vote"]["median_s"] / max(around)
    assert knn["ratios"]["vote_fraction_of_matmul"] == pytest.approx(expected)
    # the char-LSTM round: the library's and the hand-written round, the same model size
    lstm = record["parts"][names.index("char_lstm_round")]
    assert lstm["sizes"]["clients_source"] == "synthetic"
    assert lstm["sizes"]["num_params"]["library"] == lstm["sizes"]["num_params"]["hand_scan"]
    assert set(lstm["ratios"]) == {"library_over_hand_scan_c2"}
    assert 0 < lstm["ratios"]["library_over_hand_scan_c2"] < float("inf")


def test_char_lstm_part_reads_a_converted_population(tmp_path):
    """``--population DIR``: the part's clients are the folder's (their number, T, V, record
    counts), not synthetic ones."""
    from fedjax_dp.bench import char_lstm
    from fedjax_dp.core import from_ragged, save_stacked
    from fedjax_dp.models import tasks
    rng = np.random.default_rng(0)
    xs = [rng.integers(1, 7, (n, 5)).astype(np.int32) for n in (3, 6, 2)]
    save_stacked(tmp_path, from_ragged(xs, [np.roll(x, -1, 1) for x in xs], dtype=np.int32))
    tasks.save(tmp_path, tasks.NextToken(vocab_size=7, pad_id=0))
    rec = char_lstm.measure(dict(clients=99, seq=99, vocab=99, hidden=2, cohorts=[2],
                                 local_steps=1, batch=2, variants=["hand_scan"],
                                 population=str(tmp_path)), 1)
    assert rec["sizes"]["clients_source"] == str(tmp_path)
    assert (rec["sizes"]["clients"], rec["sizes"]["seq"], rec["sizes"]["vocab"]) == (3, 5, 7)
    assert rec["sizes"]["records_per_client_median"] == 3.0
    assert set(rec["times"]) == {"hand_scan_c2"} and rec["pairs"] == {}
    with pytest.raises(ValueError, match=r"char_lstm_round.cohorts must be in \[1, 3\]"):
        char_lstm.measure(dict(clients=1, seq=1, vocab=1, hidden=1, cohorts=[4], local_steps=1,
                               batch=1, population=str(tmp_path)), 1)


@pytest.mark.parametrize("argv,needle", [
    (["--suite", "huge"], "--suite must be one of ['quick', 'full']"),
    (["--only", "local_training,nope"], "--only: unknown part(s) ['nope']"),
    (["--sizes", "giant"], "--sizes must be one of"),
    (["--population", "no/such/folder"], "--population must be a converted population folder"),
])
def test_bench_bad_arguments(argv, needle, capsys):
    assert cli.main(["bench", *argv]) == 2
    assert needle in capsys.readouterr().err


@pytest.mark.skipif(not (PEERS / "workload.py").exists(), reason="the peers' folder is absent")
def test_reference_workload_equals_the_peers_definition():
    import importlib.util
    from fedjax_dp.bench import peers_reference as ref
    spec = importlib.util.spec_from_file_location("peers_workload", PEERS / "workload.py")
    W = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(W)
    w = ref.WORKLOAD
    assert (w.clients, w.examples, w.dim, w.hidden, w.classes, w.batch, w.local_steps) == (
        W.NUM_CLIENTS, W.EXAMPLES_PER_CLIENT, W.DIM, W.HIDDEN, W.NUM_CLASSES, W.BATCH,
        W.LOCAL_STEPS)
    assert (w.client_lr, w.server_lr, w.clip, w.noise_multiplier) == (
        W.CLIENT_LR, W.SERVER_LR, W.CLIP, W.NOISE_MULTIPLIER)
    x, y = ref.make_data()
    X, Y = W.make_data()
    np.testing.assert_array_equal(x, X)
    np.testing.assert_array_equal(y, Y)
    theirs = W.init_params()
    for k, v in ref.init_params().items():
        np.testing.assert_array_equal(v, theirs[k])
