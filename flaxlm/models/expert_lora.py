"""LoRA on a mixture of experts' 3-D expert parameters (flaxlm.models.moe.SparseMoE's gate_up_proj [E, 2I, D] and
down_proj [E, D, I]), as PEFT's ParamWrapper adapts them (LoraConfig(target_parameters=["mlp.experts.gate_up_proj",
...]), peft/tuners/lora/layer.py): each expert e of a parameter W [E, out, in] gets its own rank-r pair, and the
experts run with W_e + alpha / r * B_e A_e in place of W_e. The update is added to the weights before the grouped
matmuls (SparseMoE calls adapted()), so each token still meets only its k experts; the price is one [E, out, in]
temporary per adapted parameter and layer, as PEFT's forward pays it.

Our layout, the parameter's own: lora_a [E, r, in] (A_e), lora_b [E, out, r] (B_e). PEFT keeps both as one
nn.Linear each and reshapes them, in two different orders:
    lora_A.weight [E * r, in]: row e * r + j is A_e[j]          (expert-major)
    lora_B.weight [out, r * E]: column j * E + e is B_e[:, j]   (rank-major)
to_peft and from_peft convert. No dropout (PEFT's ParamWrapper refuses lora_dropout: x cannot be factored out).
"""
import jax.numpy as jnp
import numpy as np
from flax import nnx

# SparseMoE's 3-D parameters, in the order transformers' *Experts modules define theirs: PEFT wraps a module's
# targeted parameters in that order, each wrapper around the last, which decides its tensors' names (lora.Module.key)
EXPERT_PARAMETERS = ("gate_up_proj", "down_proj")


class ExpertLora(nnx.Module):
    """The adapter of one expert parameter W [E, out, in]: lora_a [E, r, in], lora_b [E, out, r] (float32) and
    scale (alpha / r); SparseMoE holds it as `{parameter}_lora` (attribute_of)."""

    def __init__(self, a_ERI, b_EOR, scale):
        self.lora_a, self.lora_b, self.scale = nnx.Param(a_ERI), nnx.Param(b_EOR), float(scale)


def attribute_of(parameter):
    """The SparseMoE attribute that holds the ExpertLora of `parameter` (gate_up_proj -> gate_up_proj_lora)."""
    return f"{parameter}_lora"


def delta(a_ERI, b_EOR, scale):
    """scale * B_e A_e for every expert: [E, out, in] float32 (jax or numpy arrays in, jax array out)."""
    return jnp.einsum("eor,eri->eoi", jnp.asarray(b_EOR, jnp.float32), jnp.asarray(a_ERI, jnp.float32),
                      preferred_element_type=jnp.float32) * scale


def adapted(module, parameter, dtype):
    """module's expert parameter `parameter` [E, out, in] in dtype: W + scale * B A (summed in float32) when an
    ExpertLora adapts it, else W."""
    w = getattr(module, parameter)[...]
    lora = getattr(module, attribute_of(parameter), None)
    if lora is None:
        return w.astype(dtype)
    return (w.astype(jnp.float32) + delta(lora.lora_a[...], lora.lora_b[...], lora.scale)).astype(dtype)


def to_peft(a_ERI, b_EOR):
    """(lora_A.weight [E * r, in], lora_B.weight [out, r * E]) as PEFT's ParamWrapper stores them (numpy)."""
    E, r, d_in = a_ERI.shape
    return (np.ascontiguousarray(np.reshape(a_ERI, (E * r, d_in))),
            np.ascontiguousarray(np.transpose(b_EOR, (1, 2, 0)).reshape(b_EOR.shape[1], r * E)))


def from_peft(a_peft, b_peft, experts):
    """(lora_a [E, r, in], lora_b [E, out, r]) of PEFT's lora_A.weight [E * r, in] and lora_B.weight [out, r * E]."""
    a_peft, b_peft = np.asarray(a_peft), np.asarray(b_peft)
    r = a_peft.shape[0] // experts
    return (a_peft.reshape(experts, r, a_peft.shape[1]),
            np.transpose(b_peft.reshape(b_peft.shape[0], r, experts), (2, 0, 1)))
