"""Run under XLA_FLAGS=--xla_force_host_platform_device_count=8 (see test_sharding.py).

Checks that sharding the agent axis over 8 CPU devices gives the same results as one device, for
the lift primitive, local training of all agents, and a full FedAvg / DP-FedAvg round (whose sum
over agents becomes a cross-device reduction), the MPC vote, DP-FNAS (:func:`fnas_checks`),
AE-DPFL / kNN-DPFL with ``runtime.mesh`` (host- and device-resident agents,
:func:`voting_checks`), and -- from ``isrl_sharded_check.py``, in the same process so that JAX
starts once -- the ISRL-DP silo axis (SPIDER and SDP SPIDER). Prints one JSON line.
"""
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import chains  # noqa: E402
import isrl_sharded_check  # noqa: E402

from fedjax_dp.algorithms import api
from fedjax_dp.algorithms.fedkt import fedkt, learners as fedkt_learners, solo
from fedjax_dp.algorithms.voting import knn_dpfl
from fedjax_dp.core.cohort import Sampling
from fedjax_dp.core import (agent_mesh, agent_sum, for_each_agent, for_each_agent_sum,
                            from_ragged, shard_agents)
from fedjax_dp.models import make_model
from fedjax_dp.privacy import vote
from fedjax_dp.train import LocalTrainConfig, train_agents


def close(a, b, tol=1e-5):
    return all(np.allclose(x, y, rtol=tol, atol=tol) for x, y in
               zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def fnas_checks(mesh) -> dict:
    """DP-FNAS (11 parties: padded to 16 rows, 2 per device) with ``runtime.mesh``: one search
    epoch and one retraining epoch equal the run without a mesh (search state, genotype,
    retrained parameters, diagnostics history; private, so the parties' noise is the same); the
    parties' data is split over the 8 devices and ``agents_per_process`` counts all 11."""
    from fedjax_dp.algorithms import api
    from fedjax_dp.algorithms.fnas import dp_fnas, search_memo

    shape, classes = (4, 4, 1), 3
    cfg = dp_fnas.Config(nodes=1, channels=2, cells=1, primitives=("none", "skip_connect"),
                         stem_multiplier=1, search_epochs=1, batch_size=2, retrain_epochs=1,
                         retrain_batch_size=2, diagnostics=True)
    r = np.random.default_rng(3)
    sizes = [3, 5, 4, 6, 2, 5, 3, 4, 6, 5, 2]
    fed = api.FederatedData(agents=from_ragged(
        [r.normal(size=(n,) + shape).astype(np.float32) for n in sizes],
        [r.integers(0, classes, n) for n in sizes]), num_classes=classes)
    runs = {}
    for name, m in (("plain", None), ("mesh", mesh)):
        search_memo.clear()                  # each run computes its search (no replay)
        runs[name] = api.run(dp_fnas, jax.random.key(0), fed, None, cfg,
                             runtime=api.Runtime(mesh=m))
    plain, sharded = runs["plain"].state, runs["mesh"].state
    strip = lambda res: [{k: v for k, v in h.items() if not k.endswith("_s")}
                         for h in res.history]
    hist = all(a.keys() == b.keys() and all(np.isclose(a[k], b[k], rtol=1e-5, atol=1e-6)
                                            for k in a)
               for a, b in zip(strip(runs["plain"]), strip(runs["mesh"])))
    x = sharded.context.search_data.train.x
    split = (x.shape[0] == 16 and len(x.sharding.device_set) == 8
             and x.sharding.spec[0] == "agents"
             and np.array_equal(np.asarray(x)[:11], np.asarray(plain.context.search_data.train.x)))
    equal = (close(plain.values["search"], sharded.values["search"])
             and close(plain.values["retrain"].params, sharded.values["retrain"].params)
             and dp_fnas.genotype(plain) == dp_fnas.genotype(sharded)
             and len(runs["mesh"].history) == 2 and hist)
    return {"dp_fnas_sharded": bool(split and equal),
            "dp_fnas_agents_per_process": sharded.context.agents_per_process == (11,)}


def voting_checks(mesh, data) -> dict:
    """AE-DPFL (local training and vote) and kNN-DPFL (vote) with ``runtime.mesh`` over the 8
    devices, from host- and from device-resident agents (11: chunks of 5 rounded up to 8), equal
    the run without a mesh: ballots, clean vote sums, labels and metrics exactly, the trained
    parameters and losses to float tolerance; ``agents_per_process`` sums to N."""
    from fedjax_dp.algorithms import api
    from fedjax_dp.algorithms.voting import ae_dpfl
    model = make_model("logistic", (6,), 3)        # the smallest programs: compile-bound
    local = LocalTrainConfig(steps=2, batch_size=4, learning_rate=0.1)
    public = np.random.default_rng(1).normal(size=(9, 6)).astype(np.float32)
    n = data.num_agents
    ae = ae_dpfl.Config(sigma=0.5, num_queries=6, agent_chunk=5, data_dependent=True, local=local)
    knn = knn_dpfl.Config(k=2, sigma=0.5, num_queries=6, agent_chunk=5, data_dependent=True,
                          feature_map="identity", knn_method="top_k")

    def run(module, config, agents, m):
        fed = api.FederatedData(agents, 3, x_public=public)
        state = module.init(jax.random.key(4), fed, model, config,
                            api.Runtime(mesh=m, chunk_size=None))
        history = []
        for _ in module.PHASES[:-1]:                           # all but the student
            state, metrics = module.step(state)
            history.append(metrics)
        return {**state.values, "history": history}

    out = {}
    for name, module, config in (("ae_dpfl", ae_dpfl, ae), ("knn_dpfl", knn_dpfl, knn)):
        ref = run(module, config, data, None)       # device == host without a mesh: test_stream_*
        for where, agents in (("host", data.on_host()), ("device", data)):
            got = run(module, config, agents, mesh)
            ok = (all(np.array_equal(ref[k], got[k]) for k in ("labels", "clean_vote_sums"))
                  and ref["history"] == got["history"]              # agent_chunk: the config's
                  and ref["agents_per_process"].tolist() == [n]
                  and int(np.sum(got["agents_per_process"])) == n)
            if module is ae_dpfl:
                ok = ok and (np.array_equal(ref["agent_ballots"], got["agent_ballots"])
                             and close(ref["agent_losses"], got["agent_losses"])
                             and len(np.unique(ref["agent_ballots"])) > 1)
                if where == "device":                   # kept parameters, split over the mesh
                    ok = ok and close(ref["agent_params"], got["agent_params"])
            out[f"{name}_mesh_{where}"] = bool(ok)
    return out


def main():
    assert jax.device_count() == 8, jax.devices()
    mesh = agent_mesh()
    r = np.random.default_rng(0)
    sizes = [3, 5, 4, 6, 2, 5, 3, 4, 6, 5, 2]            # 11 agents: not a multiple of 8
    xs = [r.normal(size=(n, 6)).astype(np.float32) for n in sizes]
    ys = [r.integers(0, 3, size=n) for n in sizes]
    data = from_ragged(xs, ys)
    out = {}

    w = jnp.asarray(r.normal(size=(6, 4)), jnp.float32)
    fn = lambda x, m, w: (jnp.tanh(x @ w) * m[:, None]).sum(0)
    plain = for_each_agent(fn, (0, 0, None))(data.x, data.mask, w)
    sharded = jax.jit(for_each_agent(fn, (0, 0, None), mesh=mesh))(data.x, data.mask, w)
    both = jax.jit(for_each_agent(fn, (0, 0, None), mesh=mesh, chunk_size=1))(data.x, data.mask, w)
    out["lift"] = bool(close(plain, sharded) and close(plain, both))
    where = jnp.asarray(r.random(len(sizes)) < 0.7)
    want = jnp.sum(jnp.where(where[:, None], plain, 0.0), axis=0)
    summed = [jax.jit(lambda *a, c=c: for_each_agent_sum(fn, (0, 0, None), mesh=mesh,
                                                         chunk_size=c)(*a, where=where))(
        data.x, data.mask, w) for c in (None, 1)]
    out["lift_sum"] = bool(all(close(want, s) for s in summed))

    even = jax.tree.map(lambda l: l[:8], data)
    placed = shard_agents(even, mesh)
    out["placed_on_8"] = len(placed.x.sharding.device_set) == 8
    s_plain = agent_sum(jax.tree.map(lambda l: l.astype(jnp.float32), even.x))
    s_shard = jax.jit(agent_sum)(placed.x)
    out["agent_sum"] = bool(close(s_plain, s_shard))

    model = make_model("mlp", (6,), 3, hidden=(8,))
    params = model.init(jax.random.key(0))
    cfg = LocalTrainConfig(steps=3, batch_size=4, learning_rate=0.1)
    key = jax.random.key(1)
    p_plain, l_plain = train_agents(key, params, data, model, cfg)
    p_shard, l_shard = train_agents(key, params, data, model, cfg, mesh=mesh)
    out["train_agents"] = bool(close(p_plain, p_shard) and close(l_plain, l_shard))

    chain = chains.chain(model, cfg, sampling=Sampling("poisson", rate=0.5), server_lr=1.0,
                         clip_norm=0.5, noise_multiplier=0.2, denominator="expected")
    r_plain = chains.ParamsRunner(chain, data, cohort="masked")(key, params)
    r_shard = chains.ParamsRunner(chain, data, mesh=mesh, cohort="masked")(key, params)
    out["dp_fedavg_round"] = bool(close(r_plain, r_shard))
    # the gathered cohort sharded over the 8 devices (buckets padded to multiples of 8), from
    # device- and from host-resident agents, equals the single-device masked round
    sharded = chains.ParamsRunner(chain, data, mesh=mesh)
    streamed = chains.ParamsRunner(chain, data.on_host(), mesh=mesh)
    out["gathered_round_sharded"] = bool(close(sharded(key, params), r_plain)
                                         and close(streamed(key, params), r_plain)
                                         and all(b % 8 == 0 for b in sharded.plan.buckets))

    # the MPC vote with the agents split over 8 devices (11 agents: padded with invalid agents)
    kx = [r.normal(size=(n, 6)).astype(np.float32) for n in sizes]
    kdata = from_ragged(kx, ys)
    queries = jnp.asarray(r.normal(size=(7, 6)), jnp.float32)
    fn = knn_dpfl.ballot_fn(2, 3)
    agents = (kdata.x, kdata.y, kdata.mask)
    s_plain = vote.vote_sums(fn, agents, queries, num_classes=3)
    s_shard = vote.vote_sums(fn, agents, queries, num_classes=3, mesh=mesh, agent_chunk=1)
    l_plain = vote.mpc_vote(key, fn, agents, queries, 0.3, num_classes=3)
    l_shard = vote.mpc_vote(key, fn, agents, queries, 0.3, num_classes=3, mesh=mesh)
    # the noisy tallies themselves (inside the tallier boundary): each agent's noise is keyed by
    # its global index, so the sharded sum carries exactly the same noise
    tally = lambda m: jax.jit(lambda k, a, q: vote.noisy_tally(
        k, a, q, 0.3, ballot_fn=fn, num_classes=3, agent_chunk=None, query_chunk=None,
        noisy=True, mesh=m))(key, agents, queries)
    agg = lambda m: vote.mpc_vote(key, fn, agents, queries, 0.3, num_classes=3, mesh=m,
                                  noise="aggregate")
    out["knn_vote"] = bool(np.allclose(s_plain, s_shard, atol=1e-5)
                           and np.array_equal(l_plain, l_shard)
                           and np.allclose(tally(None), tally(mesh), atol=1e-5)
                           and not np.allclose(tally(None), s_plain, atol=1e-2)
                           and np.array_equal(agg(None), agg(mesh))
                           and np.array_equal(vote.mpc_vote_and_sums(
                               key, fn, agents, queries, 0.3, num_classes=3, mesh=mesh)[0],
                               agg(None)))
    out.update(fnas_checks(mesh))
    out.update(voting_checks(mesh, data))
    out.update(isrl_sharded_check.checks())
    out.update(fedkt_checks(mesh))
    print(json.dumps(out))
    return 0 if all(out.values()) else 1


FEDKT_FIELDS = ("teacher_votes", "z", "party_labels", "student_preds", "server_votes",
                "server_labels", "server_mask")


def fedkt_run(parties, public, level, mesh, party_chunk=None):
    """A tiny FedKT run (11 parties x 2 partitions x 2 teachers, logistic learners): its state."""
    learner = fedkt_learners.JaxLearner(make_model("logistic", (6,), 3),
                                        LocalTrainConfig(steps=3, batch_size=4), chunk_size=None)
    cfg = fedkt.Config(num_partitions=2, num_teachers=2, level=level, gamma=0.5,
                       party_chunk=party_chunk, local=learner.train)
    data = api.FederatedData(agents=parties, num_classes=3, x_public=public)
    runtime = api.Runtime(mesh=mesh, chunk_size=None)
    state = fedkt.init(jax.random.key(3), data, learner.model, cfg, runtime, teacher=learner,
                       student=learner, final=learner)
    return api.run(fedkt, jax.random.key(3), data, learner.model, cfg, runtime=runtime,
                   state=state).state


def fedkt_same(got, ref, x_test, y_test, kept=()):
    """The mesh run ``got`` equals the single-device ``ref``: votes, labels and predictions
    exactly, the final (and ``kept``) parameters and the test accuracy to float tolerance; every
    party trained once (agents_per_process sums to n)."""
    n = ref.context.data.num_agents
    acc = lambda st: np.mean(fedkt.output(st).predict_labels(x_test) == y_test)  # noqa: E731
    return bool(all(np.array_equal(got.values[f], ref.values[f]) for f in FEDKT_FIELDS)
                and all(close(fedkt.fitted(got, m), fedkt.fitted(ref, m))
                        for m in ("final",) + tuple(kept))
                and abs(acc(got) - acc(ref)) < 1e-6
                and int(np.sum(got.values["agents_per_process"])) == n
                and int(np.sum(got.values["student_agents_per_process"])) == n)


def fedkt_checks(mesh):
    """FedKT with the parties split over the 8 devices (11 parties: chunks padded to 8 / 16)
    equals FedKT without a mesh: L0 from host-resident parties streamed in chunks of 5 (8 on
    the mesh: 2 chunks), L2 (noisy party labels keyed by the global party index) from
    device-resident parties in one chunk (16 on the mesh; the kept teachers / students
    compared)."""
    r = np.random.default_rng(7)
    sizes = [4, 6, 5, 3, 6, 4, 5, 2, 6, 3, 5]
    w = r.normal(size=(6, 3))
    xs = [r.normal(size=(n, 6)).astype(np.float32) for n in sizes]
    parties = from_ragged(xs, [np.argmax(x @ w, 1) for x in xs])
    public = r.normal(size=(10, 6)).astype(np.float32)
    x_test = r.normal(size=(20, 6)).astype(np.float32)
    y_test = np.argmax(x_test @ w, 1)
    host = parties.on_host()
    out = {}
    ref = fedkt_run(parties, public, "L0", None)
    out["fedkt_l0_host_sharded"] = fedkt_same(fedkt_run(host, public, "L0", mesh, 5), ref,
                                              x_test, y_test)
    ref = fedkt_run(parties, public, "L2", None)
    out["fedkt_l2_device_sharded"] = fedkt_same(fedkt_run(parties, public, "L2", mesh), ref,
                                                x_test, y_test, kept=("teachers", "students"))
    out["fedkt_solo_host_sharded"] = fedkt_solo_same(host, mesh, x_test, y_test)
    return out


def fedkt_solo_same(parties, mesh, x_test, y_test):
    """SOLO (every party's own model) with the host-resident parties split over the mesh equals
    SOLO without one: the n models to float tolerance, the mean accuracy, every party once."""
    model = make_model("logistic", (6,), 3)
    cfg = solo.Config(local=LocalTrainConfig(steps=3, batch_size=4))
    data = api.FederatedData(agents=parties, num_classes=3)
    runs = [api.run(solo, jax.random.key(4), data, model, cfg,
                    runtime=api.Runtime(mesh=m, chunk_size=None)).state for m in (None, mesh)]
    acc = [solo.output(st).score(x_test, y_test) for st in runs]
    return bool(close(*(solo.fitted(st) for st in runs)) and abs(acc[0] - acc[1]) < 1e-6
                and int(np.sum(runs[1].values["agents_per_process"])) == parties.num_agents)


if __name__ == "__main__":
    sys.exit(main())
