"""XLA_FLAGS for a test process: n simulated CPU devices, and whatever else the XLA_FLAGS the suite was started with
say (`XLA_FLAGS=--xla_cpu_max_isa=AVX2 python -m pytest tests` runs every test, subprocesses too, as a CPU without
AVX-512 would)."""
import os
import re

DEVICES = re.compile(r"--xla_force_host_platform_device_count=\d+")


def xla_flags(devices):
    """The suite's XLA_FLAGS with the simulated device count set to `devices`."""
    kept = DEVICES.sub("", os.environ.get("XLA_FLAGS", "")).split()
    return " ".join([*kept, f"--xla_force_host_platform_device_count={devices}"])
