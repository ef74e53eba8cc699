"""Work that cannot fit in memory is refused before it runs, in one line (fedjax_dp.core.memory)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dp.algorithms.voting import ae_dpfl, knn_dpfl
from fedjax_dp.algorithms import api, isrl, seeds
from fedjax_dp.algorithms.averaging import fedavg
from fedjax_dp.core import from_ragged, memory
from fedjax_dp.models import make_model
from fedjax_dp.train import LocalTrainConfig, make_local_update

TINY = "200kB"


@pytest.fixture(scope="module")
def problem():
    r = np.random.default_rng(0)
    ys = [r.integers(0, 3, size=n) for n in (6, 4, 5, 6)]
    xs = [r.normal(size=(len(y), 5)).astype(np.float32) + y[:, None] for y in ys]
    model = make_model("mlp", (5,), 3, hidden=(8,))
    x_public = r.normal(size=(40, 5)).astype(np.float32)
    return from_ragged(xs, ys), model, x_public


def test_parse_and_limit(monkeypatch):
    assert memory.parse_bytes("2GB") == 2 * 10 ** 9
    assert memory.parse_bytes("512MiB") == 512 * 2 ** 20
    assert memory.parse_bytes("1e9") == 10 ** 9
    with pytest.raises(ValueError, match=memory.ENV):
        memory.parse_bytes("lots")
    monkeypatch.setenv(memory.ENV, "3MB")
    assert memory.memory_limit() == memory.Limit(3 * 10 ** 6, f"{memory.ENV}=3MB", True)
    monkeypatch.setenv(memory.ENV, "off")
    assert memory.memory_limit() is None
    monkeypatch.delenv(memory.ENV)
    limit = memory.memory_limit()            # the device's free / host's available memory
    assert limit is None or (limit.bytes > 0 and not limit.counts_arguments)


def test_estimate_of_a_matmul_matches_its_buffers():
    peaks = []
    for n in (64, 128, 256):
        x = jnp.ones((n, 2 * n), jnp.float32)
        est = memory.estimate(jax.jit(lambda a: a @ a.T).lower(x).compile())
        if est is None:
            pytest.skip("this platform reports no memory analysis")
        assert est.arguments == 4 * 2 * n * n and est.outputs == 4 * n * n
        true = 4 * 3 * n * n                              # input + output
        assert true <= est.peak <= 2 * true
        peaks.append(est.peak)
    assert peaks == sorted(peaks)


def test_check_adds_no_compilation(monkeypatch):
    """The check's lower+compile is the compilation the call uses (jax keeps the executable);
    later calls of the same shape are not checked again."""
    from jax import monitoring
    events = []
    monitoring.register_event_duration_secs_listener(
        lambda name, secs, **kw: events.append(name))
    monkeypatch.setenv(memory.ENV, "1GB")
    f = memory.checked(jax.jit(lambda a: jnp.tanh(a @ a.T)), what="t")
    x = jnp.ones((37, 19))
    events.clear()
    f(x)
    f(x)
    assert events.count("/jax/core/compile/backend_compile_duration") == 1


def test_estimate_grows_with_batch_size(problem):
    data, model, _ = problem
    params = model.init(jax.random.key(0))
    one = (jax.random.key(1), params, data.x[0], data.y[0], data.mask[0], data.counts[0])
    peaks = []
    for b in (8, 256, 8192):
        fn = jax.jit(make_local_update(model, LocalTrainConfig(steps=1, batch_size=b)))
        est = memory.estimate(fn.lower(*one))
        if est is None:
            pytest.skip("this platform reports no memory analysis")
        peaks.append(est.peak)
    assert peaks[0] < peaks[1] < peaks[2]
    assert peaks[2] > 8192 * 5 * 4                   # at least the batch's features [B, d]


def _fedavg_config(batch_size):
    return fedavg.Config(rounds=2, local=LocalTrainConfig(steps=1, batch_size=batch_size))


def test_fedavg_big_batch_refused_before_any_round(problem, monkeypatch):
    data, model, _ = problem
    monkeypatch.setenv(memory.ENV, TINY)
    rounds = []
    with pytest.raises(memory.MemoryBudgetError) as e:
        api.run(fedavg, jax.random.key(0), api.FederatedData(agents=data, num_classes=3), model,
                _fedavg_config(20000), on_step=lambda t, m: rounds.append(t))
    msg = str(e.value)
    assert rounds == [] and "\n" not in msg and isinstance(e.value, ValueError)
    assert "train.batch_size (20000)" in msg and "run.chunk_size" in msg and TINY in msg
    assert "model.hidden ([8])" in msg
    monkeypatch.setenv(memory.ENV, "2GB")          # a normal limit: the same run runs
    hist = api.run(fedavg, jax.random.key(0), api.FederatedData(agents=data, num_classes=3),
                   model, _fedavg_config(20000))
    assert len(hist.history) == 2


def test_seeds_round_refused(problem, monkeypatch):
    """S seeds' rounds in one vmapped call (the seed driver) are checked before their first run."""
    data, model, _ = problem
    fed = api.FederatedData(agents=data, num_classes=3)
    states = [fedavg.init(jax.random.key(s), fed, model, _fedavg_config(20000),
                          api.Runtime(chunk_size=None)) for s in range(2)]
    step = seeds.seed_batch(fedavg, states)
    assert step is not None
    monkeypatch.setenv(memory.ENV, TINY)
    with pytest.raises(memory.MemoryBudgetError, match=r"one step of 2 seeds"):
        step(states, [api.step_key(jax.random.key(s), 0) for s in range(2)])


def test_ae_dpfl_chunk_refused_naming_chunk_size(problem, monkeypatch):
    data, model, x_public = problem
    monkeypatch.setenv(memory.ENV, TINY)
    cfg = ae_dpfl.Config(sigma=1.0, num_queries=10, student_steps=2, agent_chunk=2,
                         local=LocalTrainConfig(steps=2, batch_size=20000))
    with pytest.raises(memory.MemoryBudgetError,
                       match=r"chunk of 2 agents.*run\.chunk_size.*train\.batch_size \(20000\)"):
        api.run(ae_dpfl, jax.random.key(0),
                api.FederatedData(agents=data, num_classes=3, x_public=x_public), model, cfg,
                runtime=api.Runtime(chunk_size=None))


def test_knn_search_chunk_refused_naming_agent_chunk(problem, monkeypatch):
    data, model, _ = problem
    r = np.random.default_rng(1)
    x_public = r.normal(size=(3000, 5)).astype(np.float32)
    monkeypatch.setenv(memory.ENV, TINY)
    cfg = knn_dpfl.Config(k=2, sigma=1.0, num_queries=3000, student_steps=2, agent_chunk=4,
                          feature_map="identity")
    with pytest.raises(memory.MemoryBudgetError,
                       match=r"kNN search of a chunk of 4 agents.*algorithm\.agent_chunk \(4\)"):
        api.run(knn_dpfl, jax.random.key(0),
                api.FederatedData(agents=data, num_classes=3, x_public=x_public), model, cfg)


def test_knn_search_of_vmapped_seeds_refused_naming_the_seeds(problem, monkeypatch):
    """The seeds' path (one vmapped kNN search of S seeds per chunk) is budgeted as the single
    seed's: refused before any work, naming the chunk, the queries and the seeds."""
    from fedjax_dp.algorithms import seeds
    data, model, _ = problem
    x_public = np.random.default_rng(1).normal(size=(3000, 5)).astype(np.float32)
    cfg = knn_dpfl.Config(k=2, sigma=1.0, num_queries=3000, student_steps=2, agent_chunk=4,
                          feature_map="identity")
    fed = api.FederatedData(agents=data, num_classes=3, x_public=x_public)
    monkeypatch.setenv(memory.ENV, TINY)
    with pytest.raises(memory.MemoryBudgetError,
                       match=r"kNN search of a chunk of 4 agents .* for 3000 queries, 2 seeds "
                             r"vmapped together.*algorithm\.agent_chunk \(4\), "
                             r"algorithm\.num_queries \(3000\) or seeds vmapped together \(2\)"):
        seeds.run_seeds(knn_dpfl, [jax.random.key(0), jax.random.key(1)], [fed, fed], model, cfg)


def test_isrl_round_refused(monkeypatch):
    from isrl_fixtures import FED, MODEL, config
    monkeypatch.setenv(memory.ENV, "1kB")
    with pytest.raises(memory.MemoryBudgetError,
                       match=r"a round of 2 of 4 silos.*run\.chunk_size \(none\), "
                             r"algorithm\.num_available \(2\) or model\.hidden \(\[4\]\)"):
        api.run(isrl.ALGORITHMS["local_sgd"], jax.random.key(0), FED, MODEL,
                config("local_sgd"), runtime=api.Runtime(chunk_size=None))


def test_dp_fnas_compiled_step_refused(monkeypatch):
    """DP-FNAS compiles its iterations ahead (dp_fnas.compile_checked): a new one is checked there,
    naming the phase's config keys (a stand-in step: the real search step compiles slowly)."""
    from fedjax_dp.algorithms.fnas import dp_fnas
    monkeypatch.setenv(memory.ENV, "1kB")
    cfg = dp_fnas.Config(batch_size=64, channels=3)
    step = jax.jit(lambda a: jnp.tanh(a @ a.T))
    with pytest.raises(memory.MemoryBudgetError,
                       match=r"a search iteration.*algorithm\.batch_size \(64\), "
                             r"algorithm\.channels \(3\)"):
        dp_fnas.compile_checked(step, jnp.ones((41, 7)), what="a search iteration",
                          drivers=dp_fnas.memory_drivers(cfg, "search"))
    assert "algorithm.retrain_channels" in dp_fnas.memory_drivers(cfg, "retrain")
    monkeypatch.setenv(memory.ENV, "1GB")
    fn, _ = dp_fnas.compile_checked(step, jnp.ones((41, 7)), what="a search iteration")
    assert fn(jnp.ones((41, 7))).shape == (41, 41)


def test_explain_oom_is_one_line():
    exc = RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 25853536472 bytes.\n"
                       "  File ...\n")
    line = memory.explain_oom(exc)
    assert line is not None and "\n" not in line and "25.9 GB" in line
    assert "lower" in line
    assert memory.explain_oom(RuntimeError("shapes do not match")) is None
    assert memory.explain_oom(ValueError("x: out of memory is not a value")) is None
    assert "\n" not in memory.explain_oom(MemoryError("Unable to allocate 3 GiB\nfor an array"))
    budget = memory.MemoryBudgetError("x needs 3 GB")
    assert memory.explain_oom(budget) == "x needs 3 GB"


@pytest.mark.parametrize("setting, named", [
    ("train.batch_size=100000", "train.batch_size (100000)"),      # an oversized batch
    ("model.hidden=[16384]", "model.hidden ([16384])"),            # an oversized model
])
def test_cli_refuses_big_batch_or_model_in_one_line(tmp_path, monkeypatch, capsys, setting,
                                                     named):
    from fedjax_dp.experiments import cli
    monkeypatch.setenv(memory.ENV, "1GB")
    out = tmp_path / "x"
    rc = cli.main(["run", "configs/dp_fedavg/mnist5k.toml", "--set", setting,
                   "--set", "algorithm.rounds=1", "--set", "run.checkpoint_every=0",
                   "--out", str(out), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1 and named in err
    assert not out.exists()                          # refused before any round: no run left
