"""Which stages compose: every pair of stage options, from the same stated requirements the chain
checks (:func:`fedjax_dp.stages.base.check_chain`), as docs/mechanisms.md's table.

A pair *runs* when some chain of representative stages holds both and breaks no requirement;
otherwise the table gives the refusal a chain holding both answers with. The representatives
(:func:`representatives`) are one small, consistent instance per registered option.
"""
from __future__ import annotations

import itertools
from collections import Counter
from typing import Iterator

from fedjax_dp.core import cohort as cohort_lib
from fedjax_dp.privacy import adaptive_clip as adaptive_lib
from fedjax_dp.privacy import correlated_noise as correlated_lib
from fedjax_dp.privacy import distributed_dp as distributed_lib
from fedjax_dp.privacy import secagg as secagg_lib
from fedjax_dp.stages import (aggregation, clipping, correlated, distributed, noise,
                              participation, updates)
from fedjax_dp.stages.base import KINDS, Stage, StageConflict, registered
from fedjax_dp.stages.chain import Chain

__all__ = ["representatives", "chains", "pair_verdicts", "markdown"]

#: the cycle b of the representatives' groups and correlated strategies
CYCLE = 2
ROUNDS = 4


def representatives() -> dict[str, list[Stage]]:
    """One instance of every registered stage option, by kind (b = 2, T = 4)."""
    tracker = adaptive_lib.AdaptiveClip(count_noise=2.0, max_clip_norm=4.0)

    def strategy(kind):
        return correlated_lib.CorrelatedNoise(kind, CYCLE, ROUNDS)

    out = {
        "participation": [participation.Poisson(0.5), participation.Fixed(2),
                          participation.Cyclic(CYCLE, cohort_lib.Sampling("poisson", rate=0.5))],
        "client_update": [updates.LocalSteps(None), updates.LocalDpSgd(None)],
        "clipping": [clipping.NoClip(), clipping.FixedClip(1.0),
                     clipping.AdaptiveClip(1.0, tracker)],
        "aggregation": [aggregation.PlainSum(), aggregation.SecureSum(secagg_lib.SecAggConfig())],
        "noise": [noise.NoNoise(), noise.GaussianNoise(1.0),
                  correlated.BandedMF(strategy("banded_mf"), 1.0),
                  correlated.BLT(strategy("blt"), 1.0), correlated.Tree(strategy("tree"), 1.0),
                  distributed.DDG(distributed_lib.DistributedNoise("ddg"), 1.0),
                  distributed.Skellam(distributed_lib.DistributedNoise("skellam"), 1.0)],
        "server_update": [updates.PlainStep(1.0), updates.OptaxStep("adam", 0.01)],
    }
    for kind in KINDS:                  # every registered option has its representative
        missing = set(registered(kind)) - {s.NAME for s in out[kind]}
        if missing:
            raise ValueError(f"no representative for {kind} stages {sorted(missing)}")
    return out


def chains() -> Iterator[tuple[tuple[Stage, ...], str | None]]:
    """Every chain of representatives: ``(stages in KINDS order, refusal or None)``."""
    reps = representatives()
    for combo in itertools.product(*(reps[k] for k in KINDS)):
        try:
            Chain(**dict(zip(KINDS, combo)))
            yield combo, None
        except StageConflict as e:
            yield combo, str(e)


def pair_verdicts() -> dict[tuple[str, str], dict[tuple[str, str], str | None]]:
    """``{(kind_a, kind_b): {(name_a, name_b): None (runs) or the refusal}}`` for every pair of
    kinds (a before b in :data:`KINDS`)."""
    runs: set = set()
    why: dict = {}
    for combo, refusal in chains():
        for (i, a), (j, b) in itertools.combinations(enumerate(combo), 2):
            key = (KINDS[i], KINDS[j], a.NAME, b.NAME)
            if refusal is None:
                runs.add(key)
            elif a.label in refusal or b.label in refusal:
                why.setdefault(key, Counter())[refusal] += 1
    reps = representatives()
    out = {}
    for ka, kb in itertools.combinations(KINDS, 2):
        cells = {}
        for a, b in itertools.product(reps[ka], reps[kb]):
            key = (ka, kb, a.NAME, b.NAME)
            if key in runs:
                cells[(a.NAME, b.NAME)] = None
            else:
                reasons = why.get(key)
                cells[(a.NAME, b.NAME)] = (reasons.most_common(1)[0][0] if reasons else
                                           "no chain of the other stages admits both")
        out[(ka, kb)] = cells
    return out


def markdown() -> str:
    """The table of every pair, one markdown table per pair of kinds; refusals numbered."""
    notes: dict[str, int] = {}
    lines = []
    reps = representatives()
    for (ka, kb), cells in pair_verdicts().items():
        cols = [s.NAME for s in reps[kb]]
        lines += [f"### {ka} x {kb}", "", f"| {ka} \\ {kb} | " + " | ".join(cols) + " |",
                  "|---" * (len(cols) + 1) + "|"]
        for a in reps[ka]:
            row = []
            for b in cols:
                refusal = cells[(a.NAME, b)]
                if refusal is None:
                    row.append("runs")
                else:
                    n = notes.setdefault(refusal, len(notes) + 1)
                    row.append(f"no ({n})")
            lines.append(f"| {a.NAME} | " + " | ".join(row) + " |")
        lines.append("")
    lines += ["### Refusals", ""]
    lines += [f"{n}. {text}" for text, n in notes.items()]
    return "\n".join(lines) + "\n"
