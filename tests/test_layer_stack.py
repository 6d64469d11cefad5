"""Layers under jax.lax.scan and rematerialized (flaxlm.models.layer_stack): the loss and every gradient equal
the plain loop's for each family, with dropout on and off; the parameters keep their per-layer layout; the
flags reach the model; and the attention-kernel choice fails clearly where it cannot run."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import transformers

from flaxlm import models
from flaxlm.config.options import ModelArgs
from flaxlm.config.cli import parse_args
from flaxlm.errors import UserError
from flaxlm.models import Execution, layer_stack
from flaxlm.training.pipeline import load_model, model_execution

B, L, T, V = 2, 12, 5, 64
IDS_BL = np.random.default_rng(0).integers(3, V, (B, L)).astype(np.int32)
MASK_BL = np.ones((B, L), np.int32)
MASK_BL[1, 9:] = 0  # row 1 padded
MASKED_BP = np.array([[1, 4, 7], [0, 2, 8]], np.int32)

CONFIGS = {  # 2 layers (3 for RoBERTa, whose last runs apart), dropout 0.1 everywhere it applies
    "roberta": transformers.RobertaConfig(vocab_size=V, hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
                                          intermediate_size=24, max_position_embeddings=L + 2, pad_token_id=1),
    "t5": transformers.T5Config(vocab_size=V, d_model=16, d_kv=8, d_ff=24, num_layers=2, num_decoder_layers=2,
                                num_heads=2, feed_forward_proj="gated-gelu", decoder_start_token_id=0),
    "gpt2": transformers.GPT2Config(vocab_size=V, n_embd=16, n_layer=2, n_head=2, n_inner=24, n_positions=L),
    "opt": transformers.OPTConfig(vocab_size=V, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                  ffn_dim=24, max_position_embeddings=L, word_embed_proj_dim=8, dropout=0.1,
                                  attention_dropout=0.1, pad_token_id=1),
    "llama": transformers.LlamaConfig(vocab_size=V, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=24, attention_dropout=0.1,
                                      max_position_embeddings=L),
    # 3 layers: global, local, global (window 4); its first layer runs apart, a local and a global one scanned
    "modernbert": transformers.ModernBertConfig(
        vocab_size=V, hidden_size=16, num_hidden_layers=3, num_attention_heads=2, intermediate_size=24,
        local_attention=4, global_attn_every_n_layers=2, max_position_embeddings=L, embedding_dropout=0.1, attention_dropout=0.1, mlp_dropout=0.1,
        pad_token_id=1, bos_token_id=0, eos_token_id=2, cls_token_id=0, sep_token_id=2),
    # 5 layers: sliding, full, sliding, full, sliding (window 4), soft-capped: two local/global pairs scanned (the
    # scan's step is a pair), the fifth layer after them
    "gemma2": transformers.Gemma2Config(vocab_size=V, hidden_size=16, num_hidden_layers=5, num_attention_heads=2,
                                        num_key_value_heads=1, head_dim=8, intermediate_size=24, sliding_window=4,
                                        query_pre_attn_scalar=8, attn_logit_softcapping=5.0,
                                        final_logit_softcapping=3.0, attention_dropout=0.1, max_position_embeddings=L),
}
def call(model, family, dropout_key):
    """float32 logits of the family's training call (the masked-LM encoders: at the masked positions only)."""
    if family in ("roberta", "modernbert"):
        return model(IDS_BL, MASK_BL, masked_positions_BP=MASKED_BP, dropout_key=dropout_key)
    if family == "t5":
        return model(IDS_BL, MASK_BL, IDS_BL[:, :T], dropout_key=dropout_key)
    return model(IDS_BL, MASK_BL, dropout_key=dropout_key)


def randomized(params, std=0.2):
    """params + normal(std) noise, the same every call: activations and gradients far from zero everywhere
    (a fresh init's are small enough for an absolute tolerance to hide a wrong gradient)."""
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(3), len(leaves))
    return jax.tree.unflatten(treedef, [x + std * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])


@functools.lru_cache(maxsize=None)
def losses_and_grads(family, execution=None):
    """((loss, grads) with dropout, (loss, grads) without) and the jaxpr of the dropout loss, from one compile
    (at XLA's lowest optimization level: what is checked here is the math, and compiling is most of the time)."""
    graphdef, params = models.split_model(models.create_model(CONFIGS[family], execution=execution))
    params = randomized(params)

    def loss(params, dropout_key):  # reaches every logit unevenly: each parameter gets a distinct gradient
        logits = call(models.merge_model(graphdef, params), family, dropout_key)
        return jnp.mean(jnp.sin(3.0 * logits) + logits ** 2)

    def both(params):
        return jax.value_and_grad(loss)(params, jax.random.key(7)), jax.value_and_grad(loss)(params, None)
    step = jax.jit(both).lower(params).compile(compiler_options={"xla_backend_optimization_level": 0})
    return step(params), str(jax.make_jaxpr(loss)(params, jax.random.key(7)))


def assert_same_as_the_loop(family, execution):
    (with_dropout, without), _ = losses_and_grads(family)
    assert not np.isclose(with_dropout[0], without[0], rtol=1e-3)  # the dropout key does reach the layers
    got, jaxpr = losses_and_grads(family, execution)
    for (loss, grads), (got_loss, got_grads), mode in zip((with_dropout, without), got, ("dropout", "eval")):
        np.testing.assert_allclose(got_loss, loss, rtol=1e-5, err_msg=f"{execution} {mode}")
        assert jax.tree.structure(got_grads) == jax.tree.structure(grads)
        for (path, g), got_g in zip(jax.tree_util.tree_leaves_with_path(grads), jax.tree.leaves(got_grads)):
            np.testing.assert_allclose(got_g, g, rtol=1e-5, atol=1e-6, err_msg=f"{execution} {mode} {path}")
    assert ("scan" in jaxpr) == execution.scan, execution  # the transformation is really there
    assert ("remat" in jaxpr) == (execution.remat != "none"), execution


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_scan_equals_the_loop(family):
    assert_same_as_the_loop(family, Execution(scan=True))


# Remat wraps each layer's call the same way in every family (flaxlm.models.layer_stack): checked on the families whose
# layers the stack runs in other ways (ModernBERT's first layer apart, Gemma 2's local/global pairs, T5's two
# stacks), RoBERTa's under every policy below. GPT-2, OPT and Llama, one plain layer after another, took 5-9 s each.
@pytest.mark.parametrize("family", ["gemma2", "modernbert", "t5"])
def test_full_remat_equals_the_loop(family):
    assert_same_as_the_loop(family, Execution(remat="full"))


@pytest.mark.parametrize("execution", [Execution(scan=True, remat="full"), Execution(scan=True, remat="dots_saveable"),
                                       Execution(remat="dots_with_no_batch_dims_saveable")],
                         ids=lambda e: f"{'scan' if e.scan else 'loop'}-{e.remat}")
def test_each_remat_policy_equals_the_loop(execution):
    """Every policy, on the loop and under scan, on RoBERTa (a scanned part, then its last layer apart)."""
    assert_same_as_the_loop("roberta", execution)


def test_params_keep_their_per_layer_layout():
    for family, config in CONFIGS.items():
        _, loop = models.split_model(models.create_model(config))
        _, scan = models.split_model(models.create_model(config, execution=Execution(scan=True, remat="full")))
        assert jax.tree.structure(scan) == jax.tree.structure(loop), family
        assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(scan), jax.tree.leaves(loop))), family
        layers = loop["decoder" if family == "t5" else "layers"]
        layers = layers["layers"] if family == "t5" else layers
        assert sorted(layers) == [str(i) for i in range(len(layers))], family


def test_the_kv_cache_path_stays_a_loop():
    """Generation (the KV cache) runs the layers one by one even in a scanned model; the scanned model's
    training call is the scan."""
    config = CONFIGS["llama"]
    model = models.create_model(config, execution=Execution(scan=True))
    cached = jax.make_jaxpr(lambda: model(IDS_BL, MASK_BL, cache=model.init_cache(B, L)))()
    assert "scan" not in str(cached) and "scan" in str(jax.make_jaxpr(lambda: model(IDS_BL, MASK_BL))())


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_bfloat16_scans(family):
    """The scan carry keeps the compute dtype (a layer that changed it would not trace)."""
    model = models.create_model(CONFIGS[family], dtype="bfloat16", execution=Execution(scan=True, remat="full"))
    out = jax.eval_shape(lambda: call(model, family, jax.random.key(0)))
    assert out.dtype == jnp.float32 and out.shape[:1] == (B,)


def test_different_layers_cannot_be_scanned():
    config = transformers.GPT2Config(vocab_size=V, n_embd=16, n_layer=2, n_head=2, n_positions=L,
                                     scale_attn_by_inverse_layer_idx=True)
    model = models.create_model(config, execution=Execution(scan=True))
    with pytest.raises(UserError, match="--scan_layers needs layers that repeat"):
        jax.eval_shape(lambda: model(IDS_BL))
    model = models.create_model(config, execution=Execution(remat="full"))
    jax.eval_shape(lambda: model(IDS_BL))  # remat alone is fine


def test_flags_choose_the_execution():
    (model_args,) = parse_args(ModelArgs, argv=[])
    assert model_execution(model_args) == Execution()  # default: today's loop
    (model_args,) = parse_args(ModelArgs, argv=["--scan_layers", "--remat_policy", "dots_saveable",
                                                "--attention_implementation", "xla"])
    assert model_execution(model_args) == Execution(scan=True, remat="dots_saveable", attention="xla")
    assert set(layer_stack.REMAT_POLICIES) == {"none", "full", "dots_saveable", "dots_with_no_batch_dims_saveable"}
    with pytest.raises(UserError, match="unknown remat policy 'some'"):
        Execution(remat="some")


# (Gemma 2's soft-capped scores are computed explicitly: no fused attention call to reach)
@pytest.mark.parametrize("family", sorted(set(CONFIGS) - {"gemma2"}))
def test_the_attention_implementation_reaches_every_attention_call(family, monkeypatch):
    seen = []
    real = jax.nn.dot_product_attention

    def recording(*args, implementation=None, **kwargs):
        seen.append(implementation)
        return real(*args, implementation=implementation, **kwargs)
    monkeypatch.setattr(jax.nn, "dot_product_attention", recording)
    for attention, implementation in (("auto", None), ("xla", "xla")):
        seen.clear()
        model = models.create_model(CONFIGS[family], execution=Execution(attention=attention))
        jax.eval_shape(lambda: call(model, family, None))  # eval: no attention dropout, the fused path
        assert seen and set(seen) == {implementation}, (attention, seen)


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="checks the message off NVIDIA GPUs")
def test_cudnn_attention_off_gpu_is_one_clear_error(tmp_path):
    CONFIGS["gpt2"].save_pretrained(tmp_path)
    (model_args,) = parse_args(ModelArgs, argv=["--config_name", str(tmp_path), "--dtype", "bfloat16",
                                                "--attention_implementation", "cudnn"])
    with pytest.raises(UserError) as e:  # the scripts' path: flags -> load_model -> create_model
        load_model(model_args, seed=0, script="run_clm_flax.py")
    assert str(e.value) == "--attention_implementation cudnn needs an NVIDIA GPU; use auto or xla"
