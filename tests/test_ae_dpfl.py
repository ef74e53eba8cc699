"""AE-DPFL: ballots vs a per-agent loop, one-GEMM first layer, run, ledger, configs end to end."""
import dataclasses
import math
import re
from pathlib import Path

import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dp.algorithms.voting import ae_dpfl
from fedjax_dp.core import from_ragged, rng
from fedjax_dp.data import population, synthetic
from fedjax_dp.experiments import config as config_lib
from fedjax_dp.experiments import runner
from fedjax_dp.models import make_model
from fedjax_dp.privacy import accounting, vote
from fedjax_dp.train import LocalTrainConfig, accuracy, train_agents
from voting_fixtures import run_voting

ROOT = Path(__file__).resolve().parents[1]
TINY = ["data.num_agents=10", "train.steps=3", "model.hidden=[8]", "algorithm.num_queries=20",
        "algorithm.student_steps=5", "run.progress=false", 'privacy.accountants=["rdp"]']


@pytest.fixture(scope="module")
def problem():
    ds = synthetic(num_train=480, num_public=150, num_test=200, num_features=6, num_classes=3,
                   seed=1)
    data = from_ragged(list(ds.x_train.reshape(8, 60, 6)), list(ds.y_train.reshape(8, 60)))
    model = make_model("mlp", (6,), 3, hidden=(16,))
    cfg = ae_dpfl.Config(sigma=1.0, num_queries=120, student_steps=100,
                         local=LocalTrainConfig(steps=40, batch_size=16, learning_rate=0.2),
                         agent_chunk=3, query_chunk=50, data_dependent=True)
    res = run_voting(ae_dpfl, jax.random.key(0), data, model, cfg, ds.x_public, chunk_size=None)
    return ds, data, model, cfg, res


def test_ballots_match_a_per_agent_loop(problem):
    ds, data, model, cfg, res = problem
    queries = jnp.asarray(ds.x_public[:30])
    got = np.asarray(ae_dpfl.ballot_fn(model)(res.agent_params, queries))     # [N, q, C]
    logits = jax.jit(model.logits)                    # one agent's logits, compiled once
    for i in range(data.num_agents):
        p = jax.tree.map(lambda l: l[i], res.agent_params)
        pred = np.argmax(np.asarray(logits(p, queries)), -1)
        np.testing.assert_array_equal(got[i], np.eye(3)[pred])


def test_first_layer_of_all_agents_is_one_gemm(problem):
    """Under vmap with shared queries the first Dense is ONE dot_general [q, d] x [N, d, h]
    (no batch dimensions: a single GEMM [q, d] x [d, N h])."""
    ds, data, model, cfg, res = problem
    queries = jnp.asarray(ds.x_public[:30])
    jaxpr = jax.make_jaxpr(ae_dpfl.ballot_fn(model))(res.agent_params, queries)
    dots = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "dot_general"]
    first = dots[0]
    shapes = sorted(tuple(v.aval.shape) for v in first.invars)
    (_, _), (lhs_batch, rhs_batch) = first.params["dimension_numbers"]
    assert lhs_batch == () and rhs_batch == ()                         # no per-agent batching
    assert (8, 6, 16) in shapes                                        # all agents' kernels
    assert any(s[0] == 30 and s[-1] == 6 and math.prod(s) == 180 for s in shapes)   # queries


def test_run_outputs_and_accuracy(problem):
    ds, data, model, cfg, res = problem
    assert res.labels.shape == (120,) and res.labels.dtype == np.int32
    assert len(set(res.query_indices.tolist())) == 120
    assert res.clean_vote_sums.shape == (120, 3)
    np.testing.assert_allclose(res.clean_vote_sums.sum(1), data.num_agents)   # one vote each
    assert np.mean(res.labels == ds.y_public[res.query_indices]) > 0.8
    assert accuracy(model, res.params, ds.x_test, ds.y_test) > 0.75
    # deterministic given the key; a different key draws different noise / queries
    again = run_voting(ae_dpfl, jax.random.key(0), data, model, cfg, ds.x_public, chunk_size=None)
    np.testing.assert_array_equal(again.labels, res.labels)


def test_ledger_units_and_data_dependent(problem):
    ds, data, model, cfg, res = problem
    ledger = ae_dpfl.ledger(cfg, res.state)
    delta = 1e-5
    for unit, z in (("agent", cfg.sigma), ("instance", cfg.sigma / math.sqrt(2))):
        acc = dp_accounting.rdp.RdpAccountant(list(accounting.DEFAULT_RDP_ORDERS))
        acc.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), 120))
        assert ledger.epsilon(unit, delta) == pytest.approx(acc.get_epsilon(delta), rel=1e-9)
    rows = {(r["unit"], r["accountant"]): r for r in ledger.report(delta, ("rdp",))}
    assert rows[("agent_data_dependent", "rdp")]["data_dependent"] is True
    assert rows[("agent", "rdp")]["data_dependent"] is False
    assert rows[("agent", "rdp")]["relation"] == vote.RELATIONS["agent"]


def test_config_validation():
    for kwargs, match in [({"sigma": 0.0}, "algorithm.sigma"), ({"sigma": -2}, "algorithm.sigma"),
                          ({"num_queries": 0}, "num_queries"),
                          ({"student_learning_rate": -1.0}, "student_learning_rate"),
                          ({"student_optimizer": "lbfgs"}, "student_optimizer"),
                          ({"query_chunk": 0}, "query_chunk"),
                          ({"data_dependent": "yes"}, "data_dependent"),
                          ({"vote_noise": "per_query"}, "algorithm.vote_noise")]:
        with pytest.raises(ValueError, match=match):
            ae_dpfl.Config(**kwargs)


def test_bad_inputs_raise_before_work(problem):
    ds, data, model, cfg, res = problem
    with pytest.raises(ValueError, match="num_queries"):
        run_voting(ae_dpfl, jax.random.key(0), data, model, ae_dpfl.Config(num_queries=151),
                   ds.x_public)
    with pytest.raises(ValueError, match="x_public"):
        run_voting(ae_dpfl, jax.random.key(0), data, model, cfg, ds.x_public[:, :5])
    bad = ds.x_public.copy()
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="x_public"):
        run_voting(ae_dpfl, jax.random.key(0), data, model, cfg, bad)


def test_shipped_config_runs_end_to_end_tiny(tmp_path, monkeypatch, capsys):
    """Also the output without a terminal: one line per phase, then a short summary with the
    test accuracy, the headline guarantee (unit, delta, accountant, how many more), that it
    covers every release (the shipped config reports no data-dependent epsilon and no local
    diagnostics unless it opts in) and the folder."""
    from fedjax_dp.core import progress
    monkeypatch.setattr(progress, "interactive", lambda: False)       # a pipe or a log file
    cfg = config_lib.load(ROOT / "configs" / "ae_dpfl" / "mnist5k.toml", TINY)
    result = runner.run(cfg, tmp_path, progress=True)
    lines = capsys.readouterr().err.strip().splitlines()
    assert [ln.split(" ")[1:4] for ln in lines[:3]] == [
        ["phase", "1/3", "local_training"], ["phase", "2/3", "vote"], ["phase", "3/3", "student"]]
    assert len(lines) == 4 and lines[3].startswith(
        f"[ae_dpfl] test accuracy {result['test_accuracy']:.4f}; agent: eps=")
    assert re.search(rf"at delta={cfg['privacy']['delta']:.3g} \(rdp, \+1 more\); ", lines[3])
    assert lines[3].endswith(f"; covers every release; run folder {tmp_path}")
    report = "\n".join(runner.report_lines(result, tmp_path))
    assert "every guarantee covers every release" in report and "mean_agent_loss" not in report
    assert result["algorithm"] == "ae_dpfl" and result["num_agents"] == 10
    assert "mean_agent_loss" not in result["history"][0]
    units = {(g["unit"], g["accountant"]): g for g in result["privacy"]}
    assert {("agent", "rdp"), ("instance", "rdp")} == set(units)
    event = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(cfg["algorithm"]
                                                                            ["sigma"]), 20)
    assert units[("agent", "rdp")]["epsilon"] == pytest.approx(
        accounting.epsilon(event, cfg["privacy"]["delta"]), rel=1e-9)


def test_cross_domain_config_tiny(tmp_path):
    cfg = config_lib.load(ROOT / "configs" / "ae_dpfl" / "mnist5k_to_digits.toml",
                          TINY + ["algorithm.data_dependent=false"])
    result = runner.run(cfg, tmp_path, progress=False)
    assert result["dataset"] == "mnist5k->digits"
    assert {g["unit"] for g in result["privacy"]} == {"agent", "instance"}
    ds = population.load_data(cfg["data"])
    assert ds.feature_shape == (8, 8, 1) and ds.x_test.shape[0] == 360      # digits' test split
    with pytest.raises(ValueError, match="image_size"):
        population.load_data({**cfg["data"], "image_size": 0})              # 28x28 vs 8x8
    with pytest.raises(ValueError, match="server_dataset"):
        runner.plan(config_lib.load(ROOT / "configs" / "ae_dpfl" / "mnist5k_to_digits.toml",
                                    ["data.server_dataset=\"nope\""]))
    with pytest.raises(ValueError, match="image_size"):
        config_lib.load(ROOT / "configs" / "ae_dpfl" / "mnist5k_to_digits.toml",
                        ["data.image_size=-1"])


# --------------------------------------------------------------------------- abstention

def _confidences(model, params, queries):
    """Per-agent loop: (max softmax [N, q], argmax [N, q])."""
    n = jax.tree.leaves(params)[0].shape[0]
    conf, pred = [], []
    softmax = jax.jit(lambda p, q: jax.nn.softmax(model.logits(p, q), -1))   # compiled once
    for i in range(n):
        p = jax.tree.map(lambda l: l[i], params)
        probs = np.asarray(softmax(p, queries))
        conf.append(probs.max(-1))
        pred.append(probs.argmax(-1))
    return np.stack(conf), np.stack(pred)


def test_abstaining_ballots_match_a_per_agent_loop(problem):
    ds, data, model, cfg, res = problem
    queries = jnp.asarray(ds.x_public[:30])
    conf, pred = _confidences(model, res.agent_params, queries)
    tau = float(np.median(conf))
    got = np.asarray(ae_dpfl.ballot_fn(model, tau)(res.agent_params, queries))   # [N, q, C]
    clear = np.abs(conf - tau) > 1e-5             # float round-off can flip exact-threshold cases
    assert clear.mean() > 0.95
    want = np.where((conf >= tau)[..., None], np.eye(3)[pred], 0.0)
    np.testing.assert_array_equal(got[clear], want[clear])
    assert 0 < (got.sum(-1) == 0).mean() < 1                 # both abstentions and votes occur
    assert set(np.unique(got.sum(-1))) <= {0.0, 1.0}         # one-hot or zero, nothing else
    # None is the paper's rule; tau <= 1/C never abstains (max softmax >= 1/C)
    plain = np.asarray(ae_dpfl.ballot_fn(model)(res.agent_params, queries))
    np.testing.assert_array_equal(plain, np.eye(3)[pred])
    np.testing.assert_array_equal(
        np.asarray(ae_dpfl.ballot_fn(model, 0.3)(res.agent_params, queries)), plain)
    assert ae_dpfl.ballot_fn(model, 0.5) is ae_dpfl.ballot_fn(model, 0.5)   # compiled once


def test_abstention_sensitivities_brute_force(problem):
    """Noise-free vote sums with abstention: removing one agent moves each query's sum by <= 1
    (L2); retraining with one record of one agent removed moves it by <= sqrt(2)."""
    ds, data, model, cfg, res = problem
    queries = jnp.asarray(ds.x_public[:60])
    conf, _ = _confidences(model, res.agent_params, queries)
    tau = float(np.median(conf))
    fn = ae_dpfl.ballot_fn(model, tau)
    sums = lambda params: np.asarray(vote.vote_sums(fn, params, queries, num_classes=3))
    full = sums(res.agent_params)
    n = data.num_agents
    for j in range(n):                                            # add/remove one agent
        rest = jax.tree.map(lambda l: np.delete(np.asarray(l), j, axis=0), res.agent_params)
        change = np.linalg.norm(full - sums(rest), axis=-1)
        assert change.max() <= 1.0 + 1e-6
    # add/remove one record of agent 0: retrain everyone exactly as the run (api.run) does
    key = jax.random.key(0)
    init = jax.vmap(model.init)(rng.split_per_agent(rng.stream(key, "init"), n))
    xs = list(ds.x_train.reshape(8, 60, 6))
    ys = list(ds.y_train.reshape(8, 60))
    train = lambda d: train_agents(rng.stream(key, "train"), init, d, model, cfg.local,
                                   shared_init=False, chunk_size=None)[0]
    np.testing.assert_allclose(sums(train(from_ragged(xs, ys))), full)     # the run's agents
    worst = 0.0
    for r in (0, 17, 59):
        xr, yr = list(xs), list(ys)
        xr[0], yr[0] = np.delete(xs[0], r, 0), np.delete(ys[0], r, 0)
        change = np.linalg.norm(full - sums(train(from_ragged(xr, yr, pad_to=60))), axis=-1)
        assert change.max() <= math.sqrt(2) + 1e-6
        worst = max(worst, change.max())
    assert worst > 0                               # the check saw at least one ballot move


def test_abstention_run_and_ledger(problem):
    ds, data, model, cfg, res = problem
    acfg = dataclasses.replace(cfg, abstain_below=0.9)
    ares = run_voting(ae_dpfl, jax.random.key(0), data, model, acfg, ds.x_public, chunk_size=None)
    np.testing.assert_array_equal(ares.query_indices, res.query_indices)
    votes = ares.clean_vote_sums.sum(1)
    assert votes.max() <= data.num_agents and votes.min() < data.num_agents   # some abstain
    top = np.sort(ares.clean_vote_sums, 1)
    clear = top[:, -1] - top[:, -2] >= 5                      # 5 sigma: noise cannot flip these
    assert clear.mean() > 0.25
    np.testing.assert_array_equal(ares.labels[clear], ares.clean_vote_sums[clear].argmax(1))
    assert np.mean(ares.labels == ds.y_public[ares.query_indices]) > 0.6      # chance: 1/3
    # the ledger does not depend on abstain_below: same Delta, same sigma, same Q
    delta = 1e-5
    for unit in ("agent", "instance"):
        assert (ae_dpfl.ledger(acfg).epsilon(unit, delta)
                == ae_dpfl.ledger(cfg).epsilon(unit, delta))


@pytest.mark.parametrize("bad", [0, 0.0, -0.5, 1.0001, 2, float("nan"), float("inf"), True,
                                 "0.9"])
def test_abstain_below_validation(bad):
    with pytest.raises(ValueError, match=r"abstain_below.*\(0, 1\]"):
        ae_dpfl.Config(abstain_below=bad)
    with pytest.raises(ValueError, match=r"abstain_below.*\(0, 1\]"):
        ae_dpfl.ballot_fn(make_model("logistic", (2,), 2), bad)


def test_abstain_below_from_toml_set():
    path = ROOT / "configs" / "ae_dpfl" / "mnist5k.toml"
    plan = runner.plan(config_lib.load(path, TINY + ["algorithm.abstain_below=0.9"]))
    assert plan.algorithm_config.abstain_below == 0.9
    assert runner.plan(config_lib.load(path, TINY)).algorithm_config.abstain_below is None
    with pytest.raises(ValueError, match=r"algorithm\.abstain_below.*\(0, 1\]"):
        runner.plan(config_lib.load(path, TINY + ["algorithm.abstain_below=1.5"]))


@pytest.mark.parametrize("where", ["host", "device"])
def test_cli_run_compiles_a_fixed_set_of_functions(tmp_path, where):
    """The command line's AE-DPFL on a generated population streamed in 4 chunks (the last
    ragged): a fixed set of compiled functions for the whole run (drawing the agents, the
    queries, the step keys, one call per chunk, the vote, the student), however many chunks;
    no eager op compiles its own program (issue 30: 53 compilations before on the CPU)."""
    cfg = config_lib.load(ROOT / "configs" / "ae_dpfl" / "mnist5k.toml", [
        "data.dataset=synthetic", "data.num_agents=50", "data.partition=\"iid\"",
        "data.partition_options={}", "data.dataset_options={num_train=803,num_features=6,"
        "num_public=40,num_test=30,generator=\"jax\"}", "train.steps=2", "train.batch_size=4",
        "model.hidden=[8]", "algorithm.num_queries=10", "algorithm.student_steps=3",
        "algorithm.agent_chunk=16", f"run.agents_on=\"{where}\"", "run.progress=false",
        "run.compilation_cache=\"off\""])
    result = runner.run(cfg, tmp_path, progress=False)
    timing = result["timing"]
    assert timing["compilations"] <= 10, [e["what"] for e in timing["listed"]]
    eager = {"jit(_reduce_min)", "jit(dynamic_slice)", "jit(less)", "jit(_threefry_split)",
             "jit(concatenate)", "jit(iota)", "jit(squeeze)", "jit(_threefry_fold_in)"}
    assert not eager & {e["what"] for e in timing["listed"]}
    assert [r["agent_chunk"] for r in result["history"] if "agent_chunk" in r] == [16]
