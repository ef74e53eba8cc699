"""Every cell of participation {poisson, fixed, cyclic} x clipping {fixed, adaptive} x
aggregation {plain, secagg} x noise {gaussian, banded_mf, blt, tree, ddg, skellam} x server
{sgd, adam}: accepted, with its epsilon checked against a composition this test makes itself
(dp-accounting events composed here; the matrix mechanism's sensitivity by brute force over every
participation pattern of the tiny T; the distributed RDP curves summed and amplified here), or
refused in one line naming both stages. The refused set is stated here independently of the
stages' requirements. Every accepted pair of stages also runs two tiny rounds end to end (a greedy
cover of the accepted pairs by accepted cells), and docs/mechanisms.md's table is current."""
import functools
import itertools
import math
from pathlib import Path

import dp_accounting
import jax
import numpy as np
import pytest

from fedjax_dp.algorithms import api, rounds, rounds_protocol
from fedjax_dp.core import cohort, from_ragged
from fedjax_dp.models import make_model
from fedjax_dp.privacy import PrivacyLedger, accounting, distributed_accounting
from fedjax_dp.privacy import adaptive_clip as adaptive_lib
from fedjax_dp.privacy import correlated_noise as correlated_lib
from fedjax_dp.privacy import distributed_dp as distributed_lib
from fedjax_dp.privacy import secagg as secagg_lib
from fedjax_dp.stages import (Chain, Setup, StageConflict, aggregation, clipping, correlated,
                              distributed, noise, participation, table, updates)
from fedjax_dp.train import LocalTrainConfig

N, T, B, Q, C, Z, SIGMA_B, DELTA = 8, 4, 2, 0.5, 2, 1.0, 2.0, 1e-5
LOCAL = LocalTrainConfig(steps=1, batch_size=2, learning_rate=0.5)
MODEL = make_model("mlp", (3,), 2, hidden=())
DIM = sum(int(np.prod(l.shape)) for l in jax.tree.leaves(MODEL.init(jax.random.key(0))))


def _strategy(kind):
    if kind == "blt":                 # a given BLT: no optimisation in the suite
        return correlated_lib.CorrelatedNoise("blt", B, T, buf_decay=(0.9, 0.4),
                                              output_scale=(0.2, 0.3))
    return correlated_lib.CorrelatedNoise(kind, B, T)


PARTICIPATION = {"poisson": participation.Poisson(Q), "fixed": participation.Fixed(C),
                 "cyclic": participation.Cyclic(B, cohort.Sampling("poisson", rate=Q))}
CLIPPING = {"fixed": clipping.FixedClip(1.0),
            "adaptive": clipping.AdaptiveClip(1.0, adaptive_lib.AdaptiveClip(
                learning_rate=0.2, count_noise=SIGMA_B, max_clip_norm=4.0))}
AGGREGATION = {"plain": aggregation.PlainSum(),
               "secagg": aggregation.SecureSum(secagg_lib.SecAggConfig(frac_bits=16))}
NOISE = {"gaussian": noise.GaussianNoise(Z),
         "banded_mf": correlated.BandedMF(_strategy("banded_mf"), Z),
         "blt": correlated.BLT(_strategy("blt"), Z),
         "tree": correlated.Tree(_strategy("tree"), Z),
         "ddg": distributed.DDG(distributed_lib.DistributedNoise("ddg", bits=20), Z),
         "skellam": distributed.Skellam(distributed_lib.DistributedNoise("skellam", bits=20), Z)}
SERVER = {"sgd": updates.PlainStep(1.0), "adam": updates.OptaxStep("adam", 0.01)}
AXES = {"participation": PARTICIPATION, "clipping": CLIPPING, "aggregation": AGGREGATION,
        "noise": NOISE, "server_update": SERVER}
CELLS = list(itertools.product(*(list(v) for v in AXES.values())))


def _chain(cell, client=updates.LocalSteps(None)) -> Chain:
    stages = {kind: AXES[kind][name] for kind, name in zip(AXES, cell)}
    return Chain(client_update=client, **stages)


def _expected_refusal(cell) -> tuple[str, str] | None:
    """The two stages that cannot go together in this cell, stated from the mechanisms (not
    read from the code): distributed noise needs the secure sum and exactly C of N each round;
    tree aggregation needs every agent's turns at least b rounds apart (cyclic groups)."""
    part, _, agg, nse, _ = cell
    if nse in ("ddg", "skellam") and agg == "plain":
        return f'noise "{nse}"', 'aggregation "plain"'
    if nse in ("ddg", "skellam") and part != "fixed":
        return f'noise "{nse}"', f'participation "{part}"'
    if nse == "tree" and part != "cyclic":
        return 'noise "tree"', f'participation "{part}"'
    return None


def _patterns(min_sep: int, turns: int):
    """Every participation pattern of T rounds: turns at least ``min_sep`` apart, at most
    ``turns`` of them (0/1 vectors)."""
    for bits in itertools.product((0, 1), repeat=T):
        on = [t for t in range(T) if bits[t]]
        if len(on) <= turns and all(b - a >= min_sep for a, b in zip(on, on[1:])):
            yield np.array(bits, np.float64)


def _brute_sensitivity_squared(kind: str, min_sep: int, turns: int) -> float:
    coefs = correlated_lib.strategy_coefs(_strategy(kind))
    c = np.array([[coefs[i - j] if i >= j else 0.0 for j in range(T)] for i in range(T)])
    return max(float(np.sum((c @ u) ** 2)) for u in _patterns(min_sep, turns))


def _per_turn(part: str, z: float):
    """A Gaussian of multiplier z each turn, amplified by the participation's draw."""
    if part == "fixed":
        return dp_accounting.SelfComposedDpEvent(dp_accounting.SampledWithoutReplacementDpEvent(
            N, C, dp_accounting.GaussianDpEvent(z / 2)), T)
    turns = T if part == "poisson" else math.ceil(T / B)
    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(Q, dp_accounting.GaussianDpEvent(z)), turns)


def _independent_epsilon(cell) -> float:
    """The aggregation and the server update release nothing new (a secure sum is the sum; a
    server step is post-processing): the expected epsilon depends on the other three only."""
    return _expected_epsilon(cell[0], cell[1], cell[3])


@functools.lru_cache(maxsize=None)
def _expected_epsilon(part: str, clip: str, nse: str) -> float:
    f = 2.0 if part == "fixed" else 1.0
    zc = 2 * SIGMA_B if clip == "adaptive" else None
    z_u = Z if zc is None else (Z ** -2 - zc ** -2) ** -0.5
    min_sep, turns = (B, math.ceil(T / B)) if part == "cyclic" else (1, T)
    count = [] if zc is None else [dp_accounting.SelfComposedDpEvent(
        dp_accounting.GaussianDpEvent(zc / f), turns)]
    if nse in ("ddg", "skellam"):
        return _distributed_epsilon(nse, z_u, zc)
    if nse == "gaussian" or (nse == "banded_mf" and part == "cyclic"):
        event = _per_turn(part, Z)           # (amplified banded MF: Choquette-Choo et al. Thm 4)
    elif nse == "tree":
        event = dp_accounting.ComposedDpEvent([dp_accounting.SelfComposedDpEvent(
            dp_accounting.SingleEpochTreeAggregationDpEvent(z_u / f, B), math.ceil(T / B))]
            + count)
    else:
        s = math.sqrt(_brute_sensitivity_squared(nse, min_sep, turns))
        event = dp_accounting.ComposedDpEvent([dp_accounting.GaussianDpEvent(z_u / (f * s))]
                                              + count)
    rel = dp_accounting.NeighboringRelation   # dp-accounting analyses the tree under its
    relation = (rel.REPLACE_SPECIAL if nse == "tree" else       # replace-special relation only
                rel.REPLACE_ONE if part == "fixed" else rel.ADD_OR_REMOVE_ONE)
    acc = dp_accounting.rdp.RdpAccountant(list(accounting.DEFAULT_RDP_ORDERS), relation)
    return acc.compose(event).get_epsilon(DELTA)


def _distributed_epsilon(kind: str, z_u: float, zc: float | None) -> float:
    spec = NOISE[kind].spec
    plan = distributed_lib.plan(spec, noise_multiplier=z_u, clip=1.0, dim=DIM, cohort=C)
    orders = distributed_accounting.ORDERS
    base_orders = np.arange(2, int(max(orders)) + 1)
    base = distributed_accounting.round_rdp(
        kind, base_orders, scaled_clip=1.0 / plan.scale, dim=plan.padded_dim, beta=spec.beta,
        total_variance=plan.total_variance, cohort=C, min_survivors=C)
    if zc is not None:
        base = base + distributed_accounting.count_round_rdp(
            kind, base_orders, total_variance=zc ** 2, cohort=C, min_survivors=C)
    full = np.concatenate([[0.0, 0.0], base])
    rdp = T * distributed_accounting.wor_subsampled_rdp(orders, lambda j: full[j],
                                                        population=N, cohort=C)
    return dp_accounting.rdp.compute_epsilon(orders, rdp, DELTA)[0]


_LEDGER_EPSILONS: dict = {}


def _ledger_epsilon(chain: Chain) -> float:
    """The ledger's epsilon of the chain's composed account (evaluated once per distinct
    account: cells differing only in aggregation or server give the same one)."""
    acc = chain.account(Setup(N, T, DIM, None))
    key = (acc.relation, repr(acc.event) if acc.event is not None else
           (tuple(acc.orders), np.asarray(acc.rdp).tobytes()))
    if key not in _LEDGER_EPSILONS:
        _LEDGER_EPSILONS[key] = _evaluate(acc)
    return _LEDGER_EPSILONS[key]


def _evaluate(acc) -> float:
    ledger = PrivacyLedger()
    if acc.event is None:
        ledger.add_rdp("agent", acc.orders, acc.rdp, relation=acc.relation,
                       data_dependent=False, sensitivity=acc.sensitivity, note=acc.note)
    else:
        ledger.add_event("agent", acc.event, relation=acc.relation, sensitivity=acc.sensitivity,
                         note=acc.note)
    return ledger.epsilon("agent", DELTA, "rdp")


@pytest.mark.parametrize("cell", CELLS, ids=["-".join(c) for c in CELLS])
def test_cell_is_accepted_with_its_composed_epsilon_or_refused_naming_both_stages(cell):
    refusal = _expected_refusal(cell)
    if refusal is not None:
        with pytest.raises(StageConflict) as err:
            _chain(cell)
        message = str(err.value)
        assert "\n" not in message and all(label in message for label in refusal), message
        return
    chain = _chain(cell)
    assert _ledger_epsilon(chain) == pytest.approx(_independent_epsilon(cell), rel=1e-9)


def test_relations_and_sensitivities_follow_the_participation():
    fixed = _chain(("fixed", "fixed", "plain", "gaussian", "sgd")).account(Setup(N, T))
    poisson = _chain(("poisson", "fixed", "plain", "blt", "sgd")).account(Setup(N, T))
    assert fixed.relation == participation.REPLACE_ONE and fixed.sensitivity == 2.0
    assert poisson.relation == participation.ADD_REMOVE and poisson.sensitivity == 1.0


def test_the_brute_force_equals_jax_privacys_min_sep_sensitivity():
    for kind, (m, k) in itertools.product(("banded_mf", "blt"), ((1, T), (B, 2), (1, 2))):
        s = correlated_lib.pattern_sensitivity(_strategy(kind), m, k)
        assert s ** 2 == pytest.approx(_brute_sensitivity_squared(kind, m, k), rel=1e-6)


# ---------------------------------------------------------------- tiny rounds, end to end

def _accepted_pairs(cell):
    return set(itertools.combinations(zip(AXES, cell), 2))


def _cover() -> list[tuple]:
    """Accepted cells, greedily, until every pair of stages some accepted cell holds is held."""
    accepted = [c for c in CELLS if _expected_refusal(c) is None]
    todo = set().union(*(_accepted_pairs(c) for c in accepted))
    chosen = []
    while todo:
        best = max(accepted, key=lambda c: len(_accepted_pairs(c) & todo))
        chosen.append(best)
        todo -= _accepted_pairs(best)
    return chosen


COVER = _cover()


@pytest.fixture(scope="module")
def fed():
    r = np.random.default_rng(0)
    ys = [r.integers(0, 2, size=3) for _ in range(N)]
    xs = [r.normal(size=(3, 3)).astype(np.float32) + y[:, None] for y in ys]
    return api.FederatedData(agents=from_ragged(xs, ys), num_classes=2)


@pytest.mark.parametrize("cell", COVER, ids=["-".join(c) for c in COVER])
def test_every_accepted_pair_of_stages_runs_a_round(fed, cell):
    chain = _chain(cell, rounds.local_steps(MODEL, LOCAL))
    key = jax.random.key(1)
    state = rounds.init_rounds(key, fed, MODEL, chain, T, api.Runtime(), local=LOCAL)
    start = state.values
    for t in range(2):
        state, metrics = rounds_protocol.step(state, api.step_key(key, t))
    flat = np.concatenate([np.ravel(a) for a in jax.tree.leaves(state.values["params"])])
    before = np.concatenate([np.ravel(a) for a in jax.tree.leaves(start["params"])])
    assert np.all(np.isfinite(flat)) and not np.array_equal(flat, before)
    stages = state.values["stages"]
    if cell[0] == "cyclic":
        assert int(stages[0]["round"]) == 2
    if cell[1] == "adaptive":
        assert float(stages[2]["clip_norm"]) != 1.0 and "unclipped_fraction" in metrics
    if cell[4] == "adam":
        assert int(stages[5][0].count) == 2
    if cell[3] in ("ddg", "skellam"):
        assert float(metrics["released"]) == 1.0


def test_the_cover_holds_every_accepted_pair():
    accepted = [c for c in CELLS if _expected_refusal(c) is None]
    assert set().union(*map(_accepted_pairs, accepted)) == \
        set().union(*map(_accepted_pairs, COVER))
    assert len(COVER) < len(accepted) / 4


def test_docs_mechanisms_table_is_generated_from_the_requirements():
    """docs/mechanisms.md holds table.markdown() between its markers (regenerate with
    ``python tools/docs_mechanisms_table.py``)."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "mechanisms.md").read_text()
    begin, end = "<!-- table: begin -->\n", "<!-- table: end -->"
    assert begin in text and end in text
    assert text.split(begin, 1)[1].split(end, 1)[0] == table.markdown()


def test_a_composed_shipped_config_runs_from_the_command_line_by_name(tmp_path, capsys):
    """Adaptive clipping under secure aggregation with distributed Skellam noise, the shipped
    config by name (tiny), through ``fedjax-dp run``: its guarantee is the composed RDP curve
    and covers every release; a bad pairing from --set is refused in one line naming both."""
    import json

    from fedjax_dp.experiments import cli
    small = ["--set=algorithm.rounds=2", "--set=train.steps=1", "--set=model.hidden=[4]",
             "--set=data.num_agents=20", "--set=algorithm.cohort_size=4",
             "--set=run.eval_every=0", "--quiet"]
    assert cli.main(["run", "dp_fedavg/mnist5k_adaptive_secagg_skellam", *small,
                     "--out", str(tmp_path / "run")]) == 0
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    (guarantee,) = result["privacy"]
    assert guarantee["covers_all_releases"] and "rdp" in guarantee["events"][0]
    assert "count in its own secure sum" in " ".join(guarantee["notes"])
    capsys.readouterr()
    assert cli.main(["run", "dp_fedavg/mnist5k_adaptive_secagg_skellam", *small,
                     "--set=algorithm.aggregation=plain", "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and 'noise "skellam" with aggregation "plain"' in err[0]
