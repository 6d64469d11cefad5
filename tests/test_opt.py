"""OPT: what the parity checks of every family (tests/test_parity.py) do not cover: transformers' positions from
the mask, the parameter tree (post-LN without a final norm, project_in/out, bias-free and non-affine), strictness
on its names and bare checkpoints, attention dropout and the initialization."""
import jax
import numpy as np
import pytest
import transformers

from flaxlm import models
from flaxlm.errors import UserError
from flaxlm.models import opt
from parity import (assert_initialized_like_transformers, assert_load_fails, assert_same_params, batch, hf_logits,
                    jnp_args, random_hf, randomize)
from test_parity import CASE, CASES

OPT = CASE["opt-pre_ln"]
OPT_CASES = [c for c in CASES if c.model_type == "opt"]


def test_hf_positions_with_left_padding():
    """transformers derives positions from the mask (cumsum * mask - 1: padding gets -1, table row 1): at the
    real tokens these are our clip(cumsum - 1, 0), so passing them explicitly changes nothing there."""
    hf = random_hf(OPT)
    b = batch(OPT)
    explicit = hf_logits(hf, b.hf)
    derived = hf_logits(hf, {k: v for k, v in b.hf.items() if k != "position_ids"})
    real = b.real_BL
    assert np.isfinite(explicit[real]).all() and np.isfinite(derived[real]).all()
    assert np.abs(explicit - derived)[real].max() < 1e-6


def test_names_and_tree_layout():
    params = models.split_model(models.create_model(CASE["opt-post_ln_projected"].config()))[1]
    assert set(params) == {"embed", "position", "project_in", "project_out", "layers"}  # post-LN: no final norm
    assert set(params["layers"]["1"]) == {"attn_norm", "attn", "mlp_norm", "fc_in", "fc_out"}
    assert params["embed"]["embedding"].shape == (99, 16)
    assert params["position"]["embedding"].shape == (42, 32)  # max_position_embeddings + 2
    assert params["project_in"] == {"kernel": params["project_in"]["kernel"]}  # bias-free
    assert params["project_in"]["kernel"].shape == (16, 32) and params["project_out"]["kernel"].shape == (32, 16)
    bare = models.split_model(models.create_model(CASE["opt-bias_free_untied"].config()))[1]
    assert set(bare) == {"embed", "position", "layers", "lm_head"}  # non-affine final norm: no tensors
    assert set(bare["layers"]["0"]) == {"attn", "fc_in", "fc_out"}
    assert set(bare["layers"]["0"]["attn"]["q"]) == {"kernel"}
    for case in OPT_CASES:
        config = case.config()
        params = models.split_model(models.create_model(config))[1]
        names = [hf for hf, _, _ in opt.tensor_names(config)]
        assert len(names) == len(set(names)) == len(jax.tree.leaves(params))
        assert models.create_model(config).max_positions == 40


def test_strict_loading_and_bare_checkpoints():
    config = OPT.config()
    params = models.split_model(models.create_model(config))[1]
    tensors = models.to_hf_state_dict(config, params)

    missing = dict(tensors)
    del missing["model.decoder.layers.1.fc2.bias"]
    assert_load_fails(config, missing, r"missing tensor\(s\) model.decoder.layers.1.fc2.bias.*2 layers")
    assert_load_fails(config, {**tensors, "model.decoder.layers.2.fc1.weight": np.zeros((37, 32), np.float32)},
                      r"unexpected tensor\(s\) model.decoder.layers.2.fc1.weight")
    assert_load_fails(config, {**tensors, "model.decoder.embed_positions.weight": np.zeros((40, 32), np.float32)},
                      r"model.decoder.embed_positions.weight has shape \(40, 32\) but config.json implies \(42, 32\)")
    assert_load_fails(config, {**tensors, "lm_head.weight": tensors["model.decoder.embed_tokens.weight"] + 1},
                      "lm_head.weight differs from model.decoder.embed_tokens.weight.*tie_word_embeddings")
    # a post-LN checkpoint has no final norm
    assert_load_fails(OPT.config(do_layer_norm_before=False), tensors,
                      r"unexpected tensor\(s\) model.decoder.final_layer_norm")
    # a bare OPTModel checkpoint ('decoder.' names) with a tied lm_head copy: accepted, the same parameters
    bare = {k.removeprefix("model."): v for k, v in tensors.items()}
    bare["lm_head.weight"] = tensors["model.decoder.embed_tokens.weight"]
    assert_same_params(models.from_hf_state_dict(config, bare), params)


def test_attention_dropout_alone_acts():
    graphdef, params = models.split_model(models.create_model(OPT.config()))
    params = randomize(params, std=OPT.std)
    args = jnp_args(batch(OPT))
    det = models.apply_model(graphdef, params, *args)
    graphdef_attn, _ = models.split_model(models.create_model(OPT.config(dropout=0.0)))
    attn_only = models.apply_model(graphdef_attn, params, *args, dropout_key=jax.random.key(1))
    assert not np.allclose(attn_only, det)


def test_initialization_like_hf():
    """Normal(init_std) weights with the pad row zeroed, zero biases, unit norms: Hugging Face's _init_weights."""
    config = transformers.OPTConfig(vocab_size=512, hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                                    ffn_dim=192, max_position_embeddings=256, word_embed_proj_dim=48, init_std=0.05)
    params = assert_initialized_like_transformers(config, transformers.OPTForCausalLM,
                                                  lambda name: name.endswith(".bias") or "layer_norm" in name)
    assert not params["model.decoder.embed_tokens.weight"][config.pad_token_id].any()


def test_create_model_errors():
    with pytest.raises(UserError, match="hidden_size 30 is not a multiple of num_attention_heads 4"):
        models.create_model(OPT.config(hidden_size=30))
    with pytest.raises(UserError, match="hidden_act|activation"):
        models.create_model(OPT.config(activation_function="mish"))
    with pytest.raises(UserError, match="layerdrop"):
        models.create_model(OPT.config(layerdrop=0.1))
    assert "opt" in models.CAUSAL_LM_TYPES
