"""Qwen2 (and Qwen3, which shares its layer windows): what the parity table (tests/test_parity.py) does not cover:
each layer's sliding window as transformers' config sets it, the config errors, and the scanned layers (identical
layers scan, layers with different windows name the problem)."""
import jax.numpy as jnp
import numpy as np
import pytest
import transformers

from flaxlm import models
from flaxlm.errors import UserError
from flaxlm.models.layer_stack import Execution
from test_parity import CASE


def windows(model):
    return [layer.attn.window for layer in model.layers]


def test_layer_windows_follow_transformers_layer_types():
    """use_sliding_window: layers max_window_layers.. slide; without it, none does (the released models); explicit
    layer_types win; Qwen3 the same."""
    base = dict(vocab_size=99, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                intermediate_size=37)
    on = dict(use_sliding_window=True, sliding_window=4, max_window_layers=1)
    assert windows(models.create_model(transformers.Qwen2Config(**base, **on))) == [None, 4, 4]
    assert windows(models.create_model(transformers.Qwen2Config(**base, sliding_window=4))) == [None] * 3
    explicit = transformers.Qwen2Config(**base, **on,
                                        layer_types=["sliding_attention", "full_attention", "sliding_attention"])
    assert windows(models.create_model(explicit)) == [4, None, 4]
    assert windows(models.create_model(transformers.Qwen3Config(**base, **on, head_dim=8))) == [None, 4, 4]


def test_config_errors_name_the_field():
    base = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                intermediate_size=37)
    config = transformers.Qwen2Config(**base, layer_types=["full_attention", "chunked_attention"])
    with pytest.raises(UserError, match="layer_types"):
        models.create_model(config)
    config = transformers.Qwen2Config(**base, layer_types=["full_attention", "sliding_attention"])  # window: None
    with pytest.raises(UserError, match="sliding_window"):
        models.create_model(config)
    with pytest.raises(UserError, match="sliding_window"):
        models.create_model(transformers.MistralConfig(**base, sliding_window=0))


@pytest.mark.parametrize("name", ["mistral-window4-untied", "qwen2-untied", "qwen3-head_dim12-untied"])
def test_identical_layers_scan_to_the_loops_logits(name):
    config = CASE[name].config()
    ids = jnp.asarray(np.random.default_rng(0).integers(3, 99, (2, 12)))
    loop = models.create_model(config, seed=1)
    scanned = models.create_model(config, seed=1, execution=Execution(scan=True))
    np.testing.assert_allclose(scanned(ids), loop(ids), atol=1e-5)


def test_layers_with_different_windows_do_not_scan():
    model = models.create_model(CASE["qwen2-window4-layer1"].config(), execution=Execution(scan=True))
    with pytest.raises(UserError, match="--scan_layers"):
        model(jnp.ones((1, 8), jnp.int32))
