"""The MPC vote: vectorised vs loop, chunked vs plain, noise independence, accounting, CLI."""
import json
import math

import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dp.core import rng
from fedjax_dp.experiments import cli
from fedjax_dp.privacy import accounting, vote
from fedjax_dp.privacy.gnmax import PATE_ORDERS, gnmax_epsilon

N, Q, C = 7, 11, 4


def _one_hot_ballots(agents, queries):
    """Agent i votes class (i + t) mod C on query t, via its 'preference' row (pure, chunkable)."""
    pref, = agents                                                      # [a, C]
    scores = pref[:, None, :] + queries[None, :, :]                     # [a, q, C]
    return jax.nn.one_hot(jnp.argmax(scores, -1), C)


@pytest.fixture(scope="module")
def setup():
    k1, k2 = jax.random.split(jax.random.key(0))
    pref = jax.random.normal(k1, (N, C))
    queries = jax.random.normal(k2, (Q, C))
    return (pref,), queries


def test_vote_matches_a_loop_over_agents_and_queries(setup):
    agents, queries = setup
    key, sigma = jax.random.key(5), 2.0
    labels = vote.mpc_vote(key, _one_hot_ballots, agents, queries, sigma, num_classes=C)
    ballots = np.asarray(_one_hot_ballots(agents, queries))              # [N, Q, C]
    std = sigma / math.sqrt(N)
    share = jax.jit(lambda key, i, t: rng.counter_normals(                # compiled once
        jax.random.fold_in(key, 2 ** 32 - 2), i, t, C)[0])
    ref = []
    for t in range(Q):                                                   # reference loop
        tally = np.zeros(C)
        for i in range(N):    # agent i's share on query t: counters (i, t h + j), own key
            z = share(key, np.array([i]), np.array([t]))
            tally += ballots[i, t] + std * np.asarray(z)
        ref.append(int(np.argmax(tally)))
    np.testing.assert_array_equal(np.asarray(labels), ref)
    assert labels.dtype == jnp.int32 and labels.shape == (Q,)


_TALLY = jax.jit(vote.noisy_tally, static_argnames=("ballot_fn", "num_classes", "agent_chunk",
                                               "query_chunk", "noisy", "noise"))


@pytest.fixture(scope="module")
def plain_tally(setup):
    agents, queries = setup
    return np.asarray(_TALLY(jax.random.key(9), agents, queries, 1.5, ballot_fn=_one_hot_ballots,
                             num_classes=C, agent_chunk=None, query_chunk=None, noisy=True))


@pytest.mark.parametrize("agent_chunk,query_chunk", [(1, None), (3, 4), (100, 100)])
def test_chunked_equals_plain(setup, plain_tally, agent_chunk, query_chunk):
    """Chunks of agents x queries (also ragged last chunks, and chunks larger than N, Q)."""
    agents, queries = setup
    chunked = _TALLY(jax.random.key(9), agents, queries, 1.5, ballot_fn=_one_hot_ballots,
                     num_classes=C, agent_chunk=agent_chunk, query_chunk=query_chunk, noisy=True)
    np.testing.assert_allclose(chunked, plain_tally, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(
        vote.mpc_vote(jax.random.key(9), _one_hot_ballots, agents, queries, 1.5,
                      num_classes=C, agent_chunk=agent_chunk, query_chunk=query_chunk),
        plain_tally.argmax(-1))
    np.testing.assert_allclose(
        vote.vote_sums(_one_hot_ballots, agents, queries, num_classes=C,
                       agent_chunk=agent_chunk, query_chunk=query_chunk),
        np.asarray(_one_hot_ballots(agents, queries)).sum(0), atol=1e-6)


def test_noise_is_independent_across_agents_and_queries_with_the_right_scale():
    n, q, c, sigma = 64, 48, 10, 3.0
    draw = jax.jit(vote.agent_query_noise, static_argnames="num_classes")
    noise = np.asarray(draw(jax.random.key(1), jnp.arange(n), jnp.arange(q),
                            sigma / math.sqrt(n), num_classes=c))              # [n, q, c]
    m = q * c
    assert noise.std() == pytest.approx(sigma / math.sqrt(n), rel=0.05)
    per_agent = noise.reshape(n, m)
    corr = np.corrcoef(per_agent)
    off = corr[~np.eye(n, dtype=bool)]
    assert np.abs(off).max() < 5 / math.sqrt(m)           # no two agents correlated beyond chance
    per_query = noise.transpose(1, 0, 2).reshape(q, n * c)
    corr_q = np.corrcoef(per_query)
    assert np.abs(corr_q[~np.eye(q, dtype=bool)]).max() < 5 / math.sqrt(n * c)
    assert len({row.tobytes() for row in noise.reshape(n * q, c)}) == n * q   # no repeated draw
    # the secure sum carries N(0, sigma^2): tally minus the clean sum over many queries
    total = noise.sum(0).ravel()
    assert total.std() == pytest.approx(sigma, rel=0.1)
    # a different key gives different noise; the same key the same noise
    again = draw(jax.random.key(1), jnp.arange(n), jnp.arange(q), sigma / math.sqrt(n),
                 num_classes=c)
    other = draw(jax.random.key(2), jnp.arange(n), jnp.arange(q), sigma / math.sqrt(n),
                 num_classes=c)
    np.testing.assert_array_equal(noise, again)
    assert abs(np.corrcoef(noise.ravel(), np.asarray(other).ravel())[0, 1]) < 0.02


def test_aggregate_noise_vote_matches_a_loop_and_any_chunking(setup):
    """noise="aggregate": argmax(clean sum + sigma N(0, I) from the virtual party's key per query),
    the same labels for every chunking."""
    agents, queries = setup
    key, sigma = jax.random.key(5), 2.0
    labels = vote.mpc_vote(key, _one_hot_ballots, agents, queries, sigma, num_classes=C,
                           noise="aggregate")
    clean = np.asarray(_one_hot_ballots(agents, queries)).sum(0)           # [Q, C]
    party = jax.random.fold_in(key, jnp.uint32(2 ** 32 - 1))
    draw = jax.jit(lambda t: jax.random.normal(jax.random.fold_in(party, t), (C,)))
    ref = [int(np.argmax(clean[t] + sigma * np.asarray(draw(t)))) for t in range(Q)]
    np.testing.assert_array_equal(np.asarray(labels), ref)
    plain = _TALLY(key, agents, queries, sigma, ballot_fn=_one_hot_ballots, num_classes=C,
                   agent_chunk=None, query_chunk=None, noisy=True, noise="aggregate")
    for agent_chunk, query_chunk in [(1, None), (3, 4)]:
        chunked = _TALLY(key, agents, queries, sigma, ballot_fn=_one_hot_ballots, num_classes=C,
                         agent_chunk=agent_chunk, query_chunk=query_chunk, noisy=True,
                         noise="aggregate")
        np.testing.assert_allclose(chunked, plain, rtol=1e-5, atol=1e-5)
    # a prefix of the queries gets the same noise (query t's key does not depend on Q)
    np.testing.assert_array_equal(
        vote.aggregate_noise(key, jnp.arange(5), sigma, C),
        vote.aggregate_noise(key, jnp.arange(Q), sigma, C)[:5])


def test_one_pass_vote_and_sums_equal_the_separate_calls(setup):
    """mpc_vote_and_sums / run_vote: the aggregate-noise labels and the clean sums from one
    evaluation of the ballots equal mpc_vote(noise="aggregate") and vote_sums; run_vote without
    the analysis returns no sums, with per-agent shares the labels of mpc_vote."""
    agents, queries = setup
    key = jax.random.key(21)
    labels, sums = vote.mpc_vote_and_sums(key, _one_hot_ballots, agents, queries, 0.7,
                                          num_classes=C, agent_chunk=3, query_chunk=4)
    np.testing.assert_array_equal(labels, vote.mpc_vote(
        key, _one_hot_ballots, agents, queries, 0.7, num_classes=C, noise="aggregate"))
    np.testing.assert_array_equal(sums, vote.vote_sums(_one_hot_ballots, agents, queries,
                                                       num_classes=C))
    assert sums.dtype == np.float64
    for noise in vote.NOISE_MODES:
        ref = vote.mpc_vote(key, _one_hot_ballots, agents, queries, 0.7, num_classes=C,
                            noise=noise)
        got, clean = vote.run_vote(key, _one_hot_ballots, agents, queries, 0.7, num_classes=C,
                                   noise=noise, data_dependent=True)
        np.testing.assert_array_equal(got, ref)
        np.testing.assert_array_equal(clean, sums)
        got, clean = vote.run_vote(key, _one_hot_ballots, agents, queries, 0.7, num_classes=C,
                                   noise=noise)
        np.testing.assert_array_equal(got, ref)
        assert clean is None
    with pytest.raises(ValueError, match="sigma"):
        vote.mpc_vote_and_sums(key, _one_hot_ballots, agents, queries, -1.0, num_classes=C)


def _fixed_ballots(agents, queries):
    """Agent i votes class 0 if i < 3 else class 1, on every query (N = 5: margin 1)."""
    votes = (agents[0][:, 0] >= 3).astype(jnp.int32)                    # [a]
    return jax.nn.one_hot(jnp.broadcast_to(votes[:, None], (votes.shape[0], queries.shape[0])), 2)


def test_noise_modes_release_the_same_distribution():
    """Per-agent shares and the aggregate draw: tally noise N(0, sigma^2 I) in both (std, no
    correlation across classes or queries), and the released label is class 0 with probability
    Phi(margin / (sigma sqrt 2)) in both (4 standard errors over 4000 queries)."""
    agents = (jnp.arange(5.0)[:, None],)
    queries = jnp.zeros((4000, 1))
    sigma = 1.5
    p0 = 0.5 * (1 + math.erf(1.0 / (sigma * math.sqrt(2)) / math.sqrt(2)))
    se = math.sqrt(p0 * (1 - p0) / 4000)
    clean = np.asarray(_fixed_ballots(agents, queries)).sum(0)             # [Q, 2]
    for mode in vote.NOISE_MODES:
        tally = np.asarray(_TALLY(jax.random.key(11), agents, queries, sigma,
                                  ballot_fn=_fixed_ballots, num_classes=2, agent_chunk=None,
                                  query_chunk=None, noisy=True, noise=mode))
        noise = tally - clean
        assert noise.std() == pytest.approx(sigma, rel=0.05), mode
        assert abs(np.corrcoef(noise[:, 0], noise[:, 1])[0, 1]) < 4 / math.sqrt(4000), mode
        assert abs(np.corrcoef(noise[:-1, 0], noise[1:, 0])[0, 1]) < 4 / math.sqrt(4000), mode
        labels = np.asarray(vote.mpc_vote(jax.random.key(12), _fixed_ballots, agents, queries,
                                          sigma, num_classes=2, noise=mode))
        assert abs(np.mean(labels == 0) - p0) < 4 * se, mode
    with pytest.raises(ValueError, match="noise"):
        vote.mpc_vote(jax.random.key(0), _fixed_ballots, agents, queries, sigma,
                      num_classes=2, noise="per_query")


def test_released_vote_is_only_the_argmax_and_strong_consensus_survives_noise(setup):
    agents, queries = setup
    out = vote.mpc_vote(jax.random.key(3), _one_hot_ballots, agents, queries, 1e-3,
                        num_classes=C)
    clean = vote.vote_sums(_one_hot_ballots, agents, queries, num_classes=C)
    assert out.shape == (Q,)                              # labels, nothing else
    # tiny noise: the released label is the clean winner wherever the winner is unique
    unique = (np.sort(clean, 1)[:, -1] - np.sort(clean, 1)[:, -2]) > 0
    np.testing.assert_array_equal(np.asarray(out)[unique], clean.argmax(1)[unique])


def test_vote_argument_errors(setup):
    agents, queries = setup
    for kwargs, match in [({"sigma": -1.0}, "sigma"), ({"sigma": 0.0}, "sigma"),
                          ({"sigma": float("nan")}, "sigma"), ({"agent_chunk": 0}, "agent_chunk"),
                          ({"query_chunk": -2}, "query_chunk")]:
        args = {"sigma": 1.0, **kwargs}
        sigma = args.pop("sigma")
        with pytest.raises(ValueError, match=match):
            vote.mpc_vote(jax.random.key(0), _one_hot_ballots, agents, queries, sigma,
                          num_classes=C, **args)


def test_sensitivity_table():
    assert vote.vote_sensitivity("agent", "one_hot") == 1.0
    assert vote.vote_sensitivity("agent", "neighbour_counts", 5) == 1.0
    assert vote.vote_sensitivity("instance", "one_hot") == pytest.approx(math.sqrt(2))
    assert vote.vote_sensitivity("instance", "neighbour_counts", 5) == pytest.approx(math.sqrt(2) / 5)
    assert vote.vote_sensitivity("instance", "neighbour_counts", 5, rule="paper") == pytest.approx(
        math.sqrt(2 / 5))
    with pytest.raises(ValueError, match="k"):
        vote.vote_sensitivity("instance", "neighbour_counts")
    with pytest.raises(ValueError, match="unit"):
        vote.vote_sensitivity("party", "one_hot")


@pytest.mark.parametrize("sigma,q,sens", [(25.0, 500, 1.0), (10.0, 100, math.sqrt(2)),
                                          (3.0, 200, math.sqrt(2) / 4)])
def test_ledger_matches_dp_accounting_directly(sigma, q, sens):
    delta = 1e-4
    ledger = vote.vote_ledger(sigma, q, {"agent": sens})
    event = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(sigma / sens), q)
    rdp = dp_accounting.rdp.RdpAccountant(list(accounting.DEFAULT_RDP_ORDERS))
    rdp.compose(event)
    pld = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    pld.compose(event)
    assert ledger.epsilon("agent", delta, "rdp") == pytest.approx(rdp.get_epsilon(delta),
                                                                   rel=1e-9)
    assert ledger.epsilon("agent", delta, "pld") == pytest.approx(pld.get_epsilon(delta),
                                                                   rel=1e-6)
    # closed form check: RDP q alpha Delta^2 / (2 sigma^2)
    np.testing.assert_allclose(accounting.event_rdp(ledger.event("agent"), [2.0, 8.0]),
                               [q * a * sens ** 2 / (2 * sigma ** 2) for a in (2.0, 8.0)])


def test_paper_check_value_and_data_dependent_entry():
    ledger = vote.vote_ledger(25.0, 500, {"agent": 1.0})
    assert ledger.epsilon("agent", 1e-3) == pytest.approx(3.09, abs=0.01)
    votes = np.tile([80.0, 10, 5, 5], (50, 1))
    ledger = vote.vote_ledger(4.0, 50, {"agent": 1.0, "instance": math.sqrt(2)},
                              clean_vote_sums=votes)
    rows = {(r["unit"], r["accountant"]): r for r in ledger.report(1e-5)}
    assert rows[("agent", "rdp")]["data_dependent"] is False
    dd = rows[("agent_data_dependent", "rdp")]
    assert dd["data_dependent"] is True and ("agent_data_dependent", "pld") not in rows
    assert dd["epsilon"] == pytest.approx(gnmax_epsilon(votes, 4.0, 1e-5, 1.0)[0], rel=1e-9)
    assert dd["events"][-1]["orders"] == PATE_ORDERS.tolist()
    assert rows[("instance_data_dependent", "rdp")]["epsilon"] == pytest.approx(
        gnmax_epsilon(votes, 4.0, 1e-5, math.sqrt(2))[0], rel=1e-9)
    assert dd["epsilon"] < rows[("agent", "rdp")]["epsilon"]


def test_cli_account_gaussian_vote(capsys):
    code = cli.main(["account", "gaussian-vote", "--sigma", "25", "--queries", "500",
                     "--delta", "1e-3", "--unit", "agent"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["epsilon"]["rdp"] == pytest.approx(3.09, abs=0.01)
    assert 0 < out["epsilon"]["pld"] < out["epsilon"]["rdp"]
    assert out["event"]["class_name"] == "SelfComposedDpEvent" and out["event"]["count"] == 500
    code = cli.main(["account", "gaussian-vote", "--sigma", "10", "--queries", "100",
                     "--delta", "1e-5", "--unit", "instance", "--algorithm", "knn", "--k", "4",
                     "--accountant", "rdp"])
    out = json.loads(capsys.readouterr().out)
    assert out["sensitivity"] == pytest.approx(math.sqrt(2) / 4)
    assert out["epsilon"]["rdp"] == pytest.approx(accounting.epsilon(
        dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(10 * 4 / math.sqrt(2)),
                                          100), 1e-5), rel=1e-9)
    code = cli.main(["account", "gaussian-vote", "--sigma", "10", "--queries", "100",
                     "--delta", "1e-5", "--unit", "instance", "--algorithm", "knn"])
    assert code == 2 and "--k" in capsys.readouterr().err
