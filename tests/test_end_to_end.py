"""End-to-end runs of the shipped configs (small enough for CI) and the README's contract."""
import json
import re
from pathlib import Path

import pytest

from fedjax_dp.experiments import config as config_lib
from fedjax_dp.experiments import runner

ROOT = Path(__file__).resolve().parents[1]


def test_fedavg_mnist5k_config_reaches_85_percent(tmp_path):
    """configs/fedavg/mnist5k.toml as shipped: IID over 10 agents (a centralized MLP: ~92%)."""
    cfg = config_lib.load(ROOT / "configs" / "fedavg" / "mnist5k.toml", ["run.eval_every=0"])
    result = runner.run(cfg, tmp_path, progress=False)
    assert result["num_agents"] == 10 and result["config"]["data"]["partition"] == "iid"
    assert result["test_accuracy"] >= 0.85
    assert result["privacy"] == []                       # FedAvg claims no guarantee
    assert json.loads((tmp_path / "result.json").read_text())["test_accuracy"] == \
        result["test_accuracy"]


@pytest.mark.parametrize("path", sorted(p for p in (ROOT / "configs").glob("*/*.toml")
                                         if p.parent.name != "experiments"),
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_shipped_config_validates(path):
    runner.plan(config_lib.load(path))


def _readme_commands():
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.S).group(1)
    return [line.strip() for line in block.splitlines() if line.strip() and
            not line.startswith("#")]


def test_readme_has_two_setup_commands_and_ci_runs_the_test_one():
    demo, tests = _readme_commands()
    assert "fedjax-dp run configs/" in demo and "pip install" in demo
    assert "pytest" in tests and "pip install" in tests
    ci = (ROOT / ".ci" / "run").read_text()
    assert tests in ci.splitlines()
