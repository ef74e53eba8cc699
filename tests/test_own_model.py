"""Your own model and data: ``models.from_flax`` (linen and nnx) against calling the module
directly, ``FederatedData.from_arrays`` against a loop that groups records by client, bad input
refused in one line naming the argument, and docs/own_model_and_data.md run as written."""
import re
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from fedjax_dp import core, models
from fedjax_dp.algorithms import api

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "own_model_and_data.md"


class LinenMLP(nn.Module):
    @nn.compact
    def __call__(self, x):                       # x [B, 2, 3]: flattens, as users write it
        x = x.reshape((x.shape[0], -1))
        return nn.Dense(3)(nn.tanh(nn.Dense(5)(x)))


class NnxMLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.hidden = nnx.Linear(6, 5, rngs=rngs)
        self.out = nnx.Linear(5, 3, rngs=rngs)

    def __call__(self, x):
        x = x.reshape((x.shape[0], -1))
        return self.out(nnx.tanh(self.hidden(x)))


X = np.random.default_rng(0).normal(size=(7, 2, 3)).astype(np.float32)


def test_linen_module_gives_the_modules_own_init_and_predictions():
    module = LinenMLP()
    model = models.from_flax(module, X[:1])
    assert (model.name, model.feature_shape, model.num_classes) == ("LinenMLP", (2, 3), 3)
    key = jax.random.key(3)
    params = model.init(key)
    own = module.init(key, X[:1])
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), params, own))
    np.testing.assert_allclose(model.logits(params, X), module.apply(own, X), rtol=1e-6,
                               atol=1e-6)
    np.testing.assert_allclose(model.apply(params, X[4]), module.apply(own, X[4:5])[0],
                               rtol=1e-6, atol=1e-6)


def test_nnx_module_and_class_give_the_modules_predictions():
    module = NnxMLP(nnx.Rngs(0))
    model = models.from_flax(module, X[:2])
    assert (model.name, model.feature_shape, model.num_classes) == ("NnxMLP", (2, 3), 3)
    params = model.init(jax.random.key(1))
    np.testing.assert_allclose(model.logits(params, X), module(X), rtol=1e-6, atol=1e-6)
    again = model.init(jax.random.key(2))            # a module: its own parameters, any key
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), params, again))
    # the class (a function rngs -> module): the parameters of NnxMLP(nnx.Rngs(key))
    fresh = models.from_flax(NnxMLP, X[:1])
    k1, k2 = jax.random.key(5), jax.random.key(6)
    np.testing.assert_allclose(fresh.logits(fresh.init(k1), X), NnxMLP(nnx.Rngs(k1))(X),
                               rtol=1e-6, atol=1e-6)
    stacked = jax.vmap(fresh.init)(jnp.stack([k1, k2]))   # all agents' models at once
    assert not np.allclose(stacked["out"]["kernel"][0], stacked["out"]["kernel"][1])
    grad = jax.grad(lambda p: fresh.apply(p, X[0]).sum())(fresh.init(k1))
    assert jax.tree.structure(grad) == jax.tree.structure(fresh.init(k1))


class NnxNormed(nnx.Module):
    """Other state than parameters (batch statistics), held as built."""

    def __init__(self, rngs: nnx.Rngs):
        self.dense = nnx.Linear(6, 3, rngs=rngs)
        self.norm = nnx.BatchNorm(3, use_running_average=True, rngs=rngs)

    def __call__(self, x):
        return self.norm(self.dense(x.reshape((x.shape[0], -1))))


def test_nnx_state_other_than_parameters_is_kept_and_not_trained():
    module = NnxNormed(nnx.Rngs(0))
    module.norm.mean[...] = jnp.array([0.5, -1.0, 2.0])      # statistics a trained module holds
    model = models.from_flax(module, X[:1])
    params = model.init(jax.random.key(0))
    assert set(params) == {"dense", "norm"} and set(params["norm"]) == {"scale", "bias"}
    np.testing.assert_allclose(model.logits(params, X), module(X), rtol=1e-6, atol=1e-6)


def _loop_grouping(x, y, ids):
    """The reference: for each sorted distinct id, its records in order (a loop over clients)."""
    unique = sorted(set(ids.tolist()))
    groups = [[r for r in range(len(ids)) if ids[r] == c] for c in unique]
    return unique, core.from_ragged([x[g] for g in groups], [y[g] for g in groups])


@pytest.mark.parametrize("ids", [np.array([7, -2, 7, 30, -2, 7, 5, 30, 7]),
                                 ["bob", "al", "bob", "zoe", "al", "bob", "cy", "zoe", "bob"]],
                         ids=["ints", "strings"])
def test_from_arrays_groups_records_as_a_loop_over_clients(ids):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(9, 2, 3)).astype(np.float32)
    y = rng.integers(0, 4, size=9)
    fed = api.FederatedData.from_arrays(x, y, ids, num_classes=4, x_public=x[:2])
    unique, want = _loop_grouping(x, y, np.asarray(ids))
    assert list(fed.client_ids) == unique and fed.num_classes == 4 and fed.num_agents == 4
    for field in ("x", "y", "mask", "counts"):
        np.testing.assert_array_equal(getattr(fed.agents, field), getattr(want, field))
    assert fed.agents.y.dtype == jnp.int32 and fed.agents.x.dtype == jnp.float32


def _one_line(exc_info, *words):
    text = str(exc_info.value)
    assert "\n" not in text, text
    for word in words:
        assert word in text, (word, text)


class _Scalar(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(1)(x.reshape((x.shape[0], -1)))[:, 0]     # [B], not [B, C]


class _IntOut(nn.Module):
    @nn.compact
    def __call__(self, x):
        return jnp.zeros((x.shape[0], 3), jnp.int32)


@pytest.mark.parametrize("module, example, words", [
    (3, X[:1], ("module", "flax.linen.Module", "int")),
    (LinenMLP, X[:1], ("module", "LinenMLP(...)")),
    (lambda rngs: 3, X[:1], ("module", "returned int")),
    (lambda a, b: None, X[:1], ("module", "nnx.Rngs(0) failed")),
    (LinenMLP(), X[0, 0], ("example_x", "[B >= 1, *feature_shape]", "(3,)")),
    (LinenMLP(), np.array([["a", "b"]]), ("example_x", "numeric")),
    (NnxMLP(nnx.Rngs(0)), np.zeros((1, 4)), ("example_x", "(4,)", "cannot be initialised")),
    (_Scalar(), X[:1], ("module must return floating logits", "shape ()")),
    (_IntOut(), X[:1], ("module must return floating logits", "int32")),
], ids=["int", "linen-class", "factory-result", "factory-fails", "one-example", "strings",
        "wrong-width", "scalar-output", "int-output"])
def test_from_flax_refuses_bad_input_in_one_line(module, example, words):
    with pytest.raises(ValueError) as e:
        models.from_flax(module, example)
    _one_line(e, *words)


GOOD = dict(x=np.zeros((4, 2), np.float32), y=np.array([0, 1, 2, 0]), client_ids=[1, 2, 1, 3],
            num_classes=3)


@pytest.mark.parametrize("change, words", [
    ({"y": np.array([0, 1, 2])}, ("x and y", "same length", "4 and 3")),
    ({"client_ids": [1, 2, 1]}, ("client_ids", "one client id per record (4)", "(3,)")),
    ({"client_ids": [[1, 2], [1, 3]]}, ("client_ids", "1-D")),
    ({"client_ids": [0.5, 1.0, 1.0, 2.0]}, ("client_ids", "integer or string", "float64")),
    ({"client_ids": np.array([1, "a", 1, 2], dtype=object)}, ("client_ids", "object")),
    ({"y": np.array([0, 1, 3, 0])}, ("y", "[0, 2]", "num_classes = 3", "[0, 3]")),
    ({"y": np.array([0, -1, 2, 0])}, ("y", "[0, 2]", "[-1, 2]")),
    ({"y": np.array([0.0, 1.0, 2.0, 0.0])}, ("y", "integer labels", "float64")),
    ({"x": np.array([[0.0, np.nan]] * 4)}, ("x", "NaN or infinite")),
    ({"x": np.zeros(4)}, ("x", "[n >= 1, *feature_shape]", "(4,)")),
    ({"num_classes": 0}, ("num_classes",)),
], ids=["y-length", "ids-length", "ids-2d", "float-ids", "mixed-ids", "label-high",
        "label-negative", "float-labels", "nan", "flat-x", "num-classes"])
def test_from_arrays_refuses_bad_input_in_one_line(change, words):
    with pytest.raises(ValueError) as e:
        api.FederatedData.from_arrays(**{**GOOD, **change})
    _one_line(e, *words)


def test_client_ids_must_match_the_agents():
    fed = api.FederatedData.from_arrays(**GOOD)
    with pytest.raises(ValueError, match=r"data.client_ids must hold one id per agent \(3\)"):
        api.FederatedData(agents=fed.agents, num_classes=3, client_ids=np.array([1, 2]))


def test_print_progress_prints_every_kth_step(capsys):
    show = api.print_progress(every=2)
    for t in (1, 2, 3, 4):
        show(t, {"round": t, "train_loss": 0.5 / t, "num_sampled": 3})
    assert capsys.readouterr().out.splitlines() == [
        "step 2: train_loss 0.25, num_sampled 3", "step 4: train_loss 0.125, num_sampled 3"]
    with pytest.raises(ValueError, match="every"):
        api.print_progress(every=0)


def test_the_page_is_linked_from_the_index_the_nav_and_the_readme():
    assert "own_model_and_data.md" in (ROOT / "docs" / "index.md").read_text()
    assert "own_model_and_data.md" in (ROOT / "mkdocs.yml").read_text()
    assert "docs/own_model_and_data.md" in (ROOT / "README.md").read_text()


def test_the_docs_example_runs_as_written(capsys, monkeypatch):
    """The page's python blocks in one namespace, at the smoke size (tests/conftest.py)."""
    monkeypatch.setenv("FEDJAX_DP_NOTEBOOK_SMOKE", "1")
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) == 4
    namespace: dict = {}
    for i, block in enumerate(blocks):
        exec(compile(block, f"own_model_and_data.md block {i + 1}", "exec"), namespace)
    out = capsys.readouterr().out
    fed = namespace["fed"]
    assert fed.num_agents == 50 and str(fed.client_ids[0]) == "user0"
    for line in ("DP-FedAvg, linen", "DP-FedAvg, nnx", "AE-DPFL, nnx"):
        found = re.search(re.escape(line) + r": test accuracy ([0-9.]+), epsilon ([0-9.]+)", out)
        assert found, (line, out)
        assert 0 <= float(found[1]) <= 1 and 0 < float(found[2]) < 100
    assert "\nstep 1\n" in out                  # api.print_progress (no diagnostics)
