"""Lift a one-agent function over the stacked agent axis: vmap, in chunks, or across devices.

``for_each_agent`` (fedjax's ``for_each_client``, but all agents in *one* compiled computation)
has backends with identical results: ``vmap`` (default); ``chunk_size=c`` (``lax.map`` with
``batch_size=c``: memory bounded by c agents); ``backend="map"`` (``lax.map`` one agent at a
time: bit for bit the numbers of separate calls); ``mesh=`` (``shard_map`` over an ``agents``
axis, each device vmapping its slice; N is padded to a multiple of the device count by repeating
the last agent, the padding dropped; a sum over agents is a cross-device reduction, the
simulation of secure aggregation); ``backend="loop"`` (a Python loop over ``jax.jit(fn)`` for
debugging, the error naming the failing agent, and as the reference of tests and benchmarks).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fedjax_dp.core import defaults as defaults_lib, validation

AGENTS = "agents"


def agent_mesh(devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A 1-D mesh whose single axis ``agents`` spans ``devices`` (default: ``jax.devices()``,
    every device of every process under ``jax.distributed``; tests/test_multiprocess.py)."""
    devs = np.asarray(jax.devices() if devices is None else list(devices))
    return Mesh(devs, (AGENTS,))


def _normalize_axes(in_axes, nargs: int) -> tuple:
    if isinstance(in_axes, (list, tuple)):
        if len(in_axes) != nargs:
            raise ValueError(f"in_axes has {len(in_axes)} entries but the function got {nargs} "
                             "arguments")
        axes = tuple(in_axes)
    else:
        axes = (in_axes,) * nargs
    for a in axes:
        if a not in (0, None):
            raise ValueError(f"in_axes entries must be 0 (per-agent) or None (shared), got {a}")
    return axes


def _num_agents(args, axes) -> int:
    sizes = {leaf.shape[0] for a, ax in zip(args, axes) if ax == 0
             for leaf in jax.tree.leaves(a)}
    if not sizes:
        raise ValueError("for_each_agent needs at least one per-agent argument (in_axes 0)")
    if len(sizes) != 1:
        raise ValueError(f"per-agent arguments disagree on the number of agents: {sorted(sizes)}")
    return sizes.pop()


def num_chunks(n: int, size: int) -> int:
    """Chunks of ``size`` that cover ``n`` agents (the last one may be partial)."""
    return -(-n // size)


def pad_rows(tree: Any, multiple: int, *, fill=0) -> Any:
    """Leading axes padded to a multiple of ``multiple`` with ``fill`` (None: the last row)."""
    def pad(leaf):
        extra = (-leaf.shape[0]) % multiple
        if not extra:
            return leaf
        rows = (jnp.repeat(leaf[-1:], extra, axis=0) if fill is None
                else jnp.full((extra,) + leaf.shape[1:], fill, leaf.dtype))
        return jnp.concatenate([leaf, rows])

    return jax.tree.map(pad, tree)


def chunked(tree: Any, size: int, *, fill=0) -> Any:
    """The package's one in-device chunker: every leaf ``[n, ...]`` padded with ``fill``
    (:func:`pad_rows`) and reshaped ``[num_chunks(n, size), size, ...]`` for a ``lax.scan`` /
    ``lax.map`` over the chunks (host streaming: :func:`fedjax_dp.core.agent_stream.chunks`)."""
    return jax.tree.map(lambda l: l.reshape((-1, size) + l.shape[1:]),
                        pad_rows(tree, size, fill=fill))


def _pad_to_devices(args, axes, ndev: int) -> list:
    return [pad_rows(a, ndev, fill=None) if ax == 0 else a for a, ax in zip(args, axes)]


def for_each_agent(fn: Callable[..., Any], in_axes=0, *, chunk_size: int | None = None,
                   mesh: Mesh | None = None, backend: str = "vmap") -> Callable[..., Any]:
    """Lift ``fn(*args)`` (one agent) to all agents: a function of the same arguments whose
    outputs have a leading agent axis. ``in_axes``: per argument, 0 (a leading agent axis) or
    None (shared); ``chunk_size``, ``mesh``, ``backend`` (``"vmap"``, ``"map"``, ``"loop"``): the
    module's backends, with identical results."""
    validation.check_choice("backend", backend, ("vmap", "map", "loop"))
    if chunk_size is not None:
        validation.check_int("chunk_size", chunk_size, minimum=1)
    if backend == "loop":
        return _loop(fn, in_axes)

    def local(axes, *args):
        """Run fn over the agents present in ``args`` (whole axis, or one device's shard)."""
        if chunk_size is None and backend == "vmap":
            return jax.vmap(fn, in_axes=axes)(*args)
        mapped = tuple(a for a, ax in zip(args, axes) if ax == 0)

        def one(mapped_one):
            it = iter(mapped_one)
            full = [next(it) if ax == 0 else a for a, ax in zip(args, axes)]
            return fn(*full)

        return jax.lax.map(one, mapped, batch_size=chunk_size)

    def lifted(*args):
        axes = _normalize_axes(in_axes, len(args))
        if mesh is None:
            return local(axes, *args)
        n = _num_agents(args, axes)
        padded = _pad_to_devices(args, axes, mesh.shape[AGENTS])     # copies of the last agent
        specs = tuple(P(AGENTS) if ax == 0 else P() for ax in axes)
        sharded = jax.shard_map(lambda *a: local(axes, *a), mesh=mesh, in_specs=specs,
                                out_specs=P(AGENTS), check_vma=False)
        out = sharded(*padded)
        return jax.tree.map(lambda l: l[:n], out) if n % mesh.shape[AGENTS] else out

    return lifted


def for_each_agent_sum(fn: Callable[..., Any], in_axes=0, *, chunk_size: int | None = None,
                       mesh: Mesh | None = None) -> Callable[..., Any]:
    """Lift ``fn`` (one agent) to the sum of its outputs over the agents present:

        lifted(*args, where=w) = sum_b [w_b] fn(args_b)        (w [N] bool; default all True)

    without materialising the per-agent outputs ``[N, ...]``: with ``chunk_size`` a scan adds
    each chunk's sum to an accumulator (the chunk's parameters stay in cache), with ``mesh`` a
    ``psum`` adds the devices' sums. Rows with ``w_b`` False are selected away (``jnp.where``: a
    NaN there cannot leak into the sum). Equal to stacking then summing, up to float reassociation.
    """
    if chunk_size is not None:
        validation.check_int("chunk_size", chunk_size, minimum=1)

    def selected(w, *args):
        return jax.tree.map(lambda l: jnp.where(w, l, jnp.zeros((), l.dtype)), fn(*args))

    def local(axes, where, *args):
        """The sum over the agents present in ``args`` (whole axis, or one device's shard)."""
        n = where.shape[0]
        vaxes = (0,) + tuple(axes)
        if chunk_size is None or chunk_size >= n:
            out = jax.vmap(selected, in_axes=vaxes)(where, *args)
            return jax.tree.map(lambda l: jnp.sum(l, axis=0), out)
        full, rest = divmod(n, chunk_size)
        mapped = (where,) + tuple(a for a, ax in zip(args, axes) if ax == 0)

        def chunk_sum(mapped_chunk):
            it = iter(mapped_chunk[1:])
            full_args = [next(it) if ax == 0 else a for a, ax in zip(args, axes)]
            out = jax.vmap(selected, in_axes=vaxes)(mapped_chunk[0], *full_args)
            return jax.tree.map(lambda l: jnp.sum(l, axis=0), out)

        head = chunked(jax.tree.map(lambda l: l[:full * chunk_size], mapped), chunk_size)
        first = jax.tree.map(lambda l: l[0], head)
        zero = jax.tree.map(lambda l: jnp.zeros(l.shape, l.dtype),
                            jax.eval_shape(chunk_sum, first))

        def body(acc, mapped_chunk):
            return jax.tree.map(jnp.add, acc, chunk_sum(mapped_chunk)), None

        total, _ = jax.lax.scan(body, zero, head)
        if rest:
            tail = jax.tree.map(lambda l: l[full * chunk_size:], mapped)
            total = jax.tree.map(jnp.add, total, chunk_sum(tail))
        return total

    def lifted(*args, where=None):
        axes = _normalize_axes(in_axes, len(args))
        n = _num_agents(args, axes)
        where = jnp.ones((n,), bool) if where is None else jnp.asarray(where, bool)
        if where.shape != (n,):
            raise ValueError(f"where must have shape ({n},) (one entry per agent), got "
                             f"{where.shape}")
        if mesh is None:
            return local(axes, where, *args)
        padded = _pad_to_devices(args, axes, mesh.shape[AGENTS])
        where = pad_rows(where, mesh.shape[AGENTS], fill=False)
        specs = (P(AGENTS),) + tuple(P(AGENTS) if ax == 0 else P() for ax in axes)
        sharded = jax.shard_map(
            lambda w, *a: jax.lax.psum(local(axes, w, *a), AGENTS), mesh=mesh, in_specs=specs,
            out_specs=P(), check_vma=False)
        return sharded(where, *padded)

    return lifted


@jax.jit
def take_row(tree: Any, i) -> Any:
    """Row ``i`` of every leaf of ``tree`` (device arrays) in ONE compiled call per tree layout,
    the row a traced index (eager ``leaf[i]`` compiles a slice and a squeeze per leaf shape)."""
    return jax.tree.map(lambda l: l[i], tree)


@jax.jit
def stack_rows(trees: Sequence[Any]) -> Any:
    """``jnp.stack`` of the pytrees ``trees`` leaf by leaf, in one compiled call per layout."""
    return jax.tree.map(lambda *ls: jnp.stack(ls), *trees)


@jax.jit
def add_leading_axis(tree: Any) -> Any:
    """Every leaf ``[...]`` of ``tree`` as ``[1, ...]``, in one compiled call per layout."""
    return jax.tree.map(lambda l: l[None], tree)


def _row(tree: Any, i: int) -> Any:
    """Row ``i`` of ``tree``: :func:`take_row` for device arrays, plain indexing otherwise (host
    arrays stay on the host; only the row travels)."""
    if all(isinstance(l, jax.Array) for l in jax.tree.leaves(tree)):
        return take_row(tree, i)
    return jax.tree.map(lambda l: l[i], tree)


def _loop(fn, in_axes):
    jfn = jax.jit(fn)

    def looped(*args):
        axes = _normalize_axes(in_axes, len(args))
        n = _num_agents(args, axes)
        outs = []
        for i in range(n):
            one = [_row(a, i) if ax == 0 else a for a, ax in zip(args, axes)]
            try:
                outs.append(jfn(*one))
            except Exception as e:  # name the failing agent, keep the cause
                raise RuntimeError(f"agent {i} failed: {e}") from e
        return stack_rows(outs)

    return looped


def agent_sum(tree: Any, weights: jax.Array | None = None) -> Any:
    """Sum over the agent axis (secure-aggregation simulation), optionally weighted by
    ``weights [N]`` (e.g. a participation mask); a cross-device reduction on a sharded axis."""
    if weights is None:
        return jax.tree.map(lambda l: jnp.sum(l, axis=0), tree)
    return jax.tree.map(
        lambda l: jnp.tensordot(weights.astype(l.dtype), l, axes=(0, 0)), tree)


def shard_agents(tree: Any, mesh: Mesh) -> Any:
    """Place a stacked pytree on ``mesh`` with its leading (agent) axis split over ``agents``
    (``ValueError`` unless the number of agents is divisible by the number of devices)."""
    ndev = mesh.shape[AGENTS]
    for leaf in jax.tree.leaves(tree):
        if leaf.shape[0] % ndev:
            raise ValueError(f"the number of agents ({leaf.shape[0]}) must be divisible by the "
                             f"number of devices in the mesh ({ndev}) to shard it")
    return jax.device_put(tree, NamedSharding(mesh, P(AGENTS)))


def replicate(tree: Any, mesh: Mesh) -> Any:
    """``tree`` replicated over every device of ``mesh`` (``P()``). Leaves already replicated
    on it stay. A mesh over several processes' devices takes a process-local array through the
    host (each process has the same value, as SPMD code computes it; the runtime has no
    cross-host device transfer on every backend); PRNG keys through their key data."""
    target = NamedSharding(mesh, P())
    local = mesh.devices.size == len(mesh.local_devices)

    def one(x):
        if isinstance(x, jax.Array) and x.sharding.is_equivalent_to(target, x.ndim):
            return x
        if local or not isinstance(x, jax.Array) or not x.is_fully_addressable:
            return jax.device_put(x, target)
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            data = jax.device_put(np.asarray(jax.random.key_data(x)), target)
            return jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
        return jax.device_put(np.asarray(x), target)
    return jax.tree.map(one, tree)


def auto_chunk_size(bytes_per_agent: int, num_agents: int, *,
                    budget_bytes: int | None = None, minimum: int = 8,
                    platform_defaults: defaults_lib.Defaults | None = None) -> int | None:
    """A chunk of agents whose working set fits the budget of this device (None: no chunking).

    ``chunk = max(minimum, budget_bytes // bytes_per_agent)`` agents, None when fewer than
    ``min_chunks`` chunks (or a single one) would result. Budget (``budget_bytes`` overrides it)
    and ``min_chunks`` come from :func:`fedjax_dp.core.defaults.defaults` (``platform_defaults``;
    default: this machine's): on a CPU cache-sized chunks keep a multi-step update's parameters
    in cache; on an accelerator agents are chunked only beyond 1/4 of its memory (docs/devices.md).
    """
    d = defaults_lib.defaults() if platform_defaults is None else platform_defaults
    budget = d.chunk_budget_bytes if budget_bytes is None else budget_bytes
    if budget is None or bytes_per_agent <= 0:
        return None
    chunk = max(minimum, int(budget // bytes_per_agent))
    # < min_chunks chunks: the agents (nearly) fit anyway, a ragged last one costs a second body
    return None if d.min_chunks * chunk > num_agents or chunk >= num_agents else chunk


def agent_bytes(params: Any, num_agents: int | None = None) -> int:
    """Bytes of ONE agent's parameters: the leaves' total, or, for parameters stacked over the
    agents (leading axis ``num_agents > 1``), one agent's share."""
    leaves = jax.tree.leaves(params)
    total = sum(l.size * l.dtype.itemsize for l in leaves)
    if (num_agents is not None and num_agents > 1 and leaves
            and leaves[0].ndim and leaves[0].shape[0] == num_agents):
        total //= num_agents
    return int(total)


def training_bytes(params: Any, num_agents: int | None = None) -> int:
    """One training agent's working set: parameters, gradient and update (:func:`agent_bytes`)."""
    return 3 * agent_bytes(params, num_agents)


def resolve_chunk_size(chunk_size: int | str | None, *, num_agents: int, bytes_per_agent: int = 0,
                       default: int | None = None, capped: bool = False) -> int | None:
    """The package's one chunk-size resolver (``runtime.chunk_size``, every algorithm's chunk
    setting, the streamed chunks): ``"auto"`` is :func:`auto_chunk_size` of the caller's working
    set per agent on this device (``bytes_per_agent``: :func:`training_bytes`; per-example
    gradients, ``(n_max + 3) agent_bytes(params)``), None is ``default`` (None: all at once), an
    int is used as given; ``capped``: at most ``num_agents``."""
    if chunk_size == "auto":
        return auto_chunk_size(bytes_per_agent, num_agents)
    size = default if chunk_size is None else validation.check_int("chunk_size", chunk_size,
                                                                   minimum=1)
    return min(size, num_agents) if capped and size is not None else size
