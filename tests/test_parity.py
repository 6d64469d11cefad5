"""Every family's tiny models against transformers' PyTorch models: the checks that apply to all of them.

CASES is the table of tiny models (tests/parity.py: Case). A new family adds its cases here, and its own checks,
if it has any, in tests/test_<family>.py. Each check runs on every case (the KV cache on every causal LM, greedy
generation on one case of each causal family):
transformers' checkpoint loads into ours with its logits and loss; ours loads into transformers, cleanly, with the
same parameter count and logits; the tensors we write are named as transformers writes them; loading is strict;
bfloat16 stays close to float32; dropout depends only on its key; the KV cache decodes the full forward's
logits; greedy generation picks transformers' tokens.
"""
import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import transformers

from flaxlm import models
from generation_check import assert_greedy_matches_transformers
from parity import (Case, as_untied, assert_close_at_real, assert_load_fails, assert_losses_match, assert_same_params,
                    batch, hf_logits, hf_tied, jitted, jnp_args, load_ours, random_hf, randomize,
                    saved_keys)


def family(hf_class, inputs, base, variants, **settings):
    """The Cases of one family: its base config fields changed by each variant."""
    return [Case(name, hf_class, inputs, {**base, **changes}, **settings) for name, changes in variants.items()]


BERT = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            max_position_embeddings=64, initializer_range=0.2)
BERT_SETTINGS = dict(std=0.3, bf16_std=0.1, bf16_rel=0.1)
GPT2 = dict(vocab_size=99, n_embd=32, n_layer=2, n_head=4, n_inner=37, n_positions=40, bos_token_id=1,
            eos_token_id=2, pad_token_id=0, resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1)
OPT = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, ffn_dim=37,
           max_position_embeddings=40, dropout=0.1, attention_dropout=0.1, pad_token_id=1)
LLAMA = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
             max_position_embeddings=64, tie_word_embeddings=False, pad_token_id=0, attention_dropout=0.1)
# buckets/max_distance small enough that the lengths of the batch reach the log-spaced and the clipped buckets;
# initializer_factor 0.5 keeps activations moderate so float32 rounding stays far below the 1e-4 tolerance
T5 = dict(vocab_size=99, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_decoder_layers=3, num_heads=4,
          relative_attention_num_buckets=8, relative_attention_max_distance=20, initializer_factor=0.5,
          decoder_start_token_id=0, dropout_rate=0.1)
# DeBERTa: 8 buckets (or 6 relative positions) so that the batch's 12 positions reach the log-spaced / clipped rows
DEBERTA = dict(BERT, relative_attention=True, position_buckets=8, pos_att_type="p2c|c2p", type_vocab_size=0,
               position_biased_input=False)

# 3 layers: global, local, local (every 2: global, local, global); a window of 4 (2 each side) is shorter than the
# batch's rows of 12
MODERNBERT = dict(vocab_size=99, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=24,
                  max_position_embeddings=64, global_attn_every_n_layers=3, local_attention=4, pad_token_id=0,
                  bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2, global_rope_theta=1000.0,
                  local_rope_theta=50.0, embedding_dropout=0.1, attention_dropout=0.1, mlp_dropout=0.1)
MT5 = dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False)  # mT5 and UMT5 as released: T5 v1.1's FFN
# GPT-Neo: a window of 4, shorter than the batch's rows of 20 and the greedy prompts of 7, so that local layers
# train and decode past their window
GPT_NEO = dict(vocab_size=99, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=37,
               max_position_embeddings=40, window_size=4, attention_types=[[["global", "local"], 1]], bos_token_id=1,
               eos_token_id=2, pad_token_id=0, embed_dropout=0.1, attention_dropout=0.1, resid_dropout=0.1)
GPTJ = dict(vocab_size=99, n_embd=32, n_layer=2, n_head=4, n_inner=37, n_positions=40, rotary_dim=4,
            bos_token_id=1, eos_token_id=2, pad_token_id=0, embd_pdrop=0.1, attn_pdrop=0.1, resid_pdrop=0.1,
            tie_word_embeddings=False)
BLOOM = dict(vocab_size=99, hidden_size=32, n_layer=2, n_head=4, bos_token_id=1, eos_token_id=2, pad_token_id=0,
             hidden_dropout=0.1, attention_dropout=0.1)
GEMMA = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             head_dim=8, intermediate_size=37, max_position_embeddings=64, pad_token_id=0, attention_dropout=0.1)
# 3 layers: sliding, full, sliding; a window of 4 is shorter than the batch's rows (20) and the greedy prompts (7).
# Small soft-caps (attention 5, logits 3) so that they bend the scores; query_pre_attn_scalar other than head_dim.
# transformers' Gemma 2 runs its eager attention (it does not support sdpa, which cannot soft-cap).
GEMMA2 = dict(GEMMA, num_hidden_layers=3, sliding_window=4, query_pre_attn_scalar=12, attn_logit_softcapping=5.0,
              final_logit_softcapping=3.0)
# 3 layers: local, local, global (sliding_window_pattern 3); each kind its own RoPE, the global one linearly scaled
GEMMA3 = dict(GEMMA, num_hidden_layers=3, sliding_window=4, query_pre_attn_scalar=12,
              layer_types=["sliding_attention", "sliding_attention", "full_attention"],
              rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 50.0},
                               "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1000.0}})
# sliding windows of 4: shorter than the batch's rows of 20 and the greedy prompts of 7
MISTRAL = dict(LLAMA, num_key_value_heads=2, sliding_window=4)
# Mistral's with every layer's MLP 4 experts of width 16 (intermediate_size), 2 per token, always renormalized
# (Mixtral-8x7B: 8 of 14336, 2 per token)
MIXTRAL = dict(MISTRAL, intermediate_size=16, num_local_experts=4, num_experts_per_tok=2)
QWEN2 = dict(LLAMA, num_key_value_heads=2)
QWEN3 = dict(LLAMA, num_key_value_heads=2, head_dim=8)
# 4 experts of width 16, 2 per token (Qwen3-30B-A3B: 128 of 768, 8 per token, renormalized)
QWEN3_MOE = dict(QWEN3, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, norm_topk_prob=True)
# 4 routed experts of width 16, 2 per token, not renormalized, and a shared expert of width 24 (Qwen1.5-MoE-A2.7B: 60
# of 1408, 4 per token, a shared one of 5632)
QWEN2_MOE = dict(QWEN2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                 shared_expert_intermediate_size=24)
# every layer 4 experts of width 16 (intermediate_size), 2 per token, not renormalized (OLMoE-1B-7B: 64 of 1024,
# 8 per token); its q/k RMSNorms span all the heads
OLMOE = dict(LLAMA, intermediate_size=16, num_experts=4, num_experts_per_tok=2, norm_topk_prob=False,
             bos_token_id=1, eos_token_id=2)

CASES = [
    *family(transformers.BertForMaskedLM, "encoder", BERT, {
        "gelu": {}, "gelu_new": dict(hidden_act="gelu_new"), "relu": dict(hidden_act="relu")}, **BERT_SETTINGS),
    *family(transformers.RobertaForMaskedLM, "encoder", {**BERT, "max_position_embeddings": 66}, {
        "gelu": {}, "relu": dict(hidden_act="relu")}, **BERT_SETTINGS),
    # RoBERTa's architecture under other model types and class names: one case each
    *family(transformers.XLMRobertaForMaskedLM, "encoder", {**BERT, "max_position_embeddings": 66}, {"gelu": {}},
            **BERT_SETTINGS),
    *family(transformers.CamembertForMaskedLM, "encoder", {**BERT, "max_position_embeddings": 66}, {"gelu": {}},
            **BERT_SETTINGS),
    # bfloat16 from the initialization, within 0.05
    *family(transformers.GPT2LMHeadModel, "causal", GPT2, {
        "tied": {}, "untied": dict(tie_word_embeddings=False),
        "inverse-layer-scale-gelu": dict(scale_attn_by_inverse_layer_idx=True, activation_function="gelu"),
    }, bf16_std=0.0, bf16_rel=0.0),
    *family(transformers.OPTForCausalLM, "causal", OPT, {
        "pre_ln": {},  # opt-125m-like
        "post_ln_projected": dict(do_layer_norm_before=False, word_embed_proj_dim=16),  # opt-350m-like
        "bias_free_untied": dict(enable_bias=False, layer_norm_elementwise_affine=False, tie_word_embeddings=False),
        "projected_no_final_norm": dict(word_embed_proj_dim=24, _remove_final_layer_norm=True),
    }, std=0.2),
    *family(transformers.LlamaForCausalLM, "causal", LLAMA, {
        "gqa-untied": dict(num_key_value_heads=2),
        "mha-tied": dict(num_key_value_heads=4, tie_word_embeddings=True, rms_norm_eps=1e-5),
        "mqa-head_dim-bias": dict(num_key_value_heads=1, head_dim=12, attention_bias=True, mlp_bias=True),
    }),  # every RoPE type against transformers' logits: tests/test_rope.py
    *family(transformers.MistralForCausalLM, "causal", MISTRAL, {
        "window4-untied": {},
        "no-window-tied": dict(sliding_window=None, tie_word_embeddings=True, num_key_value_heads=4)}),
    *family(transformers.MixtralForCausalLM, "causal", MIXTRAL, {
        "window4-untied": {},
        # no window (as released), 6 experts, 3 per token, head_dim 12 (not hidden_size / heads), a tied head
        "no-window-top3-head_dim12-tied": dict(sliding_window=None, num_local_experts=6, num_experts_per_tok=3,
                                               head_dim=12, tie_word_embeddings=True)}),
    *family(transformers.Qwen2ForCausalLM, "causal", QWEN2, {
        "tied": dict(tie_word_embeddings=True),  # Qwen2.5-0.5B / 1.5B
        "untied": {},  # Qwen2.5-7B
        # transformers' layer_types from use_sliding_window: layer 0 full, layer 1 a window of 4
        "window4-layer1": dict(use_sliding_window=True, sliding_window=4, max_window_layers=1)}),
    *family(transformers.Qwen2MoeForCausalLM, "causal", QWEN2_MOE, {
        "experts4-top2-untied": {},
        # layer 0 a dense MLP (mlp_only_layers); transformers' layer_types from use_sliding_window: the even layers
        # below max_window_layers (0 and 2) a window of 4; no q/k/v biases; 6 experts, 3 per token, renormalized
        "dense0-window4-nobias-top3-normalized-tied": dict(
            num_hidden_layers=3, mlp_only_layers=[0], use_sliding_window=True, sliding_window=4, max_window_layers=3,
            qkv_bias=False, num_experts=6, num_experts_per_tok=3, norm_topk_prob=True, tie_word_embeddings=True)}),
    *family(transformers.Qwen3ForCausalLM, "causal", QWEN3, {
        "head_dim12-untied": dict(head_dim=12),  # head_dim != hidden_size / heads, as Qwen3-0.6B's
        "tied-bias-window4-layer1": dict(tie_word_embeddings=True, attention_bias=True, use_sliding_window=True,
                                         sliding_window=4, max_window_layers=1)}),
    *family(transformers.Qwen3MoeForCausalLM, "causal", QWEN3_MOE, {
        "experts4-top2-untied": {},
        # layer 0 a dense MLP (mlp_only_layers), 6 experts, 3 per token, the probabilities not renormalized
        "dense-layer0-top3-unnormalized-tied": dict(mlp_only_layers=[0], num_experts=6, num_experts_per_tok=3,
                                                    norm_topk_prob=False, tie_word_embeddings=True)}),
    *family(transformers.OlmoeForCausalLM, "causal", OLMOE, {
        "experts4-top2-untied": {},  # allenai/OLMoE-1B-7B-0924's settings, smaller
        # clip_qkv 0.5 clips a share of q, k (RMS 1 after their norms) and v; grouped keys (k_norm 2 heads wide);
        # 6 experts, 3 per token, renormalized
        "clip-gqa-top3-normalized-tied": dict(clip_qkv=0.5, num_key_value_heads=2, num_experts=6,
                                              num_experts_per_tok=3, norm_topk_prob=True, tie_word_embeddings=True)}),
    # the generator and the discriminator, with embeddings narrower / wider than the layers (projected)
    *family(transformers.ElectraForMaskedLM, "encoder", BERT, {"generator-projected": dict(embedding_size=16)},
            **BERT_SETTINGS),
    *family(transformers.ElectraForPreTraining, "replaced-token", BERT, {
        "discriminator-projected-relu": dict(embedding_size=48, hidden_act="relu")},
        task="replaced_token_detection", **BERT_SETTINGS),
    *family(transformers.DebertaV2ForMaskedLM, "encoder", DEBERTA, {
        "v3": dict(share_att_key=True, norm_rel_ebd="layer_norm"),  # deberta-v3-*
        # deberta-v2-xlarge's convolution, with absolute positions, token types and unshared position projections
        "v2-absolute-conv": dict(position_buckets=-1, max_relative_positions=6, position_biased_input=True,
                                 type_vocab_size=2, hidden_act="relu", conv_kernel_size=3, conv_groups=2,
                                 conv_act="gelu", attention_head_size=8),
    }, **BERT_SETTINGS),
    *family(transformers.T5ForConditionalGeneration, "encoder-decoder", T5, {
        "v1_1": dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False),
        "original": dict(feed_forward_proj="relu", tie_word_embeddings=True),
        "gated-silu-tied": dict(feed_forward_proj="gated-silu", tie_word_embeddings=True, num_decoder_layers=2),
    }),
    *family(transformers.ModernBertForMaskedLM, "encoder", MODERNBERT, {
        "global3-window4": {},  # answerdotai/ModernBERT-*'s settings, smaller
        "biases-untied-relu": dict(global_attn_every_n_layers=2, local_attention=6, attention_bias=True,
                                   mlp_bias=True, norm_bias=True, classifier_bias=True, decoder_bias=False,
                                   tie_word_embeddings=False, hidden_activation="relu")}),
    *family(transformers.MT5ForConditionalGeneration, "encoder-decoder", T5, {"gated-gelu": MT5}),
    *family(transformers.UMT5ForConditionalGeneration, "encoder-decoder", T5, {"gated-gelu": MT5}),
    *family(transformers.GPTNeoForCausalLM, "causal", GPT_NEO, {
        "global-local": {},  # EleutherAI/gpt-neo-*'s pattern
        "local-global-global-untied-relu": dict(num_layers=3, attention_types=[[["local", "global"], 1],
                                                                               [["global"], 1]],
                                                tie_word_embeddings=False, activation_function="relu"),
    }),
    *family(transformers.GPTJForCausalLM, "causal", GPTJ, {
        "partial-rotary": {},  # gpt-j-6b's: rotary on 64 of 256 features per head
        "full-rotary-tied-gelu": dict(rotary_dim=8, tie_word_embeddings=True, activation_function="gelu"),
    }),
    # BLOOM's query_key_value holds each head's q, k, v together ([N, 3, H] output features): a wrong split fails
    # every check here
    *family(transformers.BloomForCausalLM, "causal", BLOOM, {
        "4-heads": {},
        # 6 heads (not a power of two: the extra ALiBi slopes), the norm's output as the residual, untied head
        "6-heads-residual-post-ln-untied": dict(hidden_size=36, n_head=6, tie_word_embeddings=False,
                                                apply_residual_connection_post_layernorm=True),
    }),
    *family(transformers.GemmaForCausalLM, "causal", GEMMA, {
        "gqa-tied": {},  # google/gemma-2b-like: tied, head_dim independent of the width
        "mha-head_dim16-untied-bias": dict(num_key_value_heads=4, head_dim=16, tie_word_embeddings=False,
                                           attention_bias=True)}),
    *family(transformers.Gemma2ForCausalLM, "causal", GEMMA2, {
        "softcap-window4-untied": dict(tie_word_embeddings=False),
        "global-first-uncapped-tied-mqa": dict(
            attn_logit_softcapping=None, final_logit_softcapping=None, num_key_value_heads=1,
            layer_types=["full_attention", "sliding_attention", "sliding_attention"])}),
    *family(transformers.Gemma3ForCausalLM, "causal", GEMMA3, {
        "local-local-global": {},
        # transformers' Gemma 3 ignores attn_logit_softcapping (its attention never receives it); so do we
        "final-softcap-untied-mqa": dict(final_logit_softcapping=3.0, attn_logit_softcapping=1.0,
                                         tie_word_embeddings=False, num_key_value_heads=1, head_dim=16)}),
]
CASE = {str(c): c for c in CASES}
CAUSAL = [c for c in CASES if c.inputs == "causal"]
# greedy generation runs the same loop for every case of a family (the KV cache is checked on each): one case each
# (Gemma's untied cases: a tied tiny Gemma, its embeddings scaled by sqrt(width), repeats its last token)
GREEDY = [CASE["gpt2-tied"], CASE["opt-post_ln_projected"], CASE["llama-gqa-untied"], CASE["mistral-window4-untied"],
          CASE["mixtral-window4-untied"],
          CASE["qwen2-window4-layer1"], CASE["qwen3-head_dim12-untied"], CASE["qwen3_moe-experts4-top2-untied"],
          CASE["olmoe-experts4-top2-untied"], CASE["qwen2_moe-dense0-window4-nobias-top3-normalized-tied"],
          CASE["gpt_neo-global-local"],
          CASE["gptj-partial-rotary"], CASE["bloom-6-heads-residual-post-ln-untied"],
          CASE["gemma-mha-head_dim16-untied-bias"], CASE["gemma2-softcap-window4-untied"],
          CASE["gemma3_text-final-softcap-untied-mqa"]]
AUTO = {"encoder": transformers.AutoModelForMaskedLM, "encoder-decoder": transformers.AutoModelForSeq2SeqLM,
        "causal": transformers.AutoModelForCausalLM, "replaced-token": transformers.AutoModelForPreTraining}
each_case = pytest.mark.parametrize("case", CASES, ids=str)
# the first case of each family: for the checks of what a family's cases share (its dtype handling, its dropout, its
# loading's strictness), where a case's shape options (ties, windows, head sizes) change nothing
FIRST_OF_EACH_FAMILY = list({c.model_type: c for c in reversed(CASES)}.values())[::-1]
each_family = pytest.mark.parametrize("case", FIRST_OF_EACH_FAMILY, ids=str)


@each_case
def test_hf_checkpoint_loads_with_its_logits_and_loss_and_we_write_its_tensors(case, tmp_path):
    """transformers' checkpoint loads into ours with its logits and loss; what we write of it is named and shaped as
    in that checkpoint (a tied head is not saved)."""
    hf = random_hf(case)
    hf.save_pretrained(tmp_path)
    config, model = load_ours(case, tmp_path)
    assert models.family_of(config).tie_word_embeddings(config) == case.tied
    b = batch(case)
    ref = hf_logits(hf, b.hf)
    assert ref.shape == (*b.real_BL.shape, *case.per_position)
    graphdef, params = models.split_model(model)
    forward = jitted(graphdef, params)
    assert_close_at_real(forward(*jnp_args(b)), ref, b.real_BL, case.tol)
    assert_losses_match(case, forward, hf, b)
    written = models.to_hf_state_dict(config, params)
    assert {k: v.shape for k, v in written.items()} == saved_keys(tmp_path)


@each_case
def test_our_checkpoint_loads_in_transformers(case, tmp_path):
    """config.json and the tensors load cleanly into the case's class, with our parameter count, logits and loss;
    and back into ours, the same parameters."""
    config = case.config()
    graphdef, params = models.split_model(models.create_model(config, seed=1, task=case.task))
    params = randomize(params, seed=1, std=case.std)
    models.save_pretrained(tmp_path, config, params)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["architectures"] == [case.hf_class.__name__] and saved["model_type"] == case.model_type
    assert saved["tie_word_embeddings"] == case.tied  # written either way: the default is True in GPT-2, False in Llama
    hf, info = AUTO[case.inputs].from_pretrained(tmp_path, output_loading_info=True)
    hf = as_untied(hf)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")), info
    assert type(hf) is case.hf_class and hf_tied(hf) == case.tied
    assert models.count_params(params) == sum(p.numel() for p in hf.parameters())
    b = batch(case, seed=1)
    apply = jitted(graphdef, params)
    assert_close_at_real(apply(*jnp_args(b)), hf_logits(hf, b.hf), b.real_BL, case.tol)
    assert_losses_match(case, apply, hf, b)
    _, model = load_ours(case, tmp_path)
    assert_same_params(models.split_model(model)[1], params)


@each_family
def test_loading_is_strict(case):
    """A missing tensor (one of layer 1), an unexpected one (that tensor of a layer 9 the config lacks) and one
    of the wrong shape are each a one-line error naming it. Once a family: the check of the names is flaxlm.models.
    hf_io's for every case, and each case's names are test_hf_checkpoint_loads_..._we_write_its_tensors'."""
    config = case.config()
    tensors = models.to_hf_state_dict(config, models.split_model(models.create_model(config, task=case.task))[1])
    name = next(n for n in tensors if ".1." in n)
    missing = {k: v for k, v in tensors.items() if k != name}
    assert_load_fails(config, missing, rf"missing tensor\(s\) {re.escape(name)}", case.task)
    extra = name.replace(".1.", ".9.", 1)
    assert_load_fails(config, {**tensors, extra: tensors[name]}, rf"unexpected tensor\(s\) {re.escape(extra)}",
                      case.task)
    matrix = next(n for n, x in tensors.items() if x.ndim == 2 and ".0." in n)
    rows, cols = tensors[matrix].shape
    assert_load_fails(config, {**tensors, matrix: np.zeros((rows - 1, cols), np.float32)},
                      rf"{re.escape(matrix)} has shape \({rows - 1}, {cols}\) but config.json implies "
                      rf"\({rows}, {cols}\)", case.task)


@each_family
def test_bfloat16_compute_is_close_to_float32(case):
    config = case.config()
    graphdef32, params = models.split_model(models.create_model(config, task=case.task))
    params = randomize(params, std=case.bf16_std)
    graphdef16, params16 = models.split_model(models.create_model(config, dtype="bfloat16", task=case.task))
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves((params, params16)))  # parameters stay float32
    args = jnp_args(batch(case))
    ref = np.asarray(jitted(graphdef32, params)(*args))
    got = jitted(graphdef16, params)(*args)
    assert got.dtype == jnp.float32 and np.isfinite(np.asarray(got)).all()
    err = float(np.abs(np.asarray(got) - ref).max())
    assert err < case.bf16_rel * np.abs(ref).max() + 0.05, err
    if case.inputs == "causal":
        assert models.merge_model(graphdef16, params).init_cache(3, 8)["k"][0].dtype == jnp.bfloat16


@each_family
def test_dropout_depends_only_on_its_key(case):
    graphdef, params = models.split_model(models.create_model(case.config(), task=case.task))
    args = jnp_args(batch(case))
    train = jax.jit(lambda p, key: models.apply_model(graphdef, p, *args, dropout_key=key))
    det = jitted(graphdef, params)(*args)
    a, b, c = (train(params, jax.random.key(k)) for k in (1, 1, 2))
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, det) and not np.allclose(a, c)


@pytest.mark.parametrize("case", CAUSAL, ids=str)
def test_kv_cache_decodes_the_full_forward(case):
    """Prefill 8 tokens, then decode one at a time (row 2's padding runs into the decode steps): the logits at
    real positions are the full forward's."""
    graphdef, params = models.split_model(models.create_model(case.config(), seed=2))
    params = randomize(params, seed=2, std=case.std)
    b = batch(case, seed=2)
    ids, mask, pos = jnp_args(b)
    full = np.asarray(jitted(graphdef, params)(ids, mask, pos))
    step = jax.jit(lambda p, *a, cache: models.apply_model(graphdef, p, *a, cache=cache))
    length = ids.shape[1]
    cache = models.merge_model(graphdef, params).init_cache(ids.shape[0], length + 4)
    logits, cache = step(params, ids[:, :8], mask[:, :8], pos[:, :8], cache=cache)
    out = [logits]
    for t in range(8, length):
        logits, cache = step(params, ids[:, t:t + 1], mask[:, t:t + 1], pos[:, t:t + 1], cache=cache)
        out.append(logits)
    assert int(cache["index"]) == length
    err = float(np.abs(np.concatenate(out, axis=1) - full)[b.real_BL].max())
    assert err < case.cache_tol, err


@pytest.mark.parametrize("case", GREEDY, ids=str)
def test_greedy_generation_picks_the_tokens_of_transformers(case, tmp_path):
    """flaxlm.models.generation (left-padded prompts, KV cache) against transformers' generate, no EOS stop."""
    hf = random_hf(case, seed=3, std=0.3)  # noisier: continuations that are not one repeated token
    hf.save_pretrained(tmp_path)
    tokens = assert_greedy_matches_transformers(hf, tmp_path, [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14]], 6)
    assert len({t for row in tokens for t in row}) > 1  # not a degenerate repeat of one token


def test_every_registered_family_has_cases():
    """A family registered in flaxlm.models.registry is checked here: its cases are in CASES (a causal LM's in
    GREEDY too)."""
    from flaxlm.models.registry import FAMILIES
    assert {c.model_type for c in CASES} == set(FAMILIES) == {c.model_type for c in FIRST_OF_EACH_FAMILY}
    assert {c.model_type for c in GREEDY} == {c.model_type for c in CAUSAL}
