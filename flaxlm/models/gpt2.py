"""GPT-2: a pre-LayerNorm decoder with learned positions and the LM head tied to the token embeddings.

Configured by a transformers GPT2Config; the parameters map 1:1 to GPT2LMHeadModel's (Hugging Face keeps
them in Conv1D layout, [in, out], which is our kernel layout). The decoder-only interface every causal-LM
family shares:

    logits_BLV = model(ids_BL, mask_BL=None, positions_BL=None, dropout_key=key)   # causal, training / eval
    cache = model.init_cache(batch, length)                                        # for generation
    logits_BTV, cache = model(ids_BT, mask_BT, positions_BT, cache=cache)          # T new tokens at cache index
    h_BLD = model(ids_BL, dropout_key=key, hidden=True); head = model.head()       # for a fused head + loss
"""
import math

import jax.numpy as jnp
from flax import nnx

from flaxlm.errors import UserError
from flaxlm.models import kv_cache
from flaxlm.models.layer_stack import Execution
from flaxlm.models.layers import (LayerNorm, LMHead, activation, attention, compute_dtype, dense, dropout, fold_key,
                                  split_last)


def embed(n, d, std, rngs):
    return nnx.Embed(n, d, dtype=jnp.float32, param_dtype=jnp.float32,
                     embedding_init=nnx.initializers.normal(std), rngs=rngs)


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


class GPT2LMHeadModel(nnx.Module):
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
        self.embed = embed(config.vocab_size, D, std, rngs)
        self.position = embed(config.n_positions, D, std, rngs)
        self.execution = execution or Execution()
        self.layers = nnx.List([Block(config, i, self.dtype, rngs, self.execution) for i in range(config.n_layer)])
        self.final_norm = LayerNorm(D, config.layer_norm_epsilon, rngs)
        self.tied = getattr(config, "tie_word_embeddings", True)
        if not self.tied:
            self.lm_head = dense(D, config.vocab_size, self.dtype, std, rngs, use_bias=False)
        self.dropout_rate = config.embd_pdrop
        self.num_heads, self.head_dim = config.n_head, D // config.n_head
        self.max_positions = config.n_positions

    def init_cache(self, batch, length):
        return kv_cache.init_cache(len(self.layers), batch, length, self.num_heads, self.head_dim, self.dtype)

    def __call__(self, input_ids_BL, attention_mask_BL=None, positions_BL=None, *, dropout_key=None, cache=None,
                 hidden=False):
        """Logits [B, L, V] (float32), or with hidden=True the final hidden states [B, L, D] that the head
        multiplies (see head()); with a cache, (that, the updated cache)."""
        if positions_BL is None:
            positions_BL = kv_cache.default_positions(input_ids_BL, cache)
        x_BLD = self.embed(input_ids_BL) + self.position(positions_BL)
        x_BLD = dropout(x_BLD.astype(self.dtype), self.dropout_rate, fold_key(dropout_key, 0))
        x_BLD, cache = kv_cache.run_layers(
            self.layers, x_BLD, attention_mask_BL, cache,
            lambda i, layer, x, *cached: layer(x, attention_mask_BL, fold_key(dropout_key, i + 1), *cached),
            self.execution)
        h_BLD = self.final_norm(x_BLD)
        out = h_BLD if hidden else self.head().logits(h_BLD)
        return out if cache is None else (out, cache)

    def head(self):
        """The LM head: the token embeddings (tied) or lm_head's kernel."""
        return LMHead(self.embed.embedding[...] if self.tied else self.lm_head.kernel[...], self.tied, self.dtype)

