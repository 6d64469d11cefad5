"""The mixture-of-experts block the MoE families share (Qwen3-MoE; later Mixtral, Qwen2-MoE, OLMoE): a router picks
k of E experts per token, each picked expert (a SwiGLU MLP of width I) runs on the token, and the token's output
is the sum of the k outputs weighted by the router's probabilities.

Dropless and sparse: every token reaches each of its k experts (no capacity, nothing dropped), and no token is
multiplied by an expert it was not routed to. The M * k (token, expert) copies are sorted by expert and each
expert's rows go through one grouped matmul (jax.lax.ragged_dot_general, group sizes = rows per expert), so a step
costs the active parameters' FLOPs, not all E experts'.

The expert weights are 3-D parameters in transformers' (>= 5) layout, so that they load and save as plain copies:
gate_up_proj [E, 2I, D] (each expert's gate rows, then its up rows) and down_proj [E, D, I]; the router is a
parameter gate [E, D] (transformers' mlp.gate.weight). The per-expert tensors of the hub's checkpoints
(mlp.experts.{e}.gate_proj.weight ..., which transformers 5's save_pretrained writes too) are stacked into them on
load (stack_experts) and written back that way (split_experts).

Shape suffixes as in layers.py, plus M token rows (B * T), E experts, K experts per token, N = M * K routed copies,
I an expert's MLP width, X = 2I (gate and up together).
"""
import contextlib
import contextvars
import re

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from flaxlm.errors import UserError
from flaxlm.models.layers import activation, normal_init

# x_ND contracted with w_EXD over D (w's last axis): transformers' [out, in] expert layout used as it is stored
_CONTRACT_LAST = jax.lax.RaggedDotDimensionNumbers(dot_dimension_numbers=(((1,), (2,)), ((), ())),
                                                   lhs_ragged_dimensions=(0,), rhs_group_dimensions=(0,))


def route(logits_ME, k, norm_topk_prob):
    """(weights_MK float32, experts_MK int32): the k most probable experts of each row under softmax(logits) in
    float32, as transformers' TopKRouter; norm_topk_prob: the k probabilities renormalized to sum to 1."""
    probs_ME = jax.nn.softmax(logits_ME.astype(jnp.float32), axis=-1)
    weights_MK, experts_MK = jax.lax.top_k(probs_ME, k)
    if norm_topk_prob:
        weights_MK = weights_MK / weights_MK.sum(-1, keepdims=True)
    return weights_MK, experts_MK.astype(jnp.int32)


def grouped_swiglu(x_MD, experts_MK, weights_MK, gate_up_EXD, down_EDI, act, dtype):
    """sum_k weights_MK[m, k] * expert_{experts_MK[m, k]}(x_MD[m]), each expert down(act(gate(x)) * up(x)), computed
    sparsely: the M * K copies sorted by expert, two grouped matmuls, the results unsorted and summed per token."""
    (M, D), (E, X, _), K = x_MD.shape, gate_up_EXD.shape, experts_MK.shape[1]
    expert_N = experts_MK.reshape(M * K)
    order_N = jnp.argsort(expert_N, stable=True)  # copies grouped by expert, in token order within each group
    rows_E = jnp.bincount(expert_N, length=E).astype(jnp.int32)  # group sizes: how many copies each expert gets
    x_ND = jnp.take(x_MD.astype(dtype), order_N // K, axis=0)
    h_NX = jax.lax.ragged_dot_general(x_ND, gate_up_EXD.astype(dtype), rows_E, _CONTRACT_LAST,
                                      preferred_element_type=jnp.float32).astype(dtype)
    gate_NI, up_NI = jnp.split(h_NX, 2, axis=-1)
    y_ND = jax.lax.ragged_dot_general(act(gate_NI) * up_NI, down_EDI.astype(dtype), rows_E, _CONTRACT_LAST,
                                      preferred_element_type=jnp.float32).astype(dtype)
    # back to (token, k) order: the inverse permutation is a gather, not a scatter-add (deterministic, no atomics)
    inverse_N = jnp.zeros_like(order_N).at[order_N].set(jnp.arange(M * K, dtype=order_N.dtype))
    y_MKD = jnp.take(y_ND, inverse_N, axis=0).reshape(M, K, D)
    return (y_MKD * weights_MK.astype(dtype)[..., None]).sum(1)


def dense_swiglu(x_MD, experts_MK, weights_MK, gate_up_EXD, down_EDI, act, dtype):
    """What grouped_swiglu computes, the costly way: every expert on every token, the unrouted ones weighted 0
    (the reference the tests hold the grouped form to)."""
    E = gate_up_EXD.shape[0]
    h_MEX = jnp.einsum("md,exd->mex", x_MD.astype(dtype), gate_up_EXD.astype(dtype))
    gate_MEI, up_MEI = jnp.split(h_MEX, 2, axis=-1)
    y_MED = jnp.einsum("mei,edi->med", act(gate_MEI) * up_MEI, down_EDI.astype(dtype))
    weight_ME = (jax.nn.one_hot(experts_MK, E, dtype=jnp.float32) * weights_MK[..., None]).sum(1)
    return (y_MED * weight_ME.astype(dtype)[..., None]).sum(1)


class SparseMoE(nnx.Module):
    """The routed experts of one layer: config.num_experts experts of width config.moe_intermediate_size, the
    config.num_experts_per_tok best of them per token, config.norm_topk_prob, config.hidden_act."""

    def __init__(self, config, dtype, rngs, execution=None):
        D, I, E = config.hidden_size, config.moe_intermediate_size, config.num_experts
        std = config.initializer_range
        # the router: transformers' mlp.gate.weight [E, D], a plain parameter there (no Linear: no LoRA on it)
        self.gate = nnx.Param(normal_init(std)(rngs.params(), (E, D), jnp.float32))
        self.gate_up_proj = nnx.Param(normal_init(std)(rngs.params(), (E, 2 * I, D), jnp.float32))
        self.down_proj = nnx.Param(normal_init(std)(rngs.params(), (E, D, I), jnp.float32))
        self.k, self.norm_topk_prob, self.act, self.dtype = (config.num_experts_per_tok, bool(config.norm_topk_prob),
                                                             config.hidden_act, dtype)
        # router_logits() takes the logits out of the call: only from a plain loop of layers (no inner trace)
        self.collectable = execution is None or (not execution.scan and execution.remat == "none")

    def __call__(self, x_MD):
        # in the compute dtype, as transformers' F.linear in the hidden states' dtype; softmax in float32 (route)
        logits_ME = jnp.einsum("md,ed->me", x_MD.astype(self.dtype), self.gate[...].astype(self.dtype))
        weights_MK, experts_MK = route(logits_ME, self.k, self.norm_topk_prob)
        collected = _ROUTER_LOGITS.get()
        if collected is not None:
            if not self.collectable:
                raise UserError("the load-balancing loss (output_router_logits in config.json) needs the layers "
                                "run in a plain loop; drop --scan_layers and --remat_policy, or set "
                                "output_router_logits to false")
            collected.append(logits_ME.astype(jnp.float32))
        return grouped_swiglu(x_MD, experts_MK, weights_MK, self.gate_up_proj[...], self.down_proj[...],
                              activation(self.act), self.dtype)


_ROUTER_LOGITS = contextvars.ContextVar("router_logits", default=None)


@contextlib.contextmanager
def router_logits(enabled=True):
    """Collects the router logits of the SparseMoE layers called inside, in call order: a list of float32 [M, E]
    (transformers' output_router_logits); enabled False: nothing collected (the list stays empty). Why a context
    and not a return value: the layers' interface (x, kv) is every decoder family's (kv_cache.run_layers). The
    layers must run in a plain loop (no --scan_layers, no remat): under jax.lax.scan or jax.checkpoint the logits
    would be values of an inner trace (SparseMoE raises a UserError)."""
    collected = []
    token = _ROUTER_LOGITS.set(collected if enabled else None)
    try:
        yield collected
    finally:
        _ROUTER_LOGITS.reset(token)


def load_balancing_loss(router_logits, num_experts, k, mask_M=None):
    """transformers' load_balancing_loss_func (Switch Transformer's auxiliary loss) over the layers' router logits
    (a sequence of [M, E], M = B * T rows each): E * sum_e f_e * P_e, where f_e is the share of the k routed copies
    that go to expert e and P_e the mean router probability of e, both over every layer's rows (mask_M [M]: the
    rows counted, padding 0). float32 scalar."""
    counts_E = jnp.zeros((num_experts,), jnp.float32)
    probs_E = jnp.zeros((num_experts,), jnp.float32)
    rows = 0.0
    w_M = None if mask_M is None else mask_M.reshape(-1).astype(jnp.float32)
    for logits_ME in router_logits:
        probs_ME = jax.nn.softmax(logits_ME.astype(jnp.float32), axis=-1)
        _, experts_MK = jax.lax.top_k(probs_ME, k)
        hits_ME = jax.nn.one_hot(experts_MK, num_experts, dtype=jnp.float32).sum(1)
        if w_M is None:
            counts_E, probs_E, rows = counts_E + hits_ME.sum(0), probs_E + probs_ME.sum(0), rows + probs_ME.shape[0]
        else:
            counts_E = counts_E + (hits_ME * w_M[:, None]).sum(0)
            probs_E, rows = probs_E + (probs_ME * w_M[:, None]).sum(0), rows + w_M.sum()
    # transformers divides the expert counts by the rows (not rows * k): with k > 1 the shares sum to k
    return num_experts * jnp.sum((counts_E / rows) * (probs_E / rows))


def wants_aux_loss(config):
    """Whether config's loss adds the load-balancing loss: an MoE config with output_router_logits true (as
    transformers' *MoeForCausalLM adds it to the loss from labels)."""
    return bool(getattr(config, "output_router_logits", False)) and getattr(config, "num_experts", 0) > 0


def add_aux_loss(config, sums, logits, mask_BL=None):
    """An objective's sums (loss_sum over weight_sum target tokens) with router_aux_loss_coef times the
    load-balancing loss of the collected router logits added to the mean loss (so loss_sum gains coef * aux *
    weight_sum), and aux_loss_sum (aux * weight_sum: the step's metrics show the aux loss itself); sums unchanged
    when there are no logits. mask_BL: the tokens counted (transformers' attention_mask; None: all)."""
    if not logits:
        return sums
    aux = load_balancing_loss(logits, config.num_experts, config.num_experts_per_tok, mask_BL)
    count = sums["weight_sum"]
    return {**sums, "loss_sum": sums["loss_sum"] + config.router_aux_loss_coef * aux * count,
            "aux_loss_sum": aux * count}


# transformers' per-expert tensor names (the hub's checkpoints, and what its save_pretrained writes) <-> fused ones
_PER_EXPERT = re.compile(r"^(?P<layer>.*\.mlp\.experts)\.(?P<e>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.weight$")


class StackedExperts:
    """The fused tensor of a layer's per-expert tensors, read when used (np.asarray): the hub's E separate
    [I, D] gate and up (or [D, I] down) tensors as gate_up_proj [E, 2I, D] (or down_proj [E, D, I]); its parts may
    be hf_io.LazyTensors, so a checkpoint is still read one layer's experts at a time."""

    def __init__(self, parts):
        self.parts = parts  # per expert: [gate, up] or [down]
        first = parts[0]
        rows = sum(p.shape[0] for p in first)
        self.shape = (len(parts), rows, *first[0].shape[1:])
        self.dtype = np.dtype(first[0].dtype)
        self.ndim = len(self.shape)

    def __array__(self, dtype=None, copy=None):
        x = np.stack([np.concatenate([np.asarray(p) for p in expert], axis=0) for expert in self.parts])
        return x if dtype is None else x.astype(dtype)


def stack_experts(tensors, num_experts):
    """tensors with each layer's per-expert mlp.experts.{e}.{gate,up,down}_proj.weight replaced by transformers'
    fused mlp.experts.gate_up_proj and down_proj (StackedExperts); fused checkpoints pass unchanged. UserError
    naming the first missing or differently shaped expert tensor."""
    found = {}
    for name in tensors:
        m = _PER_EXPERT.match(name)
        if m:
            found.setdefault(m["layer"], {})[(int(m["e"]), m["proj"])] = name
    out = {n: x for n, x in tensors.items() if not _PER_EXPERT.match(n)}
    for layer, names in found.items():
        want = [(e, p) for e in range(num_experts) for p in ("gate_proj", "up_proj", "down_proj")]
        missing = [f"{layer}.{e}.{p}.weight" for e, p in want if (e, p) not in names]
        if missing:
            raise UserError(f"checkpoint is missing tensor(s) {', '.join(missing[:5])}; it does not match "
                            f"config.json (num_experts {num_experts})")
        extra = sorted(set(names) - set(want))
        if extra:
            raise UserError(f"checkpoint has unexpected tensor(s) {names[extra[0]]}; it does not match config.json "
                            f"(num_experts {num_experts})")
        for proj in ("gate_proj", "up_proj", "down_proj"):
            shapes = {tuple(tensors[names[(e, proj)]].shape) for e in range(num_experts)}
            if len(shapes) > 1:
                odd = next(names[(e, proj)] for e in range(num_experts)
                           if tuple(tensors[names[(e, proj)]].shape) != tuple(tensors[names[(0, proj)]].shape))
                raise UserError(f"tensor {odd} has shape {tuple(tensors[odd].shape)}, unlike expert 0's "
                                f"{tuple(tensors[names[(0, proj)]].shape)}; use the config.json the checkpoint "
                                f"was saved with")
        out[f"{layer}.gate_up_proj"] = StackedExperts(
            [[tensors[names[(e, "gate_proj")]], tensors[names[(e, "up_proj")]]] for e in range(num_experts)])
        out[f"{layer}.down_proj"] = StackedExperts([[tensors[names[(e, "down_proj")]]] for e in range(num_experts)])
    return out


def split_experts(tensors):
    """The inverse of stack_experts on numpy tensors: each fused mlp.experts.gate_up_proj [E, 2I, D] and down_proj
    [E, D, I] written as transformers' save_pretrained writes them, per expert (mlp.experts.{e}.gate_proj.weight
    [I, D], up_proj, down_proj [D, I]); the other tensors in their order."""
    out = {}
    for name, x in tensors.items():
        if name.endswith(".mlp.experts.gate_up_proj"):
            layer, half = name.removesuffix(".gate_up_proj"), x.shape[1] // 2
            for e in range(x.shape[0]):
                out[f"{layer}.{e}.gate_proj.weight"] = np.ascontiguousarray(x[e, :half])
                out[f"{layer}.{e}.up_proj.weight"] = np.ascontiguousarray(x[e, half:])
        elif name.endswith(".mlp.experts.down_proj"):
            layer = name.removesuffix(".down_proj")
            for e in range(x.shape[0]):
                out[f"{layer}.{e}.down_proj.weight"] = np.ascontiguousarray(x[e])
        else:
            out[name] = x
    return out
