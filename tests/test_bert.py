"""BERT / RoBERTa: what the parity checks of every family (tests/test_parity.py) do not cover: RoBERTa's position
ids, the masked-position gather, the attention kernels and dropout, the functional API under jit and sharding."""
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
from parity import batch, jnp_args
from test_parity import CASE


BERT, ROBERTA = CASE["bert-gelu"], CASE["roberta-gelu"]


def test_roberta_position_ids_match_hf():
    from transformers.models.roberta.modeling_roberta import RobertaEmbeddings
    from flaxlm.models.bert import roberta_position_ids
    ids = np.array([[0, 5, 6, 1, 1], [7, 1, 8, 9, 1]])
    ref = RobertaEmbeddings.create_position_ids_from_input_ids(torch.tensor(ids), 1).numpy()
    np.testing.assert_array_equal(np.asarray(roberta_position_ids(jnp.asarray(ids), 1)), ref)


@pytest.mark.parametrize("case", [BERT, ROBERTA], ids=str)
def test_masked_positions_gather(case):
    config = case.config()
    model = models.create_model(config)
    ids, mask, _ = batch(case).args
    full = model(jnp.asarray(ids), jnp.asarray(mask))
    pos = jnp.array([[0, 3, 11], [1, 2, 6]], jnp.int32)
    got = model(jnp.asarray(ids), jnp.asarray(mask), masked_positions_BP=pos)
    assert got.shape == (2, 3, config.vocab_size) and got.dtype == jnp.float32
    np.testing.assert_allclose(got, jnp.take_along_axis(full, pos[..., None], axis=1), atol=1e-5)


def test_attention_dropout_alone_acts():
    """Attention-probability dropout changes the output with the hidden dropout off."""
    graphdef, params = models.split_model(models.create_model(BERT.config(num_hidden_layers=1)))
    ids, mask, _ = jnp_args(batch(BERT))
    det = models.apply_model(graphdef, params, ids, mask)
    attention_only = BERT.config(num_hidden_layers=1, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.5)
    graphdef = models.split_model(models.create_model(attention_only))[0]
    assert not np.allclose(models.apply_model(graphdef, params, ids, mask, dropout_key=jax.random.key(1)), det)


def test_explicit_attention_matches_dot_product_attention():
    q, k, v = np.random.default_rng(0).normal(size=(3, 2, 5, 3, 8)).astype(np.float32)
    mask = jnp.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], bool)
    ref = attention(q, k, v, mask)
    got = attention(q, k, v, mask, dropout_rate=1e-9, dropout_key=jax.random.key(0))
    np.testing.assert_allclose(got, ref, atol=1e-5)


def test_grad_under_jit_and_sharding():
    config = ROBERTA.config(num_hidden_layers=1, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    graphdef, params = models.split_model(models.create_model(config))
    ids, mask, _ = jnp_args(batch(ROBERTA))
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
    config = BERT.config(num_hidden_layers=12)
    model = models.create_model(config)
    graphdef, params = models.split_model(model)
    assert set(params["layers"]) == {str(i) for i in range(12)}
    # layer order survives the str keys ("10" sorts before "2")
    params["layers"] = {k: {**v, "mlp_in": {**v["mlp_in"], "bias": jnp.full((37,), float(k))}}
                        for k, v in params["layers"].items()}
    rebuilt = models.merge_model(graphdef, params)
    assert [float(layer.mlp_in.bias[0]) for layer in rebuilt.layers] == [float(i) for i in range(12)]


def test_decay_mask():
    _, params = models.split_model(models.create_model(BERT.config()))
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
        models.create_model(BERT.config(hidden_act="mish"))
    with pytest.raises(UserError, match="dtype"):
        models.create_model(BERT.config(), dtype="int8")


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
