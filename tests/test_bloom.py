"""BLOOM: what the parity checks of every family (tests/test_parity.py) do not cover: the ALiBi slopes of head
counts beyond the table's (transformers' build_alibi_tensor), the config it refuses, the initialization,
pretraining from --model_type bloom with the default block size (no positions limit), and bare checkpoints (as the
hub's are saved)."""
import numpy as np
import pytest
import torch
import transformers
from transformers.models.bloom.modeling_bloom import build_alibi_tensor

import run_clm_flax
from flaxlm import models
from flaxlm.errors import UserError
from flaxlm.models.bloom import alibi_slopes
from parity import assert_initialized_like_transformers, assert_same_params
from run_helpers import read_metrics
from test_parity import CASE

BLOOM = CASE["bloom-4-heads"]


@pytest.mark.parametrize("heads", [4, 6, 8, 12, 16, 20])
def test_alibi_slopes_are_transformers(heads):
    """Powers of two and not (12, 20: the odd powers of the next power of two's base for the remaining heads). Ours
    are the float64 powers of the float32 base rounded once to float32; transformers takes them with torch.pow in
    float32 (transformers 5.25: one of 16 heads 1 ulp apart; 1 ulp at most over 1-128 heads)."""
    alibi = build_alibi_tensor(torch.ones(1, 3, dtype=torch.long), heads, torch.float32)  # [N, 1, 3]: slope * 0..2
    ours = np.asarray(alibi_slopes(heads), np.float32)
    np.testing.assert_array_max_ulp(ours, alibi[:, 0, 1].numpy(), maxulp=1)
    n = 2 ** int(np.floor(np.log2(heads)))
    exponents = np.concatenate([np.arange(1, n + 1), np.arange(1, 1 + 2 * (heads - n), 2)])
    bases = np.where(np.arange(heads) < n, np.float32(2 ** (-8 / n)), np.float32(2 ** (-8 / (2 * n))))
    np.testing.assert_array_equal(ours, (np.float64(bases) ** exponents).astype(np.float32))


def test_slow_but_exact_is_refused():
    """transformers' slow_but_exact path with pretraining_tp > 1 leaves out the dense biases: not ours to copy."""
    with pytest.raises(UserError, match="slow_but_exact"):
        models.create_model(BLOOM.config(pretraining_tp=2, slow_but_exact=True))
    models.create_model(BLOOM.config(pretraining_tp=2))  # without it, the tensor-parallel degree changes nothing


def test_initialized_like_transformers():
    config = transformers.BloomConfig(vocab_size=512, hidden_size=64, n_layer=1, n_head=4, initializer_range=0.05)
    assert_initialized_like_transformers(config, transformers.BloomForCausalLM,
                                         lambda name: name.endswith(".bias") or "layernorm" in name or "ln_f" in name)


def test_pretrains_from_model_type_at_the_tokenizers_length(model_dir_for, corpus, tmp_path):
    """--model_type bloom alone (Hugging Face's old Flax script's way): BLOOM has no positions limit, so the
    default block size is the tokenizer's model_max_length (64 here)."""
    out = tmp_path / "run"
    run_clm_flax.main(["--output_dir", str(out), "--model_type", "bloom", "--config_overrides",
                       "hidden_size=32,n_layer=2,n_head=4", "--tokenizer_name", model_dir_for(None),
                       "--train_file", corpus["train"], "--per_device_train_batch_size", "1", "--max_steps", "2",
                       "--do_eval", "false", "--logging_steps", "1"])
    assert [r["step"] for r in read_metrics(out)] == [1, 2]
    config, _ = models.load_pretrained(str(out))
    assert config.model_type == "bloom" and config.hidden_size == 32


def test_block_size_has_no_positions_limit():
    from types import SimpleNamespace
    from flaxlm.objectives.clm import MAX_BLOCK_SIZE, resolve_block_size
    tokenizer = SimpleNamespace(model_max_length=int(1e30))  # a tokenizer without a length
    assert resolve_block_size(None, None, tokenizer, BLOOM.config()) == MAX_BLOCK_SIZE
    assert resolve_block_size(4096, None, tokenizer, BLOOM.config()) == 4096


def test_bare_checkpoint_with_old_buffers_loads():
    """A checkpoint without the 'transformer.' prefix (the bare model), with the buffers older transformers saved:
    the same parameters."""
    config = BLOOM.config()
    tensors = models.to_hf_state_dict(config, models.split_model(models.create_model(config))[1])
    bare = {name.removeprefix("transformer."): x for name, x in tensors.items()}
    assert_same_params(models.from_hf_state_dict(config, bare), models.from_hf_state_dict(config, tensors))
