"""OPT against transformers' OPTForCausalLM, both directions (pre-LN, post-LN with project_in/out, bias-free and
non-affine with an untied head), plus the KV cache, strict loading, bf16, dropout and initialization."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from flaxlm import models
from flaxlm.errors import UserError
from flaxlm.models import opt

CASES = {
    "pre_ln": dict(),  # opt-125m-like
    "post_ln_projected": dict(do_layer_norm_before=False, word_embed_proj_dim=16),  # opt-350m-like
    "bias_free_untied": dict(enable_bias=False, layer_norm_elementwise_affine=False, tie_word_embeddings=False),
    "projected_no_final_norm": dict(word_embed_proj_dim=24, _remove_final_layer_norm=True),
}


def tiny_config(case="pre_ln", **overrides):
    kw = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, ffn_dim=37,
              max_position_embeddings=40, dropout=0.1, attention_dropout=0.1, pad_token_id=1)
    return transformers.OPTConfig(**{**kw, **CASES[case], **overrides})


def batch(config, seed=0, pad=3):
    """ids, mask (numpy int64) [2, 12]: row 1 left-padded by `pad`; positions 0-based at the real tokens."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, config.vocab_size, (2, 12))
    mask = np.ones_like(ids)
    mask[1, :pad] = 0
    ids[1, :pad] = config.pad_token_id
    return ids, mask


def positions(mask):
    return np.clip(np.cumsum(mask, axis=1) - 1, 0, None)


def randomize(params, seed=0, std=0.2):
    """Random values everywhere (norm scales, biases, the pad row too), so every tensor's mapping is exercised."""
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return jax.tree.unflatten(treedef, [x + std * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])


def random_hf(config, seed=0, std=0.2):
    torch.manual_seed(seed)
    hf = transformers.OPTForCausalLM(config)
    assert (hf.lm_head.weight is hf.model.decoder.embed_tokens.weight) == config.tie_word_embeddings
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(std * torch.randn_like(p))
    return hf.eval()


def hf_logits(hf, ids, mask):
    with torch.no_grad():
        return hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()


def ours(model_or_fn, ids, mask):
    return np.asarray(model_or_fn(jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(positions(mask))))


def max_err_at_real(a, b, mask):
    real = mask.astype(bool)
    assert np.isfinite(a[real]).all() and np.isfinite(b[real]).all()
    return float(np.abs(a - b)[real].max())


def check_loss(model_fn, hf, config):
    """transformers' loss with labels = ids (it shifts them itself) is our mean token cross-entropy."""
    ids = np.random.default_rng(5).integers(3, config.vocab_size, (2, 12))
    mask = np.ones_like(ids)
    with torch.no_grad():
        theirs = float(hf(input_ids=torch.tensor(ids), labels=torch.tensor(ids)).loss)
    logits = jnp.asarray(ours(model_fn, ids, mask))
    logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    mine = float(-jnp.take_along_axis(logp, jnp.asarray(ids[:, 1:])[..., None], axis=-1).mean())
    assert mine == pytest.approx(theirs, abs=1e-5)


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
    ids, mask = batch(config)
    got, ref = ours(model, ids, mask), hf_logits(hf, ids, mask)
    assert got.dtype == np.float32 and got.shape == ref.shape == (2, 12, config.vocab_size)
    err = max_err_at_real(got, ref, mask)
    assert err < 1e-4, err
    assert np.abs(ref).max() > 1.0  # a meaningful comparison, not two near-zero tensors
    check_loss(model, hf, config)
    # our names are the ones transformers writes
    params = models.split_model(model)[1]
    assert {k: v.shape for k, v in models.to_hf_state_dict(loaded_config, params).items()} == saved_keys(tmp_path)


@pytest.mark.parametrize("case", list(CASES))
def test_flaxlm_to_hf(tmp_path, case):
    config = tiny_config(case)
    graphdef, params = models.split_model(models.create_model(config, seed=1))
    params = randomize(params, seed=1)
    models.save_pretrained(tmp_path, config, params)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["architectures"] == ["OPTForCausalLM"] and saved["model_type"] == "opt"
    assert saved.get("tie_word_embeddings", True) == config.tie_word_embeddings
    hf, info = transformers.OPTForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")), info
    assert (hf.lm_head.weight.data_ptr() == hf.model.decoder.embed_tokens.weight.data_ptr()) == \
        config.tie_word_embeddings
    assert models.count_params(params) == sum(p.numel() for p in hf.parameters())
    apply = lambda *a: models.apply_model(graphdef, params, *a)  # noqa: E731
    ids, mask = batch(config, seed=1)
    err = max_err_at_real(ours(apply, ids, mask), hf_logits(hf.eval(), ids, mask), mask)
    assert err < 1e-4, err
    check_loss(apply, hf, config)
    # and back: the same parameters
    _, model = models.load_pretrained(tmp_path)
    jax.tree.map(np.testing.assert_array_equal, models.split_model(model)[1], jax.tree.map(np.asarray, params))


def test_hf_positions_with_left_padding():
    """transformers derives positions from the mask (cumsum * mask - 1: padding gets -1, table row 1): at the
    real tokens these are our clip(cumsum - 1, 0), so passing them explicitly changes nothing there."""
    config = tiny_config("pre_ln")
    hf = random_hf(config)
    ids, mask = batch(config, pad=5)
    with torch.no_grad():
        explicit = hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                      position_ids=torch.tensor(positions(mask))).logits.numpy()
    assert max_err_at_real(explicit, hf_logits(hf, ids, mask), mask) < 1e-6


@pytest.mark.parametrize("case", ["pre_ln", "post_ln_projected", "bias_free_untied"])
def test_kv_cache_matches_full_forward(case):
    config = tiny_config(case)
    graphdef, params = models.split_model(models.create_model(config, seed=2))
    model = models.merge_model(graphdef, randomize(params, seed=2))
    ids, mask = batch(config, seed=2, pad=4)
    pos = positions(mask)
    full = ours(model, ids, mask)
    step = jax.jit(lambda m, ids, mask, pos, cache: m(ids, mask, pos, cache=cache))
    cache = model.init_cache(2, ids.shape[1] + 2)
    prefill = 6
    first, cache = step(model, *(jnp.asarray(a[:, :prefill]) for a in (ids, mask, pos)), cache)
    pieces = [np.asarray(first)]
    for t in range(prefill, ids.shape[1]):
        out, cache = step(model, *(jnp.asarray(a[:, t:t + 1]) for a in (ids, mask, pos)), cache)
        pieces.append(np.asarray(out))
    assert int(cache["index"]) == ids.shape[1]
    err = max_err_at_real(np.concatenate(pieces, axis=1), full, mask)
    assert err < 1e-5, err


def test_greedy_generation_matches_hf(tmp_path):
    """flaxlm.models.generation (left-padded prompts, KV cache) picks transformers' greedy tokens (no EOS stop)."""
    from flaxlm.models.generation import generate
    config = tiny_config("post_ln_projected", eos_token_id=None)
    hf = random_hf(config, seed=3)
    hf.save_pretrained(tmp_path)
    _, model = models.load_pretrained(tmp_path)
    prompts = [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14]]
    got = generate(model, prompts, max_new_tokens=6, pad_token_id=config.pad_token_id).tokens
    ids = np.array([prompts[0], [config.pad_token_id] * 4 + prompts[1]])  # left-padded, as generate() pads
    mask = (ids != config.pad_token_id).astype(np.int64)
    with torch.no_grad():
        ref = hf.generate(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), max_new_tokens=6,
                          do_sample=False, pad_token_id=config.pad_token_id)[:, 7:].tolist()
    assert got == ref and len(set(got[0] + got[1])) > 1  # not a degenerate repeat of one token


def test_names_and_tree_layout():
    params = models.split_model(models.create_model(tiny_config("post_ln_projected")))[1]
    assert set(params) == {"embed", "position", "project_in", "project_out", "layers"}  # post-LN: no final norm
    assert set(params["layers"]["1"]) == {"attn_norm", "attn", "mlp_norm", "fc_in", "fc_out"}
    assert params["embed"]["embedding"].shape == (99, 16)
    assert params["position"]["embedding"].shape == (42, 32)  # max_position_embeddings + 2
    assert params["project_in"] == {"kernel": params["project_in"]["kernel"]}  # bias-free
    assert params["project_in"]["kernel"].shape == (16, 32) and params["project_out"]["kernel"].shape == (32, 16)
    bare = models.split_model(models.create_model(tiny_config("bias_free_untied")))[1]
    assert set(bare) == {"embed", "position", "layers", "lm_head"}  # non-affine final norm: no tensors
    assert set(bare["layers"]["0"]) == {"attn", "fc_in", "fc_out"}
    assert set(bare["layers"]["0"]["attn"]["q"]) == {"kernel"}
    for case in CASES:
        config = tiny_config(case)
        params = models.split_model(models.create_model(config))[1]
        names = [hf for hf, _, _ in opt.tensor_names(config)]
        assert len(names) == len(set(names)) == len(jax.tree.leaves(params))
        assert models.create_model(config).max_positions == 40


def test_strict_loading_and_bare_checkpoints():
    config = tiny_config("pre_ln")
    params = models.split_model(models.create_model(config))[1]
    tensors = models.to_hf_state_dict(config, params)

    def fails(tensors, pattern, config=config):
        with pytest.raises(UserError, match=pattern) as e:
            models.from_hf_state_dict(config, tensors)
        assert "\n" not in str(e.value)

    missing = dict(tensors)
    del missing["model.decoder.layers.1.fc2.bias"]
    fails(missing, r"missing tensor\(s\) model.decoder.layers.1.fc2.bias.*2 layers")
    fails({**tensors, "model.decoder.layers.2.fc1.weight": np.zeros((37, 32), np.float32)},
          r"unexpected tensor\(s\) model.decoder.layers.2.fc1.weight")
    fails({**tensors, "model.decoder.embed_positions.weight": np.zeros((40, 32), np.float32)},
          r"model.decoder.embed_positions.weight has shape \(40, 32\) but config.json implies \(42, 32\)")
    fails({**tensors, "lm_head.weight": tensors["model.decoder.embed_tokens.weight"] + 1},
          "lm_head.weight differs from model.decoder.embed_tokens.weight.*tie_word_embeddings")
    # a post-LN checkpoint has no final norm
    fails(tensors, r"unexpected tensor\(s\) model.decoder.final_layer_norm",
          tiny_config("pre_ln", do_layer_norm_before=False))
    # a bare OPTModel checkpoint ('decoder.' names) with a tied lm_head copy: accepted, the same parameters
    bare = {k.removeprefix("model."): v for k, v in tensors.items()}
    bare["lm_head.weight"] = tensors["model.decoder.embed_tokens.weight"]
    jax.tree.map(np.testing.assert_array_equal, models.from_hf_state_dict(config, bare),
                 jax.tree.map(np.asarray, params))


def test_bfloat16_compute():
    config = tiny_config("post_ln_projected")
    graphdef32, params = models.split_model(models.create_model(config))
    params = randomize(params, std=0.05)
    graphdef16, params16 = models.split_model(models.create_model(config, dtype="bfloat16"))
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params16))
    ids, mask = batch(config)
    ref = ours(lambda *a: models.apply_model(graphdef32, params, *a), ids, mask)
    got = ours(lambda *a: models.apply_model(graphdef16, params, *a), ids, mask)
    assert got.dtype == np.float32 and np.isfinite(got).all()
    assert np.abs(got - ref).max() < 0.05 * np.abs(ref).max() + 0.05
    cache = models.merge_model(graphdef16, params).init_cache(2, 12)
    assert cache["k"][0].dtype == jnp.bfloat16


def test_dropout_key():
    config = tiny_config("pre_ln")
    graphdef, params = models.split_model(models.create_model(config))
    params = randomize(params)
    args = tuple(map(jnp.asarray, batch(config)))
    train = jax.jit(lambda p, key: models.apply_model(graphdef, p, *args, dropout_key=key))
    det = models.apply_model(graphdef, params, *args)
    a, b, c = (train(params, jax.random.key(k)) for k in (1, 1, 2))
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, det) and not np.allclose(a, c)
    # attention dropout alone changes the output too
    graphdef_attn, _ = models.split_model(models.create_model(tiny_config("pre_ln", dropout=0.0)))
    attn_only = models.apply_model(graphdef_attn, params, *args, dropout_key=jax.random.key(1))
    assert not np.allclose(attn_only, det)


def test_initialization_like_hf():
    """Normal(init_std) weights with the pad row zeroed, zero biases, unit norms: Hugging Face's _init_weights."""
    config = transformers.OPTConfig(vocab_size=512, hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                                    ffn_dim=192, max_position_embeddings=256, word_embed_proj_dim=48, init_std=0.05)
    params = models.to_hf_state_dict(config, models.split_model(models.create_model(config))[1])
    torch.manual_seed(0)
    ref = {k: v.numpy() for k, v in transformers.OPTForCausalLM(config).state_dict().items()}
    assert set(params) <= set(ref)
    assert not params["model.decoder.embed_tokens.weight"][config.pad_token_id].any()
    for name, x in params.items():
        if name.endswith(".bias") or "layer_norm" in name:
            np.testing.assert_array_equal(x, ref[name])
        else:
            assert abs(x.mean()) < 0.2 * ref[name].std() + 1e-3, name
            assert x.std() == pytest.approx(ref[name].std(), rel=0.2), name


def test_create_model_errors():
    with pytest.raises(UserError, match="hidden_size 30 is not a multiple of num_attention_heads 4"):
        models.create_model(tiny_config(hidden_size=30))
    with pytest.raises(UserError, match="hidden_act|activation"):
        models.create_model(tiny_config(activation_function="mish"))
    with pytest.raises(UserError, match="layerdrop"):
        models.create_model(tiny_config(layerdrop=0.1))
    assert "opt" in models.CAUSAL_LM_TYPES
