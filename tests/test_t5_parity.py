"""T5 (v1.1 and original) against transformers' T5ForConditionalGeneration, both directions, plus the
functional API, dropout, bf16, initialization, strictness of the checkpoint mapping and the FLOPs count."""
import json
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
from flaxlm.models.t5 import relative_buckets, shift_right, t5_attention, ties_embeddings

# name -> (feed_forward_proj, tie_word_embeddings, num_layers, num_decoder_layers)
CASES = {
    "v1_1": ("gated-gelu", False, 2, 3),
    "original": ("relu", True, 2, 3),
    "gated-silu-tied": ("gated-silu", True, 2, 2),
}


def tiny_config(case="v1_1", **overrides):
    ffp, tie, enc, dec = CASES[case]
    # buckets/max_distance small enough that the lengths below reach the log-spaced and the clipped buckets;
    # initializer_factor 0.5 keeps activations moderate so float32 rounding stays far below the 1e-4 tolerance
    kw = dict(vocab_size=99, d_model=32, d_kv=8, d_ff=37, num_layers=enc, num_decoder_layers=dec, num_heads=4,
              relative_attention_num_buckets=8, relative_attention_max_distance=20, initializer_factor=0.5,
              feed_forward_proj=ffp, tie_word_embeddings=tie, decoder_start_token_id=0, dropout_rate=0.1)
    return transformers.T5Config(**{**kw, **overrides})


def batch(config, seed=0):
    """ids, attention_mask, decoder_input_ids, decoder_attention_mask, labels (numpy int64): row 1 of the
    encoder input is padded from 20, row 1 of the decoder from 19 (labels -100 there)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(2, config.vocab_size, (2, 30))
    mask = np.ones_like(ids)
    mask[1, 20:] = 0
    ids[1, 20:] = config.pad_token_id
    labels = rng.integers(2, config.vocab_size, (2, 25))
    labels[1, 19:] = -100
    dec_ids = np.asarray(shift_right(labels, config.decoder_start_token_id, config.pad_token_id))
    dec_mask = (labels != -100).astype(np.int64)
    dec_mask[:, 0] = 1
    return ids, mask, dec_ids, dec_mask, labels


def randomize(params, seed=0, std=0.1):
    """Random values everywhere (norm scales and position biases too), so every tensor's mapping is exercised."""
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return jax.tree.unflatten(treedef, [x + std * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])


def random_hf(config, seed=0, std=0.1):
    """A transformers model with random weights; v1.1 gets its own LM head (transformers 5 ties it at init)."""
    torch.manual_seed(seed)
    hf = transformers.T5ForConditionalGeneration(config)
    if not ties_embeddings(config):
        hf.lm_head.weight = torch.nn.Parameter(hf.shared.weight.detach().clone())
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(std * torch.randn_like(p))
    return hf.eval()


def hf_forward(hf, ids, mask, dec_ids, dec_mask, labels=None):
    t = lambda a: None if a is None else torch.tensor(a)  # noqa: E731
    with torch.no_grad():
        if labels is not None:  # transformers shifts the labels itself
            return hf.eval()(input_ids=t(ids), attention_mask=t(mask), labels=t(labels))
        return hf.eval()(input_ids=t(ids), attention_mask=t(mask), decoder_input_ids=t(dec_ids),
                         decoder_attention_mask=t(dec_mask))


def our_loss(logits_BTV, labels_BT):
    logp = jax.nn.log_softmax(jnp.asarray(logits_BTV), axis=-1)
    real = labels_BT != -100
    nll = -jnp.take_along_axis(logp, jnp.asarray(np.where(real, labels_BT, 0))[..., None], axis=-1)[..., 0]
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
    assert ties_embeddings(loaded_config) == CASES[case][1]
    ids, mask, dec_ids, dec_mask, labels = batch(config)
    ours = np.asarray(model(*map(jnp.asarray, (ids, mask, dec_ids, dec_mask))))
    ref = hf_forward(hf, ids, mask, dec_ids, dec_mask).logits.numpy()
    assert ours.dtype == np.float32 and ours.shape == ref.shape == (2, 25, config.vocab_size)
    err = np.abs(ours - ref).max()
    assert err < 1e-4, err
    assert np.abs(ref).max() > 1.0  # a meaningful comparison, not two near-zero tensors
    # the loss transformers computes from labels (shifting them itself) is ours on the same labels
    theirs = float(hf_forward(hf, ids, mask, None, None, labels=labels).loss)
    mine = our_loss(model(jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(dec_ids)), labels)
    assert mine == pytest.approx(theirs, abs=1e-5)
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
    assert saved["architectures"] == ["T5ForConditionalGeneration"] and saved["model_type"] == "t5"
    assert saved.get("tie_word_embeddings", True) == CASES[case][1]  # readable by transformers 4 too
    hf, info = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")), info
    # v1.1: a separate LM head and no output scaling; original: tied and scaled
    assert (hf.lm_head.weight.data_ptr() == hf.shared.weight.data_ptr()) == CASES[case][1]
    assert hf.config.scale_decoder_outputs == CASES[case][1]
    assert models.count_params(params) == sum(p.numel() for p in hf.parameters())
    ids, mask, dec_ids, dec_mask, labels = batch(config, seed=1)
    ours = np.asarray(models.apply_model(graphdef, params, *map(jnp.asarray, (ids, mask, dec_ids, dec_mask))))
    ref = hf_forward(hf, ids, mask, dec_ids, dec_mask).logits.numpy()
    err = np.abs(ours - ref).max()
    assert err < 1e-4, err
    assert np.abs(ref).max() > 1.0
    theirs = float(hf_forward(hf, ids, mask, None, None, labels=labels).loss)
    assert our_loss(models.apply_model(graphdef, params, *map(jnp.asarray, (ids, mask, dec_ids))),
                    labels) == pytest.approx(theirs, abs=1e-5)
    # and back: the same parameters
    _, model = models.load_pretrained(tmp_path)
    jax.tree.map(np.testing.assert_array_equal, models.split_model(model)[1], jax.tree.map(np.asarray, params))


def test_transformers5_tied_v1_1_checkpoint(tmp_path, caplog):
    """transformers 5 builds a v1.1 model from a config with its LM head tied (and unscaled) and saves no
    lm_head.weight: ours starts with a copy of the shared embeddings and computes the same logits."""
    config = tiny_config("v1_1")
    torch.manual_seed(0)
    hf = transformers.T5ForConditionalGeneration(config).eval()
    hf.save_pretrained(tmp_path)
    assert "lm_head.weight" not in saved_keys(tmp_path)
    with caplog.at_level(logging.WARNING, logger="flaxlm.models.convert"):
        _, model = models.load_pretrained(tmp_path)
    assert "no lm_head.weight" in caplog.text
    ids, mask, dec_ids, dec_mask, _ = batch(config)
    np.testing.assert_allclose(np.asarray(model(*map(jnp.asarray, (ids, mask, dec_ids, dec_mask)))),
                               hf_forward(hf, ids, mask, dec_ids, dec_mask).logits.numpy(), atol=1e-4, rtol=0)


def test_names_and_tree_layout():
    config = tiny_config("v1_1")
    params = models.split_model(models.create_model(config))[1]
    assert set(params) == {"shared", "encoder", "decoder", "lm_head"}
    assert set(params["encoder"]) == {"relative_attention_bias", "layers", "final_norm"}
    assert set(params["encoder"]["layers"]["0"]) == {"attn_norm", "attn", "mlp_norm", "mlp"}
    assert set(params["decoder"]["layers"]["2"]) == {"attn_norm", "attn", "cross_norm", "cross_attn", "mlp_norm",
                                                     "mlp"}
    assert set(params["decoder"]["layers"]["0"]["mlp"]) == {"wi_0", "wi_1", "wo"}
    assert params["encoder"]["relative_attention_bias"]["embedding"].shape == (8, 4)
    assert params["lm_head"]["kernel"].shape == (32, 99)
    original = models.split_model(models.create_model(tiny_config("original")))[1]
    assert "lm_head" not in original and set(original["encoder"]["layers"]["1"]["mlp"]) == {"wi", "wo"}
    names = [hf for hf, _, _ in t5.tensor_names(config)]
    assert len(names) == len(set(names)) == len(jax.tree.leaves(params))
    assert sum("relative_attention_bias" in n for n in names) == 2  # one per stack, in block 0


def test_inner_dim_differs_from_d_model(tmp_path):
    """num_heads * d_kv need not be d_model (as in t5-3b/11b)."""
    config = tiny_config("original", d_kv=5, num_heads=3)
    hf = random_hf(config)
    hf.save_pretrained(tmp_path)
    _, model = models.load_pretrained(tmp_path)
    ids, mask, dec_ids, dec_mask, _ = batch(config)
    np.testing.assert_allclose(np.asarray(model(*map(jnp.asarray, (ids, mask, dec_ids, dec_mask)))),
                               hf_forward(hf, ids, mask, dec_ids, dec_mask).logits.numpy(), atol=1e-4, rtol=0)


def test_encode_decode_equal_call():
    config = tiny_config("v1_1")
    model = models.create_model(config, seed=2)
    ids, mask, dec_ids, dec_mask, _ = map(jnp.asarray, batch(config))
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
    config = tiny_config(pad_token_id=3, decoder_start_token_id=5)
    labels = np.array([[7, 8, 9, -100], [10, -100, -100, -100]])
    ref = transformers.T5ForConditionalGeneration(config)._shift_right(torch.tensor(labels)).numpy()
    np.testing.assert_array_equal(np.asarray(shift_right(labels, 5, 3)), ref)


def test_bfloat16_compute():
    config = tiny_config("v1_1")
    graphdef32, params = models.split_model(models.create_model(config))
    params = randomize(params, std=0.05)
    graphdef16, params16 = models.split_model(models.create_model(config, dtype="bfloat16"))
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params16))
    args = tuple(map(jnp.asarray, batch(config)[:4]))
    ref = models.apply_model(graphdef32, params, *args)
    got = models.apply_model(graphdef16, params, *args)
    assert got.dtype == jnp.float32 and bool(jnp.isfinite(got).all())
    assert float(jnp.abs(got - ref).max()) < 0.05 * float(jnp.abs(ref).max()) + 0.05
    enc = models.merge_model(graphdef16, params).encode(args[0], args[1])
    assert enc.dtype == jnp.bfloat16


def test_dropout_key():
    config = tiny_config("v1_1", dropout_rate=0.1)
    graphdef, params = models.split_model(models.create_model(config))
    args = tuple(map(jnp.asarray, batch(config)[:4]))
    train = jax.jit(lambda p, key: models.apply_model(graphdef, p, *args, dropout_key=key))
    det = models.apply_model(graphdef, params, *args)
    a, b, c = (train(params, jax.random.key(k)) for k in (1, 1, 2))
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, det) and not np.allclose(a, c)
    # without a key (eval) the rate does not matter
    graphdef0, _ = models.split_model(models.create_model(tiny_config("v1_1", dropout_rate=0.0)))
    np.testing.assert_allclose(models.apply_model(graphdef0, params, *args), det, atol=1e-6)


def test_explicit_attention_matches_dot_product_attention():
    q, k, v = np.random.default_rng(0).normal(size=(3, 2, 5, 3, 8)).astype(np.float32)
    bias = np.random.default_rng(1).normal(size=(1, 3, 5, 5)).astype(np.float32)
    mask = jnp.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], bool)[:, None, None, :] & jnp.tril(jnp.ones((5, 5), bool))
    ref = t5_attention(q, k, v, bias, mask)
    got = t5_attention(q, k, v, bias, mask, dropout_rate=1e-9, dropout_key=jax.random.key(0))
    np.testing.assert_allclose(got, ref, atol=1e-5)


def test_functional_jit_and_sharded_grad():
    config = tiny_config("original", dropout_rate=0.1)
    model = models.create_model(config, seed=3)
    graphdef, params = models.split_model(model)
    ids, mask, dec_ids, dec_mask, labels = batch(config)
    np.testing.assert_allclose(
        jax.jit(lambda p, *a: models.apply_model(graphdef, p, *a))(params, *map(jnp.asarray, batch(config)[:4])),
        model(*map(jnp.asarray, (ids, mask, dec_ids, dec_mask))), atol=1e-5, rtol=0)

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
    params = models.split_model(models.create_model(tiny_config("v1_1")))[1]
    flat = {"/".join(str(getattr(k, "key", k)) for k in path): v
            for path, v in jax.tree_util.tree_flatten_with_path(models.decay_mask(params))[0]}
    assert {k for k, v in flat.items() if not v} == {k for k in flat if k.endswith("/scale")}
    assert all(k.endswith(("_norm/scale", "final_norm/scale")) for k in flat if k.endswith("/scale"))
    assert flat["shared/embedding"] and flat["lm_head/kernel"] and flat["encoder/relative_attention_bias/embedding"]


def test_initialization_like_hf():
    """Each tensor's init std is Hugging Face's _init_weights' (initializer_factor-scaled normals, norms = factor)."""
    config = transformers.T5Config(vocab_size=512, d_model=64, d_kv=16, d_ff=192, num_layers=1, num_heads=8,
                                   feed_forward_proj="gated-gelu", tie_word_embeddings=False, initializer_factor=0.7)
    params = models.to_hf_state_dict(config, models.split_model(models.create_model(config))[1])
    torch.manual_seed(0)
    ref = {k: v.numpy() for k, v in transformers.T5ForConditionalGeneration(config).state_dict().items()}
    for name, x in params.items():
        if name.endswith("layer_norm.weight"):
            np.testing.assert_array_equal(x, ref[name])
        else:
            assert abs(x.mean()) < 0.2 * ref[name].std() + 1e-3, name
            assert x.std() == pytest.approx(ref[name].std(), rel=0.2), name


def test_strict_loading():
    config = tiny_config("v1_1")
    params = models.split_model(models.create_model(config))[1]
    tensors = models.to_hf_state_dict(config, params)

    def fails(tensors, pattern):
        with pytest.raises(UserError, match=pattern) as e:
            models.from_hf_state_dict(config, tensors)
        assert "\n" not in str(e.value)

    missing = dict(tensors)
    del missing["decoder.block.1.layer.1.EncDecAttention.v.weight"]
    fails(missing, r"missing tensor\(s\) decoder.block.1.layer.1.EncDecAttention.v.weight.*2\+3 layers")
    fails({**tensors, "encoder.block.2.layer.0.SelfAttention.q.weight": np.zeros((32, 32), np.float32)},
          r"unexpected tensor\(s\) encoder.block.2.layer.0.SelfAttention.q.weight")
    fails({**tensors, "encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight":
           np.zeros((8, 4), np.float32)}, "unexpected tensor")
    fails({**tensors, "decoder.block.0.layer.2.DenseReluDense.wi_1.weight": np.zeros((36, 32), np.float32)},
          r"wi_1.weight has shape \(36, 32\) but config.json implies \(37, 32\)")
    fails({**tensors, "encoder.embed_tokens.weight": tensors["shared.weight"] + 1}, "differs from shared.weight")
    # a v1.1 checkpoint under an original-T5 config.json: its own LM head cannot be tied
    with pytest.raises(UserError, match="lm_head.weight differs from shared.weight.*tie_word_embeddings"):
        models.from_hf_state_dict(tiny_config("original"), tensors)
    no_head = {k: v for k, v in tensors.items() if k != "lm_head.weight"}  # then the FFN names differ
    with pytest.raises(UserError, match=r"missing tensor\(s\) decoder.block.0.layer.2.DenseReluDense.wi.weight"):
        models.from_hf_state_dict(tiny_config("original"), no_head)


def test_tied_copies_and_unused_tensors_accepted():
    """Older checkpoints carry embed_tokens and tied lm_head copies of shared.weight and the decoder's unused
    cross-attention position bias: all dropped after checking."""
    config = tiny_config("original")
    params = models.split_model(models.create_model(config, seed=4))[1]
    tensors = models.to_hf_state_dict(config, params)
    old = {**tensors, "encoder.embed_tokens.weight": tensors["shared.weight"],
           "decoder.embed_tokens.weight": tensors["shared.weight"], "lm_head.weight": tensors["shared.weight"],
           "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight": np.zeros((8, 4), np.float32)}
    jax.tree.map(np.testing.assert_array_equal, models.from_hf_state_dict(config, old), jax.tree.map(np.asarray, params))
    torch_sd = {k: v.numpy() for k, v in transformers.T5ForConditionalGeneration(config).state_dict().items()}
    assert set(models.from_hf_state_dict(config, torch_sd)) == set(params)


def test_create_model_errors():
    with pytest.raises(UserError, match="hidden_act|activation"):
        models.create_model(tiny_config("v1_1", feed_forward_proj="gated-mish"))
    with pytest.raises(UserError, match="num_decoder_layers"):
        models.create_model(tiny_config("v1_1", num_decoder_layers=0))


def test_train_flops_match_xla_count():
    """The analytic count (matmuls only) is XLA's count of the forward within 2% on a matmul-dominated shape."""
    for case in ("v1_1", "original"):
        config = tiny_config(case, vocab_size=2048, d_model=256, d_kv=32, d_ff=1024, num_layers=3,
                             num_decoder_layers=2, num_heads=4)
        graphdef, params = models.split_model(models.create_model(config))
        fwd = jax.jit(lambda p, a, b: models.apply_model(graphdef, p, a, None, b))
        cost = fwd.lower(params, jnp.zeros((2, 96), jnp.int32), jnp.zeros((2, 24), jnp.int32)).compile().cost_analysis()
        cost = cost[0] if isinstance(cost, (list, tuple)) else cost
        ours = encoder_decoder_train_flops(config, 2, 96, 24)
        assert ours / 3 == pytest.approx(cost["flops"], rel=0.02)
