"""T5 (v1.1 and original): what the parity checks of every family (tests/test_parity.py) do not cover: the
tied/untied head conventions of transformers 4 and 5, the parameter tree, inner dim != d_model, encode/decode,
relative position buckets, shift_right, the functional API under jit and sharding, initialization, strictness on
its names, older checkpoints and the FLOPs count."""
import dataclasses
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from flaxlm import models
from flaxlm.errors import UserError
from flaxlm.training.flops import encoder_decoder_train_flops
from flaxlm.models import t5
from flaxlm.models.t5 import relative_buckets, shift_right, t5_attention
from parity import (assert_close_at_real, assert_initialized_like_transformers, assert_load_fails, assert_same_params,
                    batch, hf_logits, jnp_args, random_hf, saved_keys)
from test_parity import CASE, CASES

V1_1, ORIGINAL = CASE["t5-v1_1"], CASE["t5-original"]
T5_CASES = [c for c in CASES if c.model_type == "t5"]


@pytest.mark.parametrize("case", T5_CASES, ids=str)
def test_transformers_scales_the_decoder_output_of_a_tied_head(case, tmp_path):
    """v1.1: a separate LM head and no output scaling; original: tied and scaled."""
    config = case.config()
    models.save_pretrained(tmp_path, config, models.split_model(models.create_model(config))[1])
    assert transformers.T5ForConditionalGeneration.from_pretrained(tmp_path).config.scale_decoder_outputs == case.tied


def test_transformers5_tied_v1_1_checkpoint(tmp_path, caplog):
    """transformers 5 builds a v1.1 model from a config with its LM head tied (and unscaled) and saves no
    lm_head.weight: ours starts with a copy of the shared embeddings and computes the same logits."""
    torch.manual_seed(0)
    hf = transformers.T5ForConditionalGeneration(V1_1.config()).eval()
    hf.save_pretrained(tmp_path)
    assert "lm_head.weight" not in saved_keys(tmp_path)
    with caplog.at_level(logging.WARNING, logger="flaxlm.models.convert"):
        _, model = models.load_pretrained(tmp_path)
    assert "no lm_head.weight" in caplog.text
    b = batch(V1_1)
    np.testing.assert_allclose(np.asarray(model(*jnp_args(b))), hf_logits(hf, b.hf), atol=1e-4, rtol=0)


def test_names_and_tree_layout():
    config = V1_1.config()
    params = models.split_model(models.create_model(config))[1]
    assert set(params) == {"shared", "encoder", "decoder", "lm_head"}
    assert set(params["encoder"]) == {"relative_attention_bias", "layers", "final_norm"}
    assert set(params["encoder"]["layers"]["0"]) == {"attn_norm", "attn", "mlp_norm", "mlp"}
    assert set(params["decoder"]["layers"]["2"]) == {"attn_norm", "attn", "cross_norm", "cross_attn", "mlp_norm",
                                                     "mlp"}
    assert set(params["decoder"]["layers"]["0"]["mlp"]) == {"wi_0", "wi_1", "wo"}
    assert params["encoder"]["relative_attention_bias"]["embedding"].shape == (8, 4)
    assert params["lm_head"]["kernel"].shape == (32, 99)
    original = models.split_model(models.create_model(ORIGINAL.config()))[1]
    assert "lm_head" not in original and set(original["encoder"]["layers"]["1"]["mlp"]) == {"wi", "wo"}
    names = [hf for hf, _, _ in t5.tensor_names(config)]
    assert len(names) == len(set(names)) == len(jax.tree.leaves(params))
    assert sum("relative_attention_bias" in n for n in names) == 2  # one per stack, in block 0


def test_inner_dim_differs_from_d_model(tmp_path):
    """num_heads * d_kv need not be d_model (as in t5-3b/11b)."""
    case = dataclasses.replace(ORIGINAL, fields={**ORIGINAL.fields, "d_kv": 5, "num_heads": 3})
    hf = random_hf(case)
    hf.save_pretrained(tmp_path)
    _, model = models.load_pretrained(tmp_path)
    b = batch(case)
    assert_close_at_real(model(*jnp_args(b)), hf_logits(hf, b.hf), b.real_BL, case.tol)


def test_encode_decode_equal_call():
    model = models.create_model(V1_1.config(), seed=2)
    ids, mask, dec_ids, dec_mask = jnp_args(batch(V1_1))
    enc = model.encode(ids, mask)
    assert enc.shape == (2, 30, 32)
    np.testing.assert_array_equal(model.decode(dec_ids, enc, mask, dec_mask), model(ids, mask, dec_ids, dec_mask))
    with pytest.raises(ValueError, match="decoder_input_ids"):
        model(ids, mask)


def test_relative_buckets_match_hf():
    from transformers.models.t5.modeling_t5 import T5Attention
    for bidirectional in (True, False):
        for num_buckets, max_distance in ((32, 128), (8, 20), (64, 256)):
            ours = relative_buckets(300, 340, bidirectional, num_buckets, max_distance)
            rel = torch.arange(340)[None, :] - torch.arange(300)[:, None]
            ref = T5Attention._relative_position_bucket(rel, bidirectional=bidirectional, num_buckets=num_buckets,
                                                        max_distance=max_distance).numpy()
            np.testing.assert_array_equal(ours, ref)


def test_shift_right_matches_hf():
    config = V1_1.config(pad_token_id=3, decoder_start_token_id=5)
    labels = np.array([[7, 8, 9, -100], [10, -100, -100, -100]])
    ref = transformers.T5ForConditionalGeneration(config)._shift_right(torch.tensor(labels)).numpy()
    np.testing.assert_array_equal(np.asarray(shift_right(labels, 5, 3)), ref)


def test_bfloat16_encoder_output():
    graphdef16, params = models.split_model(models.create_model(V1_1.config(), dtype="bfloat16"))
    ids, mask = jnp_args(batch(V1_1))[:2]
    assert models.merge_model(graphdef16, params).encode(ids, mask).dtype == jnp.bfloat16


def test_eval_ignores_the_dropout_rate():
    """Without a key (eval) the rate does not matter."""
    graphdef, params = models.split_model(models.create_model(V1_1.config(dropout_rate=0.1)))
    args = jnp_args(batch(V1_1))
    det = models.apply_model(graphdef, params, *args)
    graphdef0, _ = models.split_model(models.create_model(V1_1.config(dropout_rate=0.0)))
    np.testing.assert_allclose(models.apply_model(graphdef0, params, *args), det, atol=1e-6)


def test_explicit_attention_matches_dot_product_attention():
    q, k, v = np.random.default_rng(0).normal(size=(3, 2, 5, 3, 8)).astype(np.float32)
    bias = np.random.default_rng(1).normal(size=(1, 3, 5, 5)).astype(np.float32)
    mask = jnp.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], bool)[:, None, None, :] & jnp.tril(jnp.ones((5, 5), bool))
    ref = t5_attention(q, k, v, bias, mask)
    got = t5_attention(q, k, v, bias, mask, dropout_rate=1e-9, dropout_key=jax.random.key(0))
    np.testing.assert_allclose(got, ref, atol=1e-5)


def test_functional_jit_and_sharded_grad():
    model = models.create_model(ORIGINAL.config(dropout_rate=0.1), seed=3)
    graphdef, params = models.split_model(model)
    b = batch(ORIGINAL)
    np.testing.assert_allclose(jax.jit(lambda p, *a: models.apply_model(graphdef, p, *a))(params, *jnp_args(b)),
                               model(*jnp_args(b)), atol=1e-5, rtol=0)
    (_, _, labels), = b.losses
    ids, mask, dec_ids, _ = b.args

    ids, mask, dec_ids, labels = (jnp.tile(jnp.asarray(a), (4, 1)) for a in (ids, mask, dec_ids, labels))  # 8 rows

    def loss(p, ids, mask, dec_ids, labels, key):
        logits = models.apply_model(graphdef, p, ids, mask, dec_ids, dropout_key=key)
        real = labels != -100
        logp = jax.nn.log_softmax(logits)
        nll = -jnp.take_along_axis(logp, jnp.where(real, labels, 0)[..., None], axis=-1)[..., 0]
        return (nll * real).sum() / real.sum()

    mesh = Mesh(np.array(jax.devices()), ("data",))
    rep, rows = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    key = jax.random.key(0, impl="rbg")
    value, grads = jax.jit(jax.value_and_grad(loss))(jax.device_put(params, rep),
                                                     *jax.device_put((ids, mask, dec_ids, labels), rows), key)
    assert jax.tree.structure(grads) == jax.tree.structure(params)
    assert all(bool(jnp.isfinite(x).all()) for x in jax.tree.leaves(grads))
    for stack in ("encoder", "decoder"):
        assert float(jnp.abs(grads[stack]["relative_attention_bias"]["embedding"]).sum()) > 0
    assert float(jnp.abs(grads["decoder"]["layers"]["2"]["cross_attn"]["k"]["kernel"]).sum()) > 0
    np.testing.assert_allclose(value, jax.jit(loss)(params, ids, mask, dec_ids, labels, key), rtol=1e-5)


def test_decay_mask_like_run_t5_mlm_flax():
    """Hugging Face's run_t5_mlm_flax decays everything but biases and layer-norm scales: T5 has no biases,
    so every kernel, both embedding tables and the position-bias tables decay, no norm does."""
    params = models.split_model(models.create_model(V1_1.config()))[1]
    flat = {"/".join(str(getattr(k, "key", k)) for k in path): v
            for path, v in jax.tree_util.tree_flatten_with_path(models.decay_mask(params))[0]}
    assert {k for k, v in flat.items() if not v} == {k for k in flat if k.endswith("/scale")}
    assert all(k.endswith(("_norm/scale", "final_norm/scale")) for k in flat if k.endswith("/scale"))
    assert flat["shared/embedding"] and flat["lm_head/kernel"] and flat["encoder/relative_attention_bias/embedding"]


def test_initialization_like_hf():
    """Each tensor's init std is Hugging Face's _init_weights' (initializer_factor-scaled normals, norms = factor)."""
    config = transformers.T5Config(vocab_size=512, d_model=64, d_kv=16, d_ff=192, num_layers=1, num_heads=8,
                                   feed_forward_proj="gated-gelu", tie_word_embeddings=False, initializer_factor=0.7)
    assert_initialized_like_transformers(config, transformers.T5ForConditionalGeneration,
                                         lambda name: name.endswith("layer_norm.weight"))


def test_strict_loading():
    config = V1_1.config()
    tensors = models.to_hf_state_dict(config, models.split_model(models.create_model(config))[1])

    missing = dict(tensors)
    del missing["decoder.block.1.layer.1.EncDecAttention.v.weight"]
    assert_load_fails(config, missing,
                      r"missing tensor\(s\) decoder.block.1.layer.1.EncDecAttention.v.weight.*2\+3 layers")
    zeros = lambda *shape: np.zeros(shape, np.float32)  # noqa: E731
    assert_load_fails(config, {**tensors, "encoder.block.2.layer.0.SelfAttention.q.weight": zeros(32, 32)},
                      r"unexpected tensor\(s\) encoder.block.2.layer.0.SelfAttention.q.weight")
    assert_load_fails(config, {**tensors, "encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight":
                               zeros(8, 4)}, "unexpected tensor")
    assert_load_fails(config, {**tensors, "decoder.block.0.layer.2.DenseReluDense.wi_1.weight": zeros(36, 32)},
                      r"wi_1.weight has shape \(36, 32\) but config.json implies \(37, 32\)")
    assert_load_fails(config, {**tensors, "encoder.embed_tokens.weight": tensors["shared.weight"] + 1},
                      "differs from shared.weight")
    # a v1.1 checkpoint under an original-T5 config.json: its own LM head cannot be tied
    with pytest.raises(UserError, match="lm_head.weight differs from shared.weight.*tie_word_embeddings"):
        models.from_hf_state_dict(ORIGINAL.config(), tensors)
    no_head = {k: v for k, v in tensors.items() if k != "lm_head.weight"}  # then the FFN names differ
    with pytest.raises(UserError, match=r"missing tensor\(s\) decoder.block.0.layer.2.DenseReluDense.wi.weight"):
        models.from_hf_state_dict(ORIGINAL.config(), no_head)


def test_tied_copies_and_unused_tensors_accepted():
    """Older checkpoints carry embed_tokens and tied lm_head copies of shared.weight and the decoder's unused
    cross-attention position bias: all dropped after checking."""
    config = ORIGINAL.config()
    params = models.split_model(models.create_model(config, seed=4))[1]
    tensors = models.to_hf_state_dict(config, params)
    old = {**tensors, "encoder.embed_tokens.weight": tensors["shared.weight"],
           "decoder.embed_tokens.weight": tensors["shared.weight"], "lm_head.weight": tensors["shared.weight"],
           "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight": np.zeros((8, 4), np.float32)}
    assert_same_params(models.from_hf_state_dict(config, old), params)
    torch_sd = {k: v.numpy() for k, v in transformers.T5ForConditionalGeneration(config).state_dict().items()}
    assert set(models.from_hf_state_dict(config, torch_sd)) == set(params)


def test_create_model_errors():
    with pytest.raises(UserError, match="hidden_act|activation"):
        models.create_model(V1_1.config(feed_forward_proj="gated-mish"))
    with pytest.raises(UserError, match="num_decoder_layers"):
        models.create_model(V1_1.config(num_decoder_layers=0))


def test_train_flops_match_xla_count():
    """The analytic count (matmuls only) is XLA's count of the forward within 2% on a matmul-dominated shape."""
    for case in (V1_1, ORIGINAL):
        config = case.config(vocab_size=2048, d_model=256, d_kv=32, d_ff=1024, num_layers=3, num_decoder_layers=2,
                             num_heads=4)
        graphdef, params = models.split_model(models.create_model(config))
        fwd = jax.jit(lambda p, a, b: models.apply_model(graphdef, p, a, None, b))
        cost = fwd.lower(params, jnp.zeros((2, 96), jnp.int32), jnp.zeros((2, 24), jnp.int32)).compile().cost_analysis()
        cost = cost[0] if isinstance(cost, (list, tuple)) else cost
        ours = encoder_decoder_train_flops(config, 2, 96, 24)
        assert ours / 3 == pytest.approx(cost["flops"], rel=0.02)
