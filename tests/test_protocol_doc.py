"""docs/protocol.md's worked example runs as written: its module (the block starting with
``# noisy_gd.py``) saved as a file, its registry line and its runs executed in one namespace."""
import re
import sys
from pathlib import Path

import pytest

from fedjax_dp.algorithms import registry

DOC = Path(__file__).resolve().parents[1] / "docs" / "protocol.md"


def _example_blocks() -> list[str]:
    """The python blocks of the section ``## Adding an algorithm: a worked example``."""
    text = DOC.read_text()
    section = text[text.index("## Adding an algorithm: a worked example"):]
    nxt = section.find("\n## ", 1)
    section = section if nxt < 0 else section[:nxt]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_the_worked_example_adds_an_algorithm_with_one_module_and_one_registry_line(
        tmp_path, monkeypatch, capsys):
    blocks = _example_blocks()
    assert len(blocks) == 3 and blocks[0].startswith("# noisy_gd.py\n")
    (tmp_path / "noisy_gd.py").write_text(blocks[0])
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "ALGORITHMS", dict(registry.algorithms()))   # restored after
    monkeypatch.delitem(sys.modules, "noisy_gd", raising=False)
    namespace: dict = {}
    exec(compile(blocks[1], "protocol.md: registry line", "exec"), namespace)
    assert registry.get("noisy_gd") is namespace["noisy_gd"]
    exec(compile(blocks[2], "protocol.md: runs", "exec"), namespace)

    result, record, z = namespace["result"], namespace["record"], namespace["z"]
    assert result.state.step == 3 and [r["round"] for r in result.history] == [1, 2, 3]
    assert record["algorithm"] == "noisy_gd" and 0 <= record["test_accuracy"] <= 1
    assert record["privacy"][0]["unit"] == "agent" and record["privacy"][0]["epsilon"] > 4.0
    assert 1.0 < z                              # epsilon 4 needs more noise than z = 1
    assert calibrate_epsilon(namespace, z) == pytest.approx(4.0, rel=1e-3)
    assert capsys.readouterr().out.count("\n") == 2                   # the two prints


def calibrate_epsilon(namespace: dict, z: float) -> float:
    calibrate = namespace["calibrate"]
    return calibrate.planned_epsilon(
        calibrate.set_key(namespace["run_config"], "algorithm.noise_multiplier", z))
