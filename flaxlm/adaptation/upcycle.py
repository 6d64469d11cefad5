"""upcycle_moe.py's steps (sparse upcycling, Komatsuzaki et al. 2023): a dense decoder becomes its family's
mixture-of-experts sibling, every expert of a layer a copy of that layer's MLP, the router of each layer new and
random, every other tensor copied. The k routing weights are renormalized to sum to 1 (norm_topk_prob), so
sum_k w_k * MLP(x) = MLP(x): the upcycled model computes the dense model's function (its loss at step 0 is the dense
model's) until training makes the experts differ.

The families that have a sibling: SIBLINGS, one row each. Input: a dense model directory (or hub name) with its
tokenizer; output: a Hugging Face directory (config.json, safetensors with the experts per expert as the hub's MoE
checkpoints hold them, the tokenizer's files copied) that transformers and flaxlm load.
"""
import dataclasses
import os
import shutil
from typing import Callable

import numpy as np

from flaxlm.errors import UserError
from flaxlm.files import check_new_dir
from flaxlm.models import abstract_model, count_config_params, family_of, load_config, load_pretrained, save_pretrained
from flaxlm.models import split_model
from flaxlm.models.convert import set_path
from flaxlm.models.hf_io import lazy_checkpoint, resolve_dir
from flaxlm.models.presets import config_for, human
from flaxlm.models.vocabulary_tensors import flat
from flaxlm.tokenization.loading import TOKENIZER_FILES, load_tokenizer


@dataclasses.dataclass(frozen=True)
class Sibling:
    """A dense family's mixture-of-experts sibling: its model_type; fields(dense config, E, k), the config keys
    that make every layer sparse with E experts as wide as the dense MLP, k per token, renormalized; the dense
    config's keys the sibling has no use for."""
    model_type: str
    fields: Callable
    drop: tuple = ()


def _qwen3_moe_fields(config, E, k):
    # Qwen3-MoE windows every layer or none (use_sliding_window); a dense Qwen3 names each layer's (layer_types):
    # upcycled_config checks that the two agree layer by layer
    windowed = "sliding_attention" in (getattr(config, "layer_types", None) or [])
    return dict(num_experts=E, num_experts_per_tok=k, moe_intermediate_size=config.intermediate_size,
                decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True, use_sliding_window=windowed,
                sliding_window=config.sliding_window if windowed else None)


SIBLINGS = {
    "qwen3": Sibling("qwen3_moe", _qwen3_moe_fields, drop=("layer_types", "max_window_layers")),
    # Mixtral's experts are intermediate_size wide (the dense MLP's, copied) and always renormalized
    "mistral": Sibling("mixtral", lambda config, E, k: dict(num_local_experts=E, num_experts_per_tok=k)),
}
_NOT_CARRIED = ("model_type", "architectures", "transformers_version", "dtype", "torch_dtype")  # save_config's
_MODEL_FILES = ("chat_template.jinja", "generation_config.json")  # copied with the tokenizer's files


def sibling_of(config, source):
    """The Sibling of config's family; UserError naming the families that have one."""
    if config.model_type in SIBLINGS:
        return SIBLINGS[config.model_type]
    known = ", ".join(f"{dense} (to {s.model_type})" for dense, s in SIBLINGS.items())
    if config.model_type in {s.model_type for s in SIBLINGS.values()}:
        raise UserError(f"{source} holds a {config.model_type} model, a mixture of experts already; pass a dense "
                        f"model: {known}")
    raise UserError(f"{source} holds a {config.model_type} model, which has no mixture-of-experts sibling in "
                    f"flaxlm; upcycle {known}")


def windows(config):
    """Each layer's sliding window (None: full attention) as config's family builds the layer."""
    model = family_of(config).model
    return [model.layer_options(config, i).get("window") for i in range(config.num_hidden_layers)]


def upcycled_config(config, num_experts, k, source):
    """The sibling's transformers config: config's values (those the sibling reads), every layer sparse with
    num_experts experts of the dense MLP's width, k per token, renormalized; UserError when the sibling cannot
    attend as the dense model does."""
    sibling = sibling_of(config, source)
    kept = {key: value for key, value in config.to_dict().items() if key not in (*_NOT_CARRIED, *sibling.drop)}
    moe = config_for(sibling.model_type, {**kept, **sibling.fields(config, num_experts, k)})
    if windows(moe) != windows(config):
        raise UserError(f"{source}'s layers attend over the sliding windows {windows(config)}, which "
                        f"{sibling.model_type} cannot express (one window for every layer, or none); upcycle a "
                        f"model whose layers all attend alike")
    return moe


def upcycled_params(dense, moe_config, router_std, seed):
    """The sibling's params from the dense params: a tensor at the same path and shape copied; in each sparse
    layer the router (mlp.gate [E, D]) drawn from normal(router_std) and every expert the dense MLP, gate_up_proj
    [E, 2I, D] its gate and up kernels transposed, down_proj [E, D, I] its down kernel transposed, shared by the E
    experts without copies (np.broadcast_to; the export writes each expert). In the dense params' dtype."""
    rng = np.random.default_rng(seed)
    dense_flat = {path: np.asarray(x) for path, x in flat(dense).items()}
    dtype = next(iter(dense_flat.values())).dtype
    out, used = {}, set()
    for path, shape in flat(abstract_model(moe_config)[1]).items():
        *mlp, name = path
        if path in dense_flat and dense_flat[path].shape == shape.shape:
            x, used = dense_flat[path], used | {path}
        elif name == "gate":
            x = rng.normal(0.0, router_std, shape.shape).astype(dtype)
        elif name in ("gate_up_proj", "down_proj"):
            parts = [(*mlp, p, "kernel") for p in (("gate_proj", "up_proj") if name == "gate_up_proj" else
                                                   ("down_proj",))]
            used |= set(parts)
            x = np.broadcast_to(np.concatenate([dense_flat[p].T for p in parts]), shape.shape)  # [in, out] -> [out, in]
        else:
            raise RuntimeError(f"upcycling does not know where {'.'.join(path)} of {moe_config.model_type} comes from")
        set_path(out, path, x)
    left = sorted(".".join(p) for p in set(dense_flat) - used)
    if left:
        raise RuntimeError(f"upcycling left dense tensors unused: {left[:5]}")
    return out


def checkpoint_dtype(path):
    """'bfloat16' when every tensor of the checkpoint in directory `path` is, else 'float32': the upcycled model is
    written as the dense one was."""
    dtypes = {np.dtype(x.dtype).name for x in lazy_checkpoint(path).values()}
    return "bfloat16" if dtypes == {"bfloat16"} else "float32"


def copy_model_files(source, output_dir):
    """The tokenizer's files, its chat template and the generation config of directory `source`, byte for byte."""
    for name in (*TOKENIZER_FILES, *_MODEL_FILES):
        if os.path.isfile(os.path.join(source, name)):
            shutil.copyfile(os.path.join(source, name), os.path.join(output_dir, name))


def active_params(params, E, k):
    """The parameters one token runs through: all of params less the E - k experts of each layer it is not routed
    to."""
    numbers = {path: x.size for path, x in flat(params).items()}
    experts = sum(n for path, n in numbers.items() if path[-1] in ("gate_up_proj", "down_proj"))
    return sum(numbers.values()) - experts * (E - k) // E


def upcycle(args):
    """Write the upcycled model of args.model_name_or_path into args.output_dir; returns the line that says what
    was written. Every check that needs no weights runs before they are loaded, and before anything is written."""
    E, k = args.num_experts, args.num_experts_per_tok
    check_new_dir(args.output_dir)
    if k > E:
        raise UserError(f"--num_experts_per_tok {k} is more than --num_experts {E}; route each token to at most "
                        f"--num_experts experts")
    source = resolve_dir(args.model_name_or_path)
    dense_config = load_config(source)
    moe_config = upcycled_config(dense_config, E, k, args.model_name_or_path)
    load_tokenizer(source, local_only=True)  # one without a tokenizer fails here, not after the weights
    std = getattr(dense_config, "initializer_range", 0.02) if args.router_init_std is None else args.router_init_std
    print(f"loading {args.model_name_or_path} ({dense_config.model_type}, "
          f"{human(count_config_params(dense_config))} parameters)", flush=True)
    _, model = load_pretrained(source, param_dtype=checkpoint_dtype(source))
    params = upcycled_params(split_model(model)[1], moe_config, std, args.seed)
    total = count_config_params(moe_config)
    print(f"writing {args.output_dir} ({moe_config.model_type}, {human(total)} parameters)", flush=True)
    save_pretrained(args.output_dir, moe_config, params)
    copy_model_files(source, args.output_dir)
    return (f"{moe_config.model_type}, {E} experts ({k} per token) in each of {moe_config.num_hidden_layers} layers, "
            f"{human(total)} parameters ({human(active_params(params, E, k))} active per token), routers "
            f"normal(0, {std:g}) from seed {args.seed}")
