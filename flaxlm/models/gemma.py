"""Gemma: Llama's decoder with a GeGLU MLP, (1 + w) RMSNorms and token embeddings scaled by sqrt(hidden_size).

Configured by a transformers GemmaConfig; the parameters map 1:1 to GemmaForCausalLM's, named as Llama's
(model.embed_tokens, model.layers.i.{input_layernorm, self_attn.{q,k,v,o}_proj, post_attention_layernorm,
mlp.{gate,up,down}_proj}, model.norm; lm_head only when untied, which the released models are not). The norms
store w and multiply by 1 + w (initialized 0). The embeddings are multiplied by sqrt(hidden_size) rounded to the
compute dtype, as transformers rounds its normalizer to the weights' dtype; the tied LM head uses them unscaled.

The pieces here (Attention with an optional scale, sliding window, attention soft-cap and per-head q/k norms;
the GeGLU MLP; the model whose layers each family builds) are Gemma 2's and Gemma 3's too (gemma2.py, gemma3.py).

Shape suffixes as in layers.py, plus K key/value heads, X concatenated projections.
"""
import jax.numpy as jnp
import numpy as np
from flax import nnx

from flaxlm.errors import UserError
from flaxlm.models import kv_cache
from flaxlm.models.decoder import CausalLM
from flaxlm.models.family import Family, add_linear, add_norm, drop_tied_head, with_prefix
from flaxlm.models.layer_stack import Execution
from flaxlm.models.layers import RMSNorm, activation, attention, compute_dtype, dense, embed, fold_key
from flaxlm.models.llama import checked_heads, fused_dense, heads
from flaxlm.models.rope import rope, rope_of


def norm(dim, eps):
    """Gemma's RMSNorm: x / rms(x) * (1 + w), w initialized 0."""
    return RMSNorm(dim, eps, init_value=0.0, offset=1.0)


class Attention(nnx.Module):
    """Grouped-query attention with RoPE (rotation: this layer's Rope), scores scaled by `scale`; window:
    a sliding window (None: global); softcap: attention logit soft-capping; qk_norm: (1 + w) RMSNorms of each
    query and key head before RoPE (Gemma 3)."""

    def __init__(self, config, dtype, rngs, execution, *, rotation, scale, window=None, softcap=None,
                 qk_norm=False):
        (N, K, H), D = heads(config), config.hidden_size
        bias, std = config.attention_bias, config.initializer_range
        self.q_proj = dense(D, N * H, dtype, std, rngs, use_bias=bias)
        self.k_proj = dense(D, K * H, dtype, std, rngs, use_bias=bias)
        self.v_proj = dense(D, K * H, dtype, std, rngs, use_bias=bias)
        self.o_proj = dense(N * H, D, dtype, std, rngs, use_bias=bias)
        if qk_norm:
            self.q_norm, self.k_norm = norm(H, config.rms_norm_eps), norm(H, config.rms_norm_eps)
        self.qk_norm = qk_norm
        self.num_heads, self.kv_heads, self.head_dim = N, K, H
        self.rotation, self.scale, self.window, self.softcap = rotation, scale, window, softcap
        self.dropout_rate = config.attention_dropout
        self.implementation = execution.attention_implementation

    def __call__(self, x_BTD, positions_BT, mask_BL, key, kv=None, index=None, visible_BTS=None):
        (B, T, D), N, K, H = x_BTD.shape, self.num_heads, self.kv_heads, self.head_dim
        q_MX, k_MX, v_MX = fused_dense(x_BTD.reshape(B * T, D), self.q_proj, self.k_proj, self.v_proj)
        q_BTNH, k_BTKH = q_MX.reshape(B, T, N, H), k_MX.reshape(B, T, K, H)
        if self.qk_norm:
            q_BTNH, k_BTKH = self.q_norm(q_BTNH), self.k_norm(k_BTKH)
        q_BTNH, k_BTKH = rope(q_BTNH, positions_BT, self.rotation), rope(k_BTKH, positions_BT, self.rotation)
        v_BTKH = v_MX.reshape(B, T, K, H)
        if kv is None:
            o_BTNH = attention(q_BTNH, k_BTKH, v_BTKH, mask_BL, causal=True, scale=self.scale,
                               dropout_rate=self.dropout_rate, dropout_key=key, implementation=self.implementation,
                               window=self.window, softcap=self.softcap)
        else:
            o_BTNH, kv = kv_cache.attend(q_BTNH, kv, k_BTKH, v_BTKH, index, visible_BTS, self.scale,
                                         window=self.window, softcap=self.softcap)
        return self.o_proj(o_BTNH.reshape(B * T, N * H)), kv


class MLP(nnx.Module):
    """GeGLU: down(act(gate(x)) * up(x)), act gelu_pytorch_tanh in the released models."""

    def __init__(self, config, act, dtype, rngs):
        D, F, std = config.hidden_size, config.intermediate_size, config.initializer_range
        self.gate_proj = dense(D, F, dtype, std, rngs, use_bias=False)
        self.up_proj = dense(D, F, dtype, std, rngs, use_bias=False)
        self.down_proj = dense(F, D, dtype, std, rngs, use_bias=False)
        activation(act)
        self.act = act

    def __call__(self, x_MD):
        gate_MF, up_MF = fused_dense(x_MD, self.gate_proj, self.up_proj)
        return self.down_proj(activation(self.act)(gate_MF) * up_MF)


class Block(nnx.Module):
    """Gemma's layer: pre-norm attention and MLP, as Llama's."""

    def __init__(self, config, dtype, rngs, execution, act, **attention_settings):
        D, eps = config.hidden_size, config.rms_norm_eps
        self.attn_norm = norm(D, eps)
        self.attn = Attention(config, dtype, rngs, execution, **attention_settings)
        self.mlp_norm = norm(D, eps)
        self.mlp = MLP(config, act, dtype, rngs)

    def __call__(self, x_BTD, positions_BT, mask_BL, key, kv=None, index=None, visible_BTS=None):
        B, T, D = x_BTD.shape
        a_MD, kv = self.attn(self.attn_norm(x_BTD), positions_BT, mask_BL, key, kv, index, visible_BTS)
        x_MD = x_BTD.reshape(B * T, D) + a_MD
        return (x_MD + self.mlp(self.mlp_norm(x_MD))).reshape(B, T, D), kv


def gemma_activation(config):
    """GemmaConfig's hidden_act; transformers reads the legacy "gelu" of the released config.json files as the
    tanh approximation they were trained with."""
    act = config.hidden_act
    return "gelu_pytorch_tanh" if act == "gelu" else act


class GemmaForCausalLM(CausalLM):
    """Gemma with its LM head (tied unless config.tie_word_embeddings is false); execution: how the layers run
    (flaxlm.models.layer_stack.Execution; default a plain loop). Gemma 2 and 3 redefine make_layer and
    final_softcap."""

    def __init__(self, config, *, dtype="float32", rngs, execution=None):
        N, K, H = checked_heads(config)
        if getattr(config, "use_bidirectional_attention", False):
            raise UserError("use_bidirectional_attention is not supported (flaxlm's Gemma is a causal LM); set it "
                            "to false in config.json")
        self.dtype = compute_dtype(dtype)
        D, std = config.hidden_size, config.initializer_range
        Vp = self.vocab_rows(config, execution)  # config.vocab_size, or more with --pad_vocab_multiple
        self.embed = embed(Vp, D, std, rngs, drawn=config.vocab_size)
        self.embed_scale = float(np.float32(D ** 0.5))  # transformers' float32 buffer, rounded again to dtype
        self.execution = execution or Execution()
        self.layers = nnx.List([self.make_layer(config, i, rngs) for i in range(config.num_hidden_layers)])
        self.final_norm = norm(D, config.rms_norm_eps)
        self.tied = bool(getattr(config, "tie_word_embeddings", True))
        if not self.tied:
            self.lm_head = dense(D, Vp, self.dtype, std, rngs, use_bias=False, drawn=config.vocab_size)
        self.logit_softcap = self.final_softcap(config)
        self.kv_heads, self.head_dim = K, H
        # dynamic RoPE's base grows past max_position_embeddings: it exists to run longer sequences
        dynamic = any(layer.attn.rotation.ntk_factor for layer in self.layers)
        self.max_positions = None if dynamic else config.max_position_embeddings

    def make_layer(self, config, i, rngs):
        """Layer i: Gemma's are alike (global attention scaled by head_dim**-0.5)."""
        return Block(config, self.dtype, rngs, self.execution, gemma_activation(config),
                     rotation=rope_of(config, heads(config)[2]), scale=heads(config)[2] ** -0.5)

    def final_softcap(self, config):
        """The final logit soft-cap (None: none)."""
        return None

    def embed_input(self, input_ids_BL, positions_BL, dropout_key):
        return self.embed(input_ids_BL).astype(self.dtype) * jnp.asarray(self.embed_scale, self.dtype)

    def call_layer(self, i, layer, x_BLD, attention_mask_BL, positions_BL, dropout_key, *cached):
        return layer(x_BLD, positions_BL, attention_mask_BL, fold_key(dropout_key, i), *cached)


def tensor_names(config, post_norms=False, qk_norm=False):
    """Tensor names of GemmaForCausalLM -> our paths (post_norms: Gemma 2's and 3's four norms per layer;
    qk_norm: Gemma 3's per-head query and key norms). Biases only with attention_bias; lm_head only when
    untied."""
    bias = getattr(config, "attention_bias", False)
    names = [("model.embed_tokens.weight", ("embed", "embedding"), "copy")]
    for i in range(config.num_hidden_layers):
        hf, ours = f"model.layers.{i}.", ("layers", str(i))
        add_norm(names, f"{hf}input_layernorm", (*ours, "attn_norm"), bias=False)
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            add_linear(names, f"{hf}self_attn.{proj}", (*ours, "attn", proj), bias)
        if qk_norm:
            add_norm(names, f"{hf}self_attn.q_norm", (*ours, "attn", "q_norm"), bias=False)
            add_norm(names, f"{hf}self_attn.k_norm", (*ours, "attn", "k_norm"), bias=False)
        if post_norms:
            add_norm(names, f"{hf}post_attention_layernorm", (*ours, "post_attn_norm"), bias=False)
            add_norm(names, f"{hf}pre_feedforward_layernorm", (*ours, "mlp_norm"), bias=False)
            add_norm(names, f"{hf}post_feedforward_layernorm", (*ours, "post_mlp_norm"), bias=False)
        else:
            add_norm(names, f"{hf}post_attention_layernorm", (*ours, "mlp_norm"), bias=False)
        for proj in ("gate_proj", "up_proj", "down_proj"):
            add_linear(names, f"{hf}mlp.{proj}", (*ours, "mlp", proj), bias=False)
    add_norm(names, "model.norm", ("final_norm",), bias=False)
    if not getattr(config, "tie_word_embeddings", True):
        add_linear(names, "lm_head", ("lm_head",), bias=False)
    return names


def normalize(config, tensors, notes):
    """Accept a bare model's checkpoint (no 'model.' prefix), drop saved RoPE buffers (computed from config.json)
    and a tied lm_head.weight (checked equal to the token embeddings)."""
    out = with_prefix(tensors, "model.", ("embed_tokens", "layers", "norm"), buffers=("inv_freq",))
    return drop_tied_head(config, out, "lm_head.weight", "model.embed_tokens.weight")


# The hub's config.json files of google/gemma-2b and gemma-7b (their "gelu" is the tanh approximation, which
# transformers substitutes); gemma-tiny is for tests and the CPU demo.
_GEMMA = dict(model_type="gemma", vocab_size=256000, max_position_embeddings=8192, hidden_act="gelu_pytorch_tanh",
              head_dim=256, rms_norm_eps=1e-6, rope_theta=10000.0, initializer_range=0.02, attention_bias=False,
              attention_dropout=0.0, tie_word_embeddings=True, pad_token_id=0, bos_token_id=2, eos_token_id=1)


def _shape(width, layers, heads, kv_heads, intermediate):
    return dict(hidden_size=width, num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=kv_heads, intermediate_size=intermediate)


PRESETS = {
    "gemma-2b": {**_GEMMA, **_shape(2048, 18, 8, 1, 16384)},
    "gemma-7b": {**_GEMMA, **_shape(3072, 28, 16, 16, 24576)},
    "gemma-tiny": {**_GEMMA, **_shape(64, 2, 4, 1, 128), "head_dim": 16, "vocab_size": 1024,
                   "max_position_embeddings": 256},
}

GEMMA = Family(model_type="gemma", name="Gemma", model=GemmaForCausalLM, tensor_names=tensor_names,
               normalize=normalize, architecture="GemmaForCausalLM", presets=PRESETS, script="run_clm_flax.py",
               max_length=lambda config: config.max_position_embeddings)
