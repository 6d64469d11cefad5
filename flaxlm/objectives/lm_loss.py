"""The LM head fused with its softmax cross-entropy: loss and accuracy sums straight from hidden rows.

    loss_sum, accuracy_sum, z_loss_sum = head_xent(h_BTD, weight, labels_BT, weights_BT, tied=True, z_loss=1e-4)

equals

    logits_BTV = h_BTD @ weight.T (tied: weight is the embeddings [V, D]) or h_BTD @ weight (untied: a kernel [D, V])
    xent_BT = optax.softmax_cross_entropy_with_integer_labels(logits_BTV, labels_BT)
    z_BT = z_loss * logsumexp(logits_BTV) ** 2  (PaLM's z-loss: keeps the softmax's normalizer near 1)
    loss_sum = sum((xent_BT + z_BT) * weights_BT)
    accuracy_sum, z_loss_sum = sum((label's logit >= max logit) * weights_BT), sum(z_BT * weights_BT)

without ever holding all the logits. Why: on CPU, with a large vocabulary the logits, their softmax and
cross-entropy and the backward pass are several passes over an array much larger than the cache. Here
the rows go through in chunks of about `chunk_rows` (a lax.scan: one chunk at a time, so that its
logits stay in cache); the forward pass takes each chunk's max, logsumexp and label logit and at once
turns them into the chunk's gradient of the loss sum, dlogits = (softmax - onehot(label)) * weight,
multiplied out into dh and added into the head weight's gradient. The loss sum is linear in those, so
the backward pass only scales the saved dh_BTD and dweight by the loss sum's cotangent. Undifferentiated
(evaluation), no gradient is computed.
"""
import functools
import math

import jax
import jax.numpy as jnp

from flaxlm.models.matmul import rows_contracted
from flaxlm.models.vocab_padding import mask_padded_columns
from flaxlm.platform import platform as target_platform

CPU_CHUNK_ROWS = 256  # [256, V] float32 logits: 8 MiB at V = 8192; see the timings in head_xent
ACCELERATOR_CHUNK_LOGITS = 1 << 26  # 256 MiB of float32 logits per chunk and device: big matmuls, bounded memory


def default_chunk_rows(vocab_size, platform=None):
    """Rows per chunk and device: CPU_CHUNK_ROWS on CPU (the chunk's logits stay in cache); elsewhere as many
    as keep a chunk's logits near ACCELERATOR_CHUNK_LOGITS (at least 1024 rows, for big matmuls), so that
    long sequences times a large vocabulary (GPT-2: 32 x 1024 rows x 50257 = 6.6 GB of float32 logits) never
    materialize at once."""
    if (platform or target_platform()) == "cpu":
        return CPU_CHUNK_ROWS
    return max(1024, ACCELERATOR_CHUNK_LOGITS // vocab_size)


def head_loss_sums(h_BTD, head, labels_BT, weights_BT, chunk_rows=None, z_loss=0.0):
    """An objective's sums for the rows h_BTD that a model returns with hidden=True, its head()
    (models.layers.LMHead) and each row's label and weight; with z_loss (--z_loss), its term is in loss_sum
    and, for the log, in z_loss_sum."""
    loss, accuracy, z_sum = head_xent(h_BTD, head.weight, labels_BT, weights_BT, tied=head.tied, dtype=head.dtype,
                                      bias_V=head.bias, chunk_rows=chunk_rows, softcap=head.softcap,
                                      vocab_size=head.vocab_size, z_loss=z_loss)
    sums = {"loss_sum": loss, "accuracy_sum": accuracy, "weight_sum": weights_BT.sum()}
    return {**sums, "z_loss_sum": z_sum} if z_loss else sums


def head_xent(h_BTD, weight, labels_BT, weights_BT, *, tied, dtype=jnp.float32, bias_V=None, chunk_rows=None,
              shards=None, softcap=None, vocab_size=None, z_loss=0.0):
    """(loss_sum, accuracy_sum, z_loss_sum) of the LM head over the hidden rows h_BTD; float32 scalars.

    weight: the token embeddings [V, D] (tied) or the head's kernel [D, V]; the matmuls run in `dtype`
    with float32 results; bias_V (optional) is added to the logits, then softcap (optional; Gemma 2's final
    logit soft-capping) maps them to softcap * tanh(logits / softcap). vocab_size (optional): the true
    vocabulary of a weight padded past it (--pad_vocab_multiple): the matmuls run over the padded width and the
    columns past it are masked to float32's lowest value, so that they weigh exactly 0 in the softmax (and get
    no gradient): the loss is the unpadded head's. weights_BT weighs each row's loss and
    correctness (0 leaves a row out); labels_BT are token ids. A row is correct when its label's logit is
    the largest (an exact tie counts). z_loss (PaLM's coefficient, 1e-4 there; 0: none) adds z_loss times
    each row's logsumexp(logits) squared to its loss. Gradients flow to h_BTD, weight, bias_V and weights_BT;
    accuracy_sum has none in h_BTD, weight and bias_V (it is piecewise constant there), and z_loss_sum, the
    z-loss part of loss_sum kept for the log, none at all (differentiate loss_sum).

    The chunks are slices of the T axis, all B rows each, so that a batch split over devices along B stays
    split: each device runs about chunk_rows of its own rows at a time (the batch taken as split over
    `shards` devices, default all of them). chunk_rows None: default_chunk_rows(V); 0: one chunk.
    On a 2-core CPU with V = 8192, D = 256 and 1016 rows, the value and gradient took ~25% less time than
    the unfused path with 192-384 rows per chunk, less gain at 128 and 512, none at 64 (thin matmuls);
    with only 160-232 rows in all, about the same time.
    """
    B, T, _ = h_BTD.shape
    if chunk_rows is None:
        chunk_rows = default_chunk_rows(weight.shape[0 if tied else 1])
    shards = jax.device_count() if shards is None else shards
    n, Tc = (1, T) if not chunk_rows else chunking(B, T, chunk_rows, shards)
    return _head_xent(h_BTD, weight, bias_V, labels_BT.astype(jnp.int32), weights_BT.astype(jnp.float32),
                      bool(tied), jnp.dtype(dtype).name, n, Tc, None if softcap is None else float(softcap),
                      None if vocab_size is None else int(vocab_size), float(z_loss or 0.0))


def chunking(B, T, chunk_rows, shards=1):
    """(chunks, positions per chunk): as few slices of the T positions as keep each shard's rows of a chunk
    (B / shards rows times the positions) at most chunk_rows (one position at least), evened out so that
    the padding at the end is less than one position per chunk."""
    per_shard = math.ceil(B / shards)
    n = math.ceil(T / max(1, chunk_rows // per_shard))
    return n, math.ceil(T / n)


def _chunk(h_CD, w, bias_V, labels_C, weights_C, tied, with_grads, softcap=None, vocab_size=None, z_loss=0.0):
    """One chunk: (loss_sum, accuracy_sum, z_loss_sum, loss_C, correct_C) and, with_grads, (dh_CD, dweight_DV,
    dbias_V) of its loss sum. dweight_DV is [D, V] also when tied (the transposed product is the faster one on
    CPU). vocab_size: the columns past it (a padded vocabulary's) masked out. loss_C: each row's cross-entropy
    plus its z-loss."""
    logits_CV = jnp.einsum("cd,vd->cv" if tied else "cd,dv->cv", h_CD, w, preferred_element_type=jnp.float32)
    if bias_V is not None:
        logits_CV = logits_CV + bias_V
    if softcap is not None:
        capped_CV = jnp.tanh(logits_CV / softcap)
        logits_CV = capped_CV * softcap
    logits_CV = mask_padded_columns(logits_CV, vocab_size)  # after the cap, which would bound the mask
    max_C = logits_CV.max(-1)
    exp_CV = jnp.exp(logits_CV - max_C[:, None])
    sumexp_C = exp_CV.sum(-1)
    label_C = jnp.take_along_axis(logits_CV, labels_C[:, None], axis=-1)[:, 0]
    lse_C = max_C + jnp.log(sumexp_C)
    z_C = z_loss * jnp.square(lse_C) if z_loss else jnp.zeros_like(lse_C)  # z_loss is static: 0 adds no work
    loss_C = lse_C - label_C + z_C
    correct_C = (label_C >= max_C).astype(jnp.float32)
    sums = ((loss_C * weights_C).sum(), (correct_C * weights_C).sum(), (z_C * weights_C).sum(), loss_C, correct_C)
    if not with_grads:
        return sums, None
    # d(sum_c weight_c * (xent_c + z_loss * lse_c^2)) / dlogits = weight * ((1 + 2 z_loss lse) softmax - onehot(label))
    is_label_CV = jax.lax.broadcasted_iota(jnp.int32, logits_CV.shape, 1) == labels_C[:, None]
    softmax_weight_C = weights_C * ((1.0 + 2.0 * z_loss * lse_C) if z_loss else 1.0) / sumexp_C
    dlogits_CV = exp_CV * softmax_weight_C[:, None] - jnp.where(is_label_CV, weights_C[:, None], 0.0)
    if softcap is not None:  # through softcap * tanh(z / softcap): times 1 - tanh^2
        dlogits_CV = dlogits_CV * (1.0 - jnp.square(capped_CV))
    dbias_V = None if bias_V is None else dlogits_CV.sum(0)
    dlogits_CV = dlogits_CV.astype(w.dtype)
    dh_CD = jnp.einsum("cv,vd->cd" if tied else "cv,dv->cd", dlogits_CV, w, preferred_element_type=jnp.float32)
    dweight_DV = rows_contracted(h_CD, dlogits_CV)
    return sums, (dh_CD, dweight_DV, dbias_V)


def _to_chunks(x_BT, n, Tc):
    """[B, T, ...] -> [n, B, Tc, ...]: T padded (zeros) to n * Tc and cut into n slices, the slice axis first."""
    B, T = x_BT.shape[:2]
    x_BT = jnp.pad(x_BT, [(0, 0), (0, n * Tc - T)] + [(0, 0)] * (x_BT.ndim - 2))
    return jnp.moveaxis(x_BT.reshape(B, n, Tc, *x_BT.shape[2:]), 1, 0)


def _from_chunks(x_NBC, T):
    """[n, B, Tc, ...] -> [B, T, ...], the inverse of _to_chunks."""
    n, B, Tc = x_NBC.shape[:3]
    return jnp.moveaxis(x_NBC, 0, 1).reshape(B, n * Tc, *x_NBC.shape[3:])[:, :T]


def _run(h_BTD, weight, bias_V, labels_BT, weights_BT, tied, dtype, n, Tc, with_grads, softcap, vocab_size, z_loss):
    """Scan the chunks: (loss_sum, accuracy_sum, z_loss_sum, loss_BT, correct_BT), and with_grads (dh_BTD,
    dweight, dbias_V) in h_BTD's, weight's and bias_V's shapes (float32)."""
    (B, T, D), V = h_BTD.shape, weight.shape[0 if tied else 1]
    w = weight.astype(dtype)
    bias_V = None if bias_V is None else bias_V.astype(jnp.float32)
    xs = (_to_chunks(h_BTD.astype(dtype), n, Tc), _to_chunks(labels_BT, n, Tc),
          _to_chunks(weights_BT, n, Tc))  # padding positions weigh nothing

    def body(carry, chunk):
        h_BCD, labels_BC, weights_BC = chunk
        sums, grads = _chunk(h_BCD.reshape(B * Tc, D), w, bias_V, labels_BC.reshape(-1), weights_BC.reshape(-1),
                             tied, with_grads, softcap, vocab_size, z_loss)
        loss, accuracy, z_sum, loss_C, correct_C = sums
        sums = (loss, accuracy, z_sum, loss_C.reshape(B, Tc), correct_C.reshape(B, Tc))
        if not with_grads:
            return carry, sums
        dh_CD, *dparams = grads
        return jax.tree.map(jnp.add, carry, tuple(dparams)), (*sums, dh_CD.reshape(B, Tc, D))

    carry = None
    if with_grads:
        carry = (jnp.zeros((D, V), jnp.float32), None if bias_V is None else jnp.zeros((V,), jnp.float32))
    carry, out = jax.lax.scan(body, carry, xs)
    sums = (out[0].sum(), out[1].sum(), out[2].sum(), _from_chunks(out[3], T), _from_chunks(out[4], T))
    if not with_grads:
        return sums, None
    dweight_DV, dbias_V = carry
    return sums, (_from_chunks(out[5], T), dweight_DV.T if tied else dweight_DV, dbias_V)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8, 9, 10, 11))
def _head_xent(h_BTD, weight, bias_V, labels_BT, weights_BT, tied, dtype, n, Tc, softcap, vocab_size, z_loss):
    (loss, accuracy, z_sum, _, _), _ = _run(h_BTD, weight, bias_V, labels_BT, weights_BT, tied, dtype, n, Tc, False,
                                            softcap, vocab_size, z_loss)
    return loss, accuracy, z_sum


def _head_xent_fwd(h_BTD, weight, bias_V, labels_BT, weights_BT, tied, dtype, n, Tc, softcap, vocab_size, z_loss):
    (loss, accuracy, z_sum, loss_BT, correct_BT), (dh_BTD, dweight, dbias_V) = _run(
        h_BTD, weight, bias_V, labels_BT, weights_BT, tied, dtype, n, Tc, True, softcap, vocab_size, z_loss)
    grads = (dh_BTD.astype(h_BTD.dtype), dweight.astype(weight.dtype),
             None if bias_V is None else dbias_V.astype(bias_V.dtype))
    return (loss, accuracy, z_sum), (grads, loss_BT, correct_BT)


def _head_xent_bwd(tied, dtype, n, Tc, softcap, vocab_size, z_loss, res, cotangents):
    (dh_BTD, dweight, dbias_V), loss_BT, correct_BT = res
    g_loss, g_accuracy, _ = cotangents  # z_loss_sum is for the log: its gradient is loss_sum's

    def scale(x):
        return None if x is None else (g_loss * x).astype(x.dtype)
    # labels (integers) get no cotangent; weights_BT gets each row's loss and correctness
    return scale(dh_BTD), scale(dweight), scale(dbias_V), None, g_loss * loss_BT + g_accuracy * correct_BT


_head_xent.defvjp(_head_xent_fwd, _head_xent_bwd)
