"""What the --compile_for tests share: each family's tiny preset and its pretraining script compiled for a TPU
v5e-8 on this CPU (libtpu's compiler; the tests that need it skip where it is not installed)."""
import importlib
import importlib.util

import pytest

from flaxlm.models.registry import FAMILIES

needs_libtpu = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                  reason="the TPU compiler: pip install -r requirements-tpu.txt")
T5_KINDS = ("t5", "mt5", "umt5")


def tiny_preset(model_type):
    family = FAMILIES[model_type]
    return next(p for p, fields in family.presets.items() if "tiny" in p and fields["model_type"] == model_type)


def tokenizer_kind(model_type):
    return "unigram" if model_type in T5_KINDS else "bpe"


def compile_for_v5e_8(model_type, model_dir, corpus, attention, length, *flags):
    """The family's pretraining script with --compile_for v5e-8 --sharding fsdp (then `flags`, which may say another
    --sharding): what check_fit returns."""
    script = FAMILIES[model_type].script
    flag = "--block_size" if script == "run_clm_flax.py" else "--max_seq_length"
    return importlib.import_module(script.removesuffix(".py")).main([
        "--config_name", model_dir, "--tokenizer_name", model_dir, "--train_file", corpus["train"], flag, str(length),
        "--per_device_train_batch_size", "2", "--per_device_eval_batch_size", "2", "--dtype", "bfloat16",
        "--attention_implementation", attention, "--sharding", "fsdp", "--compile_for", "v5e-8", *flags])
