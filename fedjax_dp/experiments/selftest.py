"""``fedjax-dp selftest``: every algorithm family at a tiny size on the default device, compared
with the same run on the CPU (docs/devices.md, "First command on a new machine").

Each case is a shipped config with ``--set``-style overrides that make it tiny
(``configs/selftest.toml``, at least one case per algorithm family); it runs the way ``fedjax-dp
run`` runs it, once on JAX's default device and once inside ``jax.default_device(<the first CPU
device>)``, in this process. Compared, within :data:`TOLERANCES`: every data-independent epsilon
(``EPSILON_RTOL``: float64 host accounting, so any difference is a defect), the final model's
``sum |params|`` and ``||params||_2`` (``CHECKSUM_RTOL``: an accelerator rounds differently, a
wrong kernel moves them by far more; a model without parameters: the sum of its predicted test
labels) and ``test_accuracy`` (``ACCURACY_ATOL``, absolute). On a CPU-only machine both runs are
on the CPU. A crash in one case is that case's FAIL and the other cases still run; the exit
status is 1 if any case failed.
"""
from __future__ import annotations

import dataclasses
import math
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Iterable

import fedjax_dp

#: the comparison of the default device's run with the CPU's (module docstring: why these)
EPSILON_RTOL = 1e-9
CHECKSUM_RTOL = 1e-3
ACCURACY_ATOL = 0.05
TOLERANCES = {"epsilon_rtol": EPSILON_RTOL, "checksum_rtol": CHECKSUM_RTOL,
              "accuracy_atol": ACCURACY_ATOL}

#: the shipped configs: a checkout's configs/ or the wheel's fedjax_dp/configs
#: (:func:`fedjax_dp.experiments.shipped.root`)
CONFIGS = next((d for d in (Path(fedjax_dp.__file__).resolve().parent / "configs",
                            Path(fedjax_dp.__file__).resolve().parent.parent / "configs")
                if d.is_dir()), Path(fedjax_dp.__file__).resolve().parent.parent / "configs")
#: the cases: ``set`` (overrides of every case) and ``[[case]]`` tables (``config``, ``set``)
CASES_FILE = CONFIGS / "selftest.toml"


@dataclasses.dataclass(frozen=True)
class Case:
    """One algorithm at a tiny size: a shipped config and the overrides that shrink it."""

    algorithm: str                  # its config's algorithm.name (the registry's name)
    config: str                     # path under configs/
    overrides: tuple[str, ...]      # key=value, as fedjax-dp run --set (every case's first)


def load_cases(path: str | Path = CASES_FILE) -> list[Case]:
    """The cases of ``path`` (default ``configs/selftest.toml``), in its order."""
    import tomllib

    from fedjax_dp.experiments import config as config_lib
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"selftest needs the repository's configs/ folder (a checkout's, or "
                         f"the wheel's fedjax_dp/configs): {path} not found")
    table = tomllib.loads(path.read_text())
    common = tuple(table.get("set", []))
    cases = []
    for i, entry in enumerate(table.get("case", [])):
        if set(entry) - {"config", "set"} or "config" not in entry:
            raise ValueError(f"{path}: case {i + 1} must have a config and optionally a set "
                             f"list, got keys {sorted(entry)}")
        overrides = common + tuple(entry.get("set", []))
        name = config_lib.load(path.parent / entry["config"], list(overrides))["algorithm"]["name"]
        cases.append(Case(algorithm=name, config=entry["config"], overrides=overrides))
    if not cases:
        raise ValueError(f"{path} holds no [[case]]")
    return cases


def family(entry: Any) -> str:
    """The family of a registry entry: the package under ``fedjax_dp.algorithms`` that holds it
    (``averaging``, ``voting``, ``fedkt``, ``isrl``, ``fnas``)."""
    module = getattr(entry, "__name__", None) if isinstance(entry, type(fedjax_dp)) else None
    module = module or type(entry).__module__
    parts = module.split(".")
    return parts[2] if parts[:2] == ["fedjax_dp", "algorithms"] and len(parts) > 2 else module


def families(cases: Iterable[Case] | None = None) -> dict[str, list[str]]:
    """``{family: [its cases' algorithms]}`` of ``cases`` (default :func:`load_cases`), in order."""
    from fedjax_dp.algorithms import registry
    out: dict[str, list[str]] = {}
    for case in load_cases() if cases is None else cases:
        out.setdefault(family(registry.get(case.algorithm)), []).append(case.algorithm)
    return out


def select(names: Iterable[str] | None, cases: Iterable[Case] | None = None) -> list[Case]:
    """The cases (default :func:`load_cases`) named by ``names`` (families or algorithms; None:
    all)."""
    cases = load_cases() if cases is None else list(cases)
    if names is None:
        return cases
    names = [n.strip() for n in names if n.strip()]
    groups = families(cases)
    known = list(groups) + [c.algorithm for c in cases]
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise ValueError(f"--families must name families or algorithms among {known}, "
                         f"got {bad or names}")
    wanted = {a for n in names for a in groups.get(n, [n])}
    return [c for c in cases if c.algorithm in wanted]


def config_of(case: Case) -> dict:
    """The resolved config of ``case``: its shipped file with its overrides."""
    from fedjax_dp.experiments import config as config_lib
    return config_lib.load(CONFIGS / case.config, list(case.overrides))


# ----------------------------------------------------------------------------- one run


@dataclasses.dataclass(frozen=True)
class Numbers:
    """What a run is compared on."""

    test_accuracy: float
    epsilon: tuple[tuple[str, float | None], ...]   # (unit/accountant, epsilon) per guarantee
    abs_sum: float                                   # sum |params| (or of predicted labels)
    l2: float                                        # ||params||_2
    device: str
    wall_s: float

    def as_dict(self) -> dict:
        return {"test_accuracy": self.test_accuracy, "epsilon": dict(self.epsilon),
                "abs_sum": self.abs_sum, "l2": self.l2, "device": self.device,
                "wall_s": round(self.wall_s, 3)}


def checksum(output: Any, x_test: Any) -> tuple[float, float]:
    """``(sum |p|, ||p||_2)`` over every leaf of the final model's parameters, accumulated in
    float64 on the host; a model without parameters: the sum of its predicted labels on
    ``x_test`` (and its L2 norm)."""
    import jax
    import numpy as np
    leaves = jax.tree.leaves(output.params) if output.params is not None else []
    if not leaves:
        labels = np.asarray(output.predict_labels(x_test), dtype=np.float64)
        return float(np.abs(labels).sum()), float(np.sqrt((labels ** 2).sum()))
    host = [np.asarray(jax.device_get(leaf), dtype=np.float64).ravel() for leaf in leaves]
    return (float(sum(np.abs(h).sum() for h in host)),
            float(math.sqrt(sum(float((h ** 2).sum()) for h in host))))


def run_case(case: Case, device: Any = None) -> Numbers:
    """Run ``case`` as ``fedjax-dp run`` does (plan, setup, :func:`api.run`, the result record),
    on ``device`` (None: JAX's default device) and return its :class:`Numbers`."""
    import contextlib

    import jax

    from fedjax_dp.algorithms import api
    from fedjax_dp.experiments import runner
    config = config_of(case)
    start = time.perf_counter()
    scope = jax.default_device(device) if device is not None else contextlib.nullcontext()
    with scope:
        p = runner.plan(config)
        s = runner.setup(config)
        runtime = api.Runtime(chunk_size=config["run"]["chunk_size"] or None,   # as the runner
                              rounds_per_call=config["run"].get("rounds_per_call", "auto"))
        done = api.run(p.entry, s.key, s.fed, s.model, p.algorithm_config, runtime=runtime)
        result = runner.result_record(p, config, s, done.state, done.history, None,
                                      time.perf_counter() - start)
        abs_sum, l2 = checksum(p.entry.output(done.state), s.dataset.x_test)
        where = device if device is not None else jax.devices()[0]
    epsilon = tuple((f"{g['unit']}/{g['accountant']}", g["epsilon"])
                    for g in result["privacy"] if not g.get("data_dependent"))
    return Numbers(test_accuracy=float(result["test_accuracy"]), epsilon=epsilon,
                   abs_sum=abs_sum, l2=l2, device=str(where),
                   wall_s=time.perf_counter() - start)


# ----------------------------------------------------------------------------- comparison


def _close(a: float | None, b: float | None, rtol: float) -> bool:
    if a is None or b is None:                       # no guarantee (infinite epsilon): both
        return a is None and b is None
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= rtol * max(abs(a), abs(b)) or a == b


def compare(device: Numbers, cpu: Numbers, tolerances: dict | None = None) -> list[str]:
    """What differs between the default device's run and the CPU's beyond ``tolerances``
    (default :data:`TOLERANCES`): one phrase per mismatch; [] when they agree."""
    tol = TOLERANCES if tolerances is None else tolerances
    problems = []
    if dict(device.epsilon).keys() != dict(cpu.epsilon).keys():
        problems.append(f"guarantees {list(dict(device.epsilon))} vs {list(dict(cpu.epsilon))}")
    for (name, a), (_, b) in zip(device.epsilon, cpu.epsilon):
        if not _close(a, b, tol["epsilon_rtol"]):
            problems.append(f"epsilon {name} {a!r} vs {b!r}")
    for name in ("abs_sum", "l2"):
        a, b = getattr(device, name), getattr(cpu, name)
        if not (math.isfinite(a) and math.isfinite(b)) or not _close(a, b, tol["checksum_rtol"]):
            problems.append(f"{name} {a:.6g} vs {b:.6g}")
    a, b = device.test_accuracy, cpu.test_accuracy
    if not (math.isfinite(a) and abs(a - b) <= tol["accuracy_atol"]):
        problems.append(f"test_accuracy {a:.4f} vs {b:.4f}")
    return problems


@dataclasses.dataclass
class Outcome:
    """One case's line: PASS / FAIL, the numbers of both runs, what differed or crashed."""

    case: Case
    family: str
    passed: bool
    wall_s: float
    device: Numbers | None = None
    cpu: Numbers | None = None
    problems: list[str] = dataclasses.field(default_factory=list)
    error: str | None = None

    def line(self) -> str:
        head = f"{'PASS' if self.passed else 'FAIL'} {self.family:<9} {self.case.algorithm:<11}"
        if self.error is not None:
            return f"{head} crashed: {self.error} ({self.wall_s:.1f} s)"
        d, c = self.device, self.cpu
        eps = ", ".join(f"{k}={v:.6g}" if v is not None else f"{k}=inf"
                        for k, v in d.epsilon[:1]) or "no guarantee"
        text = (f"{head} acc {d.test_accuracy:.4f}/{c.test_accuracy:.4f}  eps {eps}  "
                f"|p|_1 {d.abs_sum:.6g}/{c.abs_sum:.6g}  |p|_2 {d.l2:.6g}/{c.l2:.6g}  "
                f"({d.wall_s:.1f} s on {d.device}, {c.wall_s:.1f} s on {c.device})")
        return text + (f"  MISMATCH: {'; '.join(self.problems)}" if self.problems else "")

    def as_dict(self) -> dict:
        return {"algorithm": self.case.algorithm, "family": self.family, "passed": self.passed,
                "wall_s": round(self.wall_s, 3), "error": self.error, "problems": self.problems,
                "device": self.device.as_dict() if self.device else None,
                "cpu": self.cpu.as_dict() if self.cpu else None}


def run(cases: Iterable[Case] | None = None, *, log: Callable[[str], None] = lambda line: None,
        tolerances: dict | None = None,
        perturb: Callable[[Case, Numbers], Numbers] | None = None) -> dict:
    """Run every case on the default device and on the CPU; ``log`` gets one line per case as
    it finishes. ``perturb(case, numbers)`` (tests only) replaces the default device's numbers
    before the comparison. Returns ``{"passed", "cases", "tolerances", "default_device",
    "wall_s"}``."""
    import jax

    from fedjax_dp.algorithms import registry
    cases = load_cases() if cases is None else list(cases)
    try:
        cpu_device = jax.devices("cpu")[0]
    except RuntimeError:
        raise ValueError("selftest compares with the CPU, but JAX has no CPU backend here "
                         "(JAX_PLATFORMS must include cpu, e.g. JAX_PLATFORMS=cuda,cpu)") from None
    default = jax.devices()[0]
    start = time.perf_counter()
    outcomes = []
    for case in cases:
        t0 = time.perf_counter()
        outcome = Outcome(case=case, family=family(registry.get(case.algorithm)), passed=False,
                          wall_s=0.0)
        try:
            outcome.device = run_case(case)
            if perturb is not None:
                outcome.device = perturb(case, outcome.device)
            # the CPU's run; where the default device is that CPU, the same call again (inside
            # jax.default_device the jitted functions would compile anew for the same device)
            outcome.cpu = run_case(case, None if default == cpu_device else cpu_device)
            outcome.problems = compare(outcome.device, outcome.cpu, tolerances)
            outcome.passed = not outcome.problems
        except Exception as e:                      # reported; the other cases still run
            text = str(e).strip().splitlines()
            outcome.error = f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")
            outcome.problems = [traceback.format_exc(limit=-3)]
        outcome.wall_s = time.perf_counter() - t0
        outcomes.append(outcome)
        log(outcome.line())
    return {"passed": all(o.passed for o in outcomes),
            "cases": [o.as_dict() for o in outcomes],
            "lines": [o.line() for o in outcomes],
            "tolerances": dict(TOLERANCES if tolerances is None else tolerances),
            "default_device": str(default), "cpu_device": str(cpu_device),
            "wall_s": round(time.perf_counter() - start, 3)}


def summary(report: dict) -> str:
    """The last line: how many cases passed, the devices, the tolerances and the wall time."""
    n = len(report["cases"])
    ok = sum(c["passed"] for c in report["cases"])
    tol = report["tolerances"]
    return (f"selftest: {ok}/{n} passed ({'PASS' if report['passed'] else 'FAIL'}) on "
            f"{report['default_device']} vs {report['cpu_device']}; tolerances: epsilon "
            f"{tol['epsilon_rtol']:g} relative, parameter checksums {tol['checksum_rtol']:g} "
            f"relative, test accuracy {tol['accuracy_atol']:g} absolute; {report['wall_s']:.1f} s")
