"""Bench part: the kNN-DPFL MPC vote vs the matmul.

N agents x n local points x Q queries x d features, C = 10 classes, k neighbours: the full vote
of :func:`fedjax_dp.privacy.vote.noisy_tally` with the kNN ballots of
:func:`fedjax_dp.algorithms.voting.knn_dpfl.ballot_fn` (the library's default kNN method;
distances, per-agent top-k, label counts, every agent's Gaussian noise per query, the secure sum)
and its argmax (what ``mpc_vote`` releases), one compiled call, agents in chunks of
``agent_chunk`` (0: none).

Achieved GFLOP/s counts the distance GEMM only, ``2 Q d N n`` FLOPs; the suite divides it by the
same run's matmul GFLOP/s (``vote_fraction_of_matmul``: the share of the device's dense-matmul
speed the whole vote reaches).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_dp.bench import common

NAME = "knn_vote"
TITLE = "the kNN MPC vote vs the matmul"


def measure(sizes: dict, repeats: int) -> dict:
    from fedjax_dp.algorithms.voting import knn_dpfl
    from fedjax_dp.privacy import vote

    n_agents, n, q, d, k, c = (sizes["agents"], sizes["local_size"], sizes["queries"],
                               sizes["features"], sizes["k"], 10)
    chunk = sizes.get("agent_chunk") or None
    kx, ky, kq = jax.random.split(jax.random.key(0), 3)
    agents = (jax.random.normal(kx, (n_agents, n, d), jnp.float32),        # x [N, n, d]
              jax.random.randint(ky, (n_agents, n), 0, c),                 # y [N, n]
              jnp.ones((n_agents, n), bool))                               # mask [N, n]
    queries = jax.random.normal(kq, (q, d), jnp.float32)                   # [Q, d]
    fn = knn_dpfl.ballot_fn(k, c)
    release = jax.jit(lambda key, ag, qs: jnp.argmax(vote.noisy_tally(
        key, ag, qs, jnp.float32(1.0), ballot_fn=fn, num_classes=c, agent_chunk=chunk,
        query_chunk=None, noisy=True), axis=-1).astype(jnp.int32))
    key = jax.random.key(1)
    times = {"vote": common.time_fn(lambda: release(key, agents, queries), repeats)}
    gemm = 2.0 * q * d * n_agents * n
    return {"name": NAME, "title": TITLE, "sizes": {**sizes, "classes": c,
                                                      "gemm_gflop": gemm / 1e9},
            "times": times, "pairs": {}, "flops": {"vote": gemm},
            "gflops": {"vote": gemm / times["vote"]["median_s"] / 1e9}}
