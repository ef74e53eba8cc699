"""Audit harnesses of the averaging family: one DP-FedSGD step, one DP-FedAvg round.

Registers ``dp-sgd-step`` and ``dp-fedavg-round`` with :mod:`fedjax_dp.audit.harness` (what an
:class:`Auditable` is and how it is run) when the family is imported.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.algorithms import rounds
from fedjax_dp.algorithms.round_parts import make_round_parts
from fedjax_dp.algorithms.averaging import dp_fedavg, dp_fedsgd, fedavg
from fedjax_dp.audit.harness import (Auditable, Spec, canary_projection, canary_worlds,
                                     check_gaussian_params, flat, register, unit_vector)
from fedjax_dp.core import cohort as cohort_lib
from fedjax_dp.core import from_arrays, validation
from fedjax_dp.models import make_model
from fedjax_dp.stages import Chain, Setup, aggregation, clipping, noise, participation, updates
from fedjax_dp.train import LocalTrainConfig, cross_entropy

__all__ = ["logistic", "canary_examples", "dp_sgd_step_harness", "dp_fedavg_round_harness"]


@functools.lru_cache(maxsize=4)
def logistic(features: int, classes: int):
    """``(model, params)``: the logistic model of the audits at zero parameters (shapes from
    ``jax.eval_shape``: no eager flax work)."""
    model = make_model("logistic", (features,), classes)
    shapes = jax.eval_shape(model.init, jax.random.key(0))       # no eager flax work
    params = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), shapes)
    return model, params


def canary_examples(num: int, scale: float, clip: float) -> tuple[np.ndarray, np.ndarray]:
    """``x [num, 2]``, ``y [num]``: row 0 the canary (feature ``2 sqrt(2) scale clip`` on axis 0,
    so its cross-entropy gradient at zero parameters has norm ``>= scale * clip``), the others
    small fixed examples."""
    x = np.zeros((num, 2), np.float32)
    y = np.zeros((num,), np.int32)
    x[0, 0] = 2.0 * math.sqrt(2.0) * scale * clip
    y[0] = 1
    for i in range(1, num):
        x[i] = (0.1 * ((i % 3) - 1), 0.1)
        y[i] = i % 2
    return x, y


def dp_sgd_step_harness(weaken, *, noise_multiplier, clip_norm, num_examples, canary_scale,
                        accountant) -> Auditable:
    """One DP-FedSGD step of one agent (eq. (1) of :mod:`.dp_fedsgd`):
    :func:`dp_fedsgd.sample_records` (rate 1) then :func:`dp_fedsgd.noisy_gradient` (per-example
    clip to C, ``N(0, (z C)^2)``, divided by the fixed ``p n``) on a logistic model at zero
    parameters. Neighbours: the canary example (gradient norm ``>= canary_scale * C``) present
    vs removed (mask 0). Statistic: the noisy gradient's projection on the canary's clipped
    gradient. Claimed: :func:`dp_fedsgd.instance_ledger` of one round of one step with record
    sampling rate 1.
    """
    z, clip, scale = check_gaussian_params(noise_multiplier, clip_norm, canary_scale, accountant)
    n = validation.check_int("num_examples", num_examples, minimum=1)
    model, params = logistic(2, 2)
    loss_fn = cross_entropy(model)
    x, y = canary_examples(n, scale, clip)
    x, y = jnp.asarray(x), jnp.asarray(y)
    worlds = canary_worlds(n)
    run_clip = math.inf if weaken == "no-clip" else clip
    std = z * clip / (2 if weaken == "halve-noise" else 1)
    denominator = float(n)                                        # p n with p = 1: public

    def release(key, w):
        k_batch, k_noise = jax.random.split(key)                  # as make_local_dp_sgd
        weights = dp_fedsgd.sample_records(k_batch, w["mask"], 1.0)          # [n]
        g, _ = dp_fedsgd.noisy_gradient(k_noise, loss_fn, w["params"], w["x"], w["y"], weights,
                                        w["clip"], w["std"], denominator)
        return flat(g)

    inputs = {nb: {"mask": m, "params": params, "x": x, "y": y, "clip": jnp.float32(run_clip),
                   "std": jnp.float32(std)} for nb, m in worlds.items()}

    one = canary_projection(loss_fn, release)

    def claimed(delta):
        cfg = dp_fedsgd.Config(rounds=1, clip_norm=clip, noise_multiplier=z,
                               record_sampling_rate=1.0,
                               local=LocalTrainConfig(steps=1, batch_size=n))
        return dp_fedsgd.instance_ledger(cfg, np.asarray([n])).epsilon(dp_fedsgd.UNIT, delta,
                                                                       accountant)

    params_out = dict(noise_multiplier=z, clip_norm=clip, num_examples=n, canary_scale=scale,
                      accountant=accountant, record_sampling_rate=1.0)
    return Auditable("dp-sgd-step", params_out, weaken, dp_fedsgd.UNIT, dp_fedsgd.RELATION,
                     one, inputs, claimed, structure=(n,))


def dp_fedavg_round_harness(weaken, *, noise_multiplier, clip_norm, num_agents, canary_scale,
                            accountant) -> Auditable:
    """One DP-FedAvg round (:mod:`.dp_fedavg`; voting-dpfl Alg. 1) through the library's round
    parts (:func:`~fedjax_dp.algorithms.round_parts.make_round_parts` of its chain), sampling
    rate 1: the Gaussian mechanism on the
    clipped update sum, claimed by ``dp_fedavg.ledger`` with ``sampling_rate = 1``. Each agent has
    one record and one local step (deterministic updates); agent 0 is the canary (update norm
    ``>= canary_scale * S``), present vs absent (its ``valid`` flag, how the library drops an
    agent from a round; the denominator ``q N`` is a public constant in both worlds).
    Statistic: the new model's projection on the canary's clipped update.
    """
    z, clip, scale = check_gaussian_params(noise_multiplier, clip_norm, canary_scale, accountant)
    n = validation.check_int("num_agents", num_agents, minimum=1)
    model, params = logistic(2, 2)
    x, y = canary_examples(n, scale, clip)
    data = jax.tree.map(jnp.asarray, from_arrays(x[:, None], y[:, None], np.ones(n, np.int64)))
    local = LocalTrainConfig(steps=1, batch_size=1, learning_rate=1.0)
    z_used = z / (2 if weaken == "halve-noise" else 1)
    std = z_used * clip

    def chain_of(multiplier: float) -> Chain:
        return Chain(participation=participation.Poisson(1.0),
                     client_update=rounds.local_steps(model, local),
                     clipping=(clipping.NoClip() if weaken == "no-clip"
                               else clipping.FixedClip(norm=clip)),
                     aggregation=aggregation.PlainSum(),
                     noise=noise.GaussianNoise(multiplier=multiplier, sensitivity=clip),
                     server_update=updates.PlainStep(1.0, denominator="expected"))

    setup = Setup(n, 1)
    server = make_round_parts(chain_of(z_used), setup)[1]
    # train_sum does not read the noise: the noise-free chain's compiles once for every level
    train_sum = make_round_parts(chain_of(0.0), setup)[0]
    view = lambda p: {"params": p, "stages": ((), (), (), (), (), ())}  # noqa: E731
    ids = jnp.arange(n)
    worlds = canary_worlds(n)
    # The agents' part of the round once per world (one record each, batch_size = 1: the same
    # update for every training key); the trials run the server's part with their own k_noise.
    _, k_train, _ = fedavg.round_keys(jax.random.key(0))
    sums = {nb: train_sum(k_train, view(params), data, None, ids, v, {})
            for nb, v in worlds.items()}
    if weaken != "no-clip" and abs(float(jnp.linalg.norm(flat(sums[False][0])
                                                          - flat(sums[True][0]))) - clip) > 1e-4:
        raise AssertionError("audit input does not attain the clip norm")

    def release(key, w):
        _, _, k_noise = fedavg.round_keys(key)
        new, _ = server(k_noise, view(w["params"]), w["sums"])
        return flat(new["params"]) - flat(w["params"])

    u = jnp.asarray(unit_vector(np.asarray(flat(sums[False][0]) - flat(sums[True][0])),
                                "dp-fedavg-round"))
    inputs = {nb: {"params": params, "sums": sm, "u": u} for nb, sm in sums.items()}

    def one(key, inputs):
        w = inputs
        return jnp.dot(release(key, w), w["u"])

    def claimed(delta):
        cfg = dp_fedavg.Config(rounds=1, sampling_rate=1.0, clip_norm=clip, noise_multiplier=z,
                               local=local)
        return dp_fedavg.ledger(cfg).epsilon("agent", delta, accountant)

    params_out = dict(noise_multiplier=z, clip_norm=clip, num_agents=n, canary_scale=scale,
                      accountant=accountant, sampling_rate=1.0)
    return Auditable("dp-fedavg-round", params_out, weaken, "agent", dp_fedavg.RELATION,
                     one, inputs, claimed,
                     structure=(n, None if weaken == "no-clip" else clip, std))


register("dp-sgd-step", Spec(
    "one DP-FedSGD step (dp_fedsgd.noisy_gradient), canary example present/absent",
    dict(noise_multiplier=3.7, clip_norm=1.0, num_examples=4, canary_scale=100.0,
         accountant="pld"),
    ("halve-noise", "no-clip"), dp_sgd_step_harness))
register("dp-fedavg-round", Spec(
    "one DP-FedAvg round (round_parts.make_round_parts), sampling rate 1, canary agent",
    dict(noise_multiplier=3.7, clip_norm=1.0, num_agents=3, canary_scale=100.0,
         accountant="pld"),
    ("halve-noise", "no-clip"), dp_fedavg_round_harness))
