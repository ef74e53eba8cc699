"""``fedjax-dp selftest``: every algorithm family at a tiny size on the default device against
the CPU (fedjax_dp/experiments/selftest.py). On this CPU-only machine both runs are on the CPU:
the command checks that every family runs and gives the same numbers twice."""
from __future__ import annotations

import dataclasses
import json
import math
import re

import jax
import pytest

from fedjax_dp.algorithms import registry
from fedjax_dp.experiments import cli, selftest


def _numbers(**changes) -> selftest.Numbers:
    base = selftest.Numbers(test_accuracy=0.5, epsilon=(("agent/rdp", 2.0),), abs_sum=100.0,
                            l2=10.0, device="cpu:0", wall_s=1.0)
    return dataclasses.replace(base, **changes)


# ----------------------------------------------------------------------------- the comparison

def test_each_tolerance_is_applied_as_stated():
    assert selftest.TOLERANCES == {"epsilon_rtol": 1e-9, "checksum_rtol": 1e-3,
                                   "accuracy_atol": 0.05}
    ref = _numbers()
    assert selftest.compare(ref, ref) == []
    # epsilon: host accounting, equal to 1e-9 relative
    assert selftest.compare(_numbers(epsilon=(("agent/rdp", 2.0 * (1 + 5e-10)),)), ref) == []
    assert selftest.compare(_numbers(epsilon=(("agent/rdp", 2.0 * (1 + 5e-9)),)), ref) == \
        [f"epsilon agent/rdp {2.0 * (1 + 5e-9)!r} vs 2.0"]
    assert selftest.compare(_numbers(epsilon=(("agent/rdp", None),)), ref)   # inf vs finite
    assert selftest.compare(_numbers(epsilon=()), ref)                       # a guarantee lost
    # checksums: 1e-3 relative; NaN never passes
    assert selftest.compare(_numbers(abs_sum=100.09, l2=10.009), ref) == []
    assert selftest.compare(_numbers(abs_sum=100.2), ref) == ["abs_sum 100.2 vs 100"]
    assert selftest.compare(_numbers(l2=math.nan), ref) == ["l2 nan vs 10"]
    # accuracy: 0.05 absolute
    assert selftest.compare(_numbers(test_accuracy=0.549), ref) == []
    assert selftest.compare(_numbers(test_accuracy=0.56), ref) == ["test_accuracy 0.5600 vs 0.5000"]
    # no guarantee on either side (a non-private run) is equal
    assert selftest.compare(_numbers(epsilon=()), _numbers(epsilon=())) == []


def test_every_family_of_the_registry_has_a_case():
    in_registry = {selftest.family(entry) for entry in registry.algorithms().values()}
    assert in_registry == {"averaging", "voting", "fedkt", "isrl", "fnas"}
    assert set(selftest.families()) == in_registry
    cases = selftest.load_cases()
    names = [c.algorithm for c in cases]
    assert {"fedavg", "dp_fedavg", "dp_fedsgd", "ae_dpfl", "knn_dpfl", "fedkt", "dp_fnas"} <= \
        set(names) and any(n.startswith("sdp_") for n in names)         # and a shuffle-DP one
    for case in cases:                 # a shipped config, quiet, with every case's overrides
        config = selftest.config_of(case)
        assert config["algorithm"]["name"] == case.algorithm
        assert (config["run"]["progress"], config["run"]["checkpoint_every"]) == (False, 0)


def test_a_bad_cases_file_is_refused_naming_it(tmp_path):
    bad = tmp_path / "selftest.toml"
    bad.write_text('[[case]]\nconfig = "x.toml"\nsets = []\n')
    with pytest.raises(ValueError, match="case 1 must have a config and optionally a set"):
        selftest.load_cases(bad)
    bad.write_text('set = []\n')
    with pytest.raises(ValueError, match="holds no"):
        selftest.load_cases(bad)
    with pytest.raises(ValueError, match="needs the repository's configs/ folder"):
        selftest.load_cases(tmp_path / "missing.toml")


def test_families_select_cases_and_bad_names_are_refused():
    assert [c.algorithm for c in selftest.select(["averaging"])] == \
        ["fedavg", "dp_fedavg", "dp_fedsgd"]
    assert [c.algorithm for c in selftest.select(["fnas", "fedavg"])] == ["fedavg", "dp_fnas"]
    with pytest.raises(ValueError, match="--families must name families or algorithms"):
        selftest.select(["averging"])
    assert cli.main(["selftest", "--families", "nope"]) == 2


def test_a_crash_is_one_fail_line_and_the_other_cases_still_run(monkeypatch):
    """Mocked runs (no training): the report, its JSON and the lines."""
    def fake_run_case(case, device=None):
        if case.algorithm == "fedavg":
            raise FloatingPointError("boom\nsecond line")
        return _numbers(device="cpu:0" if device is None else str(device))

    monkeypatch.setattr(selftest, "run_case", fake_run_case)
    lines = []
    report = selftest.run(selftest.select(["averaging"]), log=lines.append)
    assert not report["passed"] and len(lines) == 3
    assert lines[0].startswith("FAIL averaging fedavg") and "crashed: FloatingPointError: boom" in \
        lines[0]
    assert all(line.startswith("PASS averaging") for line in lines[1:])
    json.dumps(report)                                               # --json prints it
    assert selftest.summary(report).startswith("selftest: 2/3 passed (FAIL)")


# ----------------------------------------------------------------------------- the command

def test_selftest_command_passes_every_family_on_this_cpu(capsys):
    """As a user runs it (``fedjax-dp selftest``, its default persistent compilation cache), in
    this process: one PASS line per case, a summary line, exit status 0."""
    options = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
               "jax_persistent_cache_min_entry_size_bytes")
    before = {name: getattr(jax.config, name) for name in options}
    try:
        rc = cli.main(["selftest"])
    finally:                        # the command's cache settings stay with the command
        for name, value in before.items():
            jax.config.update(name, value)
    out = capsys.readouterr()
    assert rc == 0, out.out + out.err[-3000:]
    lines = out.out.strip().splitlines()
    passed = [line for line in lines if line.startswith("PASS ")]
    cases = selftest.load_cases()
    assert [line.split()[2] for line in passed] == [c.algorithm for c in cases], lines
    assert not [line for line in lines if line.startswith("FAIL ")]
    cpu = re.escape(str(jax.devices("cpu")[0]))                 # "cpu:0" (jax 0.6: TFRT_CPU_0)
    n = len(cases)
    assert re.match(rf"selftest: {n}/{n} passed \(PASS\) on {cpu} vs {cpu}; tolerances: "
                    r"epsilon 1e-09 relative", lines[-1]), lines[-1]
    for line in passed:                           # the numbers of both runs, and the times
        assert re.search(rf"acc \d\.\d{{4}}/\d\.\d{{4}} .* \([\d.]+ s on {cpu}, [\d.]+ s on "
                         rf"{cpu}\)", line), line


def test_a_mismatch_fails_the_command(monkeypatch, capsys):
    """A perturbation of the default device's checksum beyond the tolerance: FAIL, exit 1 (after
    the command above in the same process: fedavg's programs are compiled already)."""
    real = selftest.run

    def perturbed(cases, **kwargs):
        def bump(case, numbers):
            return dataclasses.replace(numbers, abs_sum=numbers.abs_sum * 1.01)
        return real(cases, perturb=bump, **kwargs)

    monkeypatch.setattr(selftest, "run", perturbed)
    assert cli.main(["selftest", "--families", "fedavg"]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0].startswith("FAIL averaging fedavg") and "MISMATCH: abs_sum" in out[0]
    assert out[-1].startswith("selftest: 0/1 passed (FAIL)")
