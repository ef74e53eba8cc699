"""Semi-supervised (self-training) student of AE-DPFL / kNN-DPFL: post-processing, kept labels,
gain over the supervised student on a tiny task, config validation."""
import dataclasses

import jax
import numpy as np
import pytest

from fedjax_dp.algorithms.voting import ae_dpfl, knn_dpfl
from fedjax_dp.algorithms import api
from fedjax_dp.train import student as student_lib
from fedjax_dp.core import from_ragged, rng
from fedjax_dp.data import synthetic
from fedjax_dp.models import make_model
from fedjax_dp.train import LocalTrainConfig, accuracy
from voting_fixtures import run_voting

DELTA = 1e-5


NUM_PUBLIC, Q = 600, 12
STUDENT = LocalTrainConfig(steps=100, batch_size=16, learning_rate=0.5)


@pytest.fixture(scope="module")
def problem():
    """4-class Gaussian mixture in 10-d; one logistic model and one student config for every
    test (so the compiled student training is shared: shapes [1, Q] and [1, NUM_PUBLIC])."""
    ds = synthetic(num_train=240, num_public=NUM_PUBLIC, num_test=1000, num_features=10,
                   num_classes=4, seed=0, separation=2.5)
    data = from_ragged(list(ds.x_train.reshape(6, 40, 10)), list(ds.y_train.reshape(6, 40)))
    model = make_model("logistic", (10,), 4)
    return ds, data, model


def _same_params(a, b) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.mark.parametrize("algorithm", ["ae", "knn"])
def test_self_training_is_post_processing(problem, algorithm):
    """Same votes, same clean sums, identical ledger; only the student differs."""
    ds, data, model = problem
    if algorithm == "ae":
        mod = ae_dpfl
        base = ae_dpfl.Config(sigma=2.0, num_queries=Q, student_steps=STUDENT.steps,
                              student_batch_size=STUDENT.batch_size,
                              student_learning_rate=STUDENT.learning_rate,
                              local=LocalTrainConfig(steps=10, batch_size=8, learning_rate=0.2),
                              data_dependent=True)
    else:
        mod = knn_dpfl
        base = knn_dpfl.Config(k=3, sigma=0.5, num_queries=Q, feature_map="identity",
                               student_steps=STUDENT.steps, student_batch_size=STUDENT.batch_size,
                               student_learning_rate=STUDENT.learning_rate,
                               data_dependent=True)
    ssl = base.__class__(**{**base.__dict__, "student_semi_supervised": True,
                            "student_self_training_rounds": 2, "student_confidence": 0.5})
    assert base.semi_supervised is None
    assert ssl.semi_supervised == student_lib.SelfTraining(rounds=2, confidence=0.5)
    key = jax.random.key(3)
    kw = {"chunk_size": None} if algorithm == "ae" else {}
    r0 = run_voting(mod, key, data, model, base, ds.x_public, **kw)
    r1 = run_voting(mod, key, data, model, ssl, ds.x_public, **kw)
    np.testing.assert_array_equal(r0.query_indices, r1.query_indices)
    np.testing.assert_array_equal(r0.labels, r1.labels)
    np.testing.assert_array_equal(r0.clean_vote_sums, r1.clean_vote_sums)
    l0 = mod.ledger(base, r0.state)
    l1 = mod.ledger(ssl, r1.state)
    assert l0.to_json() == l1.to_json()
    for unit in ("agent", "instance", "agent_data_dependent", "instance_data_dependent"):
        assert l0.epsilon(unit, DELTA) == l1.epsilon(unit, DELTA)
    assert not _same_params(r0.params, r1.params)            # the student did change
    # composed from outside: the self-trained student's phase stepped on the supervised run's
    # released labels (a state just before the student phase, carrying the other config)
    before = api.State(step=len(mod.PHASES) - 1,
                       values={k: v for k, v in r0.state.values.items() if k != "params"},
                       context=dataclasses.replace(r0.state.context, config=ssl))
    composed, _ = mod.step(before, None)
    assert _same_params(composed.values["params"], r1.params)
    # the supervised path is unchanged: run's student == the plain supervised student
    sup = student_lib.train_supervised(rng.stream(key, "student"), model,
                                       ds.x_public[r0.query_indices], r0.labels, base.student)
    assert _same_params(sup, r0.params)


def test_released_labels_are_always_kept(problem, monkeypatch):
    """Every round trains on the Q released (x, y) pairs first, unchanged, plus pseudo-labels
    only for the unlabelled points; released labels the student disagrees with stay."""
    ds, _, model = problem
    q = Q
    x_l = ds.x_public[:q]
    labels = (ds.y_public[:q] + 1) % 4                        # deliberately wrong labels
    x_u = ds.x_public[q:]
    seen, supervised = [], []
    orig, orig_sup = student_lib.train_agents, student_lib.train_supervised

    def spy(key, params, data, *args, **kwargs):
        seen.append(jax.device_get(data))
        return orig(key, params, data, *args, **kwargs)

    def spy_sup(key, model, x, y, config):           # round 0: one compiled call of its own
        supervised.append((np.asarray(x), np.asarray(y)))
        return orig_sup(key, model, x, y, config)

    monkeypatch.setattr(student_lib, "train_agents", spy)
    monkeypatch.setattr(student_lib, "train_supervised", spy_sup)
    history = []
    student_lib.train_self_training(jax.random.key(0), model, x_l, labels, x_u, STUDENT,
                                    student_lib.SelfTraining(rounds=2, confidence=0.4),
                                    history=history)
    assert len(supervised) == 1 and len(seen) == 2 and len(history) == 2   # round 0 + 2 rounds
    np.testing.assert_array_equal(supervised[0][1], labels)
    np.testing.assert_allclose(supervised[0][0], x_l)
    for data, h in zip(seen, history):
        count = int(data.counts[0])
        assert count == q + h["num_pseudo"] and h["num_pseudo"] > 0
        np.testing.assert_array_equal(data.y[0, :q], labels)              # kept, unchanged
        np.testing.assert_allclose(data.x[0, :q], x_l)
        np.testing.assert_array_equal(np.asarray(data.mask[0]), np.arange(data.x.shape[1]) < count)
        # the pseudo-labelled rows are exactly the confident unlabelled points, with their labels
        kept = np.flatnonzero(h["kept"])
        np.testing.assert_allclose(data.x[0, q:count], x_u[kept])
        np.testing.assert_array_equal(data.y[0, q:count], h["pseudo_labels"][kept])
        assert np.all(h["confidence"][kept] >= 0.4)
        # one fixed training shape for every round (one compilation)
        assert data.x.shape[1] == q + len(x_u)


def test_self_training_beats_supervised_with_few_labels(problem):
    """12 labelled + 588 unlabelled points of a 4-class mixture (measured: 0.730 -> 0.777)."""
    ds, _, model = problem
    qidx = np.sort(np.random.default_rng(0).choice(NUM_PUBLIC, Q, replace=False))
    labels = ds.y_public[qidx]
    key = jax.random.key(0)
    sup = student_lib.train_student(key, model, ds.x_public, qidx, labels, STUDENT)
    ssl = student_lib.train_student(key, model, ds.x_public, qidx, labels, STUDENT,
                                    student_lib.SelfTraining(rounds=2, confidence=0.9))
    acc_sup = accuracy(model, sup, ds.x_test, ds.y_test)
    acc_ssl = accuracy(model, ssl, ds.x_test, ds.y_test)
    assert acc_ssl >= acc_sup + 0.03, (acc_sup, acc_ssl)


@pytest.mark.parametrize("cls", [ae_dpfl.Config, knn_dpfl.Config])
@pytest.mark.parametrize("field,value", [
    ("student_semi_supervised", "yes"), ("student_semi_supervised", 1),
    ("student_self_training_rounds", 0), ("student_self_training_rounds", 1.5),
    ("student_confidence", 0.0), ("student_confidence", 1.5), ("student_confidence", "high"),
])
def test_config_validation_names_the_field(cls, field, value):
    with pytest.raises(ValueError, match=f"algorithm.{field}"):
        cls(**{field: value})


def test_self_training_settings_validation():
    with pytest.raises(ValueError, match="self_training_rounds"):
        student_lib.SelfTraining(rounds=0)
    with pytest.raises(ValueError, match="confidence"):
        student_lib.SelfTraining(confidence=2.0)
    assert ae_dpfl.Config(student_semi_supervised=True).semi_supervised == \
        student_lib.SelfTraining()
    with pytest.raises(ValueError, match="semi must be a student.SelfTraining"):
        student_lib.train_self_training(jax.random.key(0), make_model("logistic", (2,), 2),
                                        np.zeros((2, 2)), np.zeros(2, int), np.zeros((3, 2)),
                                        LocalTrainConfig(steps=1), {"rounds": 1})


def test_supervised_student_is_the_one_agent_training(problem):
    """``train_supervised`` (one compiled call: key splits, initialisation and training) equals
    the one-agent ``train_agents`` from ``model.init(k_init)`` it replaces."""
    from fedjax_dp.train import train_agents
    ds, _, model = problem
    key = jax.random.key(11)
    x, y = ds.x_public[:Q], ds.y_public[:Q]
    k_init, k_train = jax.random.split(key)
    ref, _ = train_agents(k_train, model.init(k_init), from_ragged([x], [y]), model, STUDENT,
                          chunk_size=None)
    got = student_lib.train_supervised(key, model, x, y, STUDENT)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(ref)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b)[0], rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="as many labels as records"):
        student_lib.train_supervised(key, model, x, y[:3], STUDENT)
