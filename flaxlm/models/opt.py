"""OPT: a decoder with learned positions (offset by 2), pre- or post-LayerNorm layers, and the LM head tied to
the token embeddings, optionally narrower than the model (word_embed_proj_dim, with project_in/project_out).

Configured by a transformers OPTConfig; the parameters map 1:1 to OPTForCausalLM's. The decoder-only interface
of every causal-LM family (flaxlm.models.decoder); positions are 0-based. Below the model: its Hugging Face tensor
names, its presets and its Family.
"""
from flax import nnx

from flaxlm.errors import UserError
from flaxlm.models import kv_cache
from flaxlm.models.decoder import CausalLM
from flaxlm.models.family import Family, add_linear, add_norm, drop_tied_head, with_prefix
from flaxlm.models.layer_stack import Execution
from flaxlm.models.layers import LayerNorm, activation, attention, compute_dtype, dense, dropout, embed, fold_key

POSITION_OFFSET = 2  # OPT's embed_positions table has 2 extra leading rows; position p uses row p + 2


def layer_norm(config, rngs):
    """torch's nn.LayerNorm (eps 1e-5); without scale and bias when layer_norm_elementwise_affine is false."""
    norm = LayerNorm(config.hidden_size, 1e-5, rngs)
    if not config.layer_norm_elementwise_affine:
        norm.scale, norm.bias = nnx.data(None), nnx.data(None)
    return norm


class Attention(nnx.Module):
    def __init__(self, config, dtype, rngs, execution):
        D, std, bias = config.hidden_size, config.init_std, config.enable_bias
        self.q, self.k, self.v, self.out = (dense(D, D, dtype, std, rngs, use_bias=bias) for _ in range(4))
        self.num_heads = config.num_attention_heads
        self.dropout_rate = config.attention_dropout
        self.implementation = execution.attention_implementation

    def __call__(self, x_BTD, mask_BL, key, kv=None, index=None, visible_BTS=None):
        (B, T, D), N = x_BTD.shape, self.num_heads
        x_MD = x_BTD.reshape(B * T, D)
        q_BTNH, k_BTNH, v_BTNH = (proj(x_MD).reshape(B, T, N, D // N) for proj in (self.q, self.k, self.v))
        if kv is None:  # scale: head_dim ** -0.5, as OPT's
            o_BTNH = attention(q_BTNH, k_BTNH, v_BTNH, mask_BL, causal=True, dropout_rate=self.dropout_rate,
                               dropout_key=key, implementation=self.implementation)
        else:
            o_BTNH, kv = kv_cache.attend(q_BTNH, kv, k_BTNH, v_BTNH, index, visible_BTS)
        return self.out(o_BTNH.reshape(B * T, D)), kv


class Block(nnx.Module):
    def __init__(self, config, dtype, rngs, execution):
        D, F, std, bias = config.hidden_size, config.ffn_dim, config.init_std, config.enable_bias
        self.attn_norm = layer_norm(config, rngs)  # Hugging Face's self_attn_layer_norm
        self.attn = Attention(config, dtype, rngs, execution)
        self.mlp_norm = layer_norm(config, rngs)  # Hugging Face's final_layer_norm (of the layer)
        self.fc_in = dense(D, F, dtype, std, rngs, use_bias=bias)
        self.fc_out = dense(F, D, dtype, std, rngs, use_bias=bias)
        self.act = config.activation_function
        self.dropout_rate = config.dropout
        self.pre_norm = config.do_layer_norm_before  # False (opt-350m): each norm follows its residual sum

    def __call__(self, x_BTD, mask_BL, key, kv=None, index=None, visible_BTS=None):
        B, T, D = x_BTD.shape
        h_BTD = self.attn_norm(x_BTD) if self.pre_norm else x_BTD
        a_MD, kv = self.attn(h_BTD, mask_BL, fold_key(key, 0), kv, index, visible_BTS)
        x_MD = x_BTD.reshape(B * T, D) + dropout(a_MD, self.dropout_rate, fold_key(key, 1))
        if not self.pre_norm:
            x_MD = self.attn_norm(x_MD)
        h_MD = self.fc_out(activation(self.act)(self.fc_in(self.mlp_norm(x_MD) if self.pre_norm else x_MD)))
        x_MD = x_MD + dropout(h_MD, self.dropout_rate, fold_key(key, 2))
        if not self.pre_norm:
            x_MD = self.mlp_norm(x_MD)
        return x_MD.reshape(B, T, D), kv


class OPTForCausalLM(CausalLM):
    """OPT with its LM head (tied to the token embeddings unless config.tie_word_embeddings is false); execution:
    how the layers run (flaxlm.models.layer_stack.Execution; default a plain loop)."""

    def __init__(self, config, *, dtype="float32", rngs, execution=None):
        D, W, V = config.hidden_size, config.word_embed_proj_dim, config.vocab_size
        if D % config.num_attention_heads:
            raise UserError(f"hidden_size {D} is not a multiple of num_attention_heads "
                            f"{config.num_attention_heads}; fix config.json")
        if config.layerdrop:
            raise UserError(f"layerdrop {config.layerdrop} is not supported; set it to 0.0 in config.json")
        activation(config.activation_function)
        self.dtype = compute_dtype(dtype)
        std = config.init_std
        Vp = self.vocab_rows(config, execution)  # V, or more with --pad_vocab_multiple
        self.embed = embed(Vp, W, std, rngs, drawn=V)
        pad = config.pad_token_id
        if pad is not None and 0 <= pad < V:  # Hugging Face zeroes the padding row at initialization
            self.embed.embedding[...] = self.embed.embedding[...].at[pad].set(0.0)
        self.position = embed(config.max_position_embeddings + POSITION_OFFSET, D, std, rngs)
        if W != D:  # bias-free projections between the embedding width and the model width (opt-350m)
            self.project_in = dense(W, D, self.dtype, std, rngs, use_bias=False)
            self.project_out = dense(D, W, self.dtype, std, rngs, use_bias=False)
        self.projected = W != D
        self.execution = execution or Execution()
        self.layers = nnx.List([Block(config, self.dtype, rngs, self.execution)
                                for _ in range(config.num_hidden_layers)])
        final_norm = config.do_layer_norm_before and not getattr(config, "_remove_final_layer_norm", False)
        self.final_norm = layer_norm(config, rngs) if final_norm else None  # post-LN models have none
        self.tied = getattr(config, "tie_word_embeddings", True)
        if not self.tied:
            self.lm_head = dense(W, Vp, self.dtype, std, rngs, use_bias=False, drawn=V)
        self.kv_heads, self.head_dim = config.num_attention_heads, D // config.num_attention_heads
        self.max_positions = config.max_position_embeddings

    def embed_input(self, input_ids_BL, positions_BL, dropout_key):
        e_BLW = self.embed(input_ids_BL)
        B, L, W = e_BLW.shape
        e_BLD = self.project_in(e_BLW.reshape(B * L, W)).reshape(B, L, -1) if self.projected else e_BLW
        return (e_BLD + self.position(positions_BL + POSITION_OFFSET)).astype(self.dtype)

    def head_input(self, x_BLD):
        """The rows [B, L, W] the LM head multiplies: the final norm (pre-LN models), then project_out."""
        h_BLD = x_BLD if self.final_norm is None else self.final_norm(x_BLD)
        if not self.projected:
            return h_BLD
        B, L, D = h_BLD.shape
        return self.project_out(h_BLD.reshape(B * L, D).astype(self.dtype)).reshape(B, L, -1)


def tensor_names(config):
    """Tensor names of OPTForCausalLM -> our paths. Optional: biases (enable_bias), norm tensors
    (layer_norm_elementwise_affine), project_in/out (word_embed_proj_dim), the final norm, lm_head."""
    p = "model.decoder."
    names = [(f"{p}embed_tokens.weight", ("embed", "embedding"), "copy"),
             (f"{p}embed_positions.weight", ("position", "embedding"), "copy")]

    def norm(hf, ours):
        if config.layer_norm_elementwise_affine:
            add_norm(names, hf, ours)

    def linear(hf, ours, bias=config.enable_bias):
        add_linear(names, hf, ours, bias)

    if config.word_embed_proj_dim != config.hidden_size:
        linear(f"{p}project_in", ("project_in",), bias=False)
        linear(f"{p}project_out", ("project_out",), bias=False)
    for i in range(config.num_hidden_layers):
        hf, ours = f"{p}layers.{i}.", ("layers", str(i))
        for proj in ("q", "k", "v"):
            linear(f"{hf}self_attn.{proj}_proj", (*ours, "attn", proj))
        linear(f"{hf}self_attn.out_proj", (*ours, "attn", "out"))
        norm(f"{hf}self_attn_layer_norm", (*ours, "attn_norm"))
        linear(f"{hf}fc1", (*ours, "fc_in"))
        linear(f"{hf}fc2", (*ours, "fc_out"))
        norm(f"{hf}final_layer_norm", (*ours, "mlp_norm"))
    if config.do_layer_norm_before and not getattr(config, "_remove_final_layer_norm", False):
        norm(f"{p}final_layer_norm", ("final_norm",))
    if not getattr(config, "tie_word_embeddings", True):
        linear("lm_head", ("lm_head",), bias=False)
    return names


def normalize(config, tensors, notes):
    """Accept a bare OPTModel checkpoint (names from 'decoder.', as some hub OPT files are saved) and drop a tied
    lm_head.weight (checked equal to the token embeddings)."""
    out = with_prefix(tensors, "model.", ("decoder",))
    return drop_tied_head(config, out, "lm_head.weight", "model.decoder.embed_tokens.weight")


# facebook/opt-*: opt-350m is post-LayerNorm with a 512-wide embedding projected to 1024; the tiny ones are for
# tests and the CPU demo.
_OPT = dict(model_type="opt", vocab_size=50272, max_position_embeddings=2048, do_layer_norm_before=True,
            activation_function="relu", dropout=0.1, attention_dropout=0.0, init_std=0.02, enable_bias=True,
            layer_norm_elementwise_affine=True, pad_token_id=1, bos_token_id=2, eos_token_id=2)


def _shape(width, layers, heads, ffn, proj=None, pre_ln=True):
    return dict(hidden_size=width, num_hidden_layers=layers, num_attention_heads=heads, ffn_dim=ffn,
                word_embed_proj_dim=proj or width, do_layer_norm_before=pre_ln)


PRESETS = {
    "opt-125m": {**_OPT, **_shape(768, 12, 12, 3072)},
    "opt-350m": {**_OPT, **_shape(1024, 24, 16, 4096, proj=512, pre_ln=False)},
    "opt-tiny": {**_OPT, **_shape(64, 2, 2, 256), "vocab_size": 1024, "max_position_embeddings": 256},
    "opt-350m-tiny": {**_OPT, **_shape(64, 2, 2, 256, proj=32, pre_ln=False), "vocab_size": 1024,
                      "max_position_embeddings": 256},
}

OPT = Family(model_type="opt", name="OPT", model=OPTForCausalLM, tensor_names=tensor_names, normalize=normalize,
             architecture="OPTForCausalLM", presets=PRESETS, script="run_clm_flax.py",
             max_length=lambda config: config.max_position_embeddings)
