"""Mistral: Llama's decoder (flaxlm.models.llama) with sliding-window attention in every layer.

Configured by a transformers MistralConfig; the parameters and their Hugging Face names are LlamaForCausalLM's
without biases (Mistral has none, whatever config.json says). config.sliding_window W (None: full attention) lets a
query see only the W keys up to its own, in training and in the KV cache's decoding alike, as transformers' mask
does (query slot - key slot < W). transformers' Mistral ignores a config's layer_types (a Ministral setting): so do
we.
"""
from flaxlm.errors import UserError
from flaxlm.models import llama
from flaxlm.models.family import Family


def sliding_window(config):
    """config.sliding_window, checked: None or a positive int."""
    window = getattr(config, "sliding_window", None)
    if window is not None and (not isinstance(window, int) or window < 1):
        raise UserError(f"sliding_window {window!r} must be a positive integer or null; fix config.json")
    return window


class MistralForCausalLM(llama.LlamaForCausalLM):
    """Llama with a sliding window in every layer and no biases."""

    @staticmethod
    def layer_options(config, i):
        return dict(qkv_bias=False, o_bias=False, mlp_bias=False, window=sliding_window(config))


def tensor_names(config):
    """LlamaForCausalLM's tensor names without biases."""
    return llama.tensor_names(config, qkv_bias=False, o_bias=False, mlp_bias=False)


def normalize(config, tensors, notes):
    """As Llama's (flaxlm.models.llama.normalize): bare checkpoints, old buffers, a tied head."""
    return llama.normalize(config, tensors, notes)

# mistral-7b: Mistral-7B-v0.1 (a 4096 window); mistral-7b-v0.3: its larger vocabulary, rope_theta 1e6, no window;
# mistral-tiny for tests and the CPU demo, with a window shorter than its training rows.
_MISTRAL = dict(model_type="mistral", vocab_size=32000, max_position_embeddings=32768, hidden_act="silu",
                rms_norm_eps=1e-5, rope_theta=10000.0, initializer_range=0.02, sliding_window=4096,
                tie_word_embeddings=False, pad_token_id=None, bos_token_id=1, eos_token_id=2)

PRESETS = {
    "mistral-7b": {**_MISTRAL, **llama._shape(4096, 32, 32, 8, 14336)},
    "mistral-7b-v0.3": {**_MISTRAL, **llama._shape(4096, 32, 32, 8, 14336), "vocab_size": 32768,
                        "rope_theta": 1000000.0, "sliding_window": None},
    "mistral-tiny": {**_MISTRAL, **llama._shape(64, 2, 4, 2, 176), "vocab_size": 1024, "max_position_embeddings": 256,
                     "sliding_window": 16},
}

MISTRAL = Family(model_type="mistral", name="Mistral", model=MistralForCausalLM, tensor_names=tensor_names,
                 normalize=normalize, architecture="MistralForCausalLM", presets=PRESETS,
                 script="run_clm_flax.py", max_length=lambda config: config.max_position_embeddings)
