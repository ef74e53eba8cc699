"""docs/protocol.md's worked example runs as written: its module (the block starting with
``# noisy_gd.py``) saved as a file, its registry line and its runs executed in one namespace."""
import re
import sys
from pathlib import Path

import pytest

from fedjax_dp.algorithms import registry

DOC = Path(__file__).resolve().parents[1] / "docs" / "protocol.md"


def _blocks(heading: str) -> list[str]:
    """The python blocks of the section ``## <heading>``."""
    text = DOC.read_text()
    section = text[text.index(f"## {heading}"):]
    nxt = section.find("\n## ", 1)
    section = section if nxt < 0 else section[:nxt]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def _example_blocks() -> list[str]:
    return _blocks("Adding an algorithm: a worked example")


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


def _noise_blocks() -> list[str]:
    return _blocks("Adding a noise stage: a worked example")


def test_the_worked_noise_stage_is_one_module_and_runs_in_every_driver(tmp_path, monkeypatch):
    """The example's stage, saved as a module, registers itself, composes with DP-FedAvg's
    stages, runs three rounds and is accounted as the test composes it; an unsupported pairing
    is refused naming both stages."""
    import dp_accounting

    from fedjax_dp.privacy import accounting
    from fedjax_dp.stages import base, stage_kinds
    blocks = _noise_blocks()
    assert len(blocks) == 2 and blocks[0].startswith("# decaying_noise.py\n")
    (tmp_path / "decaying_noise.py").write_text(blocks[0])
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "decaying_noise", raising=False)
    monkeypatch.setattr(base, "_REGISTRY", {k: dict(v) for k, v in base._REGISTRY.items()})
    namespace: dict = {}
    exec(compile(blocks[1], "protocol.md: the noise stage's run", "exec"), namespace)
    assert "decaying" in [s["name"] for s in stage_kinds()["noise"]]
    assert int(namespace["result"].state.values["stages"][4]) == 3
    events = [dp_accounting.PoissonSampledDpEvent(0.5, dp_accounting.GaussianDpEvent(
        1.5 * 0.8 ** t)) for t in range(3)]
    acc = dp_accounting.rdp.RdpAccountant(list(accounting.DEFAULT_RDP_ORDERS))
    assert namespace["epsilon"] == pytest.approx(
        acc.compose(dp_accounting.ComposedDpEvent(events)).get_epsilon(1e-5), rel=1e-9)
    dp_fedavg = namespace["dp_fedavg"]
    with pytest.raises(ValueError, match='noise "decaying" with participation "fixed": its '
                                         'analysis is written for Poisson sampling'):
        dp_fedavg.Config(rounds=3, sampling="fixed", cohort_size=2,
                         noise=namespace["decaying_noise"].DecayingNoise(decay=0.8))
