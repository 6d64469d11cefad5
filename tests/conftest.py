"""Test setup: 8 simulated CPU devices for every test (single-device tests use a 1-device mesh)."""
import os
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pathlib  # noqa: E402

import pytest  # noqa: E402

SHARED_DATA = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"


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
def tiny_gpt2_dir(tmp_path_factory, corpus):
    """Our BPE tokenizer (304 tokens: divisible by 8 devices) and a gpt2-tiny config beside it."""
    import create_config
    import train_tokenizer
    d = str(tmp_path_factory.mktemp("tiny_gpt2"))
    train_tokenizer.main(["--type", "bpe", "--train_file", corpus["train"], "--vocab_size", "304",
                          "--model_max_length", "64", "--output_dir", d])
    create_config.main(["--preset", "gpt2-tiny", "--output_dir", d])
    return d
