"""A test worker that dies ends the run at once, in one line naming its test and how it died (tests/worker_deaths.py):
a small suite run as README.md's command runs the real one, one of its tests aborting the process."""
import pathlib
import subprocess
import sys
import textwrap

TESTS = pathlib.Path(__file__).resolve().parent

DYING = """
import os, time
import pytest

@pytest.mark.parametrize("i", range(20))
def test_before(i):
    pass

def test_dies():
    os.abort()

def test_after():
    pass
"""
SLOW = """
import time
import pytest

@pytest.mark.parametrize("i", range(200))
def test_slow(i):
    time.sleep(1)
"""


def test_a_dead_worker_ends_the_run_naming_its_test(tmp_path):
    suite = tmp_path / "tests"
    suite.mkdir()
    (suite / "conftest.py").write_text(f"import sys\nsys.path.insert(0, {str(TESTS)!r})\n"
                                       f"pytest_plugins = ['worker_deaths']\n")
    (suite / "test_dying.py").write_text(textwrap.dedent(DYING))
    (suite / "test_slow.py").write_text(textwrap.dedent(SLOW))
    # the slow file alone would take 200 s: the run must end long before, when the other worker dies
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadfile", "-p",
                           "no:cacheprovider", "tests"], cwd=tmp_path, capture_output=True, text=True, timeout=150)
    said = done.stdout + done.stderr
    assert done.returncode == 3, said
    assert "died (signal 6 (SIGABRT)) while running tests/test_dying.py::test_dies; the run stops here" in said, said
    assert "replacing crashed worker" not in said
    assert "Fatal Python error: Aborted" in said  # the worker's own last words reach the console
