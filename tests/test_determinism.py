"""Determinism: every shipped config, at a small size, run twice with the same seed gives the same
``result.json`` apart from timings, versions, output paths and which compilations the process
already had.

The second run of a config reuses the first one's compiled functions (``make_model`` gives one
model object per arguments), so the check costs one small run per config plus its replay. The
default suite checks three (DP-FedAvg, ISRL-DP MB-SGD, FedKT with trees; the suite's time budget); ``pytest -m sweep
tests/test_determinism.py`` checks every shipped config (3.5 minutes on 2 cores)."""
import copy
import json
from pathlib import Path

import pytest

from fedjax_dp.experiments import config as config_lib
from fedjax_dp.experiments import runner

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted(p for p in (ROOT / "configs").glob("*/*.toml")
                 if p.parent.name not in ("experiments", "benchmarks"))  # sweeps; user data
#: checked in the default suite; the others are marked ``sweep``
DEFAULT = {"dp_fedavg/mnist5k", "fedkt/wbcd", "isrl/wbcd_isrl_mb_sgd"}

#: algorithm fields made small (when the config has them)
SMALL_ALGORITHM = {"rounds": 2, "student_steps": 3, "final_steps": 3, "num_queries": 10,
                   "search_epochs": 1, "retrain_epochs": 1, "nodes": 1, "cells": 1,
                   "channels": 2, "stem_multiplier": 1, "local_steps": 2, "epoch_length": 1,
                   "tree_estimators": 3, "batch_size": 8,
                   "retrain_batch_size": 8, "feature_dim": 8}
#: fields that change with the run but not with what it computed (besides timings ``*_s``)
VOLATILE = ("versions", "timing", "cohort", "genotype_png", "votes_file", "account_command")


def small(config: dict) -> dict:
    c = copy.deepcopy(config)
    algo = c["algorithm"]
    for k, v in SMALL_ALGORITHM.items():
        if k in algo:
            algo[k] = v
    if c["algorithm"]["name"] == "dp_fnas":
        algo["primitives"] = ["skip_connect", "max_pool_3x3"]
    c["train"]["steps"] = 2
    c["model"]["hidden"] = [8]
    c["run"].update(eval_every=1, progress=False, checkpoint_every=0)
    return c


def _stable(result: dict) -> dict:
    out = {k: v for k, v in result.items() if k not in VOLATILE and not k.endswith("_s")}
    out["history"] = [{k: v for k, v in r.items() if not k.endswith("_s")}
                      for r in result["history"]]
    return out


def _name(path: Path) -> str:
    return f"{path.parent.name}/{path.stem}"


@pytest.mark.parametrize("path", [p if _name(p) in DEFAULT else
                                  pytest.param(p, marks=pytest.mark.sweep) for p in CONFIGS],
                         ids=_name)
def test_same_config_and_seed_give_the_same_result(tmp_path, path):
    cfg = config_lib.resolve(small(config_lib.load(path)))
    first = runner.run(cfg, tmp_path / "a")
    runner.run(cfg, tmp_path / "b")
    a = json.loads((tmp_path / "a" / "result.json").read_text())
    b = json.loads((tmp_path / "b" / "result.json").read_text())
    assert _stable(a) == _stable(b)
    assert _stable(first) == _stable(a)
    assert len(a["history"]) >= 1
