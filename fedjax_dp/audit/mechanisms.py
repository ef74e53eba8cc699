"""Registry of auditable mechanisms: the library's own code on a worst-case neighbour pair.

Each entry builds, from its parameters, an :class:`Auditable`:

* ``one_trial(key, neighbour) -> statistic`` (a float32 scalar): ONE run of the library's
  mechanism on dataset D (``neighbour=False``, the world where the statistic tends to be larger:
  the canary is present / the changed vote is cast) or on its neighbour D' (``neighbour=True``),
  reduced to a scalar statistic;
* ``trials(key, num_trials, neighbour) -> [num_trials]``: ``one_trial`` over the keys
  ``split(key, num_trials)`` in ONE jit-compiled call (``jax.lax.map`` over chunks of trials,
  each chunk vmapped), compiled once per (mechanism, parameters, num_trials, world);
* ``claimed_epsilon(delta)``: the epsilon the library's own accounting (its ledger for exactly
  what ran, through ``dp_accounting``) claims for that one release.

Statistic for the Gaussian mechanisms: the projection ``<release, u>`` of the release on the
unit vector ``u`` along the noise-free difference ``f(D) - f(D')`` (computed once by the same
code with zero noise). For ``release = f + N(0, s^2 I)`` it is ``N(<f, u>, s^2)``: the
Neyman-Pearson optimal statistic of the pair, so a threshold test on it is the best test there
is. The vote mechanisms release only an argmax: the Gaussian vote is audited on its noisy tally
(what Theorem 5's accounting covers; the argmax is post-processing), the FedKT LNMax vote on its
released label (its noisy counts are never materialised by the library).

Worst-case inputs: the canary's contribution is always at the sensitivity bound (a gradient or
update of norm ``canary_scale`` times the clip, clipped down to the clip), the other inputs are
fixed, and the mechanism's only randomness left is its noise (record / agent sampling rate 1).
Auditing the un-sampled single release is deliberate: the accounting's claim for it is tight,
so the audit can come close to it; amplification by sampling and composition over rounds are
outside what a single pair of worlds can probe with modest trial counts.

Weakened variants (``weaken=``), built by the same code path and audited against the ORIGINAL
claim: ``"halve-noise"`` runs with half the noise std (noise multiplier / 2, sigma / 2,
Laplace scale / 2, or a quarter of the binomial noise trials); ``"no-clip"`` runs with a clip
that never binds (``clip = inf``, no clipping, or a clip far above the canary with the noise
std kept at ``z C``). A correct audit must report a lower bound ABOVE the claim for them.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from fedjax_dp.core import validation

__all__ = ["WEAKENINGS", "ACCOUNTANTS", "Auditable", "Spec", "MECHANISMS", "build",
           "DEFAULT_CHUNK"]

#: The weakened variants any mechanism may offer (each entry lists those it supports).
WEAKENINGS = ("halve-noise", "no-clip")
ACCOUNTANTS = ("rdp", "pld")
#: Trials per vmapped chunk inside one compiled call (bounds memory, not the result).
DEFAULT_CHUNK = 1 << 18


@dataclasses.dataclass(frozen=True)
class Auditable:
    """A mechanism ready to audit (see the module docstring)."""

    name: str
    params: dict                                   # resolved parameters (JSON-able)
    weaken: str | None
    unit: str
    relation: str
    one: Callable[..., jax.Array]                  # one(key, inputs) -> scalar statistic
    inputs: dict                                   # {neighbour: pytree of arrays}
    claimed: Callable[[float], float]
    structure: tuple = ()                          # what the compiled code depends on
    chunk: int = DEFAULT_CHUNK

    def one_trial(self, key: jax.Array, neighbour: bool) -> jax.Array:
        """One run of the mechanism in world D (``neighbour=False``) or D' -> scalar statistic."""
        return self.one(key, self.inputs[bool(neighbour)])

    def trials(self, key: jax.Array, num_trials: int, neighbour: bool) -> jax.Array:
        """``[num_trials]`` float32: ``one_trial(k, neighbour)`` for ``k`` in
        ``split(key, num_trials)``, in one compiled call (the world's arrays are arguments, not
        constants, so XLA does not constant-fold the batched mechanism)."""
        num_trials = validation.check_int("trials", num_trials, minimum=1)
        sig = (self.name, self.structure or id(self), num_trials, self.chunk)
        fn = _COMPILED.get(sig)
        if fn is None:
            chunk = min(self.chunk, num_trials)

            def run(key, inputs):
                keys = jax.random.split(key, num_trials)                  # [T] trial keys
                one = functools.partial(self.one, inputs=inputs)
                if num_trials <= chunk:
                    return jax.vmap(one)(keys)                            # [T]
                return jax.lax.map(one, keys, batch_size=chunk)           # [T], chunked

            fn = _COMPILED[sig] = jax.jit(run)
        return fn(key, self.inputs[bool(neighbour)])

    def jitted_one_trial(self, key: jax.Array, neighbour: bool) -> jax.Array:
        """:meth:`one_trial`, compiled (once per structure): for loops over a few trials."""
        sig = (self.name, self.structure or id(self), "one")
        fn = _COMPILED.get(sig)
        if fn is None:
            fn = _COMPILED[sig] = jax.jit(self.one)
        return fn(key, self.inputs[bool(neighbour)])

    def claimed_epsilon(self, delta: float) -> float:
        """The library's accounting: epsilon at ``delta`` of the (unweakened) release."""
        return float(self.claimed(validation.check_open_unit("delta", delta)))


#: Compiled trial runners, shared by every Auditable with the same (name, structure): variants
#: that differ only in array inputs (noise scale, clip) reuse one compilation.
_COMPILED: dict = {}


@dataclasses.dataclass(frozen=True)
class Spec:
    """A registry entry: defaults of its parameters, the weakenings it supports, its builder."""

    description: str
    defaults: dict
    weakenings: tuple
    builder: Callable[..., Auditable]


def _unit_vector(diff: np.ndarray, what: str) -> np.ndarray:
    n = float(np.linalg.norm(diff))
    if not n > 0:
        raise ValueError(f"{what}: the neighbouring worlds do not differ (zero difference)")
    return (diff / n).astype(np.float32)


def _flat(tree) -> jax.Array:
    return ravel_pytree(tree)[0]


def _direction(tree) -> jax.Array:
    """The unit vector along a pytree (flattened), traced: ``v / ||v||``."""
    v = _flat(tree)
    return v / jnp.linalg.norm(v)


def _check_accountant(accountant: str) -> str:
    return validation.check_choice("accountant", accountant, ACCOUNTANTS)


def _check_finite_positive(name: str, value) -> float:
    v = validation.check_positive(name, value)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return v


# =============================================================================== gaussian-vote

def _stored_ballots(agents: jax.Array, queries: jax.Array) -> jax.Array:
    """Ballot function of the audit: agent i's stored ballot ``agents[i] [C]`` for every query:
    ``[a, q, C]`` (module-level, so hashable and compiled once)."""
    return jnp.broadcast_to(agents[:, None, :], (agents.shape[0], queries.shape[0],
                                                  agents.shape[1]))


def _gaussian_vote(weaken, *, sigma, unit, ballot, k, num_agents, num_classes, noise,
                   accountant) -> Auditable:
    """AE-DPFL / kNN-DPFL noisy vote sum (voting-dpfl Alg. 2-3, Thm 5), one query.

    Neighbours: ``agent``: agent 0 (one-hot vote for class 1) present vs removed;
    ``instance`` + ``one_hot``: agent 0's vote moves from class 0 to class 1;
    ``instance`` + ``neighbour_counts``: one of agent 0's k neighbours changes label 0 -> 1
    (its ballot moves by 1/k in two coordinates, sensitivity sqrt(2)/k). The tally is
    :func:`fedjax_dp.privacy.vote.noisy_tally` (every agent's own noise share, or the aggregate
    noise), the statistic its projection on the change (the score difference of the two
    classes that change, scaled by 1/sqrt(2); the changed class's score at agent level).
    """
    from fedjax_dp.privacy import vote
    validation.check_choice("unit", unit, tuple(vote.RELATIONS))
    validation.check_choice("ballot", ballot, vote.BALLOTS)
    validation.check_choice("noise", noise, vote.NOISE_MODES)
    n = validation.check_int("num_agents", num_agents, minimum=2)
    c = validation.check_int("num_classes", num_classes, minimum=2)
    sigma = _check_finite_positive("sigma", sigma)
    _check_accountant(accountant)
    if ballot == "neighbour_counts":
        k = validation.check_int("k", 4 if k is None else k, minimum=1)
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
    kw = dict(ballot_fn=_stored_ballots, num_classes=c, agent_chunk=None, query_chunk=None)
    # The noise-free tallies are the ballot sums; they differ by agent 0's change, whose norm is
    # the stated sensitivity (checked: the pair is worst case).
    change = d.sum(0) - dp.sum(0)                                 # [C]
    if abs(float(np.linalg.norm(change)) - sens) > 1e-5:
        raise AssertionError("audit input does not attain the stated sensitivity")
    u = jnp.asarray(_unit_vector(change, "gaussian-vote"))

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


# =============================================================================== fedkt-laplace

def _fedkt_laplace(weaken, *, gamma, num_teachers, gap, num_classes, accountant) -> Auditable:
    """FedKT's LNMax vote (FedKT Alg. 1, Thm 3; L2 example level), one query of one partition.

    ``t`` teachers vote on one public point through :func:`fedjax_dp.algorithms.fedkt.votes.vote_counts`
    and the label is released by :func:`fedjax_dp.algorithms.fedkt.votes.noisy_labels`
    (``argmax(counts + Lap(1/gamma))``). Neighbours (replace one training example, which changes
    one teacher's vote): in D' the top-2 gap is ``gap`` (class 0 ahead); in D teacher 0 votes
    class 1 instead (gap ``gap - 2``). Statistic: the released label is class 1 (0/1).
    Claimed: ``LaplaceDpEvent(1 / (2 gamma))`` (L1 sensitivity 2), by the library's
    :func:`fedjax_dp.algorithms.fedkt.privacy.data_independent_events`.
    """
    from fedjax_dp.algorithms.fedkt import privacy as fedkt_privacy
    from fedjax_dp.algorithms.fedkt import votes as fedkt_votes
    from fedjax_dp.privacy import PrivacyLedger
    gamma = _check_finite_positive("gamma", gamma)
    t = validation.check_int("num_teachers", num_teachers, minimum=2)
    c = validation.check_int("num_classes", num_classes, minimum=2)
    gap = validation.check_int("gap", gap, minimum=0, maximum=t)
    if (t + gap) % 2:
        raise ValueError(f"gap must have the parity of num_teachers ({t}) so the votes split "
                         f"into integers, got {gap}")
    _check_accountant(accountant)
    a = (t + gap) // 2                                            # class-0 votes in D'
    if a < 1:
        raise ValueError(f"gap must leave teacher 0 a class-0 vote to change, got {gap}")
    preds_dp = np.asarray([0] * a + [1] * (t - a), np.int32)      # teacher 0 votes class 0
    preds_d = preds_dp.copy()
    preds_d[0] = 1                                                # ... or class 1
    worlds = {False: jnp.asarray(preds_d)[None, :, None],         # [G=1, t, Q=1]
              True: jnp.asarray(preds_dp)[None, :, None]}
    run_gamma = 2 * gamma if weaken == "halve-noise" else gamma

    def one(key, inputs):
        w = inputs
        counts = fedkt_votes.vote_counts(w["preds"], c)                 # [1, 1, C]
        label = fedkt_votes.noisy_labels(key[None], counts, w["gamma"])   # [1, 1]
        return (label[0, 0] == 1).astype(jnp.float32)

    inputs = {nb: {"preds": p, "gamma": jnp.float32(run_gamma)} for nb, p in worlds.items()}

    def claimed(delta):
        event = fedkt_privacy.data_independent_events("L2", gamma, 1, num_partitions=1,
                                                      num_teachers=t)["example"]
        ledger = PrivacyLedger().add_event("example", event,
                                           relation=fedkt_privacy.EXAMPLE_RELATION,
                                           sensitivity=2.0)
        return ledger.epsilon("example", delta, accountant)

    params = dict(gamma=gamma, num_teachers=t, gap=gap, num_classes=c, accountant=accountant)
    return Auditable("fedkt-laplace", params, weaken, "example", fedkt_privacy.EXAMPLE_RELATION,
                     one, inputs, claimed, structure=(t, c))


# =============================================================================== dp-sgd-step

@functools.lru_cache(maxsize=4)
def _logistic(features: int, classes: int):
    from fedjax_dp.models import make_model
    model = make_model("logistic", (features,), classes)
    shapes = jax.eval_shape(model.init, jax.random.key(0))       # no eager flax work
    params = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), shapes)
    return model, params


def _canary_examples(num: int, scale: float, clip: float) -> tuple[np.ndarray, np.ndarray]:
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


def _dp_sgd_step(weaken, *, noise_multiplier, clip_norm, num_examples, canary_scale,
                 accountant) -> Auditable:
    """One DP-FedSGD step of one agent (eq. (1) of :mod:`fedjax_dp.algorithms.averaging.dp_fedsgd`):
    :func:`dp_fedsgd.sample_records` (rate 1) then :func:`dp_fedsgd.noisy_gradient` (per-example
    clip to C, ``N(0, (z C)^2)``, divided by the fixed ``p n``: the private-gradient primitive
    :mod:`fedjax_dp.train.private_grad`) on a logistic model at zero parameters. Neighbours: the canary example (gradient norm ``>= canary_scale * C``) present
    vs removed (mask 0). Statistic: the noisy gradient's projection on the canary's clipped
    gradient. Claimed: :func:`dp_fedsgd.instance_ledger` of one round of one step with record
    sampling rate 1.
    """
    from fedjax_dp.algorithms.averaging import dp_fedsgd
    from fedjax_dp.train import LocalTrainConfig, cross_entropy
    z = _check_finite_positive("noise_multiplier", noise_multiplier)
    clip = _check_finite_positive("clip_norm", clip_norm)
    n = validation.check_int("num_examples", num_examples, minimum=1)
    scale = validation.check_number("canary_scale", canary_scale)
    if not 1.0 <= scale < 1e6:
        raise ValueError(f"canary_scale must be in [1, 1e6), got {canary_scale!r}")
    _check_accountant(accountant)
    model, params = _logistic(2, 2)
    loss_fn = cross_entropy(model)
    x, y = _canary_examples(n, scale, clip)
    x, y = jnp.asarray(x), jnp.asarray(y)
    mask_d = jnp.ones((n,), bool)
    worlds = {False: mask_d, True: mask_d.at[0].set(False)}
    run_clip = math.inf if weaken == "no-clip" else clip
    std = z * clip / (2 if weaken == "halve-noise" else 1)
    denominator = float(n)                                        # p n with p = 1: public

    def release(key, w, noise_std):
        k_batch, k_noise = jax.random.split(key)                  # as make_local_dp_sgd
        weights = dp_fedsgd.sample_records(k_batch, w["mask"], 1.0)          # [n]
        g, _ = dp_fedsgd.noisy_gradient(k_noise, loss_fn, w["params"], w["x"], w["y"], weights,
                                        w["clip"], noise_std, denominator)
        return _flat(g)

    inputs = {nb: {"mask": m, "params": params, "x": x, "y": y, "clip": jnp.float32(run_clip),
                   "std": jnp.float32(std)} for nb, m in worlds.items()}

    def one(key, inputs):
        w = inputs
        # The worlds' noise-free releases differ by the canary's clipped gradient / (p n),
        # parallel to its raw gradient: the adversary's direction u (any fixed direction gives
        # a valid test). Computed in the compiled function (not batched over trials: once).
        u = _direction(jax.grad(loss_fn)(w["params"], w["x"][0], w["y"][0]))
        return jnp.dot(release(key, w, w["std"]), u)

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


# =============================================================================== dp-fedavg-round

def _dp_fedavg_round(weaken, *, noise_multiplier, clip_norm, num_agents, canary_scale,
                     accountant) -> Auditable:
    """One DP-FedAvg round (:mod:`fedjax_dp.algorithms.averaging.dp_fedavg`; voting-dpfl Alg. 1) through
    the library's compiled round parts (:func:`fedavg.make_round_parts`: ``train_sum`` once per
    world, ``server`` per trial with the trial round's ``k_noise`` from
    :func:`fedavg.round_keys`), sampling rate 1: every agent takes part, so the round is the
    Gaussian mechanism on the clipped update sum and the claim is that of
    ``dp_fedavg.ledger`` with ``sampling_rate = 1`` (no amplification to audit). Each agent has
    one record and one local step (deterministic updates); agent 0 is the canary (update norm
    ``>= canary_scale * S``), present vs absent (its ``valid`` flag, how the library drops an
    agent from a round; the denominator ``q N`` is a public constant in both worlds).
    Statistic: the new model's projection on the canary's clipped update.
    """
    from fedjax_dp.algorithms.averaging import dp_fedavg, fedavg
    from fedjax_dp.core import cohort as cohort_lib
    from fedjax_dp.core import from_arrays
    from fedjax_dp.train import LocalTrainConfig
    z = _check_finite_positive("noise_multiplier", noise_multiplier)
    clip = _check_finite_positive("clip_norm", clip_norm)
    n = validation.check_int("num_agents", num_agents, minimum=1)
    scale = validation.check_number("canary_scale", canary_scale)
    if not 1.0 <= scale < 1e6:
        raise ValueError(f"canary_scale must be in [1, 1e6), got {canary_scale!r}")
    _check_accountant(accountant)
    model, params = _logistic(2, 2)
    x, y = _canary_examples(n, scale, clip)
    data = jax.tree.map(jnp.asarray, from_arrays(x[:, None], y[:, None], np.ones(n, np.int64)))
    local = LocalTrainConfig(steps=1, batch_size=1, learning_rate=1.0)
    update = fedavg.local_sgd_update(model, local)
    sampling = cohort_lib.Sampling("poisson", rate=1.0)

    std = z * clip / (2 if weaken == "halve-noise" else 1)
    spec = fedavg.RoundSpec(sampling=sampling, server_lr=1.0,
                            clip_norm=None if weaken == "no-clip" else clip,
                            noise_std=std, denominator="expected")
    server = fedavg.make_round_parts(update, spec, n)[1]
    # train_sum does not read the noise: take it from the noise-free spec (compiled once for
    # every noise level).
    train_sum = fedavg.make_round_parts(update, dataclasses.replace(spec, noise_std=0.0), n)[0]
    ids = jnp.arange(n)
    worlds = {False: jnp.ones((n,), bool), True: jnp.ones((n,), bool).at[0].set(False)}
    # The agents' part of the round (local training, clipping, secure sum), once per world:
    # every agent holds one record and batch_size = 1, so its update is the same for every
    # training key (this key is the round's k_train of key 0). The trials run the server's part
    # (noise on the sum, divide, apply) with each trial round's k_noise -- the library's own
    # split of a round into train_sum and server (RoundRunner's multi-pass rounds).
    _, k_train, _ = fedavg.round_keys(jax.random.key(0))
    sums = {nb: train_sum(k_train, params, data, None, ids, v, {}) for nb, v in worlds.items()}
    if weaken != "no-clip" and abs(float(jnp.linalg.norm(_flat(sums[False][0])
                                                          - _flat(sums[True][0]))) - clip) > 1e-4:
        raise AssertionError("audit input does not attain the clip norm")

    def release(key, w):
        _, _, k_noise = fedavg.round_keys(key)
        new, _ = server(k_noise, w["params"], w["sums"])
        return _flat(new) - _flat(w["params"])

    u = jnp.asarray(_unit_vector(np.asarray(_flat(sums[False][0]) - _flat(sums[True][0])),
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


# =============================================================================== ISRL / SDP uploads

def _scalar_loss(params, x, y):
    """The tiny linear model of the silo audits: ``0.5 (w x - y)^2`` with ONE weight ``w``
    (``x``, ``y`` scalars; one coordinate, so the shuffle accounting's per-coordinate
    composition is tight). Gradient at ``w = 0``: ``-x y``."""
    return 0.5 * (params["w"][0] * x - y) ** 2


def _silo_records(num: int, scale: float, clip: float) -> tuple[np.ndarray, np.ndarray]:
    """Record 0 the canary (gradient ``-scale * clip`` at ``w = 0``); the others zero gradient."""
    x = np.zeros((num,), np.float32)
    y = np.zeros((num,), np.float32)
    x[0], y[0] = 1.0, scale * clip
    return x, y


def _silo_inputs(num_records, scale, clip):
    n = validation.check_int("num_records", num_records, minimum=1)
    x, y = _silo_records(n, scale, clip)
    mask = jnp.ones((n,), bool)
    return n, jnp.asarray(x), jnp.asarray(y), {False: mask, True: mask.at[0].set(False)}


def _check_scale(canary_scale) -> float:
    scale = validation.check_number("canary_scale", canary_scale)
    if not 1.0 <= scale < 1e6:
        raise ValueError(f"canary_scale must be in [1, 1e6), got {canary_scale!r}")
    return scale


def _isrl_upload(weaken, *, noise_multiplier, clip_norm, num_records, canary_scale,
                 accountant) -> Auditable:
    """One ISRL-DP gradient upload of one silo (eq. (1) of
    :mod:`fedjax_dp.algorithms.isrl.uploads`, :func:`uploads.gradient_upload` with
    ``private=True``, i.e. :func:`fedjax_dp.train.private_grad.private_gradient`): Poisson records at rate 1, per-record clip to C, ``N(0, (z C)^2)``,
    divided by ``n``. Neighbours: the silo's canary record present vs removed (the library's
    relation, add/remove one record of one silo). Statistic: the upload's projection on the
    canary's clipped gradient. Claimed: :func:`isrl.calibration.silo_event` with one upload at
    rate 1. ``no-clip``: clip ``10 * canary_scale * C`` with noise multiplier scaled so the
    noise std stays ``z C``.
    """
    from fedjax_dp.algorithms.isrl import calibration, uploads
    from fedjax_dp.privacy import PrivacyLedger
    z = _check_finite_positive("noise_multiplier", noise_multiplier)
    clip = _check_finite_positive("clip_norm", clip_norm)
    scale = _check_scale(canary_scale)
    _check_accountant(accountant)
    n, x, y, worlds = _silo_inputs(num_records, scale, clip)
    params = {"w": jnp.zeros((1,), jnp.float32)}
    upload = uploads.gradient_upload(_scalar_loss, True)
    run_clip, run_z = clip, z
    if weaken == "no-clip":
        run_clip = 10.0 * scale * clip
        run_z = z * clip / run_clip
    elif weaken == "halve-noise":
        run_z = z / 2

    def release(key, w, zz):
        u, _ = upload(key, w["params"], w["x"], w["y"], w["mask"], 1.0, float(n), w["clip"], zz)
        return _flat(u)

    inputs = {nb: {"params": params, "x": x, "y": y, "mask": m, "clip": jnp.float32(run_clip),
                   "z": jnp.float32(run_z)} for nb, m in worlds.items()}

    def one(key, inputs):
        w = inputs
        # The canary's clipped gradient is parallel to its raw one: the adversary's direction.
        u = _direction(jax.grad(_scalar_loss)(w["params"], w["x"][0], w["y"][0]))
        return jnp.dot(release(key, w, w["z"]), u)

    def claimed(delta):
        ledger = PrivacyLedger().add_event(calibration.UNIT,
                                           calibration.silo_event(z, [(1.0, 1)]),
                                           relation=calibration.RELATION, sensitivity=clip)
        return ledger.epsilon(calibration.UNIT, delta, accountant)

    params_out = dict(noise_multiplier=z, clip_norm=clip, num_records=n, canary_scale=scale,
                      accountant=accountant, record_sampling_rate=1.0)
    return Auditable("isrl-upload", params_out, weaken, calibration.UNIT, calibration.RELATION,
                     one, inputs, claimed, structure=(n,))


#: ``shuffle.calibrate_noise_trials(1.0, 1e-5, granularity=8, dimension=1, releases=1)``.
SDP_DEFAULT_NOISE_TRIALS = 3570


def _sdp_upload(weaken, *, noise_trials, granularity, clip_norm, num_records, canary_scale
                ) -> Auditable:
    """One shuffle-DP release (:mod:`fedjax_dp.algorithms.isrl.sdp`): the silo's per-record
    gradient reports (:func:`uploads.gradient_reports`: L2 clip to C, grid C / K, randomised
    rounding), then the server's binomial sum (:func:`uploads.shuffled_estimate`,
    ``Bin(N, 1/2)``). One coordinate (the scalar model), records at rate 1. Neighbours: the
    canary report present vs removed. Statistic: the decoded sum, signed along the canary.
    Claimed: ``shuffle.make_event(config, 1, 1)`` through a ledger (PLD of the binomial pair).
    ``halve-noise``: ``N // 4`` trials (std ``sqrt(N)/2`` halves). (No ``no-clip`` variant: the
    clip and the grid are one config here, so a skipped clip is a different protocol.)
    """
    from fedjax_dp.algorithms.isrl import sdp, uploads
    from fedjax_dp.privacy import PrivacyLedger, shuffle
    big_n = validation.check_int("noise_trials", noise_trials, minimum=4,
                                 maximum=shuffle.MAX_NOISE_TRIALS)
    k = validation.check_int("granularity", granularity, minimum=1, maximum=2 ** 12)
    clip = _check_finite_positive("clip_norm", clip_norm)
    scale = _check_scale(canary_scale)
    cfg = shuffle.ShuffleConfig(clip_norm=clip, granularity=k, noise_trials=big_n)
    run_cfg = cfg
    if weaken == "halve-noise":
        run_cfg = cfg.replace(noise_trials=big_n // 4)
    n, x, y, worlds = _silo_inputs(num_records, scale, clip)
    params = {"w": jnp.zeros((1,), jnp.float32)}
    reports = uploads.gradient_reports(_scalar_loss, run_cfg)
    def one(key, inputs):
        w = inputs
        # The canary's report moves the sum by K grid steps in the sign of its gradient.
        sign = jnp.sign(jax.grad(_scalar_loss)(w["params"], w["x"][0], w["y"][0])["w"][0])
        k_silo, k_server = jax.random.split(key)
        sums, _ = reports(k_silo, w["params"], w["x"], w["y"], w["mask"], 1.0)   # [1] int32
        return sign * uploads.shuffled_estimate(k_server, sums, run_cfg)[0]

    inputs = {nb: {"params": params, "x": x, "y": y, "mask": m} for nb, m in worlds.items()}

    def claimed(delta):
        ledger = PrivacyLedger().add_shuffle(sdp.UNIT, shuffle.make_event(cfg, 1, 1),
                                             relation=sdp.RELATION)
        return ledger.epsilon(sdp.UNIT, delta, "pld")

    params_out = dict(noise_trials=big_n, granularity=k, clip_norm=clip, num_records=n,
                      canary_scale=scale, accountant="pld", record_sampling_rate=1.0)
    return Auditable("sdp-upload", params_out, weaken, sdp.UNIT, sdp.RELATION, one, inputs,
                     claimed, structure=(n, run_cfg))


# =============================================================================== registry

MECHANISMS: dict[str, Spec] = {
    "gaussian-vote": Spec(
        "AE-DPFL / kNN-DPFL MPC vote sum (privacy/vote.py), one query",
        dict(sigma=3.7, unit="agent", ballot="one_hot", k=None, num_agents=4, num_classes=3,
             noise="per_agent", accountant="pld"),
        ("halve-noise",), _gaussian_vote),
    "fedkt-laplace": Spec(
        "FedKT LNMax vote (algorithms/fedkt/votes.py noisy_labels), one query, released label",
        dict(gamma=0.5, num_teachers=10, gap=4, num_classes=2, accountant="pld"),
        ("halve-noise",), _fedkt_laplace),
    "dp-sgd-step": Spec(
        "one DP-FedSGD step (dp_fedsgd.noisy_gradient), canary example present/absent",
        dict(noise_multiplier=3.7, clip_norm=1.0, num_examples=4, canary_scale=100.0,
             accountant="pld"),
        ("halve-noise", "no-clip"), _dp_sgd_step),
    "dp-fedavg-round": Spec(
        "one DP-FedAvg round (fedavg.make_round_parts), sampling rate 1, canary agent",
        dict(noise_multiplier=3.7, clip_norm=1.0, num_agents=3, canary_scale=100.0,
             accountant="pld"),
        ("halve-noise", "no-clip"), _dp_fedavg_round),
    "isrl-upload": Spec(
        "one ISRL-DP silo gradient upload (isrl/uploads.gradient_upload), canary record",
        dict(noise_multiplier=3.7, clip_norm=1.0, num_records=4, canary_scale=100.0,
             accountant="pld"),
        ("halve-noise", "no-clip"), _isrl_upload),
    "sdp-upload": Spec(
        "one shuffle-DP release (isrl/uploads.gradient_reports + shuffled_estimate), canary",
        dict(noise_trials=SDP_DEFAULT_NOISE_TRIALS, granularity=8, clip_norm=1.0,
             num_records=4, canary_scale=100.0),
        ("halve-noise",), _sdp_upload),
}


def resolve(mechanism: str, weaken: str | None = None, **params) -> tuple[Spec, dict]:
    """Check the mechanism, the weakening and the parameter names; fill in the defaults."""
    validation.check_choice("mechanism", mechanism, tuple(MECHANISMS))
    spec = MECHANISMS[mechanism]
    if weaken is not None and weaken not in spec.weakenings:
        raise ValueError(f"weaken must be one of {list(spec.weakenings)} (or None) for "
                         f"mechanism {mechanism!r}, got {weaken!r}")
    unknown = sorted(set(params) - set(spec.defaults))
    if unknown:
        raise ValueError(f"{unknown[0]} is not a parameter of mechanism {mechanism!r}; its "
                         f"parameters are {sorted(spec.defaults)}")
    full = {**spec.defaults, **{k: v for k, v in params.items() if v is not None}}
    return spec, full


@functools.lru_cache(maxsize=64)
def _build_cached(mechanism: str, weaken: str | None, items: tuple) -> Auditable:
    spec = MECHANISMS[mechanism]
    return spec.builder(weaken, **dict(items))


def build(mechanism: str, weaken: str | None = None, **params) -> Auditable:
    """The :class:`Auditable` of ``mechanism`` with ``params`` (defaults from the registry);
    cached per (mechanism, weaken, parameters), so its compiled trials are shared."""
    _, full = resolve(mechanism, weaken, **params)
    return _build_cached(mechanism, weaken, tuple(sorted(full.items())))
