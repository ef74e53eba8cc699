"""The rooms of the package: no module of one algorithm family imports another family (they
share the round engine, ``api`` and the lower layers instead), and the concepts written once
keep no second copy under their old names."""
import ast
import functools
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "fedjax_dp"
FAMILIES = sorted(p.name for p in (PACKAGE / "algorithms").iterdir()
                  if p.is_dir() and (p / "__init__.py").exists())


def _imported(path: Path) -> set[str]:
    """Every module name ``path`` imports (``import a.b``, ``from a.b import c``: a.b and a.b.c),
    at any depth (imports inside functions too)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_the_families_are_the_five_papers_systems():
    assert FAMILIES == ["averaging", "fedkt", "fnas", "isrl", "voting"]


def test_no_family_imports_another_family():
    crossings = []
    for family in FAMILIES:
        for path in sorted((PACKAGE / "algorithms" / family).rglob("*.py")):
            for name in _imported(path):
                parts = name.split(".")
                if parts[:2] == ["fedjax_dp", "algorithms"] and len(parts) > 2 \
                        and parts[2] in FAMILIES and parts[2] != family:
                    crossings.append(f"{path.relative_to(PACKAGE)} imports {name}")
    assert crossings == []


def test_the_walk_sees_a_crossing(tmp_path):
    """The import walk itself: a module that imports another family is seen."""
    bad = tmp_path / "m.py"
    bad.write_text("def f():\n    from fedjax_dp.algorithms.averaging import fedavg\n")
    assert "fedjax_dp.algorithms.averaging.fedavg" in _imported(bad)


def test_one_chunk_size_resolver():
    """``fedjax_dp.core.lift.resolve_chunk_size`` is the only one: the old per-layer resolvers
    (train.local's, DP-FedSGD's) are gone."""
    assert _defined("resolve_chunk_size") == ["core/lift.py"]


@functools.cache
def _nodes() -> tuple[tuple[str, tuple[ast.AST, ...]], ...]:
    """Every module of the package (relative path) with its AST's nodes, parsed once."""
    return tuple((str(path.relative_to(PACKAGE)), tuple(ast.walk(ast.parse(path.read_text()))))
                 for path in sorted(PACKAGE.rglob("*.py")))


def _defined(name: str) -> list[str]:
    return [rel for rel, nodes in _nodes() for node in nodes
            if isinstance(node, ast.FunctionDef) and node.name == name]


def test_one_chunker():
    """Chunking is ``fedjax_dp.core.lift`` (``chunked`` on the device, ``num_chunks`` the
    boundaries, ``pad_rows`` the padding) and ``agent_stream.chunks`` on the host; sizing is
    ``resolve_chunk_size`` (working set: ``training_bytes``). The private copies are gone."""
    for name in ("chunked", "num_chunks", "pad_rows", "training_bytes"):
        assert _defined(name) == ["core/lift.py"], name
    assert _defined("chunks") == ["core/agent_stream.py"]
    for old in ("_chunked", "seed_chunks", "resolve_size", "_device_chunks", "_inner_chunk",
                "_param_bytes"):
        assert _defined(old) == [], old


def test_one_clip_function():
    """Clipping to a global L2 norm is ``fedjax_dp.privacy.clipping.clip_by_global_norm``
    (per row: ``vmap`` of it); the private-gradient module's own copies are gone."""
    assert _defined("clip_by_global_norm") == ["privacy/clipping.py"]
    assert _defined("clip_to_norm") == _defined("clip_rows") == []


def test_one_seed_driver():
    """S seeds are driven by ``fedjax_dp.algorithms.seeds`` alone: families declare a pure
    ``seed_step`` or a batched step (``batch_plan`` / ``batched_step``); the per-family seed
    steppers and the round engine's seed copy of its round are gone."""
    assert _defined("seed_batch") == ["algorithms/seeds.py"]
    assert _defined("seeds_stepper") == _defined("seed_rounds_stepper") == []
    assert _defined("seed_calls") == []
    classes = [node.name for _, nodes in _nodes() for node in nodes
               if isinstance(node, ast.ClassDef)]
    assert "SeedRounds" not in classes


def test_each_layer_does_its_own_work():
    """data/ imports nothing from the layers above it; the families register their algorithms
    (the registry names none of them); the moved modules have no second home."""
    above = ("fedjax_dp.experiments", "fedjax_dp.algorithms", "fedjax_dp.train")
    crossings = [f"{path.relative_to(PACKAGE)} imports {name}"
                 for path in sorted((PACKAGE / "data").rglob("*.py"))
                 for name in _imported(path) if name.startswith(above)]
    assert crossings == []
    registry = (PACKAGE / "algorithms" / "registry.py").read_text()
    assert [f for f in FAMILIES if f in registry] == []
    gone = ["experiments/registry.py", "experiments/population.py", "train/tasks.py"]
    assert [p for p in gone if (PACKAGE / p).exists()] == []


def test_privacy_and_audit_sit_low():
    """privacy/ imports nothing above core/ (itself and core/ only); audit/ imports no
    algorithm (the families import it to register their harnesses, not the reverse)."""
    def crossings(room: str, allowed: tuple) -> list[str]:
        return [f"{path.relative_to(PACKAGE)} imports {name}"
                for path in sorted((PACKAGE / room).rglob("*.py"))
                for name in _imported(path)
                if name.startswith("fedjax_dp.") and not name.startswith(allowed)]
    assert crossings("privacy", ("fedjax_dp.core", "fedjax_dp.privacy")) == []
    assert crossings("audit", ("fedjax_dp.core", "fedjax_dp.privacy", "fedjax_dp.audit")) == []


def test_stages_sit_between_the_mechanisms_and_the_algorithms():
    """stages/ (a round's chain of stages) imports privacy/, train/ and core/ (and itself),
    never algorithms/ or experiments/ (the algorithms import it, not the reverse); the layers
    below it import no stage."""
    crossings = [f"{path.relative_to(PACKAGE)} imports {name}"
                 for path in sorted((PACKAGE / "stages").rglob("*.py"))
                 for name in _imported(path)
                 if name.startswith("fedjax_dp.") and not name.startswith(
                     ("fedjax_dp.core", "fedjax_dp.privacy", "fedjax_dp.train",
                      "fedjax_dp.stages"))]
    assert crossings == []
    below = [f"{path.relative_to(PACKAGE)} imports {name}"
             for room in ("core", "privacy", "train")
             for path in sorted((PACKAGE / room).rglob("*.py"))
             for name in _imported(path) if name.startswith("fedjax_dp.stages")]
    assert below == []


def test_privacy_one_concept_per_module():
    """train/private_grad.py became privacy/'s batch_selection, clipping, noise and private_grad;
    the audit harness moved from privacy/ to audit/harness.py (with the registry of audit/
    mechanisms.py); ``poisson_event`` (an alias of ``sampled_gaussian_event``) is gone."""
    gone = ["train/private_grad.py", "privacy/audit_harness.py", "audit/mechanisms.py"]
    assert [p for p in gone if (PACKAGE / p).exists()] == []
    assert _defined("poisson_event") == []
    assert _defined("gaussian_noise") == ["privacy/noise.py"]
    assert _defined("make_event") == ["privacy/shuffle_accounting.py"]


def test_one_vote_tally():
    """The vote's secure sum -- the in-call tally and the streamed :class:`Tally` with its adds
    and release -- is ``fedjax_dp.privacy.vote``'s alone: no algorithm defines a tally."""
    assert _defined("tally_release") == _defined("tally_step") == ["privacy/vote.py"]
    in_algorithms = [str(path.relative_to(PACKAGE))
                     for path in (PACKAGE / "algorithms").rglob("*.py")
                     for node in ast.walk(ast.parse(path.read_text()))
                     if isinstance(node, ast.FunctionDef) and "tally" in node.name]
    assert in_algorithms == []
    classes = {str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py")
               for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.ClassDef) and node.name == "Tally"}
    assert classes == {"privacy/vote.py"}


def test_algorithm_modules_stay_small():
    """No module of ``algorithms/`` is over 500 lines (a module that grows past it holds more
    than one concept: split it by concept, as rounds.py / fused_rounds.py)."""
    long = {str(p.relative_to(PACKAGE)): n for p in (PACKAGE / "algorithms").rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 500}
    assert long == {}
