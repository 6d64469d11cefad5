"""BLOOM: a pre-LayerNorm decoder without position embeddings: ALiBi adds slope * key position to each head's
attention scores (any length; no positions limit). The token embeddings pass a LayerNorm; the MLP is
4 * hidden_size wide with tanh-approximated GELU; the LM head is tied to the token embeddings.

Configured by a transformers BloomConfig; the parameters map 1:1 to BloomForCausalLM's: transformer.word_embeddings
(_layernorm) -> embed (embed_norm), h.{i}.input_layernorm / post_attention_layernorm -> attn_norm / mlp_norm,
self_attention.query_key_value / dense -> attn.qkv / out, mlp.dense_h_to_4h / dense_4h_to_h -> fc_in / fc_out,
ln_f -> final_norm. query_key_value's output features are per head [N, 3, H] (head n's query, key, value), not
[3, N, H]: attn.qkv keeps that layout (its kernel is the torch weight transposed) and the forward splits it so.
The ALiBi key positions are the batch's positions (transformers': cumsum(mask) - 1 at real tokens); the KV cache
adds slope * (key slot - query slot), the same up to a constant per query. The decoder-only interface of every
causal-LM family is flaxlm.models.decoder's. Below the model: its Hugging Face tensor names, its presets and its
Family.
"""
import math

import jax.numpy as jnp
import numpy as np
from flax import nnx

from flaxlm.errors import UserError
from flaxlm.models import kv_cache
from flaxlm.models.decoder import CausalLM
from flaxlm.models.family import Family, add_linear, add_norm, config_ties, drop_tied_head, with_prefix
from flaxlm.models.layer_stack import Execution
from flaxlm.models.layers import ACTIVATIONS, LayerNorm, attention, compute_dtype, dense, dropout, embed, fold_key

gelu = ACTIVATIONS["gelu_pytorch_tanh"]  # BLOOM's bloom_gelu_forward


def alibi_slopes(num_heads):
    """The float32 ALiBi slope of each head, as transformers' BLOOM computes them: for the largest power of two
    n <= num_heads, base ** 1..n with base 2 ** (-8 / n); the remaining heads take the odd powers of 2n's base."""
    n = 2 ** math.floor(math.log2(num_heads))

    def powers(base, exponents):  # float32 base ** integers, rounded once from float64
        return (np.float64(np.float32(base)) ** exponents).astype(np.float32)

    slopes = powers(2 ** (-(2 ** -(math.log2(n) - 3))), np.arange(1, n + 1))
    if n != num_heads:
        extra = powers(2 ** (-(2 ** -(math.log2(2 * n) - 3))), np.arange(1, 1 + 2 * min(n, num_heads - n), 2))
        slopes = np.concatenate([slopes, extra])
    return tuple(float(s) for s in slopes)  # static: hashable, not a parameter


class Attention(nnx.Module):
    def __init__(self, config, dtype, rngs, execution):
        D, std = config.hidden_size, config.initializer_range
        self.qkv = dense(D, 3 * D, dtype, std, rngs)  # query_key_value: output features [N, 3, H]
        self.out = dense(D, D, dtype, std, rngs)  # dense
        self.num_heads = config.n_head
        self.dropout_rate = config.attention_dropout
        self.implementation = execution.attention_implementation

    def __call__(self, x_BTD, slopes, positions_BT, mask_BL, key, kv=None, index=None, visible_BTS=None):
        (B, T, D), N = x_BTD.shape, self.num_heads
        qkv_BTN3H = self.qkv(x_BTD.reshape(B * T, D)).reshape(B, T, N, 3, D // N)
        q_BTNH, k_BTNH, v_BTNH = qkv_BTN3H[..., 0, :], qkv_BTN3H[..., 1, :], qkv_BTN3H[..., 2, :]
        if kv is None:
            slopes_N = jnp.asarray(slopes, jnp.float32)
            bias_BN1S = slopes_N[None, :, None, None] * positions_BT.astype(jnp.float32)[:, None, None, :]
            o_BTNH = attention(q_BTNH, k_BTNH, v_BTNH, mask_BL, causal=True, bias=bias_BN1S,
                               dropout_rate=self.dropout_rate, dropout_key=key, implementation=self.implementation)
        else:
            o_BTNH, kv = kv_cache.attend(q_BTNH, kv, k_BTNH, v_BTNH, index, visible_BTS, alibi_slopes=slopes)
        return self.out(o_BTNH.reshape(B * T, D)), kv


class Block(nnx.Module):
    def __init__(self, config, dtype, rngs, execution):
        D, std, eps = config.hidden_size, config.initializer_range, config.layer_norm_epsilon
        self.attn_norm = LayerNorm(D, eps, rngs)  # input_layernorm
        self.attn = Attention(config, dtype, rngs, execution)
        self.mlp_norm = LayerNorm(D, eps, rngs)  # post_attention_layernorm
        self.fc_in = dense(D, 4 * D, dtype, std, rngs)
        self.fc_out = dense(4 * D, D, dtype, std, rngs)
        self.dropout_rate = config.hidden_dropout
        # the residual around each sublayer is its normalized input instead of its input
        self.norm_residual = config.apply_residual_connection_post_layernorm

    def __call__(self, x_BTD, slopes, positions_BT, mask_BL, key, kv=None, index=None, visible_BTS=None):
        B, T, D = x_BTD.shape
        h_BTD = self.attn_norm(x_BTD)
        a_MD, kv = self.attn(h_BTD, slopes, positions_BT, mask_BL, fold_key(key, 0), kv, index, visible_BTS)
        x_MD = (h_BTD if self.norm_residual else x_BTD).reshape(B * T, D) + \
            dropout(a_MD, self.dropout_rate, fold_key(key, 1))
        h_MD = self.mlp_norm(x_MD)
        m_MD = self.fc_out(gelu(self.fc_in(h_MD)))
        x_MD = (h_MD if self.norm_residual else x_MD) + dropout(m_MD, self.dropout_rate, fold_key(key, 2))
        return x_MD.reshape(B, T, D), kv


class BloomForCausalLM(CausalLM):
    """BLOOM with its LM head (tied to the token embeddings unless config.tie_word_embeddings is false); execution:
    how the layers run (flaxlm.models.layer_stack.Execution; default a plain loop)."""

    def __init__(self, config, *, dtype="float32", rngs, execution=None):
        D, N = config.hidden_size, config.n_head
        if D % N:
            raise UserError(f"hidden_size {D} is not a multiple of n_head {N}; fix config.json")
        if config.pretraining_tp > 1 and config.slow_but_exact:
            raise UserError("slow_but_exact with pretraining_tp > 1 is not supported (transformers then drops the "
                            "dense layers' biases); set slow_but_exact to false in config.json")
        self.slopes = alibi_slopes(N)
        self.dtype = compute_dtype(dtype)
        std, eps = config.initializer_range, config.layer_norm_epsilon
        Vp = self.vocab_rows(config, execution)  # config.vocab_size, or more with --pad_vocab_multiple
        self.embed = embed(Vp, D, std, rngs, drawn=config.vocab_size)
        self.embed_norm = LayerNorm(D, eps, rngs)
        self.execution = execution or Execution()
        self.layers = nnx.List([Block(config, self.dtype, rngs, self.execution) for _ in range(config.n_layer)])
        self.final_norm = LayerNorm(D, eps, rngs)
        self.tied = config_ties(config)
        if not self.tied:
            self.lm_head = dense(D, Vp, self.dtype, std, rngs, use_bias=False, drawn=config.vocab_size)
        self.kv_heads, self.head_dim = N, D // N
        self.max_positions = None  # ALiBi: no positions limit

    def embed_input(self, input_ids_BL, positions_BL, dropout_key):
        return self.embed_norm(self.embed(input_ids_BL)).astype(self.dtype)

    def call_layer(self, i, layer, x_BLD, attention_mask_BL, positions_BL, dropout_key, *cached):
        return layer(x_BLD, self.slopes, positions_BL, attention_mask_BL, fold_key(dropout_key, i + 1), *cached)


def tensor_names(config):
    """Tensor names of BloomForCausalLM -> our paths (lm_head.weight only when untied). query_key_value keeps its
    per-head [N, 3, H] output layout: a plain transposed Linear."""
    names = [("transformer.word_embeddings.weight", ("embed", "embedding"), "copy")]
    add_norm(names, "transformer.word_embeddings_layernorm", ("embed_norm",))
    for i in range(config.n_layer):
        hf, ours = f"transformer.h.{i}.", ("layers", str(i))
        add_norm(names, f"{hf}input_layernorm", (*ours, "attn_norm"))
        add_linear(names, f"{hf}self_attention.query_key_value", (*ours, "attn", "qkv"))
        add_linear(names, f"{hf}self_attention.dense", (*ours, "attn", "out"))
        add_norm(names, f"{hf}post_attention_layernorm", (*ours, "mlp_norm"))
        add_linear(names, f"{hf}mlp.dense_h_to_4h", (*ours, "fc_in"))
        add_linear(names, f"{hf}mlp.dense_4h_to_h", (*ours, "fc_out"))
    add_norm(names, "transformer.ln_f", ("final_norm",))
    if not config_ties(config):
        add_linear(names, "lm_head", ("lm_head",), bias=False)
    return names


def normalize(config, tensors, notes):
    """Accept a bare BloomModel checkpoint (no 'transformer.' prefix, as the hub's bigscience/bloom-* are saved) and
    drop a tied lm_head.weight (checked equal to the token embeddings)."""
    out = with_prefix(tensors, "transformer.", ("word_embeddings", "word_embeddings_layernorm", "h", "ln_f"))
    return drop_tied_head(config, out, "lm_head.weight", "transformer.word_embeddings.weight")


# bigscience/bloom-*: 16 heads, a 250880-token vocabulary; bloom-tiny is for tests and the CPU demo.
_BLOOM = dict(model_type="bloom", vocab_size=250880, layer_norm_epsilon=1e-5, initializer_range=0.02,
              apply_residual_connection_post_layernorm=False, hidden_dropout=0.0, attention_dropout=0.0,
              pretraining_tp=1, slow_but_exact=False, bos_token_id=1, eos_token_id=2, pad_token_id=3)


def _shape(width, layers, heads):
    return dict(hidden_size=width, n_layer=layers, n_head=heads)


PRESETS = {
    "bloom-560m": {**_BLOOM, **_shape(1024, 24, 16)},
    "bloom-1b7": {**_BLOOM, **_shape(2048, 24, 16), "pretraining_tp": 2},
    "bloom-tiny": {**_BLOOM, **_shape(64, 2, 4), "vocab_size": 1024},
}

def matrices(config):
    """qkv's output features are [N, 3, H] (head by head): seen as [D, N, 3, H], q, k and v each a matrix [D, N * H]
    for --optim muon."""
    from optax.contrib import MuonDimensionNumbers
    N = config.n_head

    def heads_view(shape):
        return (shape[0], N, 3, shape[1] // (3 * N)), MuonDimensionNumbers(reduction_axis=0, output_axis=(1, 3))
    return {("attn", "qkv", "kernel"): heads_view}


BLOOM = Family(model_type="bloom", name="BLOOM", model=BloomForCausalLM, tensor_names=tensor_names,
               normalize=normalize, architecture="BloomForCausalLM", presets=PRESETS, script="run_clm_flax.py",
               max_length=None, no_splash="its ALiBi adds a bias to the scores", matrices=matrices)
