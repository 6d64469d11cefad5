"""Special tokens a chat template needs (ChatML's <|im_start|>, <|im_end|>) added to a model that lacks them
(run_sft.py --chat_template chatml on a model trained here): the tokenizer gets them as special tokens, and each gets
an embedding row (and LM-head row) that is the mean of the rows of the pieces the tokenizer cut it into before, as
adapt_vocabulary.py --extend_vocabulary starts its rows (FVT). The vocabulary grows only past its free rows (a
vocabulary padded beyond the tokenizer, as Qwen's, has room)."""
import copy

import jax
import numpy as np

from flaxlm.models.vocabulary_tensors import vocabulary_axes
from flaxlm.models.convert import get_path, set_path
from flaxlm.models.vocab_padding import padded_rows


def add_special_tokens(tokenizer, config, params, tokens, multiple=1):
    """(tokenizer, config, params) with `tokens` added: copies; params as numpy on the host. multiple: the tables'
    rows padded to a multiple of it in memory (--pad_vocab_multiple: zeros past config.vocab_size, before and after)."""
    pieces = {t: tokenizer(t, add_special_tokens=False, verbose=False)["input_ids"] for t in tokens}
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.add_special_tokens({"additional_special_tokens": list(tokens)}, replace_extra_special_tokens=False)
    ids = tokenizer.convert_tokens_to_ids(list(tokens))
    axes = vocabulary_axes(config)
    config = copy.deepcopy(config)
    grown = max(config.vocab_size, len(tokenizer))
    out = {}
    for path, axis in axes.items():
        old_VX = np.moveaxis(np.asarray(get_path(params, path)), axis, 0)[:config.vocab_size]
        rows = padded_rows(grown, multiple)
        new_VX = np.concatenate([old_VX, np.zeros((rows - len(old_VX), *old_VX.shape[1:]), old_VX.dtype)])
        for token, new_id in zip(tokens, ids):
            new_VX[new_id] = old_VX[np.asarray(pieces[token])].mean(axis=0)
        out[path] = np.moveaxis(new_VX, 0, axis)
    params = jax.tree.map(lambda x: x, params)  # new containers, the same arrays
    for path, x in out.items():
        set_path(params, path, x)
    config.vocab_size = grown
    return tokenizer, config, params
