"""Sharded execution over 8 (forced) CPU devices equals single-device execution.

ONE subprocess runs every 8-device check (``sharded_check.py``, which also runs the ISRL-DP silo
axis checks of ``isrl_sharded_check.py``): JAX starts, and the shared pieces compile, once.
"""
import json
import os
import subprocess
import sys
from pathlib import Path


def test_eight_cpu_devices_equal_one_device():
    """Core (lift, placement, agent sum, local training, DP-FedAvg rounds masked and gathered,
    kNN MPC vote), DP-FNAS (a search and a retraining epoch, 11 parties padded to 16), AE-DPFL
    and kNN-DPFL with ``runtime.mesh`` (host- and device-resident agents, N = 11) equal to no
    mesh, and ISRL-DP: SPIDER and SDP SPIDER, gathered (M = 3 rows padded to 8) == masked (N = 6
    padded to 8) == one device, every round of a sharded run one compiled program; FedKT (L0 host-resident parties in chunks, L2 device-resident
    ones, SOLO) with its 11 parties split over the 8 devices == no mesh."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    # LLVM optimisation level 0: the checks are compile-bound (~45 of ~50 CPU seconds are XLA
    # compiles of tiny programs) and compare sharded with unsharded programs of the same
    # process; the HLO passes that shard, pad and reduce run as always, only the machine-code
    # optimisation is skipped (about 35% less CPU time)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
                        " --xla_backend_optimization_level=0").strip()
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1]) + os.pathsep + \
        env.get("PYTHONPATH", "")
    # no persistent compilation cache (conftest's): no other process of the session compiles
    # programs for 8 devices (the XLA flags are part of the cache key), and one run of the checks
    # compiles each program once, so the cache only adds a write of every program (~260 entries,
    # measured about 5 of ~100 CPU seconds, 1 hit)
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    script = Path(__file__).with_name("sharded_check.py")
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    core = ["lift", "lift_sum", "placed_on_8", "agent_sum", "train_agents", "dp_fedavg_round",
            "gathered_round_sharded", "knn_vote"]
    fnas = ["dp_fnas_sharded", "dp_fnas_agents_per_process"]
    voting = ["ae_dpfl_mesh_host", "ae_dpfl_mesh_device", "knn_dpfl_mesh_host",
              "knn_dpfl_mesh_device"]
    isrl = ["spider_sharded_masked",
            "spider_sharded_gathered_equals_masked", "sdp_spider_sharded_gathered_equals_masked",
            "spider_sharded_round_compiled_once", "sdp_spider_sharded_round_compiled_once"]
    fedkt = ["fedkt_l0_host_sharded", "fedkt_l2_device_sharded", "fedkt_solo_host_sharded"]
    assert sorted(out) == sorted(core + fnas + voting + isrl + fedkt +
                                 ["spider_uploads", "sdp_spider_uploads"]), out
    assert all(out[c] is True for c in core + fnas + voting + isrl + fedkt), out
    assert out["spider_uploads"] == out["sdp_spider_uploads"] == 3 * 3   # R x M, one upload each
