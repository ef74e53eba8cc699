"""The one-run audit (Steinke et al. 2023) inside a real DP-FedAvg run: the bound against its
closed form on perfectly separated scores, an honest run's bound below the ledger's epsilon, a
run whose noise was removed caught against the claim it kept, and the command line."""
import dataclasses
import json
import math

import jax
import numpy as np
import pytest
from scipy import special

from fedjax_dp.algorithms import api
from fedjax_dp.algorithms.averaging import dp_fedavg, run_audit
from fedjax_dp.audit import one_run
from fedjax_dp.core import from_ragged
from fedjax_dp.experiments import cli
from fedjax_dp.models import make_model
from fedjax_dp.train import LocalTrainConfig


@pytest.mark.parametrize("m", [100, 400])
def test_bound_on_perfect_separation_against_the_closed_form(m):
    """All m/2 included canaries score above all left-out ones. With delta -> 0, guessing the top
    k (all correct) rejects epsilon when q^k <= alpha, q = e^eps / (1 + e^eps) (Steinke et al.,
    Theorem 3.1), so eps_k = logit(alpha^(1/k)). The reported bound lies between the best eps_k
    at level alpha / m (any Bonferroni over at most m guess counts) and at level alpha."""
    alpha, half = 0.05, m // 2
    got = one_run.epsilon_lower_bound(np.arange(half) + 1e3, np.arange(half, dtype=float),
                                      significance=alpha, delta=1e-12)
    k = half                                       # the best single guess count: all in canaries
    upper = special.logit(alpha ** (1 / k))
    lower = special.logit((alpha / m) ** (1 / k))
    assert lower - 1e-6 <= got <= upper + 1e-6
    # no separation: no evidence
    assert one_run.epsilon_lower_bound(np.zeros(half), np.zeros(half), significance=alpha,
                                       delta=1e-5) == pytest.approx(0.0, abs=1e-9)


@pytest.fixture(scope="module")
def setup():
    r = np.random.default_rng(4)
    ys = [r.integers(0, 3, size=4) for _ in range(20)]
    xs = [r.normal(size=(4, 5)).astype(np.float32) + y[:, None] for y in ys]
    model = make_model("mlp", (5,), 3, hidden=(512,))     # d = 4,611: canaries nearly orthogonal
    return api.FederatedData(agents=from_ragged(xs, ys), num_classes=3), model


def _config(z):
    return dp_fedavg.Config(rounds=2, sampling_rate=1.0, clip_norm=1.0, noise_multiplier=z,
                            local=LocalTrainConfig(steps=1, batch_size=4, learning_rate=0.2))


def test_honest_run_below_claim_and_broken_run_caught(setup):
    fed, model = setup
    honest = one_run.report(run_audit.canary_run(jax.random.key(1), fed, model, _config(2.0),
                                                 canaries=400, delta=1e-5), significance=0.05)
    assert honest["consistent"] and 0 <= honest["epsilon_lower_bound"] < 1.0
    assert honest["claimed_epsilon"] == pytest.approx(
        dp_fedavg.ledger(_config(2.0)).epsilon("agent", 1e-5, "rdp"))
    assert 150 < honest["included"] < 250 and honest["canaries"] == 400
    # the noise nearly removed while the claim of z = 2 is kept: the audit refutes it
    broken = run_audit.canary_run(jax.random.key(1), fed, model, _config(0.05), canaries=400,
                                  delta=1e-5)
    lb = one_run.epsilon_lower_bound(broken.in_scores, broken.out_scores, significance=0.05,
                                     delta=1e-5)
    assert lb > honest["claimed_epsilon"] > 3.0
    assert np.mean(broken.in_scores) > np.mean(broken.out_scores) + 3 * np.std(broken.out_scores)


TINY = ["data.num_agents=10", "algorithm.rounds=1", "train.steps=1", "model.hidden=[8]"]


def test_audit_run_from_the_command_line(capsys):
    argv = ["audit", "run", "--config", "configs/dp_fedavg/mnist5k.toml", "--canaries", "40"]
    for s in TINY:
        argv += ["--set", s]
    assert cli.main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["algorithm"] == "dp_fedavg" and out["canaries"] == 40 and out["consistent"]
    assert out["claimed_epsilon"] > out["epsilon_lower_bound"] >= 0
    assert math.isclose(out["delta"], 1e-5)


@pytest.mark.parametrize("argv, match", [
    (["audit", "run"], "needs --config"),
    (["audit", "dp-fedavg-round", "--config", "x.toml"], "goes with the mechanism"),
    (["audit", "run", "--config", "configs/fedavg/mnist5k.toml"], "has no one-run audit"),
    (["audit", "run", "--config", "configs/dp_fedavg/mnist5k.toml", "--canaries", "1"],
     "--canaries"),
])
def test_audit_run_refusals(capsys, argv, match):
    assert cli.main(argv) != 0
    assert match in capsys.readouterr().err


def test_weakened_runs_are_planned_and_refused_before_any_work():
    """``plan_run``: halve-noise halves z, no-clip lifts the clip to 10 x scale x S keeping the
    noise std z S (canaries of 100 x S by default); what would change nothing is refused."""
    from fedjax_dp.audit.harness import ParameterError
    cfg = _config(2.0)
    assert run_audit.plan_run(cfg) == (cfg, 1.0)
    half, scale = run_audit.plan_run(cfg, weaken="halve-noise")
    assert (half.noise_multiplier, half.clip_norm, scale) == (1.0, 1.0, 1.0)
    wide, scale = run_audit.plan_run(cfg, weaken="no-clip")
    assert scale == 100 and wide.clip_norm == 1000.0
    assert wide.noise_multiplier * wide.clip_norm == pytest.approx(2.0)     # std z S kept
    assert run_audit.plan_run(cfg, canary_scale=0.5)[1] == 0.5               # below the clip
    refusals = [
        (dict(canary_scale=5.0), "canary_scale", "fixed clip"),   # clipped to S: the same run
        (dict(canary_scale=1.0, weaken="no-clip"), "canary_scale", "above 1"),
        (dict(weaken="nope"), "weaken", "must be one of"),
    ]
    for kwargs, param, match in refusals:
        with pytest.raises(ParameterError, match=match) as e:
            run_audit.plan_run(cfg, **kwargs)
        assert e.value.param == param
    with pytest.raises(ParameterError, match="noise_multiplier > 0"):
        run_audit.plan_run(_config(0.0), weaken="halve-noise")
    adaptive = dataclasses.replace(cfg, adaptive_clip=True)
    with pytest.raises(ParameterError, match="fixed clip"):
        run_audit.plan_run(adaptive, weaken="no-clip")
    assert run_audit.plan_run(adaptive, canary_scale=5.0)[1] == 5.0   # the clip moves: it matters


def test_fixed_size_cohorts_are_refused(setup):
    fed, model = setup
    cfg = dp_fedavg.Config(rounds=1, sampling="fixed", cohort_size=3, clip_norm=1.0,
                           local=LocalTrainConfig(steps=1, batch_size=4))
    with pytest.raises(ValueError, match="sampling"):
        run_audit.canary_run(jax.random.key(0), fed, model, cfg, canaries=10, delta=1e-5)
