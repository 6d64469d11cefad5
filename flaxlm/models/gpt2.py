"""GPT-2: a pre-LayerNorm decoder with learned positions and the LM head tied to the token embeddings.

Configured by a transformers GPT2Config; the parameters map 1:1 to GPT2LMHeadModel's (Hugging Face keeps
them in Conv1D layout, [in, out], which is our kernel layout). The decoder-only interface of every causal-LM
family is flaxlm.models.decoder's. Below the model: its Hugging Face tensor names, its presets and its Family.
"""
import math

from flax import nnx

from flaxlm.errors import UserError
from flaxlm.models import kv_cache
from flaxlm.models.decoder import CausalLM
from flaxlm.models.family import Family, add_linear, add_norm, drop_tied_head, parts_of_output, with_prefix
from flaxlm.models.layer_stack import Execution
from flaxlm.models.layers import (LayerNorm, activation, attention, compute_dtype, dense, dropout, embed, fold_key,
                                  split_last)


class Attention(nnx.Module):
    def __init__(self, config, layer_idx, dtype, rngs, execution):
        D, std = config.n_embd, config.initializer_range
        self.qkv = dense(D, 3 * D, dtype, std, rngs)  # Hugging Face's c_attn: [q | k | v]
        # Hugging Face scales the residual projections by 1/sqrt(2 * layers) at initialization
        self.out = dense(D, D, dtype, std / math.sqrt(2 * config.n_layer), rngs)
        self.num_heads = config.n_head
        self.dropout_rate = config.attn_pdrop
        self.scale = (D // config.n_head) ** -0.5 if config.scale_attn_weights else 1.0
        if config.scale_attn_by_inverse_layer_idx:
            self.scale /= layer_idx + 1
        self.implementation = execution.attention_implementation

    def __call__(self, x_BTD, mask_BL, key, kv=None, index=None, visible_BTS=None):
        (B, T, D), N = x_BTD.shape, self.num_heads
        q_MD, k_MD, v_MD = split_last(self.qkv(x_BTD.reshape(B * T, D)), (D, D, D))
        q_BTNH, k_BTNH, v_BTNH = (t.reshape(B, T, N, D // N) for t in (q_MD, k_MD, v_MD))
        if kv is None:
            o_BTNH = attention(q_BTNH, k_BTNH, v_BTNH, mask_BL, causal=True, scale=self.scale,
                               dropout_rate=self.dropout_rate, dropout_key=key, implementation=self.implementation)
        else:
            o_BTNH, kv = kv_cache.attend(q_BTNH, kv, k_BTNH, v_BTNH, index, visible_BTS, scale=self.scale)
        return self.out(o_BTNH.reshape(B * T, D)), kv


class Block(nnx.Module):
    def __init__(self, config, layer_idx, dtype, rngs, execution):
        D, std = config.n_embd, config.initializer_range
        F = config.n_inner or 4 * D
        self.attn_norm = LayerNorm(D, config.layer_norm_epsilon, rngs)
        self.attn = Attention(config, layer_idx, dtype, rngs, execution)
        self.mlp_norm = LayerNorm(D, config.layer_norm_epsilon, rngs)
        self.fc_in = dense(D, F, dtype, std, rngs)
        self.fc_out = dense(F, D, dtype, std / math.sqrt(2 * config.n_layer), rngs)
        self.act = config.activation_function
        self.dropout_rate = config.resid_pdrop

    def __call__(self, x_BTD, mask_BL, key, kv=None, index=None, visible_BTS=None):
        B, T, D = x_BTD.shape
        a_MD, kv = self.attn(self.attn_norm(x_BTD), mask_BL, fold_key(key, 0), kv, index, visible_BTS)
        x_MD = x_BTD.reshape(B * T, D) + dropout(a_MD, self.dropout_rate, fold_key(key, 1))
        h_MD = self.fc_out(activation(self.act)(self.fc_in(self.mlp_norm(x_MD))))
        return (x_MD + dropout(h_MD, self.dropout_rate, fold_key(key, 2))).reshape(B, T, D), kv


class GPT2LMHeadModel(CausalLM):
    """GPT-2 with its LM head (tied to wte unless config.tie_word_embeddings is false); execution: how the
    layers run (flaxlm.models.layer_stack.Execution; default a plain loop)."""

    def __init__(self, config, *, dtype="float32", rngs, execution=None):
        if config.n_embd % config.n_head:
            raise UserError(f"n_embd {config.n_embd} is not a multiple of n_head {config.n_head}; fix config.json")
        if getattr(config, "add_cross_attention", False):
            raise UserError("GPT-2 with cross-attention (add_cross_attention) is not supported; set it to false")
        activation(config.activation_function)
        self.dtype = compute_dtype(dtype)
        D, std = config.n_embd, config.initializer_range
        Vp = self.vocab_rows(config, execution)  # config.vocab_size, or more with --pad_vocab_multiple
        self.embed = embed(Vp, D, std, rngs, drawn=config.vocab_size)
        self.position = embed(config.n_positions, D, std, rngs)
        self.execution = execution or Execution()
        self.layers = nnx.List([Block(config, i, self.dtype, rngs, self.execution) for i in range(config.n_layer)])
        self.final_norm = LayerNorm(D, config.layer_norm_epsilon, rngs)
        self.tied = getattr(config, "tie_word_embeddings", True)
        if not self.tied:
            self.lm_head = dense(D, Vp, self.dtype, std, rngs, use_bias=False, drawn=config.vocab_size)
        self.dropout_rate = config.embd_pdrop
        self.kv_heads, self.head_dim = config.n_head, D // config.n_head
        self.max_positions = config.n_positions

    def embed_input(self, input_ids_BL, positions_BL, dropout_key):
        x_BLD = self.embed(input_ids_BL) + self.position(positions_BL)
        return dropout(x_BLD.astype(self.dtype), self.dropout_rate, fold_key(dropout_key, 0))


def tensor_names(config):
    """Tensor names of GPT2LMHeadModel -> our paths. Conv1D weights are [in, out] already."""
    names = [("transformer.wte.weight", ("embed", "embedding"), "copy"),
             ("transformer.wpe.weight", ("position", "embedding"), "copy")]
    for i in range(config.n_layer):
        hf, ours = f"transformer.h.{i}.", ("layers", str(i))
        add_norm(names, f"{hf}ln_1", (*ours, "attn_norm"))
        add_linear(names, f"{hf}attn.c_attn", (*ours, "attn", "qkv"), kind="copy")
        add_linear(names, f"{hf}attn.c_proj", (*ours, "attn", "out"), kind="copy")
        add_norm(names, f"{hf}ln_2", (*ours, "mlp_norm"))
        add_linear(names, f"{hf}mlp.c_fc", (*ours, "fc_in"), kind="copy")
        add_linear(names, f"{hf}mlp.c_proj", (*ours, "fc_out"), kind="copy")
    add_norm(names, "transformer.ln_f", ("final_norm",))
    if not getattr(config, "tie_word_embeddings", True):
        add_linear(names, "lm_head", ("lm_head",), bias=False)
    return names


def normalize(config, tensors, notes):
    """Accept a bare GPT2Model checkpoint (no 'transformer.' prefix, as the hub's gpt2 is saved), drop the
    causal-mask buffers older transformers saved (the mask and its fill value; c_attn's bias ends .c_attn.bias),
    and a tied lm_head.weight (checked equal to wte)."""
    out = with_prefix(tensors, "transformer.", ("wte", "wpe", "h", "ln_f"),
                      buffers=(".attn.bias", ".attn.masked_bias"))
    return drop_tied_head(config, out, "lm_head.weight", "transformer.wte.weight")


# openai-community/gpt2*: learned positions, tied head; the small ones are for tests and the CPU demo.
_GPT2 = dict(model_type="gpt2", vocab_size=50257, n_positions=1024, activation_function="gelu_new",
             resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1, layer_norm_epsilon=1e-5, initializer_range=0.02,
             bos_token_id=50256, eos_token_id=50256)


def _shape(width, layers, heads):
    return dict(n_embd=width, n_layer=layers, n_head=heads)


# The small vocabularies end with <|endoftext|> as GPT-2's does (a tokenizer's ids replace these).
PRESETS = {
    "gpt2": {**_GPT2, **_shape(768, 12, 12)},
    "gpt2-medium": {**_GPT2, **_shape(1024, 24, 16)},
    "gpt2-small": {**_GPT2, **_shape(128, 4, 4), "vocab_size": 8192, "bos_token_id": 8191, "eos_token_id": 8191,
                   "n_positions": 256},
    "gpt2-tiny": {**_GPT2, **_shape(64, 2, 2), "vocab_size": 1024, "bos_token_id": 1023, "eos_token_id": 1023,
                  "n_positions": 256},
}

GPT2 = Family(model_type="gpt2", name="GPT-2", model=GPT2LMHeadModel, tensor_names=tensor_names, normalize=normalize,
              architecture="GPT2LMHeadModel", presets=PRESETS, script="run_clm_flax.py",
              max_length=lambda config: config.n_positions,
              matrices=lambda config: {("attn", "qkv", "kernel"): parts_of_output(3)})  # [q | k | v]
