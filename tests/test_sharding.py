"""Sharded execution over 8 (forced) CPU devices equals single-device execution."""
import json
import os
import subprocess
import sys
from pathlib import Path


def test_eight_cpu_devices_equal_one_device():
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                        " --xla_force_host_platform_device_count=8").strip()
    env["JAX_PLATFORMS"] = "cpu"
    script = Path(__file__).with_name("sharded_check.py")
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checks = json.loads(proc.stdout.strip().splitlines()[-1])
    assert checks == {"lift": True, "placed_on_8": True, "agent_sum": True, "train_agents": True,
                      "dp_fedavg_round": True, "gathered_round_sharded": True, "knn_vote": True}
