"""One run on several processes: ``jax.distributed`` from the command line (docs/scale.md).

``fedjax-dp run CONFIG`` (and ``sweep``) started once per host joins a job of N processes when
told so -- ``--coordinator HOST:PORT --num-processes N --process-id I``, the config's
``run.distributed = {coordinator = ..., num_processes = ..., process_id = ...}``, or a cluster's
environment (:func:`detect`: SLURM, Open MPI, a Cloud TPU pod slice, a Kubernetes indexed Job or
the ``JAX_COORDINATOR_ADDRESS`` / ``JAX_NUM_PROCESSES`` / ``JAX_PROCESS_ID`` variables) -- and
calls ``jax.distributed.initialize``: JAX's own runtime, nothing else. Then ``run.mesh`` (default
``"auto"``: every device of every process when there are several processes) is the ``agents``
mesh the run's agents are split over.

The job as a whole (:class:`Group`):

* **One writer.** Process 0 holds the run folder and writes config.json, progress, checkpoints,
  result.json and tracker logs; every process computes the same run (SPMD) and reads only its
  own devices' agents. A resume reads the checkpoint on process 0 and broadcasts it
  (:meth:`Group.broadcast_bytes`): no shared file system is needed.
* **Stops agree.** A signal on any host is recorded, not raised: at the next step boundary every
  process learns it (:meth:`Group.agree_stop`, one tiny all-gather) and all stop after the same
  step, each printing the resume command. A second signal stops its process at once.
* **A lost process is loud.** A watchdog thread asks JAX's coordination service for the live
  processes every :data:`POLL_S`; when one is missing (its heartbeats stopped for ``timeout_s``)
  or the coordinator cannot be reached, it prints ONE line naming the lost process and the
  resume command, and ends this process (exit status :data:`LOST_STATUS`): nobody hangs in a
  collective. JAX's recoverable mode keeps the service from aborting the survivors first, and
  its own log lines are silenced (``TF_CPP_MIN_LOG_LEVEL``) in a multi-process run.
"""
from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
from typing import Any, Mapping

import numpy as np

#: seconds without a heartbeat after which a process counts as lost (JAX's heartbeat timeout)
DEFAULT_TIMEOUT_S = 60
#: seconds between two watchdog polls
POLL_S = 0.5
#: the exit status of a process that stops because another was lost
LOST_STATUS = 75
#: the keys of ``run.distributed``
TABLE_KEYS = ("coordinator", "num_processes", "process_id", "timeout_s")
#: the command-line flag of each key
FLAGS = {"coordinator": "--coordinator", "num_processes": "--num-processes",
         "process_id": "--process-id", "timeout_s": "--process-timeout"}


@dataclasses.dataclass(frozen=True)
class Spec:
    """How this process joins a job: ``coordinator`` (HOST:PORT of process 0's service),
    ``num_processes``, ``process_id``: given (flags, config, environment variables) or None
    (JAX's cluster detection fills them in: ``cluster`` names the environment found);
    ``timeout_s``: how long a silent process is waited for before it counts as lost."""

    coordinator: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    timeout_s: int = DEFAULT_TIMEOUT_S
    cluster: str = "flags"


def _int_env(env: Mapping[str, str], name: str) -> int | None:
    try:
        return int(env[name]) if name in env else None
    except ValueError:
        return None


def detect(env: Mapping[str, str] | None = None) -> str | None:
    """The cluster environment this process runs in with more than one process, or None:
    ``"jax_env"`` (``JAX_COORDINATOR_ADDRESS`` and ``JAX_NUM_PROCESSES`` > 1 set; the process id
    from ``JAX_PROCESS_ID`` or a Kubernetes indexed Job's ``JOB_COMPLETION_INDEX``), ``"slurm"``
    (``srun``: ``SLURM_JOB_ID``, ``SLURM_STEP_NUM_TASKS`` or ``SLURM_NTASKS`` > 1,
    ``SLURM_PROCID``), ``"openmpi"`` (``mpirun``: ``OMPI_COMM_WORLD_SIZE`` > 1), ``"tpu_pod"``
    (a Cloud TPU VM of a multi-host slice: ``TPU_WORKER_HOSTNAMES`` naming several hosts).
    Pure: reads only ``env`` (default ``os.environ``)."""
    env = os.environ if env is None else env
    if env.get("JAX_COORDINATOR_ADDRESS") and (_int_env(env, "JAX_NUM_PROCESSES") or 0) > 1:
        return "jax_env"
    tasks = _int_env(env, "SLURM_STEP_NUM_TASKS") or _int_env(env, "SLURM_NTASKS") or 0
    if "SLURM_JOB_ID" in env and "SLURM_PROCID" in env and tasks > 1:
        return "slurm"
    if (_int_env(env, "OMPI_COMM_WORLD_SIZE") or 0) > 1:
        return "openmpi"
    hosts = [h for h in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h.strip()]
    if len(hosts) > 1:
        return "tpu_pod"
    return None


def _check(name: str, value: Any, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def _check_coordinator(name: str, value: Any) -> str:
    host, _, port = str(value).rpartition(":")
    if not isinstance(value, str) or not host or not port.isdigit() or \
            not 0 < int(port) < 65536:
        raise ValueError(f"{name} must be HOST:PORT (port 1-65535), e.g. 10.0.0.1:8476, "
                         f"got {value!r}")
    return value


def resolve(flags: Mapping[str, Any] | None = None, table: Mapping[str, Any] | None = None,
            env: Mapping[str, str] | None = None) -> Spec | None:
    """The :class:`Spec` of this process, or None for a single-process run. The command-line
    ``flags`` (``coordinator``, ``num_processes``, ``process_id``, ``timeout_s``; None: not
    given) win over the config's ``run.distributed`` ``table``, which wins over the
    environment (:func:`detect`). Every value is checked before any work (``ValueError``
    naming the flag or key and its range)."""
    flags = {k: v for k, v in (flags or {}).items() if v is not None}
    table = dict(table or {})
    unknown = sorted(set(table) - set(TABLE_KEYS))
    if unknown:
        raise ValueError(f"run.distributed: unknown key(s) {unknown}; allowed: "
                         f"{list(TABLE_KEYS)}")
    merged = {**table, **flags}
    named = {k: (FLAGS[k] if k in flags else f"run.distributed.{k}") for k in merged}
    timeout = _check(named.get("timeout_s", "timeout_s"),
                     merged.get("timeout_s", DEFAULT_TIMEOUT_S), minimum=5)
    given = [k for k in ("coordinator", "num_processes", "process_id") if k in merged]
    if not given:
        cluster = detect(env)
        if cluster is None:
            return None
        e = os.environ if env is None else env
        if cluster == "jax_env":
            pid = _int_env(e, "JAX_PROCESS_ID")
            pid = _int_env(e, "JOB_COMPLETION_INDEX") if pid is None else pid
            return Spec(_check_coordinator("JAX_COORDINATOR_ADDRESS",
                                           e["JAX_COORDINATOR_ADDRESS"]),
                        _int_env(e, "JAX_NUM_PROCESSES"), pid, timeout, cluster)
        return Spec(timeout_s=timeout, cluster=cluster)   # JAX's detection fills in the rest
    missing = [k for k in ("coordinator", "num_processes", "process_id") if k not in merged]
    if missing:
        raise ValueError(f"a multi-process run needs --coordinator, --num-processes and "
                         f"--process-id together (or run.distributed's keys); missing: "
                         f"{', '.join(FLAGS[k] for k in missing)}")
    n = _check(named["num_processes"], merged["num_processes"], minimum=1)
    pid = _check(named["process_id"], merged["process_id"])
    if pid >= n:
        raise ValueError(f"{named['process_id']} must be in [0, {n - 1}] for {n} processes, "
                         f"got {pid}")
    if n == 1:
        return None
    return Spec(_check_coordinator(named["coordinator"], merged["coordinator"]), n, pid,
                timeout, "config" if all(k not in flags for k in given) else "flags")


def quiet_runtime_logs() -> None:
    """Silence the runtime's own C++ log lines (a lost peer makes every survivor print pages
    of them) before jaxlib is loaded; our one line says what happened. Errors still raise."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def initialize(spec: Spec) -> "Group":
    """Join the job (``jax.distributed.initialize``; on CPU devices with gloo collectives;
    JAX's recoverable mode, so that a lost process is reported by :class:`Group`'s watchdog,
    not by an abort of every survivor) and return the :class:`Group`."""
    quiet_runtime_logs()
    import jax
    if jax.config.jax_platforms in (None, "", "cpu") or \
            os.environ.get("JAX_PLATFORMS", "") == "cpu":
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.config.update("jax_enable_recoverability", True)
    kwargs = {} if spec.coordinator is None else {
        "coordinator_address": spec.coordinator, "num_processes": spec.num_processes,
        "process_id": spec.process_id}
    try:
        jax.distributed.initialize(**kwargs, initialization_timeout=max(spec.timeout_s, 30),
                                   heartbeat_timeout_seconds=spec.timeout_s,
                                   shutdown_timeout_seconds=spec.timeout_s)
    except Exception as e:          # an unreachable coordinator, a wrong count: one line
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        where = spec.coordinator or f"the {spec.cluster} environment's coordinator"
        raise RuntimeError(f"cannot join the job of {spec.num_processes or '?'} processes at "
                           f"{where} within {max(spec.timeout_s, 30)} s: {first}") from None
    _take_back_signals()
    return Group(spec)


def _take_back_signals() -> None:
    """JAX's preemption notifier installs its own SIGTERM handler in ``initialize``; the run's
    handlers (:mod:`fedjax_dp.core.stop`: record, then stop every process after the same step)
    are put back in front of it."""
    import signal
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGINT, signal.SIGTERM):
        handler = signal.getsignal(sig)
        if callable(handler):
            signal.signal(sig, handler)


class Group:
    """The processes of one job, as this process sees them (see the module)."""

    def __init__(self, spec: Spec):
        import jax
        from jax._src import distributed
        self.spec = spec
        self.index = jax.process_index()
        self.count = jax.process_count()
        self._client = distributed.global_state.client
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.resume_hint = ""                   # set by the command line: how to resume
        self.told = False                       # process 0 has sent the command's first message

    @property
    def is_writer(self) -> bool:
        """True on process 0: the one that writes the run's files."""
        return self.index == 0

    # ----------------------------------------------------------------- the watchdog
    def start_watchdog(self) -> None:
        """Start the thread that ends this process with one line when another is lost."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="fedjax-dp-watchdog",
                                            daemon=True)
            self._thread.start()

    def stop_watchdog(self) -> None:
        self._stop.set()

    def lost(self) -> str | None:
        """Why the job is broken (a process missing from the live set, or the coordinator
        unreachable), or None while every process is alive."""
        everyone = list(range(self.count))
        try:
            live = set(self._client.get_live_nodes(everyone))
        except Exception as e:                               # the coordinator is gone
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            return (f"lost the coordinator (process 0 of {self.count}): {first}"
                    if self.index else f"the coordination service failed: {first}")
        missing = [i for i in everyone if i not in live and not self._left(i)]
        if missing:
            return (f"lost process {missing[0]} of {self.count} (no heartbeat for "
                    f"{self.spec.timeout_s} s)" if len(missing) == 1 else
                    f"lost processes {missing} of {self.count} (no heartbeat for "
                    f"{self.spec.timeout_s} s)")
        return None

    def announce_leaving(self, why: str) -> None:
        """Tell the others this process leaves on purpose (finished, stopped with them), so
        that their watchdogs do not count it as lost."""
        try:
            self._client.key_value_set(f"fedjax_dp/left/{self.index}", why)
        except Exception:
            pass

    def _left(self, i: int) -> bool:
        try:
            return self._client.key_value_try_get(f"fedjax_dp/left/{i}") is not None
        except Exception:
            return False

    def fail(self, why: str) -> None:
        """Print the one line and end this process at once (no collective is waited for)."""
        line = f"fedjax-dp: process {self.index}: {why}; stopping."
        if self.resume_hint:
            line += f" {self.resume_hint}"
        print(line, file=sys.stderr, flush=True)
        os._exit(LOST_STATUS)

    def _watch(self) -> None:
        while not self._stop.wait(POLL_S):
            why = self.lost()
            if why is not None and not self._stop.is_set():
                self.fail(why)

    def wait_for_loss(self, seconds: float) -> str | None:
        """After a failed collective: wait up to ``seconds`` for the service to name the lost
        process (the watchdog then ends this process); None if every process stays alive."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            why = self.lost()
            if why is not None:
                return why
            time.sleep(POLL_S)
        return None

    def wait_alone(self, seconds: float) -> None:
        """Process 0, at the end: wait (up to ``seconds``) until every other process has left
        the job, so that the coordination service it hosts outlives their goodbyes."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                if set(self._client.get_live_nodes(list(range(self.count)))) <= {self.index}:
                    return
            except Exception:
                return
            time.sleep(0.05)

    # ----------------------------------------------------------------- collectives
    def agree_stop(self, pending: int | None) -> int | None:
        """Every process's recorded signal (0: none) gathered: the first signal any process
        received, or None. Called by every process at the same step boundary."""
        from jax.experimental import multihost_utils
        flags = np.asarray(multihost_utils.process_allgather(
            np.asarray([0 if pending is None else int(pending)], np.int32)))
        got = [int(f) for f in flags.reshape(-1) if int(f)]
        return got[0] if got else None

    def broadcast_bytes(self, data: bytes | None) -> bytes:
        """Process 0's ``data`` on every process (the others pass None)."""
        from jax.experimental import multihost_utils
        size = np.asarray([len(data) if self.is_writer and data is not None else 0], np.int64)
        size = int(np.asarray(multihost_utils.broadcast_one_to_all(
            size.astype(np.int32)))[0])
        if size == 0:
            return b""
        buf = (np.frombuffer(data, np.uint8) if self.is_writer else np.zeros(size, np.uint8))
        return np.asarray(multihost_utils.broadcast_one_to_all(buf)).astype(np.uint8).tobytes()

    def sync(self, name: str) -> None:
        """A barrier of every process (``name``: the point, in an error message)."""
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices(name)


def host_values(tree: Any) -> Any:
    """``tree`` with every array on the host, whole: an array split over several processes'
    devices is gathered (a collective: every process calls it at the same point), a replicated
    one read from this process's copy."""
    import jax
    from jax.experimental import multihost_utils

    def one(x):
        if not isinstance(x, jax.Array) or x.is_fully_addressable:
            return x
        if x.is_fully_replicated:
            return x.addressable_data(0)                    # this process's copy
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            data = multihost_utils.process_allgather(jax.random.key_data(x), tiled=True)
            return jax.random.wrap_key_data(np.asarray(data), impl=jax.random.key_impl(x))
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return jax.tree.map(one, tree)


# --------------------------------------------------------------------------- what process 0 tells
def pack_folder(path, names: list[str] | None = None) -> bytes:
    """A checkpoint folder's files ``names`` (default: every regular file) as one blob
    (``{"files": [[name, size], ...]}`` JSON, a newline, then the files' bytes), for
    :meth:`Group.broadcast_bytes`."""
    from pathlib import Path
    root = Path(path)
    if names is None:
        names = sorted(str(q.relative_to(root)) for q in root.rglob("*") if q.is_file()
                       and not q.is_symlink())
    names = [n for n in names if (root / n).is_file() and not (root / n).is_symlink()]
    blobs = [(root / n).read_bytes() for n in names]
    import json
    head = json.dumps({"name": root.name,
                       "files": [[n, len(b)] for n, b in zip(names, blobs)]}).encode()
    return head + b"\n" + b"".join(blobs)


def unpack_folder(data: bytes, dest) -> "Path":
    """The folder :func:`pack_folder` packed, written under ``dest`` (names checked: relative,
    no ``..``); returns its path. What it holds is then read as any checkpoint is (data only,
    digests checked: :func:`fedjax_dp.experiments.checkpoint.restore`)."""
    import json
    from pathlib import Path, PurePosixPath
    head, _, body = data.partition(b"\n")
    meta = json.loads(head.decode())
    name = str(meta["name"])
    if not name or "/" in name or name in (".", ".."):
        raise ValueError(f"a packed checkpoint named {name!r}")
    folder = Path(dest) / name
    offset = 0
    for rel, size in meta["files"]:
        parts = PurePosixPath(rel).parts
        if PurePosixPath(rel).is_absolute() or ".." in parts or not parts:
            raise ValueError(f"a packed checkpoint holds the path {rel!r}")
        target = folder.joinpath(*parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(body[offset:offset + int(size)])
        offset += int(size)
    return folder


def tell(group: Group | None, message: dict, blob: bytes = b"") -> None:
    """Process 0: send ``message`` (JSON) and ``blob`` to every other process (:func:`hear`)."""
    if group is None:
        return
    import json
    head = json.dumps(message).encode()
    group.broadcast_bytes(len(head).to_bytes(8, "little") + head + blob)


def hear(group: Group) -> tuple[dict, bytes]:
    """The other processes: what process 0 sent with :func:`tell`."""
    import json
    data = group.broadcast_bytes(None)
    n = int.from_bytes(data[:8], "little")
    return json.loads(data[8:8 + n].decode()), data[8 + n:]
