"""Models: construction from a transformers config, and a functional (graphdef, params) view for jax.jit.

    model = create_model(config, dtype="bfloat16")
    graphdef, params = split_model(model)            # params: nested dict of float32 arrays, str keys
    logits = apply_model(graphdef, params, ids_BL, mask_BL, masked_positions_BP=pos_BP, dropout_key=key)  # BERT
    logits = apply_model(graphdef, params, ids_BL, mask_BL, decoder_ids_BT, dropout_key=key)  # T5
    logits = apply_model(graphdef, params, ids_BL, mask_BL, positions_BL, dropout_key=key)  # causal LMs
    h, head = apply_hidden(graphdef, params, ...same arguments...)  # the head's input rows and the head itself

How the layers run (a loop or jax.lax.scan, rematerialization, the attention kernel): create_model(config,
execution=Execution(scan=True, remat="full")) (flaxlm.models.layer_stack); the params are the same either way.

Fine-tuning heads (BERT/RoBERTa): create_model(config, task="sequence_classification" or "question_answering"),
or load_for_task(path, task) for the encoder of a pretrained checkpoint with that head (flaxlm.models.hf_io).
"""
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from flaxlm.errors import UserError
from flaxlm.models import bert, bert_heads, gpt2, llama, opt, t5
from flaxlm.models.layer_stack import Execution
from flaxlm.models.layers import compute_dtype

# config.model_type -> module class taking (config, *, dtype, rngs). Later families register here.
MODELS = {
    "bert": bert.BertForMaskedLM,
    "roberta": bert.BertForMaskedLM,
    "t5": t5.T5ForConditionalGeneration,
    "gpt2": gpt2.GPT2LMHeadModel,
    "opt": opt.OPTForCausalLM,
    "llama": llama.LlamaForCausalLM,
}
CAUSAL_LM_TYPES = ("gpt2", "opt", "llama")  # decoder-only families: run_clm_flax.py and generation
# fine-tuning task -> module class on the BERT/RoBERTa encoder (task None: the family's pretraining model above)
TASK_MODELS = {
    "sequence_classification": bert_heads.BertForSequenceClassification,
    "question_answering": bert_heads.BertForQuestionAnswering,
}
TASK_MODEL_TYPES = ("bert", "roberta")


def model_class(config, task=None):
    model_type = getattr(config, "model_type", None)
    if model_type not in MODELS:
        raise UserError(f"unsupported model_type {model_type!r}; supported: {', '.join(MODELS)}")
    if task is None:
        return MODELS[model_type]
    if task not in TASK_MODELS:
        raise UserError(f"unknown task {task!r}; use one of {', '.join(TASK_MODELS)}")
    if model_type not in TASK_MODEL_TYPES:
        raise UserError(f"{task.replace('_', ' ')} needs a BERT or RoBERTa model, not model_type {model_type!r}; "
                        f"use a bert or roberta checkpoint")
    return TASK_MODELS[task]


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
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))


def abstract_model(config, dtype="float32", task=None, execution=None):
    """(graphdef, params of jax.ShapeDtypeStruct) without allocating or initializing anything."""
    graphdef, state = nnx.split(nnx.eval_shape(lambda: create_model(config, dtype, task=task, execution=execution)),
                                nnx.Param)
    return graphdef, _keys_to_str(jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, jnp.float32),
                                               nnx.to_pure_dict(state)))


from flaxlm.models.hf_io import (  # noqa: E402  (hf_io uses the functions above)
    from_hf_state_dict, load_config, load_for_task, load_pretrained, save_pretrained, to_hf_state_dict)

__all__ = ["MODELS", "CAUSAL_LM_TYPES", "TASK_MODELS", "create_model", "load_for_task", "split_model", "merge_model", "apply_model", "apply_hidden",
           "Execution", "decay_mask",
           "count_params",
           "abstract_model", "load_config", "load_pretrained", "save_pretrained", "to_hf_state_dict",
           "from_hf_state_dict"]
