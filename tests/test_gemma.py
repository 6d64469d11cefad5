"""Gemma, Gemma 2 and Gemma 3: what the parity checks of every family (tests/test_parity.py) do not cover: the
per-layer windows and RoPE of the released shapes, their parameter counts, the embeddings' normalizer rounded as
transformers rounds it in bfloat16, generation well past the sliding window, scanning and config errors."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from flaxlm import models
from flaxlm.errors import UserError
from flaxlm.models.layer_stack import Execution
from flaxlm.models.presets import build_config
from generation_check import assert_greedy_matches_transformers
from parity import batch, jnp_args, random_hf
from test_parity import CASE

GEMMA2 = CASE["gemma2-softcap-window4-untied"]
GEMMA3 = CASE["gemma3_text-local-local-global"]


def abstract(config):
    """Our model of config with its static settings and no parameter allocated."""
    return nnx.eval_shape(lambda: models.create_model(config))


def hf_rope(config):
    """transformers' RoPE inverse frequencies per layer type ({None: ...} when all layers share one)."""
    if config.model_type == "gemma3_text":
        rope = transformers.models.gemma3.modeling_gemma3.Gemma3RotaryEmbedding(config)
        return {t: getattr(rope, f"{t}_inv_freq").numpy() for t in set(config.layer_types)}
    return {None: transformers.models.gemma2.modeling_gemma2.Gemma2RotaryEmbedding(config).inv_freq.numpy()}


@pytest.mark.parametrize("name", ["gemma-2-9b", "gemma-3-4b"])
def test_released_shapes_have_transformers_layer_pattern(name):
    """Each layer's window (sliding_window on transformers' sliding_attention layers, none on full_attention ones)
    and RoPE frequencies (per layer type for Gemma 3) are what transformers' config and rotary embedding say."""
    config = build_config(name)
    model = abstract(config)
    rope = hf_rope(config)
    assert len(model.layers) == len(config.layer_types) == config.num_hidden_layers
    for layer, kind in zip(model.layers, config.layer_types):
        assert layer.attn.window == (config.sliding_window if kind == "sliding_attention" else None)
        np.testing.assert_allclose(np.asarray(layer.attn.rotation.inv_freq, np.float32), rope.get(kind, rope.get(None)),
                                   rtol=2e-7, atol=0)
        assert layer.attn.scale == 256 ** -0.5
    windows = [layer.attn.window for layer in model.layers]
    inv_freq = [layer.attn.rotation.inv_freq for layer in model.layers]
    if name == "gemma-2-9b":  # sliding, global, sliding, ...: one RoPE, soft-capped
        assert windows == [4096, None] * 21 and len(set(inv_freq)) == 1
        assert all(layer.attn.softcap == 50.0 for layer in model.layers) and model.logit_softcap == 30.0
    else:  # five local layers (theta 10k), then a global one (theta 1M, frequencies / 8); not soft-capped
        assert windows == ([1024] * 5 + [None]) * 5 + [1024] * 4
        local, global_ = inv_freq[0], inv_freq[5]
        assert set(inv_freq[i] for i in range(34) if i % 6 != 5) == {local}
        assert set(inv_freq[i] for i in range(34) if i % 6 == 5) == {global_}
        assert global_[0] == 1 / 8 and local[1] == pytest.approx(10000 ** (-2 / 256), rel=1e-6)
        assert global_[1] == pytest.approx(1e6 ** (-2 / 256) / 8, rel=1e-6)
        assert all(layer.attn.softcap is None for layer in model.layers) and model.logit_softcap is None


def test_released_parameter_counts():
    """The presets' sizes as published (Gemma 3 4B: its text model's)."""
    counts = {"gemma-2b": 2_506_172_416, "gemma-7b": 8_537_680_896, "gemma-2-2b": 2_614_341_888,
              "gemma-2-9b": 9_241_705_984, "gemma-3-1b": 999_885_952, "gemma-3-4b": 3_880_263_168}
    for name, count in counts.items():
        assert models.count_params(models.abstract_model(build_config(name))[1]) == count, name


@pytest.mark.parametrize("name", ["gemma-gqa-tied", "gemma2-global-first-uncapped-tied-mqa",
                                  "gemma3_text-local-local-global"])
def test_bfloat16_embeddings_are_transformers_bfloat16_embeddings(name):
    """transformers multiplies the embeddings by sqrt(hidden_size) rounded to the weights' dtype (5.65625 in
    bfloat16 for width 32, not 5.657): our bfloat16 input rows are a bfloat16 model's, bit for bit."""
    case = CASE[name]
    hf = random_hf(case).to(torch.bfloat16)
    ids = batch(case).args[0]
    with torch.no_grad():
        ref = hf.get_input_embeddings()(torch.tensor(ids)).float().numpy()
    graphdef, params = models.split_model(models.create_model(case.config(), dtype="bfloat16"))
    params["embed"]["embedding"] = jnp.asarray(hf.get_input_embeddings().weight.detach().float().numpy())
    model = models.merge_model(graphdef, params)
    ours = model.embed_input(jnp.asarray(ids), None, None)
    assert ours.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(ours.astype(jnp.float32)), ref)


def test_greedy_generation_past_the_window(tmp_path):
    """Soft-capped Gemma 2 (attention 5, logits 3) with a window of 4: prompts of 13 and 5 tokens and 10 new
    ones, so that the prefill and most decode steps see keys beyond the window (left padding inside it for the
    short prompt)."""
    hf = random_hf(GEMMA2, seed=3, std=0.3)
    assert hf.config.sliding_window == 4 and hf.config._attn_implementation == "eager"  # sdpa would not soft-cap
    assert (hf.config.attn_logit_softcapping, hf.config.final_logit_softcapping) == (5.0, 3.0)
    hf.save_pretrained(tmp_path)
    prompts = [list(range(5, 18)), [20, 21, 22, 23, 24]]
    tokens = assert_greedy_matches_transformers(hf, tmp_path, prompts, 10)
    assert all(len(set(row)) > 1 for row in tokens)  # neither row one repeated token


def test_scan_layers():
    """Gemma's layers are alike and Gemma 2's repeat (sliding, full, sliding: a pair per step of the scan, then the
    third): scanned, the loop's logits. Gemma 3's local, local, global do not repeat: a one-line error."""
    config = CASE["gemma-gqa-tied"].config()
    args = jnp_args(batch(CASE["gemma-gqa-tied"]))
    graphdef, params = models.split_model(models.create_model(config))
    scanned, _ = models.split_model(models.create_model(config, execution=Execution(scan=True)))
    np.testing.assert_allclose(np.asarray(models.apply_model(scanned, params, *args)),
                               np.asarray(models.apply_model(graphdef, params, *args)), atol=1e-5)
    graphdef, params = models.split_model(models.create_model(GEMMA2.config()))
    scanned, _ = models.split_model(models.create_model(GEMMA2.config(), execution=Execution(scan=True)))
    np.testing.assert_allclose(np.asarray(models.apply_model(scanned, params, *args)),
                               np.asarray(models.apply_model(graphdef, params, *args)), atol=1e-5)
    graphdef, params = models.split_model(models.create_model(GEMMA3.config(), execution=Execution(scan=True)))
    with pytest.raises(UserError, match="--scan_layers needs layers that repeat"):
        jax.eval_shape(lambda p: models.apply_model(graphdef, p, *args), params)


def test_config_errors():
    with pytest.raises(UserError, match="use_bidirectional_attention"):
        models.create_model(CASE["gemma-gqa-tied"].config(use_bidirectional_attention=True))
    config = GEMMA2.config()
    config.layer_types = ["sliding_attention", "chunked_attention", "full_attention"]
    with pytest.raises(UserError, match="layer_types"):
        models.create_model(config)
    config = CASE["gemma3_text-local-local-global"].config()
    config.rope_parameters = {"full_attention": config.rope_parameters["full_attention"]}
    with pytest.raises(UserError, match="sliding_attention"):
        models.create_model(config)
