"""The key/value cache of a decoder-only model: fixed length, written in place at a moving index, so every
decode step has the same shapes and compiles once.

    cache = init_cache(layers, batch, length, kv_heads, head_dim, dtype)
    cache, visible_BTS = start_step(cache, mask_BT)       # new tokens' padding mask -> what each query sees
    o_BTNH, kv = attend(q_BTNH, (cache["k"][i], cache["v"][i]), k_BTKH, v_BTKH, cache["index"], visible_BTS)
    cache = finish_step(cache, ks, vs, T)                 # the layers' updated tensors, index advanced by T

A query at slot q sees the real (unpadded) keys at slots <= q, and always itself, so that a padding
query (left padding of a prompt) stays finite instead of attending to nothing.
"""
import jax
import jax.numpy as jnp

from flaxlm.models.layer_stack import run_layers as run_stack


def init_cache(num_layers, batch, length, kv_heads, head_dim, dtype):
    """Per layer, keys [B * K, H, S] and values [B * K, S, H] (see attend), the slots' mask and the index."""
    k_MHS = (batch * kv_heads, head_dim, length)
    v_MSH = (batch * kv_heads, length, head_dim)
    return {"k": [jnp.zeros(k_MHS, dtype) for _ in range(num_layers)],
            "v": [jnp.zeros(v_MSH, dtype) for _ in range(num_layers)],
            "mask": jnp.zeros((batch, length), bool), "index": jnp.zeros((), jnp.int32)}


def start_step(cache, mask_BT):
    """Record the new tokens' mask at the cache index; returns (cache, visible_BTS)."""
    T, S, index = mask_BT.shape[1], cache["mask"].shape[1], cache["index"]
    mask_BS = jax.lax.dynamic_update_slice_in_dim(cache["mask"], mask_BT.astype(bool), index, axis=1)
    query_T = index + jnp.arange(T)
    slot_S = jnp.arange(S)
    visible_BTS = (mask_BS[:, None, :] & (slot_S[None, None, :] <= query_T[None, :, None])) | \
        (slot_S[None, None, :] == query_T[None, :, None])
    return {**cache, "mask": mask_BS}, visible_BTS


def attend(q_BTNH, kv, k_BTKH, v_BTKH, index, visible_BTS, scale=None, *, window=None, softcap=None,
           alibi_slopes=None):
    """One layer's cached attention: the new keys and values written into its cache at slots index ..
    index + T - 1, then softmax(q k^T * scale) v over the visible slots (scale defaults to H**-0.5).
    Returns (o_BTNH, the updated kv). As layers.attention: window (a query sees the `window` slots up to its
    own), softcap (scores through softcap * tanh(score / softcap)); alibi_slopes [N] (BLOOM): slope * (key slot
    - query slot) added to the scores, which is ALiBi's slope * key position up to a constant per query (the
    real tokens of a left-padded row sit in consecutive slots).

    Keys are cached as [M, H, S] and values as [M, S, H], M = B * K (K key/value heads, each serving
    G = N / K query heads): 3-D arrays in the layouts the two attention matmuls read as they are, so that
    XLA updates them in place. A [B, S, K, H] cache was transposed whole at every decode step and a 4-D
    one copied (the matmul's reshape to 3-D defeats the in-place update), which made a token at
    position 500 cost twice one at position 50."""
    k_cache_MHS, v_cache_MSH = kv
    (B, T, N, H), K = q_BTNH.shape, k_BTKH.shape[2]
    G, M, dtype = N // K, B * K, k_cache_MHS.dtype
    update = jax.lax.dynamic_update_slice_in_dim
    k_MHT = k_BTKH.transpose(0, 2, 3, 1).reshape(M, H, T).astype(dtype)
    v_MTH = v_BTKH.transpose(0, 2, 1, 3).reshape(M, T, H).astype(dtype)
    k_cache_MHS = update(k_cache_MHS, k_MHT, index, axis=2)
    v_cache_MSH = update(v_cache_MSH, v_MTH, index, axis=1)
    scale = H ** -0.5 if scale is None else scale
    q_MQH = q_BTNH.reshape(B, T, K, G, H).transpose(0, 2, 3, 1, 4).reshape(M, G * T, H).astype(dtype)  # Q = G * T
    logits_MQS = jnp.einsum("mqh,mhs->mqs", q_MQH, k_cache_MHS, preferred_element_type=jnp.float32) * scale
    S = logits_MQS.shape[-1]
    logits_BKGTS = logits_MQS.reshape(B, K, G, T, S)
    distance_TS = index + jnp.arange(T)[:, None] - jnp.arange(S)[None, :]  # query slot - key slot
    if alibi_slopes is not None:
        slopes_KG = jnp.asarray(alibi_slopes, jnp.float32).reshape(K, G)
        logits_BKGTS = logits_BKGTS - slopes_KG[:, :, None, None] * distance_TS.astype(jnp.float32)
    if softcap is not None:
        logits_BKGTS = jnp.tanh(logits_BKGTS / softcap) * softcap
    if window is not None:
        visible_BTS = visible_BTS & (distance_TS < window)
    logits_BKGTS = jnp.where(visible_BTS[:, None, None], logits_BKGTS, jnp.finfo(jnp.float32).min)
    probs_MQS = jax.nn.softmax(logits_BKGTS, axis=-1).astype(dtype).reshape(M, G * T, S)
    o_MQH = jnp.einsum("mqs,msh->mqh", probs_MQS, v_cache_MSH)
    o_BTNH = o_MQH.reshape(B, K, G, T, H).transpose(0, 3, 1, 2, 4).reshape(B, T, N, H).astype(q_BTNH.dtype)
    return o_BTNH, (k_cache_MHS, v_cache_MSH)


def finish_step(cache, ks, vs, T):
    return {**cache, "k": list(ks), "v": list(vs), "index": cache["index"] + T}


def run_layers(layers, x_BTD, mask_BT, cache, call, execution=None):
    """x through the decoder layers, with the cache when one is given: call(i, layer, x_BTD, kv, index,
    visible_BTS) -> (x_BTD, kv) runs layer i (kv, index and visible_BTS are None without a cache).
    Returns (x_BTD, the updated cache or None). Without a cache the layers run as `execution` says
    (flaxlm.models.layer_stack: scanned and/or rematerialized; i may then be traced); with one, in a loop."""
    if cache is None:
        return run_stack(layers, x_BTD, lambda i, layer, x, _: call(i, layer, x, None, None, None)[0],
                         execution), None
    mask_BT = jnp.ones(x_BTD.shape[:2], bool) if mask_BT is None else mask_BT
    cache, visible_BTS = start_step(cache, mask_BT)
    ks, vs = [], []
    for i, layer in enumerate(layers):
        x_BTD, (k, v) = call(i, layer, x_BTD, (cache["k"][i], cache["v"][i]), cache["index"], visible_BTS)
        ks.append(k)
        vs.append(v)
    return x_BTD, finish_step(cache, ks, vs, x_BTD.shape[1])


def default_positions(ids_BT, cache):
    """Positions 0.. of the new tokens (after the cache's index when decoding)."""
    start = 0 if cache is None else cache["index"]
    return jnp.broadcast_to(start + jnp.arange(ids_BT.shape[1], dtype=jnp.int32), ids_BT.shape)
