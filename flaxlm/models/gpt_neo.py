"""GPT-Neo: a pre-LayerNorm decoder with learned positions, global and local (sliding-window) attention layers
in the pattern config.attention_types gives, unscaled attention scores, and the LM head tied to the token embeddings.

Configured by a transformers GPTNeoConfig; the parameters map 1:1 to GPTNeoForCausalLM's: transformer.wte / wpe ->
embed / position, h.{i}.ln_1 / ln_2 -> attn_norm / mlp_norm, attn.attention.{q,k,v}_proj (no bias) and out_proj ->
attn.q / k / v / out, mlp.c_fc / c_proj (torch Linears) -> fc_in / fc_out, ln_f -> final_norm. A local layer's
query sees the window_size keys up to its own (transformers' mask: 0 <= query - key < window_size). The scores
are not scaled (scale 1) and, as transformers computes them, accumulate in float32. The decoder-only interface of
every causal-LM family is flaxlm.models.decoder's. Below the model: its Hugging Face tensor names, its presets and
its Family.
"""
from flax import nnx

from flaxlm.errors import UserError
from flaxlm.models import kv_cache
from flaxlm.models.decoder import CausalLM
from flaxlm.models.family import Family, add_linear, add_norm, config_ties, drop_tied_head, with_prefix
from flaxlm.models.gpt2 import GPT2LMHeadModel
from flaxlm.models.layer_stack import Execution
from flaxlm.models.layers import LayerNorm, activation, attention, compute_dtype, dense, dropout, embed, fold_key
from flaxlm.models.llama import fused_dense

ATTENTION_TYPES = ("global", "local")


def attention_layers(config):
    """Each layer's attention type ("global" or "local"), from config.attention_types [[[types...], repeats], ...]
    as transformers expands it; UserError for an unknown type or a pattern that does not cover the layers."""
    layers = [kind for types, repeats in config.attention_types for _ in range(repeats) for kind in types]
    unknown = sorted(set(layers) - set(ATTENTION_TYPES))
    if unknown:
        raise UserError(f"unknown attention type(s) {', '.join(map(repr, unknown))} in config.json's attention_types; "
                        f"use {' / '.join(ATTENTION_TYPES)}")
    if len(layers) != config.num_layers:
        raise UserError(f"attention_types gives {len(layers)} layers but num_layers is {config.num_layers}; "
                        f"fix config.json")
    return layers


class Attention(nnx.Module):
    def __init__(self, config, window, dtype, rngs, execution):
        D, std = config.hidden_size, config.initializer_range
        self.q, self.k, self.v = (dense(D, D, dtype, std, rngs, use_bias=False) for _ in range(3))
        self.out = dense(D, D, dtype, std, rngs)
        self.num_heads = config.num_heads
        self.window = window  # None: a global layer
        self.dropout_rate = config.attention_dropout
        self.implementation = execution.attention_implementation

    def __call__(self, x_BTD, mask_BL, key, kv=None, index=None, visible_BTS=None):
        (B, T, D), N = x_BTD.shape, self.num_heads
        q_MD, k_MD, v_MD = fused_dense(x_BTD.reshape(B * T, D), self.q, self.k, self.v)
        q_BTNH, k_BTNH, v_BTNH = (t.reshape(B, T, N, D // N) for t in (q_MD, k_MD, v_MD))
        if kv is None:  # GPT-Neo does not scale the scores
            o_BTNH = attention(q_BTNH, k_BTNH, v_BTNH, mask_BL, causal=True, scale=1.0, window=self.window,
                               dropout_rate=self.dropout_rate, dropout_key=key, implementation=self.implementation)
        else:
            o_BTNH, kv = kv_cache.attend(q_BTNH, kv, k_BTNH, v_BTNH, index, visible_BTS, scale=1.0,
                                         window=self.window)
        return self.out(o_BTNH.reshape(B * T, D)), kv


class Block(nnx.Module):
    def __init__(self, config, window, dtype, rngs, execution):
        D, std, eps = config.hidden_size, config.initializer_range, config.layer_norm_epsilon
        F = config.intermediate_size or 4 * D
        self.attn_norm = LayerNorm(D, eps, rngs)
        self.attn = Attention(config, window, dtype, rngs, execution)
        self.mlp_norm = LayerNorm(D, eps, rngs)
        self.fc_in = dense(D, F, dtype, std, rngs)
        self.fc_out = dense(F, D, dtype, std, rngs)
        self.act = config.activation_function
        self.dropout_rate = config.resid_dropout

    def __call__(self, x_BTD, mask_BL, key, kv=None, index=None, visible_BTS=None):
        B, T, D = x_BTD.shape
        a_MD, kv = self.attn(self.attn_norm(x_BTD), mask_BL, fold_key(key, 0), kv, index, visible_BTS)
        x_MD = x_BTD.reshape(B * T, D) + dropout(a_MD, self.dropout_rate, fold_key(key, 1))
        h_MD = self.fc_out(activation(self.act)(self.fc_in(self.mlp_norm(x_MD))))
        return (x_MD + dropout(h_MD, self.dropout_rate, fold_key(key, 2))).reshape(B, T, D), kv


class GPTNeoForCausalLM(CausalLM):
    """GPT-Neo with its LM head (tied to wte unless config.tie_word_embeddings is false); execution: how the
    layers run (flaxlm.models.layer_stack.Execution; default a plain loop; --scan_layers needs all layers of one
    attention type)."""

    def __init__(self, config, *, dtype="float32", rngs, execution=None):
        D, N = config.hidden_size, config.num_heads
        if D % N:
            raise UserError(f"hidden_size {D} is not a multiple of num_heads {N}; fix config.json")
        kinds = attention_layers(config)
        if "local" in kinds and config.window_size < 1:
            raise UserError(f"window_size {config.window_size} of the local attention layers must be at least 1")
        activation(config.activation_function)
        self.dtype = compute_dtype(dtype)
        std = config.initializer_range
        Vp = self.vocab_rows(config, execution)  # config.vocab_size, or more with --pad_vocab_multiple
        self.embed = embed(Vp, D, std, rngs, drawn=config.vocab_size)
        self.position = embed(config.max_position_embeddings, D, std, rngs)
        self.execution = execution or Execution()
        self.layers = nnx.List([Block(config, config.window_size if kind == "local" else None, self.dtype, rngs,
                                      self.execution) for kind in kinds])
        self.final_norm = LayerNorm(D, config.layer_norm_epsilon, rngs)
        self.tied = config_ties(config)
        if not self.tied:
            self.lm_head = dense(D, Vp, self.dtype, std, rngs, use_bias=False, drawn=config.vocab_size)
        self.dropout_rate = config.embed_dropout
        self.kv_heads, self.head_dim = N, D // N
        self.max_positions = config.max_position_embeddings

    embed_input = GPT2LMHeadModel.embed_input  # token + learned position embeddings, dropped out, as GPT-2's


def tensor_names(config):
    """Tensor names of GPTNeoForCausalLM -> our paths (lm_head.weight only when untied)."""
    names = [("transformer.wte.weight", ("embed", "embedding"), "copy"),
             ("transformer.wpe.weight", ("position", "embedding"), "copy")]
    for i in range(config.num_layers):
        hf, ours = f"transformer.h.{i}.", ("layers", str(i))
        add_norm(names, f"{hf}ln_1", (*ours, "attn_norm"))
        for proj, our in (("q_proj", "q"), ("k_proj", "k"), ("v_proj", "v")):
            add_linear(names, f"{hf}attn.attention.{proj}", (*ours, "attn", our), bias=False)
        add_linear(names, f"{hf}attn.attention.out_proj", (*ours, "attn", "out"))
        add_norm(names, f"{hf}ln_2", (*ours, "mlp_norm"))
        add_linear(names, f"{hf}mlp.c_fc", (*ours, "fc_in"))
        add_linear(names, f"{hf}mlp.c_proj", (*ours, "fc_out"))
    add_norm(names, "transformer.ln_f", ("final_norm",))
    if not config_ties(config):
        add_linear(names, "lm_head", ("lm_head",), bias=False)
    return names


def normalize(config, tensors, notes):
    """Accept a bare GPTNeoModel checkpoint (no 'transformer.' prefix), drop the causal-mask buffers older
    transformers saved (attn.attention.bias / masked_bias), and a tied lm_head.weight (checked equal to wte)."""
    out = with_prefix(tensors, "transformer.", ("wte", "wpe", "h", "ln_f"),
                      buffers=(".attn.attention.bias", ".attn.attention.masked_bias"))
    return drop_tied_head(config, out, "lm_head.weight", "transformer.wte.weight")


# EleutherAI/gpt-neo-*: global and local layers alternating, windows of 256; gpt_neo-tiny (window 16) is for tests
# and the CPU demo.
_GPT_NEO = dict(model_type="gpt_neo", vocab_size=50257, max_position_embeddings=2048, window_size=256,
                activation_function="gelu_new", resid_dropout=0.0, embed_dropout=0.0, attention_dropout=0.0,
                layer_norm_epsilon=1e-5, initializer_range=0.02, bos_token_id=50256, eos_token_id=50256)


def _shape(width, layers, heads):
    return dict(hidden_size=width, num_layers=layers, num_heads=heads,
                attention_types=[[["global", "local"], layers // 2]])


PRESETS = {
    "gpt-neo-125m": {**_GPT_NEO, **_shape(768, 12, 12)},
    "gpt-neo-1.3b": {**_GPT_NEO, **_shape(2048, 24, 16)},
    "gpt_neo-tiny": {**_GPT_NEO, **_shape(64, 2, 4), "vocab_size": 1024, "max_position_embeddings": 256,
                     "window_size": 16, "bos_token_id": 1023, "eos_token_id": 1023},  # <|endoftext|> last, as GPT-2's
}

GPT_NEO = Family(model_type="gpt_neo", name="GPT-Neo", model=GPTNeoForCausalLM, tensor_names=tensor_names,
                 normalize=normalize, architecture="GPTNeoForCausalLM", presets=PRESETS, script="run_clm_flax.py",
                 max_length=lambda config: config.max_position_embeddings)
