"""OPT: a decoder with learned positions (offset by 2), pre- or post-LayerNorm layers, and the LM head tied to
the token embeddings, optionally narrower than the model (word_embed_proj_dim, with project_in/project_out).

Configured by a transformers OPTConfig; the parameters map 1:1 to OPTForCausalLM's. The decoder-only interface
of flaxlm.models.gpt2: model(ids_BL, mask_BL, positions_BL, dropout_key=key), model.init_cache(batch, length),
model(ids_BT, mask_BT, positions_BT, cache=cache) -> (logits_BTV, cache), model(ids_BL, hidden=True) and
model.head() for a fused head + loss. Positions are 0-based.
"""
from flax import nnx

from flaxlm.errors import UserError
from flaxlm.models import kv_cache
from flaxlm.models.gpt2 import embed
from flaxlm.models.layer_stack import Execution
from flaxlm.models.layers import LayerNorm, LMHead, activation, attention, compute_dtype, dense, dropout, fold_key

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


class OPTForCausalLM(nnx.Module):
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
        self.embed = embed(V, W, std, rngs)
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
            self.lm_head = dense(W, V, self.dtype, std, rngs, use_bias=False)
        self.num_heads, self.head_dim = config.num_attention_heads, D // config.num_attention_heads
        self.max_positions = config.max_position_embeddings

    def init_cache(self, batch, length):
        return kv_cache.init_cache(len(self.layers), batch, length, self.num_heads, self.head_dim, self.dtype)

    def __call__(self, input_ids_BL, attention_mask_BL=None, positions_BL=None, *, dropout_key=None, cache=None,
                 hidden=False):
        """Logits [B, L, V] (float32), or with hidden=True the rows [B, L, W] that the head multiplies (after
        the final norm and project_out; see head()); with a cache, (that, the updated cache)."""
        if positions_BL is None:
            positions_BL = kv_cache.default_positions(input_ids_BL, cache)
        e_BLW = self.embed(input_ids_BL)
        B, L, W = e_BLW.shape
        e_BLD = self.project_in(e_BLW.reshape(B * L, W)).reshape(B, L, -1) if self.projected else e_BLW
        x_BLD = (e_BLD + self.position(positions_BL + POSITION_OFFSET)).astype(self.dtype)
        x_BLD, cache = kv_cache.run_layers(
            self.layers, x_BLD, attention_mask_BL, cache,
            lambda i, layer, x, *cached: layer(x, attention_mask_BL, fold_key(dropout_key, i + 1), *cached),
            self.execution)
        h_BLW = self.head_input(x_BLD if self.final_norm is None else self.final_norm(x_BLD))
        out = h_BLW if hidden else self.head().logits(h_BLW)
        return out if cache is None else (out, cache)

    def head_input(self, h_BLD):
        """The final hidden states (after the final norm) in the embedding width: project_out applied."""
        if not self.projected:
            return h_BLD
        B, L, D = h_BLD.shape
        return self.project_out(h_BLD.reshape(B * L, D).astype(self.dtype)).reshape(B, L, -1)

    def head(self):
        """The LM head: the token embeddings (tied) or lm_head's kernel."""
        return LMHead(self.embed.embedding[...] if self.tied else self.lm_head.kernel[...], self.tied, self.dtype)

