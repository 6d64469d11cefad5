"""Our params <-> Hugging Face state dicts ({tensor name: array}), through the family's name map
(flaxlm.models.family.NameMap). The loader is strict: every tensor is used, none is missing, every shape matches.
"""
import logging

import numpy as np

from flaxlm.errors import UserError
from flaxlm.models.build import abstract_model, create_model, model_class, split_model
from flaxlm.models.registry import family_of
from flaxlm.models.vocab_padding import cut_to, zero_padded

logger = logging.getLogger(__name__)


def name_map_of(config, task=None):
    """The NameMap of config's pretraining model (task None) or of a fine-tuning task's model; UserError for an
    unsupported model_type or a task its family has no head for."""
    model_class(config, task)
    return family_of(config).name_map(config, task)


def task_of(config, params):
    """The fine-tuning task whose head `params` hold (a Head of config's family), or None. Heads of the same
    parameters (ModernBERT's, ELECTRA's token and sequence classifiers' groups) are told apart by their tensor
    paths, then by config.architectures (task_config names the task's class there)."""
    family = family_of(config)
    fits = [task for task, head in family.heads.items() if all(g in params for g in head.groups)
            and all(_has_path(params, path) for _, path, _ in family.head_tensor_names(config, task)
                    if path[0] in head.groups)]
    named = [task for task in fits if family.heads[task].architecture in (getattr(config, "architectures", None)
                                                                          or ())]
    return (named or fits or [None])[0]


def _has_path(tree, path):
    for k in path:
        if not isinstance(tree, dict) or k not in tree:
            return False
        tree = tree[k]
    return True


def get_path(tree, path):
    for k in path:
        tree = tree[k]
    return tree


def set_path(tree, path, value):
    for k in path[:-1]:
        tree = tree.setdefault(k, {})
    tree[path[-1]] = value


def _describe(config):
    """'model_type 't5', 2+2 layers': what a mismatch message names of config.json."""
    layers = str(config.num_hidden_layers)
    if getattr(config, "num_decoder_layers", None) is not None:
        layers += f"+{config.num_decoder_layers}"
    return f"model_type {config.model_type!r}, {layers} layers"


def _list(names, limit=5):
    names = sorted(names)
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def to_hf_state_dict(config, params):
    """Our params -> {Hugging Face tensor name: numpy array}, as transformers' save_pretrained writes (for a
    fine-tuning head's params, as the task's *ForSequenceClassification / *ForQuestionAnswering): float32, or
    bfloat16 where the params are (--param_dtype bfloat16). A vocabulary padded in memory (--pad_vocab_multiple)
    is written in config.vocab_size rows, the shapes of the unpadded model."""
    task = task_of(config, params)
    _, shapes = abstract_model(config, task=task)  # unpadded
    out = {}
    for hf, path, kind in name_map_of(config, task).names:
        x = cut_to(np.asarray(get_path(params, path)), get_path(shapes, path).shape)
        x = x if x.dtype.name == "bfloat16" else x.astype(np.float32)
        out[hf] = np.ascontiguousarray(x.T if kind == "linear" else x)
    export = family_of(config).export
    return out if export is None or task is not None else export(config, out)


def _fill_absent_groups(config, tensors, name_map, absent, init_params, seed, task, notes):
    """tensors with the parameter groups the checkpoint lacks entirely taken from init_params (default: a fresh
    init from seed), and a note saying so."""
    if init_params is None:
        _, init_params = split_model(create_model(config, seed=seed, task=task))
    if task is None:
        notes.append("the checkpoint has no masked-LM head (a bare encoder); the head starts freshly initialized")
    else:
        notes.append(f"the checkpoint has no {' / '.join(absent)} weights of the {task.replace('_', ' ')} "
                     f"head; they start freshly initialized (train them before use)")
    tensors = dict(tensors)
    for hf, path, kind in name_map.names:
        if path[0] in absent:
            x = np.asarray(get_path(init_params, path), np.float32)
            tensors[hf] = x.T if kind == "linear" else x
    return tensors


def _matched(config, tensors, init_params, seed, task):
    """(the name map's [(hf_name, our_path, kind)], the tensors in its names): every expected tensor present with
    the shape config.json implies, none unexpected (else a UserError naming them); a head the checkpoint lacks
    entirely filled in from init_params (default: a fresh init from seed), with a warning."""
    name_map = name_map_of(config, task)
    notes = []
    tensors = name_map.normalize(dict(tensors), notes)
    _, shapes = abstract_model(config, task=task)
    expected = name_map.names
    absent = [g for g in name_map.fresh_groups if not any(hf in tensors for hf, path, _ in expected if path[0] == g)]
    missing = [hf for hf, path, _ in expected if hf not in tensors and path[0] not in absent]
    if missing:
        raise UserError(f"checkpoint is missing tensor(s) {_list(missing)}; it does not match config.json "
                        f"({_describe(config)})")
    if absent:  # a bare encoder, or a pretrained one fine-tuned for the first time: the head starts fresh
        tensors = _fill_absent_groups(config, tensors, name_map, absent, init_params, seed, task, notes)
    unexpected = set(tensors) - {hf for hf, _, _ in expected}
    if unexpected:
        raise UserError(f"checkpoint has unexpected tensor(s) {_list(unexpected)}; it does not match config.json "
                        f"({_describe(config)})")
    for hf, path, kind in expected:
        want = tuple(get_path(shapes, path).shape)
        want_hf = want[::-1] if kind == "linear" else want
        x = tensors[hf]
        if tuple(x.shape) != want_hf:
            if task is not None and path[0] in name_map.fresh_groups:
                raise UserError(f"tensor {hf} of the checkpoint's {task.replace('_', ' ')} head has shape "
                                f"{tuple(x.shape)}, this task needs {want_hf} (num_labels={config.num_labels}); "
                                f"fine-tune from the pretrained model instead (a checkpoint without this head)")
            raise UserError(f"tensor {hf} has shape {tuple(x.shape)} but config.json implies {want_hf}; "
                            f"use the config.json the checkpoint was saved with")
    for note in notes:
        logger.warning("%s", note)
    return expected, tensors


def hf_tensors(config, tensors):
    """{Hugging Face name: tensor} of config's pretraining model from a checkpoint's tensors, under the names its name
    map writes (normalized and checked as the loader does), each as the file holds it (its dtype; a
    hf_io.LazyTensor is read only when asked)."""
    return _matched(config, tensors, None, 0, None)[1]


def from_hf_state_dict(config, tensors, *, init_params=None, seed=0, task=None):
    """{Hugging Face tensor name: array} -> our params (nested dict of float32 numpy arrays), for the family's
    pretraining model (task None) or a fine-tuning task's model (a Head of the family).

    A head the checkpoint lacks entirely (BERT/RoBERTa: the MLM head of a bare encoder; a task's head on a
    pretrained encoder) comes from `init_params` (default: a fresh init from seed), with a warning. Any other
    missing, unexpected or wrongly shaped tensor is a UserError.
    """
    expected, tensors = _matched(config, tensors, init_params, seed, task)
    params = {}
    for hf, path, kind in expected:
        x = np.asarray(tensors[hf]).astype(np.float32)
        set_path(params, path, np.ascontiguousarray(x.T if kind == "linear" else x))
    return params


def place_hf_state_dict(config, tensors, shardings, *, param_dtype="float32", seed=0, task=None, shapes=None):
    """from_hf_state_dict's params as jax Arrays, each tensor read straight into its place: shardings is a pytree
    like the params of jax.sharding.Sharding (the train state's, e.g. fsdp over a mesh); shapes (optional), one like
    it of the model's parameter shapes: a vocabulary table padded there (--pad_vocab_multiple) gets zero rows past
    the checkpoint's. One tensor at a time (a
    hf_io.LazyTensor is read when its turn comes), each device gets its slice in the file's dtype and casts it to
    param_dtype ("float32" master weights, or "bfloat16"): the host holds one tensor, never the model."""
    import jax.numpy as jnp

    expected, tensors = _matched(config, tensors, None, seed, task)
    dtype = jnp.dtype(param_dtype)
    params = {}
    for hf, path, kind in expected:
        x = np.asarray(tensors[hf])
        if shapes is not None:  # in the file's layout: a torch Linear's weight is our kernel transposed
            shape = get_path(shapes, path).shape
            x = zero_padded(x, shape[::-1] if kind == "linear" else shape)
        x = _place(x, kind == "linear", get_path(shardings, path))
        # waited for, so that the host's copy and the file-dtype one are freed before the next tensor comes
        set_path(params, path, (x if x.dtype == dtype else _cast(x, dtype)).block_until_ready())
    return params


def _place(x, transposed, sharding):
    """The jax Array of numpy tensor x (transposed: a torch Linear weight, our kernel is its transpose) with
    `sharding`: each device gets its slice."""
    import jax

    shape = tuple(x.shape)[::-1] if transposed else tuple(x.shape)

    def read(index):  # one device's slice of the target array
        index = tuple(index) + (slice(None),) * (len(shape) - len(tuple(index)))
        if transposed:
            return np.ascontiguousarray(x[index[::-1]].T)
        return np.ascontiguousarray(x[index]) if index else np.asarray(x)
    return jax.make_array_from_callback(shape, sharding, read)


def _cast(x, dtype):
    import jax
    global _CAST
    if _CAST is None:  # elementwise: each device converts its own part, the sharding stays x's
        _CAST = jax.jit(lambda a, d: a.astype(d), static_argnums=1)
    return _CAST(x, dtype)


_CAST = None
