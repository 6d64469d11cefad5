"""Building blocks shared by the models: dtypes, activations, dropout with an explicit key, attention.

Shape suffixes: B batch, L/T query length, S key length, D model width, N heads, H head width, F MLP width.
"""
import contextlib
import contextvars
import functools
import math
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from flaxlm.errors import UserError
from flaxlm.models import context_parallel, cudnn_dropout, matmul, splash
from flaxlm.models.vocab_padding import drawn_then_zeros
from flaxlm.platform import splash_compiles

COMPUTE_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}

ACTIVATIONS = {
    "gelu": lambda x: 0.5 * x * (1.0 + jax.lax.erf(x * (1 / math.sqrt(2)))),  # exact GELU, HF's "gelu"
    "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_fast": lambda x: jax.nn.gelu(x, approximate=True),
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
    "tanh": jnp.tanh,  # DeBERTa-v2's default conv_act
}


def compute_dtype(dtype):
    """'float32' / 'bfloat16' / 'float16' (or the jnp dtype) -> the jnp dtype."""
    name = jnp.dtype(dtype).name if not isinstance(dtype, str) else dtype
    if name not in COMPUTE_DTYPES:
        raise UserError(f"unsupported dtype {dtype!r}; use one of {', '.join(COMPUTE_DTYPES)}")
    return COMPUTE_DTYPES[name]


def activation(name):
    if name not in ACTIVATIONS:
        raise UserError(f"unsupported hidden_act {name!r} in config.json; use one of {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name]


def fold_key(key, *ids):
    """A dropout key for one site: `key` folded with each id in turn; None stays None (no dropout)."""
    if key is None:
        return None
    for i in ids:
        key = jax.random.fold_in(key, i)
    return key


def dropout(x, rate, key):
    """Inverted dropout; identity when key is None (eval) or rate is 0.

    The mask comes from a counter-based hash (two rounds of MurmurHash3's 32-bit finalizer) of each
    element's index, seeded by two words drawn from `key`: it fuses into the surrounding elementwise
    work, costs a few integer ops per element instead of a full threefry stream, and is the same for
    any sharding of x (the index is built from per-axis iotas). Keep probability 1 - rate to 2**-32.
    """
    if key is None or rate == 0.0:
        return x
    if rate >= 1.0:
        return jnp.zeros_like(x)
    seed = jax.random.bits(key, (2,), jnp.uint32)
    index = jnp.zeros(x.shape, jnp.uint32)
    for axis, stride in enumerate(_strides(x.shape)):
        index = index + jax.lax.broadcasted_iota(jnp.uint32, x.shape, axis) * jnp.uint32(stride)
    bits = _fmix32(_fmix32(index ^ seed[0]) + seed[1])
    keep = bits >= jnp.uint32(min(round(rate * 2.0 ** 32), 2 ** 32 - 1))
    return jnp.where(keep, x / (1.0 - rate), jnp.zeros_like(x)).astype(x.dtype)


def _strides(shape):
    strides, s = [], 1
    for n in reversed(shape):
        strides.append(s & 0xFFFFFFFF)
        s *= n
    return strides[::-1]


def _fmix32(h):
    """MurmurHash3's 32-bit finalizer: a bijection of uint32 that mixes every input bit into every output bit."""
    h = h ^ (h >> 16)
    h = h * jnp.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * jnp.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


def split_last(x, sizes):
    """x split along its last axis into pieces of `sizes`; the gradient is one concatenation (autodiff's
    would pad each piece's cotangent to full width and add them: several passes over x's size)."""
    return _split_last(x, tuple(sizes))


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _split_last(x, sizes):
    out, start = [], 0
    for n in sizes:
        out.append(jax.lax.slice_in_dim(x, start, start + n, axis=x.ndim - 1))
        start += n
    return tuple(out)


def _split_last_fwd(x, sizes):
    return _split_last(x, sizes), None


def _split_last_bwd(sizes, _, grads):
    return (jnp.concatenate(grads, axis=-1),)


_split_last.defvjp(_split_last_fwd, _split_last_bwd)


def normal_init(std, cutoff=None):
    """normal(std), or with cutoff a normal(std) truncated at +-cutoff * std (torch's trunc_normal_)."""
    if cutoff is None:
        return nnx.initializers.normal(std)
    return nnx.initializers.truncated_normal(std, lower=-cutoff, upper=cutoff)


def dense(d_in, d_out, dtype, std, rngs, use_bias=True, cutoff=None, drawn=None):
    """A Linear with float32 parameters, normal(std) kernel [in, out] (truncated at +-cutoff * std if given), zero
    bias, computing in dtype (its matmul: models.matmul.dot_general, whose weight gradient is the fast form on CPU).
    drawn: only the first `drawn` outputs' columns drawn, the rest zeros (a padded vocabulary: vocab_padding)."""
    kernel_init = normal_init(std, cutoff)
    if drawn is not None:
        kernel_init = drawn_then_zeros(kernel_init, drawn, axis=1)
    return Dense(d_in, d_out, use_bias=use_bias, dtype=dtype, param_dtype=jnp.float32,
                 kernel_init=kernel_init, bias_init=nnx.initializers.zeros, rngs=rngs,
                 dot_general=matmul.dot_general)


class Dense(nnx.Linear):
    """nnx.Linear that may carry a LoRA adapter (flaxlm.models.lora): lora_a [in, r], lora_b [r, out] and
    lora_scale (alpha / r); its output is then x W + b + lora_scale * dropout(x) lora_a lora_b, as PEFT computes it.
    An untied LM head may also carry trained token rows (token_ids, token_delta: with_token_rows)."""
    lora_a = None
    lora_b = None
    lora_scale = 0.0
    lora_dropout = 0.0
    lora_site = 0  # which adapter of its layer it is: its dropout mask's own key
    token_ids = ()  # the vocabulary rows (kernel columns) token_delta [n, in] adds to
    token_delta = None

    def __call__(self, inputs):
        y = super().__call__(inputs)
        return y if self.lora_a is None else y + lora_output(self, inputs)


_LORA_DROPOUT_KEY = contextvars.ContextVar("lora_dropout_key", default=None)


@contextlib.contextmanager
def lora_dropout_key(key):
    """The dropout key of the LoRA adapters called inside (a layer's: run_layers sets it from the layer's key)."""
    token = _LORA_DROPOUT_KEY.set(key)
    try:
        yield
    finally:
        _LORA_DROPOUT_KEY.reset(token)


def lora_output(lin, x):
    """A Dense's adapter term, in its compute dtype: lora_scale * dropout(x) @ lora_a @ lora_b."""
    key = _LORA_DROPOUT_KEY.get()
    x = dropout(x, lin.lora_dropout, fold_key(key, 1000 + lin.lora_site))
    h = x.astype(lin.dtype) @ lin.lora_a[...].astype(lin.dtype)
    return (h @ lin.lora_b[...].astype(lin.dtype)) * jnp.asarray(lin.lora_scale, lin.dtype)


class Embed(nnx.Embed):
    """nnx.Embed that may carry trained token rows (flaxlm.models.lora's trainable tokens, PEFT's TrainableTokens):
    token_delta [n, D] (float32) added to the table's rows token_ids, each sum in the table's dtype; its lookups and a
    tied head (with_token_rows) see those rows, the table itself stays as it is (frozen under LoRA)."""
    token_ids = ()
    token_delta = None

    def __call__(self, inputs):
        x = super().__call__(inputs)
        if self.token_delta is None:
            return x
        hit_BLn = inputs[..., None] == jnp.asarray(self.token_ids, inputs.dtype)
        # the row's float32 sum, rounded to the table's dtype (as with_token_rows): only the hit rows get a gradient
        row_BLD = x.astype(jnp.float32) + jnp.take(self.token_delta[...], jnp.argmax(hit_BLn, -1), axis=0)
        row_BLD = row_BLD.astype(self.embedding[...].dtype).astype(x.dtype)
        return jnp.where(hit_BLn.any(-1)[..., None], row_BLD, x)


def with_token_rows(module, weight, axis=0):
    """weight (the token embeddings [V, D], axis 0, or an untied head's kernel [D, V], axis 1) with the trained rows
    of `module` (an Embed or Dense carrying token_delta) in place: weight's rows token_ids + token_delta, in weight's
    dtype. weight itself when the module carries none."""
    if getattr(module, "token_delta", None) is None:
        return weight
    ids = jnp.asarray(module.token_ids, jnp.int32)
    delta_nD = module.token_delta[...]
    if axis == 0:
        return weight.at[ids].set((weight[ids].astype(jnp.float32) + delta_nD).astype(weight.dtype))
    return weight.at[:, ids].set((weight[:, ids].astype(jnp.float32) + delta_nD.T).astype(weight.dtype))


def lm_logits(h_MD, weight, tied, dtype):
    """float32 logits [M, V] of hidden rows h_MD: against the token embeddings weight [V, D] (a tied head) or an
    untied head's kernel [D, V], multiplied in dtype."""
    pattern = "md,vd->mv" if tied else "md,dv->mv"
    return jnp.einsum(pattern, h_MD.astype(dtype), weight.astype(dtype), preferred_element_type=jnp.float32)


class LMHead(NamedTuple):
    """A model's LM head as a loss that fuses it takes it (flaxlm.objectives.lm_loss): logits = lm_logits(h, weight, tied,
    dtype) (+ bias), where h are the rows the model returns with hidden=True (any scaling already applied)."""
    weight: jax.Array  # the token embeddings [V, D] when tied, else the head's kernel [D, V]
    tied: bool
    dtype: Any  # the compute dtype of the matmul (float32 results)
    bias: Optional[jax.Array] = None  # [V], added to the logits (BERT's MLM head)
    softcap: Optional[float] = None  # logits -> softcap * tanh(logits / softcap) (Gemma 2's final soft-capping)
    vocab_size: Optional[int] = None  # the true vocabulary when weight's V is padded past it (vocab_padding); None: V

    def logits(self, h_BLD):
        """float32 logits [B, L, V] of the rows h_BLD (one 2-D matmul over the B * L rows); V the true vocabulary."""
        B, L, D = h_BLD.shape
        out_MV = lm_logits(h_BLD.reshape(B * L, D), self.weight, self.tied, self.dtype)
        out_MV = out_MV if self.bias is None else out_MV + self.bias
        out_MV = soft_cap(out_MV, self.softcap)
        # A padded vocabulary: the matmul runs over the padded width (the point of the padding), and the columns
        # past the true vocabulary are cut off here rather than masked, so that whatever reads logits (generation,
        # scoring, DPO) sees the unpadded model's exactly and can never pick a padding id. The fused training loss
        # (lm_loss.head_xent) masks them instead, keeping its softmax over the padded width too.
        if self.vocab_size is not None and self.vocab_size < out_MV.shape[-1]:
            out_MV = out_MV[:, :self.vocab_size]
        return out_MV.reshape(B, L, -1)


def soft_cap(x, cap):
    """cap * tanh(x / cap) (Gemma 2's logit soft-capping); x itself when cap is None."""
    return x if cap is None else jnp.tanh(x / cap) * cap


def untrained_at(x_BLD, ids_BL, row):
    """Embeddings looked up at ids_BL with no gradient into table row `row`: torch's nn.Embedding(padding_idx=row),
    which transformers' encoders use for the padding token, never trains that row (a loss read at padding
    positions, as question answering's, would otherwise move it)."""
    return jnp.where((ids_BL == row)[..., None], jax.lax.stop_gradient(x_BLD), x_BLD)


def embed(n, d, std, rngs, cutoff=None, drawn=None):
    """A float32 embedding table [n, d], initialized normal(std) (truncated at +-cutoff * std if given); drawn: only
    the first `drawn` rows drawn, the rest zeros (a padded vocabulary: vocab_padding)."""
    init = normal_init(std, cutoff)
    if drawn is not None:
        init = drawn_then_zeros(init, drawn, axis=0)
    return Embed(n, d, dtype=jnp.float32, param_dtype=jnp.float32, embedding_init=init, rngs=rngs)


class RMSNorm(nnx.Module):
    """T5LayerNorm == LlamaRMSNorm: x / sqrt(mean(x^2) + eps) * (offset + scale), statistics in float32 (no mean, no
    bias); returns x's dtype. Gemma's norms: offset 1, scale initialized to 0."""

    def __init__(self, dim, eps, init_value=1.0, offset=0.0):
        self.scale = nnx.Param(jnp.full((dim,), init_value, jnp.float32))
        self.eps, self.offset = eps, offset

    def __call__(self, x):
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + self.eps)
        scale = self.scale[...] + self.offset if self.offset else self.scale[...]
        return (y * scale).astype(x.dtype)


class LayerNorm(nnx.LayerNorm):
    """LayerNorm with float32 parameters and statistics (no bias with use_bias=False); returns the input's dtype."""

    def __init__(self, dim, eps, rngs, use_bias=True):
        super().__init__(dim, epsilon=eps, use_bias=use_bias, dtype=jnp.float32, param_dtype=jnp.float32, rngs=rngs)

    def __call__(self, x):
        return super().__call__(x.astype(jnp.float32)).astype(x.dtype)


class Segments(NamedTuple):
    """Segment ids [B, L] (int32) given to attention() as its mask: a query sees only the keys of its own segment
    (the documents of a packed row: run_clm_flax.py --separate_documents), causal or not."""
    ids_BL: Any


def attention(q_BTNH, k_BSKH, v_BSKH, mask=None, *, causal=False, scale=None, dropout_rate=0.0,
              dropout_key=None, implementation=None, bias=None, window=None, softcap=None):
    """Softmax attention. mask (bool, True = attend): [B, S] hides padding keys, [B, T, S] is a full
    per-query mask (the KV-cache path), Segments keeps each query to its segment's keys; causal: query t sees
    keys 0..t (T == S). K key/value heads may be fewer than the N query heads (grouped-query attention, N a
    multiple of K). scale defaults to H**-0.5.
    bias: float32 [B or 1, N or 1, T, S] added to the scaled scores (DeBERTa's relative-position scores,
    BLOOM's ALiBi). window: query t sees only the keys less than `window` positions away, t - window + 1 .. t
    when causal (Mistral's and Gemma 2's sliding window, GPT-Neo's local layers), on both sides when not
    (ModernBERT's local layers). softcap: the scaled scores (plus bias) go through
    softcap * tanh(score / softcap) before the mask (Gemma 2).

    implementation "splash" (and None on a TPU) runs the Pallas splash kernel (flaxlm.models.splash) where it applies:
    no bias, no dropout in this call, no per-query mask, whole blocks of rows; elsewhere the XLA forms below.
    Without dropout or softcap this is jax.nn.dot_product_attention (with `implementation`: None lets JAX
    choose, "xla", "cudnn"); with a key and rate > 0, or a softcap, the probabilities are computed explicitly
    (float32) so they can be dropped out as Hugging Face does, but for implementation "cudnn" (and None on an
    NVIDIA GPU), which drops them out inside cuDNN's fused kernel where cudnn_dropout.where_not allows (with
    cuDNN's masks, not layers.dropout's: flaxlm.models.cudnn_dropout). Causal rows of CAUSAL_HALVES_MIN_LENGTH
    or more (even) then run as two halves of the queries, the first against the first half of the keys only: a
    quarter of the scores, all of them masked, is skipped (a quarter less attention time, forward and backward,
    for GPT-2 small's rows of 128 on a 2-core CPU).
    """
    (_, T, N, H), S = q_BTNH.shape, k_BSKH.shape[1]
    scale = 1.0 / math.sqrt(H) if scale is None else scale
    if context_parallel.current_order() is not None:  # a sequence split over devices: its queries in their order
        return _context_parallel_attention(q_BTNH, k_BSKH, v_BSKH, mask, causal, scale, dropout_rate, dropout_key,
                                           implementation, bias, window, softcap)
    segments = mask.ids_BL if isinstance(mask, Segments) else None
    if implementation == "splash" or (implementation is None and splash_compiles()):
        dropping = dropout_key is not None and dropout_rate > 0.0
        if not splash.where_not(T, S, bias=bias, dropout=dropping, mask_ndim=getattr(mask, "ndim", 2)):
            if segments is None and mask is not None:  # padding: real tokens one segment, padding another
                segments = mask.astype(jnp.int32)
            return splash.splash_attention(q_BTNH, k_BSKH, v_BSKH, causal=causal, scale=scale, window=window,
                                           segments_BT=segments, softcap=softcap)
        implementation = None
    if segments is not None:
        mask = segments[:, :, None] == segments[:, None, :]
    if mask is not None:
        mask = mask.astype(bool)
        mask = mask[:, None, None, :] if mask.ndim == 2 else mask[:, None, :, :]  # [B, 1, T or 1, S]
    dropping = dropout_key is not None and dropout_rate > 0.0
    if dropping and implementation in (None, "cudnn") and not cudnn_dropout.where_not(
            q_BTNH.dtype, T, S, H, causal=causal, window=window, softcap=softcap,
            masked=mask is not None or bias is not None):
        return cudnn_dropout.attention(q_BTNH, k_BSKH, v_BSKH, mask, bias, causal=causal, scale=scale,
                                       window=window, dropout_rate=dropout_rate)
    if implementation == "cudnn":
        bias = None if bias is None else bias.astype(q_BTNH.dtype)  # cuDNN takes the bias in the compute dtype
        # and a mask as a bias of whole [T, S] rows (jax.nn passes a [B, 1, 1, S] padding mask on, and cuDNN refuses it)
        mask = None if mask is None else jnp.broadcast_to(mask, (mask.shape[0], 1, T, S))
    if not dropping and softcap is None:
        return jax.nn.dot_product_attention(q_BTNH, k_BSKH, v_BSKH, bias=bias, mask=mask, is_causal=causal,
                                            scale=scale, implementation=implementation,
                                            local_window_size=None if window is None else
                                            (window - 1, 0 if causal else window - 1))
    K = k_BSKH.shape[2]
    if K != N:  # repeat each key/value head for its group of query heads
        k_BSKH, v_BSKH = jnp.repeat(k_BSKH, N // K, axis=2), jnp.repeat(v_BSKH, N // K, axis=2)
    if bias is not None or window is not None or softcap is not None or \
            not (causal and T == S and T % 2 == 0 and T >= CAUSAL_HALVES_MIN_LENGTH):
        return _dropout_attention(q_BTNH, k_BSKH, v_BSKH, mask, causal, 0, scale, dropout_rate, dropout_key, bias,
                                  window, softcap)
    # causal: the first half of the queries sees only the first half of the keys, so that quarter of the
    # scores (all masked) is never computed; each half draws its own dropout mask
    h = T // 2
    first = _dropout_attention(q_BTNH[:, :h], k_BSKH[:, :h], v_BSKH[:, :h], _mask_rows(mask, 0, h, h), True, 0,
                               scale, dropout_rate, fold_key(dropout_key, 0))
    second = _dropout_attention(q_BTNH[:, h:], k_BSKH, v_BSKH, _mask_rows(mask, h, T, S), True, h, scale,
                                dropout_rate, fold_key(dropout_key, 1))
    return jnp.concatenate([first, second], axis=1)


def _context_parallel_attention(q_BTNH, k_BSKH, v_BSKH, mask, causal, scale, dropout_rate, dropout_key,
                                implementation, bias, window, softcap):
    """attention() of a sequence split over the 'context' axis (flaxlm.models.context_parallel): the queries in the
    load-balanced order, each device's T / C of them; the keys and values gathered whole, in the sequence's own
    order; each query masked by its position in the sequence. splash (as attention() chooses it) or XLA."""
    if bias is not None:
        raise UserError("--context_parallel_size does not take attention biases (BLOOM's ALiBi, T5's and DeBERTa's "
                        "relative positions); train this model without it")
    order_T = context_parallel.current_order()
    q_BTNH = context_parallel.split_over_context(q_BTNH)
    inverse = np.argsort(order_T)
    k_BSKH, v_BSKH = (context_parallel.whole_on_each_device(x)[:, inverse] for x in (k_BSKH, v_BSKH))
    segments_BS = mask.ids_BL if isinstance(mask, Segments) else None
    padding_BS = None if mask is None or segments_BS is not None else mask.astype(bool)
    T, S = q_BTNH.shape[1], k_BSKH.shape[1]
    dropping = dropout_key is not None and dropout_rate > 0.0
    if (implementation == "splash" or (implementation is None and splash_compiles())) and not splash.where_not(
            T, S, dropout=dropping) and T % (2 * context_parallel.context_size() * splash.BLOCK) == 0:
        if segments_BS is None and padding_BS is not None:  # padding: real tokens one segment, padding another
            segments_BS = padding_BS.astype(jnp.int32)
        out_BTNH = splash.context_parallel_attention(q_BTNH, k_BSKH, v_BSKH, order_T, causal=causal, scale=scale,
                                                     window=window, segments_BS=segments_BS, softcap=softcap)
        return context_parallel.split_over_context(out_BTNH)
    # XLA: the mask of each query's position (order_T) against each key's
    seen_TS = _seen(jnp.asarray(order_T), S, causal, window)
    mask_BTS = jnp.ones((1, T, S), bool) if seen_TS is None else seen_TS[None]
    if segments_BS is not None:
        mask_BTS = mask_BTS & (segments_BS[:, order_T][:, :, None] == segments_BS[:, None, :])
    if padding_BS is not None:
        mask_BTS = mask_BTS & padding_BS[:, None, :]
    mask_B1TS = mask_BTS[:, None]
    if not dropping and softcap is None:
        out_BTNH = jax.nn.dot_product_attention(q_BTNH, k_BSKH, v_BSKH, mask=mask_B1TS, scale=scale,
                                                implementation="xla" if implementation == "splash" else implementation)
    else:
        K, N = k_BSKH.shape[2], q_BTNH.shape[2]
        if K != N:
            k_BSKH, v_BSKH = jnp.repeat(k_BSKH, N // K, axis=2), jnp.repeat(v_BSKH, N // K, axis=2)
        out_BTNH = _dropout_attention(q_BTNH, k_BSKH, v_BSKH, mask_B1TS, False, 0, scale, dropout_rate, dropout_key,
                                      softcap=softcap)
    return context_parallel.split_over_context(out_BTNH)


CAUSAL_HALVES_MIN_LENGTH = 64  # shorter causal rows: one block (the halves' matmuls would be too thin)


def _mask_rows(mask, start, stop, keys):
    """The [B, 1, T or 1, S] mask for queries start..stop-1 and the first `keys` keys (None stays None)."""
    if mask is None:
        return None
    return (mask if mask.shape[2] == 1 else mask[:, :, start:stop])[..., :keys]


def _seen(query_positions_T, S, causal, window):
    """bool [T, S]: which of keys 0..S-1 each query (at its position) sees: those at or before it (causal), the
    last `window` of them, or within `window` on both sides (not causal); None when it sees them all."""
    if not causal and window is None:
        return None
    distance_TS = query_positions_T[:, None] - jnp.arange(S)[None, :]
    if causal:
        return (distance_TS >= 0) if window is None else (distance_TS >= 0) & (distance_TS < window)
    return jnp.abs(distance_TS) < window


def _dropout_attention(q_BTNH, k_BSNH, v_BSNH, mask, causal, offset, scale, dropout_rate, dropout_key, bias=None,
                       window=None, softcap=None):
    """Softmax attention with the probabilities computed (float32) and dropped out; causal: query t (at
    position offset + t) sees keys 0..offset + t (the last `window` of them with a window); bias added to the
    scaled scores, then soft-capped."""
    T, S = q_BTNH.shape[1], k_BSNH.shape[1]
    logits_BNTS = jnp.einsum("btnh,bsnh->bnts", q_BTNH, k_BSNH, preferred_element_type=jnp.float32) * scale
    if bias is not None:
        logits_BNTS = logits_BNTS + bias.astype(jnp.float32)
    logits_BNTS = soft_cap(logits_BNTS, softcap)
    seen_TS = _seen(jnp.arange(T) + offset, S, causal, window)
    if seen_TS is not None:
        mask = seen_TS[None, None] if mask is None else mask & seen_TS[None, None]
    if mask is not None:
        logits_BNTS = jnp.where(mask, logits_BNTS, jnp.finfo(jnp.float32).min)
    probs_BNTS = jax.nn.softmax(logits_BNTS, axis=-1)
    probs_BNTS = dropout(probs_BNTS, dropout_rate, dropout_key).astype(v_BSNH.dtype)
    return jnp.einsum("bnts,bsnh->btnh", probs_BNTS, v_BSNH)
