"""The fused LM head + cross-entropy (flaxlm.objectives.lm_loss) against logits + optax, and the models' hidden=True / head()
view that feeds it, through to the three objectives' sums and gradients."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import transformers

from flaxlm import models
from flaxlm.objectives.clm import clm_objective, collate_blocks
from flaxlm.objectives.lm_loss import chunking, default_chunk_rows, head_xent
from flaxlm.objectives.mlm import mlm_objective
from flaxlm.data.mlm_masking import MLMMasker
from flaxlm.models.layers import lm_logits
from flaxlm.data.span_corruption import SpanCorruptor
from flaxlm.objectives.span_lm import span_objective

B, T, D, V = 3, 11, 16, 50  # 11 positions: not a multiple of the chunks' positions below


def plain_sums(logits_BTV, labels_BT, weights_BT, z_loss=0.0):
    """PaLM's z-loss as MaxText's cross_entropy_with_logits computes it: z_loss * logsumexp(logits)^2 a row."""
    xent_BT = optax.softmax_cross_entropy_with_integer_labels(logits_BTV, labels_BT)
    z_BT = z_loss * jnp.square(jax.nn.logsumexp(logits_BTV, axis=-1))
    correct_BT = jnp.take_along_axis(logits_BTV, labels_BT[..., None], axis=-1)[..., 0] >= logits_BTV.max(-1)
    return ((xent_BT + z_BT) * weights_BT).sum(), (correct_BT * weights_BT).sum(), (z_BT * weights_BT).sum()


def logits_of(h_BTD, weight, tied, bias=None, softcap=None):
    logits = lm_logits(h_BTD.reshape(-1, h_BTD.shape[-1]), weight, tied, jnp.float32)
    logits = logits.reshape(*h_BTD.shape[:-1], -1) + (0.0 if bias is None else bias)
    return logits if softcap is None else softcap * jnp.tanh(logits / softcap)


def problem(tied, seed=0):
    rng = np.random.default_rng(seed)
    h = jnp.asarray(rng.normal(size=(B, T, D)), jnp.float32)
    weight = jnp.asarray(rng.normal(size=(V, D) if tied else (D, V)), jnp.float32)
    bias = jnp.asarray(rng.normal(size=(V,)), jnp.float32)
    labels = jnp.asarray(rng.integers(0, V, (B, T)), jnp.int32)
    weights = jnp.asarray(rng.choice([0.0, 1.0, 0.5], (B, T)), jnp.float32)  # zeros included
    weights = weights.at[:, :2].set(1.0)
    return h, weight, bias, labels, weights


def with_correct_rows(labels, logits):
    """labels with the first 2 positions of each row set to their argmax, so accuracy is not trivially 0."""
    return labels.at[:, :2].set(jnp.argmax(logits[:, :2], -1).astype(labels.dtype))


def assert_close(a, b, tol=1e-5):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol * max(1.0, float(jnp.abs(b).max())))


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["", "bias"])
# chunk_rows 3, 7, 10, 256: 1, 2 (padded), 3 (padded), 11 positions per chunk; 0: one chunk. softcap 2.0 (Gemma 2's
# final soft-capping): the raw logits (std ~3) reach tanh's bend. z_loss 0.01 (PaLM's 1e-4, raised so that its part
# of the gradient, ~2 * 0.01 * logsumexp ~ 0.1 of the softmax's, is well above the tolerance)
@pytest.mark.parametrize("chunk_rows,softcap,z_loss", [(3, None, 0), (7, None, 0), (10, None, 0), (256, None, 0),
                                                       (None, None, 0), (0, None, 0), (3, 2.0, 0), (None, 2.0, 0),
                                                       (7, None, 0.01), (3, 2.0, 0.01)])
def test_values_and_gradients_match_optax(tied, with_bias, chunk_rows, softcap, z_loss):
    h, weight, bias, labels, weights = problem(tied)
    bias = bias if with_bias else None
    labels = with_correct_rows(labels, logits_of(h, weight, tied, bias, softcap))

    def fused(h, weight, bias, weights):
        return head_xent(h, weight, labels, weights, tied=tied, bias_V=bias, chunk_rows=chunk_rows, shards=1,
                         softcap=softcap, z_loss=z_loss)

    def plain(h, weight, bias, weights):
        return plain_sums(logits_of(h, weight, tied, bias, softcap), labels, weights, z_loss)

    args = (h, weight, bias, weights)
    sums = jax.jit(fused)(*args)  # compiled: run op by op, the chunk loop costs more than the compile
    for ours, ref in zip(sums, plain(*args)):
        assert_close(ours, ref)
    assert float(sums[1]) >= 2 * B  # the rows set up to be correct count
    assert (float(sums[2]) > 0) == bool(z_loss)

    def objective(f):  # both outputs with distinct cotangents; accuracy's only reaches the row weights
        return lambda *a: 2.5 * f(*a)[0] - 3.0 * f(*a)[1]
    argnums = (0, 1, 3) if bias is None else (0, 1, 2, 3)
    ours = jax.jit(jax.grad(objective(fused), argnums))(*args)
    ref = jax.grad(objective(plain), argnums)(*args)
    for g_ours, g_ref in zip(ours, ref):
        assert g_ours.shape == g_ref.shape and g_ours.dtype == g_ref.dtype
        assert_close(g_ours, g_ref)


def test_accuracy_has_no_gradient_and_zero_weight_rows_none():
    h, weight, _, labels, weights = problem(True)
    labels = with_correct_rows(labels, logits_of(h, weight, True))

    def fused(h, w):
        return head_xent(h, w, labels, weights, tied=True, chunk_rows=7, shards=1)
    dh, dw = jax.grad(lambda h, w: fused(h, w)[1], (0, 1))(h, weight)
    assert not np.any(np.asarray(dh)) and not np.any(np.asarray(dw))
    dh = jax.grad(lambda h: fused(h, weight)[0])(h)
    assert not np.any(np.asarray(dh)[np.asarray(weights) == 0])


def test_chunking_covers_positions_with_little_padding():
    for rows, positions in ((1, 1), (3, 11), (8, 127), (32, 127), (8, 29), (32, 20)):
        for chunk_rows, shards in ((1, 1), (64, 1), (256, 1), (256, 8)):
            n, c = chunking(rows, positions, chunk_rows, shards)
            assert n * c >= positions and n * c - positions < n
            assert c == 1 or -(-rows // shards) * c <= chunk_rows
    assert chunking(8, 127, 256) == (4, 32)  # the CPU benchmark's chunk of 8 rows: 4 x 256 rows


def test_bfloat16_matmuls_keep_dtypes_and_stay_close():
    h, weight, _, labels, weights = problem(True)
    h16 = h.astype(jnp.bfloat16)

    def fused(h, w):
        return head_xent(h, w, labels, weights, tied=True, dtype=jnp.bfloat16, chunk_rows=7, shards=1)[0]
    loss, (dh, dw) = jax.value_and_grad(fused, (0, 1))(h16, weight)
    assert dh.dtype == jnp.bfloat16 and dw.dtype == jnp.float32
    ref_loss, (ref_dh, ref_dw) = jax.value_and_grad(
        lambda h, w: plain_sums(logits_of(h, w, True), labels, weights)[0], (0, 1))(h16.astype(jnp.float32), weight)
    assert_close(loss, ref_loss, 2e-2)
    assert_close(dh.astype(jnp.float32), ref_dh, 5e-2)
    assert_close(dw, ref_dw, 5e-2)


CONFIGS = {
    "gpt2-tied": lambda: transformers.GPT2Config(vocab_size=61, n_embd=16, n_layer=1, n_head=2, n_positions=16),
    "gpt2-untied": lambda: transformers.GPT2Config(vocab_size=61, n_embd=16, n_layer=1, n_head=2, n_positions=16,
                                                   tie_word_embeddings=False),
    "opt-projected": lambda: transformers.OPTConfig(vocab_size=61, hidden_size=16, num_hidden_layers=1,
                                                    num_attention_heads=2, ffn_dim=24, max_position_embeddings=16,
                                                    word_embed_proj_dim=8),
    "llama-untied": lambda: transformers.LlamaConfig(vocab_size=61, hidden_size=16, num_hidden_layers=1,
                                                     num_attention_heads=2, intermediate_size=24,
                                                     max_position_embeddings=16),
    "t5-original": lambda: transformers.T5Config(vocab_size=61, d_model=16, d_kv=8, d_ff=24, num_layers=1,
                                                 num_heads=2, feed_forward_proj="relu", tie_word_embeddings=True,
                                                 decoder_start_token_id=0),
    "t5-v1_1": lambda: transformers.T5Config(vocab_size=61, d_model=16, d_kv=8, d_ff=24, num_layers=1, num_heads=2,
                                             feed_forward_proj="gated-gelu", tie_word_embeddings=False,
                                             decoder_start_token_id=0),
    "roberta": lambda: transformers.RobertaConfig(vocab_size=61, hidden_size=16, num_hidden_layers=1,
                                                  num_attention_heads=2, intermediate_size=24,
                                                  max_position_embeddings=18),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_hidden_rows_and_head_give_the_logits(name):
    """model(..., hidden=True) and model.head() are exactly what the logits path multiplies."""
    config = CONFIGS[name]()
    graphdef, params = models.split_model(models.create_model(config, seed=1))
    params = jax.tree.map(lambda x: x + 0.05 * jnp.sin(jnp.arange(x.size).reshape(x.shape)), params)  # nonzero biases
    ids = jnp.asarray(np.random.default_rng(0).integers(3, 61, (2, 7)), jnp.int32)
    if name.startswith("t5"):
        args, kwargs = (ids, jnp.ones_like(ids), ids[:, :5]), {}
    elif name == "roberta":
        args, kwargs = (ids, jnp.ones_like(ids)), {"masked_positions_BP": jnp.asarray([[1, 4], [0, 6]])}
    else:
        args, kwargs = (ids,), {}
    logits = models.apply_model(graphdef, params, *args, **kwargs)
    h, head = models.apply_hidden(graphdef, params, *args, **kwargs)
    ours = lm_logits(h.reshape(-1, h.shape[-1]), head.weight, head.tied, head.dtype)
    ours = ours + (0.0 if head.bias is None else head.bias)
    assert_close(ours.reshape(logits.shape), logits)


def plain_objective(graphdef, task):
    """The objectives as they were before the fused head: logits, then optax."""
    def loss_sums(params, batch, key):
        if task == "clm":
            ids = batch["input_ids"]
            logits = models.apply_model(graphdef, params, ids, dropout_key=key)[:, :-1]
            labels, weights = ids[:, 1:], batch["label_weights"]
        elif task == "t5":
            logits = models.apply_model(graphdef, params, batch["input_ids"], batch["attention_mask"],
                                        batch["decoder_input_ids"], dropout_key=key)
            labels, weights = batch["labels"], batch["label_weights"]
        else:
            logits = models.apply_model(graphdef, params, batch["input_ids"], batch["attention_mask"],
                                        masked_positions_BP=batch["masked_positions"], dropout_key=key)
            labels, weights = batch["masked_labels"], batch["masked_weights"]
        loss, accuracy, _ = plain_sums(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), weights.reshape(-1))
        return {"loss_sum": loss, "accuracy_sum": accuracy, "weight_sum": weights.sum()}
    return loss_sums


@pytest.mark.parametrize("task", ["clm", "t5", "mlm"])
def test_objectives_match_logits_and_optax(task):
    """Each objective's sums and parameter gradients (dropout on) against the unfused computation."""
    rng = np.random.default_rng(0)
    if task == "clm":
        config = CONFIGS["gpt2-tied"]()
        graphdef, params = models.split_model(models.create_model(config, seed=0))
        objective = clm_objective(graphdef, config, params, 16, pad_id=0)
        batch = collate_blocks(rng.integers(3, 61, (3, 16)).astype(np.int32))
        batch["label_weights"][2] = 0.0  # an evaluation padding row
    elif task == "t5":
        config = CONFIGS["t5-original"]()  # tied and scaled: the trickiest head
        graphdef, params = models.split_model(models.create_model(config, seed=0))
        corruptor = SpanCorruptor(inputs_length=16, noise_density=0.15, mean_noise_span_length=3.0,
                                  eos_token_id=1, pad_token_id=0, first_sentinel_id=60)
        objective = span_objective(graphdef, config, corruptor)
        batch = corruptor(rng.integers(3, 50, (3, corruptor.raw_length)).astype(np.int32), np.random.default_rng(1))
    else:
        config = CONFIGS["roberta"]()
        graphdef, params = models.split_model(models.create_model(config, seed=0))
        masker = MLMMasker(seq_len=16, vocab_size=61, mask_token_id=4, pad_token_id=1,
                           special_token_ids=[0, 1, 2, 3, 4], mlm_probability=0.3)
        objective = mlm_objective(graphdef, config, masker, 16)
        batch = masker(rng.integers(5, 61, (3, 16)).astype(np.int32), np.random.default_rng(1))
    batch = {k: jnp.asarray(v) for k, v in batch.items()}
    key = jax.random.PRNGKey(3)
    plain = plain_objective(graphdef, task)

    def grads(loss_sums):
        return jax.value_and_grad(lambda p: loss_sums(p, batch, key)["loss_sum"])(params)[1]

    ours, ref = jax.jit(objective.loss_sums)(params, batch, key), jax.jit(plain)(params, batch, key)
    for k in ref:
        assert_close(ours[k], ref[k])
    grads = jax.jit(grads, static_argnums=0)
    for g_ours, g_ref in zip(jax.tree.leaves(grads(objective.loss_sums)), jax.tree.leaves(grads(plain))):
        assert_close(g_ours, g_ref, 2e-5)


def test_accelerator_chunks_bound_the_logits_of_long_sequences():
    # GPT-2 on an accelerator: 32 rows x 1024 positions x 50257 would be 6.6 GB of float32 logits at once
    rows = default_chunk_rows(50257, platform="gpu")
    n, positions = chunking(32, 1024, rows, shards=1)
    assert n > 1 and 32 * positions * 50257 * 4 <= 300 * 2 ** 20
    assert default_chunk_rows(50257, platform="cpu") == 256
    assert default_chunk_rows(1000, platform="tpu") >= 1024  # a small vocabulary still gets big matmuls
