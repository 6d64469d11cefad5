"""Qwen3: Llama's decoder (flaxlm.models.llama) with an RMSNorm over each query and key head (head_dim wide, before
RoPE), an explicit head_dim (Qwen3-0.6B: 16 heads of 128 on a width of 1024), biases only with attention_bias
(q, k, v and o_proj), the LM head tied or not.

Configured by a transformers Qwen3Config; the parameters and their Hugging Face names are LlamaForCausalLM's plus
self_attn.q_norm.weight / k_norm.weight. Sliding windows from config.layer_types as Qwen2's
(flaxlm.models.qwen2.layer_window).
"""
from flaxlm.models import llama
from flaxlm.models.family import Family
from flaxlm.models.qwen2 import layer_window


class Qwen3ForCausalLM(llama.LlamaForCausalLM):
    """Llama with per-head q/k RMSNorms and the sliding windows of config.layer_types."""

    @staticmethod
    def layer_options(config, i):
        return dict(qk_norm=True, mlp_bias=False, window=layer_window(config, i))


def tensor_names(config):
    """LlamaForCausalLM's tensor names with self_attn.q_norm.weight and k_norm.weight."""
    return llama.tensor_names(config, qk_norm=True, mlp_bias=False)


def normalize(config, tensors, notes):
    """As Llama's (flaxlm.models.llama.normalize): bare checkpoints, old buffers, a tied head."""
    return llama.normalize(config, tensors, notes)

# The Qwen3 base models' config.json (Qwen/Qwen3-*-Base); qwen3-tiny for tests and the CPU demo (head_dim 32 on a
# width of 64 with 4 heads, as the real ones' head_dim differs from width / heads).
_QWEN3 = dict(model_type="qwen3", vocab_size=151936, hidden_act="silu", rms_norm_eps=1e-6, rope_theta=1000000.0,
              initializer_range=0.02, attention_bias=False, use_sliding_window=False, sliding_window=None,
              max_window_layers=28, head_dim=128, max_position_embeddings=32768, bos_token_id=151643,
              eos_token_id=151643, attention_dropout=0.0)

PRESETS = {
    "qwen3-0.6b": {**_QWEN3, **llama._shape(1024, 28, 16, 8, 3072), "tie_word_embeddings": True},
    "qwen3-1.7b": {**_QWEN3, **llama._shape(2048, 28, 16, 8, 6144), "tie_word_embeddings": True},
    "qwen3-8b": {**_QWEN3, **llama._shape(4096, 36, 32, 8, 12288), "max_window_layers": 36,
                 "tie_word_embeddings": False},
    "qwen3-tiny": {**_QWEN3, **llama._shape(64, 2, 4, 2, 176), "head_dim": 32, "vocab_size": 1024,
                   "max_position_embeddings": 256, "max_window_layers": 2, "tie_word_embeddings": True,
                   "bos_token_id": 1, "eos_token_id": 2},
}

QWEN3 = Family(model_type="qwen3", name="Qwen3", model=Qwen3ForCausalLM, tensor_names=tensor_names,
               normalize=normalize, architecture="Qwen3ForCausalLM", presets=PRESETS, script="run_clm_flax.py",
               max_length=lambda config: config.max_position_embeddings)
