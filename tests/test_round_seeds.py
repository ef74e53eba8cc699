"""Seeds of FedAvg / DP-FedAvg / DP-FedSGD in one vmapped compiled call per round (the seed
driver vmapping the fused round, :func:`fedjax_dp.algorithms.rounds_protocol.seed_step`) equal the seeds
run one by one: the same cohorts, the same metrics, the same models, the same ledgers."""
import dataclasses

import jax
import numpy as np
import pytest

from fedjax_dp.algorithms import api, rounds, seeds
from fedjax_dp.algorithms.averaging import dp_fedavg, dp_fedsgd, fedavg
from fedjax_dp.core import from_ragged
from fedjax_dp.experiments import config as config_lib
from fedjax_dp.experiments import runner
from fedjax_dp.models import make_model
from fedjax_dp.train import LocalTrainConfig

# tiny runner configs (as tests/test_sweep.py): mnist5k, 20 agents, 2 rounds of 2 local steps
FEDAVG_SETS = ["data.num_agents=20", "algorithm.rounds=2", "train.steps=2", "run.eval_every=1",
               "algorithm.diagnostics=true", "model.hidden=[16]", "privacy.accountants=[\"rdp\"]", "run.progress=false"]
DP_FEDAVG = "configs/dp_fedavg/mnist5k.toml"
FEDAVG = "configs/fedavg/mnist5k.toml"
DP_FEDSGD = "configs/dp_fedsgd/mnist5k.toml"
DP_FEDSGD_SETS = ["data.num_agents=10", "algorithm.rounds=2", "algorithm.sampling_rate=0.5",
                  "algorithm.diagnostics=true", "train.steps=2", "run.eval_every=1", "privacy.accountants=[\"rdp\"]",
                  "run.progress=false"]
SEEDS = (0, 1, 2)


def _close_records(joint, alone, private):
    assert joint["vmapped_seeds"] == len(SEEDS)
    assert joint["seed"] == alone["seed"]
    assert joint["test_accuracy"] == pytest.approx(alone["test_accuracy"], abs=1e-6)
    assert len(joint["history"]) == len(alone["history"])
    for a, b in zip(joint["history"], alone["history"]):
        assert a.keys() == b.keys()
        for k in a:
            assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-6), k
    assert len(joint["privacy"]) == len(alone["privacy"])
    assert (len(alone["privacy"]) > 0) == private
    for a, b in zip(joint["privacy"], alone["privacy"]):
        assert a["epsilon"] == pytest.approx(b["epsilon"], rel=1e-9)


def _compare(path, sets, private=True):
    base = config_lib.load(path, sets)
    configs = [dict(base, seed=s) for s in SEEDS]
    together = runner.run_seeds(configs)
    assert together is not None
    alone = [runner.run(c) for c in configs]
    for joint, one in zip(together, alone):
        _close_records(joint, one, private)
    # different seeds: different models and cohorts (the seed axis is not broadcast)
    assert len({json_round(r["history"]) for r in together}) == len(SEEDS)
    return together, alone


def json_round(history):
    return tuple(tuple(sorted(r.items())) for r in history)


def test_dp_fedavg_poisson_seeds_equal_separate_runs():
    together, alone = _compare(DP_FEDAVG, FEDAVG_SETS)
    # Poisson cohorts of different sizes between the seeds (one common pass per round)
    sizes = {r["num_sampled"] for a in alone for r in a["history"]}
    assert len(sizes) > 1


def test_dp_fedavg_fixed_size_seeds_equal_separate_runs():
    together, _ = _compare(DP_FEDAVG, FEDAVG_SETS + ["algorithm.sampling=\"fixed\"",
                                                     "algorithm.cohort_size=5"])
    assert all(r["num_sampled"] == 5 for t in together for r in t["history"])


@pytest.mark.sweep       # suite time: test_dp_fedsgd_participation_and_ledger covers the seeds'
def test_dp_fedsgd_seeds_equal_separate_runs():   # participation and ledger on a tiny problem
    # the instance-level ledger reads each seed's participation counts: equal epsilons above
    together, alone = _compare(DP_FEDSGD, DP_FEDSGD_SETS)
    assert len({r["num_sampled"] for a in alone for r in a["history"]}) > 1


def test_fedavg_seeds_equal_separate_runs():
    assert callable(fedavg.seed_step)
    _compare(FEDAVG, FEDAVG_SETS + ["algorithm.sampling_rate=0.3"], private=False)


def test_host_resident_agents_run_seeds_one_by_one():
    base = config_lib.load(DP_FEDAVG, FEDAVG_SETS + ["run.agents_on=\"host\""])
    assert runner.run_seeds([dict(base, seed=0), dict(base, seed=1)]) is None


# ------------------------------------------------------------------ API level: tiny stacked data

LOCAL = LocalTrainConfig(steps=2, batch_size=4, learning_rate=0.2)


@pytest.fixture(scope="module")
def tiny():
    sizes = [4, 6, 3, 5, 6, 2, 5, 4]

    def data(seed):
        rs = np.random.default_rng(seed)
        ys = [rs.integers(0, 3, size=n) for n in sizes]
        xs = [rs.normal(size=(len(y), 5)).astype(np.float32) + y[:, None] for y in ys]
        return from_ragged(xs, ys)

    return data, make_model("mlp", (5,), 3, hidden=(6,))


def _states(module, config, datas, model, runtime, keys, pass_size=None):
    """Every seed's initial state; ``pass_size``: the runner's passes hold at most that many."""
    states = [module.init(k, api.FederatedData(agents=d, num_classes=3), model, config, runtime)
              for k, d in zip(keys, datas)]
    if pass_size is None:
        return states
    out = []
    for s in states:
        r = s.context.round_fn
        small = rounds.RoundRunner(r.chain, r.setup, r.agents, cohort=r.mode,
                                   pass_size=pass_size, diagnostics=config.diagnostics)
        out.append(dataclasses.replace(s, context=dataclasses.replace(s.context, round_fn=small)))
    return out


def _same_as_alone(module, config, datas, model, runtime, rounds=3, pass_size=None):
    keys = [jax.random.key(s) for s in range(len(datas))]
    states = _states(module, config, datas, model, runtime, keys, pass_size)
    batch = seeds.seed_batch(module, states)
    assert batch is not None
    alone = _states(module, config, datas, model, runtime, keys, pass_size)
    sizes = set()
    for t in range(rounds):
        step_keys = [api.step_key(k, t) for k in keys]
        states, metrics = batch(states, step_keys)
        for s in range(len(keys)):
            alone[s], want = module.step(alone[s], step_keys[s])
            assert metrics[s].keys() == want.keys()
            for k in want:
                np.testing.assert_allclose(metrics[s][k], want[k], rtol=1e-5, atol=1e-6)
            jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                         states[s].values, alone[s].values)
            assert states[s].step == alone[s].step == t + 1
            sizes.add(int(want["num_sampled"]))
    return states, alone, sizes


@pytest.mark.parametrize("shared", [True, False])
def test_multi_pass_cohorts_of_different_sizes(tiny, shared):
    """Cohorts larger than one pass (pass_size 2) with a different number of passes per seed:
    every agent counted, each seed's round its separate round (data shared or stacked)."""
    data, model = tiny
    cfg = dp_fedavg.Config(diagnostics=True, rounds=3, sampling_rate=0.5, local=LOCAL, clip_norm=0.5,
                           noise_multiplier=0.3)
    datas = [data(0)] * 3 if shared else [data(s) for s in range(3)]
    states, _, sizes = _same_as_alone(dp_fedavg, cfg, datas, model,
                                      api.Runtime(chunk_size=None), pass_size=2)
    assert states[0].context.round_fn.plan.pass_size == 2
    assert max(sizes) > 2 and len(sizes) > 1          # several passes, sizes differ


def test_masked_execution(tiny):
    data, model = tiny
    cfg = dp_fedavg.Config(diagnostics=True, rounds=2, sampling_rate=0.5, local=LOCAL,
                           denominator="sampled")
    datas = [data(s) for s in range(2)]
    states, _, _ = _same_as_alone(dp_fedavg, cfg, datas, model,
                                  api.Runtime(chunk_size=None, cohort="masked"), rounds=2)
    assert states[0].context.round_fn.mode == "masked"


def test_dp_fedsgd_participation_and_ledger(tiny):
    data, model = tiny
    cfg = dp_fedsgd.Config(diagnostics=True, rounds=3, sampling_rate=0.5, local=LOCAL, clip_norm=1.0,
                           noise_multiplier=1.0)
    datas = [data(s) for s in range(2)]
    states, alone, _ = _same_as_alone(dp_fedsgd, cfg, datas, model,
                                      api.Runtime(chunk_size=2), rounds=3)
    for got, want in zip(states, alone):
        np.testing.assert_array_equal(got.values["participation"], want.values["participation"])
        assert dp_fedsgd.ledger(cfg, got).to_json() == dp_fedsgd.ledger(cfg, want).to_json()
    assert not np.array_equal(states[0].values["participation"],
                              states[1].values["participation"])


def test_cannot_share_returns_none(tiny):
    data, model = tiny
    cfg = dp_fedavg.Config(diagnostics=True, rounds=2, sampling_rate=0.5, local=LOCAL)
    keys = [jax.random.key(0), jax.random.key(1)]
    rt = api.Runtime(chunk_size=None)
    # host-resident agents: their cohorts are gathered on the host
    assert seeds.seed_batch(dp_fedavg, _states(dp_fedavg, cfg, [data(0).on_host()] * 2, model,
                                               rt, keys)) is None
    # data shapes differ between the seeds (another n_max)
    other = from_ragged([np.ones((9, 5), np.float32)] * 8, [np.zeros(9, int)] * 8)
    assert seeds.seed_batch(dp_fedavg, _states(dp_fedavg, cfg, [data(0), other], model, rt,
                                               keys)) is None


def test_secure_aggregation_seeds_equal_separate_runs(tiny):
    """Secure aggregation inside the fused round: each seed's masks and dropouts are its own
    run's (the chunk size is the plan's, the same for every seed)."""
    data, model = tiny
    cfg = dp_fedavg.Config(diagnostics=True, rounds=2, sampling_rate=0.5, local=LOCAL, clip_norm=0.5,
                           noise_multiplier=0.3, aggregation="secagg")
    _same_as_alone(dp_fedavg, cfg, [data(0)] * 2, model, api.Runtime(chunk_size=None),
                   rounds=2)
