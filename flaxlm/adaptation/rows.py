"""The vocabulary-shaped tensors of a model's params, rebuilt row by row for a new vocabulary.

Which tensors those are is asked of the family itself: the abstract params of the config and of the same config
one token larger differ exactly in them, on their vocabulary axis (input embeddings [V, D], an untied LM head
kernel [D, V], BERT's MLM output bias [V], ...). Nothing is allocated to find them."""
import copy

import jax
import numpy as np

from flaxlm.errors import UserError
from flaxlm.models import abstract_model
from flaxlm.models.convert import get_path, set_path


def flat(tree, prefix=()):
    if not isinstance(tree, dict):
        return {prefix: tree}
    return {p: x for k, v in tree.items() for p, x in flat(v, (*prefix, k)).items()}


def vocabulary_axes(config):
    """{params path: vocabulary axis} of config's pretraining model; UserError when it has none."""
    bigger = copy.deepcopy(config)
    bigger.vocab_size = config.vocab_size + 1
    shapes = flat(abstract_model(config)[1])
    grown = flat(abstract_model(bigger)[1])
    axes = {}
    for path, x in shapes.items():
        diff = [a for a, (n, m) in enumerate(zip(x.shape, grown[path].shape)) if n != m]
        if diff:
            axes[path] = diff[0]
    if not axes:
        raise UserError(f"found no embeddings of the vocabulary's size ({config.vocab_size}) in the "
                        f"{config.model_type} model; it cannot be given a new vocabulary")
    return axes


def check_rows(params, axes, vocab_size):
    """UserError unless each vocabulary tensor of the loaded params has vocab_size rows on its axis."""
    for path, axis in axes.items():
        shape = np.shape(get_path(params, path))
        if shape[axis] != vocab_size:
            raise UserError(f"the source's {'/'.join(path)} has shape {list(shape)}, not {vocab_size} rows of the "
                            f"vocabulary on axis {axis}; the checkpoint does not match its config.json")


def rebuild(params, fresh, axes, rules):
    """A copy of params whose vocabulary tensors are fresh's (the new config's freshly initialized model) with
    the rows that have a rule replaced by the rule's weighted sum of old rows."""
    out = jax.tree.map(np.asarray, params)
    for path, axis in axes.items():
        old_VX = np.moveaxis(np.asarray(get_path(params, path)), axis, 0)
        new_VX = np.array(np.moveaxis(np.asarray(get_path(fresh, path)), axis, 0))
        for new_id, (ids, weights) in rules.items():
            new_VX[new_id] = np.tensordot(np.asarray(weights, old_VX.dtype), old_VX[np.asarray(ids)], axes=1)
        set_path(out, path, np.moveaxis(new_VX, 0, axis))
    return out
