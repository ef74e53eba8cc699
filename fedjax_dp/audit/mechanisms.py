"""Registry of auditable mechanisms: mechanism name -> its family's harness.

Each family holds its own harnesses, beside its algorithms and its privacy analysis
(``fedjax_dp/algorithms/<family>/audit.py``); the machinery they share (:class:`Auditable`,
:class:`Spec`, the weakenings, checks) is :mod:`fedjax_dp.privacy.audit_harness`, which
describes what an auditable mechanism is, its statistic and its weakened variants. This module
only merges the families' entries (:data:`MECHANISMS`) and builds an entry by name
(:func:`resolve`, :func:`build`):

* ``gaussian-vote``: :func:`fedjax_dp.algorithms.voting.audit.gaussian_vote_harness`;
* ``fedkt-laplace``: :func:`fedjax_dp.algorithms.fedkt.audit.fedkt_laplace_harness`;
* ``dp-sgd-step``: :func:`fedjax_dp.algorithms.averaging.audit.dp_sgd_step_harness`;
* ``dp-fedavg-round``: :func:`fedjax_dp.algorithms.averaging.audit.dp_fedavg_round_harness`;
* ``isrl-upload``: :func:`fedjax_dp.algorithms.isrl.audit.isrl_upload_harness`;
* ``sdp-upload``: :func:`fedjax_dp.algorithms.isrl.audit.sdp_upload_harness`.
"""
from __future__ import annotations

import functools

from fedjax_dp.algorithms.averaging import audit as averaging_audit
from fedjax_dp.algorithms.fedkt import audit as fedkt_audit
from fedjax_dp.algorithms.isrl import audit as isrl_audit
from fedjax_dp.algorithms.voting import audit as voting_audit
from fedjax_dp.core import validation
from fedjax_dp.privacy.audit_harness import (ACCOUNTANTS, DEFAULT_CHUNK, WEAKENINGS, Auditable,
                                             Spec)

__all__ = ["WEAKENINGS", "ACCOUNTANTS", "Auditable", "Spec", "MECHANISMS", "resolve", "build",
           "DEFAULT_CHUNK"]

#: Every auditable mechanism by name, in the order the families list them.
MECHANISMS: dict[str, Spec] = {**voting_audit.SPECS, **fedkt_audit.SPECS,
                               **averaging_audit.SPECS, **isrl_audit.SPECS}


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
