"""Test setup: 8 simulated CPU devices for every test (single-device tests use a 1-device mesh) and XLA:CPU's quicker
to compile code generator (tests/xla_devices.py), added to the XLA_FLAGS the suite runs under (an instruction set to
check, --xla_cpu_max_isa=AVX2; a device count or code generator given there is kept)."""
import gc
import os
import sys

from xla_devices import suite_flags

os.environ["XLA_FLAGS"] = suite_flags()
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pathlib  # noqa: E402
import shutil  # noqa: E402

import pytest  # noqa: E402

# a dead test worker ends the run in one line naming its test; FLAXLM_TEST_RESOURCES=DIR logs each worker's figures; the
# longest test files are handed out first (tests/file_order.py)
pytest_plugins = ["worker_deaths", "worker_resources", "file_order"]

SHARED_DATA = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"


def _no_default_compilation_cache():
    """Training scripts called in this process keep JAX's persistent compilation cache off unless a test passes
    --compilation_cache_dir: one process that compiled a step and then loads an equal one from that cache (written
    by an earlier script run in the same process) aborts inside XLA:CPU (jax 0.10.2: test_multihost then test_run_clm,
    with a fresh cache). A user's run is one process: the cache is written by one and read by the next."""
    from flaxlm.training import compile_cache
    enable = compile_cache.enable_compilation_cache
    compile_cache.enable_compilation_cache = lambda setting: None if setting == "auto" else enable(setting)


_no_default_compilation_cache()


MAPPINGS_BEFORE_RELEASE = 30000  # of Linux's 65530 (vm.max_map_count); a test adds a few hundred at most


def _release():
    import jax
    jax.clear_caches()
    gc.collect()


def _mappings():
    """The count of this process's memory mappings (0 where /proc is absent)."""
    try:
        with open("/proc/self/maps", "rb") as maps:
            return sum(1 for _ in maps)
    except OSError:
        return 0


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """After each test file, drop the programs JAX compiled for it. XLA:CPU maps each compiled program's code into
    the process and unmaps it only when the program is freed; a worker that runs ~800 tests keeping them all
    reaches Linux's limit of 65530 mappings per process (vm.max_map_count), and XLA aborts at the next compile."""
    yield
    _release()


@pytest.fixture(autouse=True)
def _release_when_mappings_pile_up():
    """The same within a file once the mappings near half the limit: test_parity's ~400 tests (each model family
    compiled many times over) alone map ~60,000 and aborted a CI worker."""
    yield
    if _mappings() > MAPPINGS_BEFORE_RELEASE:
        _release()


@pytest.fixture
def shared_data():
    """../shared/data beside the checkout; tests that need it skip cleanly where it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    """The demo corpus, cut small: ~60 KB train, the demo's validation file."""
    from flaxlm.data.demo_corpus import write_demo_corpus
    d = tmp_path_factory.mktemp("corpus")
    paths = write_demo_corpus(str(d))
    with open(paths["train"], encoding="utf-8") as f:
        lines = f.readlines()[:300]
    small = d / "train_small.txt"
    small.write_text("".join(lines), encoding="utf-8")
    return {"train": str(small), "validation": paths["validation"]}


@pytest.fixture(scope="session")
def model_dir_for(tmp_path_factory, corpus):
    """model_dir_for(preset, tokenizer="bpe", vocab_size=300, model_max_length=64): a directory holding the
    tokenizer train_tokenizer.py trains on the corpus and, unless preset is None, the config.json create_config.py
    writes for the preset beside it. Each is made once a session: tests copy one before changing it."""
    import create_config
    import train_tokenizer
    made = {}

    def model_dir(preset, tokenizer="bpe", vocab_size=300, model_max_length=64):
        key = (preset, tokenizer, vocab_size, model_max_length)
        if key not in made:
            d = str(tmp_path_factory.mktemp(f"{preset or 'tokenizer'}-{tokenizer}-{vocab_size}"))
            if preset is None:
                size = [] if tokenizer == "byte" else ["--vocab_size", str(vocab_size)]  # bytes: a fixed vocabulary
                train_tokenizer.main(["--type", tokenizer, "--train_file", corpus["train"], *size,
                                      "--model_max_length", str(model_max_length), "--output_dir", d])
            else:
                shutil.copytree(model_dir(None, tokenizer, vocab_size, model_max_length), d, dirs_exist_ok=True)
                create_config.main(["--preset", preset, "--output_dir", d])
            made[key] = d
        return made[key]

    return model_dir


@pytest.fixture(scope="session")
def tiny_gpt2_dir(model_dir_for):
    """Our BPE tokenizer (304 tokens: divisible by 8 devices) and a gpt2-tiny config beside it."""
    return model_dir_for("gpt2-tiny", vocab_size=304)
