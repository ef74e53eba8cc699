import os

# Tests run on the CPU; keep XLA from grabbing every core's worth of threads per process.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The notebooks (run by nbmake) at their smoke sizes: the same cells with fewer steps (each
# notebook's first cell reads it; users' runs keep the sizes the text discusses).
os.environ.setdefault("FEDJAX_DP_NOTEBOOK_SMOKE", "1")
# glibc's fatal messages (heap corruption before an abort) to stderr, not only to a terminal: a
# worker that dies in native code then says why in the test log.
os.environ.setdefault("LIBC_FATAL_STDERR_", "1")
# XLA:CPU's backend optimisation level 0 in the tests and every process they start: compiling
# dominates the suite's time (tiny shapes run in microseconds), and level 0 halves it (measured:
# tests/test_round_seeds.py + test_fedavg.py, 129 s -> 68 s of CPU). Results stay within the
# tests' tolerances (the equality tests compare two paths compiled the same way). Users' runs keep
# XLA's default level. FEDJAX_DP_TEST_XLA_OPT=default keeps the default here too.
# XLA:CPU's legacy (elemental) fusion emitters in place of the MLIR ones: XLA:CPU compiles every
# fusion as an LLVM module of its own, and the legacy emitters build them faster (measured with
# jax 0.10.2 on 2 cores, persistent cache off: tests/test_fedavg.py + test_knn_search.py
# 170 -> 100 s, test_protocol.py 162 -> 101 s; a tiny ISRL SPIDER round's compile 3.7 -> 2.2 s).
# And one LLVM module per program, not split for parallel code generation (XLA:CPU's default
# splits it in up to 32 parts compiled on a thread pool: on 2 cores, for the suite's tiny programs,
# the split costs more than it saves; measured with -n 2, paired: test_round_seeds.py +
# test_fedavg.py + test_knn_search.py 69 -> 57 s, test_protocol.py + test_dp_fedsgd.py +
# test_private_grad.py + test_isrl_algorithms.py 90 / 83 -> 76 / 79 s).
if (os.environ.get("FEDJAX_DP_TEST_XLA_OPT", "0") != "default"
        and "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", "")):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_backend_optimization_level=0"
                               " --xla_cpu_use_fusion_emitters=false"
                               " --xla_cpu_parallel_codegen_split_count=1").strip()

# One persistent XLA compilation cache shared by the test workers (pytest -n) and the processes
# they start (CLI runs, notebook kernels; not the 8-device checks of test_sharding.py, whose
# programs no other process compiles): a function two processes compile (module fixtures, shared
# configs) is compiled once. A fresh folder per test session; "off"
# disables it. Every program is cached, however short its compile (the library's own runs do the
# same): on 2 cores, -n 2, tests/test_round_seeds.py + test_fedavg.py + test_rounds.py +
# test_dp_fedsgd.py took 210 CPU s with a 0.2 s floor and 180 s with none. (The native
# aborts once seen in workers, with the cache on and off, were the memory-mapping limit below,
# not the cache.)
_CREATED_CACHE = None
if "FEDJAX_DP_TEST_JAX_CACHE" not in os.environ:
    import tempfile
    _CREATED_CACHE = tempfile.mkdtemp(prefix="fedjax_dp_jax_cache_")
    os.environ["FEDJAX_DP_TEST_JAX_CACHE"] = _CREATED_CACHE
if os.environ["FEDJAX_DP_TEST_JAX_CACHE"] != "off":
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.environ["FEDJAX_DP_TEST_JAX_CACHE"])
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
    import jax  # noqa: E402  (in case a plugin imported jax before the variables were set)

    jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


#: a worker holding more than this share of vm.max_map_count drops JAX's compiled programs after a
#: test (below the library's own MAP_SHARE, which a run starting inside a test then never reaches;
#: FEDJAX_DP_TEST_MAP_SHARE=1 turns it off, to measure a worker's growth)
TEST_MAP_SHARE = float(os.environ.get("FEDJAX_DP_TEST_MAP_SHARE", "0.35"))


def pytest_runtest_teardown(item, nextitem):
    """A worker runs hundreds of tests and keeps their compiled programs (module-level jitted
    functions, JAX's caches): XLA:CPU maps each compiled kernel as pages of their own (~25 mappings
    per program measured in the suite, jax 0.10.2), and a worker that reached the kernel's limit
    (vm.max_map_count, 65,530) died in native code in the next compilation or cache write, about
    once per full run (tools/bench_native_abort.py, tests/test_native_abort.py). Release them
    before that."""
    from fedjax_dp.core import compilation
    compilation.release_compiled(TEST_MAP_SHARE)


def pytest_unconfigure(config):
    """The process that made the cache folder (the controller) removes it at the end."""
    if _CREATED_CACHE is not None and not hasattr(config, "workerinput"):
        import shutil
        shutil.rmtree(_CREATED_CACHE, ignore_errors=True)


#: the longest tests (the subprocesses with 8 devices and 2 processes, the notebooks) start first, so that with
#: ``-n 2 --dist worksteal`` no worker is left with one of them at the end while the other idles
_LONG_FIRST = ("test_selftest.py::test_selftest_command_passes_every_family_on_this_cpu",
               "test_sharding.py::test_eight_cpu_devices_equal_one_device",
               "test_multiprocess_cli.py::test_every_family_in_a_sweep_on_two_processes",
               "test_multiprocess_cli.py::test_stopped_killed_and_resumed_on_two_processes",
               "test_multiprocess.py::test_two_processes_equal_one_process",
               "test_bench.py::test_bench_quick_suite_tiny_through_the_cli",
               "test_user_paths.py::test_killed_interrupted_and_resumed",
               "test_user_paths.py::test_readme_first_command",
               "test_wheel.py::test_release_steps_and_a_wheel_install_outside_the_tree",
               "fnas.ipynb", "isrl.ipynb", "fedkt.ipynb", "voting_dpfl.ipynb", "quickstart.ipynb")


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=lambda item: not any(item.nodeid.endswith(n) or n in item.nodeid
                                        for n in _LONG_FIRST))
