"""The vocabulary-shaped tensors of a model's params (flaxlm.models.vocabulary_tensors finds them), rebuilt row by
row for a new vocabulary."""
import jax
import numpy as np

from flaxlm.errors import UserError
from flaxlm.models.convert import get_path, set_path


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
