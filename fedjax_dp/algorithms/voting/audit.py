"""Audit harness of the voting family: the AE-DPFL / kNN-DPFL noisy vote sum, one query.

Registers ``gaussian-vote`` with :mod:`fedjax_dp.audit.harness` (what an :class:`Auditable` is
and how it is run) when the family is imported.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.audit.harness import (Auditable, ParameterError, Spec, check_accountant, register,
                                     unit_vector)
from fedjax_dp.core import validation
from fedjax_dp.privacy import vote

__all__ = ["stored_ballots", "gaussian_vote_harness"]


def stored_ballots(agents: jax.Array, queries: jax.Array) -> jax.Array:
    """Ballot function of the audit: agent i's stored ballot ``agents[i] [C]`` for every query:
    ``[a, q, C]`` (module-level, so hashable and compiled once)."""
    return jnp.broadcast_to(agents[:, None, :], (agents.shape[0], queries.shape[0],
                                                  agents.shape[1]))


def gaussian_vote_harness(weaken, *, sigma, unit, ballot, k, num_agents, num_classes, noise,
                          accountant) -> Auditable:
    """AE-DPFL / kNN-DPFL noisy vote sum (voting-dpfl Alg. 2-3, Thm 5), one query.

    Neighbours: ``agent``: agent 0 (one-hot vote for class 1) present vs removed;
    ``instance`` + ``one_hot``: agent 0's vote moves from class 0 to class 1;
    ``instance`` + ``neighbour_counts``: one of agent 0's k neighbours changes label 0 -> 1
    (its ballot moves by 1/k in two coordinates, sensitivity sqrt(2)/k). The tally is
    :func:`fedjax_dp.privacy.vote.noisy_tally` (every agent's own noise share, or the aggregate
    noise), the statistic its projection on the change (the score difference of the two
    classes that change, scaled by 1/sqrt(2); the changed class's score at agent level).
    Claimed: :func:`fedjax_dp.privacy.vote.vote_ledger` of one release, sensitivity
    :func:`fedjax_dp.privacy.vote.vote_sensitivity`.
    """
    validation.check_choice("unit", unit, tuple(vote.RELATIONS))
    validation.check_choice("ballot", ballot, vote.BALLOTS)
    validation.check_choice("noise", noise, vote.NOISE_MODES)
    n = validation.check_int("num_agents", num_agents, minimum=2)
    c = validation.check_int("num_classes", num_classes, minimum=2)
    sigma = validation.check_positive("sigma", sigma, finite=True)
    check_accountant(accountant)
    if ballot == "neighbour_counts":
        k = validation.check_int("k", 4 if k is None else k, minimum=1)
    elif k is not None:
        raise ParameterError("k", f"applies to ballot='neighbour_counts' only (ballot={ballot!r}), "
                                  f"got k={k!r}")
    sens = vote.vote_sensitivity(unit, ballot, k)
    # Fixed ballots: agent i votes class i mod C (one-hot) / k neighbours spread over classes.
    base = np.zeros((n, c), np.float32)
    for i in range(n):
        if ballot == "one_hot":
            base[i, i % c] = 1.0
        else:
            base[i, i % c] += (k - k // 2) / k
            base[i, (i + 1) % c] += (k // 2) / k
    d, dp = base.copy(), base.copy()
    if unit == "agent":
        d[0] = 0.0
        d[0, 1] = 1.0                                             # agent 0: class 1
        dp[0] = 0.0          # agent 0 removed: its ballot is gone; the tally's noise is
        #                      N(0, sigma^2 I) either way (n shares of sigma^2/n, or n - 1 of
        #                      sigma^2/(n - 1)), so a zero ballot gives the removed world's
        #                      exact distribution with one shape (one compilation)
    elif ballot == "one_hot":
        d[0] = np.eye(c, dtype=np.float32)[1]
        dp[0] = np.eye(c, dtype=np.float32)[0]
    else:
        dp[0] = 0.0
        dp[0, 0] = 1.0                                            # all k neighbours class 0
        d[0] = dp[0]
        d[0, 0] -= 1.0 / k
        d[0, 1] += 1.0 / k                                        # one neighbour -> class 1
    run_sigma = sigma / 2 if weaken == "halve-noise" else sigma
    queries = jnp.zeros((1, 1), jnp.float32)
    worlds = {False: jnp.asarray(d), True: jnp.asarray(dp)}
    kw = dict(ballot_fn=stored_ballots, num_classes=c, agent_chunk=None, query_chunk=None)
    # The noise-free tallies are the ballot sums; they differ by agent 0's change, whose norm is
    # the stated sensitivity (checked: the pair is worst case).
    change = d.sum(0) - dp.sum(0)                                 # [C]
    if abs(float(np.linalg.norm(change)) - sens) > 1e-5:
        raise AssertionError("audit input does not attain the stated sensitivity")
    u = jnp.asarray(unit_vector(change, "gaussian-vote"))

    def one(key, inputs):
        w = inputs
        tally = vote.noisy_tally(key, w["ballots"], w["queries"], w["sigma"], noisy=True,
                                 noise=noise, **kw)               # [1, C]
        return jnp.dot(tally[0], w["u"])

    inputs = {nb: {"ballots": a, "queries": queries, "u": u, "sigma": jnp.float32(run_sigma)}
              for nb, a in worlds.items()}

    def claimed(delta):
        ledger = vote.vote_ledger(sigma, 1, {unit: sens})
        return ledger.epsilon(unit, delta, accountant)

    params = dict(sigma=sigma, unit=unit, ballot=ballot, k=k, num_agents=n, num_classes=c,
                  noise=noise, accountant=accountant, sensitivity=sens)
    return Auditable("gaussian-vote", params, weaken, unit, vote.RELATIONS[unit], one, inputs,
                     claimed, structure=(n, c, noise))


register("gaussian-vote", Spec(
    "AE-DPFL / kNN-DPFL MPC vote sum (privacy/vote.py), one query",
    dict(sigma=3.7, unit="agent", ballot="one_hot", k=None, num_agents=4, num_classes=3,
         noise="per_agent", accountant="pld"),
    ("halve-noise",), gaussian_vote_harness,
    applies={"ballot": lambda weaken, p: None if p["unit"] == "instance" else
             "at unit='agent' agent 0's whole ballot is added or removed, a change of norm 1 "
             "whatever the ballot's form (give unit='instance')"}))
