"""BERT / RoBERTa against transformers' torch models, both directions, plus the functional API."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from flaxlm import models
from flaxlm.errors import UserError
from flaxlm.models.layers import attention


def tiny_config(model_type, **overrides):
    cls = transformers.RobertaConfig if model_type == "roberta" else transformers.BertConfig
    kw = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
              max_position_embeddings=64 + (2 if model_type == "roberta" else 0), initializer_range=0.2)
    return cls(**{**kw, **overrides})


def batch(config, seed=0):
    """ids, attention_mask, token_type_ids (numpy int64); row 1 is padded at the end."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, config.vocab_size, (2, 12))
    mask = np.ones_like(ids)
    mask[1, 7:] = 0
    ids[1, 7:] = config.pad_token_id
    types = np.zeros_like(ids)
    types[:, 5:] = 1
    return ids, mask, types


def randomize(params, seed=0, std=0.3):
    """Random values everywhere (biases and LayerNorm too), so every tensor's mapping is exercised."""
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return jax.tree.unflatten(treedef, [x + std * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])


def hf_logits(hf_model, ids, mask, types):
    with torch.no_grad():
        return hf_model.eval()(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                               token_type_ids=torch.tensor(types)).logits.numpy()


CASES = [("bert", "gelu"), ("roberta", "gelu"), ("bert", "gelu_new"), ("bert", "relu"), ("roberta", "relu")]


@pytest.mark.parametrize("model_type,act", CASES)
def test_hf_to_flaxlm(tmp_path, model_type, act):
    config = tiny_config(model_type, hidden_act=act)
    torch.manual_seed(0)
    hf = transformers.AutoModelForMaskedLM.from_config(config)
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(0.3 * torch.randn_like(p))
    hf.save_pretrained(tmp_path)
    _, model = models.load_pretrained(tmp_path)
    ids, mask, types = batch(config)
    ours = np.asarray(model(jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types)))
    ref = hf_logits(hf, ids, mask, types)
    assert ours.dtype == np.float32 and ours.shape == ref.shape == (2, 12, config.vocab_size)
    real = mask.astype(bool)
    np.testing.assert_allclose(ours[real], ref[real], atol=1e-4, rtol=0)
    assert np.abs(ref[real]).max() > 1.0  # a meaningful comparison, not two near-zero tensors


@pytest.mark.parametrize("model_type", ["bert", "roberta"])
def test_flaxlm_to_hf(tmp_path, model_type):
    config = tiny_config(model_type)
    graphdef, params = models.split_model(models.create_model(config, seed=1))
    params = randomize(params, seed=1)
    models.save_pretrained(tmp_path, config, params)
    hf, info = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert type(hf).__name__ == ("RobertaForMaskedLM" if model_type == "roberta" else "BertForMaskedLM")
    ids, mask, types = batch(config, seed=1)
    ours = np.asarray(models.apply_model(graphdef, params, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types)))
    ref = hf_logits(hf, ids, mask, types)
    real = mask.astype(bool)
    np.testing.assert_allclose(ours[real], ref[real], atol=1e-4, rtol=0)
    assert models.count_params(params) == sum(p.numel() for p in hf.parameters())


def test_roberta_position_ids_match_hf():
    from transformers.models.roberta.modeling_roberta import RobertaEmbeddings
    from flaxlm.models.bert import roberta_position_ids
    ids = np.array([[0, 5, 6, 1, 1], [7, 1, 8, 9, 1]])
    ref = RobertaEmbeddings.create_position_ids_from_input_ids(torch.tensor(ids), 1).numpy()
    np.testing.assert_array_equal(np.asarray(roberta_position_ids(jnp.asarray(ids), 1)), ref)


@pytest.mark.parametrize("model_type", ["bert", "roberta"])
def test_masked_positions_gather(model_type):
    config = tiny_config(model_type)
    model = models.create_model(config)
    ids, mask, _ = batch(config)
    full = model(jnp.asarray(ids), jnp.asarray(mask))
    pos = jnp.array([[0, 3, 11], [1, 2, 6]], jnp.int32)
    got = model(jnp.asarray(ids), jnp.asarray(mask), masked_positions_BP=pos)
    assert got.shape == (2, 3, config.vocab_size) and got.dtype == jnp.float32
    np.testing.assert_allclose(got, jnp.take_along_axis(full, pos[..., None], axis=1), atol=1e-5)


def test_bfloat16_compute():
    config = tiny_config("bert")
    graphdef32, params = models.split_model(models.create_model(config))
    params = randomize(params, std=0.1)
    graphdef16, _ = models.split_model(models.create_model(config, dtype="bfloat16"))
    ids, mask, types = (jnp.asarray(a) for a in batch(config))
    ref = models.apply_model(graphdef32, params, ids, mask, types)
    got = models.apply_model(graphdef16, params, ids, mask, types)
    assert got.dtype == jnp.float32
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params))
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(models.split_model(
        models.create_model(config, dtype="bfloat16"))[1]))
    err = jnp.abs(got - ref)[mask.astype(bool)]
    assert float(err.max()) < 0.1 * float(jnp.abs(ref).max()) + 0.05


def test_dropout_key():
    def train_fn(**dropout):
        graphdef, params = models.split_model(models.create_model(tiny_config("bert", num_hidden_layers=1, **dropout)))
        fn = jax.jit(lambda p, ids, mask, key: models.apply_model(graphdef, p, ids, mask, dropout_key=key))
        return graphdef, params, fn

    graphdef, params, train = train_fn(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    ids, mask, _ = (jnp.asarray(a) for a in batch(tiny_config("bert")))
    det = models.apply_model(graphdef, params, ids, mask)
    a, b, c = (train(params, ids, mask, jax.random.key(k)) for k in (1, 1, 2))
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, det) and not np.allclose(a, c)
    # attention-probability dropout alone also acts
    _, _, train = train_fn(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.5)
    assert not np.allclose(train(params, ids, mask, jax.random.key(1)), det)


def test_explicit_attention_matches_dot_product_attention():
    q, k, v = np.random.default_rng(0).normal(size=(3, 2, 5, 3, 8)).astype(np.float32)
    mask = jnp.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], bool)
    ref = attention(q, k, v, mask)
    got = attention(q, k, v, mask, dropout_rate=1e-9, dropout_key=jax.random.key(0))
    np.testing.assert_allclose(got, ref, atol=1e-5)


def test_grad_under_jit_and_sharding():
    config = tiny_config("roberta", num_hidden_layers=1, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    graphdef, params = models.split_model(models.create_model(config))
    ids, mask, _ = (jnp.asarray(a) for a in batch(config))
    ids, mask = jnp.tile(ids, (4, 1)), jnp.tile(mask, (4, 1))  # 8 rows over 8 devices
    pos = jnp.tile(jnp.array([[1, 2], [3, 4]], jnp.int32), (4, 1))
    labels = jnp.take_along_axis(ids, pos, axis=1)

    def loss(p, ids, mask, pos, labels, key):
        logits = models.apply_model(graphdef, p, ids, mask, masked_positions_BP=pos, dropout_key=key)
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[..., None], axis=-1))

    mesh = Mesh(np.array(jax.devices()), ("data",))
    rep, rows = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    key = jax.random.key(0, impl="rbg")  # any key type works; rbg compiles faster than threefry on CPU
    value, grads = jax.jit(jax.value_and_grad(loss))(
        jax.device_put(params, rep), *jax.device_put((ids, mask, pos, labels), rows), key)
    assert jax.tree.structure(grads) == jax.tree.structure(params)
    assert all(bool(jnp.isfinite(x).all()) for x in jax.tree.leaves(grads))
    assert float(jnp.abs(grads["embeddings"]["word"]["embedding"]).sum()) > 0
    assert float(jnp.abs(grads["layers"]["0"]["attn"]["query"]["kernel"]).sum()) > 0
    # same value on one device, unsharded, with the same dropout key
    np.testing.assert_allclose(value, jax.jit(loss)(params, ids, mask, pos, labels, key), rtol=1e-5)


def test_split_keys_are_strings_and_roundtrip_many_layers():
    config = tiny_config("bert", num_hidden_layers=12)
    model = models.create_model(config)
    graphdef, params = models.split_model(model)
    assert set(params["layers"]) == {str(i) for i in range(12)}
    # layer order survives the str keys ("10" sorts before "2")
    params["layers"] = {k: {**v, "mlp_in": {**v["mlp_in"], "bias": jnp.full((37,), float(k))}}
                        for k, v in params["layers"].items()}
    rebuilt = models.merge_model(graphdef, params)
    assert [float(layer.mlp_in.bias[0]) for layer in rebuilt.layers] == [float(i) for i in range(12)]


def test_decay_mask():
    _, params = models.split_model(models.create_model(tiny_config("bert")))
    mask = models.decay_mask(params)
    assert jax.tree.structure(mask) == jax.tree.structure(params)
    flat = {"/".join(str(getattr(k, "key", k)) for k in path): v
            for path, v in jax.tree_util.tree_flatten_with_path(mask)[0]}
    no_decay = {k for k, v in flat.items() if not v}
    assert no_decay == {k for k in flat if k.endswith("/bias") or "norm/" in k}
    assert flat["embeddings/word/embedding"] and flat["layers/0/attn/query/kernel"]
    assert not flat["mlm_head/bias"] and not flat["layers/1/mlp_norm/scale"]


def test_create_model_errors():
    with pytest.raises(UserError, match="unsupported model_type 'vit'.*bert, roberta"):
        models.create_model(transformers.ViTConfig())
    with pytest.raises(UserError, match="hidden_act"):
        models.create_model(tiny_config("bert", hidden_act="mish"))
    with pytest.raises(UserError, match="dtype"):
        models.create_model(tiny_config("bert"), dtype="int8")


def test_dropout_mask_rate_independence_and_sharding():
    """The hashed dropout mask drops `rate` of the elements, differs per key, and is the same for any
    sharding of its input (so 8 devices train like 1)."""
    from flaxlm.training.mesh import make_mesh
    from flaxlm.models.layers import dropout
    x = jnp.ones((16, 4, 64, 64))
    a, b = dropout(x, 0.1, jax.random.PRNGKey(1)), dropout(x, 0.1, jax.random.PRNGKey(2))
    assert abs(float((a == 0).mean()) - 0.1) < 0.003
    assert abs(float(((a == 0) & (b == 0)).mean()) - 0.01) < 0.002  # independent masks per key
    assert float(a.mean()) == pytest.approx(1.0, abs=0.01)  # inverted dropout keeps the mean
    sharded = jax.device_put(x, NamedSharding(make_mesh(), P("data")))
    c = jax.jit(lambda v: dropout(v, 0.1, jax.random.PRNGKey(1)))(sharded)
    np.testing.assert_array_equal(np.asarray(c), np.asarray(a))
