"""Mixtral (Mixtral-8x7B, Mixtral-8x22B): Mistral's decoder (flaxlm.models.mistral: Llama's layers without biases,
config.sliding_window in every layer) with a mixture of experts in every layer in place of the MLP
(flaxlm.models.moe.SparseMoE: config.num_local_experts SwiGLU experts of width config.intermediate_size, the
config.num_experts_per_tok most probable per token, always renormalized to sum to 1, as transformers' Mixtral router).
config.router_jitter_noise j (0 as released) multiplies the experts' input, in training only, by noise drawn
uniformly from [1 - j, 1 + j] per element, as transformers' MixtralSparseMoeBlock does.

Configured by a transformers MixtralConfig (config.num_experts is its alias of num_local_experts); the parameters
map 1:1 to MixtralForCausalLM's: Mistral's, and in each layer mlp.gate.weight (the router) and transformers 5's fused
mlp.experts.gate_up_proj [E, 2I, D] and down_proj [E, D, I]. The hub's checkpoints (mistralai/Mixtral-8x7B-v0.1),
which transformers 5's save_pretrained writes too, name them block_sparse_moe.gate.weight and one tensor per expert,
block_sparse_moe.experts.{e}.w1 (gate), w3 (up) and w2 (down) .weight: both layouts load; exports are the hub's.
The load-balancing loss (config.router_aux_loss_coef, config.output_router_logits) is flaxlm.models.moe's.
"""
import jax

from flaxlm.errors import UserError
from flaxlm.models import llama, mistral
from flaxlm.models.family import Family
from flaxlm.models.layers import RMSNorm, fold_key
from flaxlm.models.moe import SparseMoE, expert_matrices, expert_tensor_names, split_experts, stack_experts

# the hub's names of an expert's gate, up and down projections (transformers' conversion_mapping: w1 and w3 are
# concatenated into gate_up_proj, w2 is down_proj)
HUB_PROJS = ("w1", "w3", "w2")
_JITTER = 1  # the jitter's key: the layer's dropout key folded with this (the attention's dropout takes it unfolded)


def jitter_noise(key, shape, jitter, dtype):
    """transformers' router jitter: factors drawn uniformly from [1 - jitter, 1 + jitter]."""
    return jax.random.uniform(key, shape, dtype, 1.0 - jitter, 1.0 + jitter)


def router_jitter(config):
    """config.router_jitter_noise, checked: a float >= 0 (0: none)."""
    jitter = getattr(config, "router_jitter_noise", 0.0) or 0.0
    if jitter < 0:
        raise UserError(f"router_jitter_noise {jitter} must be 0 or more; fix config.json")
    return float(jitter)


class Block(llama.Block):
    """Llama's block with the experts (of width config.intermediate_size, top-k renormalized) in place of the MLP,
    their input jittered in training when config.router_jitter_noise > 0."""

    def __init__(self, config, dtype, rngs, execution, **attention_options):
        D, eps = config.hidden_size, config.rms_norm_eps
        self.attn_norm = RMSNorm(D, eps)
        self.attn = llama.Attention(config, dtype, rngs, execution, **attention_options)
        self.mlp_norm = RMSNorm(D, eps)
        self.mlp = SparseMoE(config, dtype, rngs, execution, width=config.intermediate_size, norm_topk_prob=True)
        self.jitter = router_jitter(config)

    def __call__(self, x_BTD, positions_BT, rotation, mask_BL, key, kv=None, index=None, visible_BTS=None):
        if not self.jitter or key is None:  # no jitter, or not training (no dropout key): Llama's block
            return super().__call__(x_BTD, positions_BT, rotation, mask_BL, key, kv, index, visible_BTS)
        B, T, D = x_BTD.shape
        a_MD, kv = self.attn(self.attn_norm(x_BTD), positions_BT, rotation, mask_BL, key, kv, index, visible_BTS)
        x_MD = x_BTD.reshape(B * T, D) + a_MD
        h_MD = self.mlp_norm(x_MD)
        # the router and the experts both see the jittered input; the residual does not (transformers scales the
        # norm's output in place)
        h_MD = h_MD * jitter_noise(fold_key(key, _JITTER), h_MD.shape, self.jitter, h_MD.dtype)
        return (x_MD + self.mlp(h_MD)).reshape(B, T, D), kv


class MixtralForCausalLM(llama.LlamaForCausalLM):
    """Mistral with sparse expert layers (Block)."""
    block = Block

    def __init__(self, config, *, dtype="float32", rngs, execution=None):
        E, k = config.num_local_experts, config.num_experts_per_tok
        if not 1 <= k <= E:
            raise UserError(f"num_experts_per_tok {k} must be between 1 and num_local_experts {E}; fix config.json")
        super().__init__(config, dtype=dtype, rngs=rngs, execution=execution)

    @staticmethod
    def layer_options(config, i):
        return dict(qkv_bias=False, o_bias=False, window=mistral.sliding_window(config))


def tensor_names(config):
    """MistralForCausalLM's tensor names, each layer's MLP replaced by its router and fused experts."""
    return expert_tensor_names(mistral.tensor_names(config), lambda i: True)


def _renamed(tensors, old, new):
    return {n.replace(old, new, 1) if n.startswith("model.layers.") else n: x for n, x in tensors.items()}


def normalize(config, tensors, notes):
    """As Mistral's (bare checkpoints, old buffers, a tied head); the hub's block_sparse_moe.* renamed mlp.*, as
    transformers' conversion_mapping does, and its per-expert w1 / w3 / w2 stacked into the fused tensors."""
    tensors = stack_experts(mistral.normalize(config, tensors, notes), config.num_local_experts,
                            block="block_sparse_moe", projs=HUB_PROJS)
    return _renamed(tensors, ".block_sparse_moe.", ".mlp.")


def export(config, tensors):
    """As transformers' save_pretrained writes them (and the hub holds them): block_sparse_moe.gate.weight and the
    experts per expert, w1 / w3 / w2."""
    return split_experts(_renamed(tensors, ".mlp.", ".block_sparse_moe."), block="block_sparse_moe",
                         projs=HUB_PROJS)


# mistralai/Mixtral-8x7B-v0.1's and mistralai/Mixtral-8x22B-v0.1's config.json (46.7B and 140.6B parameters, 12.9B
# and 39.2B active); mixtral-tiny for tests and the CPU demo (8 experts of width 32, 2 per token, a window shorter
# than its training rows).
_MIXTRAL = dict(model_type="mixtral", vocab_size=32000, hidden_act="silu", rms_norm_eps=1e-5, rope_theta=1000000.0,
                initializer_range=0.02, attention_dropout=0.0, sliding_window=None, tie_word_embeddings=False,
                bos_token_id=1, eos_token_id=2, num_local_experts=8, num_experts_per_tok=2,
                output_router_logits=False, router_jitter_noise=0.0)

PRESETS = {
    "mixtral-8x7b": {**_MIXTRAL, **llama._shape(4096, 32, 32, 8, 14336), "max_position_embeddings": 32768,
                     "router_aux_loss_coef": 0.02},
    "mixtral-8x22b": {**_MIXTRAL, **llama._shape(6144, 56, 48, 8, 16384), "max_position_embeddings": 65536,
                      "router_aux_loss_coef": 0.001},
    "mixtral-tiny": {**_MIXTRAL, **llama._shape(64, 2, 4, 2, 32), "vocab_size": 1024, "max_position_embeddings": 256,
                     "sliding_window": 16, "router_aux_loss_coef": 0.02},
}

MIXTRAL = Family(model_type="mixtral", name="Mixtral", model=MixtralForCausalLM, tensor_names=tensor_names,
                 normalize=normalize, architecture="MixtralForCausalLM", presets=PRESETS, script="run_clm_flax.py",
                 max_length=lambda config: config.max_position_embeddings, export=export, matrices=expert_matrices)
