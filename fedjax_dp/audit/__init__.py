"""Empirical privacy audits: lower bounds on every mechanism's epsilon, checked against its claim.

:mod:`.bounds` (Clopper-Pearson bounds, the threshold test's epsilon lower bound),
:mod:`.harness` (what an auditable mechanism is, and the registry the families' harnesses,
``fedjax_dp/algorithms/<family>/audit.py``, add themselves to when imported), :mod:`.audit`
(``audit(...)``). Command line: ``fedjax-dp audit MECHANISM``. See ``docs/audit.md``.
"""
from fedjax_dp.audit import bounds, harness
from fedjax_dp.audit.audit import AuditResult, audit, statistics, world_keys
from fedjax_dp.audit.harness import MECHANISMS, WEAKENINGS, build, register

__all__ = ["bounds", "harness", "AuditResult", "audit", "statistics", "world_keys",
           "MECHANISMS", "WEAKENINGS", "build", "register"]
