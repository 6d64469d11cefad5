"""GPT-J: what the parity checks of every family (tests/test_parity.py) do not cover: the rotary widths it
refuses, the LM head's bias in the fused head + loss, the initialization, and bare checkpoints with old buffers."""
import jax
import numpy as np
import pytest
import transformers

from flaxlm import models
from flaxlm.errors import UserError
from parity import assert_initialized_like_transformers, assert_same_params, randomize
from test_parity import CASE

GPTJ = CASE["gptj-partial-rotary"]


@pytest.mark.parametrize("rotary_dim", [3, 10])
def test_rotary_dim_must_fit_the_head(rotary_dim):
    with pytest.raises(UserError, match=f"rotary_dim {rotary_dim} must be even and at most the head width 8"):
        models.create_model(GPTJ.config(rotary_dim=rotary_dim))


@pytest.mark.parametrize("name", ["partial-rotary", "full-rotary-tied-gelu"])
def test_head_has_the_bias(name):
    """hidden=True rows through head() (what the fused head + loss multiplies, flaxlm.objectives.lm_loss) give the
    logits, lm_head's bias included (tied or not)."""
    config = CASE[f"gptj-{name}"].config()
    graphdef, params = models.split_model(models.create_model(config))
    params = randomize(params, std=0.2)
    model = models.merge_model(graphdef, params)
    ids = jax.numpy.asarray(np.arange(3, 15).reshape(2, 6))
    head = model.head()
    assert head.bias is not None and float(np.abs(np.asarray(head.bias)).max()) > 0
    np.testing.assert_allclose(np.asarray(head.logits(model(ids, hidden=True))), np.asarray(model(ids)), atol=1e-6)


def test_initialized_like_transformers():
    config = transformers.GPTJConfig(vocab_size=512, n_embd=64, n_layer=2, n_head=4, rotary_dim=8, n_positions=128,
                                     initializer_range=0.05)
    assert_initialized_like_transformers(config, transformers.GPTJForCausalLM,
                                         lambda name: name.endswith(".bias") or ".ln_" in name)


def test_bare_checkpoint_with_old_buffers_loads():
    """A checkpoint without the 'transformer.' prefix (the bare model), with the buffers older transformers saved:
    the same parameters."""
    config = GPTJ.config()
    tensors = models.to_hf_state_dict(config, models.split_model(models.create_model(config))[1])
    bare = {name.removeprefix("transformer."): x for name, x in tensors.items()}
    bare["h.1.attn.bias"] = np.tril(np.ones((1, 1, 40, 40), bool))
    bare["h.1.attn.masked_bias"] = np.asarray(-1e9, np.float32)
    bare["h.1.attn.embed_positions"] = np.zeros((40, 4), np.float32)
    assert_same_params(models.from_hf_state_dict(config, bare), models.from_hf_state_dict(config, tensors))
