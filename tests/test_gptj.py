"""GPT-J: what the parity checks of every family (tests/test_parity.py) do not cover: the rotary widths it
refuses, the LM head's bias in the fused head + loss, and the initialization."""
import jax
import numpy as np
import pytest
import transformers

from flaxlm import models
from flaxlm.errors import UserError
from parity import assert_initialized_like_transformers, randomize
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
