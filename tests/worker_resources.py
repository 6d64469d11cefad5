"""With FLAXLM_TEST_RESOURCES=DIR, each test process (an xdist worker, or the one process) appends to DIR/NAME.jsonl,
after each test file, what it holds of what a Linux process can run out of: memory mappings (vm.max_map_count,
65530), threads, open files, resident memory (now and its peak), JAX's live arrays. How the suite's figures grow
from the first file to the last is how a worker nears a limit (docs/developers.md#the-test-suite)."""
import json
import os
import pathlib
import threading
import time

import pytest

OUT = os.environ.get("FLAXLM_TEST_RESOURCES")


def figures():
    """This process's counts, from /proc (Linux)."""
    status = dict(line.split(":", 1) for line in pathlib.Path("/proc/self/status").read_text().splitlines())
    with open("/proc/self/maps", "rb") as maps:
        mappings = sum(1 for _ in maps)
    import jax
    return {"mappings": mappings, "threads": int(status["Threads"]), "python_threads": threading.active_count(),
            "open_files": len(os.listdir("/proc/self/fd")),
            "rss_mib": int(status["VmRSS"].split()[0]) // 1024, "peak_rss_mib": int(status["VmHWM"].split()[0]) // 1024,
            "live_arrays": len(jax.live_arrays())}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield  # after the teardown of this test's fixtures: a file's last test also tore its module fixtures down
    if OUT and (nextitem is None or nextitem.path != item.path):
        name = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(os.path.join(OUT, f"{name}.jsonl"), "a") as log:
            log.write(json.dumps({"file": item.path.name, "time": round(time.time()), **figures()}) + "\n")
