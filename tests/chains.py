"""Test helpers: a round's chain of stages from a few keyword arguments, and a host-driver
runner on bare parameters (for the tests that compare a round with a loop written by hand)."""
from __future__ import annotations

import dataclasses

import jax

from fedjax_dp.algorithms import rounds
from fedjax_dp.core import cohort
from fedjax_dp.stages import (Chain, Setup, aggregation, clipping, correlated, distributed,
                              noise, participation, updates)


def participation_of(sampling: cohort.Sampling, min_sep: int = 1):
    if min_sep > 1:
        return participation.Cyclic(min_sep, sampling)
    if sampling.kind == "fixed":
        return participation.Fixed(sampling.size)
    return participation.Poisson(sampling.rate)


def chain(model, local, *, sampling=cohort.Sampling("poisson", rate=1.0), server_lr=1.0,
          clip_norm=None, noise_multiplier=0.0, denominator="sampled", secagg=None,
          adaptive=None, correlated_noise=None, weight_cap=None, distributed_noise=None,
          server_optimizer=None, agent_update=None, noise_sensitivity=None) -> Chain:
    """The chain of the old flag record's fields (``correlated_noise``: its groups b)."""
    update = agent_update if agent_update is not None else rounds.local_sgd_update(model, local)
    if clip_norm is None:
        clip = clipping.NoClip()
    elif adaptive is not None:
        clip = clipping.AdaptiveClip(clip_norm, adaptive, weight_cap)
    else:
        clip = clipping.FixedClip(clip_norm, weight_cap)
    if distributed_noise is not None:
        cls = distributed.DDG if distributed_noise.kind == "ddg" else distributed.Skellam
        noise_ = cls(distributed_noise, noise_multiplier)
    elif correlated_noise is not None:
        cls = {"banded_mf": correlated.BandedMF, "blt": correlated.BLT,
               "tree": correlated.Tree}[correlated_noise.kind]
        noise_ = cls(correlated_noise, noise_multiplier, noise_sensitivity)
    elif noise_multiplier > 0 or noise_sensitivity is not None:
        noise_ = noise.GaussianNoise(noise_multiplier, noise_sensitivity)
    else:
        noise_ = noise.NoNoise()
    if server_optimizer is None:
        server = updates.PlainStep(server_lr, denominator)
    else:
        server = updates.OptaxStep(server_optimizer, server_lr, denominator)
    b = correlated_noise.cycle if correlated_noise is not None else 1
    return Chain(participation=participation_of(sampling, b),
                 client_update=updates.LocalSteps(update), clipping=clip,
                 aggregation=(aggregation.PlainSum() if secagg is None
                              else aggregation.SecureSum(secagg)),
                 noise=noise_, server_update=server)


class ParamsRunner:
    """A :class:`~fedjax_dp.algorithms.rounds.RoundRunner` of a chain whose stages hold no
    state, called on bare parameters: ``runner(key, params) -> (params, metrics)``."""

    def __init__(self, chain_: Chain, data, rounds_: int = 1, **kwargs):
        self.inner = rounds.RoundRunner(chain_, Setup(data.num_agents, rounds_), data, **kwargs)

    @classmethod
    def of(cls, runner: rounds.RoundRunner) -> "ParamsRunner":
        """A runner built elsewhere (e.g. ``dp_fedsgd.make_round``), called on bare params."""
        out = cls.__new__(cls)
        out.inner = runner
        return out

    def __getattr__(self, name):
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __call__(self, key, params):
        view = {"params": params,
                "stages": self.inner.chain.init_state(jax.random.key(0), params,
                                                      self.inner.num_agents)}
        out, metrics = self.inner(key, view)
        return out["params"], metrics


def replace(chain_: Chain, **stages) -> Chain:
    return dataclasses.replace(chain_, **stages)
