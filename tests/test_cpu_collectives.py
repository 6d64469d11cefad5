"""import flaxlm gives XLA:CPU's thread pool room for a collective when the CPU poses as several devices
(flaxlm/__init__.py, docs/developers.md#the-test-suite): PJRT_NPROC at least twice the device count, and, where that
is more threads than cores, Eigen's kernels on one thread each (the pool's size is also theirs)."""
import os
import subprocess
import sys

import pytest

CORES = len(os.sched_getaffinity(0))


def after_import(env):
    """PJRT_NPROC and XLA_FLAGS after `import flaxlm` in a fresh process with `env` (beside PATH)."""
    code = "import flaxlm, os; print(os.environ.get('PJRT_NPROC')); print(os.environ.get('XLA_FLAGS', ''))"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", code], env={"PATH": os.environ["PATH"], **env}, cwd=root,
                          capture_output=True, text=True, check=True)
    pool, flags = done.stdout.split("\n")[:2]
    return pool, flags


@pytest.mark.parametrize("env, expected", [
    ({"XLA_FLAGS": "--xla_cpu_max_isa=AVX2 --xla_force_host_platform_device_count=8"}, str(max(CORES, 16))),
    ({"JAX_NUM_CPU_DEVICES": "4"}, str(max(CORES, 8))),
    ({"XLA_FLAGS": "--xla_force_host_platform_device_count=8", "PJRT_NPROC": "4"}, str(max(CORES, 16))),  # too few
    ({"XLA_FLAGS": "--xla_force_host_platform_device_count=8", "PJRT_NPROC": "64"}, "64"),  # the user's, enough
    ({"XLA_FLAGS": "--xla_force_host_platform_device_count=1"}, "None"),  # one device: XLA's own default
    ({}, "None"),
])
def test_the_pool_has_twice_the_devices(env, expected):
    pool, flags = after_import(env)
    assert pool == expected
    single = "--xla_cpu_multi_thread_eigen=false" in flags.split()
    assert single == (pool not in ("None", env.get("PJRT_NPROC")) and int(pool) > CORES)  # raised past the cores
    assert flags.startswith(env.get("XLA_FLAGS", ""))  # the user's flags kept as given


def test_a_choice_of_eigen_threads_is_kept():
    _, flags = after_import({"XLA_FLAGS": "--xla_force_host_platform_device_count=8 --xla_cpu_multi_thread_eigen=true"})
    assert "=false" not in flags


def test_the_suite_runs_with_the_room():
    assert int(os.environ["PJRT_NPROC"]) >= 16  # conftest's 8 devices, set before JAX started
    assert ("--xla_cpu_multi_thread_eigen=false" in os.environ["XLA_FLAGS"]) == (CORES < 16)
