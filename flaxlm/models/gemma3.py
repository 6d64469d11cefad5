"""Gemma 3's text model: Gemma 2 (gemma2.py) with per-head query/key norms and a RoPE of its own for the local
(sliding-window) and the global layers, without soft-capping by default.

Configured by a transformers Gemma3TextConfig (model_type gemma3_text: google/gemma-3-1b-pt, and the text part of
the larger multimodal models); the parameters map 1:1 to Gemma3ForCausalLM's: Gemma 2's names plus
model.layers.i.self_attn.{q_norm, k_norm} ((1 + w) RMSNorms over head_dim, before RoPE). transformers 5 keeps the
RoPE settings per layer type in config.rope_parameters {"sliding_attention": {...}, "full_attention": {...}}
(from an old config.json's rope_local_base_freq, and rope_theta / rope_scaling for the global layers: Gemma 3 4B's
global layers divide their frequencies by a linear factor 8). layer_types: 5 local layers, then a global one.
final_logit_softcapping applies if set; attn_logit_softcapping is ignored, as transformers' Gemma 3 ignores it.
"""
from types import SimpleNamespace

from flaxlm.errors import UserError
from flaxlm.models.family import Family
from flaxlm.models.gemma import normalize as gemma_normalize, tensor_names as gemma_tensor_names
from flaxlm.models.gemma2 import Block, Gemma2ForCausalLM, layer_types, window
from flaxlm.models.llama import heads
from flaxlm.models.rope import rope_of


def layer_rope(config, layer_type):
    """The Rope of a layer type (config.rope_parameters[layer_type])."""
    params = (getattr(config, "rope_parameters", None) or {}).get(layer_type)
    if not params:
        raise UserError(f"config.json's rope_parameters has no entry for {layer_type}; give both "
                        f"sliding_attention and full_attention")
    return rope_of(SimpleNamespace(rope_parameters=params, max_position_embeddings=config.max_position_embeddings),
                   heads(config)[2])


class Gemma3ForCausalLM(Gemma2ForCausalLM):
    """Gemma 3's text model with its LM head (tied unless config.tie_word_embeddings is false)."""

    def make_layer(self, config, i, rngs):
        kind = layer_types(config)[i]
        return Block(config, self.dtype, rngs, self.execution, config.hidden_activation,
                     rotation=layer_rope(config, kind), scale=config.query_pre_attn_scalar ** -0.5,
                     window=window(config, kind), qk_norm=True)


def tensor_names(config):
    """Gemma 2's tensor names with the query and key norms."""
    return gemma_tensor_names(config, post_norms=True, qk_norm=True)



def normalize(config, tensors, notes):
    """As Gemma's: a bare model's checkpoint, saved RoPE buffers, a tied lm_head.weight."""
    return gemma_normalize(config, tensors, notes)


# The hub's google/gemma-3-1b-pt config.json, and the text_config of google/gemma-3-4b-pt's as a
# Gemma3TextConfig, in transformers 5's form: their rope_local_base_freq (the local layers' theta), rope_theta and
# rope_scaling (the global layers') in rope_parameters, sliding_window_pattern 6 as layer_types. gemma3-tiny is for
# tests and the CPU demo.
_GEMMA3 = dict(model_type="gemma3_text", hidden_activation="gelu_pytorch_tanh", head_dim=256, rms_norm_eps=1e-6,
               initializer_range=0.02, attention_bias=False, attention_dropout=0.0, query_pre_attn_scalar=256,
               final_logit_softcapping=None, attn_logit_softcapping=None, tie_word_embeddings=True, pad_token_id=0,
               bos_token_id=2, eos_token_id=1)
_LOCAL = {"rope_type": "default", "rope_theta": 10000.0}


def _shape(width, layers, heads, kv_heads, intermediate):
    return dict(hidden_size=width, num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=kv_heads, intermediate_size=intermediate,
                layer_types=["full_attention" if i % 6 == 5 else "sliding_attention" for i in range(layers)])


PRESETS = {
    "gemma-3-1b": {**_GEMMA3, **_shape(1152, 26, 4, 1, 6912), "vocab_size": 262144,
                   "max_position_embeddings": 32768, "sliding_window": 512,
                   "rope_parameters": {"sliding_attention": _LOCAL,
                                       "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}}},
    "gemma-3-4b": {**_GEMMA3, **_shape(2560, 34, 8, 4, 10240), "vocab_size": 262208,
                   "max_position_embeddings": 131072, "sliding_window": 1024,
                   "rope_parameters": {"sliding_attention": _LOCAL, "full_attention": {
                       "rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}}},
    "gemma3-tiny": {**_GEMMA3, **_shape(64, 2, 4, 2, 128), "head_dim": 16, "query_pre_attn_scalar": 16,
                    "sliding_window": 32, "vocab_size": 1024, "max_position_embeddings": 256,
                    "layer_types": ["sliding_attention", "full_attention"],
                    "rope_parameters": {"sliding_attention": _LOCAL,
                                        "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}}},
}

GEMMA3 = Family(model_type="gemma3_text", name="Gemma 3", model=Gemma3ForCausalLM, tensor_names=tensor_names,
                normalize=normalize, architecture="Gemma3ForCausalLM", presets=PRESETS, script="run_clm_flax.py",
                max_length=lambda config: config.max_position_embeddings)
