"""The char-LSTM DP-FedAvg round (issue 52 item 4): the library's round with its LSTM layer, the
same round with flax's ``nn.RNN(nn.OptimizedLSTMCell)`` layer, and a hand-written plain-JAX round.

    python tools/bench_char_lstm.py [--cohorts 10,100] [--rounds 5] [--hidden 256] [--out FILE]

Workload (TFF's Shakespeare model, McMahan et al. 2017 / Reddi et al. 2021): embedding 8, two LSTM
layers of ``hidden`` units, a dense layer to 90 characters, sequences of 80 (820,522 parameters at
hidden 256); ``clients`` ragged synthetic clients (record counts log-normal around 40, at least
4); a round: a fixed-size cohort of C clients, each 4 local SGD steps of batch 4 from the global
model, its delta clipped to L2 norm 1, the sum plus N(0, 1^2) noise, divided by C.

* ``library``: :mod:`fedjax_dp.algorithms.averaging.dp_fedavg`, ``char_lstm`` (this library's
  :func:`fedjax_dp.models.sequence.lstm_layer`), the gathered cohort, one round per call;
* ``flax_layer``: the same round with a module whose layers are flax's
  ``nn.RNN(nn.OptimizedLSTMCell)`` (the same parameters), wrapped as ``make_model`` wraps
  ``char_lstm``;
* ``hand_scan``: a plain-JAX round: the LSTM as a ``lax.scan`` with fused gates and the input
  projection hoisted, a batch loss per client, ``vmap`` over the cohort.

Median seconds per round over ``rounds`` timed rounds after one warm-up round; the ratios
library / flax_layer and library / hand_scan are of timings taken in this run. Writes JSON.
"""
from __future__ import annotations

import argparse
import json
import platform
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

VOCAB, SEQ, EMBED, LOCAL_STEPS, BATCH, CLIP, NOISE, LR = 90, 80, 8, 4, 4, 1.0, 1.0, 1.0


def population(clients: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    sizes = np.clip(rng.lognormal(np.log(40), 1.0, clients).astype(int), 4, 400)
    xs = [rng.integers(1, VOCAB, (n, SEQ)).astype(np.int32) for n in sizes]
    return xs, [np.roll(x, -1, axis=1) for x in xs], sizes


def library_step(xs, ys, cohort: int, hidden: int, layer: str):
    """``(step(t), params)``: one DP-FedAvg round of the library per call."""
    from fedjax_dp.algorithms import api
    from fedjax_dp.algorithms.averaging import dp_fedavg
    from fedjax_dp.core import from_ragged
    from fedjax_dp.models import classifiers, make_model, sequence, tasks
    from fedjax_dp.train import LocalTrainConfig

    task = tasks.NextToken(vocab_size=VOCAB, pad_id=0)
    if layer == "library":
        model = make_model("char_lstm", (SEQ,), VOCAB, options={"hidden": hidden})
    else:
        class FlaxLayerLM(sequence.LSTMLM):
            @nn.compact
            def __call__(self, x):
                h = nn.Embed(self.vocab_size, self.embed_dim)(x)
                for _ in range(self.layers):
                    h = nn.RNN(nn.OptimizedLSTMCell(self.hidden))(h)
                return nn.Dense(self.vocab_size)(h)
        # wrapped as make_model wraps the library's char_lstm (one sequence per apply)
        model = classifiers._wrap(FlaxLayerLM(VOCAB, embed_dim=EMBED, hidden=hidden),
                                  "char_lstm_flax_layer", (SEQ,), VOCAB, jnp.int32,
                                  compiled_init=True)
    model = tasks.attach(model, task)
    fed = api.FederatedData(agents=from_ragged(xs, ys, dtype=np.int32), num_classes=VOCAB)
    cfg = dp_fedavg.Config(rounds=1000, sampling="fixed", cohort_size=cohort, clip_norm=CLIP,
                           noise_multiplier=NOISE,
                           local=LocalTrainConfig(steps=LOCAL_STEPS, batch_size=BATCH,
                                                  learning_rate=LR))
    box = [dp_fedavg.init(jax.random.key(1), fed, model, cfg,
                          api.Runtime(cohort="gather", rounds_per_call=1))]
    key = jax.random.key(0)

    def step(t):
        box[0], metrics = dp_fedavg.step(box[0], api.step_key(key, t))
        jax.block_until_ready((box[0].values["params"], metrics))

    return step, sum(int(np.prod(l.shape)) for l in jax.tree.leaves(box[0].values["params"]))


def _lstm(p, x):                                   # x [B, T] int32 -> logits [B, T, V]
    h = p["embed"][x]
    for w_in, w_rec, b in p["layers"]:
        z = jnp.einsum("bte,eg->tbg", h, w_in) + b

        def cell(carry, z_t, w_rec=w_rec):
            c, hh = carry
            i, f, g, o = jnp.split(z_t + hh @ w_rec, 4, axis=-1)
            c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
            hh = jax.nn.sigmoid(o) * jnp.tanh(c)
            return (c, hh), hh

        zeros = jnp.zeros((x.shape[0], w_rec.shape[0]))
        h = jnp.swapaxes(jax.lax.scan(cell, (zeros, zeros), z)[1], 0, 1)
    return h @ p["out_w"] + p["out_b"]


def hand_scan_step(xs, ys, sizes, cohort: int, hidden: int):
    """``(step(t), params)``: the plain-JAX round per call."""
    r = np.random.default_rng(1)
    dims = [EMBED, hidden]
    p = {"embed": r.normal(size=(VOCAB, EMBED)).astype(np.float32),
         "layers": [(r.normal(size=(d, 4 * hidden)).astype(np.float32) / np.sqrt(d),
                     r.normal(size=(hidden, 4 * hidden)).astype(np.float32) / np.sqrt(hidden),
                     np.zeros(4 * hidden, np.float32)) for d in dims],
         "out_w": r.normal(size=(hidden, VOCAB)).astype(np.float32) / np.sqrt(hidden),
         "out_b": np.zeros(VOCAB, np.float32)}
    params = jax.tree.map(jnp.asarray, p)
    n_max = int(sizes.max())
    X = jnp.asarray(np.stack([np.pad(x, ((0, n_max - len(x)), (0, 0))) for x in xs]))
    Y = jnp.asarray(np.stack([np.pad(y, ((0, n_max - len(y)), (0, 0))) for y in ys]))
    N = jnp.asarray(sizes, jnp.int32)

    def loss(q, x, y):
        logp = jax.nn.log_softmax(_lstm(q, x))
        return -jnp.mean(jnp.take_along_axis(logp, y[..., None], -1))

    def client(key, q, x, y, n):
        def sgd(q, k):
            idx = jnp.floor(jax.random.uniform(k, (BATCH,)) * n).astype(jnp.int32)
            g = jax.grad(loss)(q, x[idx], y[idx])
            return jax.tree.map(lambda a, b: a - LR * b, q, g), None
        local, _ = jax.lax.scan(sgd, q, jax.random.split(key, LOCAL_STEPS))
        delta = jax.tree.map(lambda a, b: a - b, local, q)
        norm = jnp.sqrt(sum(jnp.sum(d ** 2) for d in jax.tree.leaves(delta)))
        return jax.tree.map(lambda d: d * jnp.minimum(1.0, CLIP / norm), delta)

    @jax.jit
    def round_(q, key):
        k_pick, k_local, k_noise = jax.random.split(key, 3)
        ids = jax.random.choice(k_pick, X.shape[0], (cohort,), replace=False)
        deltas = jax.vmap(client, (0, None, 0, 0, 0))(jax.random.split(k_local, cohort), q,
                                                      X[ids], Y[ids], N[ids])
        leaves, tree = jax.tree.flatten(jax.tree.map(lambda d: d.sum(0), deltas))
        noise = [NOISE * CLIP * jax.random.normal(k, l.shape)
                 for k, l in zip(jax.random.split(k_noise, len(leaves)), leaves)]
        update = jax.tree.unflatten(tree, [(l + z) / cohort for l, z in zip(leaves, noise)])
        return jax.tree.map(lambda a, b: a + b, q, update)

    box = [params]

    def step(t):
        box[0] = jax.block_until_ready(round_(box[0], jax.random.key(t)))

    return step, sum(int(np.prod(l.shape)) for l in jax.tree.leaves(params))


def timed(step, rounds: int) -> dict:
    t0 = time.perf_counter()
    step(0)                                        # warm-up: compiles
    first = time.perf_counter() - t0
    times = []
    for t in range(1, rounds + 1):
        t0 = time.perf_counter()
        step(t)
        times.append(time.perf_counter() - t0)
    return {"first_s": first, "median_s": float(np.median(times)), "min_s": float(min(times)),
            "all_s": times}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cohorts", default="10", help="comma-separated cohort sizes (default 10)")
    ap.add_argument("--clients", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--out", default=None, help="JSON file to write")
    a = ap.parse_args(argv)
    cohorts = [int(c) for c in a.cohorts.split(",")]
    if a.clients < max(cohorts) or a.rounds < 1 or a.hidden < 1:
        raise SystemExit("--clients must be at least the largest cohort; --rounds and --hidden "
                         "at least 1")
    xs, ys, sizes = population(a.clients)
    record = {"what": "char-LSTM DP-FedAvg round: library vs flax layer vs hand-written scan",
              "sizes": {"clients": a.clients, "hidden": a.hidden, "local_steps": LOCAL_STEPS,
                        "batch": BATCH, "seq": SEQ, "vocab": VOCAB, "rounds_timed": a.rounds},
              "device": {"platform": jax.devices()[0].platform,
                         "kind": jax.devices()[0].device_kind, "cpu": platform.processor(),
                         "jax": jax.__version__},
              "cohorts": {}}
    for c in cohorts:
        times, counts = {}, {}
        for name, make in (("library", lambda: library_step(xs, ys, c, a.hidden, "library")),
                           ("flax_layer", lambda: library_step(xs, ys, c, a.hidden, "flax")),
                           ("hand_scan", lambda: hand_scan_step(xs, ys, sizes, c, a.hidden))):
            step, counts[name] = make()
            times[name] = timed(step, a.rounds)
            print(f"cohort {c} {name}: {times[name]['median_s']:.3f} s/round "
                  f"(first {times[name]['first_s']:.1f} s)", flush=True)
        ratios = {f"library_over_{k}": times["library"]["median_s"] / times[k]["median_s"]
                  for k in ("flax_layer", "hand_scan")}
        print(f"cohort {c}: " + ", ".join(f"{k} {v:.2f}" for k, v in ratios.items()))
        record["cohorts"][str(c)] = {"parameters": counts, "times": times, "ratios": ratios}
    if a.out:
        from fedjax_dp.core import files               # atomic: a reader sees a whole file
        files.write_text(a.out, json.dumps(record, indent=2) + "\n")
    return record


if __name__ == "__main__":
    main()
