"""The order in which pytest-xdist hands out the suite's test files (`-n 2 --dist loadfile`): longest first.

xdist gives a worker its next file when the file it runs is nearly done, and by default hands out the files with the
most tests first. The suite's longest files are not its most numerous: test_readme_pipeline.py is one test of about
140 s, and handed out near the end it kept one worker busy for two minutes after the other had finished (CI,
2026-12-07: the workers ended 115 s apart). Handing out the longest files first (the greedy longest-first schedule)
leaves only short files for the end, so both workers finish close together.

LONGEST_FIRST is measured, not exact: each file's time in a CI run from FLAXLM_TEST_RESOURCES' logs, the files over
70 s there, longest first. A file not listed runs after them, most tests first. The order changes no result: each
file still runs whole in one worker, its tests in their own order."""
import collections
import os

LONGEST_FIRST = (
    "test_parity.py", "test_compile_for_families.py", "test_run_clm.py", "test_survival.py", "test_compile_for.py",
    "test_readme_pipeline.py", "test_run_electra.py", "test_layer_stack.py", "test_prepared.py",
    "test_create_config.py", "test_moe.py", "test_run_t5.py", "test_splash.py", "test_muon.py", "test_run_mlm.py",
    "test_multihost.py", "test_bad_input_fuzz.py", "test_grpo.py", "test_adapt_vocabulary.py", "test_lora.py",
    "test_dpo.py", "test_evaluate_lm.py", "test_suite.py", "test_vocab_padding.py", "test_no_eval.py")


def pytest_configure(config):
    # xdist's own reordering (most tests first) would undo the order below; an xdist without the option keeps it
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def file_of(item):
    return os.path.basename(item.nodeid.split("::", 1)[0])


def pytest_collection_modifyitems(items):
    tests_in = collections.Counter(map(file_of, items))
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    # a stable sort on a key of the file alone: each file's tests stay together and in their order
    items.sort(key=lambda item: (rank.get(file_of(item), len(rank)), -tests_in[file_of(item)]))
