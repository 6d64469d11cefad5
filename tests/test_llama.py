"""Llama: what the parity checks of every family (tests/test_parity.py) do not cover: RoPE frequencies (linear and
llama3 scaling, old config objects), the KV cache's key/value heads, the parameter tree, strictness on its names,
old and bare checkpoints, config errors and gradients through attention dropout."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import transformers

from flaxlm import models
from flaxlm.errors import UserError
from flaxlm.models import llama
from flaxlm.models.rope import rope_of
from parity import assert_load_fails, assert_same_params, batch, jnp_args
from test_parity import CASE, CASES, LLAMA as LLAMA_FIELDS, family

LLAMA = CASE["llama-gqa-untied"]
ROPE_CASES = {c.name: c for c in family(transformers.LlamaForCausalLM, "causal", LLAMA_FIELDS, {
    # an old config.json's top-level rope_theta and rope_scaling (transformers 5 moves them to rope_parameters)
    "rope-linear-legacy": dict(num_key_value_heads=2, rope_theta=500.0,
                               rope_scaling={"type": "linear", "factor": 2.0}),
    # head_dim 16 puts RoPE wavelengths in all three llama3 regimes (kept, smoothly scaled, divided by factor)
    "rope-llama3": dict(num_key_value_heads=2, head_dim=16, tie_word_embeddings=True, rope_parameters={
        "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 32})})}
LLAMA_CASES = [c for c in CASES if c.model_type == "llama"] + list(ROPE_CASES.values())


@pytest.mark.parametrize("case", LLAMA_CASES, ids=str)
def test_rope_frequencies_are_transformers_buffers(case, tmp_path):
    hf = case.hf_class(case.config())
    hf.config.save_pretrained(tmp_path)
    model = models.create_model(models.load_config(tmp_path))
    np.testing.assert_allclose(np.asarray(model.rope.inv_freq, np.float32), hf.model.rotary_emb.inv_freq.numpy(),
                               rtol=2e-7, atol=0)  # torch's float32 pow may differ by an ulp


@pytest.mark.parametrize("case", LLAMA_CASES, ids=str)
def test_kv_cache_holds_the_key_value_heads(case):
    config = case.config()
    cache = models.create_model(config).init_cache(3, 24)
    assert cache["k"][0].shape == (3 * config.num_key_value_heads, config.head_dim, 24)  # [B * K, H, S]


def test_names_and_tree_layout():
    config = CASE["llama-mqa-head_dim-bias"].config()
    params = models.split_model(models.create_model(config))[1]
    assert set(params) == {"embed", "layers", "final_norm", "lm_head"}
    assert set(params["layers"]["1"]) == {"attn_norm", "attn", "mlp_norm", "mlp"}
    assert set(params["layers"]["1"]["attn"]) == {"q_proj", "k_proj", "v_proj", "o_proj"}
    assert set(params["layers"]["1"]["mlp"]) == {"gate_proj", "up_proj", "down_proj"}
    assert params["layers"]["0"]["attn"]["q_proj"]["kernel"].shape == (32, 48)
    assert params["layers"]["0"]["attn"]["k_proj"]["bias"].shape == (12,)
    assert params["layers"]["0"]["attn"]["o_proj"]["kernel"].shape == (48, 32)
    assert params["lm_head"]["kernel"].shape == (32, 99)
    tied = models.split_model(models.create_model(CASE["llama-mha-tied"].config()))[1]
    assert "lm_head" not in tied and "bias" not in tied["layers"]["0"]["mlp"]["up_proj"]
    names = [hf for hf, _, _ in llama.tensor_names(config)]
    assert len(names) == len(set(names)) == len(jax.tree.leaves(params))
    # initialization like Hugging Face's: normal(initializer_range), zero biases, unit norms; norms not decayed
    assert float(params["layers"]["0"]["mlp"]["gate_proj"]["kernel"].std()) == pytest.approx(0.02, rel=0.2)
    assert float(jnp.abs(params["layers"]["0"]["attn"]["q_proj"]["bias"]).max()) == 0.0
    np.testing.assert_array_equal(params["final_norm"]["scale"], np.ones(32, np.float32))
    decay = models.decay_mask(params)
    assert not decay["layers"]["0"]["attn_norm"]["scale"] and decay["embed"]["embedding"]
    assert "llama" in models.CAUSAL_LM_TYPES


def test_strict_loading():
    config = LLAMA.config()
    tensors = models.to_hf_state_dict(config, models.split_model(models.create_model(config))[1])

    missing = dict(tensors)
    del missing["model.layers.1.self_attn.k_proj.weight"]
    assert_load_fails(config, missing, r"missing tensor\(s\) model.layers.1.self_attn.k_proj.weight")
    assert_load_fails(config, {**tensors, "model.layers.2.mlp.up_proj.weight": np.zeros((37, 32), np.float32)},
                      r"unexpected tensor\(s\) model.layers.2.mlp.up_proj.weight")
    assert_load_fails(config, {**tensors, "model.layers.0.self_attn.v_proj.bias": np.zeros(16, np.float32)},
                      r"unexpected tensor\(s\) model.layers.0.self_attn.v_proj.bias")
    assert_load_fails(config, {**tensors, "model.layers.0.self_attn.k_proj.weight": np.zeros((32, 32), np.float32)},
                      r"k_proj.weight has shape \(32, 32\) but config.json implies \(16, 32\)")
    # an untied checkpoint under a tied config.json
    assert_load_fails(LLAMA.config(tie_word_embeddings=True), tensors,
                      "lm_head.weight differs from model.embed_tokens.weight.*tie_word_embeddings")


def test_old_and_bare_checkpoints_accepted():
    """A bare LlamaModel checkpoint (no 'model.' prefix), the rotary inv_freq buffers older transformers saved and
    a tied copy of the embeddings as lm_head.weight are accepted."""
    config = CASE["llama-mha-tied"].config()
    params = models.split_model(models.create_model(config, seed=4))[1]
    tensors = models.to_hf_state_dict(config, params)
    inv_freq = np.zeros(4, np.float32)
    bare = {k.removeprefix("model."): v for k, v in tensors.items()}
    bare.update({"layers.0.self_attn.rotary_emb.inv_freq": inv_freq, "rotary_emb.inv_freq": inv_freq,
                 "lm_head.weight": tensors["model.embed_tokens.weight"]})
    assert_same_params(models.from_hf_state_dict(config, bare), params)
    torch_sd = {k: v.numpy() for k, v in transformers.LlamaForCausalLM(config).state_dict().items()}
    assert set(models.from_hf_state_dict(config, torch_sd)) == set(params)


def test_config_errors():
    with pytest.raises(UserError, match="rope_type 'proportional'.*supported: default, linear, dynamic, yarn"):
        models.create_model(LLAMA.config(rope_parameters={"rope_type": "proportional", "rope_theta": 1e4}))
    with pytest.raises(UserError, match="hidden_act"):
        models.create_model(LLAMA.config(hidden_act="mish"))
    with pytest.raises(UserError, match="num_key_value_heads 3"):
        models.create_model(LLAMA.config(num_key_value_heads=3))


def test_rope_frequencies_for_a_transformers4_config_object():
    """A config object with the old attributes (rope_theta, rope_scaling, no rope_parameters) gets the same
    frequencies as transformers 5's conversion."""
    class Old:
        rope_theta, rope_scaling, max_position_embeddings = 500.0, {"type": "linear", "factor": 2.0}, 64
    linear = rope_of(ROPE_CASES["rope-linear-legacy"].config(), 8).inv_freq
    np.testing.assert_array_equal(rope_of(Old(), 8).inv_freq, linear)
    np.testing.assert_array_equal(linear, np.float32(rope_of(LLAMA.config(rope_theta=500.0), 8).inv_freq) / 2)
    # llama3 (wavelengths 2 pi / f against 32 / 4 and 32 / 1): kept, smoothly scaled, divided by factor 8
    f, f0 = (np.float32(rope_of(c, 16).inv_freq) for c in (ROPE_CASES["rope-llama3"].config(), LLAMA.config()))
    assert f[0] == f0[0] and f0[1] / 8 < f[1] < f0[1] and np.allclose(f[2:], f0[2:] / 8, rtol=1e-6)


def test_grad_with_attention_dropout():
    graphdef, params = models.split_model(models.create_model(LLAMA.config(attention_dropout=0.1)))
    ids, mask, pos = jnp_args(batch(LLAMA))

    def loss(p, key):
        logits = models.apply_model(graphdef, p, ids, mask, pos, dropout_key=key)
        logp = jax.nn.log_softmax(logits[:, :-1])
        nll = -jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1)[..., 0]
        return (nll * mask[:, 1:]).sum() / mask[:, 1:].sum()

    grads = jax.jit(jax.grad(loss))(params, jax.random.key(0))
    assert jax.tree.structure(grads) == jax.tree.structure(params)
    assert all(bool(jnp.isfinite(x).all()) and float(jnp.abs(x).sum()) > 0 for x in jax.tree.leaves(grads))
