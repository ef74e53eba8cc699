"""Empirical privacy audits (fedjax_dp.audit): bounds, every mechanism, weakened variants, CLI.

Compile-time budget: every mechanism runs ONE number of trials (TRIALS) with parameters whose
weakened variants share the real one's compiled function where the mechanism allows it
(noise scale and clip are array inputs), and the audits are cached per module.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math

import jax
import numpy as np
import pytest
from scipy import stats

from fedjax_dp.algorithms import averaging, fedkt, isrl, voting  # noqa: F401 (harnesses register)
from fedjax_dp.audit import audit, bounds, harness, statistics, world_keys
from fedjax_dp.privacy import accounting

TRIALS = 200_000
DELTA = 1e-5
SEED = 0

# Claimed epsilon ~2 at delta 1e-5 for every mechanism (noise multiplier 2, gamma 1, N = 1026
# binomial trials at K = 8): halving the noise more than doubles the true epsilon, which
# 200k trials per world resolve with a margin of several standard errors.
PARAMS = {
    "gaussian-vote": dict(sigma=2.0),
    "fedkt-laplace": dict(gamma=1.0, gap=2),
    "dp-sgd-step": dict(noise_multiplier=2.0),
    "dp-fedavg-round": dict(noise_multiplier=2.0),
    "isrl-upload": dict(noise_multiplier=2.0),
    "sdp-upload": dict(noise_trials=1026),
}
CASES = [(m, None) for m in PARAMS] + [(m, w) for m in PARAMS
                                        for w in harness.MECHANISMS[m].weakenings]


@functools.lru_cache(maxsize=None)
def _audit(mechanism: str, weaken: str | None, **extra):
    return audit(mechanism, trials=TRIALS, delta=DELTA, seed=SEED, weaken=weaken,
                 **{**PARAMS[mechanism], **extra})


# --------------------------------------------------------------------------- bounds

def test_clopper_pearson_matches_scipy_exact_interval():
    for k, n in [(0, 10), (3, 10), (10, 10), (17, 1000), (500, 1000)]:
        lo, hi = bounds.clopper_pearson(np.int64(k), np.int64(n), 0.9)
        ci = stats.binomtest(k, n).proportion_ci(0.9, method="exact")
        assert lo == pytest.approx(ci.low, abs=1e-12)
        assert hi == pytest.approx(ci.high, abs=1e-12)


def test_clopper_pearson_closed_forms_at_the_edges():
    # k = 0: P[Bin(n, p) = 0] = (1 - p)^n = alpha at the upper bound; k = n: p^n = alpha.
    n, alpha = 50, 0.05
    assert bounds.clopper_pearson_upper(np.int64(0), np.int64(n), alpha) == pytest.approx(
        1 - alpha ** (1 / n), rel=1e-10)
    assert bounds.clopper_pearson_lower(np.int64(n), np.int64(n), alpha) == pytest.approx(
        alpha ** (1 / n), rel=1e-10)
    assert bounds.clopper_pearson_upper(np.int64(n), np.int64(n), alpha) == 1.0
    assert bounds.clopper_pearson_lower(np.int64(0), np.int64(n), alpha) == 0.0
    # The upper bound of k successes: P[Bin(n, hi) <= k] = alpha.
    hi = float(bounds.clopper_pearson_upper(np.int64(7), np.int64(n), alpha))
    assert stats.binom.cdf(7, n, hi) == pytest.approx(alpha, rel=1e-8)


def test_clopper_pearson_rejects_bad_counts():
    with pytest.raises(ValueError, match="successes"):
        bounds.clopper_pearson_upper(np.int64(5), np.int64(3), 0.05)
    with pytest.raises(ValueError, match="alpha"):
        bounds.clopper_pearson_upper(np.int64(1), np.int64(3), 1.5)


def _gaussian_true_epsilon(mu: float) -> float:
    return accounting.epsilon(accounting.gaussian_event(1.0 / mu), DELTA, "pld")


def test_threshold_tests_of_exact_gaussian_rates_reach_the_gaussian_epsilon():
    # N(mu, 1) vs N(0, 1): the threshold tests' supporting lines ARE the trade-off curve, so the
    # best exact-rate bound equals eps(delta) of GaussianDpEvent(1 / mu) (up to the PLD grid).
    mu = 1.0 / 2.0
    tau = np.linspace(-2, 12, 200_001)
    fpr, fnr = stats.norm.sf(tau), stats.norm.cdf(tau - mu)
    best = float(np.max(bounds.epsilon_from_rates(fpr, fnr, DELTA)))
    true = _gaussian_true_epsilon(mu)
    assert best <= true + 1e-3
    assert best == pytest.approx(true, abs=5e-3)


def test_sampled_gaussian_lower_bound_stays_below_and_approaches_the_truth():
    mu = 1.0 / 2.0
    true = _gaussian_true_epsilon(mu)
    rng = np.random.default_rng(0)
    lbs = []
    for n in (20_000, 2_000_000):
        b = bounds.audit_threshold(rng.normal(mu, 1.0, n), rng.normal(0.0, 1.0, n), DELTA)
        assert 0 <= b.epsilon_lower_bound <= true
        lbs.append(b.epsilon_lower_bound)
    assert lbs[1] > lbs[0] + 0.3
    assert lbs[1] > 0.6 * true


def test_threshold_is_chosen_on_the_first_half_only():
    rng = np.random.default_rng(1)
    a, b = rng.normal(1.0, 1.0, 2000), rng.normal(0.0, 1.0, 2000)
    first = bounds.audit_threshold(a, b, DELTA)
    a2, b2 = a.copy(), b.copy()
    a2[1000:], b2[1000:] = rng.normal(1.0, 1.0, 1000), rng.normal(0.0, 1.0, 1000)
    second = bounds.audit_threshold(a2, b2, DELTA)
    assert first.threshold == second.threshold
    assert (first.fpr, first.fnr) != (second.fpr, second.fnr)


def test_identical_worlds_give_no_privacy_loss():
    rng = np.random.default_rng(2)
    b = bounds.audit_threshold(rng.normal(size=50_000), rng.normal(size=50_000), DELTA)
    assert b.epsilon_lower_bound < 0.2


# --------------------------------------------------------------------------- every mechanism

@pytest.mark.parametrize("mechanism", list(PARAMS))
def test_real_mechanism_lower_bound_below_claim(mechanism):
    assert harness.MECHANISMS[mechanism].weakenings           # every entry has a broken twin
    r = _audit(mechanism, None)
    assert r.consistent
    assert 0.0 <= r.epsilon_lower_bound <= r.claimed_epsilon
    assert 1.5 < r.claimed_epsilon < 2.5          # the parameters claim ~2 (see PARAMS)
    assert r.trials == TRIALS and r.weaken is None


@pytest.mark.parametrize("mechanism,weaken", [c for c in CASES if c[1] is not None])
def test_weakened_mechanism_is_detected(mechanism, weaken):
    real, broken = _audit(mechanism, None), _audit(mechanism, weaken)
    assert broken.claimed_epsilon == real.claimed_epsilon       # the original claim
    assert broken.epsilon_lower_bound > broken.claimed_epsilon
    assert not broken.consistent


def test_knn_instance_vote_sensitivity_sqrt2_over_k():
    # kNN ballots (label counts / k): one record moves 1/k between two classes, Delta sqrt(2)/k.
    k = 4
    sigma = 2.0 * math.sqrt(2.0) / k
    real = _audit("gaussian-vote", None, unit="instance", ballot="neighbour_counts", k=k)
    assert real.params["sensitivity"] == pytest.approx(math.sqrt(2) / k)
    # sigma = 2 (noise multiplier sigma / Delta = 2 sqrt(2) k / 2): far below the claim...
    assert real.epsilon_lower_bound <= real.claimed_epsilon
    tight = audit("gaussian-vote", trials=TRIALS, delta=DELTA, seed=SEED, sigma=sigma,
                  unit="instance", ballot="neighbour_counts", k=k)
    weak = audit("gaussian-vote", trials=TRIALS, delta=DELTA, seed=SEED, sigma=sigma,
                 unit="instance", ballot="neighbour_counts", k=k, weaken="halve-noise")
    # ... and at noise multiplier 2 the claim holds and its halving is caught.
    assert tight.epsilon_lower_bound <= tight.claimed_epsilon < weak.epsilon_lower_bound


# --------------------------------------------------------------------------- vectorisation, keys

@pytest.mark.parametrize("mechanism", ["fedkt-laplace", "isrl-upload"])
def test_vmapped_trials_equal_a_loop_over_the_same_keys(mechanism):
    a = harness.build(mechanism, None, **PARAMS[mechanism])
    k_d, k_dp = world_keys(SEED)
    for key, nb in ((k_d, False), (k_dp, True)):
        batched = np.asarray(a.trials(key, TRIALS, nb))[:4]
        keys = jax.random.split(key, TRIALS)[:4]
        looped = np.asarray([a.jitted_one_trial(k, nb) for k in keys])
        np.testing.assert_allclose(batched, looped, rtol=1e-5, atol=1e-5)


def test_chunked_trials_equal_the_plain_ones():
    a = harness.build("fedkt-laplace", None, **PARAMS["fedkt-laplace"])
    key = world_keys(SEED)[0]
    plain = np.asarray(a.trials(key, TRIALS, False))
    chunked = np.asarray(dataclasses.replace(a, chunk=70_000).trials(key, TRIALS, False))
    np.testing.assert_allclose(chunked, plain, rtol=1e-6, atol=1e-6)


def test_worlds_use_independent_keys_and_noise():
    k_d, k_dp = world_keys(SEED)
    kd = np.asarray(jax.random.key_data(jax.random.split(k_d, 1000)))
    kdp = np.asarray(jax.random.key_data(jax.random.split(k_dp, 1000)))
    rows = {tuple(r) for r in kd}
    assert len(rows) == 1000 and not rows & {tuple(r) for r in kdp}
    s_d, s_dp = statistics("gaussian-vote", trials=TRIALS, seed=SEED, **PARAMS["gaussian-vote"])
    # Same noise in both worlds would make the two statistics perfectly correlated.
    assert abs(np.corrcoef(s_d, s_dp)[0, 1]) < 5 / math.sqrt(TRIALS)
    assert abs(np.corrcoef(s_d[:-1], s_d[1:])[0, 1]) < 5 / math.sqrt(TRIALS)
    # The means differ by the sensitivity (1 at agent level) and the spread is sigma.
    assert np.mean(s_d) - np.mean(s_dp) == pytest.approx(1.0, abs=0.05)
    assert np.std(s_d) == pytest.approx(2.0, rel=0.02)


# --------------------------------------------------------------------------- validation, CLI

@pytest.mark.parametrize("kwargs,match", [
    (dict(mechanism="nope"), "mechanism"),
    (dict(trials=1), "trials"),
    (dict(delta=0.0), "delta"),
    (dict(confidence=1.0), "confidence"),
    (dict(weaken="no-clip"), "weaken"),
    (dict(sigma=-1.0), "sigma"),
    (dict(clip_norm=1.0), "clip_norm"),
    (dict(gap=3), "gap"),
    (dict(gamma=1e300), r"gamma must be in \(0, 1e\+12\]"),      # float32 overflowed
    (dict(sigma=2.0, k=-3), "k applies to ballot='neighbour_counts' only"),   # was ignored
])
def test_bad_arguments_raise_before_work(kwargs, match):
    args = dict(mechanism="fedkt-laplace", trials=1000)
    args.update(kwargs)
    if "sigma" in kwargs:
        args["mechanism"] = "gaussian-vote"
    with pytest.raises(ValueError, match=match):
        audit(args.pop("mechanism"), **args)


def test_cli_audit_prints_json_and_exits_2_on_bad_arguments(capsys):
    from fedjax_dp.experiments import cli
    rc = cli.main(["audit", "fedkt-laplace", "--trials", str(TRIALS), "--gamma", "1.0",
                   "--gap", "2", "--seed", str(SEED)])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    ref = _audit("fedkt-laplace", None)
    assert out["epsilon_lower_bound"] == pytest.approx(ref.epsilon_lower_bound)
    assert out["claimed_epsilon"] == pytest.approx(ref.claimed_epsilon)
    assert out["consistent"] is True and out["mechanism"] == "fedkt-laplace"
    assert cli.main(["audit", "fedkt-laplace", "--trials", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "trials" in err
    assert cli.main(["audit", "fedkt-laplace", "--clip", "1.0"]) == 2
    assert "clip_norm" in capsys.readouterr().err
    assert cli.main(["audit", "no-such-mechanism"]) == 2
    assert "mechanism must be one of" in capsys.readouterr().err


def test_cli_reaches_every_mechanism_parameter():
    from fedjax_dp.experiments import cli
    flags = {("clip_norm" if n == "clip" else n) for n in cli.AUDIT_PARAMS}
    for name, spec in harness.MECHANISMS.items():
        assert set(spec.defaults) <= flags, name
        assert name in cli.build_parser().parse_args(["audit", name]).mechanism


# --------------------------------------------------------------------------- layout

#: mechanism -> the family package whose audit.py holds its harness.
FAMILY = {"gaussian-vote": "voting", "fedkt-laplace": "fedkt", "dp-sgd-step": "averaging",
          "dp-fedavg-round": "averaging", "isrl-upload": "isrl", "sdp-upload": "isrl"}


def _imports(path):
    """``(module-level imported module names, imports inside functions, imported names)``."""
    import ast
    tree = ast.parse(path.read_text())
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    nested = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
              and n not in top]
    modules = {a.name for n in top if isinstance(n, ast.Import) for a in n.names}
    modules |= {n.module for n in top if isinstance(n, ast.ImportFrom)}
    names = {a.name for n in top for a in n.names}
    return modules, nested, names


def test_each_family_registers_its_harness_and_imports_point_down():
    from pathlib import Path
    import fedjax_dp
    assert sorted(harness.MECHANISMS) == sorted(FAMILY)        # names unchanged
    for name, spec in harness.MECHANISMS.items():
        assert spec.builder.__module__ == f"fedjax_dp.algorithms.{FAMILY[name]}.audit", name
        assert not spec.builder.__name__.startswith("_")
    root = Path(fedjax_dp.__file__).parent
    # audit/ knows no algorithm, model or trainer (test_family_imports walks every import).
    modules, nested, _ = _imports(root / "audit" / "harness.py")
    assert not nested and not any(m.startswith(("fedjax_dp.algorithms", "fedjax_dp.models",
                                                "fedjax_dp.train")) for m in modules)
    # A family's harness imports its own family, the harness machinery and the layers below
    # (the shared round engine of algorithms/, stages/, privacy/, core/, ...), never another
    # family nor experiments/; no import hides in a function; no private name crosses a module.
    families = {p.name for p in (root / "algorithms").iterdir()
                if p.is_dir() and (p / "__init__.py").exists()}
    assert set(FAMILY.values()) <= families
    for family in sorted(set(FAMILY.values())):
        modules, nested, names = _imports(root / "algorithms" / family / "audit.py")
        assert not nested, family
        assert not any(n.startswith("_") for n in names if n != "annotations"), family
        for m in modules:
            assert not m.startswith("fedjax_dp.audit") or m == "fedjax_dp.audit.harness", m
            assert not m.startswith("fedjax_dp.experiments"), (family, m)
            if m.startswith("fedjax_dp.algorithms.") and m.split(".")[2] in families:
                assert m.split(".")[2] == family, (family, m)
            if m == "fedjax_dp.algorithms":       # from fedjax_dp.algorithms import <module>
                crossing = {n for n in names if n in families and n != family}
                assert not crossing, (family, crossing)


def test_unknown_mechanism_lists_the_registered_ones():
    with pytest.raises(ValueError, match="mechanism must be one of .*gaussian-vote"):
        harness.build("no-such-mechanism")
