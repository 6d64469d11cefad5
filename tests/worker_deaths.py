"""pytest-xdist's controller: a test worker that dies ends the whole run at once, in one line naming the test it was
running and how its process ended.

Left to itself, pytest-xdist 3.8 reports a dead worker as a failed test, starts a replacement and carries on; under
--dist loadfile it can then wait forever for the dead worker's files (pytest-xdist issue 1378, open), which in CI
is a silent hang until the job's time limit. A worker dies only of something outside Python (XLA aborting the
process, the kernel's out-of-memory killer) that no rerun fixes, and a suite that carries on past it hides it. So the
run stops there with exit status 3 (pytest's "internal error", not a test's failure); the worker's last words (its
faulthandler traceback, XLA's own message) are just above the line on stderr."""
import signal

import pytest


def exit_status(node):
    """How the process of xdist's worker `node` ended: 'signal 6 (SIGABRT)', 'exit status 1', or 'unknown'."""
    popen = getattr(getattr(node.gateway, "_io", None), "popen", None)  # execnet's popen transport: the process
    try:
        code = popen.wait(timeout=10)
    except Exception:  # noqa: BLE001 (another execnet transport, or a process that does not end)
        return "unknown"
    return f"signal {-code} ({signal.Signals(-code).name})" if code < 0 else f"exit status {code}"


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """Called when a worker goes away: error is None when it finished its work, else it died."""
    if error is None:
        return
    scheduler = node.config.pluginmanager.getplugin("dsession").sched
    try:
        test = scheduler.remove_node(node)  # what xdist itself asks next: the test the worker had not finished
    except Exception:  # noqa: BLE001 (died before it was given work)
        test = None
    pytest.exit(f"test worker {node.gateway.id} died ({exit_status(node)}) while running "
                f"{test or 'no test (between tests)'}; the run stops here, the worker's last words are above",
                returncode=pytest.ExitCode.INTERNAL_ERROR)
