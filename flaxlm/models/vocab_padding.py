"""--pad_vocab_multiple N: a causal LM's vocabulary-sized tables (token embeddings [V, D], an untied LM head
[D, V], GPT-J's head bias [V]) hold ceil(V / N) * N rows in memory, as nanoGPT pads GPT-2's 50257 to 50304, so that
the head's matmul runs over a width the accelerator's tiles divide (a GPU/TPU speed option: whether it pays is
measured on the device; on a CPU it only costs the extra rows).

The padding never matters: its rows are zeros (drawn: the first V rows exactly as the unpadded model draws them;
loaded: zeros past the checkpoint's rows), the logits a model returns are cut back to V and the fused loss masks the
padded columns (flaxlm.models.layers.LMHead, flaxlm.objectives.lm_loss), so they get no gradient and stay zero
under AdamW. config.vocab_size stays V, and an export (flaxlm.models.convert.to_hf_state_dict) writes V rows.
"""
import jax
import jax.numpy as jnp
import numpy as np


def padded_rows(vocab_size, multiple=1):
    """The rows a table of vocab_size tokens holds in memory: vocab_size rounded up to a multiple of `multiple`."""
    return -(-vocab_size // multiple) * multiple


def drawn_then_zeros(init, drawn, axis):
    """An initializer for a table padded on `axis`: init's draw of `drawn` rows there (the same numbers as the
    unpadded table's, from the same key), then zeros to the full shape."""
    def padded_init(key, shape, dtype=jnp.float32):
        shape = tuple(shape)
        if shape[axis] == drawn:
            return init(key, shape, dtype)
        x = init(key, shape[:axis] + (drawn,) + shape[axis + 1:], dtype)
        return jnp.pad(x, [(0, n - m) for n, m in zip(shape, x.shape)])
    return padded_init


def mask_padded_columns(logits_MV, vocab_size):
    """logits [M, Vp] with the columns past vocab_size at float32's lowest value: exp() of them minus any real
    logit is exactly 0, so a softmax, logsumexp or argmax over the padded width is the unpadded one's."""
    if vocab_size is None or vocab_size >= logits_MV.shape[-1]:
        return logits_MV
    real_MV = jax.lax.broadcasted_iota(jnp.int32, logits_MV.shape, logits_MV.ndim - 1) < vocab_size
    return jnp.where(real_MV, logits_MV, jnp.finfo(logits_MV.dtype).min)


def zero_padded(x, shape):
    """numpy x with zeros after its end on each axis, to `shape` (a checkpoint's tensor into a padded table)."""
    if tuple(x.shape) == tuple(shape):
        return x
    return np.pad(x, [(0, n - m) for n, m in zip(shape, x.shape)])


def cut_to(x, shape):
    """x without what lies past `shape` on each axis (a padded table's true rows, as an export writes them)."""
    if tuple(x.shape) == tuple(shape):
        return x
    return x[tuple(slice(0, n) for n in shape)]


def padding_count(params, shapes):
    """How many of params' numbers are padding: each tensor's excess over its shape in `shapes` (the unpadded
    model's abstract params; tensors it lacks, as LoRA's adapters, count none)."""
    total = 0
    for path, x in jax.tree_util.tree_leaves_with_path(params):
        want = shapes
        for key in path:
            want = want.get(key.key, {}) if isinstance(want, dict) else {}
        if hasattr(want, "shape") and tuple(want.shape) != tuple(x.shape):
            total += int(np.prod(x.shape)) - int(np.prod(want.shape))
    return total
