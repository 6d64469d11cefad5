"""Mixtral beyond the parity table (tests/test_parity.py: logits, loss, exports both ways, strict loading, bfloat16,
the KV cache, greedy generation) and tests/test_moe.py (router logits and choices, the load-balancing loss and every
gradient, fused checkpoints): the hub's per-expert layout as Mistral defines it (w1 gate, w3 up, w2 down), the router
jitter in training as transformers computes it, and config errors that name their field."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from safetensors.numpy import save_file

from flaxlm import models
from flaxlm.errors import UserError
from flaxlm.models import mixtral
from parity import random_hf
from test_parity import CASE

BASE = CASE["mixtral-window4-untied"]


def ids(config, seed=0, shape=(2, 12)):
    return np.random.default_rng(seed).integers(3, config.vocab_size, shape)


def test_hub_layout_is_mistrals_w1_gate_w3_up_w2_down(tmp_path):
    """A checkpoint written by hand in the hub's layout from transformers' fused experts (expert e is
    w2 @ (silu(w1 @ x) * (w3 @ x)), Mistral's reference FeedForward) loads to transformers' logits, and our export
    writes exactly those tensors."""
    hf = random_hf(BASE)
    I = hf.config.intermediate_size
    hub = {}
    for name, x in hf.state_dict().items():
        x = x.numpy()
        moe = name.replace(".mlp.", ".block_sparse_moe.")
        if name.endswith("mlp.experts.gate_up_proj"):
            for e in range(x.shape[0]):
                hub[moe.replace("gate_up_proj", f"{e}.w1.weight")] = np.ascontiguousarray(x[e, :I])
                hub[moe.replace("gate_up_proj", f"{e}.w3.weight")] = np.ascontiguousarray(x[e, I:])
        elif name.endswith("mlp.experts.down_proj"):
            for e in range(x.shape[0]):
                hub[moe.replace("down_proj", f"{e}.w2.weight")] = np.ascontiguousarray(x[e])
        else:
            hub[moe] = x
    assert "model.layers.1.block_sparse_moe.gate.weight" in hub
    hf.config.save_pretrained(tmp_path)
    save_file(hub, str(tmp_path / "model.safetensors"))
    config, model = models.load_pretrained(tmp_path)
    x = ids(config)
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor(x)).logits.numpy()
    np.testing.assert_allclose(np.asarray(model(jnp.asarray(x))), ref, atol=1e-4)
    written = models.to_hf_state_dict(config, models.split_model(model)[1])
    assert set(written) == set(hub)
    for name, x in hub.items():
        np.testing.assert_array_equal(written[name], x, err_msg=name)


def test_router_jitter_in_training_is_transformers(tmp_path, monkeypatch):
    """router_jitter_noise 0.5: with a dropout key (training) each layer's experts see their input times noise from
    [0.5, 1.5]; transformers in train mode, its uniform_ draws replaced by ours, computes our logits; without a key
    (evaluation, generation) there is no jitter, as in transformers' eval mode."""
    case = dataclasses.replace(BASE, fields={**BASE.fields, "router_jitter_noise": 0.5, "attention_dropout": 0.0})
    hf = random_hf(case)
    hf.save_pretrained(tmp_path)
    config, model = models.load_pretrained(tmp_path)
    x = ids(config)
    drawn, draw = [], mixtral.jitter_noise

    def recording(*args):
        drawn.append(np.asarray(draw(*args)))
        return draw(*args)

    monkeypatch.setattr(mixtral, "jitter_noise", recording)
    jittered = np.asarray(model(jnp.asarray(x), dropout_key=jax.random.key(3)))
    plain = np.asarray(model(jnp.asarray(x)))
    assert len(drawn) == config.num_hidden_layers
    assert all(n.shape == (x.size, config.hidden_size) and 0.5 <= n.min() and n.max() <= 1.5 for n in drawn)
    assert np.abs(jittered - plain).max() > 1e-2  # the noise shows in the logits

    replay = iter(drawn)

    def uniform_(tensor, low, high):  # transformers' torch.empty_like(h).uniform_(1 - j, 1 + j), one per layer
        assert (low, high) == (0.5, 1.5)
        with torch.no_grad():
            return tensor.copy_(torch.tensor(next(replay)).reshape(tensor.shape))

    monkeypatch.setattr(torch.Tensor, "uniform_", uniform_)
    with torch.no_grad():
        ref_train = hf.train()(input_ids=torch.tensor(x)).logits.numpy()
        ref_eval = hf.eval()(input_ids=torch.tensor(x)).logits.numpy()
    assert next(replay, None) is None  # one draw per layer on both sides
    np.testing.assert_allclose(jittered, ref_train, atol=1e-4)
    np.testing.assert_allclose(plain, ref_eval, atol=1e-4)


@pytest.mark.parametrize("fields, message", [
    (dict(num_experts_per_tok=5), "num_experts_per_tok 5 must be between 1 and num_local_experts 4"),
    (dict(num_local_experts=0), "num_experts_per_tok 2 must be between 1 and num_local_experts 0"),
    (dict(router_jitter_noise=-0.1), "router_jitter_noise -0.1 must be 0 or more"),
    (dict(sliding_window=0), "sliding_window 0 must be a positive integer or null"),
])
def test_config_errors_name_the_field(fields, message):
    with pytest.raises(UserError, match=message):
        models.create_model(BASE.config(**fields))
