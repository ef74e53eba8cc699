import os

# Tests run on the CPU; keep XLA from grabbing every core's worth of threads per process.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# glibc's fatal messages (heap corruption before an abort) to stderr, not only to a terminal: a
# worker that dies in native code then says why in the test log.
os.environ.setdefault("LIBC_FATAL_STDERR_", "1")

# A persistent XLA compilation cache per test worker (pytest -n) for the processes it starts
# (8-device checks, CLI runs, notebook kernels): a function that they compile alike is compiled
# once. A fresh folder per test session; "off" disables it.
_CREATED_CACHE = None
if "FEDJAX_DP_TEST_JAX_CACHE" not in os.environ:
    import tempfile
    _CREATED_CACHE = tempfile.mkdtemp(prefix="fedjax_dp_jax_cache_")
    os.environ["FEDJAX_DP_TEST_JAX_CACHE"] = _CREATED_CACHE
if os.environ["FEDJAX_DP_TEST_JAX_CACHE"] != "off":
    # Each pytest worker has its own folder, shared only with the processes it starts: an
    # executable is deserialized only by the process family that compiled it (a CI run once lost
    # a worker to a crash while two workers shared one folder; XLA:CPU deserialization has open
    # crash reports, jax-ml/jax#28908).
    _worker_cache = os.path.join(os.environ["FEDJAX_DP_TEST_JAX_CACHE"],
                                 os.environ.get("PYTEST_XDIST_WORKER", "main"))
    os.makedirs(_worker_cache, exist_ok=True)
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", _worker_cache)
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
    import jax  # noqa: E402  (in case a plugin imported jax before the variables were set)

    # The workers themselves neither write nor read it (also after an in-process CLI call turns
    # it on): XLA:CPU aborted twice in ``executable.serialize()`` while writing an entry in a
    # worker (CI; a flaky "Fatal Python error: Aborted" that lost the worker). Their CLI and
    # notebook subprocesses, which gain most from it, use it.
    jax.config.update("jax_enable_compilation_cache", False)


def pytest_unconfigure(config):
    """The process that made the cache folder (the controller) removes it at the end."""
    if _CREATED_CACHE is not None and not hasattr(config, "workerinput"):
        import shutil
        shutil.rmtree(_CREATED_CACHE, ignore_errors=True)


#: the longest tests (the subprocess with 8 devices, the notebooks) start first, so that with
#: ``-n 2 --dist worksteal`` no worker is left with one of them at the end while the other idles
_LONG_FIRST = ("test_sharding.py::test_eight_cpu_devices_equal_one_device",
               "test_user_paths.py::test_killed_interrupted_and_resumed",
               "test_user_paths.py::test_readme_first_command",
               "fnas.ipynb", "isrl.ipynb", "fedkt.ipynb", "voting_dpfl.ipynb", "quickstart.ipynb")


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=lambda item: not any(item.nodeid.endswith(n) or n in item.nodeid
                                        for n in _LONG_FIRST))
