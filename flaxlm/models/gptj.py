"""GPT-J: a decoder whose layers run attention and the MLP in parallel from one LayerNorm
(x + attn(ln(x)) + mlp(ln(x))), with rotary positions on the first rotary_dim features of each head, rotated in
interleaved pairs (2i, 2i + 1) (transformers' rotate_every_two, not Llama's halves), and an untied LM head with a
bias.

Configured by a transformers GPTJConfig; the parameters map 1:1 to GPTJForCausalLM's: transformer.wte -> embed,
h.{i}.ln_1 -> norm, attn.{q,k,v,out}_proj (no biases) -> attn.q / k / v / out, mlp.fc_in / fc_out -> fc_in /
fc_out, ln_f -> final_norm, lm_head (weight and bias) -> lm_head (only its bias when tie_word_embeddings ties the
weight to wte). The decoder-only interface of every causal-LM family is flaxlm.models.decoder's. Below the model:
its Hugging Face tensor names, its presets and its Family.

Shape suffixes as in layers.py, plus R = rotary_dim / 2 rotary frequencies.
"""
from types import SimpleNamespace

import jax.numpy as jnp
from flax import nnx

from flaxlm.errors import UserError
from flaxlm.models import kv_cache
from flaxlm.models.decoder import CausalLM
from flaxlm.models.family import Family, add_linear, add_norm, config_ties, drop_tied_head, with_prefix
from flaxlm.models.layer_stack import Execution
from flaxlm.models.layers import (LMHead, LayerNorm, activation, attention, compute_dtype, dense, dropout, embed,
                                  fold_key, with_token_rows)
from flaxlm.models.llama import fused_dense
from flaxlm.models.rope import rope_of


def rope_pairs(x_BTNH, positions_BT, rotation):
    """x's first 2R features rotated by their positions under Rope rotation (R frequencies) in interleaved pairs
    (2i, 2i + 1), GPT-J's rotate_every_two; the rest pass unchanged. Computed in float32; returns x's dtype."""
    (B, T, N, _), R = x_BTNH.shape, len(rotation.inv_freq)
    cos_BTR, sin_BTR = rotation.cos_sin(positions_BT)
    cos_BT1R, sin_BT1R = cos_BTR[:, :, None], sin_BTR[:, :, None]
    x_BTNH32 = x_BTNH.astype(jnp.float32)
    pairs_BTNR2 = x_BTNH32[..., :2 * R].reshape(B, T, N, R, 2)
    even_BTNR, odd_BTNR = pairs_BTNR2[..., 0], pairs_BTNR2[..., 1]
    rotated_BTNR2 = jnp.stack([even_BTNR * cos_BT1R - odd_BTNR * sin_BT1R,
                               odd_BTNR * cos_BT1R + even_BTNR * sin_BT1R], axis=-1)
    return jnp.concatenate([rotated_BTNR2.reshape(B, T, N, 2 * R), x_BTNH32[..., 2 * R:]],
                           axis=-1).astype(x_BTNH.dtype)


class Attention(nnx.Module):
    def __init__(self, config, dtype, rngs, execution):
        D, std = config.n_embd, config.initializer_range
        self.q, self.k, self.v, self.out = (dense(D, D, dtype, std, rngs, use_bias=False) for _ in range(4))
        self.num_heads = config.n_head
        self.dropout_rate = config.attn_pdrop
        self.implementation = execution.attention_implementation

    def __call__(self, x_BTD, positions_BT, rotation, mask_BL, key, kv=None, index=None, visible_BTS=None):
        (B, T, D), N = x_BTD.shape, self.num_heads
        q_MD, k_MD, v_MD = fused_dense(x_BTD.reshape(B * T, D), self.q, self.k, self.v)
        q_BTNH = rope_pairs(q_MD.reshape(B, T, N, D // N), positions_BT, rotation)
        k_BTNH = rope_pairs(k_MD.reshape(B, T, N, D // N), positions_BT, rotation)
        v_BTNH = v_MD.reshape(B, T, N, D // N)
        if kv is None:
            o_BTNH = attention(q_BTNH, k_BTNH, v_BTNH, mask_BL, causal=True, dropout_rate=self.dropout_rate,
                               dropout_key=key, implementation=self.implementation)
        else:
            o_BTNH, kv = kv_cache.attend(q_BTNH, kv, k_BTNH, v_BTNH, index, visible_BTS)
        return self.out(o_BTNH.reshape(B * T, D)), kv


class Block(nnx.Module):
    """Attention and MLP side by side on one LayerNorm's output, both added to the residual."""

    def __init__(self, config, dtype, rngs, execution):
        D, std = config.n_embd, config.initializer_range
        F = config.n_inner or 4 * D
        self.norm = LayerNorm(D, config.layer_norm_epsilon, rngs)
        self.attn = Attention(config, dtype, rngs, execution)
        self.fc_in = dense(D, F, dtype, std, rngs)
        self.fc_out = dense(F, D, dtype, std, rngs)
        self.act = config.activation_function
        self.dropout_rate = config.resid_pdrop

    def __call__(self, x_BTD, positions_BT, rotation, mask_BL, key, kv=None, index=None, visible_BTS=None):
        B, T, D = x_BTD.shape
        h_BTD = self.norm(x_BTD)
        a_MD, kv = self.attn(h_BTD, positions_BT, rotation, mask_BL, fold_key(key, 0), kv, index, visible_BTS)
        m_MD = self.fc_out(activation(self.act)(self.fc_in(h_BTD.reshape(B * T, D))))
        x_MD = x_BTD.reshape(B * T, D) + dropout(a_MD, self.dropout_rate, fold_key(key, 1)) + \
            dropout(m_MD, self.dropout_rate, fold_key(key, 2))
        return x_MD.reshape(B, T, D), kv


class HeadBias(nnx.Module):
    """The LM head's bias alone (a head whose weight is tied to the token embeddings)."""

    def __init__(self, vocab_size):
        self.bias = nnx.Param(jnp.zeros((vocab_size,), jnp.float32))


class GPTJForCausalLM(CausalLM):
    """GPT-J with its LM head (a Linear with bias; its weight tied to wte only if config.tie_word_embeddings);
    execution: how the layers run (flaxlm.models.layer_stack.Execution; default a plain loop)."""

    def __init__(self, config, *, dtype="float32", rngs, execution=None):
        D, N = config.n_embd, config.n_head
        if D % N:
            raise UserError(f"n_embd {D} is not a multiple of n_head {N}; fix config.json")
        rotary_dim = config.rotary_dim
        if rotary_dim is None or rotary_dim % 2 or not 0 < rotary_dim <= D // N:
            raise UserError(f"rotary_dim {rotary_dim} must be even and at most the head width {D // N}; "
                            f"fix config.json")
        activation(config.activation_function)
        self.rope = rope_of(SimpleNamespace(rope_theta=10000.0), rotary_dim)  # GPT-J's fixed base
        self.dtype = compute_dtype(dtype)
        V, std = config.vocab_size, config.initializer_range
        Vp = self.vocab_rows(config, execution)  # V, or more with --pad_vocab_multiple
        self.embed = embed(Vp, D, std, rngs, drawn=V)
        self.execution = execution or Execution()
        self.layers = nnx.List([Block(config, self.dtype, rngs, self.execution) for _ in range(config.n_layer)])
        self.final_norm = LayerNorm(D, config.layer_norm_epsilon, rngs)
        self.tied = config_ties(config)
        self.lm_head = HeadBias(Vp) if self.tied else dense(D, Vp, self.dtype, std, rngs, drawn=V)
        self.dropout_rate = config.embd_pdrop
        self.kv_heads, self.head_dim = N, D // N
        self.max_positions = config.n_positions

    def embed_input(self, input_ids_BL, positions_BL, dropout_key):
        return dropout(self.embed(input_ids_BL).astype(self.dtype), self.dropout_rate, fold_key(dropout_key, 0))

    def call_layer(self, i, layer, x_BLD, attention_mask_BL, positions_BL, dropout_key, *cached):
        return layer(x_BLD, positions_BL, self.rope, attention_mask_BL, fold_key(dropout_key, i + 1), *cached)

    def head(self):
        """The LM head with its bias: the token embeddings (tied) or lm_head's kernel."""
        weight = (with_token_rows(self.embed, self.embed.embedding[...]) if self.tied
                  else with_token_rows(self.lm_head, self.lm_head.kernel[...], axis=1))
        return LMHead(weight, self.tied, self.dtype, bias=self.lm_head.bias[...], vocab_size=self.vocab_size)


def tensor_names(config):
    """Tensor names of GPTJForCausalLM -> our paths (lm_head.weight only when untied; lm_head.bias always)."""
    names = [("transformer.wte.weight", ("embed", "embedding"), "copy")]
    for i in range(config.n_layer):
        hf, ours = f"transformer.h.{i}.", ("layers", str(i))
        add_norm(names, f"{hf}ln_1", (*ours, "norm"))
        for proj, our in (("q_proj", "q"), ("k_proj", "k"), ("v_proj", "v"), ("out_proj", "out")):
            add_linear(names, f"{hf}attn.{proj}", (*ours, "attn", our), bias=False)
        add_linear(names, f"{hf}mlp.fc_in", (*ours, "fc_in"))
        add_linear(names, f"{hf}mlp.fc_out", (*ours, "fc_out"))
    add_norm(names, "transformer.ln_f", ("final_norm",))
    if config_ties(config):
        names.append(("lm_head.bias", ("lm_head", "bias"), "copy"))
    else:
        add_linear(names, "lm_head", ("lm_head",))
    return names


def normalize(config, tensors, notes):
    """Accept a bare GPTJModel's names (no 'transformer.' prefix), drop the buffers older transformers saved (the
    causal mask attn.bias / masked_bias, the sinusoid table attn.embed_positions), and a tied lm_head.weight
    (checked equal to wte)."""
    out = with_prefix(tensors, "transformer.", ("wte", "h", "ln_f"),
                      buffers=(".attn.bias", ".attn.masked_bias", ".attn.embed_positions"))
    return drop_tied_head(config, out, "lm_head.weight", "transformer.wte.weight")


# EleutherAI/gpt-j-6b; gptj-tiny is for tests and the CPU demo.
_GPTJ = dict(model_type="gptj", vocab_size=50400, n_positions=2048, activation_function="gelu_new", resid_pdrop=0.0,
             embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5, initializer_range=0.02,
             tie_word_embeddings=False, bos_token_id=50256, eos_token_id=50256)


def _shape(width, layers, heads, rotary_dim):
    return dict(n_embd=width, n_layer=layers, n_head=heads, rotary_dim=rotary_dim)


PRESETS = {
    "gpt-j-6b": {**_GPTJ, **_shape(4096, 28, 16, 64)},
    "gptj-tiny": {**_GPTJ, **_shape(64, 2, 4, 8), "vocab_size": 1024, "n_positions": 256,
                  "bos_token_id": 1023, "eos_token_id": 1023},  # <|endoftext|> last, as GPT-2's
}

GPTJ = Family(model_type="gptj", name="GPT-J", model=GPTJForCausalLM, tensor_names=tensor_names, normalize=normalize,
              architecture="GPTJForCausalLM", presets=PRESETS, script="run_clm_flax.py",
              max_length=lambda config: config.n_positions)
