"""Empirical privacy audits: lower bounds on every mechanism's epsilon, checked against its claim.

:mod:`.bounds` (Clopper-Pearson bounds, the threshold test's epsilon lower bound),
:mod:`.mechanisms` (the registry of auditable mechanisms: name -> the harness its family
defines in ``fedjax_dp/algorithms/<family>/audit.py``, each the library's own code on a
worst-case neighbour pair, with weakened variants; their shared machinery is
:mod:`fedjax_dp.privacy.audit_harness`), :mod:`.audit` (``audit(...)``). Command line:
``fedjax-dp audit MECHANISM``. See ``docs/audit.md``.
"""
from fedjax_dp.audit import bounds, mechanisms
from fedjax_dp.audit.audit import AuditResult, audit, statistics, world_keys
from fedjax_dp.audit.mechanisms import MECHANISMS, WEAKENINGS, build

__all__ = ["bounds", "mechanisms", "AuditResult", "audit", "statistics", "world_keys",
           "MECHANISMS", "WEAKENINGS", "build"]
