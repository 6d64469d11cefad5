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
from flaxlm.models.expert_lora import adapted
from flaxlm.models.layer_stack import Carried, carried, carrying
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
    (M, D), E, K = x_MD.shape, gate_up_EXD.shape[0], experts_MK.shape[1]
    expert_N = experts_MK.reshape(M * K)
    order_N = jnp.argsort(expert_N, stable=True)  # copies grouped by expert, in token order within each group
    # group sizes: how many copies each expert gets; copies of an expert id >= E (another device's: expert_parallel)
    # sort last and fall in no group, so ragged_dot gives them zeros
    rows_E = jnp.bincount(expert_N, length=E + 1)[:E].astype(jnp.int32)
    x_ND = jnp.take(x_MD.astype(dtype), order_N // K, axis=0)
    # outputs in the compute dtype, as torch's bfloat16 matmuls (the matrix units accumulate in float32 either way):
    # a float32 [N, 2I] result would double the largest temporaries of a bfloat16 step
    h_NX = jax.lax.ragged_dot_general(x_ND, gate_up_EXD.astype(dtype), rows_E, _CONTRACT_LAST,
                                      preferred_element_type=dtype)
    gate_NI, up_NI = jnp.split(h_NX, 2, axis=-1)
    y_ND = jax.lax.ragged_dot_general(act(gate_NI) * up_NI, down_EDI.astype(dtype), rows_E, _CONTRACT_LAST,
                                      preferred_element_type=dtype)
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


def check_experts(config):
    """UserError unless config.num_experts_per_tok is between 1 and config.num_experts."""
    E, k = config.num_experts, config.num_experts_per_tok
    if E > 0 and not 1 <= k <= E:
        raise UserError(f"num_experts_per_tok {k} must be between 1 and num_experts {E}; fix config.json")


class SparseMoE(nnx.Module):
    """The routed experts of one layer: config.num_experts experts of width `width` (default
    config.moe_intermediate_size; Mixtral and OLMoE name it intermediate_size), the config.num_experts_per_tok best
    of them per token, renormalized when norm_topk_prob (default config.norm_topk_prob; Mixtral always does),
    config.hidden_act."""

    def __init__(self, config, dtype, rngs, execution=None, *, width=None, norm_topk_prob=None):
        D, E = config.hidden_size, config.num_experts
        I = config.moe_intermediate_size if width is None else width
        norm_topk_prob = config.norm_topk_prob if norm_topk_prob is None else norm_topk_prob
        std = config.initializer_range
        # the router: transformers' mlp.gate.weight [E, D], a plain parameter there (no Linear: no LoRA on it)
        self.gate = nnx.Param(normal_init(std)(rngs.params(), (E, D), jnp.float32))
        self.gate_up_proj = nnx.Param(normal_init(std)(rngs.params(), (E, 2 * I, D), jnp.float32))
        self.down_proj = nnx.Param(normal_init(std)(rngs.params(), (E, D, I), jnp.float32))
        self.k, self.norm_topk_prob, self.act, self.dtype = (config.num_experts_per_tok, bool(norm_topk_prob),
                                                             config.hidden_act, dtype)
        self.num_experts = E
        # router_logits() takes the logits out of the call: only from a plain loop of layers (no inner trace)
        self.inspectable = execution is None or (not execution.scan and execution.remat == "none")

    def __call__(self, x_MD):
        # in the compute dtype, as transformers' F.linear in the hidden states' dtype; softmax in float32 (route)
        logits_ME = jnp.einsum("md,ed->me", x_MD.astype(self.dtype), self.gate[...].astype(self.dtype))
        weights_MK, experts_MK = route(logits_ME, self.k, self.norm_topk_prob)
        stats = carried()
        if isinstance(stats, RouterStatistics):
            stats.add_layer(logits_ME, experts_MK)
        inspected = _ROUTER_LOGITS.get()
        if inspected is not None:
            if not self.inspectable:
                raise ValueError("router_logits() needs the layers run in a plain loop (no scan, no remat)")
            inspected.append(logits_ME.astype(jnp.float32))
        # with a LoRA adapter's update added to the weights (flaxlm.models.expert_lora): still sparse
        experts = expert_parallel if expert_axis_size() > 1 else grouped_swiglu
        return experts(x_MD, experts_MK, weights_MK, adapted(self, "gate_up_proj", self.dtype),
                       adapted(self, "down_proj", self.dtype), activation(self.act), self.dtype)


def expert_axis_size():
    """The size of the context mesh's 'expert' axis (jax.set_mesh: a --sharding expert run's), else 1."""
    mesh = jax.sharding.get_abstract_mesh()
    return 1 if mesh.empty or "expert" not in mesh.axis_names else mesh.shape["expert"]


def expert_parallel(x_MD, experts_MK, weights_MK, gate_up_EXD, down_EDI, act, dtype):
    """grouped_swiglu with the experts split over the context mesh's 'expert' axis (--sharding expert;
    flaxlm.training.sharding puts expert e on member e // (E / G) of each group of G devices). Each device gathers
    its group's tokens (all_gather over 'expert'), runs only its own E / G experts on the copies routed to them (the
    others fall in no group: no FLOPs, zeros), and the partial sums go back to the devices that hold the tokens
    (psum_scatter over 'expert'): dropless, each copy computed once, no capacity. The experts' 'data' (fsdp) split
    is gathered on the way in, as fsdp gathers any weight."""
    from jax.sharding import PartitionSpec as P
    mesh = jax.sharding.get_abstract_mesh()
    rows = tuple(mesh.axis_names)  # the token rows are split over every device, as the batch

    def local(x_mD, experts_mK, weights_mK, gate_up_eXD, down_eDI):
        e = gate_up_eXD.shape[0]
        x_gD, experts_gK, weights_gK = (jax.lax.all_gather(a, "expert", tiled=True)
                                        for a in (x_mD, experts_mK, weights_mK))
        mine_gK = experts_gK - jax.lax.axis_index("expert") * e  # this device's experts are 0 .. e - 1
        here_gK = (mine_gK >= 0) & (mine_gK < e)
        y_gD = grouped_swiglu(x_gD, jnp.where(here_gK, mine_gK, e), jnp.where(here_gK, weights_gK, 0.0),
                              gate_up_eXD, down_eDI, act, dtype)
        return jax.lax.psum_scatter(y_gD, "expert", scatter_dimension=0, tiled=True)

    return jax.shard_map(local, mesh=mesh, in_specs=(P(rows), P(rows), P(rows), P("expert"), P("expert")),
                         out_specs=P(rows), check_vma=False)(x_MD, experts_MK, weights_MK, gate_up_EXD, down_EDI)


_ROUTER_LOGITS = contextvars.ContextVar("router_logits", default=None)


@contextlib.contextmanager
def router_logits():
    """Collects the router logits of the SparseMoE layers called inside, in call order: a list of float32 [M, E]
    (transformers' output_router_logits), to inspect them (the losses use routing()'s statistics instead). Why a
    context and not a return value: the layers' interface (x, kv) is every decoder family's
    (kv_cache.run_layers). The layers must run in a plain loop (no scan, no remat): under jax.lax.scan or
    jax.checkpoint the logits would be values of an inner trace (SparseMoE raises a ValueError)."""
    collected = []
    token = _ROUTER_LOGITS.set(collected)
    try:
        yield collected
    finally:
        _ROUTER_LOGITS.reset(token)


class RouterStatistics(Carried):
    """What the SparseMoE layers of one forward pass add up for the router's losses and metrics (carrying() it
    around the forward; layer_stack.run_layers threads it through --scan_layers and remat). value: float32 sums
    over the layers' counted rows (mask_M [M]: the rows counted, padding 0; None: all), counts_E (the routed
    copies each expert got), probs_E (the router probabilities), rows, z_sum (logsumexp(logits)^2, the z-loss's
    terms), and over the layers load_max / load_min (the most / least loaded expert's share of a layer's copies)."""

    def __init__(self, num_experts, mask_M=None):
        zero = jnp.zeros((), jnp.float32)
        super().__init__(dict(counts_E=jnp.zeros((num_experts,), jnp.float32),
                              probs_E=jnp.zeros((num_experts,), jnp.float32), rows=zero, z_sum=zero, load_max=zero,
                              load_min=jnp.ones((), jnp.float32), layers=zero))
        self.mask_M = None if mask_M is None else mask_M.reshape(-1).astype(jnp.float32)

    def add_layer(self, logits_ME, experts_MK):
        """One layer's router logits and its choices added to value."""
        logits_ME = logits_ME.astype(jnp.float32)
        w_M = jnp.ones(logits_ME.shape[:1], jnp.float32) if self.mask_M is None else self.mask_M
        hits_E = (jax.nn.one_hot(experts_MK, logits_ME.shape[1], dtype=jnp.float32).sum(1) * w_M[:, None]).sum(0)
        share_E = hits_E / jnp.maximum(hits_E.sum(), 1.0)
        v = self.value
        self.value = dict(counts_E=v["counts_E"] + hits_E,
                          probs_E=v["probs_E"] + (jax.nn.softmax(logits_ME, -1) * w_M[:, None]).sum(0),
                          rows=v["rows"] + w_M.sum(),
                          z_sum=v["z_sum"] + (jax.nn.logsumexp(logits_ME, -1) ** 2 * w_M).sum(),
                          load_max=jnp.maximum(v["load_max"], share_E.max()),
                          load_min=jnp.minimum(v["load_min"], share_E.min()), layers=v["layers"] + 1)


def statistics(router_logits, k, mask_M=None):
    """RouterStatistics.value of a list of layers' router logits ([M, E] each, as router_logits() collects them):
    what the layers would have added up, each routing its top k."""
    stats = RouterStatistics(router_logits[0].shape[-1], mask_M)
    for logits_ME in router_logits:
        stats.add_layer(logits_ME, jax.lax.top_k(logits_ME, k)[1])
    return stats.value


def load_balancing_loss(stats, num_experts):
    """transformers' load_balancing_loss_func (Switch Transformer's auxiliary loss) from the layers' statistics
    (RouterStatistics.value): E * sum_e f_e * P_e, f_e the routed copies of expert e and P_e its router
    probability, both summed over every layer's counted rows and divided by their number. float32 scalar."""
    rows = jnp.maximum(stats["rows"], 1.0)
    # transformers divides the expert counts by the rows (not rows * k): with k > 1 the shares sum to k
    return num_experts * jnp.sum((stats["counts_E"] / rows) * (stats["probs_E"] / rows))


def z_loss(stats):
    """ST-MoE's router z-loss (switch_transformers' router_z_loss_func): the mean over every layer's counted rows
    of logsumexp(router logits)^2, which keeps the logits small. float32 scalar."""
    return stats["z_sum"] / jnp.maximum(stats["rows"], 1.0)


def has_experts(config):
    return getattr(config, "num_experts", 0) > 0


@contextlib.contextmanager
def routing(config, mask_BL=None):
    """Around a forward pass of config's model: a RouterStatistics the SparseMoE layers fill (a Carried whose
    value stays None for a model without experts). mask_BL: the tokens counted (transformers' attention_mask;
    None: all)."""
    box = RouterStatistics(config.num_experts, mask_BL) if has_experts(config) else Carried(None)
    with carrying(box):
        yield box


def add_router_losses(config, sums, stats):
    """An objective's sums (loss_sum over weight_sum target tokens) with the router's losses and metrics, for a
    model with experts (stats: routing()'s value; None: sums unchanged). Added to the mean loss: with
    config.output_router_logits, config.router_aux_loss_coef times the load-balancing loss (as transformers' *Moe
    ForCausalLM from labels), and config.router_z_loss_coef (flaxlm's --router_z_loss_coef; absent: 0) times the
    z-loss; so loss_sum gains (coef * loss) * weight_sum. The metrics, each times weight_sum as the train step
    divides them: aux_loss, router_z_loss, expert_load_max and expert_load_min (shares of a layer's routed copies;
    1 / num_experts each when balanced)."""
    if stats is None:
        return sums
    aux, z = load_balancing_loss(stats, config.num_experts), z_loss(stats)
    added = z * float(getattr(config, "router_z_loss_coef", 0.0) or 0.0)
    if getattr(config, "output_router_logits", False):
        added = added + config.router_aux_loss_coef * aux
    count = sums["weight_sum"]
    return {**sums, "loss_sum": sums["loss_sum"] + added * count, "aux_loss_sum": aux * count,
            "router_z_loss_sum": z * count, "expert_load_max_sum": stats["load_max"] * count,
            "expert_load_min_sum": stats["load_min"] * count}


def expert_tensor_names(names, sparse):
    """A dense decoder's (hf name, our path, kind) list with each sparse layer's (sparse(i) true) MLP tensors
    mlp.{gate,up,down}_proj replaced by its router (mlp.gate.weight [E, D]) and fused experts
    (mlp.experts.gate_up_proj, mlp.experts.down_proj), all three copied as they are."""
    out = []
    for hf, path, kind in names:
        layer = hf.split(".")[2] if hf.startswith("model.layers.") else None
        if layer is None or not sparse(int(layer)) or ".mlp." not in hf:
            out.append((hf, path, kind))
        elif hf.endswith("mlp.gate_proj.weight"):  # one MLP's three tensors -> the experts' three
            ours, prefix = path[:-2], hf.removesuffix("gate_proj.weight")
            out += [(f"{prefix}gate.weight", (*ours, "gate"), "copy"),
                    (f"{prefix}experts.gate_up_proj", (*ours, "gate_up_proj"), "copy"),
                    (f"{prefix}experts.down_proj", (*ours, "down_proj"), "copy")]
    return out


# transformers' per-expert tensor names (the hub's checkpoints, and what its save_pretrained writes) <-> fused ones:
# {block}.experts.{e}.{gate,up,down}.weight, by default mlp.experts.{e}.{gate_proj,up_proj,down_proj}.weight
# (Qwen3-MoE, OLMoE); Mixtral's are block_sparse_moe.experts.{e}.{w1,w3,w2}.weight
PROJS = ("gate_proj", "up_proj", "down_proj")


def _per_expert(block, projs):
    return re.compile(rf"^(?P<layer>.*\.{re.escape(block)}\.experts)\.(?P<e>\d+)\.(?P<proj>{'|'.join(projs)})\.weight$")


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


def stack_experts(tensors, num_experts, *, block="mlp", projs=PROJS):
    """tensors with each layer's per-expert {block}.experts.{e}.{gate,up,down}.weight (projs: the three names,
    default gate_proj, up_proj, down_proj) replaced by transformers' fused {block}.experts.gate_up_proj and
    down_proj (StackedExperts); fused checkpoints pass unchanged. UserError naming the first missing or differently
    shaped expert tensor."""
    per_expert, (gate, up, down) = _per_expert(block, projs), projs
    found = {}
    for name in tensors:
        m = per_expert.match(name)
        if m:
            found.setdefault(m["layer"], {})[(int(m["e"]), m["proj"])] = name
    out = {n: x for n, x in tensors.items() if not per_expert.match(n)}
    for layer, names in found.items():
        want = [(e, p) for e in range(num_experts) for p in projs]
        missing = [f"{layer}.{e}.{p}.weight" for e, p in want if (e, p) not in names]
        if missing:
            raise UserError(f"checkpoint is missing tensor(s) {', '.join(missing[:5])}; it does not match "
                            f"config.json (num_experts {num_experts})")
        extra = sorted(set(names) - set(want))
        if extra:
            raise UserError(f"checkpoint has unexpected tensor(s) {names[extra[0]]}; it does not match config.json "
                            f"(num_experts {num_experts})")
        for proj in projs:
            shapes = {tuple(tensors[names[(e, proj)]].shape) for e in range(num_experts)}
            if len(shapes) > 1:
                odd = next(names[(e, proj)] for e in range(num_experts)
                           if tuple(tensors[names[(e, proj)]].shape) != tuple(tensors[names[(0, proj)]].shape))
                raise UserError(f"tensor {odd} has shape {tuple(tensors[odd].shape)}, unlike expert 0's "
                                f"{tuple(tensors[names[(0, proj)]].shape)}; use the config.json the checkpoint "
                                f"was saved with")
        out[f"{layer}.gate_up_proj"] = StackedExperts(
            [[tensors[names[(e, gate)]], tensors[names[(e, up)]]] for e in range(num_experts)])
        out[f"{layer}.down_proj"] = StackedExperts([[tensors[names[(e, down)]]] for e in range(num_experts)])
    return out


def split_experts(tensors, *, block="mlp", projs=PROJS):
    """The inverse of stack_experts on numpy tensors: each fused {block}.experts.gate_up_proj [E, 2I, D] and
    down_proj [E, D, I] written as transformers' save_pretrained writes them, per expert
    ({block}.experts.{e}.gate_proj.weight [I, D], up_proj, down_proj [D, I], or projs' names); the other tensors in
    their order."""
    gate, up, down = projs
    out = {}
    for name, x in tensors.items():
        if name.endswith(f".{block}.experts.gate_up_proj"):
            layer, half = name.removesuffix(".gate_up_proj"), x.shape[1] // 2
            for e in range(x.shape[0]):
                out[f"{layer}.{e}.{gate}.weight"] = np.ascontiguousarray(x[e, :half])
                out[f"{layer}.{e}.{up}.weight"] = np.ascontiguousarray(x[e, half:])
        elif name.endswith(f".{block}.experts.down_proj"):
            layer = name.removesuffix(".down_proj")
            for e in range(x.shape[0]):
                out[f"{layer}.{e}.{down}.weight"] = np.ascontiguousarray(x[e])
        else:
            out[name] = x
    return out


def expert_matrices(config):
    """Family.matrices of a mixture: gate_up_proj [E, 2I, D] seen as [E, 2, I, D], each expert's gate and up a
    matrix for --optim muon (down_proj [E, D, I] is E matrices as it is)."""
    from optax.contrib import MuonDimensionNumbers

    def gate_and_up(shape):
        E, two_I, D = shape
        return (E, 2, two_I // 2, D), MuonDimensionNumbers(reduction_axis=3, output_axis=2)
    return {("gate_up_proj",): gate_and_up}
