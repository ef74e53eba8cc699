"""Run under XLA_FLAGS=--xla_force_host_platform_device_count=8: :func:`checks` is called by
``sharded_check.py`` (one subprocess for every 8-device check, started by ``test_sharding.py``);
run alone, this file prints its own checks.

ISRL-DP SPIDER (refresh and difference rounds, M = 3 of N = 6 silos) and SDP SPIDER with the silo
axis sharded over 8 CPU devices: the gathered round's M = 3 cohort rows and the masked round's
N = 6 rows are padded to 8 inside ``for_each_agent`` and the padding rows are dropped before
every sum, so each sharded run equals the single-device run, and the sharded gathered run equals
the single-device masked reference; each sharded run's rounds run one compiled program. Prints
one JSON line.
"""
import json
import sys

import jax
import numpy as np

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from fedjax_dp.algorithms import api, isrl  # noqa: E402
from fedjax_dp.core import agent_mesh, from_ragged  # noqa: E402
from fedjax_dp.models import make_model  # noqa: E402


def _same(a, b) -> bool:
    return all(np.allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6) for x, y in
               zip(jax.tree.leaves(a.state.values), jax.tree.leaves(b.state.values)))


def checks() -> dict:
    """``{check: bool, "<name>_uploads": int}`` (needs 8 devices)."""
    assert jax.device_count() == 8, jax.devices()
    rng = np.random.default_rng(0)
    xs = [rng.normal(size=(n, 5)).astype(np.float32) for n in (12, 9, 15, 10, 8, 11)]
    ys = [(x[:, 0] > 0).astype(np.int32) for x in xs]
    fed = api.FederatedData(agents=from_ragged(xs, ys), num_classes=2)
    model = make_model("mlp", (5,), 2, hidden=(4,))
    common = dict(rounds=3, num_available=3, batch_size=4, smoothness=3.0,
                  report_objective=False)
    cases = {"spider": (isrl.ISRL_SPIDER, dict(common, noise_multiplier=0.7)),
             "sdp_spider": (isrl.SDP_SPIDER, dict(common, noise_trials=64, granularity=8))}
    out = {}
    for name, (algo, fields) in cases.items():
        cfg = algo.Config(**fields)
        # SPIDER: sharded gathered and masked vs plain masked; SDP SPIDER: sharded gathered vs
        # plain masked (plain gathered == plain masked on one device: tests/test_isrl_cohort.py)
        todo = ([(True, "gather"), (False, "masked"), (True, "masked")]
                if name == "spider" else [(True, "gather"), (False, "masked")])
        runs = {(mesh, cohort): api.run(
            algo, jax.random.key(0), fed, model, cfg,
            runtime=api.Runtime(chunk_size=None, cohort=cohort,
                                mesh=agent_mesh() if mesh else None))
            for mesh, cohort in todo}
        if name == "spider":
            out[f"{name}_sharded_masked"] = _same(runs[False, "masked"], runs[True, "masked"])
        out[f"{name}_sharded_gathered_equals_masked"] = _same(runs[True, "gather"],
                                                              runs[False, "masked"])
        out[f"{name}_uploads"] = int(np.asarray(runs[True, "gather"].state.values["uploads"])
                                     .sum())
        # the initial state is placed replicated on the mesh, as the round returns it: the 3
        # rounds of each sharded run ran one compiled program
        out[f"{name}_sharded_round_compiled_once"] = all(
            runs[key].state.context.round_fn.__wrapped__._cache_size() == 1
            for key in todo if key[0])
    return out


if __name__ == "__main__":
    print(json.dumps(checks()))
