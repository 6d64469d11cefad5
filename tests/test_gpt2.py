"""GPT-2: what the parity checks of every family (tests/test_parity.py) do not cover: the checkpoints the hub
holds (bare GPT2Model names, causal-mask buffers), the state dict we write, and strictness on its names."""
import numpy as np
import pytest
from safetensors.numpy import save_file

from flaxlm import models
from parity import assert_close_at_real, assert_load_fails, batch, hf_logits, jnp_args, random_hf
from test_parity import CASE, CASES

GPT2 = CASE["gpt2-tied"]


def test_hub_style_bare_checkpoint_with_buffers(tmp_path):
    """The hub's gpt2 files: GPT2Model names without 'transformer.', attn.bias / attn.masked_bias buffers."""
    hf = random_hf(GPT2)
    tensors = {k.removeprefix("transformer."): v.numpy().copy() for k, v in hf.state_dict().items()
               if k != "lm_head.weight"}
    tensors["h.0.attn.bias"] = np.tril(np.ones((1, 1, 40, 40), np.float32))
    tensors["h.0.attn.masked_bias"] = np.array(-1e4, np.float32)
    hf.config.save_pretrained(tmp_path)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    _, model = models.load_pretrained(tmp_path)
    b = batch(GPT2)
    assert_close_at_real(model(*jnp_args(b)), hf_logits(hf, b.hf), b.real_BL, GPT2.tol)


@pytest.mark.parametrize("case", [c for c in CASES if c.model_type == "gpt2"], ids=str)
def test_we_write_the_state_dict_but_buffers_and_a_tied_head(case):
    config = case.config()
    written = models.to_hf_state_dict(config, models.split_model(models.create_model(config))[1])
    expected = {k for k in case.hf_class(config).state_dict() if not k.endswith(".attn.bias")}
    if case.tied:
        expected.discard("lm_head.weight")
    assert set(written) == expected


def test_strict_loading():
    config = GPT2.config()
    tensors = models.to_hf_state_dict(config, models.split_model(models.create_model(config))[1])
    missing = {k: v for k, v in tensors.items() if k != "transformer.h.1.mlp.c_fc.bias"}
    assert_load_fails(config, missing, r"missing tensor\(s\) transformer.h.1.mlp.c_fc.bias")
    assert_load_fails(config, {**tensors, "transformer.h.9.ln_1.weight": np.ones(32, np.float32)},
                      r"unexpected tensor\(s\) transformer.h.9.ln_1.weight")
    bad = {**tensors, "transformer.h.0.attn.c_attn.weight": np.zeros((32, 95), np.float32)}
    assert_load_fails(config, bad, r"transformer.h.0.attn.c_attn.weight has shape \(32, 95\) but config.json "
                                   r"implies \(32, 96\)")
    untied_head = {**tensors, "lm_head.weight": tensors["transformer.wte.weight"] + 1}
    assert_load_fails(config, untied_head, "lm_head.weight differs from transformer.wte.weight")
