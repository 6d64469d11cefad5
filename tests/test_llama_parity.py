"""Llama against transformers' LlamaForCausalLM, both directions (GQA / MHA / MQA, tied and untied heads, head_dim
!= hidden / heads, biases, linear and llama3 RoPE scaling), the KV-cache path, bf16, dropout and strict loading."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from flaxlm import models
from flaxlm.errors import UserError
from flaxlm.models import llama
from flaxlm.models.llama import inverse_frequencies

# name -> LlamaConfig overrides of BASE
CASES = {
    "gqa-untied": dict(num_key_value_heads=2, tie_word_embeddings=False),
    "mha-tied": dict(num_key_value_heads=4, tie_word_embeddings=True, rms_norm_eps=1e-5),
    "mqa-head_dim-bias": dict(num_key_value_heads=1, head_dim=12, attention_bias=True, mlp_bias=True),
    # an old config.json's top-level rope_theta and rope_scaling (transformers 5 moves them to rope_parameters)
    "rope-linear-legacy": dict(num_key_value_heads=2, rope_theta=500.0, rope_scaling={"type": "linear", "factor": 2.0}),
    # head_dim 16 puts RoPE wavelengths in all three llama3 regimes (kept, smoothly scaled, divided by factor)
    "rope-llama3": dict(num_key_value_heads=2, head_dim=16, tie_word_embeddings=True, rope_parameters={
        "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32}),
}
BASE = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            max_position_embeddings=64, tie_word_embeddings=False, pad_token_id=0)


def tiny_config(case="gqa-untied", **overrides):
    return transformers.LlamaConfig(**{**BASE, **CASES[case], **overrides})


def batch(config, seed=0, length=20):
    """ids, mask, positions (numpy int64): row 1 left-padded by 5, row 2 by 11; positions count real tokens."""
    ids = np.random.default_rng(seed).integers(1, config.vocab_size, (3, length))
    mask = np.ones_like(ids)
    mask[1, :5] = 0
    mask[2, :11] = 0
    ids[mask == 0] = config.pad_token_id
    return ids, mask, np.clip(np.cumsum(mask, axis=1) - 1, 0, None)


def randomize(params, seed=0, std=0.1):
    """Random values everywhere (norm scales too), so every tensor's mapping is exercised."""
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return jax.tree.unflatten(treedef, [x + std * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])


def random_hf(config, seed=0, std=0.1):
    torch.manual_seed(seed)
    hf = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(std * torch.randn_like(p))
    return hf.eval()


def hf_forward(hf, ids, mask, positions, labels=None):
    with torch.no_grad():
        return hf.eval()(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                         position_ids=torch.tensor(positions), labels=None if labels is None else torch.tensor(labels))


def max_err(ours, ref, mask):
    """The largest |difference| at real (unpadded) positions."""
    return float(np.abs(np.asarray(ours) - ref)[mask.astype(bool)].max())


def our_loss(logits_BLV, ids_BL, mask_BL):
    """Mean cross-entropy of logits[:, :-1] against ids[:, 1:] where both positions are real (a padding
    position's logits are arbitrary)."""
    logp = jax.nn.log_softmax(jnp.asarray(logits_BLV)[:, :-1], axis=-1)
    nll = -jnp.take_along_axis(logp, jnp.asarray(ids_BL)[:, 1:, None], axis=-1)[..., 0]
    real = jnp.asarray(mask_BL[:, :-1] * mask_BL[:, 1:])
    return float((nll * real).sum() / real.sum())


def saved_keys(path):
    from safetensors import safe_open
    with safe_open(str(path / "model.safetensors"), framework="np") as f:
        return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}


@pytest.mark.parametrize("case", list(CASES))
def test_hf_to_flaxlm(tmp_path, case):
    config = tiny_config(case)
    hf = random_hf(config)
    hf.save_pretrained(tmp_path)
    loaded_config, model = models.load_pretrained(tmp_path)
    ids, mask, pos = batch(config)
    ours = model(*map(jnp.asarray, (ids, mask, pos)))
    ref = hf_forward(hf, ids, mask, pos).logits.numpy()
    assert ours.dtype == jnp.float32 and ours.shape == ref.shape == (3, 20, config.vocab_size)
    err = max_err(ours, ref, mask)
    print(f"\n[{case}] hf->ours max |logit error| {err:.2e} (max |logit| {np.abs(ref).max():.2f})")
    assert err < 1e-4, err
    assert np.abs(ref).max() > 1.0  # a meaningful comparison, not two near-zero tensors
    # transformers' loss (it shifts the labels itself; -100 at padding and after it) is ours
    labels = np.where(mask * np.pad(mask, ((0, 0), (1, 0)))[:, :-1] == 1, ids, -100)
    theirs = float(hf_forward(hf, ids, mask, pos, labels=labels).loss)
    assert our_loss(ours, ids, mask) == pytest.approx(theirs, abs=1e-5)
    # our names and shapes are the ones transformers writes; RoPE frequencies are its buffers'
    params = models.split_model(model)[1]
    assert {k: v.shape for k, v in models.to_hf_state_dict(loaded_config, params).items()} == saved_keys(tmp_path)
    np.testing.assert_allclose(np.asarray(model.inv_freq, np.float32), hf.model.rotary_emb.inv_freq.numpy(),
                               rtol=2e-7, atol=0)  # torch's float32 pow may differ by an ulp


@pytest.mark.parametrize("case", list(CASES))
def test_flaxlm_to_hf(tmp_path, case):
    config = tiny_config(case)
    tied = config.tie_word_embeddings
    graphdef, params = models.split_model(models.create_model(config, seed=1))
    params = randomize(params, seed=1)
    models.save_pretrained(tmp_path, config, params)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["architectures"] == ["LlamaForCausalLM"] and saved["model_type"] == "llama"
    assert saved["tie_word_embeddings"] == tied  # written either way: Llama's default is False, GPT-2's True
    hf, info = transformers.LlamaForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")), info
    assert (hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()) == tied
    assert models.count_params(params) == sum(p.numel() for p in hf.parameters())
    ids, mask, pos = batch(config, seed=1)
    ours = models.apply_model(graphdef, params, *map(jnp.asarray, (ids, mask, pos)))
    ref = hf_forward(hf, ids, mask, pos).logits.numpy()
    err = max_err(ours, ref, mask)
    print(f"\n[{case}] ours->hf max |logit error| {err:.2e}")
    assert err < 1e-4, err
    assert np.abs(ref).max() > 1.0
    # and back: the same parameters
    _, model = models.load_pretrained(tmp_path)
    jax.tree.map(np.testing.assert_array_equal, models.split_model(model)[1], jax.tree.map(np.asarray, params))


@pytest.mark.parametrize("case", list(CASES))
def test_kv_cache_matches_full_forward(case):
    """Prefill 8 tokens, then decode one at a time (row 2's padding runs into the decode steps): the logits at
    real positions are the full forward's."""
    config = tiny_config(case)
    graphdef, params = models.split_model(models.create_model(config, seed=2))
    params = randomize(params, seed=2)
    ids, mask, pos = map(jnp.asarray, batch(config, seed=2))
    full = models.apply_model(graphdef, params, ids, mask, pos)
    step = jax.jit(lambda p, *a, cache: models.apply_model(graphdef, p, *a, cache=cache))
    cache = models.merge_model(graphdef, params).init_cache(3, 24)
    assert cache["k"][0].shape == (3 * config.num_key_value_heads, config.head_dim, 24)  # [B * K, H, S]
    logits, cache = step(params, ids[:, :8], mask[:, :8], pos[:, :8], cache=cache)
    out = [logits]
    for t in range(8, ids.shape[1]):
        logits, cache = step(params, ids[:, t:t + 1], mask[:, t:t + 1], pos[:, t:t + 1], cache=cache)
        out.append(logits)
    assert int(cache["index"]) == ids.shape[1]
    err = max_err(jnp.concatenate(out, axis=1), np.asarray(full), np.asarray(mask))
    print(f"\n[{case}] kv-cache vs full max |logit error| {err:.2e}")
    assert err < 1e-5, err


def test_names_and_tree_layout():
    config = tiny_config("mqa-head_dim-bias")
    params = models.split_model(models.create_model(config))[1]
    assert set(params) == {"embed", "layers", "final_norm", "lm_head"}
    assert set(params["layers"]["1"]) == {"attn_norm", "attn", "mlp_norm", "mlp"}
    assert set(params["layers"]["1"]["attn"]) == {"q_proj", "k_proj", "v_proj", "o_proj"}
    assert set(params["layers"]["1"]["mlp"]) == {"gate_proj", "up_proj", "down_proj"}
    assert params["layers"]["0"]["attn"]["q_proj"]["kernel"].shape == (32, 48)
    assert params["layers"]["0"]["attn"]["k_proj"]["bias"].shape == (12,)
    assert params["layers"]["0"]["attn"]["o_proj"]["kernel"].shape == (48, 32)
    assert params["lm_head"]["kernel"].shape == (32, 99)
    tied = models.split_model(models.create_model(tiny_config("mha-tied")))[1]
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
    config = tiny_config("gqa-untied")
    params = models.split_model(models.create_model(config))[1]
    tensors = models.to_hf_state_dict(config, params)

    def fails(tensors, pattern, config=config):
        with pytest.raises(UserError, match=pattern) as e:
            models.from_hf_state_dict(config, tensors)
        assert "\n" not in str(e.value)

    missing = dict(tensors)
    del missing["model.layers.1.self_attn.k_proj.weight"]
    fails(missing, r"missing tensor\(s\) model.layers.1.self_attn.k_proj.weight")
    fails({**tensors, "model.layers.2.mlp.up_proj.weight": np.zeros((37, 32), np.float32)},
          r"unexpected tensor\(s\) model.layers.2.mlp.up_proj.weight")
    fails({**tensors, "model.layers.0.self_attn.v_proj.bias": np.zeros(16, np.float32)},
          r"unexpected tensor\(s\) model.layers.0.self_attn.v_proj.bias")
    fails({**tensors, "model.layers.0.self_attn.k_proj.weight": np.zeros((32, 32), np.float32)},
          r"k_proj.weight has shape \(32, 32\) but config.json implies \(16, 32\)")
    # an untied checkpoint under a tied config.json
    tied = tiny_config("gqa-untied", tie_word_embeddings=True)
    fails(tensors, "lm_head.weight differs from model.embed_tokens.weight.*tie_word_embeddings", tied)


def test_old_and_bare_checkpoints_accepted():
    """A bare LlamaModel checkpoint (no 'model.' prefix), the rotary inv_freq buffers older transformers saved and
    a tied copy of the embeddings as lm_head.weight are accepted."""
    config = tiny_config("mha-tied")
    params = models.split_model(models.create_model(config, seed=4))[1]
    tensors = models.to_hf_state_dict(config, params)
    inv_freq = np.zeros(4, np.float32)
    bare = {k.removeprefix("model."): v for k, v in tensors.items()}
    bare.update({"layers.0.self_attn.rotary_emb.inv_freq": inv_freq, "rotary_emb.inv_freq": inv_freq,
                 "lm_head.weight": tensors["model.embed_tokens.weight"]})
    jax.tree.map(np.testing.assert_array_equal, models.from_hf_state_dict(config, bare), jax.tree.map(np.asarray, params))
    torch_sd = {k: v.numpy() for k, v in transformers.LlamaForCausalLM(config).state_dict().items()}
    assert set(models.from_hf_state_dict(config, torch_sd)) == set(params)


def test_config_errors():
    with pytest.raises(UserError, match="rope_type 'dynamic'.*supported: default, linear, llama3"):
        models.create_model(tiny_config(rope_parameters={"rope_type": "dynamic", "factor": 2.0}))
    with pytest.raises(UserError, match="rope_type 'yarn'"):
        models.create_model(tiny_config(rope_scaling={"rope_type": "yarn", "factor": 2.0}))
    with pytest.raises(UserError, match="hidden_act"):
        models.create_model(tiny_config(hidden_act="mish"))
    with pytest.raises(UserError, match="num_key_value_heads 3"):
        models.create_model(tiny_config(num_key_value_heads=3))


def test_rope_frequencies_for_a_transformers4_config_object():
    """A config object with the old attributes (rope_theta, rope_scaling, no rope_parameters) gets the same
    frequencies as transformers 5's conversion."""
    class Old:
        rope_theta, rope_scaling, max_position_embeddings = 500.0, {"type": "linear", "factor": 2.0}, 64
    linear = inverse_frequencies(tiny_config("rope-linear-legacy"), 8)
    np.testing.assert_array_equal(inverse_frequencies(Old(), 8), linear)
    np.testing.assert_array_equal(linear, np.float32(inverse_frequencies(tiny_config(rope_theta=500.0), 8)) / 2)
    # llama3 (wavelengths 2 pi / f against 32 / 4 and 32 / 1): kept, smoothly scaled, divided by factor 8
    f, f0 = (np.float32(inverse_frequencies(c, 16)) for c in (tiny_config("rope-llama3"), tiny_config()))
    assert f[0] == f0[0] and f0[1] / 8 < f[1] < f0[1] and np.allclose(f[2:], f0[2:] / 8, rtol=1e-6)


def test_bfloat16_compute():
    config = tiny_config("gqa-untied")
    graphdef32, params = models.split_model(models.create_model(config))
    params = randomize(params, std=0.05)
    graphdef16, params16 = models.split_model(models.create_model(config, dtype="bfloat16"))
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params16))
    args = tuple(map(jnp.asarray, batch(config)))
    ref = models.apply_model(graphdef32, params, *args)
    got = models.apply_model(graphdef16, params, *args)
    assert got.dtype == jnp.float32 and bool(jnp.isfinite(got).all())
    mask = np.asarray(args[1]).astype(bool)
    err = max_err(got, np.asarray(ref), mask)
    print(f"\n[bf16] max |logit error| vs fp32 {err:.2e} (max |logit| {float(jnp.abs(ref).max()):.2f})")
    assert err < 0.05 * float(jnp.abs(ref).max()) + 0.05
    assert models.merge_model(graphdef16, params).init_cache(3, 8)["k"][0].dtype == jnp.bfloat16


def test_attention_dropout_and_grad():
    config = tiny_config("gqa-untied", attention_dropout=0.1)
    graphdef, params = models.split_model(models.create_model(config))
    ids, mask, pos = map(jnp.asarray, batch(config))
    train = jax.jit(lambda p, key: models.apply_model(graphdef, p, ids, mask, pos, dropout_key=key))
    det = models.apply_model(graphdef, params, ids, mask, pos)
    a, b, c = (train(params, jax.random.key(k)) for k in (1, 1, 2))
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, det) and not np.allclose(a, c)

    def loss(p, key):
        logits = models.apply_model(graphdef, p, ids, mask, pos, dropout_key=key)
        logp = jax.nn.log_softmax(logits[:, :-1])
        nll = -jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1)[..., 0]
        return (nll * mask[:, 1:]).sum() / mask[:, 1:].sum()

    grads = jax.jit(jax.grad(loss))(params, jax.random.key(0))
    assert jax.tree.structure(grads) == jax.tree.structure(params)
    assert all(bool(jnp.isfinite(x).all()) and float(jnp.abs(x).sum()) > 0 for x in jax.tree.leaves(grads))
