"""The stages a round is chained from (docs/protocol.md, "A round is a chain of stages").

Every stage module registers its stages (:func:`~fedjax_dp.stages.base.register`); importing this
package imports each once, which is the one registration a new stage needs (add its module to
:data:`STAGE_MODULES`).
"""
from __future__ import annotations

from fedjax_dp.stages import (aggregation, clipping, correlated, distributed,  # noqa: F401
                              noise, participation, updates)
from fedjax_dp.stages.base import (KINDS, Requirement, Stage, StageConflict, check_chain,
                                   conflict, register, registered, stage_kinds)
from fedjax_dp.stages.chain import Chain, Setup, setup_of

#: the modules whose stages are registered (the one line a new stage module adds itself to)
STAGE_MODULES = (participation, updates, clipping, aggregation, noise, correlated, distributed)

__all__ = ["KINDS", "Requirement", "Stage", "StageConflict", "check_chain", "conflict",
           "register", "registered", "stage_kinds", "Chain", "Setup", "setup_of",
           "STAGE_MODULES"]
