"""Attention through Pallas' splash kernel, the TPU's flash attention (jax.experimental.pallas.ops.tpu.
splash_attention): the scores are never materialized, and blocks that the mask hides entirely are never computed.

    out_BTNH = splash_attention(q_BTNH, k_BSKH, v_BSKH, causal=True, window=4096, segments_BT=None, scale=H**-0.5)

It takes the masks the families use: causal (a query sees its position and the ones before), a causal sliding
window (Mistral, Qwen, Gemma 2/3, GPT-Neo's local layers), bidirectional (FullMask) and a bidirectional window
(ModernBERT's local layers), each with segment ids (a query
sees only keys of its own segment: the documents of a packed row, or an encoder row's real tokens apart from its
padding); grouped-query attention (one MQA kernel per key/value head); Gemma 2's soft-capped scores. Not an additive
bias (T5's buckets, DeBERTa, BLOOM's ALiBi), dropped-out probabilities, a per-query mask (the KV cache), or rows
that are not a whole number of blocks (128 queries and keys): where_not says why, and attention() then computes with
XLA.

Under jit over a mesh the kernel runs per device (shard_map over the batch axes of the context mesh, which
flaxlm.training.mesh.on_mesh sets): a Pallas kernel is not partitioned by XLA. On a CPU it runs in Pallas'
interpret mode, how its numbers are checked against XLA attention (tests/test_splash.py).
"""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from flaxlm.models.context_parallel import batch_axes
from flaxlm.platform import platform

BLOCK = 128  # rows and keys of one tile


def where_not(T, S, *, bias=None, dropout=False, mask_ndim=2):
    """Why splash attention cannot compute this call ('' when it can)."""
    if bias is not None:
        return "an additive bias on the scores (relative positions, ALiBi)"
    if dropout:
        return "dropout on the attention probabilities"
    if mask_ndim == 3:
        return "a per-query mask (decoding with a KV cache)"
    if T % BLOCK or S % BLOCK:
        return f"rows of {T} queries and {S} keys, not whole blocks of {BLOCK}"
    return ""


def _kernel(T, S, heads, causal, window, softcap, interpret, offset=0):
    """The splash MQA kernel for `heads` query heads over one key/value head (built where it is traced: its mask
    tables become constants of that program); offset: the position of the first query (context parallelism)."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as kernel_lib
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as mask_lib
    if window is not None:  # keys less than `window` away: before a query (causal), or on both sides
        mask = mask_lib.LocalMask((T, S), (window - 1, 0 if causal else window - 1), offset=offset)
    elif causal:
        mask = mask_lib.CausalMask((T, S), offset=offset)
    else:
        mask = mask_lib.FullMask((T, S))
    return kernel_lib.make_splash_mqa(mask_lib.MultiHeadMask([mask] * heads), head_shards=1, q_seq_shards=1,
                                      attn_logits_soft_cap=softcap, interpret=interpret)


def splash_attention(q_BTNH, k_BSKH, v_BSKH, *, causal, scale, window=None, segments_BT=None, softcap=None):
    """Softmax attention of q over k, v as attention() computes it (scores scaled by `scale`, then soft-capped),
    through the splash kernel. segments_BT: int32 [B, T] (T == S), a query sees only keys of its own segment."""
    from jax.experimental.pallas.ops.tpu.splash_attention.splash_attention_kernel import SegmentIds
    (B, T, N, H), (S, K) = q_BTNH.shape, k_BSKH.shape[1:3]
    kernel = _kernel(T, S, N // K, causal, window, softcap, platform() != "tpu")
    q_BKGTH = (q_BTNH * jnp.asarray(scale, q_BTNH.dtype)).reshape(B, T, K, N // K, H).transpose(0, 2, 3, 1, 4)
    k_BKSH, v_BKSH = k_BSKH.transpose(0, 2, 1, 3), v_BSKH.transpose(0, 2, 1, 3)

    def one_row(q_KGTH, k_KSH, v_KSH, segments_T):
        segment_ids = None if segments_T is None else SegmentIds(q=segments_T, kv=segments_T)
        return jax.vmap(lambda q, k, v: kernel(q, k, v, segment_ids))(q_KGTH, k_KSH, v_KSH)

    def rows(q, k, v, segments):
        return jax.vmap(one_row, in_axes=(0, 0, 0, None if segments is None else 0))(q, k, v, segments)

    mesh = jax.sharding.get_abstract_mesh()
    if not mesh.empty and "data" in mesh.axis_names and mesh.size > 1:
        batch = P(batch_axes(mesh))  # rows split over 'data' (and --sharding expert's 'expert')
        specs = (batch, batch, batch, None if segments_BT is None else batch)
        rows = jax.shard_map(rows, mesh=mesh, in_specs=specs, out_specs=batch, check_vma=False)
    out_BKGTH = rows(q_BKGTH, k_BKSH, v_BKSH, segments_BT)
    return out_BKGTH.transpose(0, 3, 1, 2, 4).reshape(B, T, N, H).astype(v_BSKH.dtype)


def context_parallel_attention(q_BTNH, k_BSKH, v_BSKH, order_T, *, causal, scale, window=None, segments_BS=None,
                               softcap=None):
    """splash_attention of the queries of a sequence split over the context mesh's 'context' axis
    (flaxlm.models.context_parallel): q in the load-balanced order (device c: chunks c and 2C - 1 - c of 2C), k and v
    whole, in the sequence's order; segments_BS: the sequence's segment ids (None: one segment). Each device runs
    the kernel on each of its two chunks, masked as queries at that chunk's offset (a kernel per chunk: the mask
    tables are static), so causal devices skip the same number of hidden blocks."""
    from jax.experimental.pallas.ops.tpu.splash_attention.splash_attention_kernel import SegmentIds
    (B, T, N, H), (S, K) = q_BTNH.shape, k_BSKH.shape[1:3]
    mesh = jax.sharding.get_abstract_mesh()
    C = mesh.shape["context"]
    chunk = T // (2 * C)
    interpret = platform() != "tpu"
    kernels = [_kernel(chunk, S, N // K, causal, window, softcap, interpret, offset=a * chunk) for a in range(2 * C)]
    q_BKGTH = (q_BTNH * jnp.asarray(scale, q_BTNH.dtype)).reshape(B, T, K, N // K, H).transpose(0, 2, 3, 1, 4)
    k_BKSH, v_BKSH = k_BSKH.transpose(0, 2, 1, 3), v_BSKH.transpose(0, 2, 1, 3)
    segments_BT = None if segments_BS is None else segments_BS[:, order_T]

    def chunk_rows(kernel, q_bKGtH, k_bKSH, v_bKSH, segments_bt, segments_bS):
        def one_row(q_KGtH, k_KSH, v_KSH, segments_t, segments_S):
            ids = None if segments_t is None else SegmentIds(q=segments_t, kv=segments_S)
            return jax.vmap(lambda q, k, v: kernel(q, k, v, ids))(q_KGtH, k_KSH, v_KSH)
        axes = (0, 0, 0) + ((None, None) if segments_bt is None else (0, 0))
        return jax.vmap(one_row, in_axes=axes)(q_bKGtH, k_bKSH, v_bKSH, segments_bt, segments_bS)

    def per_device(q_bKGtH, k_bKSH, v_bKSH, segments_bt, segments_bS):
        def on_device(c):  # device c's two chunks: c and 2C - 1 - c
            def run():
                halves = []
                for half, a in enumerate((c, 2 * C - 1 - c)):
                    rows = slice(half * chunk, (half + 1) * chunk)
                    halves.append(chunk_rows(kernels[a], q_bKGtH[:, :, :, rows], k_bKSH, v_bKSH,
                                             None if segments_bt is None else segments_bt[:, rows], segments_bS))
                return jnp.concatenate(halves, axis=3)
            return run
        return jax.lax.switch(jax.lax.axis_index("context"), [on_device(c) for c in range(C)])

    batch = batch_axes(mesh)
    seq, whole = P(batch, "context"), P(batch)
    q_spec = P(batch, None, None, "context", None)
    segment_specs = (None, None) if segments_BT is None else (seq, whole)
    run = jax.shard_map(per_device, mesh=mesh, in_specs=(q_spec, whole, whole, *segment_specs), out_specs=q_spec,
                        check_vma=False)
    out_BKGTH = run(q_BKGTH, k_BKSH, v_BKSH, segments_BT, segments_BS)
    return out_BKGTH.transpose(0, 3, 1, 2, 4).reshape(B, T, N, H).astype(v_BSKH.dtype)
