"""T5 encoder-decoder (original T5 and T5 v1.1), tensor for tensor Hugging Face's T5ForConditionalGeneration.

One module serves both, configured by a transformers T5Config:
- original T5 (feed_forward_proj "relu"): FFN wi -> ReLU -> wo; the LM head is the shared embedding matrix,
  applied to the decoder output scaled by d_model**-0.5;
- T5 v1.1 ("gated-gelu"; "gated-silu" etc. work too): FFN act(wi_0 x) * wi_1 x -> wo; an untied LM head
  (lm_head.kernel) and no scaling.
Both: pre-norm blocks with RMS norms (scale only, no mean, no bias), no biases anywhere, attention logits
without the 1/sqrt(d) factor plus a bucketed relative-position bias. Each stack owns one bias table (Hugging
Face keeps it in the stack's first block), turned into a [1, N, T, S] bias once per call and added in every
layer; cross-attention has none. The families built on these modules (flaxlm.models.mt5: mT5, and UMT5, whose
every layer has its own bias table) pass `tied` and `bias_per_layer` to T5ForConditionalGeneration.
Parameters are float32; computation runs in `dtype`; norm statistics, attention softmax and logits are float32.

Shape suffixes: B batch, L encoder length, T decoder length, S key length, D d_model, N heads, H d_kv,
F d_ff, V vocabulary, K buckets. Below the model: its Hugging Face tensor names, its presets and its Family.
"""
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from flaxlm.errors import UserError
from flaxlm.models.family import Family, add_linear, add_norm, same_tensor
from flaxlm.models.layer_stack import Execution, run_layers
from flaxlm.models.layers import LMHead, RMSNorm, activation, compute_dtype, dense, dropout, fold_key, split_last


def ties_embeddings(config):
    """True for original T5 (LM head = shared embeddings, output scaled by d_model**-0.5), False for v1.1.

    transformers 5 keeps this in `scale_decoder_outputs` (its T5Config always reports
    tie_word_embeddings=True, reading a config.json's `tie_word_embeddings: false` into
    scale_decoder_outputs=False); earlier versions in tie_word_embeddings.
    """
    scale = getattr(config, "scale_decoder_outputs", None)
    return bool(getattr(config, "tie_word_embeddings", True) if scale is None else scale)


def shift_right(labels_BT, decoder_start_token_id, pad_token_id):
    """Decoder inputs for labels, as Hugging Face's _shift_right: the start token, then the labels but the
    last; ignored labels (-100) become padding."""
    labels_BT = jnp.asarray(labels_BT)
    start_B1 = jnp.full((labels_BT.shape[0], 1), decoder_start_token_id, labels_BT.dtype)
    ids_BT = jnp.concatenate([start_B1, labels_BT[:, :-1]], axis=1)
    return jnp.where(ids_BT == -100, pad_token_id, ids_BT)


@functools.lru_cache(maxsize=64)
def relative_buckets(query_len, key_len, bidirectional, num_buckets, max_distance):
    """Bucket of every (query, key) offset, [T, S] int32: Hugging Face's _relative_position_bucket, same float32
    arithmetic, computed on the host once per shape (a constant in the compiled graph).

    Offsets below max_exact (half the buckets; a quarter each way when bidirectional) get a bucket each, larger
    ones share logarithmically wider buckets up to max_distance, beyond which all share the last.
    """
    rel_TS = np.arange(key_len)[None, :] - np.arange(query_len)[:, None]  # key position - query position
    buckets_TS = np.zeros_like(rel_TS)
    if bidirectional:
        num_buckets //= 2
        buckets_TS += (rel_TS > 0) * num_buckets
        rel_TS = np.abs(rel_TS)
    else:
        rel_TS = -np.minimum(rel_TS, 0)
    max_exact = num_buckets // 2
    log_ratio = np.log(np.maximum(rel_TS, 1).astype(np.float32) / np.float32(max_exact))
    large_TS = max_exact + (log_ratio / np.float32(math.log(max_distance / max_exact))
                            * np.float32(num_buckets - max_exact)).astype(np.int64)
    large_TS = np.minimum(large_TS, num_buckets - 1)
    out = (buckets_TS + np.where(rel_TS < max_exact, rel_TS, large_TS)).astype(np.int32)
    out.flags.writeable = False
    return out


@jax.custom_vjp
def add_shared_bias(logits_BNTS, bias_1NTS):
    """logits + bias broadcast over the batch; the bias gradient (a sum over the batch) is a matrix-vector
    product, several times faster on CPU than XLA's reduce over the leading axis."""
    return logits_BNTS + bias_1NTS


def _add_shared_bias_fwd(logits_BNTS, bias_1NTS):
    return logits_BNTS + bias_1NTS, None


def _add_shared_bias_bwd(_, g_BNTS):
    return g_BNTS, jnp.einsum("b,bnts->nts", jnp.ones(g_BNTS.shape[:1], g_BNTS.dtype), g_BNTS)[None]


add_shared_bias.defvjp(_add_shared_bias_fwd, _add_shared_bias_bwd)


def t5_attention(q_BTNH, k_BSNH, v_BSNH, bias_1NTS=None, mask_B1TS=None, *, dropout_rate=0.0, dropout_key=None,
                 implementation=None):
    """softmax(q k^T + bias) v, no 1/sqrt(H) scaling; mask (bool, True = attend) hides keys.

    Without dropout this is jax.nn.dot_product_attention (with `implementation`: None lets JAX choose, "xla",
    "cudnn"); with a key and rate > 0 the probabilities are computed explicitly (float32) so they can be
    dropped out as Hugging Face does.
    """
    if dropout_key is None or dropout_rate == 0.0:
        return jax.nn.dot_product_attention(q_BTNH, k_BSNH, v_BSNH, bias=bias_1NTS, mask=mask_B1TS, scale=1.0,
                                            implementation=implementation)
    logits_BNTS = jnp.einsum("btnh,bsnh->bnts", q_BTNH, k_BSNH, preferred_element_type=jnp.float32)
    if bias_1NTS is not None:
        logits_BNTS = add_shared_bias(logits_BNTS, bias_1NTS)
    if mask_B1TS is not None:
        logits_BNTS = jnp.where(mask_B1TS, logits_BNTS, jnp.finfo(jnp.float32).min)
    probs_BNTS = dropout(jax.nn.softmax(logits_BNTS, axis=-1), dropout_rate, dropout_key).astype(v_BSNH.dtype)
    return jnp.einsum("bnts,bsnh->btnh", probs_BNTS, v_BSNH)


def _normal(std):
    return nnx.initializers.normal(std)


def bias_table(config, rngs):
    """A relative_attention_bias table [K, N] (float32), initialized as Hugging Face does."""
    K, N, f = config.relative_attention_num_buckets, config.num_heads, config.initializer_factor
    return nnx.Embed(K, N, dtype=jnp.float32, param_dtype=jnp.float32,
                     embedding_init=_normal(f * config.d_model ** -0.5), rngs=rngs)


def gather_bias(table, buckets_TS):
    """[1, N, T, S] float32: a bias table gathered at each (query, key) offset's bucket."""
    return jnp.take(table.embedding[...].T, buckets_TS, axis=1)[None]


class Attention(nnx.Module):
    """T5Attention: q, k, v, o projections without biases (inner width N * H, need not equal D)."""

    def __init__(self, config, dtype, rngs, execution):
        D, H, N, f = config.d_model, config.d_kv, config.num_heads, config.initializer_factor
        # Hugging Face's init: the missing 1/sqrt(H) of the logits is folded into q's scale.
        self.q = dense(D, N * H, dtype, f * (D * H) ** -0.5, rngs, use_bias=False)
        self.k = dense(D, N * H, dtype, f * D ** -0.5, rngs, use_bias=False)
        self.v = dense(D, N * H, dtype, f * D ** -0.5, rngs, use_bias=False)
        self.o = dense(N * H, D, dtype, f * (N * H) ** -0.5, rngs, use_bias=False)
        self.num_heads, self.head_dim, self.dropout_rate = N, H, config.dropout_rate
        self.implementation = execution.attention_implementation

    def __call__(self, x_BTD, kv_BSD, bias_1NTS, mask_B1TS, key, kv_proj=None):
        """Attention of x's queries over kv's keys and values (kv is x for self-attention); kv_proj: kv's
        keys and values, [B * S, N * H] each, when already projected (the decoder's cross-attention)."""
        (B, T, D), N, H = x_BTD.shape, self.num_heads, self.head_dim
        x_MD = x_BTD.reshape(B * T, D)  # M = B * T: 2-D matmuls, ~5% faster per train step on CPU than 3-D ones
        if kv_proj is not None:
            q_MI, (k_BSI, v_BSI) = self.q(x_MD), kv_proj  # BS: B * S rows
        elif kv_BSD is x_BTD:  # self-attention: one matmul against [q | k | v]
            w_D3I = jnp.concatenate([self.q.kernel[...], self.k.kernel[...], self.v.kernel[...]],
                                    axis=1).astype(x_BTD.dtype)
            q_MI, k_BSI, v_BSI = split_last(jnp.dot(x_MD, w_D3I), (N * H,) * 3)
        else:
            kv_SD = kv_BSD.reshape(-1, kv_BSD.shape[-1])
            q_MI, k_BSI, v_BSI = self.q(x_MD), self.k(kv_SD), self.v(kv_SD)
        q_BTNH, k_BSNH, v_BSNH = q_MI.reshape(B, T, N, H), k_BSI.reshape(B, -1, N, H), v_BSI.reshape(B, -1, N, H)
        o_BTNH = t5_attention(q_BTNH, k_BSNH, v_BSNH, bias_1NTS, mask_B1TS, dropout_rate=self.dropout_rate,
                              dropout_key=key, implementation=self.implementation)
        return self.o(o_BTNH.reshape(B * T, N * H)).reshape(B, T, -1)


class FeedForward(nnx.Module):
    """T5DenseActDense (wi -> act -> wo) or, for feed_forward_proj "gated-*", T5DenseGatedActDense
    (act(wi_0 x) * wi_1 x -> wo); dropout on the hidden activations."""

    def __init__(self, config, dtype, rngs):
        D, F, f = config.d_model, config.d_ff, config.initializer_factor
        self.gated = bool(config.is_gated_act)
        if self.gated:
            self.wi_0 = dense(D, F, dtype, f * D ** -0.5, rngs, use_bias=False)
            self.wi_1 = dense(D, F, dtype, f * D ** -0.5, rngs, use_bias=False)
        else:
            self.wi = dense(D, F, dtype, f * D ** -0.5, rngs, use_bias=False)
        self.wo = dense(F, D, dtype, f * F ** -0.5, rngs, use_bias=False)
        self.act = config.dense_act_fn
        self.dropout_rate = config.dropout_rate

    def __call__(self, x_BTD, key):
        act = activation(self.act)
        x_MD = x_BTD.reshape(-1, x_BTD.shape[-1])  # 2-D matmuls, as in Attention
        if self.gated:  # one matmul against [wi_0 | wi_1] (measured ~5% faster per train step on CPU than two)
            w_DG = jnp.concatenate([self.wi_0.kernel[...], self.wi_1.kernel[...]], axis=1).astype(x_BTD.dtype)
            F = w_DG.shape[1] // 2
            a_MF, b_MF = split_last(jnp.dot(x_MD, w_DG), (F, F))
            h_MF = act(a_MF) * b_MF
        else:
            h_MF = act(self.wi(x_MD))
        return self.wo(dropout(h_MF, self.dropout_rate, key)).reshape(x_BTD.shape[:-1] + (-1,))


class Block(nnx.Module):
    """T5Block: pre-norm self-attention, (decoder only) cross-attention, feed-forward; dropout on each branch.
    With own_bias (UMT5) the block holds its self-attention's relative_attention_bias table."""

    def __init__(self, config, is_decoder, dtype, rngs, execution, own_bias=False):
        D, eps, f = config.d_model, config.layer_norm_epsilon, config.initializer_factor
        if own_bias:
            self.relative_attention_bias = bias_table(config, rngs)
        self.attn_norm = RMSNorm(D, eps, f)
        self.attn = Attention(config, dtype, rngs, execution)
        if is_decoder:
            self.cross_norm = RMSNorm(D, eps, f)
            self.cross_attn = Attention(config, dtype, rngs, execution)
        self.mlp_norm = RMSNorm(D, eps, f)
        self.mlp = FeedForward(config, dtype, rngs)
        self.is_decoder = is_decoder
        self.dropout_rate = config.dropout_rate

    def __call__(self, x_BTD, bias_1NTT, mask_B1TT, key, enc_BSD=None, enc_mask_B11S=None, cross_kv=None,
                 self_kv=None):
        """self_kv: the self-attention's keys and values [B, S, N * H] each, when decoding with a cache
        (flaxlm.models.t5_generation); cross_kv: the cross-attention's, projected once per encoder output."""
        rate = self.dropout_rate
        h_BTD = self.attn_norm(x_BTD)
        x_BTD = x_BTD + dropout(self.attn(h_BTD, h_BTD, bias_1NTT, mask_B1TT, fold_key(key, 0), self_kv), rate,
                                fold_key(key, 1))
        if self.is_decoder:
            h_BTD = self.cross_norm(x_BTD)
            cross_BTD = self.cross_attn(h_BTD, enc_BSD, None, enc_mask_B11S, fold_key(key, 2), cross_kv)
            x_BTD = x_BTD + dropout(cross_BTD, rate, fold_key(key, 3))
        h_BTD = self.mlp(self.mlp_norm(x_BTD), fold_key(key, 4))
        return x_BTD + dropout(h_BTD, rate, fold_key(key, 5))


class Stack(nnx.Module):
    """T5Stack without its (shared) embeddings: the relative-position bias table (bias_per_layer, UMT5: one in
    each block instead), the blocks, a final norm; the blocks run as `execution` says
    (flaxlm.models.layer_stack), the cross-attention keys and values of each decoder block being its scanned
    input."""

    def __init__(self, config, num_layers, is_decoder, dtype, rngs, execution, bias_per_layer=False):
        if not bias_per_layer:
            self.relative_attention_bias = bias_table(config, rngs)
        self.layers = nnx.List([Block(config, is_decoder, dtype, rngs, execution, bias_per_layer)
                                for _ in range(num_layers)])
        self.execution = execution
        self.final_norm = RMSNorm(config.d_model, config.layer_norm_epsilon, config.initializer_factor)
        self.is_decoder, self.bias_per_layer = is_decoder, bias_per_layer
        self.num_buckets = config.relative_attention_num_buckets
        self.max_distance = config.relative_attention_max_distance
        self.dropout_rate = config.dropout_rate

    def cross_keys_values(self, enc_BSD):
        """Every layer's cross-attention keys and values, [(k, v)], each [B * S, N * H]: one matmul of the
        encoder output against all the layers' k and v kernels side by side."""
        ws = [w for layer in self.layers for w in (layer.cross_attn.k.kernel[...], layer.cross_attn.v.kernel[...])]
        enc_MD = enc_BSD.reshape(-1, enc_BSD.shape[-1])
        kv_MX = jnp.dot(enc_MD, jnp.concatenate(ws, axis=1).astype(enc_BSD.dtype))
        parts = split_last(kv_MX, [w.shape[1] for w in ws])
        return list(zip(parts[0::2], parts[1::2]))

    def __call__(self, x_BTD, mask_BT, key, enc_BSD=None, enc_mask_BS=None):
        """Hidden states after the final norm; mask_BT (True/1 = real token) hides padding keys, and the
        decoder is causal. The decoder attends to enc_BSD, hiding its padding by enc_mask_BS."""
        T = x_BTD.shape[1]
        buckets_TT = relative_buckets(T, T, not self.is_decoder, self.num_buckets, self.max_distance)
        shared_1NTT = None if self.bias_per_layer else gather_bias(self.relative_attention_bias, buckets_TT)
        mask_B1TT = None if mask_BT is None else mask_BT[:, None, None, :].astype(bool)
        if self.is_decoder:
            causal_11TT = jnp.asarray(np.tril(np.ones((T, T), bool)))[None, None]
            mask_B1TT = causal_11TT if mask_B1TT is None else causal_11TT & mask_B1TT
        enc_mask_B11S = None if enc_mask_BS is None else enc_mask_BS[:, None, None, :].astype(bool)
        cross_kv = None
        if self.is_decoder and enc_BSD is not None:
            cross_kv = self.cross_keys_values(enc_BSD)
        x_BTD = dropout(x_BTD, self.dropout_rate, fold_key(key, 0))
        x_BTD = run_layers(self.layers, x_BTD, lambda i, layer, x, kv: layer(
            x, gather_bias(layer.relative_attention_bias, buckets_TT) if shared_1NTT is None else shared_1NTT,
            mask_B1TT, fold_key(key, i + 1), enc_BSD, enc_mask_B11S, kv), self.execution, cross_kv)
        return dropout(self.final_norm(x_BTD), self.dropout_rate, fold_key(key, len(self.layers) + 1))


class T5ForConditionalGeneration(nnx.Module):
    """T5 (original or v1.1) with its LM head; parameters named after Hugging Face's modules (tensor_names).

        logits_BTV = model(input_ids_BL, attention_mask_BL, decoder_input_ids_BT)   # teacher forcing
        enc_BLD = model.encode(input_ids_BL, attention_mask_BL)                      # for generation
        logits_BTV = model.decode(decoder_input_ids_BT, enc_BLD, attention_mask_BL)
        h_BTD = model(input_ids_BL, attention_mask_BL, decoder_input_ids_BT, hidden=True)  # for a fused
        head = model.head()                                                                # head + loss
    """

    def __init__(self, config, *, dtype="float32", rngs, execution=None, tied=None, bias_per_layer=False):
        """tied: whether the LM head is the shared embeddings (default: ties_embeddings(config));
        bias_per_layer: a relative-position bias table in every block (UMT5) instead of one per stack."""
        for key in ("num_layers", "num_decoder_layers", "num_heads", "d_model", "d_kv", "d_ff", "vocab_size",
                    "relative_attention_num_buckets"):
            if getattr(config, key) < 1:
                raise UserError(f"config key '{key}' must be positive, got {getattr(config, key)}; fix config.json")
        activation(config.dense_act_fn)  # fail early on an unsupported activation
        dtype = compute_dtype(dtype)
        D, V, f = config.d_model, config.vocab_size, config.initializer_factor
        self.shared = nnx.Embed(V, D, dtype=jnp.float32, param_dtype=jnp.float32, embedding_init=_normal(f),
                                rngs=rngs)
        self.execution = execution or Execution()
        self.encoder = Stack(config, config.num_layers, False, dtype, rngs, self.execution, bias_per_layer)
        self.decoder = Stack(config, config.num_decoder_layers, True, dtype, rngs, self.execution, bias_per_layer)
        self.tied = ties_embeddings(config) if tied is None else tied
        if not self.tied:
            self.lm_head = dense(D, V, dtype, f, rngs, use_bias=False)
        self.d_model = D
        self.dtype = dtype

    def encode(self, input_ids_BL, attention_mask_BL=None, dropout_key=None):
        """Encoder output [B, L, D] in the compute dtype; dropout_key=None is eval mode."""
        x_BLD = self.shared(input_ids_BL).astype(self.dtype)
        return self.encoder(x_BLD, attention_mask_BL, dropout_key)

    def decode(self, decoder_input_ids_BT, enc_BLD, attention_mask_BL=None, decoder_attention_mask_BT=None,
               dropout_key=None, hidden=False):
        """Logits (float32) [B, T, V] of the decoder over enc_BLD (attention_mask_BL: the encoder's padding);
        with hidden=True the rows [B, T, D] that the head multiplies instead (see head()): the decoder output,
        scaled by d_model**-0.5 when the head is tied."""
        y_BTD = self.shared(decoder_input_ids_BT).astype(self.dtype)
        h_BTD = self.decoder(y_BTD, decoder_attention_mask_BT, dropout_key, enc_BLD, attention_mask_BL)
        if self.tied:
            h_BTD = h_BTD * jnp.asarray(self.d_model ** -0.5, self.dtype)
        if hidden:
            return h_BTD
        return self.head().logits(h_BTD)

    def head(self):
        """The LM head: the shared embeddings (original T5) or lm_head's kernel (v1.1)."""
        return LMHead(self.shared.embedding[...] if self.tied else self.lm_head.kernel[...], self.tied, self.dtype)

    def __call__(self, input_ids_BL, attention_mask_BL=None, decoder_input_ids_BT=None,
                 decoder_attention_mask_BT=None, *, dropout_key=None, hidden=False):
        """Logits (float32) [B, T, V] for teacher-forced decoder inputs (shift_right of the labels), or
        with hidden=True the rows the head multiplies (see decode); dropout_key=None is eval mode."""
        if decoder_input_ids_BT is None:
            raise ValueError("T5 needs decoder_input_ids_BT: the labels shifted right (t5.shift_right)")
        enc_BLD = self.encode(input_ids_BL, attention_mask_BL, fold_key(dropout_key, 0))
        return self.decode(decoder_input_ids_BT, enc_BLD, attention_mask_BL, decoder_attention_mask_BT,
                           fold_key(dropout_key, 1), hidden)


def tensor_names(config, tied=None, bias_per_layer=False):
    """Tensor names of T5ForConditionalGeneration (transformers 5) -> our parameter paths (tied, bias_per_layer:
    as T5ForConditionalGeneration takes them).

    Hugging Face keeps each stack's relative-position bias in its first block only (UMT5: in every block);
    encoder.embed_tokens and decoder.embed_tokens are the shared embeddings (never saved); lm_head.weight exists
    when untied (v1.1).
    """
    names = [("shared.weight", ("shared", "embedding"), "copy")]

    def norm(hf, ours):
        add_norm(names, hf, ours, bias=False)

    def linear(hf, ours):
        add_linear(names, hf, ours, bias=False)

    ffn = ("wi_0", "wi_1", "wo") if config.is_gated_act else ("wi", "wo")
    bias = "layer.0.SelfAttention.relative_attention_bias.weight"
    for stack, n in (("encoder", config.num_layers), ("decoder", config.num_decoder_layers)):
        if not bias_per_layer:
            names.append((f"{stack}.block.0.{bias}", (stack, "relative_attention_bias", "embedding"), "copy"))
        for i in range(n):
            hf, ours = f"{stack}.block.{i}.layer.", (stack, "layers", str(i))
            if bias_per_layer:
                names.append((f"{stack}.block.{i}.{bias}", (*ours, "relative_attention_bias", "embedding"), "copy"))
            for proj in ("q", "k", "v", "o"):
                linear(f"{hf}0.SelfAttention.{proj}", (*ours, "attn", proj))
            norm(f"{hf}0.layer_norm", (*ours, "attn_norm"))
            if stack == "decoder":
                for proj in ("q", "k", "v", "o"):
                    linear(f"{hf}1.EncDecAttention.{proj}", (*ours, "cross_attn", proj))
                norm(f"{hf}1.layer_norm", (*ours, "cross_norm"))
            f = 2 if stack == "decoder" else 1
            for w in ffn:
                linear(f"{hf}{f}.DenseReluDense.{w}", (*ours, "mlp", w))
            norm(f"{hf}{f}.layer_norm", (*ours, "mlp_norm"))
        norm(f"{stack}.final_layer_norm", (stack, "final_norm"))
    if not (ties_embeddings(config) if tied is None else tied):
        linear("lm_head", ("lm_head",))
    return names


def normalize(config, tensors, notes, tied=None, tied_head_scale=1.0):
    """Drop what Hugging Face ties or ignores: the stacks' embed_tokens copies of shared.weight, a tied
    lm_head.weight (checked equal), decoder cross-attention's unused relative_attention_bias. An untied (v1.1)
    config whose checkpoint has no lm_head.weight (transformers 5 saves v1.1 models built from a config tied)
    gets a copy of shared.weight, which is what transformers computes with (times tied_head_scale: UMT5's tied
    head multiplies the decoder output by d_model**-0.5). tied: as T5ForConditionalGeneration takes it."""
    out = dict(tensors)
    for name in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight"):
        x = out.pop(name, None)
        if x is None:
            continue
        if "shared.weight" not in out:
            out["shared.weight"] = x
        elif not same_tensor(x, out["shared.weight"]):
            raise UserError(f"tensor {name} differs from shared.weight; only checkpoints whose encoder and decoder "
                            f"share the input embeddings (every T5) are supported")
    unused = "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight"
    if out.pop(unused, None) is not None:
        notes.append(f"ignored {unused} (cross-attention has no position bias; transformers ignores it too)")
    shared, head = out.get("shared.weight"), out.get("lm_head.weight")
    if ties_embeddings(config) if tied is None else tied:
        if head is not None:
            if shared is not None and not same_tensor(head, shared):
                raise UserError("tensor lm_head.weight differs from shared.weight but config.json describes original "
                                "T5 with tied embeddings; for an untied LM head (T5 v1.1) set tie_word_embeddings "
                                "to false in config.json")
            out.pop("lm_head.weight")
    elif head is None and shared is not None and getattr(config, "tie_word_embeddings", False):
        out["lm_head.weight"] = np.asarray(shared, np.float32) * np.float32(tied_head_scale)
        scaled = f" times {tied_head_scale:.4g}, the tied head's scale" if tied_head_scale != 1 else ""
        notes.append("the checkpoint has no lm_head.weight and its config.json ties it to shared.weight; the "
                     f"untied LM head starts as a copy of the shared embeddings{scaled}")
    return out


# google/t5-v1_1-* and google-t5/t5-* on the hub: v1.1 has a gated-GELU FFN and an untied LM head, the original a
# ReLU FFN and the LM head tied to the embeddings (transformers 5 reads tie_word_embeddings false into
# scale_decoder_outputs=False: ties_embeddings). The mini/tiny ones are for tests and the CPU demo.
_T5 = dict(model_type="t5", vocab_size=32128, d_kv=64, relative_attention_num_buckets=32,
           relative_attention_max_distance=128, dropout_rate=0.1, layer_norm_epsilon=1e-6, initializer_factor=1.0,
           decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
_T5_V1_1 = {**_T5, "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False}
_T5_ORIGINAL = {**_T5, "feed_forward_proj": "relu", "tie_word_embeddings": True}


def stack_shape(d_model, d_ff, layers, heads, decoder_layers=None):
    """A preset's widths and depths (decoder_layers: as many as the encoder's unless given)."""
    return dict(d_model=d_model, d_ff=d_ff, num_layers=layers, num_decoder_layers=decoder_layers or layers,
                num_heads=heads)


# google/byt5-*: T5 v1.1 (model_type "t5") on UTF-8 bytes (train_tokenizer.py --type byte: 3 specials, 256 bytes,
# 125 extra ids), the encoder 3x deeper than the decoder.
_BYT5 = {**_T5_V1_1, "vocab_size": 384}


PRESETS = {
    "t5-v1_1-small": {**_T5_V1_1, **stack_shape(512, 1024, 8, 6)},
    "t5-v1_1-base": {**_T5_V1_1, **stack_shape(768, 2048, 12, 12)},
    "t5-v1_1-large": {**_T5_V1_1, **stack_shape(1024, 2816, 24, 16)},
    "t5-small": {**_T5_ORIGINAL, **stack_shape(512, 2048, 6, 8)},
    "t5-base": {**_T5_ORIGINAL, **stack_shape(768, 3072, 12, 12)},
    "t5-v1_1-mini": {**_T5_V1_1, **stack_shape(128, 384, 3, 4), "d_kv": 32, "vocab_size": 8192},
    "t5-v1_1-tiny": {**_T5_V1_1, **stack_shape(64, 128, 2, 4), "d_kv": 16, "vocab_size": 1024},
    "t5-tiny": {**_T5_ORIGINAL, **stack_shape(64, 128, 2, 4), "d_kv": 16, "vocab_size": 1024},
    "byt5-small": {**_BYT5, **stack_shape(1472, 3584, 12, 6, decoder_layers=4)},
    "byt5-base": {**_BYT5, **stack_shape(1536, 3968, 18, 12, decoder_layers=6)},
    "byt5-tiny": {**_BYT5, **stack_shape(64, 128, 3, 4, decoder_layers=1), "d_kv": 16},
}

T5 = Family(model_type="t5", name="T5", model=T5ForConditionalGeneration, tensor_names=tensor_names,
            normalize=normalize, architecture="T5ForConditionalGeneration", presets=PRESETS,
            script="run_t5_mlm_flax.py", tie_word_embeddings=ties_embeddings,  # relative positions: no max_length
            no_splash="its relative position buckets add a bias to the scores")
