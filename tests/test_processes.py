"""How a process finds its job (flags, ``run.distributed``, a cluster's environment) and what
process 0 sends the others (a checkpoint folder as one blob); the 2-process runs themselves are
tests/test_multiprocess_cli.py."""
import pytest

from fedjax_dp.experiments import processes
from fedjax_dp.experiments.config import ConfigError, resolve as resolve_config


@pytest.mark.parametrize("env,cluster", [
    ({}, None),
    ({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "1", "SLURM_PROCID": "0"}, None),   # one task
    ({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "4", "SLURM_PROCID": "2"}, "slurm"),
    ({"SLURM_JOB_ID": "7", "SLURM_STEP_NUM_TASKS": "2", "SLURM_NTASKS": "1",
      "SLURM_PROCID": "1"}, "slurm"),
    ({"OMPI_COMM_WORLD_SIZE": "1"}, None),
    ({"OMPI_COMM_WORLD_SIZE": "8"}, "openmpi"),
    ({"TPU_WORKER_HOSTNAMES": "t0"}, None),                 # a single-host TPU VM
    ({"TPU_WORKER_HOSTNAMES": "t0,t1,t2,t3"}, "tpu_pod"),
    ({"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "1"}, None),
    ({"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "3"}, "jax_env"),
])
def test_detect_reads_only_the_environment_given(env, cluster):
    assert processes.detect(env) == cluster


def test_resolve_flags_over_config_over_environment():
    env = {"JAX_COORDINATOR_ADDRESS": "10.0.0.9:1234", "JAX_NUM_PROCESSES": "4",
           "JOB_COMPLETION_INDEX": "3"}                    # a Kubernetes indexed Job
    spec = processes.resolve({}, {}, env)
    assert (spec.coordinator, spec.num_processes, spec.process_id, spec.cluster) == \
        ("10.0.0.9:1234", 4, 3, "jax_env")
    table = {"coordinator": "h0:9000", "num_processes": 2, "process_id": 1, "timeout_s": 30}
    spec = processes.resolve({}, table, env)
    assert (spec.coordinator, spec.process_id, spec.timeout_s, spec.cluster) == \
        ("h0:9000", 1, 30, "config")
    spec = processes.resolve({"process_id": 0, "coordinator": None}, table, env)
    assert (spec.coordinator, spec.process_id, spec.cluster) == ("h0:9000", 0, "flags")
    assert processes.resolve({}, {}, {}) is None
    assert processes.resolve({"coordinator": "h:1", "num_processes": 1, "process_id": 0},
                             {}, {}) is None                # one process: unchanged run
    slurm = processes.resolve({}, {}, {"SLURM_JOB_ID": "1", "SLURM_NTASKS": "2",
                                       "SLURM_PROCID": "0"})
    assert slurm.coordinator is None and slurm.cluster == "slurm"   # JAX fills it in


@pytest.mark.parametrize("table,says", [
    ({"coordinator": "h:1", "num_processes": 2}, "--process-id"),
    ({"coordinator": "h", "num_processes": 2, "process_id": 0}, "HOST:PORT"),
    ({"coordinator": "h:99999", "num_processes": 2, "process_id": 0}, "port 1-65535"),
    ({"coordinator": "h:1", "num_processes": 2, "process_id": 2}, "[0, 1]"),
    ({"coordinator": "h:1", "num_processes": 2, "process_id": -1}, ">= 0"),
    ({"coordinator": "h:1", "num_processes": True, "process_id": 0}, "num_processes"),
    ({"timeout_s": 2}, ">= 5"),
    ({"host": "h"}, "unknown key"),
])
def test_bad_job_descriptions_are_refused_naming_the_key(table, says):
    with pytest.raises(ValueError, match=None) as e:
        processes.resolve({}, table, {})
    assert says in str(e.value)
    with pytest.raises(ConfigError) as e:                  # the config's table: the same check
        resolve_config({"run": {"distributed": table}})
    assert "run.distributed" in str(e.value) and says in str(e.value)


def test_run_mesh_and_distributed_keys_stay_out_of_configs_that_leave_them_alone():
    plain = resolve_config({})
    assert "mesh" not in plain["run"] and "distributed" not in plain["run"]
    set_ = resolve_config({"run": {"mesh": "all"}})
    assert set_["run"]["mesh"] == "all"
    with pytest.raises(ValueError, match="run.mesh"):
        resolve_config({"run": {"mesh": "some"}})


def test_a_packed_checkpoint_unpacks_to_the_same_files_and_refuses_escaping_paths(tmp_path):
    src = tmp_path / "step_00000004"
    (src / "values").mkdir(parents=True)
    (src / "meta.json").write_text('{"step": 4}')
    (src / "values" / "0.bin").write_bytes(bytes(range(256)) * 3)
    (src / "values" / "1.bin").write_bytes(b"")
    blob = processes.pack_folder(src)
    got = processes.unpack_folder(blob, tmp_path / "dest")
    assert got.name == "step_00000004"
    assert sorted(str(p.relative_to(got)) for p in got.rglob("*") if p.is_file()) == \
        ["meta.json", "values/0.bin", "values/1.bin"]
    assert (got / "values" / "0.bin").read_bytes() == bytes(range(256)) * 3
    for bad in (b'{"name": "x", "files": [["../evil", 1]]}\nA',
                b'{"name": "x", "files": [["/abs", 1]]}\nA',
                b'{"name": "..", "files": []}\n'):
        with pytest.raises(ValueError):
            processes.unpack_folder(bad, tmp_path / "dest2")
    assert not (tmp_path / "evil").exists()
