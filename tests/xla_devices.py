"""XLA_FLAGS for a test process: n simulated CPU devices, XLA:CPU's quicker-to-compile code generator, and whatever
else the XLA_FLAGS the suite was started with say (`XLA_FLAGS=--xla_cpu_max_isa=AVX2 python -m pytest tests` runs
every test, subprocesses too, as a CPU without AVX-512 would).

The suite compiles over a thousand tiny programs and runs each a few steps: compiling is most of its time, spent in
XLA:CPU's MLIR fusion emitters and in LLVM. --xla_cpu_use_fusion_emitters=false has XLA emit its fusions the way it
did before them (its other, long-standing code generator) and --xla_backend_optimization_level=0 has LLVM skip its
optimizations (test_freeze.py on one core: 99 s at XLA's defaults, 71 s at -O0, 45 s with the fusion emitters off);
every check of the suite passes either way. Either flag given in the suite's XLA_FLAGS keeps that setting."""
import os
import re

DEVICES = re.compile(r"--xla_force_host_platform_device_count=(\d+)")
FUSION_EMITTERS = re.compile(r"--xla_cpu_use_fusion_emitters=\w+")
OPTIMIZATION_LEVEL = re.compile(r"--xla_backend_optimization_level=\d+")
QUICK_CODE = ("--xla_cpu_use_fusion_emitters=false", "--xla_backend_optimization_level=0")


def xla_flags(devices):
    """The suite's XLA_FLAGS with the simulated device count set to `devices` (and the quicker code generator unless
    they choose one)."""
    flags = os.environ.get("XLA_FLAGS", "")
    kept = DEVICES.sub("", flags).split()
    if not FUSION_EMITTERS.search(flags) and not OPTIMIZATION_LEVEL.search(flags):
        kept += QUICK_CODE
    return " ".join([*kept, f"--xla_force_host_platform_device_count={devices}"])


def suite_flags():
    """XLA_FLAGS for the suite's own process: 8 devices unless the flags it was started with give a count."""
    count = DEVICES.search(os.environ.get("XLA_FLAGS", ""))
    return xla_flags(int(count.group(1)) if count else 8)
