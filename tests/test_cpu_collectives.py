"""import flaxlm gives XLA:CPU's thread pool room for a collective when the CPU poses as several devices
(flaxlm/__init__.py, docs/developers.md#the-test-suite): PJRT_NPROC at least twice the device count."""
import os
import subprocess
import sys

import pytest

CORES = len(os.sched_getaffinity(0))


def pool_size(env):
    """PJRT_NPROC after `import flaxlm` in a fresh process with `env` (beside PATH)."""
    code = "import flaxlm, os; print(os.environ.get('PJRT_NPROC'))"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", code], env={"PATH": os.environ["PATH"], **env}, cwd=root,
                          capture_output=True, text=True, check=True)
    return done.stdout.strip()


@pytest.mark.parametrize("env, expected", [
    ({"XLA_FLAGS": "--xla_cpu_max_isa=AVX2 --xla_force_host_platform_device_count=8"}, str(max(CORES, 16))),
    ({"JAX_NUM_CPU_DEVICES": "4"}, str(max(CORES, 8))),
    ({"XLA_FLAGS": "--xla_force_host_platform_device_count=8", "PJRT_NPROC": "4"}, str(max(CORES, 16))),  # too few
    ({"XLA_FLAGS": "--xla_force_host_platform_device_count=8", "PJRT_NPROC": "64"}, "64"),  # the user's, enough
    ({"XLA_FLAGS": "--xla_force_host_platform_device_count=1"}, "None"),  # one device: XLA's own default
    ({}, "None"),
])
def test_the_pool_has_twice_the_devices(env, expected):
    assert pool_size(env) == expected


def test_the_suite_runs_with_the_room():
    assert int(os.environ["PJRT_NPROC"]) >= 16  # conftest's 8 devices, set before JAX started
