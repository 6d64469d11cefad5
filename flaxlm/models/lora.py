"""LoRA adapters on a decoder's linear layers, in Hugging Face PEFT's format.

    lora = LoraConfig(rank=16, alpha=32, dropout=0.05, targets=None)     # None: every projection of attention and MLP
    modules = add_lora(model, config, lora, seed=0)                      # adapters added to the model, in place
    save_adapter(out, config, params, lora, modules, base="runs/sft")    # adapter_config.json, adapter_model.safetensors
    params = merged(params, modules, lora)                               # W + alpha / r * A B, adapters dropped
    save_merged(out, config, params, lora, modules, base="mistral-7b/")  # the same from the base's own checkpoint

Each targeted layer (a flaxlm.models.layers.Dense) gets lora_a [in, r] (uniform +-1/sqrt(in), PEFT's kaiming
init) and lora_b [r, out] (zeros: training starts from the base) and adds alpha / r * dropout(x) A B to its output,
as PEFT's LoRA Linear does. The targets are the module names PEFT takes (q_proj, c_attn, ...: the last part of the
Hugging Face module name, or a regular expression matched against the whole name); by default every linear layer
inside the decoder's layers. A mixture of experts (flaxlm.models.moe.SparseMoE) holds its experts in 3-D parameters,
no Dense: LoraConfig.parameters (PEFT's target_parameters: mlp.experts.gate_up_proj, ...; none by default, as PEFT)
puts an ExpertLora on them (flaxlm.models.expert_lora: A_e and B_e per expert, W_e + alpha / r * B_e A_e, as PEFT's
ParamWrapper). qwix's LoraProvider is not used: it adds an adapter where a Param of the calling module is the
right-hand side of a dot_general, and the Llama-style families multiply one concatenation of their q, k and v (and
gate, up) kernels, which is no Param (flaxlm.models.llama.fused_dense).

Trainable tokens (LoraConfig.trainable_tokens: token ids; PEFT's trainable_token_indices, TrainableTokensLayer): the
rows of those tokens in the token embeddings and in an untied LM head train beside the adapters while the tables
stay frozen. Each such module (flaxlm.models.layers.Embed, Dense) gets token_ids and token_delta [n, D] (float32,
zeros: training starts from the base), and its lookups and the head see rows + token_delta (with_token_rows). The
export stores the rows' values (rows + delta, float32) as PEFT does (...embed_tokens.token_adapter.
trainable_tokens_delta, which despite its name holds the rows themselves, swapped in for the base's), so they are
whatever rows the base the adapter is loaded on has there: the vocabulary a run grew (the chat template's markers)
only needs to be as long on the base (transformers' resize_token_embeddings). The tied head shares the embedding's
rows; an untied head with a bias (GPT-J) keeps its rows frozen: PEFT's trainable tokens drop a head's bias.
"""
import dataclasses
import json
import os
import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx

from flaxlm.errors import UserError
from flaxlm.models.convert import get_path
from flaxlm.models import expert_lora
from flaxlm.models.registry import family_of

ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
LORA_LEAVES = ("lora_a", "lora_b", "token_delta")
TRAINABLE = r"/(lora_[ab]|token_delta)$"  # --train_only's pattern of the adapters (flaxlm.training.freeze)
TOKENS_KEY = "token_adapter.trainable_tokens_delta"  # PEFT's tensor of a module's trainable tokens' rows
NUMPY_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    rank: int
    alpha: float = 8.0
    dropout: float = 0.0
    targets: tuple | str | None = None  # module names, or one regular expression; None: every layer's linear
    trainable_tokens: tuple = ()  # token ids whose embedding (and untied head) rows train too, sorted
    parameters: tuple = ()  # expert parameters (PEFT's target_parameters: mlp.experts.gate_up_proj, ...); () none

    @property
    def scale(self):
        return self.alpha / self.rank


@dataclasses.dataclass(frozen=True)
class Module:
    hf: str  # the Hugging Face module name (model.layers.0.self_attn.q_proj)
    path: tuple  # our parameter path of the Dense (layers, 0, attn, q_proj)
    conv1d: bool  # a GPT-2 style Conv1D (weight [in, out]): PEFT's fan_in_fan_out
    parameter: str | None = None  # an expert parameter of the module at path (gate_up_proj); None: a Dense's kernel
    wrapped: int = 0  # how many of PEFT's ParamWrappers wrap this parameter's on the same module (their base_layer)

    @property
    def leaf(self):
        """The adapted parameter's name in our params: the Dense's kernel, or the expert parameter."""
        return self.parameter or "kernel"

    @property
    def key(self):
        """PEFT's name of the adapter, the part before .lora_A.weight (model.layers.0.mlp.experts.base_layer)."""
        return f"base_model.model.{self.hf}" + ".base_layer" * self.wrapped

    @property
    def label(self):
        """The adapted layer's short name: q_proj, or experts.gate_up_proj."""
        return self.hf.rsplit(".", 1)[-1] + (f".{self.parameter}" if self.parameter else "")


@dataclasses.dataclass(frozen=True)
class TokenSite:
    hf: str  # the Hugging Face module name (model.embed_tokens, lm_head)
    path: tuple  # our module's path (embed,) or (lm_head,)
    leaf: str  # its vocabulary table: embedding [V, D] or kernel [D, V]
    axis: int  # the table's vocabulary axis


def token_sites(config):
    """[TokenSite] whose rows trainable tokens train: the token embeddings, and an untied bias-free LM head."""
    names = {tuple(path): hf.removesuffix(".weight") for hf, path, _ in family_of(config).tensor_names(config)}
    sites = [TokenSite(names[("embed", "embedding")], ("embed",), "embedding", 0)]
    if ("lm_head", "kernel") in names and ("lm_head", "bias") not in names:
        sites.append(TokenSite(names[("lm_head", "kernel")], ("lm_head",), "kernel", 1))
    return sites


def linear_modules(config):
    """Every linear layer of the decoder's layers: [Module], in the family's tensor order."""
    out = []
    for hf, path, kind in family_of(config).tensor_names(config):
        if path[-1] == "kernel" and hf.endswith(".weight") and re.search(r"\.\d+\.", hf):
            out.append(Module(hf.removesuffix(".weight"), tuple(path[:-1]), kind == "copy"))
    return out


def target_modules(config, targets=None):
    """The modules the targets name (None: all of linear_modules); UserError naming the family's names when a target
    matches none."""
    modules = linear_modules(config)
    names = sorted({m.hf.rsplit(".", 1)[-1] for m in modules})
    if targets is None:
        return modules
    if isinstance(targets, str):
        chosen = [m for m in modules if re.fullmatch(targets, m.hf)]
        if not chosen:
            raise UserError(f"--lora_target_modules {targets!r} matches no linear layer of this {config.model_type} "
                            f"model; its layers' linear modules are {', '.join(names)}")
        return chosen
    for t in targets:
        if t not in names:
            raise UserError(f"--lora_target_modules {t} is not a linear module of this {config.model_type} model; use "
                            f"some of {', '.join(names)} (or a regular expression of whole module names)")
    return [m for m in modules if m.hf.rsplit(".", 1)[-1] in targets]


def expert_parameters(config):
    """Every expert parameter of the decoder's layers (a SparseMoE's gate_up_proj and down_proj): [Module] with hf
    the experts' module name (model.layers.0.mlp.experts), in the family's tensor order; [] for a dense model."""
    out = []
    for hf, path, _ in family_of(config).tensor_names(config):
        if path[-1] in expert_lora.EXPERT_PARAMETERS and hf.endswith(f".{path[-1]}") and re.search(r"\.\d+\.", hf):
            out.append(Module(hf.rsplit(".", 1)[0], tuple(path[:-1]), False, parameter=path[-1]))
    return out


def target_parameters(config, targets):
    """The expert parameters the targets name, as PEFT matches its target_parameters: a parameter's whole name
    (model.layers.0.mlp.experts.gate_up_proj) equal to a target or ending in "." + target. Each knows how many
    targeted parameters of its module PEFT wraps around its own (Module.wrapped). UserError naming the model's
    expert parameters when a target matches none."""
    if not targets:
        return []
    every = expert_parameters(config)
    names = sorted({re.split(r"\.\d+\.", f"{m.hf}.{m.parameter}", maxsplit=1)[-1] for m in every})
    for t in targets:
        if not every:
            raise UserError(f"--lora_target_parameters {t}: this {config.model_type} model has no expert parameters; "
                            f"adapt its linear layers with --lora_target_modules")
        if not any(_peft_matches(m, t) for m in every):
            raise UserError(f"--lora_target_parameters {t} is no expert parameter of this {config.model_type} model; "
                            f"use some of {', '.join(names)}")
    chosen = [m for m in every if any(_peft_matches(m, t) for t in targets)]
    order = expert_lora.EXPERT_PARAMETERS.index
    return [dataclasses.replace(m, wrapped=sum(o.hf == m.hf and order(o.parameter) > order(m.parameter)
                                               for o in chosen)) for m in chosen]


def _peft_matches(m, target):
    """Whether PEFT's target_parameters entry `target` names expert parameter m (peft's _inject_parameters)."""
    name = f"{m.hf}.{m.parameter}"
    return name == target or name.endswith(f".{target}")


def add_lora(model, config, lora, seed=0):
    """Adapters on the targeted layers and expert parameters of model (in place); returns the [Module] they sit
    on. UserError for dropout on expert parameters (PEFT's ParamWrapper has none)."""
    if lora.parameters and lora.dropout:
        raise UserError(f"--lora_dropout {lora.dropout:g} cannot apply to expert parameters (PEFT's LoRA on them has "
                        f"no dropout); drop --lora_dropout or --lora_target_parameters")
    modules = target_modules(config, lora.targets) + target_parameters(config, lora.parameters)
    nodes = {tuple(str(k) for k in path): node for path, node in nnx.iter_graph(model)}
    key = jax.random.PRNGKey(seed)
    sites = {}
    for i, m in enumerate(modules):
        if m.parameter:
            _add_expert_lora(nodes[m.path], m.parameter, lora, jax.random.fold_in(key, 1_000_000 + i))
            continue
        lin = nodes[m.path]
        d_in, d_out = lin.kernel.shape
        bound = 1.0 / np.sqrt(d_in)
        a = jax.random.uniform(jax.random.fold_in(key, len(sites)), (d_in, lora.rank), jnp.float32, -bound, bound)
        lin.lora_a, lin.lora_b = nnx.Param(a), nnx.Param(jnp.zeros((lora.rank, d_out), jnp.float32))
        lin.lora_scale, lin.lora_dropout = float(lora.scale), float(lora.dropout)
        lin.lora_site = sites.setdefault(m.hf.rsplit(".", 1)[-1], len(sites))
    if lora.trainable_tokens:
        add_token_rows(model, config, lora.trainable_tokens)
    return modules


def _add_expert_lora(moe, parameter, lora, key):
    """An ExpertLora on moe's expert parameter W [E, out, in]: A [E, r, in] uniform +-1/sqrt(in) (PEFT's kaiming
    init of its lora_A), B [E, out, r] zeros."""
    E, d_out, d_in = getattr(moe, parameter).shape
    bound = 1.0 / np.sqrt(d_in)
    a = jax.random.uniform(key, (E, lora.rank, d_in), jnp.float32, -bound, bound)
    setattr(moe, expert_lora.attribute_of(parameter),
            expert_lora.ExpertLora(a, jnp.zeros((E, d_out, lora.rank), jnp.float32), lora.scale))


def add_token_rows(model, config, ids):
    """Trainable rows for the token ids (in place): token_ids and token_delta (zeros [n, D], float32) on each
    TokenSite's module; UserError for an id outside the vocabulary."""
    nodes = {tuple(str(k) for k in path): node for path, node in nnx.iter_graph(model)}
    for site in token_sites(config):
        module = nodes[site.path]
        table = getattr(module, site.leaf).get_value()  # an abstract model's (--compile_for) is a ShapeDtypeStruct
        # the true vocabulary: a table padded past it (--pad_vocab_multiple) holds no token in its last rows
        rows, width = min(table.shape[site.axis], config.vocab_size), table.shape[1 - site.axis]
        bad = [i for i in ids if not 0 <= i < rows]
        if bad:
            raise UserError(f"token id {bad[0]} is outside the model's vocabulary of {rows} rows; "
                            f"--lora_trainable_tokens takes token ids below {rows}")
        module.token_ids = tuple(int(i) for i in ids)
        module.token_delta = nnx.Param(jax.device_put(jnp.zeros((len(ids), width), jnp.float32),
                                                      _replicated_like(table)))


def is_adapter(path):
    return path[-1] in LORA_LEAVES


def base_params(params):
    """params without the adapters (nor an expert parameter's adapter's node, gate_up_proj_lora)."""
    if not isinstance(params, dict):
        return params
    kept = {k: base_params(v) for k, v in params.items() if k not in LORA_LEAVES}
    return {k: v for k, v in kept.items() if not (isinstance(v, dict) and not v and params[k])}


def adapters_off(params):
    """params with every adapter's lora_b (and trainable tokens' token_delta) at zero, so that each layer gives its
    base's output (PEFT's disable_adapter): the reference model of a LoRA run, held by no second copy."""
    if not isinstance(params, dict):
        return params
    return {k: jnp.zeros_like(v) if k in ("lora_b", "token_delta") else adapters_off(v) for k, v in params.items()}


def lora_delta(params, m, lora):
    """alpha / r * A B [in, out] (float32, numpy) of module m's adapter; an expert parameter's: [E, out, in], its
    layout (expert_lora.delta)."""
    layer = get_path(params, m.path)
    if m.parameter:
        held = layer[expert_lora.attribute_of(m.parameter)]
        return np.asarray(expert_lora.delta(held["lora_a"], held["lora_b"], lora.scale))
    return np.asarray(layer["lora_a"], np.float32) @ np.asarray(layer["lora_b"], np.float32) * lora.scale


def token_rows(params, site, ids):
    """[n, D] float32 (numpy): the site's trained rows of the token ids, its table's rows plus token_delta."""
    module = get_path(params, site.path)
    rows = np.asarray(jnp.take(module[site.leaf], jnp.asarray(ids, jnp.int32), axis=site.axis), np.float32)
    return (rows if site.axis == 0 else rows.T) + np.asarray(module["token_delta"], np.float32)


def trained_sites(params, config):
    """The TokenSites that carry trained rows in params."""
    return [s for s in token_sites(config) if "token_delta" in get_path(params, s.path)]


def merged(params, modules, lora, config=None):
    """The base params with each adapter multiplied into its kernel (float32): W + alpha / r * A B, and (given the
    config) the trained token rows in their tables, in the params' dtype."""
    out = base_params(params)
    for m in modules:
        kernel = np.asarray(get_path(params, m.path)[m.leaf])
        get_path(out, m.path)[m.leaf] = (kernel.astype(np.float32) + lora_delta(params, m, lora)).astype(kernel.dtype)
    for site in trained_sites(params, config) if config is not None else ():
        table = np.array(get_path(out, site.path)[site.leaf])
        rows = token_rows(params, site, lora.trainable_tokens).astype(table.dtype)
        if site.axis == 0:
            table[np.asarray(lora.trainable_tokens)] = rows
        else:
            table[:, np.asarray(lora.trainable_tokens)] = rows.T
        get_path(out, site.path)[site.leaf] = table
    return out


def save_merged(out_dir, config, params, lora, modules, base, dtype=None):
    """config.json and model.safetensors of the base with the adapters multiplied in, as peft's
    PeftModel.from_pretrained(base, adapter).merge_and_unload() gives it: each tensor as read from the base's own
    checkpoint (not the run's copy, bfloat16 under LoRA), W + alpha / r * A B added in float32, the trained token
    rows in their tables (a vocabulary the run grew: its rows past the base's from params), everything in `dtype`
    (default: the base's, as transformers loads it). Returns the dtype's name."""
    from flaxlm.models.vocabulary_tensors import vocabulary_axes
    from flaxlm.models import hf_io
    from flaxlm.models.convert import hf_tensors, name_map_of
    from flaxlm.models.pretrained import save_config
    base_dir = hf_io.resolve_dir(base)
    base_config = hf_io.load_config(base_dir)
    stored = hf_tensors(base_config, hf_io.lazy_checkpoint(base_dir))
    dtype = dtype or checkpoint_dtype(base_config, stored)
    deltas = {tuple(m.path) + (m.leaf,): m for m in modules}
    axes = {tuple(p): a for p, a in vocabulary_axes(config).items()}
    sites = {tuple(s.path) + (s.leaf,): s for s in trained_sites(params, config)}
    out = {}
    for hf, path, kind in name_map_of(config).names:
        path = tuple(path)
        x = np.asarray(stored[hf])
        if path in deltas:  # the file's layout: a Linear's weight [out, in], a Conv1D's [in, out] as our kernel,
            delta = lora_delta(params, deltas[path], lora)  # an expert parameter's [E, out, in] as ours
            x = x.astype(np.float32) + (delta if deltas[path].conv1d or deltas[path].parameter else delta.T)
        if path in axes and config.vocab_size > len(x):  # the rows the run added (the file's layout: vocabulary first)
            added = np.asarray(jnp.take(get_path(params, path), jnp.arange(len(x), config.vocab_size), axis=axes[path]),
                               np.float32)
            x = np.concatenate([x.astype(np.float32), added.T if kind == "linear" else added])
        if path in sites:
            x = x.astype(np.float32)
            x[np.asarray(lora.trainable_tokens)] = token_rows(params, sites[path], lora.trainable_tokens)
        out[hf] = np.ascontiguousarray(x.astype(NUMPY_DTYPES[dtype]))
    export = family_of(config).export  # as save_pretrained writes the family (an MoE's experts: per expert)
    hf_io.write_safetensors(out_dir, out if export is None else export(config, out))
    save_config(out_dir, config, None, dtype)
    return dtype


def checkpoint_dtype(config, tensors):
    """The dtype name transformers' from_pretrained gives a checkpoint (dtype "auto"): its config.json's dtype, else
    its first floating tensor's."""
    named = str(getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or "").replace("torch.", "")
    if named in NUMPY_DTYPES:
        return named
    floating = (np.dtype(x.dtype).name for x in tensors.values() if np.dtype(x.dtype).kind == "f"
                or np.dtype(x.dtype).name == "bfloat16")
    return next((name for name in floating if name in NUMPY_DTYPES), "float32")


def adapter_tensors(params, modules):
    """{PEFT tensor name: array}: lora_A.weight [r, in] and lora_B.weight [out, r] of each module (an expert
    parameter's: [E * r, in] and [out, r * E], expert_lora.to_peft)."""
    out = {}
    for m in modules:
        layer = get_path(params, m.path)
        if m.parameter:
            held = layer[expert_lora.attribute_of(m.parameter)]
            out[f"{m.key}.lora_A.weight"], out[f"{m.key}.lora_B.weight"] = expert_lora.to_peft(
                np.asarray(held["lora_a"], np.float32), np.asarray(held["lora_b"], np.float32))
            continue
        out[f"{m.key}.lora_A.weight"] = np.ascontiguousarray(np.asarray(layer["lora_a"], np.float32).T)
        out[f"{m.key}.lora_B.weight"] = np.ascontiguousarray(np.asarray(layer["lora_b"], np.float32).T)
    return out


def token_tensors(params, config, lora):
    """({PEFT tensor name: array}, trainable_token_indices) of the trained token rows: each site's rows [n, D]
    (float32), and the ids as a list (the embeddings; a tied head follows them) or {module name: ids} with an untied
    head; ({}, None) without trainable tokens."""
    sites = trained_sites(params, config)
    if not sites:
        return {}, None
    ids = [int(i) for i in lora.trainable_tokens]
    tensors = {f"base_model.model.{s.hf}.{TOKENS_KEY}": np.ascontiguousarray(token_rows(params, s, ids))
               for s in sites}
    return tensors, (ids if len(sites) == 1 else {s.hf.rsplit(".", 1)[-1]: ids for s in sites})


def save_adapter(out_dir, config, params, lora, modules, base):
    """adapter_config.json (rank, alpha, dropout, targets, the base's name or path, the trainable tokens) and
    adapter_model.safetensors, as peft.PeftModel.from_pretrained(base_model, out_dir) loads them (a vocabulary the
    run grew: on the base resized to it, docs/post-training.md)."""
    from safetensors.numpy import save_file
    os.makedirs(out_dir, exist_ok=True)
    names = lora.targets if isinstance(lora.targets, str) else sorted({m.hf.rsplit(".", 1)[-1] for m in modules
                                                                        if not m.parameter})
    tokens, indices = token_tensors(params, config, lora)
    adapter = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base, "r": lora.rank,
               "lora_alpha": lora.alpha, "lora_dropout": lora.dropout, "target_modules": names,
               "fan_in_fan_out": any(m.conv1d for m in modules), "bias": "none", "use_rslora": False,
               "init_lora_weights": True, "inference_mode": True, "modules_to_save": None,
               "trainable_token_indices": indices, "target_parameters": list(lora.parameters) or None}
    with open(os.path.join(out_dir, ADAPTER_CONFIG), "w", encoding="utf-8") as f:
        json.dump(adapter, f, indent=2)
    save_file({**adapter_tensors(params, modules), **tokens}, os.path.join(out_dir, ADAPTER_WEIGHTS),
              metadata={"format": "pt"})


def read_adapter(path):
    """(LoraConfig, {PEFT tensor name: array}) of an adapter directory; UserError when it holds none."""
    from safetensors.numpy import load_file
    config_file, weights = os.path.join(path, ADAPTER_CONFIG), os.path.join(path, ADAPTER_WEIGHTS)
    if not (os.path.isfile(config_file) and os.path.isfile(weights)):
        raise UserError(f"no LoRA adapter in {path} (no {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS}); pass the directory "
                        f"a LoRA run exported")
    with open(config_file, encoding="utf-8") as f:
        c = json.load(f)
    if c.get("peft_type", "LORA") != "LORA":
        raise UserError(f"{path} holds a {c.get('peft_type')} adapter; only LoRA adapters are read")
    indices = c.get("trainable_token_indices") or ()
    if isinstance(indices, dict):
        if len({tuple(v) for v in indices.values()}) > 1:
            raise UserError(f"the adapter in {path} trains other tokens in {' and '.join(indices)}; only adapters "
                            f"that train the same tokens in each are read")
        indices = next(iter(indices.values()), ())
    return LoraConfig(rank=int(c["r"]), alpha=float(c["lora_alpha"]), dropout=float(c.get("lora_dropout") or 0.0),
                      targets=tuple(c["target_modules"]) if isinstance(c["target_modules"], list)
                      else c["target_modules"], trainable_tokens=tuple(sorted(int(i) for i in indices)),
                      parameters=tuple(c.get("target_parameters") or ())), \
        load_file(weights)


def load_adapter(model, config, path, tokens=()):
    """The adapter of directory `path` added to model (in place) with its trained values, its trainable tokens'
    rows too (the vocabulary grown first, in place with config.vocab_size, when they lie past it); tokens: more
    token ids to train (their rows start as the model's). Returns (LoraConfig, [Module])."""
    lora, tensors = read_adapter(path)
    stored = lora.trainable_tokens
    lora = dataclasses.replace(lora, trainable_tokens=tuple(sorted({*stored, *(int(i) for i in tokens)})))
    if stored and max(stored) >= config.vocab_size:
        grow_vocabulary(model, config, max(stored) + 1)
    modules = add_lora(model, config, lora)
    _load_token_rows(model, config, lora, stored, tensors)
    nodes = {tuple(str(k) for k in p): node for p, node in nnx.iter_graph(model)}
    for m in modules:
        a, b = (tensors.get(f"{m.key}.lora_{x}.weight") for x in "AB")
        if a is None or b is None:
            raise UserError(f"the adapter in {path} has no weights for {m.hf}; it was trained on another model")
        if m.parameter:  # an expert parameter's (expert_lora.from_peft)
            held = getattr(nodes[m.path], expert_lora.attribute_of(m.parameter))
            place = _replicated_like(getattr(nodes[m.path], m.parameter)[...])
            for leaf, x in zip((held.lora_a, held.lora_b), expert_lora.from_peft(a, b, held.lora_a.shape[0])):
                leaf[...] = jax.device_put(jnp.asarray(x, jnp.float32), place)
            continue
        lin = nodes[m.path]
        place = _replicated_like(lin.kernel[...])
        lin.lora_a[...] = jax.device_put(jnp.asarray(a.T, jnp.float32), place)
        lin.lora_b[...] = jax.device_put(jnp.asarray(b.T, jnp.float32), place)
    return lora, modules


def _load_token_rows(model, config, lora, stored, tensors):
    """Each site's token_delta set so that the rows of the `stored` ids are the adapter's: its rows minus the
    model's (an adapter's site without rows, as a list's untied head: the model's rows)."""
    nodes = {tuple(str(k) for k in p): node for p, node in nnx.iter_graph(model)}
    where = np.searchsorted(np.asarray(lora.trainable_tokens), np.asarray(stored, np.int64))
    for site in token_sites(config) if stored else ():
        rows = tensors.get(f"base_model.model.{site.hf}.{TOKENS_KEY}")
        if rows is None:
            continue
        module = nodes[site.path]
        base = np.asarray(jnp.take(getattr(module, site.leaf)[...], jnp.asarray(stored, jnp.int32), axis=site.axis),
                          np.float32)
        delta = np.zeros(module.token_delta.shape, np.float32)
        delta[where] = rows.astype(np.float32) - (base if site.axis == 0 else base.T)
        module.token_delta[...] = jax.device_put(jnp.asarray(delta), _replicated_like(module.token_delta[...]))


def grow_vocabulary(model, config, size):
    """The model's vocabulary-sized tables grown to `size` rows (zeros; in place, config.vocab_size too): the room
    an adapter's trainable tokens need past the base's vocabulary (PEFT's users resize the base so). Tables padded
    in memory (--pad_vocab_multiple) grow to size's padded rows (their padding rows are zeros already)."""
    from flaxlm.models.vocabulary_tensors import vocabulary_axes
    from flaxlm.models.vocab_padding import padded_rows
    nodes = {tuple(str(k) for k in p): node for p, node in nnx.iter_graph(model)}
    rows = padded_rows(size, model.execution.vocab_multiple)
    for path, axis in vocabulary_axes(config).items():
        variable = getattr(nodes[tuple(path[:-1])], path[-1])
        x = variable[...]
        pad = [(0, 0)] * x.ndim
        pad[axis] = (0, max(0, rows - x.shape[axis]))
        variable.set_value(jnp.pad(x, pad))
    config.vocab_size = size
    model.set_vocab_size(size)  # what the head cuts its logits to


def _replicated_like(kernel):
    """Where an adapter of this kernel goes: whole on every device of the kernel's mesh (an adapter is small), or
    where JAX puts it."""
    sharding = getattr(kernel, "sharding", None)
    if isinstance(sharding, jax.sharding.NamedSharding):
        return jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec())
    return None
