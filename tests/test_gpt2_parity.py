"""GPT-2 against transformers' GPT2LMHeadModel (PyTorch), both directions, plus the KV-cache path, the
checkpoint conventions the hub uses (bare GPT2Model names, causal-mask buffers), strictness and the loss."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import save_file

from flaxlm import models
from flaxlm.errors import UserError

CASES = {
    "tied": {},
    "untied": {"tie_word_embeddings": False},
    "inverse-layer-scale-gelu": {"scale_attn_by_inverse_layer_idx": True, "activation_function": "gelu"},
}


def tiny_config(case="tied"):
    kw = dict(vocab_size=99, n_embd=32, n_layer=2, n_head=4, n_inner=37, n_positions=40, bos_token_id=1,
              eos_token_id=2, pad_token_id=0, resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1)
    return transformers.GPT2Config(**{**kw, **CASES[case]})


def batch(seed=0):
    """ids [2, 17] with row 1 left-padded by 5 tokens, its mask and positions counted from the first real token."""
    ids = np.random.default_rng(seed).integers(3, 99, (2, 17))
    mask = np.ones_like(ids)
    mask[1, :5] = 0
    ids[1, :5] = 0
    return ids, mask, np.clip(mask.cumsum(-1) - 1, 0, None)


def random_hf(config, seed=0, std=0.1):
    torch.manual_seed(seed)
    hf = transformers.GPT2LMHeadModel(config)
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(std * torch.randn_like(p))
    return hf.eval()


def randomize(params, seed=0, std=0.1):
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return jax.tree.unflatten(treedef, [x + std * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])


def hf_logits(hf, ids, mask, pos):
    with torch.no_grad():
        return hf(torch.tensor(ids), attention_mask=torch.tensor(mask), position_ids=torch.tensor(pos)).logits.numpy()


def assert_close_at_real(ours, ref, mask, tol=1e-4):
    real = mask.astype(bool)
    err = np.abs(np.asarray(ours) - ref)[real].max()
    assert err < tol, err
    assert np.abs(ref[real]).max() > 0.5  # a meaningful comparison


@pytest.mark.parametrize("case", list(CASES))
def test_hf_to_flaxlm(tmp_path, case):
    config = tiny_config(case)
    hf = random_hf(config)
    hf.save_pretrained(tmp_path)
    loaded, model = models.load_pretrained(tmp_path)
    ids, mask, pos = batch()
    ours = model(*map(jnp.asarray, (ids, mask, pos)))
    assert ours.dtype == jnp.float32 and ours.shape == (2, 17, 99)
    assert_close_at_real(ours, hf_logits(hf, ids, mask, pos), mask)
    # transformers' loss (labels shifted inside) is the mean cross-entropy of our logits[:, :-1] vs ids[:, 1:]
    with torch.no_grad():
        theirs = float(hf(torch.tensor(ids[:1]), labels=torch.tensor(ids[:1])).loss)
    logp = jax.nn.log_softmax(model(jnp.asarray(ids[:1]))[:, :-1], axis=-1)
    mine = -float(jnp.take_along_axis(logp, jnp.asarray(ids[:1, 1:])[..., None], axis=-1).mean())
    assert mine == pytest.approx(theirs, abs=1e-5)
    # the names we write are the ones transformers writes (a tied head is not saved)
    written = models.to_hf_state_dict(loaded, models.split_model(model)[1])
    expected = {k for k in hf.state_dict() if not k.endswith(".attn.bias")}
    if loaded.tie_word_embeddings:
        expected.discard("lm_head.weight")
    assert set(written) == expected


@pytest.mark.parametrize("case", list(CASES))
def test_flaxlm_to_hf(tmp_path, case):
    config = tiny_config(case)
    graphdef, params = models.split_model(models.create_model(config, seed=1))
    params = randomize(params, seed=1)
    models.save_pretrained(tmp_path, config, params)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["architectures"] == ["GPT2LMHeadModel"]
    assert saved.get("tie_word_embeddings", True) == (case != "untied")
    hf, info = transformers.GPT2LMHeadModel.from_pretrained(tmp_path, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")), info
    assert models.count_params(params) == sum(p.numel() for p in hf.parameters())
    ids, mask, pos = batch(seed=1)
    ours = models.apply_model(graphdef, params, *map(jnp.asarray, (ids, mask, pos)))
    assert_close_at_real(ours, hf_logits(hf.eval(), ids, mask, pos), mask)


def test_kv_cache_equals_full_forward():
    """Prefill 10 tokens (one row left-padded), then one token at a time: the same logits as one full pass."""
    config = tiny_config()
    graphdef, params = models.split_model(models.create_model(config, seed=2))
    model = models.merge_model(graphdef, randomize(params, seed=2))
    ids, mask, pos = map(jnp.asarray, batch(seed=2))
    full = model(ids, mask, pos)
    cache = model.init_cache(2, 20)
    first, cache = model(ids[:, :10], mask[:, :10], pos[:, :10], cache=cache)
    steps = [first]
    for t in range(10, 17):
        logits, cache = model(ids[:, t:t + 1], mask[:, t:t + 1], pos[:, t:t + 1], cache=cache)
        steps.append(logits)
    assert int(cache["index"]) == 17
    np.testing.assert_array_less(np.abs(np.asarray(jnp.concatenate(steps, 1) - full))[np.asarray(mask) == 1], 1e-5)


def test_hub_style_bare_checkpoint_with_buffers(tmp_path):
    """The hub's gpt2 files: GPT2Model names without 'transformer.', attn.bias / attn.masked_bias buffers."""
    config = tiny_config()
    hf = random_hf(config)
    tensors = {k.removeprefix("transformer."): v.numpy().copy() for k, v in hf.state_dict().items()
               if k != "lm_head.weight"}
    tensors["h.0.attn.bias"] = np.tril(np.ones((1, 1, 40, 40), np.float32))
    tensors["h.0.attn.masked_bias"] = np.array(-1e4, np.float32)
    config.save_pretrained(tmp_path)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    _, model = models.load_pretrained(tmp_path)
    ids, mask, pos = batch()
    assert_close_at_real(model(*map(jnp.asarray, (ids, mask, pos))), hf_logits(hf, ids, mask, pos), mask)


def test_strict_loading():
    config = tiny_config()
    tensors = models.to_hf_state_dict(config, models.split_model(models.create_model(config))[1])
    missing = {k: v for k, v in tensors.items() if k != "transformer.h.1.mlp.c_fc.bias"}
    with pytest.raises(UserError, match=r"missing tensor\(s\) transformer.h.1.mlp.c_fc.bias"):
        models.from_hf_state_dict(config, missing)
    with pytest.raises(UserError, match=r"unexpected tensor\(s\) transformer.h.9.ln_1.weight"):
        models.from_hf_state_dict(config, {**tensors, "transformer.h.9.ln_1.weight": np.ones(32, np.float32)})
    bad = {**tensors, "transformer.h.0.attn.c_attn.weight": np.zeros((32, 95), np.float32)}
    with pytest.raises(UserError, match=r"transformer.h.0.attn.c_attn.weight has shape \(32, 95\) but config.json "
                                        r"implies \(32, 96\)"):
        models.from_hf_state_dict(config, bad)
    untied_head = {**tensors, "lm_head.weight": tensors["transformer.wte.weight"] + 1}
    with pytest.raises(UserError, match="lm_head.weight differs from transformer.wte.weight"):
        models.from_hf_state_dict(config, untied_head)


def test_dropout_and_bf16():
    config = tiny_config()
    graphdef, params = models.split_model(models.create_model(config, seed=3))
    ids = jnp.asarray(batch()[0][:1])
    eval_logits = models.apply_model(graphdef, params, ids)
    a = models.apply_model(graphdef, params, ids, dropout_key=jax.random.key(0))
    b = models.apply_model(graphdef, params, ids, dropout_key=jax.random.key(0))
    c = models.apply_model(graphdef, params, ids, dropout_key=jax.random.key(1))
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c) and not np.allclose(a, eval_logits)
    bf16 = models.merge_model(models.split_model(models.create_model(config, dtype="bfloat16", seed=3))[0], params)
    out = bf16(ids)
    assert out.dtype == jnp.float32 and np.abs(np.asarray(out) - np.asarray(eval_logits)).max() < 0.05
