"""DP-FNAS: DARTS search space, genotype, private search steps, accounting, protocol run.

Tiny shapes throughout (4x4 images, 2 channels, 1 node, 1 cell, 2-3 primitives): compile time of
DARTS networks grows fast with their size.
"""
import dataclasses
import json
import math

import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dp.algorithms.fnas import dp_fnas, privacy, steps
from fedjax_dp.core import from_ragged
from fedjax_dp.core import progress as progress_lib
from fedjax_dp.experiments import config as config_lib
from fedjax_dp.experiments import runner
from fedjax_dp.models import darts
from fedjax_dp.privacy.clipping import weighted_clipped_sum

SHAPE = (4, 4, 1)
CLASSES = 3
PRIMS = ("none", "skip_connect", "avg_pool_3x3")
SPACE = darts.SearchSpace(nodes=1, channels=2, cells=1, primitives=PRIMS, stem_multiplier=1)


@pytest.fixture(scope="module")
def net():
    return darts.search_network(SPACE, SHAPE, CLASSES)


def _parties(k=2, n=6, seed=0):
    rng = np.random.default_rng(seed)
    xs = [rng.normal(size=(n,) + SHAPE).astype(np.float32) for _ in range(k)]
    ys = [rng.integers(0, CLASSES, n) for _ in range(k)]
    return from_ragged(xs, ys)


def _hyper(private=True, order="first", method="finite_difference", noise=1.0, clip=1.0):
    mech = steps.Mechanism(clip=clip, noise=noise, private=private)
    return steps.SearchHyper(weights=mech, arch=mech, second=mech, order=order,
                             second_order_method=method, xi=0.1, total_iterations=10)


# --------------------------------------------------------------------------- search space

def test_mixed_op_weights_sum_to_one_and_mix_ops():
    alpha = jax.random.normal(jax.random.key(0), (5, len(PRIMS)))
    w = darts.mixed_op_weights(alpha)
    np.testing.assert_allclose(np.asarray(w.sum(-1)), 1.0, rtol=1e-6)
    assert np.all(np.asarray(w) > 0)
    x = jax.random.normal(jax.random.key(1), (4, 4, 2))
    params = darts.init_mixed(jax.random.key(2), PRIMS, 2, 1)
    mixed = darts.mixed_op(PRIMS, 1, params, x, w[0])
    direct = sum(float(w[0, k]) * darts.apply_op(p, params[p], x, 1, mixed=True)
                 for k, p in enumerate(PRIMS))
    np.testing.assert_allclose(np.asarray(mixed), np.asarray(direct), rtol=1e-5, atol=1e-6)


def test_edges_and_reduction_cells():
    assert [darts.num_edges(n) for n in (1, 2, 4)] == [2, 5, 14]
    assert darts.reduction_cells(3) == (1, 2) and darts.reduction_cells(8) == (2, 5)


def _brute_genotype_cell(alpha, nodes, prims):
    w = np.exp(alpha) / np.exp(alpha).sum(-1, keepdims=True)
    out, start = [], 0
    for i in range(nodes):
        scored = []
        for j in range(i + 2):
            best = max((w[start + j, p], p) for p in range(len(prims)) if prims[p] != "none")
            scored.append((-best[0], j, prims[best[1]]))
        out += sorted([(op, j) for _, j, op in sorted(scored)[:2]], key=lambda e: e[1])
        start += i + 2
    return tuple(out)


def test_genotype_picks_top2_non_none_edges_with_argmax_op():
    prims = ("none", "skip_connect", "avg_pool_3x3", "max_pool_3x3")
    space = darts.SearchSpace(nodes=3, channels=2, cells=1, primitives=prims)
    rng = np.random.default_rng(0)
    for trial in range(5):
        alpha = {"normal": rng.normal(size=(9, 4)), "reduce": rng.normal(size=(9, 4))}
        alpha["normal"][:, 0] += 5.0 * (trial % 2)       # 'none' dominates: must be ignored
        g = darts.derive_genotype(alpha, space)
        assert g.normal == _brute_genotype_cell(alpha["normal"], 3, prims)
        assert g.reduce == _brute_genotype_cell(alpha["reduce"], 3, prims)
        assert all(op != "none" for op, _ in g.normal + g.reduce)
        assert g.normal_concat == (2, 3, 4)
    # a hand-made case: node 2 (edges 5..8) keeps inputs 1 and 3 with their strongest ops
    alpha = {"normal": np.zeros((9, 4)), "reduce": np.zeros((9, 4))}
    alpha["normal"][6, 2] = 3.0                          # edge 1 -> node 2: avg_pool
    alpha["normal"][8, 3] = 2.0                          # edge 3 -> node 2: max_pool
    alpha["normal"][5, 0] = 9.0                          # edge 0 -> node 2: only 'none' strong
    g = darts.derive_genotype(alpha, space)
    assert g.normal[4:6] == (("avg_pool_3x3", 1), ("max_pool_3x3", 3))
    assert darts.Genotype.from_json(json.loads(json.dumps(g.to_json()))) == g


def test_per_example_model_batch_independent_and_fixed_network(net):
    w = net.init_weights(jax.random.key(0))
    a = net.init_alphas(jax.random.key(1))
    assert a["normal"].shape == (2, 3) and float(jnp.abs(a["normal"]).max()) < 0.01
    x = jax.random.normal(jax.random.key(2), (3,) + SHAPE)
    batched = jax.jit(net.logits)(w, a, x)
    one = jax.jit(net.apply)
    for i in range(3):       # vmap over examples does not change the model (no batch norm)
        np.testing.assert_allclose(np.asarray(batched[i]), np.asarray(one(w, a, x[i])),
                                   rtol=1e-5, atol=1e-6)
    g = darts.random_genotype(0, 1, PRIMS)
    fixed = darts.fixed_network(g, SHAPE, CLASSES, channels=2, cells=1, stem_multiplier=1)
    p = fixed.init(jax.random.key(3))
    assert jax.jit(fixed.logits)(p, x).shape == (3, CLASSES)


# --------------------------------------------------------------------------- privacy pieces

def test_clipped_per_example_vectors_have_norm_at_most_r(net):
    w = net.init_weights(jax.random.key(0))
    a = net.init_alphas(jax.random.key(1))
    x = 10.0 * jax.random.normal(jax.random.key(2), (4,) + SHAPE)
    y = jnp.arange(4) % CLASSES
    grads = jax.jit(jax.vmap(jax.grad(lambda w_, xi, yi: steps.cross_entropy(
        net.apply(w_, a, xi), yi)), (None, 0, 0)))(w, x, y)
    # one compiled program for every clipped sum below (not op by op)
    clipped_norm = jax.jit(lambda g, wts, c: (lambda t, n: (optax.tree.norm(t), n))(
        *weighted_clipped_sum(g, wts, c)))
    r = 0.05
    for i in range(4):               # the clipped contribution of example i alone
        one_hot = jnp.zeros(4).at[i].set(1.0)
        clipped, norms = clipped_norm(grads, one_hot, r)
        assert float(norms[i]) > r                        # the test clips for real
        assert float(clipped) <= r * (1 + 1e-5)
    big = 1e6
    total, _ = clipped_norm(grads, jnp.ones(4), big)      # no clipping: the plain sum
    np.testing.assert_allclose(np.asarray(total),
                               np.asarray(optax.tree.norm(jax.tree.map(lambda g: g.sum(0),
                                                                       grads))), rtol=1e-5)


def test_noise_independent_across_parties_and_iterations():
    mech = steps.Mechanism(clip=1.0, noise=1.0)
    x = jnp.zeros((3, 4, 2))
    y = jnp.zeros((3, 4), jnp.int32)
    mask = jnp.zeros((3, 4), bool)                       # nothing sampled: output is the noise
    rate, denom = jnp.full((3,), 0.5), jnp.ones(3)

    def per_example(xi, yi):
        return jnp.zeros(500), jnp.zeros(())

    party = jax.jit(jax.vmap(lambda k, x_, y_, m_, r_, d_: steps.noisy_mean(
        k, per_example, x_, y_, m_, r_, d_, mech)[0]))
    draws = [party(jax.random.split(jax.random.fold_in(jax.random.key(0), t), 3), x, y, mask,
                   rate, denom) for t in range(2)]
    rows = np.concatenate([np.asarray(d) for d in draws])           # [6 = 2 iters x 3, 500]
    assert np.all(np.abs(rows.std(axis=1) - 1.0) < 0.15)
    corr = np.corrcoef(rows)
    assert np.max(np.abs(corr - np.eye(6))) < 0.2


def _data(k=2, n=6, batch=100):
    return dp_fnas.make_search_data(_parties(k, n), batch)


def test_vmapped_parties_equal_loop(net):
    h = _hyper(private=True, order="second", noise=0.5, clip=0.5)
    data = _data(batch=2)
    fv, fl = steps.make_search(net, h), steps.make_search(net, h, backend="loop")
    s0 = fv.init(jax.random.key(0))
    sv, mv = fv.step(s0, jax.random.key(1), data)
    sl, ml = fl.step(s0, jax.random.key(1), data)
    for a, b in zip(jax.tree.leaves((sv.w, sv.alpha)), jax.tree.leaves((sl.w, sl.alpha))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-6)
    assert float(mv["batch_train"]) == float(ml["batch_train"])


def test_second_order_gradient_matches_unrolled_objective(net):
    data = _data(k=2, n=6, batch=100)        # every record sampled (q = 1): exact gradients
    w = net.init_weights(jax.random.key(0))
    alpha = jax.tree.map(lambda a: 0.5 * jax.random.normal(jax.random.key(1), a.shape),
                         net.init_alphas(jax.random.key(1)))
    xi = 0.1

    def mean_loss(w_, a_, x, y):             # mean over parties of the party's mean loss
        per = jax.vmap(jax.vmap(lambda xi_, yi: steps.cross_entropy(net.apply(w_, a_, xi_), yi)))
        return jnp.mean(jnp.mean(per(x, y), axis=1))

    def unrolled(a_):                        # F(alpha) = L_val(w - xi grad_w L_trn(w, alpha))
        g = jax.grad(mean_loss)(w, a_, data.train.x, data.train.y)
        w_virtual = jax.tree.map(lambda p, gi: p - xi * gi, w, g)
        return mean_loss(w_virtual, a_, data.val.x, data.val.y)

    d = jax.tree.map(lambda a: jax.random.normal(jax.random.key(3), a.shape), alpha)
    step_size = 1e-2

    @jax.jit
    def reference(a_, d_):                   # every reference value in ONE compiled program
        exact_ = jax.grad(unrolled)(a_)
        f_plus_ = unrolled(jax.tree.map(lambda a, di: a + step_size * di, a_, d_))
        f_minus_ = unrolled(jax.tree.map(lambda a, di: a - step_size * di, a_, d_))
        # first order: grad_alpha L_val(W', alpha) with W' held fixed (no mixed term)
        g_trn = jax.grad(mean_loss)(w, a_, data.train.x, data.train.y)
        w_fixed = jax.tree.map(lambda p, gi: p - xi * gi, w, g_trn)
        h_first_ = jax.grad(mean_loss, argnums=1)(w_fixed, a_, data.val.x, data.val.y)
        return exact_, f_plus_, f_minus_, h_first_

    exact, f_plus, f_minus, h_first = reference(alpha, d)
    state = steps.SearchState(w=w, alpha=alpha, w_opt=None, a_opt=None, t=jnp.zeros((), int))
    hyp = dataclasses.replace(_hyper(private=False, order="second", method="jvp"), xi=xi)
    _, h_jvp, _ = steps.make_search(net, hyp).gradients(state, jax.random.key(2), data)
    for a, b in zip(jax.tree.leaves(h_jvp), jax.tree.leaves(exact)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-3, atol=1e-6)
    # a finite-difference check of F along a random direction
    fd = (f_plus - f_minus) / (2 * step_size)
    directional = sum(float(jnp.vdot(a, di)) for a, di in zip(jax.tree.leaves(h_jvp),
                                                              jax.tree.leaves(d)))
    assert abs(directional - float(fd)) <= 2e-3 * max(1.0, abs(float(fd)))
    # DARTS' finite-difference Hessian-vector product approximates the same gradient, and the
    # first-order gradient differs from it (the mixed term is not zero here)
    hyp_fd = dataclasses.replace(hyp, second_order_method="finite_difference")
    _, h_fd, _ = steps.make_search(net, hyp_fd).gradients(state, jax.random.key(2), data)
    diff = optax.tree.norm(jax.tree.map(jnp.subtract, h_fd, exact))
    assert float(diff) <= 1e-2 * float(optax.tree.norm(exact)) + 1e-6
    # first order (h_first: W' held fixed, no mixed term) is further from it
    gap = optax.tree.norm(jax.tree.map(jnp.subtract, h_first, exact))
    assert float(gap) > 10 * float(diff)


# --------------------------------------------------------------------------- accounting

def test_gdp_closed_form():
    # a Gaussian mechanism with noise multiplier s is exactly (1/s)-GDP: the closed form must
    # equal dp-accounting's (tight) PLD curve of GaussianDpEvent(s)
    from dp_accounting.pld import privacy_loss_mechanism
    for s in (0.8, 2.0):
        exact = privacy_loss_mechanism.GaussianPrivacyLoss(s, sensitivity=1.0)
        for eps in (0.5, 1.0, 3.0):
            assert privacy.gdp_delta(eps, 1.0 / s) == pytest.approx(
                exact.get_delta_for_epsilon(eps), rel=1e-6, abs=1e-12)
    mu = 0.7
    delta = privacy.gdp_delta(1.3, mu)
    assert abs(privacy.gdp_epsilon(mu, delta) - 1.3) < 1e-6
    q, t, sigma = 0.05, 400, 1.1
    assert privacy.paper_mu(q, t, sigma) == pytest.approx(q * math.sqrt(t * (math.exp(
        1 / sigma ** 2) - 1)))


def _sg(z, q, t):
    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), t)


def _direct(events, kind, delta):
    from fedjax_dp.privacy import DEFAULT_RDP_ORDERS
    acc = (dp_accounting.rdp.RdpAccountant(orders=list(DEFAULT_RDP_ORDERS)) if kind == "rdp"
           else dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4))
    for e in events:
        acc.compose(e)
    return acc.get_epsilon(delta)


@pytest.mark.parametrize("kind,rates,scale", [
    ("rdp", [(0.2, 0.25, 0.1), (0.4, 0.5, 0.2)], 1.0),   # party k: (train, val, retrain) rates
    ("pld", [(0.1, 0.1, 0.05)], 3.0)])       # noise x 3: a PLD of narrower support (cheaper)
def test_ledger_equals_direct_dp_accounting(kind, rates, scale):
    nw, na, ns, nr = 1.2 * scale, 1.0 * scale, 1.5 * scale, 1.3 * scale
    members = [privacy.record_events(rate_train=tr, rate_val=va, rate_retrain=re, iterations=6,
                                     retrain_iterations=4, noise_weights=nw, noise_arch=na,
                                     noise_second=ns, noise_retrain=nr)
               for tr, va, re in rates]
    books = privacy.ledgers(members)
    assert len(books) == (1 + len(rates) if len(rates) > 1 else 1)
    delta = 1e-5
    per_party = []
    for k, (tr, va, re) in enumerate(rates):
        train = _direct([_sg(nw, tr, 6), _sg(ns, tr, 6), _sg(nr, re, 4)], kind, delta)
        val = _direct([_sg(na, va, 6), _sg(nr, re, 4)], kind, delta)
        per_party.append(max(train, val))
        if len(books) > 1:
            assert books[1 + k].epsilon(f"instance (party {k})", delta, kind) == \
            pytest.approx(per_party[-1], rel=1e-6)
    assert books[0].epsilon("instance", delta, kind) == pytest.approx(max(per_party), rel=1e-6)
    # first order: no second-order event on the training records
    train_ev, _ = privacy.record_events(rate_train=0.2, rate_val=0.2, rate_retrain=0.1,
                                        iterations=6, retrain_iterations=0, noise_weights=1.2,
                                        noise_arch=1.0, noise_second=None, noise_retrain=1.3)
    assert train_ev == _sg(1.2, 0.2, 6)


def test_chunked_sampled_rows_equal_masked_sum():
    x = jax.random.normal(jax.random.key(0), (21, 3))
    y = jnp.zeros(21, jnp.int32)
    mask = jnp.arange(21) < 19
    mech = steps.Mechanism(clip=0.7, noise=0.0)

    def per_example(xi, yi):
        return {"a": xi * 2.0, "b": jnp.sum(xi) ** 2}, jnp.sum(xi)

    key = jax.random.key(5)
    got, metrics = jax.jit(lambda k: steps.noisy_mean(k, per_example, x, y, mask, 0.5, 2.0,
                                                      mech, chunk=4))(key)

    @jax.jit
    def reference(k):                        # the masked sum, in one compiled program
        sampled_ = jax.random.bernoulli(jax.random.split(k)[0], 0.5, (21,)) & mask
        vals, _ = jax.vmap(per_example)(x, y)
        return weighted_clipped_sum(vals, sampled_.astype(jnp.float32), 0.7)[0], sampled_

    want, sampled = reference(key)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b) / 2.0, rtol=1e-5, atol=1e-6)
    assert float(metrics["batch"]) == float(jnp.sum(sampled)) > 4     # several chunks ran



def test_one_party_path_equals_the_vmapped_one():
    """``over_parties`` calls the party function directly when K = 1 (a size-1 vmapped program
    crashes XLA's CPU runtime): same values as ``vmap`` (keys, mapped and broadcast arguments,
    noisy_mean's sampled-rows loop)."""
    parties = 1
    x = jax.random.normal(jax.random.key(1), (parties, 9, 3))
    y = jnp.zeros((parties, 9), jnp.int32)
    mask = jnp.ones((parties, 9), bool)
    mech = steps.Mechanism(clip=0.7, noise=1.0)

    def party(key, scale, xk, yk, mk):
        return steps.noisy_mean(key, lambda xi, yi: ({"a": xi * scale}, jnp.sum(xi)), xk, yk,
                                mk, 0.5, 2.0, mech, chunk=4)

    keys = jax.random.split(jax.random.key(2), parties)
    axes = (0, None, 0, 0, 0)
    got = jax.jit(steps.over_parties(party, axes, chunk_size=None, backend="vmap"))(
        keys, 2.0, x, y, mask)
    want = jax.jit(jax.vmap(party, axes))(keys, 2.0, x, y, mask)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert a.shape == b.shape and a.shape[0] == parties
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("field,value,name", [
    ("nodes", 0, "algorithm.nodes"), ("channels", 0, "algorithm.channels"),
    ("primitives", ["sep_conv_3x3", "conv_7x7"], "algorithm.primitives"),
    ("clip_weights", 0.0, "algorithm.clip_weights"), ("clip_arch", -1.0, "algorithm.clip_arch"),
    ("noise_weights", -0.1, "algorithm.noise_weights"),
    ("noise_arch", -1.0, "algorithm.noise_arch"), ("cells", 0, "algorithm.cells"),
    ("fixed_genotype", "{}", "algorithm.fixed_genotype")])
def test_bad_config_names_the_parameter(field, value, name):
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):
        dp_fnas.Config(**{field: value})


def test_too_many_parties_fails_before_work():
    with pytest.raises(ValueError, match="data.num_agents"):
        dp_fnas.check_parties(np.array([5, 1, 4]))
    cfg = config_lib.resolve({"data": {"dataset": "digits", "num_agents": 2000},
                              "algorithm": {"name": "dp_fnas"}})
    with pytest.raises(ValueError, match="num_agents"):
        runner.run(cfg, progress=False)


# --------------------------------------------------------------------------- protocol, CLI

@pytest.fixture(scope="module")
def cli_result(tmp_path_factory):
    out = tmp_path_factory.mktemp("fnas")
    cfg = config_lib.resolve({
        "data": {"dataset": "digits", "num_agents": 2, "image_size": 4},
        "algorithm": {"name": "dp_fnas", "nodes": 1, "channels": 2, "cells": 1,
                      "primitives": ["none", "skip_connect"], "stem_multiplier": 1,
                      "search_epochs": 1,
                      "batch_size": 128, "retrain_epochs": 1, "retrain_batch_size": 256,
                      # large noise: PLDs of narrow support, quick to account
                      "noise_weights": 3.0, "noise_arch": 3.0, "noise_retrain": 3.0},
        "run": {"progress": False}})
    rec = progress_lib.RecordingProgress()          # what a terminal's bars would show
    real = runner.progress_lib.bar
    runner.progress_lib.bar = lambda enabled=True: rec
    try:
        return runner.run(cfg, out), out, rec
    finally:
        runner.progress_lib.bar = real


def test_search_and_retrain_report_progress(cli_result):
    """Compilations, each epoch's iterations (finished ones, all of them) and the runner's bar
    over the steps; the line per step names the phase."""
    result, _, rec = cli_result
    iters = result["search_iterations"], result["retrain_iterations"]        # one epoch each
    assert [(t["name"], t["total"], t["unit"], t["done"]) for t in rec.tasks] == [
        ("dp_fnas", 2, "round", 2), ("compile search step", 1, "step", 1),
        ("search", iters[0], "iteration", iters[0]), ("compile retrain step", 1, "step", 1),
        ("retrain", iters[1], "iteration", iters[1])]
    cfg = dp_fnas.Config(search_epochs=2, retrain_epochs=3)
    assert [dp_fnas.step_label(cfg, t) for t in (1, 2, 3, 5)] == [
        "search epoch 1/2", "search epoch 2/2", "retrain epoch 1/3", "retrain epoch 3/3"]


def test_cli_run_writes_genotype_times_and_privacy(cli_result):
    result, out, _ = cli_result
    assert 0.0 <= result["test_accuracy"] <= 1.0
    geno = darts.Genotype.from_json(json.loads((out / "genotype.json").read_text()))
    assert geno.to_json() == result["genotype"]
    assert (out / "genotype.png").stat().st_size > 0
    assert result["search_time_s"] > 0 and result["retrain_time_s"] > 0
    # one sampling rate for all parties: identical events, one ledger covers every party
    assert {row["unit"] for row in result["privacy"]} == {"instance"}
    worst = {row["accountant"]: row["epsilon"] for row in result["privacy"]}
    assert 0 < worst["pld"] <= worst["rdp"] + 1e-9
    gdp = result["paper_gdp"]
    assert len(gdp["per_party"]) == 2 and gdp["worst_epsilon"] > 0
    assert [r["phase"] for r in result["history"]] == [0, 1]
