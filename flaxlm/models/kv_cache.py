"""The key/value cache of a decoder-only model: fixed length, written in place at a moving index, so every
decode step has the same shapes and compiles once.

    cache = init_cache(layers, batch, length, kv_heads, head_dim, dtype)
    cache, visible_BTS = start_step(cache, mask_BT)       # new tokens' padding mask -> what each query sees
    k_BSKH, v_BSKH = write(cache["k"][i], cache["v"][i], k_BTKH, v_BTKH, cache["index"])  # per layer
    cache = finish_step(cache, ks, vs, T)                 # the layers' updated tensors, index advanced by T

A query at slot q sees the real (unpadded) keys at slots <= q, and always itself, so that a padding
query (left padding of a prompt) stays finite instead of attending to nothing.
"""
import jax
import jax.numpy as jnp


def init_cache(num_layers, batch, length, kv_heads, head_dim, dtype):
    zeros_BSKH = jnp.zeros((batch, length, kv_heads, head_dim), dtype)
    return {"k": [zeros_BSKH] * num_layers, "v": [zeros_BSKH] * num_layers,
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


def write(k_cache_BSKH, v_cache_BSKH, k_BTKH, v_BTKH, index):
    """The layer's cache with the new keys and values written at slots index .. index + T - 1."""
    update = jax.lax.dynamic_update_slice_in_dim
    return (update(k_cache_BSKH, k_BTKH.astype(k_cache_BSKH.dtype), index, axis=1),
            update(v_cache_BSKH, v_BTKH.astype(v_cache_BSKH.dtype), index, axis=1))


def finish_step(cache, ks, vs, T):
    return {**cache, "k": list(ks), "v": list(vs), "index": cache["index"] + T}


def run_layers(layers, x_BTD, mask_BT, cache, call):
    """x through the decoder layers, with the cache when one is given: call(i, layer, x_BTD, kv, index,
    visible_BTS) -> (x_BTD, kv) runs layer i (kv, index and visible_BTS are None without a cache).
    Returns (x_BTD, the updated cache or None)."""
    index = visible_BTS = None
    if cache is not None:
        mask_BT = jnp.ones(x_BTD.shape[:2], bool) if mask_BT is None else mask_BT
        cache, visible_BTS = start_step(cache, mask_BT)
        index = cache["index"]
    ks, vs = [], []
    for i, layer in enumerate(layers):
        kv = None if cache is None else (cache["k"][i], cache["v"][i])
        x_BTD, kv = call(i, layer, x_BTD, kv, index, visible_BTS)
        if cache is not None:
            ks.append(kv[0])
            vs.append(kv[1])
    return x_BTD, None if cache is None else finish_step(cache, ks, vs, x_BTD.shape[1])


def default_positions(ids_BT, cache):
    """Positions 0.. of the new tokens (after the cache's index when decoding)."""
    start = 0 if cache is None else cache["index"]
    return jnp.broadcast_to(start + jnp.arange(ids_BT.shape[1], dtype=jnp.int32), ids_BT.shape)
