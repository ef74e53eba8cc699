"""Empirical privacy audits: lower bounds on every mechanism's epsilon, checked against its claim.

:mod:`.bounds` (Clopper-Pearson bounds, the test's epsilon lower bound), :mod:`.harness` (the
auditable mechanisms' registry), :mod:`.audit` (``audit(...)``, ``fedjax-dp audit``); docs/audit.md.
"""
from fedjax_dp.audit import bounds, harness
from fedjax_dp.audit.audit import AuditResult, audit, statistics, world_keys
from fedjax_dp.audit.harness import MECHANISMS, WEAKENINGS, build, register

__all__ = ["bounds", "harness", "AuditResult", "audit", "statistics", "world_keys",
           "MECHANISMS", "WEAKENINGS", "build", "register"]
