"""LoRA adapters on a decoder's linear layers, in Hugging Face PEFT's format.

    lora = LoraConfig(rank=16, alpha=32, dropout=0.05, targets=None)     # None: every projection of attention and MLP
    modules = add_lora(model, config, lora, seed=0)                      # adapters added to the model, in place
    save_adapter(out, config, params, lora, modules, base="runs/sft")    # adapter_config.json, adapter_model.safetensors
    params = merged(params, modules, lora)                               # W + alpha / r * A B, adapters dropped

Each targeted layer (a flaxlm.models.layers.Dense) gets lora_a [in, r] (uniform +-1/sqrt(in), PEFT's kaiming
init) and lora_b [r, out] (zeros: training starts from the base) and adds alpha / r * dropout(x) A B to its output,
as PEFT's LoRA Linear does. The targets are the module names PEFT takes (q_proj, c_attn, ...: the last part of the
Hugging Face module name, or a regular expression matched against the whole name); by default every linear layer
inside the decoder's layers. qwix's LoraProvider is not used: it adds an adapter where a Param of the calling
module is the right-hand side of a dot_general, and the Llama-style families multiply one concatenation of their q,
k and v (and gate, up) kernels, which is no Param (flaxlm.models.llama.fused_dense).
"""
import dataclasses
import json
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from flaxlm.errors import UserError
from flaxlm.models.convert import get_path
from flaxlm.models.layers import Dense
from flaxlm.models.registry import family_of

ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
LORA_LEAVES = ("lora_a", "lora_b")
TRAINABLE = r"/lora_[ab]$"  # --train_only's pattern of the adapters (flaxlm.training.freeze)


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    rank: int
    alpha: float = 8.0
    dropout: float = 0.0
    targets: tuple | str | None = None  # module names, or one regular expression; None: every layer's linear

    @property
    def scale(self):
        return self.alpha / self.rank


@dataclasses.dataclass(frozen=True)
class Module:
    hf: str  # the Hugging Face module name (model.layers.0.self_attn.q_proj)
    path: tuple  # our parameter path of the Dense (layers, 0, attn, q_proj)
    conv1d: bool  # a GPT-2 style Conv1D (weight [in, out]): PEFT's fan_in_fan_out


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


def add_lora(model, config, lora, seed=0):
    """Adapters on the targeted layers of model (in place); returns the [Module] they sit on."""
    modules = target_modules(config, lora.targets)
    dense = {tuple(str(k) for k in path): node for path, node in nnx.iter_graph(model) if isinstance(node, Dense)}
    key = jax.random.PRNGKey(seed)
    sites = {}
    for m in modules:
        lin = dense[m.path]
        d_in, d_out = lin.kernel.shape
        bound = 1.0 / np.sqrt(d_in)
        a = jax.random.uniform(jax.random.fold_in(key, len(sites)), (d_in, lora.rank), jnp.float32, -bound, bound)
        lin.lora_a, lin.lora_b = nnx.Param(a), nnx.Param(jnp.zeros((lora.rank, d_out), jnp.float32))
        lin.lora_scale, lin.lora_dropout = float(lora.scale), float(lora.dropout)
        lin.lora_site = sites.setdefault(m.hf.rsplit(".", 1)[-1], len(sites))
    return modules


def is_adapter(path):
    return path[-1] in LORA_LEAVES


def base_params(params):
    """params without the adapters."""
    if not isinstance(params, dict):
        return params
    return {k: base_params(v) for k, v in params.items() if k not in LORA_LEAVES}


def adapters_off(params):
    """params with every adapter's lora_b at zero, so that each layer gives its base's output (PEFT's
    disable_adapter): the reference model of a LoRA run, held by no second copy."""
    if not isinstance(params, dict):
        return params
    return {k: jnp.zeros_like(v) if k == "lora_b" else adapters_off(v) for k, v in params.items()}


def merged(params, modules, lora):
    """The base params with each adapter multiplied into its kernel (float32): W + alpha / r * A B."""
    out = base_params(params)
    for m in modules:
        layer = get_path(params, m.path)
        kernel = np.asarray(layer["kernel"], np.float32)
        delta = np.asarray(layer["lora_a"], np.float32) @ np.asarray(layer["lora_b"], np.float32) * lora.scale
        target = get_path(out, m.path)
        target["kernel"] = (kernel + delta).astype(np.asarray(layer["kernel"]).dtype)
    return out


def adapter_tensors(params, modules):
    """{PEFT tensor name: array}: lora_A.weight [r, in] and lora_B.weight [out, r] of each module."""
    out = {}
    for m in modules:
        layer = get_path(params, m.path)
        out[f"base_model.model.{m.hf}.lora_A.weight"] = np.ascontiguousarray(np.asarray(layer["lora_a"], np.float32).T)
        out[f"base_model.model.{m.hf}.lora_B.weight"] = np.ascontiguousarray(np.asarray(layer["lora_b"], np.float32).T)
    return out


def save_adapter(out_dir, config, params, lora, modules, base):
    """adapter_config.json (rank, alpha, dropout, targets, the base's name or path) and adapter_model.safetensors,
    as peft.PeftModel.from_pretrained(base_model, out_dir) loads them."""
    from safetensors.numpy import save_file
    os.makedirs(out_dir, exist_ok=True)
    names = lora.targets if isinstance(lora.targets, str) else sorted({m.hf.rsplit(".", 1)[-1] for m in modules})
    adapter = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base, "r": lora.rank,
               "lora_alpha": lora.alpha, "lora_dropout": lora.dropout, "target_modules": names,
               "fan_in_fan_out": any(m.conv1d for m in modules), "bias": "none", "use_rslora": False,
               "init_lora_weights": True, "inference_mode": True, "modules_to_save": None}
    with open(os.path.join(out_dir, ADAPTER_CONFIG), "w", encoding="utf-8") as f:
        json.dump(adapter, f, indent=2)
    save_file(adapter_tensors(params, modules), os.path.join(out_dir, ADAPTER_WEIGHTS), metadata={"format": "pt"})


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
    return LoraConfig(rank=int(c["r"]), alpha=float(c["lora_alpha"]), dropout=float(c.get("lora_dropout") or 0.0),
                      targets=tuple(c["target_modules"]) if isinstance(c["target_modules"], list)
                      else c["target_modules"]), load_file(weights)


def load_adapter(model, config, path):
    """The adapter of directory `path` added to model (in place) with its trained values; returns (LoraConfig,
    [Module])."""
    lora, tensors = read_adapter(path)
    modules = add_lora(model, config, lora)
    dense = {tuple(str(k) for k in p): node for p, node in nnx.iter_graph(model) if isinstance(node, Dense)}
    for m in modules:
        a, b = (tensors.get(f"base_model.model.{m.hf}.lora_{x}.weight") for x in "AB")
        if a is None or b is None:
            raise UserError(f"the adapter in {path} has no weights for {m.hf}; it was trained on another model")
        lin = dense[m.path]
        place = _replicated_like(lin.kernel[...])
        lin.lora_a[...] = jax.device_put(jnp.asarray(a.T, jnp.float32), place)
        lin.lora_b[...] = jax.device_put(jnp.asarray(b.T, jnp.float32), place)
    return lora, modules


def _replicated_like(kernel):
    """Where an adapter of this kernel goes: whole on every device of the kernel's mesh (an adapter is small), or
    where JAX puts it."""
    sharding = getattr(kernel, "sharding", None)
    if isinstance(sharding, jax.sharding.NamedSharding):
        return jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec())
    return None
