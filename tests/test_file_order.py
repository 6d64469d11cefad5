"""tests/file_order.py: the suite's longest files handed out first, each file's tests kept together and in order."""
import pathlib
from types import SimpleNamespace

from file_order import LONGEST_FIRST, pytest_collection_modifyitems


def test_every_listed_file_is_in_the_suite():
    """A renamed or removed file would silently fall out of the order."""
    here = pathlib.Path(__file__).parent
    assert [name for name in LONGEST_FIRST if not (here / name).is_file()] == []
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)


def test_listed_files_first_then_most_tests_each_file_together_in_order():
    nodeids = ["tests/test_a.py::t1", "tests/test_parity.py::t1", "tests/test_b.py::t1", "tests/test_b.py::t2",
               "tests/test_run_clm.py::t1", "tests/test_parity.py::t2", "tests/test_a.py::t2", "tests/test_b.py::t3"]
    items = [SimpleNamespace(nodeid=n) for n in nodeids]
    pytest_collection_modifyitems(items)
    assert [i.nodeid for i in items] == [
        "tests/test_parity.py::t1", "tests/test_parity.py::t2", "tests/test_run_clm.py::t1", "tests/test_b.py::t1",
        "tests/test_b.py::t2", "tests/test_b.py::t3", "tests/test_a.py::t1", "tests/test_a.py::t2"]
