"""Building a model from its transformers config, and the functional (graphdef, params) view of it for jax.jit.

    model = create_model(config, dtype="bfloat16")
    graphdef, params = split_model(model)            # params: nested dict of float32 arrays, str keys
    logits = apply_model(graphdef, params, ids_BL, mask_BL, masked_positions_BP=pos_BP, dropout_key=key)  # BERT
    logits = apply_model(graphdef, params, ids_BL, mask_BL, decoder_ids_BT, dropout_key=key)  # T5
    logits = apply_model(graphdef, params, ids_BL, mask_BL, positions_BL, dropout_key=key)  # causal LMs
    h, head = apply_hidden(graphdef, params, ...same arguments...)  # the head's input rows and the head itself
"""
import copy

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from flaxlm.errors import UserError
from flaxlm.models.layers import compute_dtype
from flaxlm.models.registry import FAMILIES, TASKS, family_of


def model_class(config, task=None):
    """The module class of config's family: its pretraining model (task None) or a fine-tuning task's model."""
    family = family_of(config)
    if task is None:
        return family.model
    if task not in TASKS:
        raise UserError(f"unknown task {task!r}; use one of {', '.join(TASKS)}")
    if task not in family.heads:
        able = [f for f in FAMILIES.values() if task in f.heads]
        raise UserError(f"{task.replace('_', ' ')} needs a {' or '.join(f.name for f in able)} model, not model_type "
                        f"{family.model_type!r}; use a {' or '.join(f.model_type for f in able)} checkpoint")
    return family.heads[task].model


def create_model(config, dtype="float32", seed=0, task=None, execution=None):
    """A freshly initialized model for `config` (a transformers config); parameters float32. task None: the
    family's pretraining model; "sequence_classification" / "question_answering": that head on the encoder.
    execution: how its layers run (Execution; None: a plain loop, JAX's choice of attention)."""
    cls = model_class(config, task)
    if execution is not None:
        execution.check(compute_dtype(dtype))
    return cls(config, dtype=dtype, rngs=nnx.Rngs(seed), execution=execution)


def _keys_to_str(tree):
    return {str(k): _keys_to_str(v) for k, v in tree.items()} if isinstance(tree, dict) else tree


def _keys_from_str(tree):
    # nnx.List children have int keys; nnx.merge orders leaves by sorted path, so "10" < "2" would misplace them.
    if not isinstance(tree, dict):
        return tree
    return {(int(k) if isinstance(k, str) and k.isdigit() else k): _keys_from_str(v) for k, v in tree.items()}


def split_model(model):
    """(graphdef, params): params is a nested plain dict (string keys) of the model's float32 arrays."""
    graphdef, state = nnx.split(model, nnx.Param)
    return graphdef, _keys_to_str(nnx.to_pure_dict(state))


def merge_model(graphdef, params):
    """The module for (graphdef, params); works on traced arrays inside jax.jit / jax.grad."""
    return nnx.merge(graphdef, _keys_from_str(params))


def apply_model(graphdef, params, *args, **kwargs):
    """Rebuild the module from (graphdef, params) and call it: the functional form for jit/grad."""
    return merge_model(graphdef, params)(*args, **kwargs)


def apply_hidden(graphdef, params, *args, **kwargs):
    """(h, head): the rows the LM head would multiply (the model called with hidden=True) and the head
    (layers.LMHead), for a loss that fuses the head with the cross-entropy (flaxlm.objectives.lm_loss)."""
    model = merge_model(graphdef, params)
    return model(*args, hidden=True, **kwargs), model.head()


def decay_mask(params):
    """True where weight decay applies (kernels, embeddings); False for every bias and LayerNorm scale/bias."""
    def walk(tree):
        return {k: (walk(v) if isinstance(v, dict) else k not in ("bias", "scale")) for k, v in tree.items()}
    return walk(params)


def count_params(params):
    """How many numbers params hold (arrays or jax.ShapeDtypeStructs: abstract_model's count too)."""
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))


def abstract_model(config, dtype="float32", task=None, execution=None):
    """(graphdef, params of jax.ShapeDtypeStruct) without allocating or initializing anything."""
    graphdef, state = nnx.split(nnx.eval_shape(lambda: create_model(config, dtype, task=task, execution=execution)),
                                nnx.Param)
    return graphdef, _keys_to_str(jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, jnp.float32),
                                               nnx.to_pure_dict(state)))


def count_config_params(config):
    """count_params(abstract_model(config)[1]), from models of one and two layers (every layer past the first has the
    same parameters): listing the presets does not trace 30 layers each. Lists of one entry per layer (layer_types,
    attention_layers) are cut to the depth; a family that rejects the shallower config is counted in full."""
    depth = {k: getattr(config, k) for k in ("num_hidden_layers", "num_decoder_layers")
             if getattr(config, k, None) is not None}

    def count(**layers):
        shallow = copy.deepcopy(config) if layers else config
        for k, n in layers.items():
            setattr(shallow, k, n)
        for name in ("layer_types", "attention_layers"):
            per_layer = getattr(config, name, None)
            if layers and isinstance(per_layer, list) and len(per_layer) == depth["num_hidden_layers"]:
                setattr(shallow, name, per_layer[:shallow.num_hidden_layers])
        return count_params(abstract_model(shallow)[1])

    if max(depth.values()) <= 2:
        return count()
    ones = dict.fromkeys(depth, 1)
    try:
        one = count(**ones)
        return one + sum((n - 1) * (count(**{**ones, k: 2}) - one) for k, n in depth.items())
    except UserError:
        return count()
