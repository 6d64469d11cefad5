"""Attention with dropout on the probabilities through cuDNN's fused (flash) attention on NVIDIA GPUs, so that
training with GPT-2's attn_pdrop or RoBERTa's attention_probs_dropout_prob neither materializes the [B, N, T, S]
float32 scores nor leaves the fused kernel (layers.attention takes this route where where_not says '').

The masks are cuDNN's, not layers.dropout's: the same training semantics (each probability kept with
probability 1 - rate and scaled by 1 / (1 - rate)), other random draws. cuDNN's Philox generator is seeded by a
Python int fixed in the compiled kernel (one per call site, counted as the program is traced: layers draw apart,
and every host of a run compiles the same seeds) and an offset that XLA advances each time that kernel runs; so
the run's dropout key does not reach them, a resumed run draws afresh from the first offset, and the devices of a
data-parallel run draw the same masks for their own rows. The
backward kernel keeps its own offset in step with the forward's, which holds when each runs once per step in the
same order: not under --scan_layers, whose backward runs the layers in reverse (where_not keeps that case on XLA).
"""
import itertools

import jax
import jax.numpy as jnp

from flaxlm.models.layer_stack import in_layer_scan
from flaxlm.platform import platform

_SITE_SEEDS = itertools.count(1)  # one seed per traced call: each layer's kernel draws its own masks


def compute_capability():
    """(major, minor) of this machine's NVIDIA GPU when programs are built for one; None elsewhere (CPU, TPU, an
    AMD GPU, whose compute_capability reads "gfx90a")."""
    if platform() != "gpu" or jax.default_backend() != "gpu":
        return None
    try:
        return tuple(int(x) for x in getattr(jax.devices()[0], "compute_capability", "").split("."))
    except ValueError:
        return None


def where_not(dtype, T, S, H, *, causal, window=None, softcap=None, masked=False):
    """Why cuDNN's fused attention cannot drop out this call's probabilities ('' when it can). masked: a mask or
    a bias is added to the scores."""
    capability = compute_capability()
    if capability is None:
        return "not an NVIDIA GPU"
    if capability < (8, 0):
        return f"a GPU of compute capability {capability[0]}.{capability[1]} (cuDNN's flash attention needs 8.0+)"
    if in_layer_scan():
        return ("layers under --scan_layers (cuDNN's dropout offset advances each time the kernel runs, and the "
                "backward pass runs the layers in reverse: its masks would not be the forward's)")
    if jnp.dtype(dtype) not in (jnp.bfloat16, jnp.float16):
        return f"{jnp.dtype(dtype).name} inputs (cuDNN takes bfloat16 or float16)"
    widest = 256 if capability >= (9, 0) else 128
    if H % 8 or H > widest:
        return f"heads of width {H} (cuDNN: a multiple of 8, at most {widest})"
    if softcap is not None:
        return "soft-capped scores"
    if window is not None and not causal:
        return "a window on both sides of the query (cuDNN's is to the left of a causal query)"
    if masked and (T % 2 or S % 2):
        return f"{T} queries and {S} keys with a mask or bias (cuDNN trains those at even lengths)"
    return ""


def attention(q_BTNH, k_BSKH, v_BSKH, mask_B1TS=None, bias=None, *, causal, scale, window, dropout_rate):
    """Softmax attention of layers.attention (K key/value heads dividing the N query heads) with the
    probabilities dropped out at dropout_rate inside cuDNN's kernel. mask_B1TS: bool [B, 1, T or 1, S] (True =
    attend) or None; bias: [B or 1, N or 1, T, S] added to the scaled scores. Out: [B, T, N, H] in q's dtype."""
    B, T, _, _ = q_BTNH.shape
    S = k_BSKH.shape[1]
    if mask_B1TS is not None:  # cuDNN takes the mask as a bias of whole [T, S] rows
        mask_B1TS = jnp.broadcast_to(mask_B1TS, (B, 1, T, S))
    if bias is not None:
        bias = bias.astype(q_BTNH.dtype)  # cuDNN takes the bias in the compute dtype
    return fused_attention(q_BTNH, k_BSKH, v_BSKH, bias, mask_B1TS, scale=scale, causal=causal,
                           window=window if causal else None, dropout_rate=dropout_rate, seed=next(_SITE_SEEDS))


def fused_attention(q_BTNH, k_BSKH, v_BSKH, bias, mask_B1TS, *, scale, causal, window, dropout_rate, seed):
    """cuDNN's fused attention in [B, T, N, H] layout, probabilities dropped out at dropout_rate (its Philox seeded
    by `seed`, a Python int); window: a causal query sees only the last `window` keys (None: all before it)."""
    # A private module: jax.nn.dot_product_attention, the public route to this kernel, takes no dropout rate (jax
    # 0.10.2, the pinned version, where this signature was checked: dropout_rate and seed keywords, seed an int
    # written into the kernel's configuration). A jax that moves it fails here, at trace time, on GPUs only.
    from jax._src.cudnn.fused_attention_stablehlo import MaskType, dot_product_attention
    return dot_product_attention(q_BTNH, k_BSKH, v_BSKH, bias, mask_B1TS, scale=scale,
                                 mask_type=MaskType.CAUSAL if causal else MaskType.NO_MASK, seed=seed,
                                 dropout_rate=dropout_rate, qkv_layout="BTNH", sliding_window_length=window)
