"""GPT-Neo: what the parity checks of every family (tests/test_parity.py) do not cover: the per-layer pattern of
local windows from attention_types, the attention types it refuses, --scan_layers on mixed and on uniform layers,
the initialization, and bare checkpoints with old buffers."""
import jax.numpy as jnp
import numpy as np
import pytest
import transformers

from flaxlm import models
from flaxlm.errors import UserError
from flaxlm.models.layer_stack import Execution
from parity import assert_initialized_like_transformers, assert_same_params, batch, jnp_args
from test_parity import CASE

NEO = CASE["gpt_neo-global-local"]


def test_windows_follow_attention_types():
    config = NEO.config(num_layers=5, attention_types=[[["global", "local"], 2], [["local"], 1]])
    model = models.create_model(config)
    assert [layer.attn.window for layer in model.layers] == [None, 4, None, 4, 4]


def test_unknown_attention_type_is_refused():
    with pytest.raises(UserError, match="unknown attention type.*'sparse'"):
        models.create_model(NEO.config(attention_types=[[["global", "sparse"], 1]]))


def test_scan_layers():
    """Global / local pairs scan a pair per step, all-global layers a layer per step, with the loop's logits; one
    global and one local layer do not repeat: a one-line error."""
    args = jnp_args(batch(NEO))
    with pytest.raises(UserError, match="--scan_layers needs layers that repeat"):
        models.create_model(NEO.config(), execution=Execution(scan=True))(*args)
    real = np.asarray(args[1]) == 1
    for types in ([[["global"], 2]], [[["global", "local"], 2]]):
        config = NEO.config(attention_types=types, num_layers=2 * len(types[0][0]))
        loop = models.create_model(config, seed=1)(*args)
        scanned = models.create_model(config, seed=1, execution=Execution(scan=True))(*args)
        assert float(jnp.abs(loop - scanned)[real].max()) < 1e-5


def test_initialized_like_transformers():
    config = transformers.GPTNeoConfig(vocab_size=512, hidden_size=64, num_layers=2, num_heads=4,
                                       max_position_embeddings=128, attention_types=[[["global", "local"], 1]],
                                       initializer_range=0.05)
    assert_initialized_like_transformers(config, transformers.GPTNeoForCausalLM,
                                         lambda name: name.endswith(".bias") or ".ln_" in name)


def test_bare_checkpoint_with_old_buffers_loads():
    """A checkpoint without the 'transformer.' prefix (the bare model), with the buffers older transformers saved:
    the same parameters."""
    config = NEO.config()
    tensors = models.to_hf_state_dict(config, models.split_model(models.create_model(config))[1])
    bare = {name.removeprefix("transformer."): x for name, x in tensors.items()}
    bare["h.0.attn.attention.bias"] = np.tril(np.ones((1, 1, 40, 40), bool))
    bare["h.0.attn.attention.masked_bias"] = np.asarray(-1e9, np.float32)
    assert_same_params(models.from_hf_state_dict(config, bare), models.from_hf_state_dict(config, tensors))
