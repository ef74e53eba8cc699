"""Reproducer for the native abort of long-lived test workers (issue 30, item 6), outside pytest.

    nice -n 10 python tools/bench_native_abort.py --count 2000             # one process, no cache
    nice -n 10 python tools/bench_native_abort.py --count 500 --cache DIR  # every entry written
    nice -n 10 python tools/bench_native_abort.py --count 300 --cache DIR --procs 2 --threads 2
    nice -n 10 python tools/bench_native_abort.py --count 400 --reserve-maps 64000

One long-lived process (or ``--procs`` processes started together) compiles ``--count`` distinct
jitted functions of varied structure and shapes (elementwise chains, an MLP step with its gradient,
per-example gradients under vmap, scan and while loops, sort/top-k, gather/scatter, random draws,
small and medium shapes), each called once. ``--threads`` threads compile at the same time (the
library's cohort prefetch thread dispatches while the main thread compiles). With ``--cache DIR``
JAX's persistent compilation cache is on in DIR with every compilation written (the settings of
``fedjax_dp.core.compilation.enable_cache``); with ``--procs`` > 1 the processes compile
the same sequence into the same DIR, so the same keys are written concurrently (two xdist workers
sharing one cache folder). ``--keep`` (default) keeps every function alive, as a long-lived worker
keeps the library's module-level jitted functions and JAX's own caches keep eager ops' programs.

Every ``--every`` compilations it prints the compilations so far, the process's memory mappings
(``/proc/self/maps``; the kernel refuses a new one past ``/proc/sys/vm/max_map_count``), RSS and
seconds, so the last lines before a crash say where it stood. ``--reserve-maps N`` first takes N
mapping slots (small anonymous mappings that the kernel cannot merge), so the limit is reached
after a few hundred compilations instead of thousands. Python's faulthandler is on: a native crash
prints the Python stack of every thread. Exit status: 0 when every compilation ran, else the
worker's (a negative status is the signal that killed it: -6 SIGABRT, -11 SIGSEGV).
"""
from __future__ import annotations

import argparse
import faulthandler
import json
import os
import subprocess
import sys
import threading
import time


def _status() -> dict:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "Threads"):
                out[key] = int(value.split()[0])
    with open("/proc/self/maps") as f:
        out["maps"] = sum(1 for _ in f)
    out["rss_mb"] = out.pop("VmRSS", 0) // 1024
    return out


def max_map_count() -> int | None:
    try:
        return int(open("/proc/sys/vm/max_map_count").read())
    except OSError:
        return None


def reserve_maps(n: int) -> list:
    """Take ``n`` mapping slots: one page each, alternately read-only and read-write (adjacent
    anonymous mappings with equal protections would merge into one)."""
    import mmap
    held = []
    for i in range(n):
        try:
            m = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ if i % 2 else
                          mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError:
            break
        held.append(m)
    return held


def make_function(i: int, rng_seed: int = 0):
    """The ``i``-th program: a jitted function and its arguments (numpy), distinct for every i."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng((rng_seed, i))
    kind = i % 8
    n = int(rng.integers(1, 96))          # small ... medium shapes
    d = int(rng.integers(1, 48))
    c = float(i)                          # a constant of its own: a distinct program per i

    if kind == 0:                                                  # elementwise chain
        def f(x):
            for _ in range(1 + i % 5):
                x = jnp.tanh(x * c + 1.0) + jnp.sin(x)
            return x.sum(axis=-1)
        args = (rng.standard_normal((n, d), dtype=np.float32),)
    elif kind == 1:                                                # MLP step with its gradient
        def loss(p, x, y):
            h = jax.nn.relu(x @ p["w1"] + p["b1"])
            return jnp.mean((h @ p["w2"] - y) ** 2) + 1e-3 * c
        def f(p, x, y):
            g = jax.grad(loss)(p, x, y)
            return jax.tree.map(lambda a, b: a - 0.1 * b, p, g)
        h = int(rng.integers(1, 64))
        args = ({"w1": rng.standard_normal((d, h), dtype=np.float32),
                 "b1": np.zeros((h,), np.float32),
                 "w2": rng.standard_normal((h, 1), dtype=np.float32)},
                rng.standard_normal((n, d), dtype=np.float32),
                rng.standard_normal((n, 1), dtype=np.float32))
    elif kind == 2:                                                # per-example clipped grads
        def one(w, x, y):
            return jax.grad(lambda w: jnp.sum((x @ w - y) ** 2))(w)
        def f(w, x, y):
            g = jax.vmap(one, in_axes=(None, 0, 0))(w, x, y)
            norm = jnp.sqrt(jnp.sum(g ** 2, axis=(1, 2), keepdims=True))
            return jnp.sum(g / jnp.maximum(1.0, norm / (1.0 + c)), axis=0)
        args = (rng.standard_normal((d, 3), dtype=np.float32),
                rng.standard_normal((n, 1, d), dtype=np.float32),
                rng.standard_normal((n, 1, 3), dtype=np.float32))
    elif kind == 3:                                                # scan over steps
        steps = 1 + i % 9
        def f(w, xs):
            def body(w, x):
                return w - 0.01 * jnp.tanh(x @ w).mean(0) * c, jnp.sum(w)
            return jax.lax.scan(body, w, xs)
        args = (rng.standard_normal((d, d), dtype=np.float32),
                rng.standard_normal((steps, n, d), dtype=np.float32))
    elif kind == 4:                                                # while loop
        def f(x):
            return jax.lax.while_loop(lambda s: s[0] < 3 + i % 7,
                                      lambda s: (s[0] + 1, s[1] * 0.5 + c), (0, x))[1]
        args = (rng.standard_normal((n, d), dtype=np.float32),)
    elif kind == 5:                                                # sort / top-k
        k = max(1, min(d, 1 + i % 5))
        def f(x):
            v, idx = jax.lax.top_k(x + c, k)
            return jnp.sort(x, axis=0), v, idx
        args = (rng.standard_normal((n, d), dtype=np.float32),)
    elif kind == 6:                                                # gather / scatter-add
        def f(x, ids):
            return jnp.zeros((n + 1, d), x.dtype).at[ids].add(x[ids] * c)
        args = (rng.standard_normal((n, d), dtype=np.float32),
                rng.integers(0, n, size=(max(1, n // 2),)).astype(np.int32))
    else:                                                          # random draws from a key
        def f(key, x):
            k1, k2 = jax.random.split(jax.random.fold_in(key, i))
            return x + jax.random.normal(k1, x.shape) * c, jax.random.bernoulli(k2, 0.3, (n,))
        args = (jax.random.key(i), rng.standard_normal((n, d), dtype=np.float32))
    f.__name__ = f"repro_{kind}_{i}"
    return jax.jit(f), args


def _compile_range(indices, keep: list, counter: dict, lock: threading.Lock, seed: int,
                   release=None, release_every: int = 0, drop: bool = False) -> None:
    import jax
    for n, i in enumerate(indices, 1):
        fn, args = make_function(i, seed)
        jax.block_until_ready(fn(*args))
        keep.append(fn)
        with lock:
            counter["done"] += 1
        if release is not None and n % release_every == 0:
            if drop:
                keep.clear()
            if release():
                with lock:
                    counter["released"] = counter.get("released", 0) + 1


def worker(args) -> int:
    faulthandler.enable()
    if args.opt0:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                                   + " --xla_backend_optimization_level=0").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    if args.cache:
        os.makedirs(args.cache, exist_ok=True)
        jax.config.update("jax_compilation_cache_dir", args.cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", args.min_compile_s)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    compiles = {"n": 0, "s": 0.0, "hits": 0, "writes": 0}

    def on_duration(event, duration, **_):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles["n"] += 1
            compiles["s"] += duration

    def on_event(event, **_):
        if event == "/jax/compilation_cache/cache_hits":
            compiles["hits"] += 1

    jax.monitoring.register_event_duration_secs_listener(on_duration)
    jax.monitoring.register_event_listener(on_event)
    reserve = args.reserve_maps
    if args.headroom is not None:
        reserve = max(0, (max_map_count() or 0) - _status()["maps"] - args.headroom)
    held = reserve_maps(reserve) if reserve else []
    release = None
    if args.release_every:
        from fedjax_dp.core.compilation import release_compiled as release
    tag = f"[{args.child}]" if args.child is not None else ""
    start = time.time()
    import jaxlib
    print(f"{tag} jax {jax.__version__} jaxlib {jaxlib.__version__}"
          f" cache={args.cache or 'off'} threads={args.threads} opt0={args.opt0}"
          f" reserved_maps={len(held)} max_map_count={max_map_count()} {json.dumps(_status())}",
          flush=True)
    keep: list = []
    counter = {"done": 0}
    lock = threading.Lock()
    stop = threading.Event()

    def report():
        while not stop.wait(args.every_s):
            st = _status()
            print(f"{tag} functions={counter['done']} compilations={compiles['n']} "
                  f"cache_hits={compiles['hits']} compile_s={compiles['s']:.1f} maps={st['maps']} "
                  f"rss_mb={st['rss_mb']} threads={st['Threads']} t={time.time() - start:.0f}",
                  flush=True)

    reporter = threading.Thread(target=report, daemon=True)
    reporter.start()
    indices = list(range(args.first, args.first + args.count))
    if args.threads <= 1:
        _compile_range(indices, keep if args.keep else [], counter, lock, args.seed, release,
                       args.release_every, args.drop_on_release)
    else:
        parts = [indices[t::args.threads] for t in range(args.threads)]
        threads = [threading.Thread(target=_compile_range,
                                    args=(p, keep if args.keep else [], counter, lock, args.seed))
                   for p in parts]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    stop.set()
    st = _status()
    print(f"{tag} DONE functions={counter['done']} releases={counter.get('released', 0)} "
          f"compilations={compiles['n']} "
          f"cache_hits={compiles['hits']} compile_s={compiles['s']:.1f} maps={st['maps']} "
          f"rss_mb={st['rss_mb']} seconds={time.time() - start:.0f}", flush=True)
    del held
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--count", type=int, default=500, help="distinct functions to compile")
    p.add_argument("--first", type=int, default=0, help="index of the first function")
    p.add_argument("--seed", type=int, default=0, help="shapes' seed (same seed: same keys)")
    p.add_argument("--cache", default="", help="persistent compilation cache folder (off: '')")
    p.add_argument("--min-compile-s", type=float, default=0.0,
                   help="jax_persistent_cache_min_compile_time_secs (tests: 0.2)")
    p.add_argument("--threads", type=int, default=1, help="threads compiling at once")
    p.add_argument("--procs", type=int, default=1, help="processes started together")
    p.add_argument("--drop", dest="keep", action="store_false",
                   help="drop every function after its call (default: keep them alive)")
    p.add_argument("--opt0", action="store_true",
                   help="XLA:CPU backend optimisation level 0 (as tests/conftest.py sets)")
    p.add_argument("--reserve-maps", type=int, default=0,
                   help="take this many memory-mapping slots first (see the module doc)")
    p.add_argument("--headroom", type=int, default=None,
                   help="take mapping slots first so that only this many remain free")
    p.add_argument("--release-every", type=int, default=0,
                   help="every this many functions, fedjax_dp.core.compilation."
                        "release_compiled() (the library's guard between runs; 0: never)")
    p.add_argument("--drop-on-release", action="store_true",
                   help="also drop the functions kept so far at each release (a run ending)")
    p.add_argument("--every-s", type=float, default=10.0, help="seconds between status lines")
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.procs <= 1 or args.child is not None:
        return worker(args)
    base = [a for a in (argv if argv is not None else sys.argv[1:])]
    procs = [subprocess.Popen([sys.executable, "-X", "faulthandler", __file__, *base,
                               "--child", str(k)]) for k in range(args.procs)]
    codes = [q.wait() for q in procs]
    print(f"exit statuses: {codes}", flush=True)
    return next((c for c in codes if c != 0), 0)


if __name__ == "__main__":
    sys.exit(main())
