"""Shuffle-DP vector summation: the simulated mechanism and its exact PLD accounting."""
import functools
import itertools
import math

import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from fedjax_dp.privacy import shuffle as S, shuffle_accounting as SA

CFG = S.ShuffleConfig(clip_norm=1.0, granularity=2, noise_trials=8)
NUM_KEYS = 4000


@functools.lru_cache(maxsize=None)
def _many(config):
    """est, sums of NUM_KEYS (key, reports, weights) at once: silos / repetitions as a vmapped
    axis (one compiled function per config, shared by the tests: one batch shape)."""
    return jax.jit(jax.vmap(lambda k, x, w: S._vector_sum(k, x, w, config)))


def _tile(a):
    return jnp.broadcast_to(a, (NUM_KEYS,) + a.shape)


def _reports():
    x = jnp.array([[0.30, -0.45, 0.10, 0.0],
                   [0.90, 0.80, -0.20, 0.05],       # norm > 1: clipped
                   [-0.25, 0.60, 0.70, -0.33]], jnp.float32)
    return x, jnp.array([1, 1, 0], jnp.int32)


# ----------------------------------------------------------------------------- the mechanism

@pytest.mark.parametrize("kwargs, name", [
    (dict(clip_norm=0.0, granularity=2, noise_trials=8), "clip_norm"),
    (dict(clip_norm=float("inf"), granularity=2, noise_trials=8), "clip_norm"),
    (dict(clip_norm=1.0, granularity=0, noise_trials=8), "granularity"),
    (dict(clip_norm=1.0, granularity=1.5, noise_trials=8), "granularity"),
    (dict(clip_norm=1.0, granularity=2, noise_trials=0), "noise_trials"),
    (dict(clip_norm=1.0, granularity=2, noise_trials=2 ** 41), "noise_trials"),
    (dict(clip_norm=1.0, granularity=2, noise_trials=8, norm="l1"), "norm"),
])
def test_config_validation(kwargs, name):
    with pytest.raises(ValueError, match=name):
        S.ShuffleConfig(**kwargs)


def test_bad_inputs():
    x, w = _reports()
    key = jax.random.key(0)
    with pytest.raises(ValueError, match="weights"):
        S.shuffle_vector_sum(key, x, jnp.array([1, 0.5, 0]), CFG)
    with pytest.raises(ValueError, match="weights"):
        S.shuffle_vector_sum(key, x, jnp.ones(2), CFG)
    with pytest.raises(ValueError, match="vectors"):
        S.shuffle_vector_sum(key, x[0], w, CFG)
    with pytest.raises(ValueError, match="config"):
        S.shuffle_vector_sum(key, x, w, {"clip_norm": 1.0})
    with pytest.raises(ValueError, match="relation"):
        SA.per_coordinate_sensitivity(CFG, "swap")
    with pytest.raises(ValueError, match="delta"):
        SA.epsilon(CFG, 2, 1, 0.0)
    with pytest.raises(ValueError, match="dimension"):
        SA.make_event(CFG, 0)


def test_clip_norms():
    x = jnp.array([[3.0, 4.0], [0.3, -0.4], [2.0, -0.5]])
    l2 = S.clip(x, CFG)
    np.testing.assert_allclose(np.linalg.norm(l2, axis=1), [1.0, 0.5, 1.0], rtol=1e-6)
    np.testing.assert_allclose(l2[1], x[1])
    linf = S.clip(x, CFG.replace(norm="linf"))
    np.testing.assert_allclose(linf, [[1.0, 1.0], [0.3, -0.4], [1.0, -0.5]])


@pytest.fixture(scope="module")
def samples():
    x, w = _reports()
    return _many(CFG)(jax.random.split(jax.random.key(1), NUM_KEYS), _tile(x), _tile(w))


def test_unbiased_and_variance_formula(samples):
    x, w = _reports()
    est, sums = samples
    want = np.asarray((S.clip(x, CFG) * w[:, None]).sum(0))
    var = np.asarray(S.estimate_variance(x, w, CFG))
    # Closed form by hand for coordinate 0: y = K x~ / C for the two real reports.
    y = np.asarray(S.clip(x, CFG))[:2, 0] * 2
    f = y - np.floor(y)
    assert var[0] == pytest.approx(0.25 * (np.sum(f * (1 - f)) + 8 / 4), rel=1e-6)
    mean, sample_var = np.asarray(est).mean(0), np.asarray(est).var(0, ddof=1)
    assert np.all(np.abs(mean - want) < 4.5 * np.sqrt(var / NUM_KEYS))
    # Sample variance: relative SE ~ sqrt(2 / n) (kurtosis near Gaussian's) -> 4.5 SE ~ 10%.
    np.testing.assert_allclose(sample_var, var, rtol=0.1)
    assert sums.dtype == jnp.int32


def test_release_is_a_function_of_the_sums_only():
    # Two different report sets on the integer grid (rounding is then deterministic) with the
    # same per-coordinate sums give identical releases under one key; and est = decode(sums).
    step = CFG.step
    a = jnp.array([[2, 0, 0, 0], [0, 1, 1, 0], [0, -1, 0, 1]], jnp.float32) * step  # <= C
    b = jnp.array([[1, 1, 0, 0], [1, 0, 1, 1], [0, -1, 0, 0]], jnp.float32) * step
    w = jnp.ones(3, jnp.int32)
    assert np.array_equal(a.sum(0), b.sum(0))
    key = jax.random.key(7)
    est_a, sums_a = S.shuffle_vector_sum(key, a, w, CFG, return_sums=True)
    est_b, sums_b = S.shuffle_vector_sum(key, b, w, CFG, return_sums=True)
    np.testing.assert_array_equal(sums_a, sums_b)
    np.testing.assert_array_equal(est_a, est_b)
    np.testing.assert_array_equal(est_a, S.decode(sums_a, CFG))
    # A zero-weight report contributes nothing, whatever it holds.
    c = a.at[2].set(jnp.array([0.9, -0.9, 0.1, 0.0]))
    _, sums_c = S.shuffle_vector_sum(key, c, jnp.array([1, 1, 0]), CFG, return_sums=True)
    _, sums_a2 = S.shuffle_vector_sum(key, a, jnp.array([1, 1, 0]), CFG, return_sums=True)
    np.testing.assert_array_equal(sums_c, sums_a2)


def test_keys_independent_and_reproducible(samples):
    x, w = _reports()
    est, _ = samples
    again, _ = _many(CFG)(jax.random.split(jax.random.key(1), NUM_KEYS), _tile(x), _tile(w))
    np.testing.assert_array_equal(est, again)
    e = np.asarray(est)
    # Consecutive keys, and coordinates within one release: uncorrelated (|r| < 4.5 / sqrt(n)).
    bound = 4.5 / math.sqrt(NUM_KEYS // 2)
    assert abs(np.corrcoef(e[0::2, 0], e[1::2, 0])[0, 1]) < bound
    assert abs(np.corrcoef(e[:, 0], e[:, 1])[0, 1]) < bound
    assert len(np.unique(e[:, 2])) > 5


def test_vectorised_matches_loop_and_vmap_over_silos():
    x, w = _reports()
    key = jax.random.key(3)
    est, sums = S.shuffle_vector_sum(key, x, w, CFG, return_sums=True)
    # A plain loop over reports and coordinates with the same rounding draws; the noise is the
    # release of all-zero weights under the same key (the noise key does not see the data).
    k_round, _ = jax.random.split(key)
    u = np.asarray(jax.random.uniform(k_round, x.shape))
    _, noise = S.shuffle_vector_sum(key, x, jnp.zeros(3, jnp.int32), CFG, return_sums=True)
    xc = np.asarray(S.clip(x, CFG))
    want = []
    for j in range(x.shape[1]):
        total = int(noise[j])
        for i in range(x.shape[0]):
            y = float(xc[i, j]) * CFG.granularity / CFG.clip_norm
            if w[i]:
                total += math.floor(y) + int(u[i, j] < y - math.floor(y))
        want.append(total)
    np.testing.assert_array_equal(sums, want)
    # vmap over silos (one key, reports and weights each) equals a loop over silos.
    factors = jnp.linspace(-1.5, 1.5, NUM_KEYS)[:, None, None]
    silo_x, silo_w = factors * _tile(x), _tile(w).at[1].set(jnp.array([0, 1, 1]))
    silo_keys = jax.random.split(key, NUM_KEYS)
    out, _ = _many(CFG)(silo_keys, silo_x, silo_w)
    for s in (0, 1, NUM_KEYS - 1):
        np.testing.assert_array_equal(out[s], S.shuffle_vector_sum(silo_keys[s], silo_x[s],
                                                                   silo_w[s], CFG))


def test_tree_sum_is_the_vector_sum_of_raveled_records():
    x, w = _reports()                                        # [3, 4]: leaves of 1 + 3 entries
    tree = {"b": x[:, :1].reshape(3), "w": x[:, 1:].reshape(3, 1, 3)}
    key = jax.random.key(5)
    out, sums = S.shuffle_tree_sum(key, tree, w, CFG, return_sums=True)
    est, want_sums = S.shuffle_vector_sum(key, x, w, CFG, return_sums=True)
    np.testing.assert_array_equal(sums, want_sums)
    assert out["b"].shape == () and out["w"].shape == (1, 3)
    np.testing.assert_array_equal(jnp.concatenate([out["b"][None], out["w"].reshape(-1)]), est)
    assert S.tree_dimension(tree) == 4
    with pytest.raises(ValueError, match="leading record axis"):
        S.shuffle_tree_sum(key, {"a": x, "b": x[:2]}, w, CFG)


def _numpy_table_draw(key, n, dim):
    """Reference for the table path: numpy's sorted search on the same 64-bit uniforms."""
    lo, f_hi, f_lo = S._cdf_table(n)
    table = (f_hi.astype(np.uint64) << np.uint64(32)) | f_lo.astype(np.uint64)
    u = np.asarray(jax.random.bits(key, (2, dim), jnp.uint32)).astype(np.uint64)
    return np.searchsorted(table, (u[0] << np.uint64(32)) | u[1], side="right") + lo - n // 2


@pytest.mark.parametrize("n, path", [(37, "bits"), (3 * 2 ** 13 + 4097, "table")])
def test_binomial_noise(n, path, monkeypatch):
    if path == "table":                # 3 chunks of 2^13 trials (one table) + one of 4097
        monkeypatch.setattr(S, "_MAX_TABLE_TRIALS", 2 ** 13)
    # Two keys, vmapped and jitted (one compile): 2 x 1000 draws.
    keys = jax.random.split(jax.random.key(4), 2)
    draws = np.asarray(jax.jit(jax.vmap(lambda k: S.binomial_noise(k, n, 1000)))(keys))
    # Centred Bin(n, 1/2) - floor(n / 2): mean (n mod 2) / 2, std sqrt(n) / 2.
    sd = math.sqrt(n) / 2
    assert abs(draws.mean() - (n % 2) / 2) < 4.5 * sd / math.sqrt(2000)
    assert draws.std() == pytest.approx(sd, rel=0.1)
    if n < 100:
        assert draws.min() >= -(n // 2) and draws.max() <= n - n // 2
    if path == "table":                # the vmapped binary searches = numpy's search, per key
        for i in range(2):
            k_full, k_rest = jax.random.split(keys[i])
            want = (_numpy_table_draw(k_full, 2 ** 13, 3 * 1000).reshape(3, 1000).sum(0)
                    + _numpy_table_draw(k_rest, 4097, 1000))
            np.testing.assert_array_equal(draws[i], want)


def test_cdf_table_is_the_binomial_pmf():
    from scipy import stats
    n = 5001
    lo, f_hi, f_lo = S._cdf_table(n)
    fixed = [int(h) * 2 ** 32 + int(l) for h, l in zip(f_hi, f_lo)]     # exact integers
    probs = np.diff([0] + fixed) / 2.0 ** 64
    want = stats.binom.pmf(np.arange(lo, lo + len(fixed)), n, 0.5)
    np.testing.assert_allclose(probs, want, atol=1e-14)
    assert fixed[-1] == 2 ** 64 - 1 and all(np.diff(fixed) >= 0)
    # The window holds all but a negligible mass.
    assert stats.binom.cdf(lo - 1, n, 0.5) < 1e-30


# ----------------------------------------------------------------------------- brute force

def _binom_pmf(n):
    return {b: math.comb(n, b) / 2 ** n for b in range(n + 1)}


def _exact_output(y, noise_trials):
    """Exact distribution of the server's view S (a tuple per outcome) for grid values y [n, d].

    Enumerates every report's rounding and every noise value per coordinate (coordinates are
    independent), then takes the product over coordinates.
    """
    noise = _binom_pmf(noise_trials)
    per_coord = []
    for j in range(len(y[0])):
        dist = {}
        choices = [[(math.floor(v[j]), 1 - (v[j] - math.floor(v[j]))),
                    (math.floor(v[j]) + 1, v[j] - math.floor(v[j]))] for v in y]
        for combo in itertools.product(*choices):
            p_round = math.prod(p for _, p in combo)
            total = sum(v for v, _ in combo)
            for b, pb in noise.items():
                o = total + b - noise_trials // 2
                dist[o] = dist.get(o, 0.0) + p_round * pb
        per_coord.append(dist)
    out = {}
    for combo in itertools.product(*[list(d.items()) for d in per_coord]):
        key = tuple(o for o, _ in combo)
        out[key] = out.get(key, 0.0) + math.prod(p for _, p in combo)
    return out


def _hockey(p, q, eps):
    return sum(max(0.0, pm - math.exp(eps) * q.get(o, 0.0)) for o, pm in p.items())


def _grid(vectors, config):
    return (np.asarray(S.clip(jnp.asarray(vectors, jnp.float32), config), np.float64)
            * config.granularity / config.clip_norm).tolist()


EPS_GRID = [0.0, 0.5, 1.0, 2.0, 3.0]


@pytest.mark.parametrize("norm, relation, base, other, close", [
    # L-inf clipping, reports on the grid (deterministic rounding), the new report at a corner:
    # every coordinate shifts by exactly K (2K for replace): the dominating pair itself (tight).
    ("linf", "add_remove", [[0.5, -0.5], [-1.0, 0.0]], [1.0, -1.0], True),
    ("linf", "replace", [[0.5, -0.5], [-1.0, 0.0]], [1.0, -1.0], True),
    # L2 clipping and random-ish values: only an upper bound.
    ("l2", "add_remove", [[0.3, -0.6], [-0.8, 0.1], [0.2, 0.2]], [0.6, 0.7], False),
    ("l2", "replace", [[0.3, -0.6], [-0.8, 0.1]], [0.45, -0.35], False),
])
def test_pld_is_pessimistic_and_tight_against_brute_force(norm, relation, base, other, close):
    cfg = S.ShuffleConfig(clip_norm=1.0, granularity=2, noise_trials=6, norm=norm)
    if relation == "add_remove":       # D' = D + one report
        d_in, d_out = base, base + [other]
    else:                              # replace the first report by `other` ...
        d_in = base
        d_out = [other] + base[1:]
        if close:                      # ... or, for the tight case, a corner by the other one
            d_in = [[-1.0, 1.0]] + base[1:]
    p = _exact_output(_grid(d_out, cfg), cfg.noise_trials)
    q = _exact_output(_grid(d_in, cfg), cfg.noise_trials)
    assert sum(p.values()) == pytest.approx(1.0) and sum(q.values()) == pytest.approx(1.0)
    for method in SA.METHODS:
        for eps in EPS_GRID:
            brute = max(_hockey(p, q, eps), _hockey(q, p, eps))
            got = SA.delta_for_epsilon(cfg, 2, 1, eps, relation=relation, method=method)
            assert got >= brute - 1e-12, (method, eps)
            if close:
                assert got <= brute + 2e-3, (method, eps, got, brute)


def test_buckets_match_a_direct_two_pmf_pld_on_the_full_support():
    # Small N: the window covers the whole support, so the PLD equals dp_accounting's own
    # construction from the two complete binomial pmfs.
    n, s = 10, 3
    upper = {o: math.log(math.comb(n, o - s) / 2 ** n) for o in range(s, n + s + 1)}
    lower = {o: math.log(math.comb(n, o) / 2 ** n) for o in range(n + 1)}
    direct = pld_lib.from_two_probability_mass_functions(lower, upper, symmetric=False)
    ours = SA.coordinate_pld(n, s, method="buckets")
    for eps in [0.0, 0.3, 1.0, 2.5]:
        assert ours.get_delta_for_epsilon(eps) == pytest.approx(
            direct.get_delta_for_epsilon(eps), abs=1e-12)
    cd = SA.coordinate_pld(n, s)
    for eps in [0.0, 0.3, 1.0, 2.5]:   # connect-the-dots: tighter, still >= the exact value
        exact = sum(max(0.0, math.exp(upper[o]) - math.exp(eps) * math.exp(lower.get(o, -1e9)))
                    for o in upper)
        assert exact - 1e-12 <= cd.get_delta_for_epsilon(eps) <= ours.get_delta_for_epsilon(
            eps) + 1e-12


def test_gaussian_limit_and_composition():
    # Many noise bits: Bin(N, 1/2) ~ N(N/2, N/4); d*T compositions of shift K are one Gaussian
    # mechanism with sensitivity K sqrt(dT) and std sqrt(N)/2.
    cfg = S.ShuffleConfig(clip_norm=1.0, granularity=2, noise_trials=40_000)
    d, t, delta = 20, 10, 1e-5
    sigma = math.sqrt(cfg.noise_trials) / 2 / (cfg.granularity * math.sqrt(d * t))
    gauss = dp_accounting.get_epsilon_gaussian(sigma, delta)
    assert SA.epsilon(cfg, d, t, delta) == pytest.approx(gauss, rel=0.03)
    # d coordinates x T releases compose like d*T coordinates of one release; the PLD equals
    # dp_accounting's composition of the per-coordinate PLD.
    assert SA.epsilon(cfg, d, t, delta) == pytest.approx(SA.epsilon(cfg, d * t, 1, delta), rel=1e-9)
    one = SA.coordinate_pld(cfg.noise_trials, cfg.granularity)
    assert SA.epsilon(cfg, d, t, delta) == pytest.approx(
        one.self_compose(d * t).get_epsilon_for_delta(delta), rel=1e-12)
    # Replace doubles the sensitivity: more epsilon.
    assert SA.epsilon(cfg, d, t, delta, relation="replace") > SA.epsilon(cfg, d, t, delta)


def test_epsilon_monotone_and_calibration():
    delta, h = 1e-5, 1e-3           # a coarser PLD grid keeps the search quick (still pessimistic)
    eps_at = lambda n: SA.epsilon(CFG.replace(noise_trials=n), 3, 2, delta,
                                  value_discretization_interval=h)
    eps = [eps_at(n) for n in (50, 100, 200)]
    assert all(a > b for a, b in zip(eps, eps[1:]))
    n = SA.calibrate_noise_trials(4.0, delta, granularity=2, dimension=3, releases=2,
                                  value_discretization_interval=h)
    assert eps_at(n) <= 4.0 < eps_at(n - 1)
    approx = SA.calibrate_noise_trials(4.0, delta, granularity=2, dimension=3, releases=2,
                                       rtol=0.05, value_discretization_interval=h)
    assert n <= approx <= 1.05 * n + 1 and eps_at(approx) <= 4.0
    with pytest.raises(ValueError, match="max_trials"):
        SA.calibrate_noise_trials(0.1, delta, granularity=2, dimension=3, releases=2,
                                  max_trials=100, value_discretization_interval=h)


def test_no_privacy_when_noise_is_smaller_than_the_shift():
    cfg = S.ShuffleConfig(clip_norm=1.0, granularity=4, noise_trials=3)
    assert SA.epsilon(cfg, 1, 1, 1e-5) == math.inf
    assert SA.epsilon(cfg, 50, 20, 1e-5) == math.inf
    # Poisson sampled (SDP MB-SGD with noise_trials = 1): dp_accounting's subsampling of a PLD
    # with no finite loss raised IndexError after training; epsilon is inf for every delta < q
    for d, count in ((1, 1), (31, 2)):
        event = SA.BinomialSumEvent(1, 2, d, count, 0.1)
        assert SA.pld(event).get_epsilon_for_delta(1e-5) == math.inf


def test_event_json_round_trip():
    e = SA.make_event(CFG, 7, 3, "replace")
    assert (e.sensitivity, e.dimension, e.count, e.noise_trials) == (4, 7, 3, 8)
    assert SA.BinomialSumEvent.from_json(e.to_json()) == e
    with pytest.raises(ValueError, match="BinomialSumEvent"):
        SA.BinomialSumEvent.from_json({"class_name": "GaussianDpEvent"})
    with pytest.raises(ValueError, match="noise_probability"):
        SA.BinomialSumEvent.from_json({**e.to_json(), "noise_probability": 0.3})


def test_simulated_sums_follow_the_enumerated_distribution(samples):
    # The mechanism that is simulated is the one that is analysed: each coordinate's sums over
    # NUM_KEYS keys match the exactly enumerated distribution (rounding x noise).
    x, w = _reports()
    _, sums = samples
    y = _grid(np.asarray(x)[np.asarray(w) > 0], CFG)
    for j in range(x.shape[1]):
        exact = _exact_output([[row[j]] for row in y], CFG.noise_trials)
        values, counts = np.unique(np.asarray(sums)[:, j], return_counts=True)
        assert set(values.tolist()) <= {o[0] for o in exact}
        for (o,), p in exact.items():
            freq = counts[values == o].sum() / NUM_KEYS
            assert abs(freq - p) < 4.5 * math.sqrt(p * (1 - p) / NUM_KEYS) + 1e-3, (j, o)


# ----------------------------------------------------------------------------- ledger

REL = SA.RELATIONS["add_remove"]


def test_ledger_shuffle_entry_and_composition():
    from fedjax_dp.privacy import PrivacyLedger
    from fedjax_dp.privacy import accounting as A
    delta = 1e-5
    ev = SA.make_event(CFG.replace(noise_trials=400), dimension=2, releases=2)
    ledger = PrivacyLedger().add_shuffle("silo_record", ev, relation=REL, note="SDP MB-SGD")
    alone = SA.pld(ev).get_epsilon_for_delta(delta)
    assert ledger.epsilon("silo_record", delta, "pld") == pytest.approx(alone, rel=1e-12)
    with pytest.raises(ValueError, match="accountant"):
        ledger.epsilon("silo_record", delta, "rdp")
    with pytest.raises(ValueError, match="DpEvent"):
        ledger.event("silo_record")
    # Composed with a Gaussian event of the same unit: the PLDs compose.
    ledger.add_event("silo_record", A.gaussian_event(3.0, 5), relation=REL)
    direct = pld_lib.from_gaussian_mechanism(3.0 / math.sqrt(5),
                                             value_discretization_interval=1e-4)
    want = direct.compose(SA.pld(ev)).get_epsilon_for_delta(delta)
    got = ledger.epsilon("silo_record", delta, "pld")
    assert got == pytest.approx(want, rel=1e-6)
    assert got > max(alone, A.epsilon(A.gaussian_event(3.0, 5), delta, "pld"))
    # A small noise coarsens the Gaussians' PLD grid (accounting.pld_interval): the shuffle PLD
    # is built on the same grid, so the two still compose.
    small = PrivacyLedger().add_shuffle("r", ev, relation=REL)
    small.add_event("r", A.gaussian_event(0.1), relation=REL)
    h = A.pld_interval(A.gaussian_event(0.1))
    assert h == pytest.approx(1e-3)
    want = pld_lib.from_gaussian_mechanism(0.1, value_discretization_interval=h).compose(
        SA.pld(ev, value_discretization_interval=h)).get_epsilon_for_delta(delta)
    assert small.epsilon("r", delta, "pld") == pytest.approx(want, rel=1e-9)
    # A noiseless event makes the unit non-private.
    worse = PrivacyLedger().add_shuffle("r", ev, relation=REL)
    worse.add_event("r", A.gaussian_event(0.0), relation=REL)
    assert worse.epsilon("r", delta, "pld") == math.inf


def test_ledger_shuffle_report_parallel_and_json():
    import json
    from fedjax_dp.privacy import PrivacyLedger
    from fedjax_dp.privacy import accounting as A
    delta = 1e-5
    members = [SA.make_event(CFG.replace(noise_trials=n), 2, 2) for n in (800, 200, 800)]
    ledger = PrivacyLedger().add_parallel("silo_record", members, relation=REL)
    ledger.add_event("agent", A.gaussian_event(2.0), relation="add/remove one agent")
    assert ledger.epsilon("silo_record", delta, "pld") == pytest.approx(
        SA.pld(members[1]).get_epsilon_for_delta(delta), rel=1e-12)
    rows = ledger.report(delta)            # default ("rdp", "pld"): RDP skipped for shuffle
    assert [(r["unit"], r["accountant"]) for r in rows] == [
        ("silo_record", "pld"), ("agent", "rdp"), ("agent", "pld")]
    row = rows[0]
    assert row["parallel"][0]["worst_member"] == 1
    assert row["parallel"][0]["distinct_members"][0]["members"] == [0, 2]
    assert row["events"] == [members[1].to_json()]
    assert SA.BinomialSumEvent.from_json(row["events"][0]) == members[1]
    text = json.dumps(ledger.to_json(), allow_nan=False)
    again = PrivacyLedger.from_json(text)
    assert again.entries == ledger.entries and again.report(delta) == rows
    with pytest.raises(ValueError, match="pld"):
        ledger.report(delta, accountants=("rdp",))
    # A sequential shuffle entry composes with the parallel one and survives JSON too.
    both = ledger.merged(PrivacyLedger().add_shuffle("silo_record", members[0], relation=REL))
    assert both.epsilon("silo_record", delta, "pld") == pytest.approx(
        SA.pld(members[1]).compose(SA.pld(members[0])).get_epsilon_for_delta(delta), rel=1e-9)
    again = PrivacyLedger.from_json(json.dumps(both.to_json()))
    assert again.entries == both.entries
    assert again.entries[-1].kind == "shuffle" and again.entries[-1].sensitivity == 2.0
    with pytest.raises(ValueError, match="BinomialSumEvent"):
        PrivacyLedger().add_shuffle("x", A.gaussian_event(1.0), relation=REL)


def test_pld_dominates_random_neighbours():
    # Random tiny neighbouring pairs (random values, so the rounding is random and the changes
    # of mixed sign), both relations, granularities and noise counts: never above the PLD.
    rng = np.random.default_rng(0)
    for trial in range(8):
        cfg = S.ShuffleConfig(clip_norm=1.0, granularity=int(rng.integers(1, 4)),
                              noise_trials=int(rng.integers(3, 9)), norm=("l2", "linf")[trial % 2])
        base = rng.uniform(-1, 1, (2, 2)).tolist()
        new = rng.uniform(-1, 1, 2).tolist()
        relation = ("add_remove", "replace")[(trial // 2) % 2]
        d_in, d_out = (base, base + [new]) if relation == "add_remove" else (base, [new] + base[1:])
        p = _exact_output(_grid(d_out, cfg), cfg.noise_trials)
        q = _exact_output(_grid(d_in, cfg), cfg.noise_trials)
        for eps in EPS_GRID:
            brute = max(_hockey(p, q, eps), _hockey(q, p, eps))
            assert SA.delta_for_epsilon(cfg, 2, 1, eps, relation=relation) >= brute - 1e-12


def _mix(a, b, q):
    out = {o: (1 - q) * p for o, p in a.items()}
    for o, p in b.items():
        out[o] = out.get(o, 0.0) + q * p
    return out


def _product(a, b):
    return {(x, y): pa * pb for x, pa in a.items() for y, pb in b.items()}


@pytest.mark.parametrize("tight", [True, False])
def test_poisson_subsampled_pld_against_brute_force(tight):
    # The added record takes part with probability q: M(D') = (1 - q) M(D) + q M(D + x).
    q = 0.3
    cfg = S.ShuffleConfig(clip_norm=1.0, granularity=2, noise_trials=6, norm="linf")
    base = [[0.5, -0.5], [-1.0, 0.0]] if tight else [[0.3, -0.6], [-0.8, 0.1]]
    new = [1.0, -1.0] if tight else [0.45, 0.7]
    without = _exact_output(_grid(base, cfg), cfg.noise_trials)
    with_x = _mix(without, _exact_output(_grid(base + [new], cfg), cfg.noise_trials), q)
    for releases in (1, 2):
        p, r = (with_x, without) if releases == 1 else (_product(with_x, with_x),
                                                        _product(without, without))
        ev = SA.make_event(cfg, 2, releases, sampling_probability=q)
        pld = SA.pld(ev)
        for eps in EPS_GRID:
            brute = max(_hockey(p, r, eps), _hockey(r, p, eps))
            got = pld.get_delta_for_epsilon(eps)
            assert got >= brute - 1e-12, (releases, eps)
            if tight:
                assert got <= brute + 2e-3, (releases, eps, got, brute)
        # Sampling helps: less delta than the same releases without it.
        assert pld.get_delta_for_epsilon(0.5) < SA.pld(SA.make_event(cfg, 2, releases)
                                                      ).get_delta_for_epsilon(0.5)


def test_poisson_subsampled_gaussian_limit():
    # Many noise bits: one release ~ a Gaussian mechanism of sensitivity K sqrt(d); Poisson
    # subsampled and composed, it matches dp_accounting's subsampled Gaussian.
    n, k, d, t, q = 40_000, 2, 20, 10, 0.1
    got = SA.pld(SA.BinomialSumEvent(n, k, d, t, q)).get_epsilon_for_delta(1e-5)
    sigma = math.sqrt(n) / 2 / (k * math.sqrt(d))
    acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), t)
    assert got == pytest.approx(acc.get_epsilon(1e-5), rel=0.03)
    with pytest.raises(ValueError, match="add_remove"):
        SA.make_event(CFG, 2, 1, relation="replace", sampling_probability=0.5)
    e = SA.make_event(CFG, 2, 3, sampling_probability=0.25)
    assert SA.BinomialSumEvent.from_json(e.to_json()) == e
