"""Qwen2 / Qwen2.5: Llama's decoder (flaxlm.models.llama) with biases on the q, k and v projections (none on o_proj
or the MLP), the LM head tied or not (config.tie_word_embeddings).

Configured by a transformers Qwen2Config; the parameters and their Hugging Face names are LlamaForCausalLM's plus
self_attn.{q,k,v}_proj.bias. Sliding windows as transformers applies them: config.layer_types (filled in by the
config from use_sliding_window and max_window_layers: layers max_window_layers.. slide) names each layer
"full_attention" or "sliding_attention"; a sliding layer's query sees the config.sliding_window keys up to its own.
Layers that differ in their window cannot be scanned (--scan_layers); the released models use no window.
"""
from flaxlm.errors import UserError
from flaxlm.models import llama
from flaxlm.models.family import Family

LAYER_TYPES = ("full_attention", "sliding_attention")


def layer_window(config, i):
    """Layer i's sliding window (None: full attention), from config.layer_types and config.sliding_window."""
    layer_types = getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers
    if len(layer_types) != config.num_hidden_layers or not set(layer_types) <= set(LAYER_TYPES):
        raise UserError(f"layer_types {layer_types} must name each of the {config.num_hidden_layers} layers "
                        f"{' or '.join(LAYER_TYPES)}; fix config.json")
    if layer_types[i] == "full_attention":
        return None
    window = getattr(config, "sliding_window", None)
    if not isinstance(window, int) or window < 1:
        raise UserError(f"layer_types has sliding_attention layers but sliding_window is {window!r} (it is null "
                        f"unless use_sliding_window is true); set sliding_window to a positive integer in config.json")
    return window


class Qwen2ForCausalLM(llama.LlamaForCausalLM):
    """Llama with q/k/v biases and the sliding windows of config.layer_types."""

    @staticmethod
    def layer_options(config, i):
        return dict(qkv_bias=True, o_bias=False, mlp_bias=False, window=layer_window(config, i))


def tensor_names(config):
    """LlamaForCausalLM's tensor names with self_attn.{q,k,v}_proj.bias."""
    return llama.tensor_names(config, qkv_bias=True, o_bias=False, mlp_bias=False)


def normalize(config, tensors, notes):
    """As Llama's (flaxlm.models.llama.normalize): bare checkpoints, old buffers, a tied head."""
    return llama.normalize(config, tensors, notes)


# The Qwen2.5 base models' config.json (Qwen/Qwen2.5-*): the small ones tie their LM head; qwen2-tiny for tests and
# the CPU demo. Their sliding_window (32768 / 131072) is left out: with use_sliding_window false the config sets it
# to None.
_QWEN2 = dict(model_type="qwen2", vocab_size=151936, hidden_act="silu", rms_norm_eps=1e-6, rope_theta=1000000.0,
              initializer_range=0.02, use_sliding_window=False, bos_token_id=151643, eos_token_id=151643,
              attention_dropout=0.0)

PRESETS = {
    "qwen2.5-0.5b": {**_QWEN2, **llama._shape(896, 24, 14, 2, 4864), "max_position_embeddings": 32768,
                     "max_window_layers": 24, "tie_word_embeddings": True},
    "qwen2.5-1.5b": {**_QWEN2, **llama._shape(1536, 28, 12, 2, 8960), "max_position_embeddings": 131072,
                     "max_window_layers": 21, "tie_word_embeddings": True},
    "qwen2.5-7b": {**_QWEN2, **llama._shape(3584, 28, 28, 4, 18944), "vocab_size": 152064,
                   "max_position_embeddings": 131072, "max_window_layers": 28, "tie_word_embeddings": False},
    "qwen2-tiny": {**_QWEN2, **llama._shape(64, 2, 4, 2, 176), "vocab_size": 1024, "max_position_embeddings": 256,
                   "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2},
}

QWEN2 = Family(model_type="qwen2", name="Qwen2", model=Qwen2ForCausalLM, tensor_names=tensor_names,
               normalize=normalize, architecture="Qwen2ForCausalLM", presets=PRESETS, script="run_clm_flax.py",
               max_length=lambda config: config.max_position_embeddings)
