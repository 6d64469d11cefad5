"""OLMoE (allenai/OLMoE-1B-7B): Llama's decoder (flaxlm.models.llama) with a mixture of experts in every layer
(flaxlm.models.moe.SparseMoE: config.num_experts SwiGLU experts of width config.intermediate_size, the
config.num_experts_per_tok most probable per token, renormalized only with config.norm_topk_prob, false as
released). Its attention normalizes the whole query and key projections (one RMSNorm over the N * H query features,
one over the K * H key features, before RoPE; not per head as Qwen3's), then clips q, k and v to
[-config.clip_qkv, config.clip_qkv] when config.clip_qkv is set.

Configured by a transformers OlmoeConfig; the parameters map 1:1 to OlmoeForCausalLM's: Llama's, self_attn.q_norm
and k_norm, and in each layer mlp.gate.weight (the router) and transformers 5's fused mlp.experts.gate_up_proj
[E, 2I, D] and down_proj [E, D, I]. Checkpoints hold the experts either fused or one tensor per expert (the hub's
layout, which transformers' save_pretrained writes too): both load; exports are per expert (as Qwen3-MoE's).
The load-balancing loss (config.router_aux_loss_coef, config.output_router_logits) is flaxlm.models.moe's.
"""
from flaxlm.errors import UserError
from flaxlm.models import llama
from flaxlm.models.family import Family
from flaxlm.models.layers import RMSNorm
from flaxlm.models.moe import (SparseMoE, check_experts, expert_matrices, expert_tensor_names,
                               split_experts, stack_experts)


class Block(llama.Block):
    """Llama's block (its __call__) with the experts (of width config.intermediate_size) in place of the MLP."""

    def __init__(self, config, dtype, rngs, execution, **attention_options):
        D, eps = config.hidden_size, config.rms_norm_eps
        self.attn_norm = RMSNorm(D, eps)
        self.attn = llama.Attention(config, dtype, rngs, execution, **attention_options)
        self.mlp_norm = RMSNorm(D, eps)
        self.mlp = SparseMoE(config, dtype, rngs, execution, width=config.intermediate_size)


class OlmoeForCausalLM(llama.LlamaForCausalLM):
    """Llama with whole-projection q/k norms, clip_qkv and sparse expert layers (Block)."""
    block = Block

    def __init__(self, config, *, dtype="float32", rngs, execution=None):
        check_experts(config)
        if config.num_experts < 1:
            raise UserError(f"num_experts {config.num_experts} must be at least 1 for OLMoE; fix config.json")
        N, _, H = llama.heads(config)
        if N * H != config.hidden_size:  # transformers' q_norm is hidden_size wide: the heads must fill it
            raise UserError(f"num_attention_heads {N} * head_dim {H} must equal hidden_size {config.hidden_size} "
                            f"for OLMoE; fix config.json")
        super().__init__(config, dtype=dtype, rngs=rngs, execution=execution)

    @staticmethod
    def layer_options(config, i):
        return dict(qk_norm="whole", clip_qkv=getattr(config, "clip_qkv", None))


def tensor_names(config):
    """LlamaForCausalLM's tensor names with self_attn.q_norm / k_norm, each MLP replaced by the router and experts."""
    return expert_tensor_names(llama.tensor_names(config, qk_norm=True, mlp_bias=False), lambda i: True)


def normalize(config, tensors, notes):
    """As Llama's (bare checkpoints, old buffers, a tied head), and per-expert tensors stacked into the fused ones."""
    return stack_experts(llama.normalize(config, tensors, notes), config.num_experts)


def export(config, tensors):
    """The experts per expert, as transformers' save_pretrained writes them (and the hub holds them)."""
    return split_experts(tensors)


# allenai/OLMoE-1B-7B-0924's config.json (6.9B parameters, 1.3B active); olmoe-tiny for tests and the CPU demo
# (8 experts of width 32, 2 per token).
_OLMOE = dict(model_type="olmoe", vocab_size=50304, hidden_act="silu", rms_norm_eps=1e-5, rope_theta=10000.0,
              initializer_range=0.02, attention_bias=False, attention_dropout=0.0, clip_qkv=None,
              max_position_embeddings=4096, pad_token_id=1, bos_token_id=None, eos_token_id=50279,
              tie_word_embeddings=False, norm_topk_prob=False, output_router_logits=False, router_aux_loss_coef=0.01)

PRESETS = {
    "olmoe-1b-7b": {**_OLMOE, **llama._shape(2048, 16, 16, 16, 1024), "num_experts": 64, "num_experts_per_tok": 8},
    "olmoe-tiny": {**_OLMOE, **llama._shape(64, 2, 4, 4, 32), "num_experts": 8, "num_experts_per_tok": 2,
                   "vocab_size": 1024, "max_position_embeddings": 256, "pad_token_id": None, "bos_token_id": 1,
                   "eos_token_id": 2},
}

OLMOE = Family(model_type="olmoe", name="OLMoE", model=OlmoeForCausalLM, tensor_names=tensor_names,
               normalize=normalize, architecture="OlmoeForCausalLM", presets=PRESETS, script="run_clm_flax.py",
               max_length=lambda config: config.max_position_embeddings, export=export, matrices=expert_matrices)
