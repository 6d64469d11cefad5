"""What a model family is to the package (Family: one config.model_type, registered in flaxlm.models.registry), how
one model's tensors are named in Hugging Face checkpoints (NameMap), and the helpers every family's name map uses.

A name map lists (hf_name, our_path, kind) triples: kind "linear" for a torch Linear weight [out, in] that is our
kernel [in, out] transposed, "copy" otherwise. Its normalize function brings a checkpoint saved in another
convention (a bare model without its prefix, old tensor names, saved buffers, tied copies) to those names.
"""
from dataclasses import dataclass, field
from functools import partial
from typing import Callable, NamedTuple

import numpy as np

from flaxlm.errors import UserError


REPLACED_TOKEN_DETECTION = "replaced_token_detection"  # the task of a replaced-token-detection discriminator


class NameMap(NamedTuple):
    """How one model (a family's pretraining model, or a fine-tuning head on its encoder) is saved."""
    names: list  # [(hf_name, our_path, kind)]
    normalize: Callable  # normalize(tensors, notes) -> tensors in the names' convention
    architecture: str  # config.json "architectures"
    fresh_groups: tuple  # top-level parameter groups a checkpoint may lack entirely (started fresh)


@dataclass(frozen=True)
class Head:
    """A task's model on a family's encoder: a fine-tuning head, or another pretraining model (ELECTRA's
    discriminator, task "replaced_token_detection")."""
    model: type  # module class taking (config, *, dtype, rngs, execution)
    architecture: str  # its Hugging Face class ("BertForSequenceClassification")
    groups: tuple  # our top-level parameter groups of the head: a pretrained encoder lacks them (started fresh)


def config_ties(config):
    """config.json's tie_word_embeddings (default true): the rule of the families whose config says it."""
    return bool(getattr(config, "tie_word_embeddings", True))


@dataclass(frozen=True)
class Family:
    """One model family, defined in its own file: its pretraining model, how it is saved, its presets, the script
    that trains it and the longest input it takes. flaxlm.models.registry finds it by config.model_type."""
    model_type: str  # config.model_type
    name: str  # how messages name it ("RoBERTa")
    model: type  # the pretraining model: module class taking (config, *, dtype, rngs, execution)
    tensor_names: Callable  # tensor_names(config) -> the pretraining model's [(hf_name, our_path, kind)]
    normalize: Callable  # normalize(config, tensors, notes) -> tensors in tensor_names' convention
    architecture: str  # config.json "architectures" of the pretraining model
    presets: dict  # create_config.py's shape presets of the family's file: {name: config fields with model_type}
    script: str  # the script that pretrains it
    max_length: Callable | None = None  # max_length(config): the longest input its positions allow; None: no limit
    tie_word_embeddings: Callable = config_ties  # tie_word_embeddings(config): the value config.json gets on export
    fresh_head: str | None = None  # top-level parameter group a bare checkpoint may lack (started fresh)
    heads: dict = field(default_factory=dict)  # task -> Head (fine-tuning heads, ELECTRA's discriminator)
    head_tensor_names: Callable | None = None  # head_tensor_names(config, task): a Head's model's triples
    no_splash: str | None = None  # why the Pallas splash kernel cannot compute its attention (XLA's then)
    normalize_for_head: Callable | None = None  # normalize_for_head(config, tensors, notes, task)
    # matrices(config): {parameter path suffix: view(shape) -> (the shape its parts are seen in, MuonDimensionNumbers
    # of that view)} for fused tensors (GPT-2's qkv): --optim muon orthogonalizes each part alone (flaxlm.training.muon)
    matrices: Callable | None = None
    # export(config, tensors) -> the pretraining model's tensors (in tensor_names' layout) as its checkpoints hold
    # them, where that differs (Qwen3-MoE: the experts one tensor per expert); None: as tensor_names names them
    export: Callable | None = None

    def name_map(self, config, task=None):
        """The NameMap of `config`'s pretraining model (task None) or of a fine-tuning task's model."""
        if task is None:
            return NameMap(self.tensor_names(config), partial(self.normalize, config), self.architecture,
                           (self.fresh_head,) if self.fresh_head else ())
        head = self.heads[task]
        return NameMap(self.head_tensor_names(config, task),
                       lambda tensors, notes: self.normalize_for_head(config, tensors, notes, task),
                       head.architecture, head.groups)


def add_norm(names, hf, ours, bias=True):
    """A norm's tensors added to `names`: hf.weight -> ours/scale (and hf.bias -> ours/bias)."""
    names.append((f"{hf}.weight", (*ours, "scale"), "copy"))
    if bias:
        names.append((f"{hf}.bias", (*ours, "bias"), "copy"))


def add_linear(names, hf, ours, bias=True, kind="linear"):
    """A torch Linear's tensors added to `names`: hf.weight [out, in] -> ours/kernel [in, out] (kind "copy": a
    Conv1D's weight, [in, out] already), and hf.bias -> ours/bias."""
    names.append((f"{hf}.weight", (*ours, "kernel"), kind))
    if bias:
        names.append((f"{hf}.bias", (*ours, "bias"), "copy"))


def with_prefix(tensors, prefix, roots, buffers=()):
    """A bare model's tensors in its full model's names: `prefix` added to the names whose first part is one of
    roots; the non-weight buffers older transformers saved (names ending in one of buffers) dropped."""
    out = {}
    for name, x in tensors.items():
        if buffers and name.endswith(buffers):
            continue
        out[prefix + name if name.split(".")[0] in roots else name] = x
    return out


def drop_prefixed(tensors, prefixes):
    """(tensors without the names starting with one of prefixes, the names dropped)."""
    dropped = sorted(n for n in tensors if n.startswith(prefixes))
    return {n: x for n, x in tensors.items() if not n.startswith(prefixes)}, dropped


def same_tensor(a, b):
    return a.shape == b.shape and np.allclose(np.asarray(a, np.float32), np.asarray(b, np.float32))


def drop_tied_head(config, tensors, head, embeddings):
    """A tied config's head tensor, if saved, must equal the embeddings it is tied to; it is dropped."""
    if getattr(config, "tie_word_embeddings", True) and head in tensors:
        x = tensors.pop(head)
        if embeddings in tensors and not same_tensor(x, tensors[embeddings]):
            raise UserError(f"tensor {head} differs from {embeddings} but config.json ties them; set "
                            f"tie_word_embeddings to false in config.json for an untied LM head")
    return tensors


def parts_of_output(parts):
    """A kernel [in, parts * n] whose output is its parts one after another ([q | k | v]): seen as [in, parts, n],
    each part a matrix (for Family.matrices)."""
    from optax.contrib import MuonDimensionNumbers

    def view(shape):
        return (shape[0], parts, shape[1] // parts), MuonDimensionNumbers(reduction_axis=0, output_axis=2)
    return view
