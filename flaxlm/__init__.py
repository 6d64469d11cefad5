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


def _room_for_cpu_collectives():
    """Give XLA:CPU's thread pool room for a collective when one host poses as N devices
    (--xla_force_host_platform_device_count=N, or JAX_NUM_CPU_DEVICES=N): PJRT_NPROC at least max(cores, 2N).

    Why: XLA:CPU (jaxlib 0.10) runs a program over N devices on one pool of max(cores, N) threads. Each device's
    launch waits on that pool for a free slot of the device's 32 programs in flight, and an all-reduce needs all N
    of its device programs on the pool at once. On a host with fewer than N cores the pool has exactly N threads:
    once a loop has queued 32 programs ahead (an evaluation loop does, when the host outpaces the devices), one
    thread waits for a slot while the other N-1 wait in the all-reduce for the device program that would free it,
    and XLA aborts the process a minute later ("Termination timeout for `all reduce ...`", 7 of 8 arrived).
    With 2N threads the N launches of one dispatch can all wait and still leave N threads for the collective.
    PJRT_NPROC also sizes XLA's pool for multi-threaded Eigen kernels (a matmul split over threads): 2N of them on
    fewer cores slow every program (tests/test_moe.py on 2 cores: 110 s before, 131 s with 16 threads), and the N
    device programs already keep the cores busy, so where PJRT_NPROC is raised past the cores those kernels run on one
    thread each (--xla_cpu_multi_thread_eigen=false, 108 s) unless XLA_FLAGS chooses.
    docs/developers.md#the-test-suite has the evidence."""
    import re
    count = re.search(r"--xla_force_host_platform_device_count=(\d+)", os.environ.get("XLA_FLAGS", ""))
    devices = int(count.group(1)) if count else int(os.environ.get("JAX_NUM_CPU_DEVICES") or 1)
    given = os.environ.get("PJRT_NPROC", "")
    if devices > 1 and not (given.isdigit() and int(given) >= 2 * devices):
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        os.environ["PJRT_NPROC"] = str(max(cores, 2 * devices))
        flags = os.environ.get("XLA_FLAGS", "")
        if 2 * devices > cores and "--xla_cpu_multi_thread_eigen" not in flags:
            os.environ["XLA_FLAGS"] = f"{flags} --xla_cpu_multi_thread_eigen=false".strip()


_room_for_cpu_collectives()
