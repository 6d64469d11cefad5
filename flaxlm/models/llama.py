"""Llama: a pre-RMSNorm decoder with rotary positions (RoPE), a SwiGLU MLP and grouped-query attention.

Configured by a transformers LlamaConfig; the parameters map 1:1 to LlamaForCausalLM's (torch Linear weights
[out, in] are our kernels transposed). q/k/v and gate/up stay separate parameters, as Hugging Face's, and are
concatenated at compute time into one matmul each. The decoder-only interface of every causal-LM family
(flaxlm.models.decoder); the cache holds K key/value heads of head_dim. Below the model: its Hugging Face tensor
names, its presets and its Family.

Shape suffixes as in layers.py, plus K key/value heads, X concatenated projections, R = H / 2 rotary frequencies.
"""
import jax.numpy as jnp
from flax import nnx

from flaxlm.errors import UserError
from flaxlm.models import kv_cache
from flaxlm.models.decoder import CausalLM
from flaxlm.models.family import Family, add_linear, add_norm, drop_tied_head, with_prefix
from flaxlm.models.layer_stack import Execution
from flaxlm.models.layers import (RMSNorm, activation, attention, compute_dtype, dense, embed, fold_key,
                                  lora_output, split_last)
from flaxlm.models.rope import rope, rope_of

def heads(config):
    """(N query heads, K key/value heads, H head width): transformers 5 fills in head_dim and
    num_key_value_heads; configs from older versions may leave them None."""
    N = config.num_attention_heads
    K = getattr(config, "num_key_value_heads", None) or N
    return N, K, getattr(config, "head_dim", None) or config.hidden_size // N


def checked_heads(config):
    """heads(config), or a UserError when the query heads are not a multiple of the key/value heads or the head
    width is odd (RoPE rotates pairs)."""
    N, K, H = heads(config)
    if N % K:
        raise UserError(f"num_attention_heads {N} is not a multiple of num_key_value_heads {K}; fix config.json")
    if H % 2:
        raise UserError(f"head_dim {H} is odd; rotary position embeddings need an even head_dim")
    return N, K, H


def fused_dense(x_MD, *linears):
    """The outputs of Linears sharing an input from one matmul over their concatenated kernels."""
    dtype = linears[0].dtype
    w_DX = jnp.concatenate([lin.kernel[...].astype(dtype) for lin in linears], axis=1)
    y_MX = x_MD.astype(dtype) @ w_DX
    if linears[0].bias is not None:
        y_MX = y_MX + jnp.concatenate([lin.bias[...].astype(dtype) for lin in linears])
    ys = split_last(y_MX, [lin.out_features for lin in linears])
    return [y if getattr(lin, "lora_a", None) is None else y + lora_output(lin, x_MD) for y, lin in zip(ys, linears)]


class Attention(nnx.Module):
    """Grouped-query attention with RoPE. The options of the families built on Llama's layers: qkv_bias / o_bias
    (default config.attention_bias; Qwen2: q/k/v only), qk_norm (True, Qwen3: an RMSNorm over each query and key
    head before RoPE; "whole", OLMoE: one over all the query features [N * H], one over all the key features
    [K * H]), clip_qkv (OLMoE: q, k and v clipped to [-clip_qkv, clip_qkv] after the whole norms; None: not),
    window (Mistral's sliding window: a query sees the `window` keys up to its own; None: all)."""

    def __init__(self, config, dtype, rngs, execution, *, qkv_bias=None, o_bias=None, qk_norm=False, clip_qkv=None,
                 window=None):
        (N, K, H), D = heads(config), config.hidden_size
        bias, std = getattr(config, "attention_bias", False), config.initializer_range
        qkv_bias, o_bias = bias if qkv_bias is None else qkv_bias, bias if o_bias is None else o_bias
        self.q_proj = dense(D, N * H, dtype, std, rngs, use_bias=qkv_bias)
        self.k_proj = dense(D, K * H, dtype, std, rngs, use_bias=qkv_bias)
        self.v_proj = dense(D, K * H, dtype, std, rngs, use_bias=qkv_bias)
        self.o_proj = dense(N * H, D, dtype, std, rngs, use_bias=o_bias)
        whole = qk_norm == "whole"
        if qk_norm:
            self.q_norm = RMSNorm(N * H if whole else H, config.rms_norm_eps)
            self.k_norm = RMSNorm(K * H if whole else H, config.rms_norm_eps)
        self.head_norm, self.whole_norm = bool(qk_norm) and not whole, whole
        self.clip_qkv, self.window = clip_qkv, window
        self.num_heads, self.kv_heads, self.head_dim = N, K, H
        self.dropout_rate = config.attention_dropout
        self.implementation = execution.attention_implementation

    def __call__(self, x_BTD, positions_BT, rotation, mask_BL, key, kv=None, index=None, visible_BTS=None):
        (B, T, D), N, K, H = x_BTD.shape, self.num_heads, self.kv_heads, self.head_dim
        q_MX, k_MX, v_MX = fused_dense(x_BTD.reshape(B * T, D), self.q_proj, self.k_proj, self.v_proj)
        if self.whole_norm:
            q_MX, k_MX = self.q_norm(q_MX), self.k_norm(k_MX)
        if self.clip_qkv is not None:
            q_MX, k_MX, v_MX = (jnp.clip(y, -self.clip_qkv, self.clip_qkv) for y in (q_MX, k_MX, v_MX))
        q_BTNH, k_BTKH = q_MX.reshape(B, T, N, H), k_MX.reshape(B, T, K, H)
        if self.head_norm:
            q_BTNH, k_BTKH = self.q_norm(q_BTNH), self.k_norm(k_BTKH)
        q_BTNH, k_BTKH = rope(q_BTNH, positions_BT, rotation), rope(k_BTKH, positions_BT, rotation)
        v_BTKH = v_MX.reshape(B, T, K, H)
        if kv is None:
            o_BTNH = attention(q_BTNH, k_BTKH, v_BTKH, mask_BL, causal=True, dropout_rate=self.dropout_rate,
                               dropout_key=key, implementation=self.implementation, window=self.window)
        else:
            o_BTNH, kv = kv_cache.attend(q_BTNH, kv, k_BTKH, v_BTKH, index, visible_BTS, window=self.window)
        return self.o_proj(o_BTNH.reshape(B * T, N * H)), kv


class MLP(nnx.Module):
    """SwiGLU: down(act(gate(x)) * up(x)), of width `width` (default config.intermediate_size; Qwen2-MoE's shared
    expert: config.shared_expert_intermediate_size)."""

    def __init__(self, config, dtype, rngs, bias=None, width=None):
        D, std = config.hidden_size, config.initializer_range
        F = config.intermediate_size if width is None else width
        bias = getattr(config, "mlp_bias", False) if bias is None else bias
        self.gate_proj = dense(D, F, dtype, std, rngs, use_bias=bias)
        self.up_proj = dense(D, F, dtype, std, rngs, use_bias=bias)
        self.down_proj = dense(F, D, dtype, std, rngs, use_bias=bias)
        self.act = config.hidden_act

    def __call__(self, x_MD):
        gate_MF, up_MF = fused_dense(x_MD, self.gate_proj, self.up_proj)
        return self.down_proj(activation(self.act)(gate_MF) * up_MF)


class Block(nnx.Module):
    """mlp_bias (default config.mlp_bias) and the Attention's options (see Attention)."""

    def __init__(self, config, dtype, rngs, execution, *, mlp_bias=None, **attention_options):
        D, eps = config.hidden_size, config.rms_norm_eps
        self.attn_norm = RMSNorm(D, eps)
        self.attn = Attention(config, dtype, rngs, execution, **attention_options)
        self.mlp_norm = RMSNorm(D, eps)
        self.mlp = MLP(config, dtype, rngs, mlp_bias)

    def __call__(self, x_BTD, positions_BT, rotation, mask_BL, key, kv=None, index=None, visible_BTS=None):
        B, T, D = x_BTD.shape
        a_MD, kv = self.attn(self.attn_norm(x_BTD), positions_BT, rotation, mask_BL, key, kv, index, visible_BTS)
        x_MD = x_BTD.reshape(B * T, D) + a_MD
        return (x_MD + self.mlp(self.mlp_norm(x_MD))).reshape(B, T, D), kv


class LlamaForCausalLM(CausalLM):
    """Llama with its LM head (untied unless config.tie_word_embeddings); execution: how the layers run
    (flaxlm.models.layer_stack.Execution; default a plain loop)."""

    def __init__(self, config, *, dtype="float32", rngs, execution=None):
        N, K, H = checked_heads(config)
        activation(config.hidden_act)
        self.rope = rope_of(config, H)
        self.dtype = compute_dtype(dtype)
        D, std = config.hidden_size, config.initializer_range
        Vp = self.vocab_rows(config, execution)  # config.vocab_size, or more with --pad_vocab_multiple
        self.embed = embed(Vp, D, std, rngs, drawn=config.vocab_size)
        self.execution = execution or Execution()
        self.layers = nnx.List([self.block(config, self.dtype, rngs, self.execution, **self.layer_options(config, i))
                                for i in range(config.num_hidden_layers)])
        self.final_norm = RMSNorm(D, config.rms_norm_eps)
        self.tied = bool(getattr(config, "tie_word_embeddings", False))
        if not self.tied:
            self.lm_head = dense(D, Vp, self.dtype, std, rngs, use_bias=False, drawn=config.vocab_size)
        self.kv_heads, self.head_dim = K, H
        # dynamic RoPE's base grows past max_position_embeddings: it exists to run longer sequences
        self.max_positions = None if self.rope.ntk_factor else config.max_position_embeddings

    block = Block  # the layer class (Qwen3-MoE's has its experts in place of the MLP)

    @staticmethod
    def layer_options(config, i):
        """Layer i's Block options (mlp_bias, Attention's): the families built on Llama's layers set them."""
        return {}

    def embed_input(self, input_ids_BL, positions_BL, dropout_key):
        return self.embed(input_ids_BL).astype(self.dtype)

    def call_layer(self, i, layer, x_BLD, attention_mask_BL, positions_BL, dropout_key, *cached):
        return layer(x_BLD, positions_BL, self.rope, attention_mask_BL, fold_key(dropout_key, i), *cached)


def tensor_names(config, *, qkv_bias=None, o_bias=None, mlp_bias=None, qk_norm=False):
    """Tensor names of LlamaForCausalLM -> our paths. Biases only with attention_bias / mlp_bias (or the options,
    as Attention's and Block's; qk_norm: self_attn.q_norm / k_norm); lm_head.weight only when untied."""
    bias = getattr(config, "attention_bias", False)
    qkv_bias, o_bias = bias if qkv_bias is None else qkv_bias, bias if o_bias is None else o_bias
    mlp_bias = getattr(config, "mlp_bias", False) if mlp_bias is None else mlp_bias
    names = [("model.embed_tokens.weight", ("embed", "embedding"), "copy")]
    for i in range(config.num_hidden_layers):
        hf, ours = f"model.layers.{i}.", ("layers", str(i))
        add_norm(names, f"{hf}input_layernorm", (*ours, "attn_norm"), bias=False)
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            add_linear(names, f"{hf}self_attn.{proj}", (*ours, "attn", proj), o_bias if proj == "o_proj" else qkv_bias)
        if qk_norm:
            for norm in ("q_norm", "k_norm"):
                add_norm(names, f"{hf}self_attn.{norm}", (*ours, "attn", norm), bias=False)
        add_norm(names, f"{hf}post_attention_layernorm", (*ours, "mlp_norm"), bias=False)
        for proj in ("gate_proj", "up_proj", "down_proj"):
            add_linear(names, f"{hf}mlp.{proj}", (*ours, "mlp", proj), mlp_bias)
    add_norm(names, "model.norm", ("final_norm",), bias=False)
    if not getattr(config, "tie_word_embeddings", False):
        add_linear(names, "lm_head", ("lm_head",), bias=False)
    return names


def normalize(config, tensors, notes):
    """Accept a bare LlamaModel checkpoint (no 'model.' prefix), drop the rotary_emb.inv_freq buffers older
    transformers saved (computed from config.json, not weights), and a tied lm_head.weight (checked equal to the
    token embeddings)."""
    out = with_prefix(tensors, "model.", ("embed_tokens", "layers", "norm"), buffers=("rotary_emb.inv_freq",))
    return drop_tied_head(config, out, "lm_head.weight", "model.embed_tokens.weight")


# Llama-style: RoPE, RMSNorm, SwiGLU, grouped-query attention; llama-3.2-1b is meta-llama/Llama-3.2-1B's config.json,
# llama-100m is our own ~100M shape, llama-tiny is for tests and the CPU demo.
_LLAMA = dict(model_type="llama", vocab_size=32000, max_position_embeddings=2048, hidden_act="silu",
              rms_norm_eps=1e-5, rope_theta=10000.0, initializer_range=0.02, attention_bias=False,
              tie_word_embeddings=False, pad_token_id=None, bos_token_id=1, eos_token_id=2)


def _shape(width, layers, heads, kv_heads, intermediate):
    return dict(hidden_size=width, num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=kv_heads, intermediate_size=intermediate)


PRESETS = {
    "llama-3.2-1b": {**_LLAMA, **_shape(2048, 16, 32, 8, 8192), "vocab_size": 128256, "max_position_embeddings": 131072,
                     "rope_theta": 500000.0, "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0,
                                                              "low_freq_factor": 1.0, "rope_type": "llama3",
                                                              "original_max_position_embeddings": 8192},
                     "head_dim": 64, "mlp_bias": False, "tie_word_embeddings": True, "bos_token_id": 128000,
                     "eos_token_id": 128001},
    "llama-100m": {**_LLAMA, **_shape(768, 12, 12, 4, 2048), "tie_word_embeddings": True},
    "llama-tiny": {**_LLAMA, **_shape(64, 2, 4, 2, 176), "vocab_size": 1024, "max_position_embeddings": 256},
}

LLAMA = Family(model_type="llama", name="Llama", model=LlamaForCausalLM, tensor_names=tensor_names, normalize=normalize,
               architecture="LlamaForCausalLM", presets=PRESETS, script="run_clm_flax.py",
               max_length=lambda config: config.max_position_embeddings)
