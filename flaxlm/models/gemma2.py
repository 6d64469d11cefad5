"""Gemma 2: Gemma (gemma.py) with four norms per layer, soft-capped attention and final logits, and sliding-window
layers alternating with global ones.

Configured by a transformers Gemma2Config; the parameters map 1:1 to Gemma2ForCausalLM's: Gemma's names plus
model.layers.i.{pre_feedforward_layernorm, post_feedforward_layernorm} (our mlp_norm, post_mlp_norm), and
post_attention_layernorm now normalizes the attention's output (our post_attn_norm). Per layer
config.layer_types says "sliding_attention" (a query sees the last sliding_window tokens) or "full_attention"
(transformers fills it in: sliding, full, sliding, ...). Scores are scaled by query_pre_attn_scalar**-0.5 and
soft-capped by attn_logit_softcapping (cap * tanh(score / cap)); the logits by final_logit_softcapping.
The MLP's activation is config.hidden_activation. Layers that differ in their window cannot run under
--scan_layers.
"""
from flaxlm.errors import UserError
from flaxlm.models.family import Family
from flaxlm.models.gemma import Block as GemmaBlock
from flaxlm.models.gemma import GemmaForCausalLM, norm, normalize as gemma_normalize, tensor_names as gemma_tensor_names
from flaxlm.models.llama import heads
from flaxlm.models.rope import rope_of

LAYER_TYPES = ("sliding_attention", "full_attention")


class Block(GemmaBlock):
    """Gemma 2's and 3's layer: x + post_attn_norm(attn(attn_norm(x))), then x + post_mlp_norm(mlp(mlp_norm(x)))."""

    def __init__(self, config, dtype, rngs, execution, act, **attention_settings):
        super().__init__(config, dtype, rngs, execution, act, **attention_settings)
        self.post_attn_norm = norm(config.hidden_size, config.rms_norm_eps)
        self.post_mlp_norm = norm(config.hidden_size, config.rms_norm_eps)

    def __call__(self, x_BTD, positions_BT, mask_BL, key, kv=None, index=None, visible_BTS=None):
        B, T, D = x_BTD.shape
        a_MD, kv = self.attn(self.attn_norm(x_BTD), positions_BT, mask_BL, key, kv, index, visible_BTS)
        x_MD = x_BTD.reshape(B * T, D) + self.post_attn_norm(a_MD)
        return (x_MD + self.post_mlp_norm(self.mlp(self.mlp_norm(x_MD)))).reshape(B, T, D), kv


def layer_types(config):
    """config.layer_types, checked: one of LAYER_TYPES per layer."""
    types = list(getattr(config, "layer_types", None) or [])
    if len(types) != config.num_hidden_layers or any(t not in LAYER_TYPES for t in types):
        raise UserError(f"config.json's layer_types must list {config.num_hidden_layers} entries, each one of "
                        f"{', '.join(LAYER_TYPES)}; got {types}")
    return types


def window(config, layer_type):
    """The layer's sliding window (None: global attention)."""
    return config.sliding_window if layer_type == "sliding_attention" else None


class Gemma2ForCausalLM(GemmaForCausalLM):
    """Gemma 2 with its LM head (tied unless config.tie_word_embeddings is false), soft-capped."""

    def make_layer(self, config, i, rngs):
        H = heads(config)[2]
        return Block(config, self.dtype, rngs, self.execution, config.hidden_activation,
                     rotation=rope_of(config, H), scale=config.query_pre_attn_scalar ** -0.5,
                     window=window(config, layer_types(config)[i]), softcap=config.attn_logit_softcapping)

    def final_softcap(self, config):
        return config.final_logit_softcapping


def tensor_names(config):
    """Gemma's tensor names with the four norms per layer."""
    return gemma_tensor_names(config, post_norms=True)



def normalize(config, tensors, notes):
    """As Gemma's: a bare model's checkpoint, saved RoPE buffers, a tied lm_head.weight."""
    return gemma_normalize(config, tensors, notes)


# The hub's config.json files of google/gemma-2-2b and gemma-2-9b; gemma2-tiny is for tests and the CPU demo.
_GEMMA2 = dict(model_type="gemma2", vocab_size=256000, max_position_embeddings=8192,
               hidden_activation="gelu_pytorch_tanh", head_dim=256, rms_norm_eps=1e-6, rope_theta=10000.0,
               initializer_range=0.02, attention_bias=False, attention_dropout=0.0, query_pre_attn_scalar=256,
               sliding_window=4096, final_logit_softcapping=30.0, attn_logit_softcapping=50.0,
               tie_word_embeddings=True, pad_token_id=0, bos_token_id=2, eos_token_id=1)


def _shape(width, layers, heads, kv_heads, intermediate):
    return dict(hidden_size=width, num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=kv_heads, intermediate_size=intermediate)


PRESETS = {
    "gemma-2-2b": {**_GEMMA2, **_shape(2304, 26, 8, 4, 9216)},
    "gemma-2-9b": {**_GEMMA2, **_shape(3584, 42, 16, 8, 14336)},
    "gemma2-tiny": {**_GEMMA2, **_shape(64, 2, 4, 2, 128), "head_dim": 16, "query_pre_attn_scalar": 16,
                    "sliding_window": 32, "vocab_size": 1024, "max_position_embeddings": 256},
}

GEMMA2 = Family(model_type="gemma2", name="Gemma 2", model=Gemma2ForCausalLM, tensor_names=tensor_names,
                normalize=normalize, architecture="Gemma2ForCausalLM", presets=PRESETS, script="run_clm_flax.py",
                max_length=lambda config: config.max_position_embeddings)
