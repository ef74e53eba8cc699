"""Secure aggregation: fixed point, additive sharing, pairwise masks, dropouts, keys, views, and
secagg == plain for AE-DPFL, kNN-DPFL and DP-FedAvg with the same key."""
import dataclasses

import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from fedjax_dp.algorithms.voting import ae_dpfl, knn_dpfl, voting_dpfl
import chains
from fedjax_dp.algorithms import api, rounds
from fedjax_dp.algorithms.averaging import dp_fedavg
from fedjax_dp.core import from_ragged, rng
from fedjax_dp.models import make_model
from fedjax_dp.privacy import accounting, secagg, secagg_masks, secagg_shares, vote
from fedjax_dp.stages import StageConflict, clipping, updates
from fedjax_dp.stages import noise as noise_stages
from fedjax_dp.train import LocalTrainConfig

F = 16                                        # fraction bits used throughout (one compilation)
CFG = secagg.SecAggConfig(talliers=3, frac_bits=F, neighbours=4)


def _int_sum(values, alive, frac_bits=F):
    """The exact fixed-point sum over the alive rows, from numpy int64 (the test oracle)."""
    enc = np.round(np.asarray(values, np.float64) * 2.0 ** frac_bits).astype(np.int64)
    s = enc[np.asarray(alive)].sum(0) % 2 ** 32
    return np.where(s >= 2 ** 31, s - 2 ** 32, s).astype(np.int64)


def _ints(u):
    return np.asarray(secagg.to_signed(u)).astype(np.int64)


# --------------------------------------------------------------------------- fixed point

def test_encode_decode_round_trip_and_wrap_around():
    x = np.array([0.0, 1.0, -1.0, 3.14159, -2.5e-5, 1e-6, 32767.0, -32768.0], np.float32)
    u = np.asarray(secagg.encode(x, F))
    assert u.dtype == np.uint32
    np.testing.assert_array_less(np.abs(np.asarray(secagg.decode(u, F)) - x),
                                 2.0 ** -(F + 1) + 1e-9)
    assert u[2] == 2 ** 32 - 2 ** F                    # -1 is 2^32 - 2^f (two's complement)
    # partial sums wrap around the ring, the final sum is still exact
    big = np.full((4,), 30000.0, np.float32)           # 4 x 30000 > 2^15: partial sums overflow
    terms = np.concatenate([big, -big + 1.0])          # true sum: 4
    total = jnp.sum(secagg.encode(terms, F), dtype=jnp.uint32)
    assert float(secagg.decode(total, F)) == 4.0
    # saturates (no silent wrap) beyond the representable range of one value
    assert int(secagg.to_signed(secagg.encode(np.float32(1e6), F))) == 2 ** 31 - 128


def test_check_range_and_config_errors_name_the_field():
    secagg.check_range("bound", 1000.0, F, 10)                       # fits
    with pytest.raises(ValueError, match=r"overflow.*frac_bits <= 15"):
        secagg.check_range("bound", 40000.0, F, 10)
    for kw, field in [(dict(talliers=1), "secagg.talliers"), (dict(frac_bits=31), "frac_bits"),
                      (dict(neighbours=3), "secagg.neighbours"),
                      (dict(dropout=1.0), "secagg.dropout"), (dict(dropout=-0.1), "dropout")]:
        with pytest.raises(ValueError, match=field):
            secagg.SecAggConfig(**kw)
    base = ae_dpfl.Config(num_queries=4)
    for kw, field in [(dict(aggregation="mpc"), "algorithm.aggregation"),
                      (dict(aggregation="secagg", secagg_talliers=1), "algorithm.secagg_talliers"),
                      (dict(aggregation="secagg", secagg_dropout=1.5), "algorithm.secagg_dropout"),
                      (dict(secagg_dropout=0.2), "algorithm.secagg_dropout")]:
        with pytest.raises(ValueError, match=field):
            dataclasses.replace(base, **kw)
    with pytest.raises(ValueError, match="algorithm.secagg_neighbours"):
        dp_fedavg.Config(aggregation="secagg", secagg_neighbours=5)
    with pytest.raises(ValueError, match="algorithm.secagg_frac_bits"):
        knn_dpfl.Config(aggregation="secagg", secagg_frac_bits=-1)


# --------------------------------------------------------------------------- additive sharing

def _normal(seed, shape, scale=1.0):
    return (np.random.default_rng(seed).normal(size=shape) * scale).astype(np.float32)


def test_shares_reconstruct_the_exact_fixed_point_sum_and_chunking_is_exact():
    x = _normal(0, (9, 5, 3), 4.0)                                                # [N, Q, C]
    ids = jnp.arange(9)
    enc = secagg.encode(x, F)
    shares = secagg_shares.share(jax.random.key(1), ids, enc, 3)                 # [N, J, Q, C]
    assert shares.shape == (9, 3, 5, 3) and shares.dtype == jnp.uint32
    alive = np.arange(9) % 4 != 1
    sums = secagg_shares.tallier_sums(shares, jnp.asarray(alive))
    np.testing.assert_array_equal(_ints(secagg_shares.combine(sums)), _int_sum(x, alive))
    # chunked accumulation (3 chunks, mod 2^32) == all at once; the argmax is the plain one's
    acc = secagg_shares.tally_init(3, (5, 3))
    for lo in range(0, 9, 3):
        acc = secagg_shares.tally_add(acc, jax.random.key(1), x[lo:lo + 3], ids[lo:lo + 3],
                                      jnp.ones(3, bool), frac_bits=F)
    one = secagg_shares.tallier_sums(shares, jnp.ones(9, bool))
    np.testing.assert_array_equal(np.asarray(acc), np.asarray(one))
    labels = secagg_shares.release_labels(acc, frac_bits=F)
    np.testing.assert_array_equal(np.asarray(labels), x.sum(0).argmax(-1))
    np.testing.assert_allclose(np.asarray(secagg_shares.reveal_sum(acc, F)), x.sum(0),
                               atol=9 * 2.0 ** -(F + 1) + 1e-5)


def test_sharing_matches_a_python_loop_over_agents():
    x = _normal(2, (9, 5, 3))
    enc = np.asarray(secagg.encode(x, F))
    got = np.asarray(secagg_shares.share(jax.random.key(3), jnp.arange(9), jnp.asarray(enc), 3))
    for i in range(9):
        r = np.asarray(jax.random.bits(jax.random.fold_in(jax.random.key(3), i), (2, 5, 3),
                                       jnp.uint32))
        np.testing.assert_array_equal(got[i, :2], r)
        last = (enc[i].astype(np.uint64) + 2 * 2 ** 32 - r.astype(np.uint64).sum(0)) % 2 ** 32
        np.testing.assert_array_equal(got[i, 2], last)


def _chi2_bytes(u):
    """p-value of a chi-square test that the bytes of uint32 values are uniform on 0..255."""
    b = np.asarray(u, np.uint32).view(np.uint8).ravel()
    return stats.chisquare(np.bincount(b, minlength=256)).pvalue


def _independent(u, v):
    """No equal entries beyond chance and |correlation| < 4 / sqrt(n) (4 standard errors)."""
    u, v = np.asarray(u).ravel().astype(float), np.asarray(v).ravel().astype(float)
    return np.mean(u == v) < 0.01 and abs(np.corrcoef(u, v)[0, 1]) < 4 / np.sqrt(u.size)


def test_one_talliers_view_is_uniform_whatever_the_inputs_and_shares_are_independent():
    """Every single share (J = 2: a coalition of J - 1 = 1 tallier) is uniform on Z_2^32 and has
    the same distribution for two very different input sets, while the sum is right; agents
    with identical inputs, and the same agent in two votes, get independent shares."""
    n, shape = 64, (16, 8)
    inputs = [np.zeros((n,) + shape, np.float32), _normal(4, (n,) + shape, 100.0)]
    views = []
    for x in inputs:
        shares = secagg_shares.share(jax.random.key(5), jnp.arange(n), secagg.encode(x, F), 2)
        for j in range(2):
            assert _chi2_bytes(shares[:, j]) > 1e-3
        views.append(np.asarray(shares[:, 1]).ravel())               # the last share: E(x) - r
        np.testing.assert_array_equal(
            _ints(secagg_shares.combine(secagg_shares.tallier_sums(shares, jnp.ones(n, bool)))),
            _int_sum(x, np.ones(n, bool)))
    assert stats.ks_2samp(views[0].astype(np.float64), views[1].astype(np.float64),
                          method="asymp").pvalue > 1e-3
    assert stats.kstest(views[1] / 2.0 ** 32, "uniform").pvalue > 1e-3
    zeros = secagg.encode(inputs[0], F)
    a = secagg_shares.share(jax.random.key(6), jnp.arange(n), zeros, 2)
    b = secagg_shares.share(jax.random.key(7), jnp.arange(n), zeros, 2)        # the next vote
    assert _independent(a[0, 0], a[1, 0]) and _independent(a[0, 0], b[0, 0])


# --------------------------------------------------------------------------- pairwise masks

def test_neighbour_graph_is_k_regular_symmetric_and_random_per_key():
    assert secagg_masks.ring_offsets(5, 8) == secagg_masks.ring_offsets(5, None) == (1, 2, 3, 4)
    assert secagg_masks.ring_offsets(9, 4) == (1, 2, 7, 8)
    for b, k, deg in [(9, 4, 4), (6, None, 5)]:
        nbr = np.asarray(secagg_masks.neighbours(jax.random.key(8), b, k))
        assert nbr.shape == (b, deg)
        for i in range(b):
            assert i not in nbr[i] and len(set(nbr[i])) == deg          # no self loop, distinct
            for j in nbr[i]:
                assert i in nbr[j]                                       # symmetric
    g1 = np.asarray(secagg_masks.neighbours(jax.random.key(8), 9, 4))
    g2 = np.asarray(secagg_masks.neighbours(jax.random.key(9), 9, 4))
    assert not np.array_equal(np.sort(g1, 1), np.sort(g2, 1))


MB, MD = 32, 256                    # agents and dimension of the masking tests (one compilation)


def test_masked_inputs_match_a_python_loop_and_cancel_exactly():
    x = _normal(10, (MB, MD))
    ids = jnp.asarray(np.sort(np.random.default_rng(0).choice(1000, MB, replace=False)))
    enc = secagg.encode(x, F)
    y, nbr = secagg_masks.masked_inputs(jax.random.key(11), enc, ids, 4)
    seed = jax.random.fold_in(jax.random.key(11), 1)
    ids_np, nbr_np = np.asarray(ids), np.asarray(nbr)
    pair_bits = jax.jit(lambda lo, hi: jax.random.bits(      # one pair's mask, compiled once
        jax.random.fold_in(jax.random.fold_in(seed, lo), hi), (MD,), jnp.uint32))
    for i in range(MB):                                              # the loop reference
        m = np.asarray(enc[i]).astype(np.uint64)
        for j in nbr_np[i]:
            lo, hi = sorted((int(ids_np[i]), int(ids_np[j])))
            r = np.asarray(pair_bits(np.uint32(lo), np.uint32(hi))).astype(np.uint64)
            m = m + r if ids_np[i] < ids_np[j] else m + (2 ** 32 - r)
        np.testing.assert_array_equal(np.asarray(y[i]), (m % 2 ** 32).astype(np.uint32))
    np.testing.assert_array_equal(_ints(jnp.sum(y, 0, dtype=jnp.uint32)),
                                  _int_sum(x, np.ones(MB, bool)))


@pytest.mark.parametrize("fraction", [0.0, 0.2, 0.5, 0.9])
def test_dropouts_give_the_survivors_exact_sum(fraction):
    x = _normal(12, (MB, MD), 3.0)
    valid = jnp.arange(MB) < MB - 3                                  # three padding rows
    alive = secagg.drop_within(jax.random.key(13), valid, fraction, jnp.arange(MB))
    # every agent's own coin (tests/test_secagg_dropout_privacy.py checks their law)
    np.testing.assert_array_equal(np.asarray(alive), np.asarray(valid) & np.asarray(
        secagg.survive(jax.random.key(13), jnp.arange(MB), fraction)))
    assert not bool(jnp.any(alive & ~valid))
    out = secagg_masks.secure_sum_jit(jax.random.key(14), jnp.asarray(x), jnp.arange(MB), alive,
                                      CFG)
    expect = _int_sum(x, np.asarray(alive)).astype(np.float32) * np.float32(2.0 ** -F)
    np.testing.assert_array_equal(np.asarray(out), expect)
    # the vote's host draw: the same coins for agents 0..N-1
    surv = secagg.survivors(jax.random.key(15), 20, fraction)
    np.testing.assert_array_equal(surv, np.asarray(secagg.survive(jax.random.key(15),
                                                                  jnp.arange(20), fraction)))


def test_the_servers_view_is_uniform_whatever_the_inputs_and_masks_are_independent():
    views = []
    for x in [np.zeros((MB, MD), np.float32), _normal(16, (MB, MD), 50.0)]:
        y, _ = secagg_masks.masked_inputs(jax.random.key(17), secagg.encode(x, F),
                                          jnp.arange(MB), 4)
        assert _chi2_bytes(y) > 1e-3
        views.append(np.asarray(y).ravel().astype(np.float64))
        np.testing.assert_array_equal(_ints(jnp.sum(y, 0, dtype=jnp.uint32)),
                                      _int_sum(x, np.ones(MB, bool)))
    assert stats.ks_2samp(views[0], views[1], method="asymp").pvalue > 1e-3
    # zero inputs: y is the mask itself; other agents' and other rounds' masks are independent
    zeros = secagg.encode(np.zeros((MB, MD), np.float32), F)
    r1, _ = secagg_masks.masked_inputs(jax.random.key(18), zeros, jnp.arange(MB), 4)
    r2, _ = secagg_masks.masked_inputs(jax.random.key(19), zeros, jnp.arange(MB), 4)
    assert _independent(r1[0], r2[0]) and _independent(r1[0], r1[1])
    k = jax.random.key(20)
    assert not np.array_equal(np.asarray(jax.random.key_data(secagg_masks.pair_key(k, 1, 2))),
                              np.asarray(jax.random.key_data(secagg_masks.pair_key(k, 1, 3))))
    np.testing.assert_array_equal(np.asarray(jax.random.key_data(secagg_masks.pair_key(k, 2, 1))),
                                  np.asarray(jax.random.key_data(secagg_masks.pair_key(k, 1, 2))))


# --------------------------------------------------------------------------- AE-DPFL, kNN-DPFL

N, Q, C = 12, 8, 3


@pytest.fixture(scope="module")
def voting():
    r = np.random.default_rng(0)
    xs = [r.normal(size=(6, 4)).astype(np.float32) + np.arange(6)[:, None] % 3 for _ in range(N)]
    ys = [np.arange(6) % 3 for _ in range(N)]
    agents = from_ragged(xs, ys)
    public = r.normal(size=(20, 4)).astype(np.float32)
    data = api.FederatedData(agents=agents, num_classes=C, x_public=public)
    model = make_model("mlp", (4,), C, hidden=(4,))
    ballots = r.integers(-1, C, size=(N, Q)).astype(np.int8)             # -1: abstain
    ballots[:, 0] = 1                                                     # a clear winner
    return data, model, ballots


def _ae_vote(voting, **kw):
    data, model, ballots = voting
    cfg = ae_dpfl.Config(**{"sigma": 0.7, "num_queries": Q, "agent_chunk": 5,
                            "data_dependent": True, **kw})                # the clean sums
    state = ae_dpfl.init(jax.random.key(0), data, model, cfg)
    state = api.State(step=1, values={"agent_ballots": ballots}, context=state.context)
    state, metrics = ae_dpfl.step(state)
    return cfg, state, metrics


@pytest.mark.parametrize("noise", ["per_agent", "aggregate"])
def test_ae_dpfl_secagg_releases_the_plain_labels_and_the_same_ledger(voting, noise):
    cfg, plain, _ = _ae_vote(voting, vote_noise=noise)
    for kw in [dict(secagg_talliers=2 if noise == "per_agent" else 4)]:
        cfg_s, sec, metrics = _ae_vote(voting, vote_noise=noise, aggregation="secagg", **kw)
        np.testing.assert_array_equal(sec.values["labels"], plain.values["labels"])
        np.testing.assert_array_equal(sec.values["clean_vote_sums"],
                                      plain.values["clean_vote_sums"])
        assert metrics["secagg_survivors"] == N
        a, b = ae_dpfl.ledger(cfg, plain), ae_dpfl.ledger(cfg_s, sec)
        assert [e.event for e in a.entries] == [e.event for e in b.entries]
        assert a.epsilon("instance_data_dependent", 1e-5) == b.epsilon(
            "instance_data_dependent", 1e-5)


@pytest.mark.parametrize("noise", ["per_agent", "aggregate"])
def test_ae_dpfl_dropouts_count_the_survivors_with_the_noise_topped_up(voting, noise):
    data, model, ballots = voting
    cfg, state, metrics = _ae_vote(voting, aggregation="secagg", secagg_dropout=0.25,
                                   vote_noise=noise)
    k_share, k_drop, k_top = voting_dpfl.secagg_keys(state.context)
    alive = secagg.survivors(k_drop, N, 0.25)                              # each agent's coin
    m = int(alive.sum())
    assert metrics["secagg_survivors"] == m and 0 < m < N                  # key 0: some drop
    onehot = (ballots[..., None] == np.arange(C)).astype(np.float64)       # abstain: zeros
    np.testing.assert_array_equal(state.values["clean_vote_sums"], onehot[alive].sum(0))
    # the ledger is the one without dropouts: the noise is topped up to sigma (voting_dpfl)
    ledger = ae_dpfl.ledger(cfg, state)
    for unit, sens in ae_dpfl.sensitivities().items():
        direct = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(0.7 / sens), Q)
        assert ledger.epsilon(unit, 1e-5) == pytest.approx(accounting.epsilon(direct, 1e-5))
    assert ae_dpfl.ledger(cfg).epsilon("agent", 1e-5) == ledger.epsilon("agent", 1e-5)
    # the released vote: argmax of the survivors' ballots plus sigma^2 of noise -- the survivors'
    # own shares plus the talliers' top-up N(0, sigma^2 (N - M)/N) (per_agent), or the total
    # drawn at once (aggregate)
    if noise == "per_agent":
        z = np.asarray(_noise(state.context.keys["vote"], jnp.arange(N), jnp.arange(Q),
                              jnp.float32(0.7 / np.sqrt(N)), num_classes=C))[alive].sum(0)
        z = z + np.asarray(vote.aggregate_noise(k_top, jnp.arange(Q),
                                                0.7 * np.sqrt((N - m) / N), C))
    else:
        z = np.asarray(vote.aggregate_noise(state.context.keys["vote"], jnp.arange(Q), 0.7, C))
    np.testing.assert_array_equal(state.values["labels"], (onehot[alive].sum(0) + z).argmax(-1))


_noise = jax.jit(vote.agent_query_noise, static_argnames=("num_classes",))


def test_secagg_vote_refuses_a_mesh_and_an_overflowing_range(voting):
    data, model, _ = voting
    cfg = ae_dpfl.Config(sigma=0.7, num_queries=Q, aggregation="secagg")
    with pytest.raises(ValueError, match="runtime.mesh"):
        ae_dpfl.init(jax.random.key(0), data, model, cfg,
                     api.Runtime(mesh=jax.sharding.Mesh(np.asarray(jax.devices()[:1]),
                                                        ("agents",))))
    with pytest.raises(ValueError, match="overflow"):
        ae_dpfl.init(jax.random.key(0), data, model,
                     dataclasses.replace(cfg, secagg_frac_bits=27))


def test_knn_dpfl_secagg_releases_the_plain_labels(voting):
    data, model, _ = voting
    out = {}
    for agg in ("plain", "secagg"):
        cfg = knn_dpfl.Config(k=3, sigma=0.3, num_queries=Q, feature_map="identity",
                              knn_method="top_k", agent_chunk=5, aggregation=agg,
                              data_dependent=True)
        state = knn_dpfl.init(jax.random.key(1), data, model, cfg)
        out[agg], _ = knn_dpfl.step(state)
    np.testing.assert_array_equal(out["secagg"].values["labels"], out["plain"].values["labels"])
    np.testing.assert_array_equal(out["secagg"].values["clean_vote_sums"],
                                  out["plain"].values["clean_vote_sums"])


def test_the_share_stream_is_not_the_noise_stream(voting):
    data, model, _ = voting
    state = ae_dpfl.init(jax.random.key(0), data, model, ae_dpfl.Config(num_queries=Q))
    keys = state.context.keys
    raw = {name: np.asarray(jax.random.key_data(k)).tobytes() for name, k in keys.items()}
    raw.update({f"secagg_{i}": np.asarray(jax.random.key_data(k)).tobytes()
                for i, k in enumerate(voting_dpfl.secagg_keys(state.context))})
    assert len(set(raw.values())) == len(raw)                              # all distinct


# --------------------------------------------------------------------------- DP-FedAvg

LOCAL = LocalTrainConfig(steps=2, batch_size=4, learning_rate=0.2)


@pytest.fixture(scope="module")
def fed():
    r = np.random.default_rng(1)
    sizes = [4, 6, 3, 5, 6, 2, 5, 4]
    ys = [r.integers(0, 3, size=n) for n in sizes]
    xs = [r.normal(size=(len(y), 5)).astype(np.float32) + y[:, None] for y in ys]
    return from_ragged(xs, ys), make_model("mlp", (5,), 3, hidden=(6,))


def _mean_update(key, params, x, y, mask, count, extras):
    """A cheap agent update (no training to compile): the params plus the mean of the agent's
    records per feature, times 3 (so that clipping to 0.5 is active for some agents)."""
    m = jnp.sum(x * mask[:, None], 0) / jnp.maximum(count, 1)                    # [5]
    return jax.tree.map(lambda p: p + 3.0 * m, params), {}


def _mean_chain(cfg):
    return chains.replace(dp_fedavg.chain(cfg), client_update=updates.LocalSteps(_mean_update))


def _dp_round(cfg, data, model, key):
    runner = chains.ParamsRunner(_mean_chain(cfg), data)
    return runner(key, {"w": jnp.zeros((5,))})


def test_dp_fedavg_secagg_gives_the_plain_update_up_to_fixed_point(fed):
    """The DP-FedAvg round of a Config (sampling, clipping, noise, denominator qN) with the
    plain and the secure sum of the clipped updates (a cheap local update stands in for local
    SGD, which secure aggregation never sees)."""
    data, model = fed
    base = dp_fedavg.Config(diagnostics=True, rounds=1, sampling_rate=0.6, clip_norm=0.5, noise_multiplier=0.5,
                            local=LOCAL)
    cfg = dataclasses.replace(base, aggregation="secagg", secagg_neighbours=2)
    key = jax.random.key(3)
    plain, m_plain = _dp_round(base, data, model, key)
    sec, m_sec = _dp_round(cfg, data, model, key)
    # M <= N agents each rounded by <= 2^-(f+1), divided by qN (plus float32 rounding)
    tol = base.server_lr * data.num_agents * 2.0 ** -(F + 1) / (0.6 * data.num_agents) + 1e-6
    np.testing.assert_allclose(np.asarray(sec["w"]), np.asarray(plain["w"]), rtol=0, atol=tol)
    assert m_sec["num_sampled"] == m_plain["num_sampled"] > 1
    assert [e.event for e in dp_fedavg.ledger(cfg).entries] == \
        [e.event for e in dp_fedavg.ledger(base).entries]
    with pytest.raises(ValueError, match="overflow"):                    # before any work
        chains.ParamsRunner(_mean_chain(dataclasses.replace(cfg, clip_norm=1e5)), data)


def test_dp_fedavg_round_with_dropouts_sums_the_survivors(fed):
    data, model = fed
    cfg = dp_fedavg.Config(diagnostics=True, rounds=1, sampling_rate=1.0, clip_norm=100.0, noise_multiplier=0.0,
                           denominator="sampled", local=LOCAL, aggregation="secagg",
                           secagg_neighbours=2, secagg_dropout=0.4)
    key = jax.random.key(4)
    new, metrics = _dp_round(cfg, data, model, key)
    # the oracle: the same survivors (the pass's dropout key), their plain updates summed
    _, k_train, _ = rounds.round_keys(key)
    k_pass = jax.random.fold_in(rng.stream(k_train, "secagg"), 0)             # ids[0] = 0
    alive = np.asarray(secagg.drop_within(jax.random.split(k_pass)[1],
                                          jnp.ones(data.num_agents, bool), 0.4,
                                          jnp.arange(data.num_agents)))
    assert metrics["num_sampled"] == alive.sum()
    assert 0 < alive.sum() < data.num_agents                             # key 4: some drop
    means = np.stack([3.0 * np.asarray(data.x[i])[np.asarray(data.mask[i])].mean(0)
                      for i in range(data.num_agents)])                   # [N, 5]
    np.testing.assert_allclose(np.asarray(new["w"]), means[alive].sum(0) / alive.sum(),
                               atol=data.num_agents * 2.0 ** -(F + 1) + 1e-5)
    with pytest.raises(StageConflict, match='^aggregation "secagg" with clipping "none": the '
                       'secure sum\'s fixed-point ring is sized by the largest clip'):
        chains.replace(_mean_chain(cfg), clipping=clipping.NoClip(), noise=noise_stages.NoNoise())
