"""Bench part: the char-LSTM DP-FedAvg round on ragged clients (issue 52, docs/bench.md).

The workload of TFF's Shakespeare benchmark (McMahan et al. 2017; Reddi et al. 2021): an
embedding of 8, two LSTM layers of ``hidden`` units, a dense layer to the V characters, windows
of T characters, next-character loss (:class:`fedjax_dp.models.tasks.NextToken`). A round: a
fixed-size cohort of C clients drawn without replacement, each ``local_steps`` SGD steps of
``batch`` records (learning rate 1) from the global model, its delta clipped to L2 norm 1, the
cohort's sum plus ``N(0, 1^2 I)``, divided by C, added to the model.

The clients: ``population = None`` draws ``clients`` ragged synthetic clients (record counts
log-normal around 40, between 4 and 400; T = ``seq``, V = ``vocab``); a folder (``fedjax-dp
bench --population DIR``) reads a converted population (``fedjax-dp data convert
gutenberg_shakespeare SRC DIR``, memory-mapped, its own T, V and record counts).

Three rounds, timed per cohort size C in ``cohorts``:

* ``library``: :mod:`fedjax_dp.algorithms.averaging.dp_fedavg` with ``char_lstm`` (the
  library's :func:`fedjax_dp.models.sequence.lstm_layer`), the gathered cohort, one round per
  call (:func:`fedjax_dp.algorithms.api.step`);
* ``flax_layer``: the same round with :class:`FlaxLayerLM`, whose layers are flax's
  ``nn.RNN(nn.OptimizedLSTMCell)`` (the same parameter tree);
* ``hand_scan``: a plain-JAX round (:func:`hand_scan_round`): the LSTM a ``lax.scan`` with
  the gates fused and the input projection hoisted, a batch loss per client, ``vmap`` over the
  cohort; its cohort and batches drawn on the host.

Ratios ``library_over_hand_scan`` and ``library_over_flax_layer`` per cohort, of timings taken
in the same run.
"""
from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.bench import common
from fedjax_dp.models import sequence

NAME = "char_lstm_round"
TITLE = "the char-LSTM DP-FedAvg round on ragged clients: the library vs a hand-written scan"

CLIP, NOISE, LR = 1.0, 1.0, 1.0
VARIANTS = ("library", "flax_layer", "hand_scan")


class FlaxLayerLM(sequence.LSTMLM):
    """:class:`~fedjax_dp.models.sequence.LSTMLM` with flax's own recurrent layer,
    ``nn.RNN(nn.OptimizedLSTMCell(hidden))``, in place of the library's: the same parameter
    tree and initial values (the reference of the library's layer)."""

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:        # x [B, T] int32 -> [B, T, V]
        h = nn.Embed(self.vocab_size, self.embed_dim)(x)
        for _ in range(self.layers):
            h = nn.RNN(nn.OptimizedLSTMCell(self.hidden))(h)
        if self.projection:
            h = nn.Dense(self.projection)(h)
        return nn.Dense(self.vocab_size)(h)


def synthetic_clients(clients: int, seq: int, vocab: int, seed: int = 0):
    """``(agents, task)``: ragged clients of next-character records (ids 1 .. V-1, 0 the
    padding), record counts log-normal around 40, clipped to [4, 400]."""
    from fedjax_dp.core import from_ragged
    from fedjax_dp.models import tasks

    rng = np.random.default_rng(seed)
    sizes = np.clip(rng.lognormal(np.log(40), 1.0, clients).astype(int), 4, 400)
    xs = [rng.integers(1, vocab, (n, seq)).astype(np.int32) for n in sizes]
    ys = [np.roll(x, -1, axis=1) for x in xs]
    return (from_ragged(xs, ys, dtype=np.int32),
            tasks.NextToken(vocab_size=vocab, pad_id=0))


def population_clients(path: str):
    """``(agents, task)`` of a converted population folder (memory-mapped)."""
    from fedjax_dp.core import load_stacked
    from fedjax_dp.models import tasks

    return load_stacked(path), tasks.load(path)


def library_round(agents, task, cohort: int, hidden: int, layer: str, local_steps: int,
                  batch: int) -> tuple[Callable[[], Any], int]:
    """``(step, parameters)``: ``step()`` runs the next DP-FedAvg round of the library."""
    from fedjax_dp.algorithms import api
    from fedjax_dp.algorithms.averaging import dp_fedavg
    from fedjax_dp.models import classifiers, make_model, tasks
    from fedjax_dp.train import LocalTrainConfig

    seq, vocab = int(agents.x.shape[-1]), task.vocab_size
    if layer == "library":
        model = make_model("char_lstm", (seq,), vocab, options={"hidden": hidden})
    else:              # wrapped as make_model wraps char_lstm (one sequence per apply)
        model = classifiers._wrap(FlaxLayerLM(vocab, hidden=hidden), "char_lstm_flax_layer",
                                  (seq,), vocab, jnp.int32, compiled_init=True)
    model = tasks.attach(model, task)
    fed = api.FederatedData(agents=agents, num_classes=vocab)
    cfg = dp_fedavg.Config(rounds=1000, sampling="fixed", cohort_size=cohort,
                           clip_norm=CLIP, noise_multiplier=NOISE,
                           local=LocalTrainConfig(steps=local_steps, batch_size=batch,
                                                  learning_rate=LR))
    box = [dp_fedavg.init(jax.random.key(1), fed, model, cfg,
                          api.Runtime(cohort="gather", rounds_per_call=1))]
    root = jax.random.key(0)

    def step():
        state = box[0]
        box[0], metrics = dp_fedavg.step(state, api.step_key(root, state.step))
        return box[0].values["params"], metrics

    return step, common.num_params(box[0].values["params"])


def _lstm(p: dict, x: jax.Array) -> jax.Array:          # x [B, T] int32 -> logits [B, T, V]
    h = p["embed"][x]                                     # [B, T, E]
    for w_in, w_rec, b in p["layers"]:
        z = jnp.einsum("bte,eg->tbg", h, w_in) + b        # [T, B, 4H]: hoisted projection

        def cell(carry, z_t, w_rec=w_rec):
            c, hh = carry
            i, f, g, o = jnp.split(z_t + hh @ w_rec, 4, axis=-1)      # one fused matmul
            c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
            hh = jax.nn.sigmoid(o) * jnp.tanh(c)
            return (c, hh), hh

        zeros = jnp.zeros((x.shape[0], w_rec.shape[0]), h.dtype)
        h = jnp.swapaxes(jax.lax.scan(cell, (zeros, zeros), z)[1], 0, 1)     # [B, T, H]
    return h @ p["out_w"] + p["out_b"]


def hand_scan_round(agents, task, cohort: int, hidden: int, local_steps: int, batch: int,
                    embed: int = 8, seed: int = 1) -> tuple[Callable[[], Any], int]:
    """``(step, parameters)``: the plain-JAX DP-FedAvg round; the cohort (without replacement)
    and every client's ``local_steps x batch`` records (uniform over its records) drawn on the
    host, gathered, and the round one jitted call on ``[C, S, B, T]``."""
    vocab, pad = task.vocab_size, task.pad_id
    r = np.random.default_rng(seed)
    dims = [embed, hidden]
    p = {"embed": r.normal(size=(vocab, embed)).astype(np.float32),
         "layers": [(r.normal(size=(d, 4 * hidden)).astype(np.float32) / np.sqrt(d),
                     r.normal(size=(hidden, 4 * hidden)).astype(np.float32) / np.sqrt(hidden),
                     np.zeros(4 * hidden, np.float32)) for d in dims],
         "out_w": r.normal(size=(hidden, vocab)).astype(np.float32) / np.sqrt(hidden),
         "out_b": np.zeros(vocab, np.float32)}
    counts = np.asarray(agents.counts)                    # [N]

    def loss(q, x, y):                                    # x, y [B, T]
        logp = jax.nn.log_softmax(_lstm(q, x))
        m = (y != pad).astype(jnp.float32)
        nll = -jnp.take_along_axis(logp, y[..., None], -1)[..., 0]              # [B, T]
        return jnp.mean(jnp.sum(nll * m, -1) / jnp.maximum(1.0, jnp.sum(m, -1)))

    def client(q, x, y):                                  # x, y [S, B, T]
        def sgd(q, xy):
            g = jax.grad(loss)(q, *xy)
            return jax.tree.map(lambda a, d: a - LR * d, q, g), None
        local, _ = jax.lax.scan(sgd, q, (x, y))
        delta = jax.tree.map(lambda a, b: a - b, local, q)
        norm = jnp.sqrt(sum(jnp.sum(d ** 2) for d in jax.tree.leaves(delta)))
        return jax.tree.map(lambda d: d * jnp.minimum(1.0, CLIP / norm), delta)

    @jax.jit
    def round_(q, key, x, y):                             # x, y [C, S, B, T]
        deltas = jax.vmap(client, (None, 0, 0))(q, x, y)
        leaves, tree = jax.tree.flatten(jax.tree.map(lambda d: d.sum(0), deltas))
        noise = [NOISE * CLIP * jax.random.normal(k, l.shape)
                 for k, l in zip(jax.random.split(key, len(leaves)), leaves)]
        update = jax.tree.unflatten(tree, [(l + z) / cohort for l, z in zip(leaves, noise)])
        return jax.tree.map(lambda a, b: a + b, q, update)

    box, rng, t = [jax.tree.map(jnp.asarray, p)], np.random.default_rng(seed + 1), [0]

    def step():
        ids = rng.choice(len(counts), cohort, replace=False)                       # [C]
        rows = (rng.random((cohort, local_steps, batch))
                * counts[ids][:, None, None]).astype(np.int64)                   # [C, S, B]
        x = np.asarray(agents.x[ids[:, None, None], rows])                     # [C, S, B, T]
        y = np.asarray(agents.y[ids[:, None, None], rows])
        box[0] = round_(box[0], jax.random.key(t[0]), x, y)
        t[0] += 1
        return box[0]

    return step, common.num_params(box[0])


def check_sizes(sizes: dict) -> None:
    """A clear error for sizes no round can run with (before any work)."""
    for key in ("hidden", "local_steps", "batch", "clients", "seq", "vocab"):
        if int(sizes[key]) < 1:
            raise ValueError(f"{NAME}.{key} must be at least 1, got {sizes[key]}")
    unknown = [v for v in sizes.get("variants", VARIANTS) if v not in VARIANTS]
    if unknown:
        raise ValueError(f"{NAME}.variants: unknown {unknown}; the variants are {VARIANTS}")


def measure(sizes: dict, repeats: int) -> dict:
    check_sizes(sizes)
    hidden, steps, batch = sizes["hidden"], sizes["local_steps"], sizes["batch"]
    if sizes.get("population"):
        agents, task = population_clients(sizes["population"])
        source = str(sizes["population"])
    else:
        agents, task = synthetic_clients(sizes["clients"], sizes["seq"], sizes["vocab"])
        source = "synthetic"
    n = agents.num_agents
    cohorts = [int(c) for c in sizes["cohorts"]]
    if not all(1 <= c <= n for c in cohorts):
        raise ValueError(f"{NAME}.cohorts must be in [1, {n}] (the clients), got {cohorts}")
    variants = list(sizes.get("variants", VARIANTS))
    makers = {"library": lambda c: library_round(agents, task, c, hidden, "library", steps,
                                                 batch),
              "flax_layer": lambda c: library_round(agents, task, c, hidden, "flax", steps,
                                                    batch),
              "hand_scan": lambda c: hand_scan_round(agents, task, c, hidden, steps, batch)}
    times, params, pairs = {}, {}, {}
    for c in cohorts:
        for v in variants:
            step, params[v] = makers[v](c)
            times[f"{v}_c{c}"] = common.time_fn(step, repeats)
        for ref in ("hand_scan", "flax_layer"):
            if "library" in variants and ref in variants:
                pairs[f"library_over_{ref}_c{c}"] = (f"library_c{c}", f"{ref}_c{c}")
    counts = np.asarray(agents.counts)
    return {"name": NAME, "title": TITLE,
            "sizes": {**{k: v for k, v in sizes.items() if k != "population"},
                      "clients_source": source, "clients": n,
                      "seq": int(agents.x.shape[-1]), "vocab": task.vocab_size,
                      "records_per_client_median": float(np.median(counts)),
                      "num_params": params},
            "times": times, "pairs": pairs}
