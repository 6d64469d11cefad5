"""XLA_FLAGS for a test process: n simulated CPU devices, LLVM's quick code generation, and whatever else the XLA_FLAGS
the suite was started with say (`XLA_FLAGS=--xla_cpu_max_isa=AVX2 python -m pytest tests` runs every test,
subprocesses too, as a CPU without AVX-512 would).

The suite compiles over a thousand tiny programs and runs each a few steps: at XLA:CPU's default (LLVM -O3) their
compilation is most of its time. --xla_backend_optimization_level=0 makes such a test about a third faster (test_freeze.py: 105 s
-> 69 s on one core), and every check of the suite passes at either level; a level given in the suite's XLA_FLAGS is
kept."""
import os
import re

DEVICES = re.compile(r"--xla_force_host_platform_device_count=(\d+)")
OPTIMIZATION_LEVEL = re.compile(r"--xla_backend_optimization_level=\d+")
QUICK_CODE = "--xla_backend_optimization_level=0"


def xla_flags(devices):
    """The suite's XLA_FLAGS with the simulated device count set to `devices` (and quick code generation unless they
    set a level)."""
    flags = os.environ.get("XLA_FLAGS", "")
    kept = DEVICES.sub("", flags).split()
    if not OPTIMIZATION_LEVEL.search(flags):
        kept.append(QUICK_CODE)
    return " ".join([*kept, f"--xla_force_host_platform_device_count={devices}"])


def suite_flags():
    """XLA_FLAGS for the suite's own process: 8 devices unless the flags it was started with give a count."""
    count = DEVICES.search(os.environ.get("XLA_FLAGS", ""))
    return xla_flags(int(count.group(1)) if count else 8)
