"""Bench part: the kNN-DPFL MPC vote vs the matmul, and vs its own distance GEMM (docs/bench.md).

N agents x n local points x Q queries x d features, C = 10 classes, k neighbours. Timed in the
same run:

* ``vote``: :func:`fedjax_dp.privacy.vote.noisy_tally` with the ballots of
  :func:`fedjax_dp.algorithms.voting.knn_dpfl.ballot_fn` (the device's default kNN method) and
  its argmax, one compiled call, agents in chunks of ``agent_chunk`` (0: none);
* ``distances``: the scores alone, one augmented GEMM per block of
  :func:`fedjax_dp.ops.knn_search.block_sizes`, each block reduced with a min (no dead code);
* on an accelerator only, ``vote_<other>``: the vote with the other exact kNN method.

GFLOP/s counts the distance GEMM only, ``2 Q d N n`` FLOPs.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from fedjax_dp.bench import common
from fedjax_dp.core.lift import chunked, pad_rows

NAME = "knn_vote"
TITLE = "the kNN MPC vote vs the matmul"


def _distances_fn(n_agents: int, n: int, q: int):
    """``(x [N, n, d], mask [N, n], queries [Q, d]) -> [N / ab, Q / qb, ab, qb]``: every block's
    augmented scores GEMM, reduced with a min over the records."""
    from fedjax_dp.ops import knn_search

    ab_t, qb_t = knn_search.block_sizes(n_agents, n, q)
    ab = knn_search.agent_block_size(n_agents, ab_t)
    qb = knn_search.query_block_size(q, qb_t)

    def distances(x, mask, queries):
        qblocks = chunked(knn_search.augment_queries(pad_rows(queries, qb)), qb)

        def per_agent_block(blk):
            xa = knn_search.augment_records(*blk)                             # [ab, n, d+1]
            return lax.map(lambda qa: jnp.min(knn_search.augmented_scores(xa, qa), axis=1),
                           qblocks)
        return lax.map(per_agent_block, chunked((x, mask), ab))
    return distances


def workload(n_agents: int, n: int, q: int, d: int, c: int = 10):
    """The agents ``(x [N, n, d], y [N, n] in [0, c), mask [N, n])`` and the queries ``[Q, d]``."""
    kx, ky, kq = jax.random.split(jax.random.key(0), 3)
    agents = (jax.random.normal(kx, (n_agents, n, d), jnp.float32),
              jax.random.randint(ky, (n_agents, n), 0, c), jnp.ones((n_agents, n), bool))
    return agents, jax.random.normal(kq, (q, d), jnp.float32)


def release_fn(k: int, c: int, method: str, chunk: int | None, **options):
    """What ``mpc_vote`` releases, jitted: the argmax of the noisy kNN tally (``options``: more
    arguments of :func:`fedjax_dp.privacy.vote.noisy_tally`, e.g. ``mesh``, ``noise``)."""
    from fedjax_dp.algorithms.voting import knn_dpfl
    from fedjax_dp.privacy import vote
    fn = knn_dpfl.ballot_fn(k, c, method)
    return jax.jit(lambda key, ag, qs: jnp.argmax(vote.noisy_tally(
        key, ag, qs, jnp.float32(1.0), ballot_fn=fn, num_classes=c, agent_chunk=chunk,
        query_chunk=None, noisy=True, **options), axis=-1).astype(jnp.int32))


def measure(sizes: dict, repeats: int) -> dict:
    from fedjax_dp.algorithms.voting import knn_dpfl
    from fedjax_dp.core import defaults as defaults_lib

    n_agents, n, q, d, k, c = (sizes["agents"], sizes["local_size"], sizes["queries"],
                               sizes["features"], sizes["k"], 10)
    chunk = sizes.get("agent_chunk") or None
    agents, queries = workload(n_agents, n, q, d, c)
    key = jax.random.key(1)
    default = knn_dpfl.resolve_method("auto")
    release = release_fn(k, c, default, chunk)
    dist = jax.jit(_distances_fn(n_agents, n, q))
    times = {"vote": common.time_fn(lambda: release(key, agents, queries), repeats),
             "distances": common.time_fn(lambda: dist(agents[0], agents[2], queries), repeats)}
    pairs = {"vote_over_distances": ("vote", "distances")}
    if defaults_lib.defaults().accelerator:
        other = "top_k" if default == "threshold" else "threshold"
        release_other = release_fn(k, c, other, chunk)
        times[f"vote_{other}"] = common.time_fn(lambda: release_other(key, agents, queries),
                                                repeats)
        pairs[f"{other}_over_{default}"] = (f"vote_{other}", "vote")
    gemm = 2.0 * q * d * n_agents * n
    return {"name": NAME, "title": TITLE,
            "sizes": {**sizes, "classes": c, "method": default, "gemm_gflop": gemm / 1e9},
            "times": times, "pairs": pairs, "flops": {"vote": gemm, "distances": gemm},
            "gflops": {"vote": gemm / times["vote"]["median_s"] / 1e9,
                       "distances": gemm / times["distances"]["median_s"] / 1e9}}
