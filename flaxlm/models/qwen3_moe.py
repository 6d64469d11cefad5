"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's decoder (flaxlm.models.qwen3: Llama's layers with a per-head
q/k RMSNorm) with a mixture of experts (flaxlm.models.moe.SparseMoE: config.num_experts SwiGLU experts of width
config.moe_intermediate_size, the config.num_experts_per_tok most probable per token, renormalized with
config.norm_topk_prob) in place of the MLP. Layer i is sparse as transformers decides: not in config.mlp_only_layers
and (i + 1) a multiple of config.decoder_sparse_step; the others keep a dense MLP of config.intermediate_size
(the released models have none). With config.use_sliding_window every layer attends within config.sliding_window.

Configured by a transformers Qwen3MoeConfig; the parameters map 1:1 to Qwen3MoeForCausalLM's: Qwen3's, and in each
sparse layer mlp.gate.weight (the router), mlp.experts.gate_up_proj [E, 2I, D] and mlp.experts.down_proj [E, D, I]
(transformers 5's fused expert tensors, our parameters as they are). Checkpoints hold the experts either fused or
one tensor per expert (mlp.experts.{e}.gate_proj.weight ..., the hub's layout, which transformers' save_pretrained
writes too): both load; exports are per expert.

The load-balancing loss (config.router_aux_loss_coef, config.output_router_logits) is flaxlm.models.moe's
load_balancing_loss over the router logits moe.router_logits() collects.
"""
from flaxlm.models import llama
from flaxlm.models.family import Family
from flaxlm.models.layers import RMSNorm
from flaxlm.models.moe import (SparseMoE, check_experts, expert_matrices, expert_tensor_names,
                               split_experts, stack_experts)


def sparse_layer(config, i):
    """Whether layer i has the experts (transformers' Qwen3MoeDecoderLayer rule) rather than a dense MLP."""
    return (i not in (getattr(config, "mlp_only_layers", None) or []) and config.num_experts > 0
            and (i + 1) % config.decoder_sparse_step == 0)


class Block(llama.Block):
    """Llama's block (its __call__) with the experts (`experts`: Qwen2-MoE's add a shared expert) in place of the MLP
    when sparse."""
    experts = SparseMoE

    def __init__(self, config, dtype, rngs, execution, *, sparse, **attention_options):
        D, eps = config.hidden_size, config.rms_norm_eps
        self.attn_norm = RMSNorm(D, eps)
        self.attn = llama.Attention(config, dtype, rngs, execution, **attention_options)
        self.mlp_norm = RMSNorm(D, eps)
        self.mlp = (self.experts(config, dtype, rngs, execution) if sparse
                    else llama.MLP(config, dtype, rngs, bias=False))


class Qwen3MoeForCausalLM(llama.LlamaForCausalLM):
    """Qwen3 with sparse expert layers (Block)."""
    block = Block

    def __init__(self, config, *, dtype="float32", rngs, execution=None):
        check_experts(config)
        super().__init__(config, dtype=dtype, rngs=rngs, execution=execution)

    @staticmethod
    def layer_options(config, i):
        # transformers gives every layer config.sliding_window (None unless use_sliding_window)
        return dict(qk_norm=True, sparse=sparse_layer(config, i), window=getattr(config, "sliding_window", None))


def tensor_names(config):
    """Qwen3ForCausalLM's tensor names, a sparse layer's mlp.{gate,up,down}_proj replaced by its router
    (mlp.gate.weight [E, D]) and its fused experts, all three copied as they are."""
    return expert_tensor_names(llama.tensor_names(config, qk_norm=True, mlp_bias=False),
                               lambda i: sparse_layer(config, i))


def normalize(config, tensors, notes):
    """As Llama's (bare checkpoints, old buffers, a tied head), and per-expert tensors stacked into the fused ones."""
    return stack_experts(llama.normalize(config, tensors, notes), config.num_experts)


def export(config, tensors):
    """The experts per expert, as transformers' save_pretrained writes them (and the hub holds them)."""
    return split_experts(tensors)


# Qwen/Qwen3-30B-A3B-Base's config.json; Qwen/Qwen3-235B-A22B's (no base model was released: its eos and context
# are the post-trained model's); qwen3-moe-tiny for tests and the CPU demo (8 experts, 2 per token).
_QWEN3_MOE = dict(model_type="qwen3_moe", vocab_size=151936, hidden_act="silu", rms_norm_eps=1e-6,
                  rope_theta=1000000.0, initializer_range=0.02, attention_bias=False, use_sliding_window=False,
                  head_dim=128, max_position_embeddings=32768, bos_token_id=151643, eos_token_id=151643,
                  attention_dropout=0.0, tie_word_embeddings=False, decoder_sparse_step=1, mlp_only_layers=[],
                  norm_topk_prob=True, output_router_logits=False, router_aux_loss_coef=0.001)


def _experts(experts, per_token, width):
    return dict(num_experts=experts, num_experts_per_tok=per_token, moe_intermediate_size=width)


PRESETS = {
    "qwen3-30b-a3b": {**_QWEN3_MOE, **llama._shape(2048, 48, 32, 4, 6144), **_experts(128, 8, 768)},
    "qwen3-235b-a22b": {**_QWEN3_MOE, **llama._shape(4096, 94, 64, 4, 12288), **_experts(128, 8, 1536),
                        "max_position_embeddings": 40960, "eos_token_id": 151645},
    "qwen3-moe-tiny": {**_QWEN3_MOE, **llama._shape(64, 2, 4, 2, 176), **_experts(8, 2, 32), "head_dim": 32,
                       "vocab_size": 1024, "max_position_embeddings": 256, "bos_token_id": 1, "eos_token_id": 2},
}

QWEN3_MOE = Family(model_type="qwen3_moe", name="Qwen3-MoE", model=Qwen3MoeForCausalLM, tensor_names=tensor_names,
                   normalize=normalize, architecture="Qwen3MoeForCausalLM", presets=PRESETS, script="run_clm_flax.py",
                   max_length=lambda config: config.max_position_embeddings, export=export, matrices=expert_matrices)
