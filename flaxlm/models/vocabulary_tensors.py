"""Which tensors of a model's params are vocabulary-shaped, asked of the family itself: the abstract params of the
config and of the same config one token larger differ exactly in them, on their vocabulary axis (input embeddings
[V, D], an untied LM head kernel [D, V], BERT's MLM output bias [V], ...). Nothing is allocated to find them.
Vocabulary adaptation (flaxlm.adaptation) rebuilds these rows; LoRA's trainable tokens (flaxlm.models.lora) grow
them."""
import copy

from flaxlm.errors import UserError
from flaxlm.models.build import abstract_model


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
