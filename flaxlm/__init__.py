"""flaxlm: language-model pretraining in JAX/Flax with Hugging Face-compatible models."""
import glob
import importlib.util
import os

__version__ = "0.1.0"


def _quiet_libtpu_without_tpus():
    """With libtpu installed on a host without TPU chips (a CPU or GPU machine that checks runs with --compile_for),
    libtpu prints warnings about TPU_ACCELERATOR_TYPE and TPU_WORKER_HOSTNAMES at every JAX start, and a process that
    loads it locks /tmp/libtpu_lockfile so that no second one can compile for a TPU at the same time: give the two
    variables a value there and lift the lock, which guards TPU chips there are none of (a user's own values are
    kept). TPU chips are Google PCI devices (vendor 0x1ae0), as JAX itself finds them."""
    if importlib.util.find_spec("libtpu") is None:
        return
    for vendor in glob.glob("/sys/bus/pci/devices/*/vendor"):
        try:
            with open(vendor) as f:
                if f.read().strip() == "0x1ae0":
                    return
        except OSError:
            continue
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-8")
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


_quiet_libtpu_without_tpus()
