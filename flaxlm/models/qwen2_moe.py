"""Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): Qwen2's decoder (flaxlm.models.qwen2: Llama's layers with biases
on q, k and v, config.qkv_bias) whose sparse layers hold routed experts and a shared expert. Layer i is sparse as
in Qwen3-MoE (flaxlm.models.qwen3_moe.sparse_layer: not in config.mlp_only_layers and (i + 1) a multiple of
config.decoder_sparse_step); the others keep a dense MLP of config.intermediate_size (the released models have
none). A sparse layer's output is that of its routed experts (flaxlm.models.moe.SparseMoE: config.num_experts
SwiGLU experts of width config.moe_intermediate_size, the config.num_experts_per_tok most probable per token, not
renormalized unless config.norm_topk_prob) plus its shared expert, which every token runs: a SwiGLU MLP of width
config.shared_expert_intermediate_size scaled by sigmoid(shared_expert_gate(x)), a Linear D -> 1.

Sliding windows as transformers applies them: config.layer_types, which the config fills in from
use_sliding_window and max_window_layers (unlike Qwen2's rule: the even layers below max_window_layers slide), and
config.sliding_window (0 unless use_sliding_window); the released models use no window.

Configured by a transformers Qwen2MoeConfig; the parameters map 1:1 to Qwen2MoeForCausalLM's: Qwen2's, and in each
sparse layer mlp.gate.weight (the router), mlp.experts.gate_up_proj [E, 2I, D] and mlp.experts.down_proj [E, D, I]
(transformers 5's fused expert tensors), mlp.shared_expert.{gate,up,down}_proj.weight and
mlp.shared_expert_gate.weight (Linears: LoRA can target them). Checkpoints hold the experts either fused or one
tensor per expert (mlp.experts.{e}.gate_proj.weight ..., the hub's layout, which transformers' save_pretrained
writes too): both load; exports are per expert. The load-balancing loss is Qwen3-MoE's (flaxlm.models.moe): the
routed experts' router logits only.
"""
import jax

from flaxlm.models import llama, qwen2, qwen3_moe
from flaxlm.models.family import Family, add_linear
from flaxlm.models.layers import dense
from flaxlm.models.moe import SparseMoE, expert_matrices, expert_tensor_names, split_experts, stack_experts
from flaxlm.models.qwen3_moe import sparse_layer


class SharedExpertMoE(SparseMoE):
    """The routed experts (SparseMoE, its parameters and router logits) plus the shared expert every token runs:
    [M, D] -> routed + sigmoid(shared_expert_gate(x)) * shared_expert(x), as Qwen2MoeSparseMoeBlock."""

    def __init__(self, config, dtype, rngs, execution=None):
        super().__init__(config, dtype, rngs, execution, norm_topk_prob=getattr(config, "norm_topk_prob", False))
        self.shared_expert = llama.MLP(config, dtype, rngs, bias=False, width=config.shared_expert_intermediate_size)
        self.shared_expert_gate = dense(config.hidden_size, 1, dtype, config.initializer_range, rngs, use_bias=False)

    def __call__(self, x_MD):
        routed_MD = super().__call__(x_MD)
        return routed_MD + jax.nn.sigmoid(self.shared_expert_gate(x_MD)) * self.shared_expert(x_MD)


class Block(qwen3_moe.Block):
    """Qwen3-MoE's block with the shared expert in its sparse layers."""
    experts = SharedExpertMoE


def qkv_bias(config):
    """Whether q, k and v have biases: config.qkv_bias (transformers 5; always, before it)."""
    return bool(getattr(config, "qkv_bias", True))


class Qwen2MoeForCausalLM(qwen3_moe.Qwen3MoeForCausalLM):
    """Qwen2 with sparse layers of routed and shared experts (Block): Qwen3-MoE's model with Qwen2's attention."""
    block = Block

    @staticmethod
    def layer_options(config, i):
        return dict(qkv_bias=qkv_bias(config), o_bias=False, sparse=sparse_layer(config, i),
                    window=qwen2.layer_window(config, i))


def tensor_names(config):
    """Qwen2ForCausalLM's tensor names (q/k/v biases per config.qkv_bias), a sparse layer's MLP replaced by its
    router and fused experts (moe.expert_tensor_names) followed by its shared expert's four Linears."""
    names = expert_tensor_names(llama.tensor_names(config, qkv_bias=qkv_bias(config), o_bias=False, mlp_bias=False),
                                lambda i: sparse_layer(config, i))
    out = []
    for hf, path, kind in names:
        out.append((hf, path, kind))
        if hf.endswith(".mlp.experts.down_proj"):
            prefix, ours = hf.removesuffix("experts.down_proj"), path[:-1]
            for proj in ("gate_proj", "up_proj", "down_proj"):
                add_linear(out, f"{prefix}shared_expert.{proj}", (*ours, "shared_expert", proj), bias=False)
            add_linear(out, f"{prefix}shared_expert_gate", (*ours, "shared_expert_gate"), bias=False)
    return out


def normalize(config, tensors, notes):
    """As Llama's (bare checkpoints, old buffers, a tied head), and per-expert tensors stacked into the fused ones
    (the shared expert's are not per expert: they pass as they are)."""
    return stack_experts(llama.normalize(config, tensors, notes), config.num_experts)


def export(config, tensors):
    """The routed experts per expert, as transformers' save_pretrained writes them (and the hub holds them)."""
    return split_experts(tensors)


# Qwen/Qwen1.5-MoE-A2.7B's and Qwen/Qwen2-57B-A14B's config.json (every layer sparse: 60 experts, 4 per token, and
# 64, 8 per token; a shared expert 4x / 8x an expert's width); their sliding_window is left out: with
# use_sliding_window false the config sets it to 0. qwen2-moe-tiny for tests and the CPU demo (8 experts, 2 per
# token).
_QWEN2_MOE = dict(model_type="qwen2_moe", vocab_size=151936, hidden_act="silu", rms_norm_eps=1e-6,
                  rope_theta=1000000.0, initializer_range=0.02, use_sliding_window=False, bos_token_id=151643,
                  eos_token_id=151643, attention_dropout=0.0, tie_word_embeddings=False, decoder_sparse_step=1,
                  norm_topk_prob=False, output_router_logits=False, router_aux_loss_coef=0.001)


def _experts(experts, per_token, width, shared):
    return dict(num_experts=experts, num_experts_per_tok=per_token, moe_intermediate_size=width,
                shared_expert_intermediate_size=shared)


PRESETS = {
    "qwen1.5-moe-a2.7b": {**_QWEN2_MOE, **llama._shape(2048, 24, 16, 16, 5632), **_experts(60, 4, 1408, 5632),
                          "max_position_embeddings": 8192, "max_window_layers": 21},
    "qwen2-57b-a14b": {**_QWEN2_MOE, **llama._shape(3584, 28, 28, 4, 18944), **_experts(64, 8, 2560, 20480),
                       "max_position_embeddings": 131072, "max_window_layers": 28},
    "qwen2-moe-tiny": {**_QWEN2_MOE, **llama._shape(64, 2, 4, 2, 176), **_experts(8, 2, 32, 64), "vocab_size": 1024,
                       "max_position_embeddings": 256, "bos_token_id": 1, "eos_token_id": 2},
}

QWEN2_MOE = Family(model_type="qwen2_moe", name="Qwen2-MoE", model=Qwen2MoeForCausalLM, tensor_names=tensor_names,
                   normalize=normalize, architecture="Qwen2MoeForCausalLM", presets=PRESETS, script="run_clm_flax.py",
                   max_length=lambda config: config.max_position_embeddings, export=export, matrices=expert_matrices)
