"""The run's values an averaging round carries besides the model, and which of them its server
reads and sets (the round's *view*): C_t under adaptive clipping, the noise stream's state, the
round counter and the participation groups under correlated noise, the server optimizer's
state. ``spec`` is the round's
:class:`~fedjax_dp.algorithms.rounds.RoundSpec`."""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.algorithms import server_step
from fedjax_dp.core import rng
from fedjax_dp.privacy import correlated_noise as correlated_lib

__all__ = ["server_keys", "view", "unview", "params_of", "init_values", "cohort_mask"]


def server_keys(spec) -> tuple[str, ...]:
    """The run's values a round's server reads and sets: the params, C_t when adaptive, the
    noise stream's state when correlated, the server optimizer's state (the round's *view*)."""
    return (("params",) + (("clip_norm",) if spec.adaptive else ())
            + (("noise_state",) if spec.correlated else ())
            + (("server_opt_state",) if spec.server_optimizer is not None else ()))


def view(spec, values: dict) -> Any:
    """What a round reads from the run's values: the params alone, or a dict of
    :func:`server_keys`."""
    keys = server_keys(spec)
    return values["params"] if keys == ("params",) else {k: values[k] for k in keys}


def params_of(spec, view: Any) -> Any:
    """The model's parameters in a round's ``view``."""
    return view if server_keys(spec) == ("params",) else view["params"]


def unview(spec, view: Any) -> dict:
    """The values a round's result ``view`` sets (:func:`view`'s inverse)."""
    return {"params": view} if server_keys(spec) == ("params",) else dict(view)


def init_values(spec, params: Any, key: jax.Array, num_agents: int) -> dict:
    """The run's first values: the params; the server optimizer's ``init(params)``; C_0 =
    ``clip_norm`` when adaptive; when
    correlated, the noise stream's state, round 0 and each agent's participation group,
    independent and uniform over the b groups (from ``key``, independent of the data)."""
    values = {"params": params}
    if spec.server_optimizer is not None:
        values["server_opt_state"] = server_step.optimizer(spec).init(params)
    if spec.adaptive:
        values["clip_norm"] = jnp.float32(spec.clip_norm)
    if spec.correlated:
        dim = sum(int(np.prod(l.shape)) for l in jax.tree.leaves(params))
        values["noise_state"] = correlated_lib.init_state(spec.correlated, dim)
        values["round"] = jnp.int32(0)
        values["cohort_group"] = jax.random.randint(
            rng.stream(key, "cohort_groups"), (num_agents,), 0, spec.correlated.cycle,
            jnp.int32)
    return values


def cohort_mask(spec, values: dict, coins: jax.Array) -> jax.Array:
    """The round's coins ``[N]`` restricted to group ``round mod b`` when correlated."""
    if not spec.correlated:
        return coins
    return coins & (values["cohort_group"] == values["round"] % spec.correlated.cycle)
