"""DeBERTa-v2 and DeBERTa-v3 (model_type deberta-v2): BERT's post-LayerNorm encoder with disentangled attention,
the masked-LM model on it and the fine-tuning heads, configured by a transformers DebertaV2Config.

Disentangled attention adds to each content score q_i . k_j / sqrt(H * s) two relative-position scores, each read
at the row r(i, j) of a table of 2 * span relative-position embeddings (LayerNorm-ed once when norm_rel_ebd says
layer_norm; projected by each layer's query/key projections when share_att_key, else by its own
pos_query/pos_key projections):
    c2p  q_i . pos_key[r(i, j)] / sqrt(H * s)        (content to position, "c2p" in pos_att_type)
    p2c  k_j . pos_query[r(i, j)] / sqrt(H * s)      (position to content, "p2c" in pos_att_type)
where s = 1 + the number of those two types, r(i, j) = clip(bucket(i - j) + span, 0, 2 * span - 1), bucket() keeps
distances under position_buckets / 2 and log-spaces longer ones up to max_relative_positions (no buckets: the
distance itself), and span = position_buckets (or max_relative_positions, which defaults to
max_position_embeddings). The scores are gathered from [B, N, T, 2 * span] products with an index that depends on
the length only, and added to the scaled content scores as jax.nn.dot_product_attention's bias. Padding keys are
masked; transformers also masks the queries at padding (their rows then attend evenly to every key), which changes
only the outputs at padding, which no real position reads.

v3 (deberta-v3-*): no absolute positions (position_biased_input false), no token types, share_att_key, 256
buckets. v2 may add absolute positions and token types to the embeddings, and a convolution beside the first
layer (conv_kernel_size > 0, deberta-v2-xlarge): its output, added to the first layer's, is LayerNorm-ed.

The heads are BERT's where they compute the same (bert.BertForMaskedLM: dense -> activation -> LayerNorm -> tied
decoder + bias; bert.BertForQuestionAnswering), on this encoder: each such class names BERT's head first and
DebertaV2Encoder second, so that BERT's __init__ and __call__ build and call this encoder. The sequence
classifier (ContextPooler: dropout -> dense -> pooler_hidden_act -> dropout -> classifier) is its own.
transformers names the MLM head cls.predictions.* when config.legacy (its default) and lm_predictions.lm_head.*
otherwise; we write the one config.legacy names and read either. The replaced-token-detection discriminator
(DeBERTa-v3's pretraining, run_electra_flax.py) has Microsoft's head, mask_predictions.*: transformers has no class
for it and loads the encoder of such a checkpoint (the hub's v3 checkpoints hold that head too), ignoring the head.
"""
import math

import jax.numpy as jnp
import numpy as np
from flax import nnx

from flaxlm.errors import UserError
from flaxlm.models import bert
from flaxlm.models.family import (REPLACED_TOKEN_DETECTION, Family, Head, add_linear, add_norm, drop_prefixed,
                                  same_tensor, with_prefix)
from flaxlm.models.layer_stack import Execution, run_layers
from flaxlm.models.layers import LayerNorm, activation, attention, compute_dtype, dense, dropout, embed, fold_key

POSITION_TYPES = ("c2p", "p2c")


def position_types(config):
    """The relative-position scores config.pos_att_type asks for (a subset of POSITION_TYPES)."""
    types = config.pos_att_type or []
    types = [t.strip() for t in types.lower().split("|")] if isinstance(types, str) else list(types)
    unknown = [t for t in types if t not in POSITION_TYPES]
    if unknown:
        raise UserError(f"unsupported pos_att_type {'|'.join(unknown)} in config.json; use c2p, p2c or p2c|c2p")
    return types


def relative_span(config):
    """(position_buckets or 0, max_relative_positions, span): span rows of the embedding table on each side."""
    buckets = max(getattr(config, "position_buckets", -1), 0)
    max_relative = getattr(config, "max_relative_positions", -1)
    max_relative = config.max_position_embeddings if max_relative < 1 else max_relative
    return buckets, max_relative, buckets or max_relative


def log_bucket(distance, buckets, max_position):
    """transformers' make_log_bucket_position (float32, as torch computes it): distances under buckets / 2 kept,
    longer ones log-spaced so that max_position - 1 lands on buckets - 1; the sign kept."""
    mid = buckets // 2
    far = np.where(np.abs(distance) < mid, mid - 1, np.abs(distance)).astype(np.float32)
    log_ratio = np.log(far / np.float32(mid)) / np.log(np.float32((max_position - 1) / mid))
    log_pos = np.ceil(log_ratio * np.float32(mid - 1)) + np.float32(mid)
    return np.where(far <= mid, distance, log_pos * np.sign(distance)).astype(np.int64)


def relative_index(length, buckets, max_relative, span):
    """[L, L] int32: the row r(i, j) of the relative-position table that query i reads for key j (the arguments:
    relative_span's)."""
    distance = np.arange(length)[:, None] - np.arange(length)[None, :]
    if buckets:
        distance = log_bucket(distance, buckets, max_relative)
    return np.clip(distance + span, 0, 2 * span - 1).astype(np.int32)


def head_width(config):
    """H = hidden_size / num_attention_heads (config.attention_head_size, deberta-v2-xxlarge's, must agree: the
    attention's output projection is hidden_size wide)."""
    D, N = config.hidden_size, config.num_attention_heads
    if D % N or getattr(config, "attention_head_size", D // N) != D // N:
        raise UserError(f"hidden_size {D} is not num_attention_heads {N} times attention_head_size "
                        f"{getattr(config, 'attention_head_size', D / N)}; fix config.json")
    return D // N


class DisentangledAttention(nnx.Module):
    """Self-attention with the c2p / p2c relative-position scores (module docstring); bert.EncoderLayer's
    attention, called with relative=(the table [2 * span, D], the index [1 or B, T, L] of r(i, j))."""

    def __init__(self, config, dtype, rngs, execution):
        D, N, H, std = config.hidden_size, config.num_attention_heads, head_width(config), config.initializer_range
        self.query, self.key, self.value = (dense(D, D, dtype, std, rngs) for _ in range(3))
        self.out = dense(D, D, dtype, std, rngs)
        types = position_types(config)
        self.c2p, self.p2c = "c2p" in types, "p2c" in types
        self.relative = bool(config.relative_attention)
        self.shared = bool(getattr(config, "share_att_key", False))  # the table projected by key / query
        own = self.relative and not self.shared
        self.pos_key = dense(D, D, dtype, std, rngs) if own and self.c2p else None
        self.pos_query = dense(D, D, dtype, std, rngs) if own and self.p2c else None
        self.num_heads, self.head_width = N, H
        self.scale = 1.0 / math.sqrt(H * (1 + self.c2p + self.p2c))
        self.dropout_rate = config.attention_probs_dropout_prob
        self.table_dropout_rate = config.hidden_dropout_prob
        self.implementation = execution.attention_implementation

    def __call__(self, x_BLD, mask_BL, key, xq_BTD=None, relative=None):
        xq_BTD = x_BLD if xq_BTD is None else xq_BTD
        (B, L, D), T, N, H = x_BLD.shape, xq_BTD.shape[1], self.num_heads, self.head_width
        x_MD = x_BLD.reshape(B * L, D)
        q_BTNH = self.query(xq_BTD.reshape(B * T, D)).reshape(B, T, N, H)
        k_BLNH, v_BLNH = self.key(x_MD).reshape(B, L, N, H), self.value(x_MD).reshape(B, L, N, H)
        bias = self.position_scores(q_BTNH, k_BLNH, *relative, fold_key(key, 1)) if self.relative else None
        o_BTNH = attention(q_BTNH, k_BLNH, v_BLNH, mask_BL, scale=self.scale, bias=bias,
                           dropout_rate=self.dropout_rate, dropout_key=fold_key(key, 0),
                           implementation=self.implementation)
        return self.out(o_BTNH.reshape(B * T, D))

    def position_scores(self, q_BTNH, k_BLNH, table_RD, index_BTL, key):
        """float32 [B, N, T, L]: the c2p and p2c scores, scaled as the content scores are."""
        table_RD = dropout(table_RD, self.table_dropout_rate, key)
        R, N, H = table_RD.shape[0], self.num_heads, self.head_width
        scores_BNTL = 0.0
        if self.c2p:  # query i against the position keys, at the row r(i, j) of each key j
            pk_RNH = (self.key if self.shared else self.pos_key)(table_RD).reshape(R, N, H)
            c2p_BNTR = jnp.einsum("btnh,rnh->bntr", q_BTNH, pk_RNH, preferred_element_type=jnp.float32)
            scores_BNTL = scores_BNTL + jnp.take_along_axis(c2p_BNTR, index_BTL[:, None], axis=-1)
        if self.p2c:  # key j against the position queries, at the row r(i, j) of each query i
            pq_RNH = (self.query if self.shared else self.pos_query)(table_RD).reshape(R, N, H)
            p2c_BNLR = jnp.einsum("blnh,rnh->bnlr", k_BLNH, pq_RNH, preferred_element_type=jnp.float32)
            p2c_BNLT = jnp.take_along_axis(p2c_BNLR, jnp.swapaxes(index_BTL, 1, 2)[:, None], axis=-1)
            scores_BNTL = scores_BNTL + jnp.swapaxes(p2c_BNLT, 2, 3)
        return scores_BNTL * self.scale


class Embeddings(nnx.Module):
    """Word embeddings (+ absolute positions when position_biased_input, + token types when type_vocab_size > 0)
    -> LayerNorm -> zero at padding -> dropout."""

    def __init__(self, config, dtype, rngs):
        D, std = config.hidden_size, config.initializer_range
        if getattr(config, "embedding_size", D) != D:
            raise UserError(f"embedding_size {config.embedding_size} differs from hidden_size {D}: DeBERTa's "
                            f"embedding projection is not supported; drop embedding_size from config.json")
        self.word = embed(config.vocab_size, D, std, rngs)
        self.word.embedding[...] = self.word.embedding[...].at[config.pad_token_id or 0].set(0.0)  # as HF inits
        self.position = (embed(config.max_position_embeddings, D, std, rngs)
                         if config.position_biased_input else None)
        self.token_type = embed(config.type_vocab_size, D, std, rngs) if config.type_vocab_size > 0 else None
        self.norm = LayerNorm(D, config.layer_norm_eps, rngs)
        self.dropout_rate = config.hidden_dropout_prob
        self.dtype = dtype

    def __call__(self, ids_BL, token_type_ids_BL, real_BL, key, segment_ids_BL=None):
        x_BLD = self.word(ids_BL)
        if self.position is not None:  # packed rows: positions restart at every sequence
            pos_BL = (bert.segment_positions(segment_ids_BL) if segment_ids_BL is not None
                      else jnp.arange(ids_BL.shape[1], dtype=jnp.int32)[None, :])
            x_BLD = x_BLD + self.position(pos_BL)
        if self.token_type is not None:
            x_BLD = x_BLD + self.token_type(token_type_ids_BL)
        x_BLD = self.norm(x_BLD) * real_BL[..., None].astype(jnp.float32)
        return dropout(x_BLD.astype(self.dtype), self.dropout_rate, key)


class ConvLayer(nnx.Module):
    """DeBERTa-v2's convolution of the embeddings (conv_kernel_size wide, conv_groups groups, zero outside each
    sequence) -> zero at padding -> dropout -> conv_act, added to the first layer's output -> LayerNorm -> zero
    at padding. kernel keeps torch's Conv1d layout [out, in / groups, width]."""

    def __init__(self, config, dtype, rngs):
        D, K, G = config.hidden_size, config.conv_kernel_size, getattr(config, "conv_groups", 1)
        if K % 2 == 0 or D % G:
            raise UserError(f"conv_kernel_size {K} must be odd and hidden_size {D} a multiple of conv_groups {G}; "
                            f"fix config.json")
        self.kernel = nnx.Param(nnx.initializers.normal(config.initializer_range)(rngs.params(), (D, D // G, K)))
        self.bias = nnx.Param(jnp.zeros((D,), jnp.float32))
        self.norm = LayerNorm(D, config.layer_norm_eps, rngs)
        self.act = getattr(config, "conv_act", "tanh")
        activation(self.act)  # fail early on an unsupported activation
        self.groups, self.dropout_rate, self.dtype = G, config.hidden_dropout_prob, dtype

    def __call__(self, x_BLD, y_BLD, segment_ids_BL, key):
        """x: the embeddings, y: the first layer's output; segment_ids: 1, 2, ... per sequence, 0 at padding."""
        (B, L, D), (_, Din, K), G = x_BLD.shape, self.kernel.shape, self.groups
        pad = (K - 1) // 2
        x_pad = jnp.pad(x_BLD, ((0, 0), (pad, pad), (0, 0)))
        seg_pad = jnp.pad(segment_ids_BL, ((0, 0), (pad, pad)))
        # tap k of position i: the embedding at i + k - pad if that is in i's sequence, else 0
        taps_BLKD = jnp.stack([jnp.where((seg_pad[:, k:k + L] == segment_ids_BL)[..., None], x_pad[:, k:k + L], 0)
                               for k in range(K)], axis=2)
        w_GOIK = self.kernel[...].reshape(G, D // G, Din, K).astype(self.dtype)
        c_BLGO = jnp.einsum("blkgi,goik->blgo", taps_BLKD.reshape(B, L, K, G, Din).astype(self.dtype), w_GOIK,
                            preferred_element_type=jnp.float32)
        real_BL1 = (segment_ids_BL > 0)[..., None]
        c_BLD = jnp.where(real_BL1, c_BLGO.reshape(B, L, D) + self.bias[...], 0.0)
        c_BLD = activation(self.act)(dropout(c_BLD, self.dropout_rate, key))
        return (self.norm(y_BLD.astype(jnp.float32) + c_BLD) * real_BL1).astype(y_BLD.dtype)


class DebertaV2Encoder(bert.BertEncoder):
    """The DeBERTa-v2/v3 encoder (embeddings, the relative-position table, post-LayerNorm layers with disentangled
    attention, the optional convolution) that every head builds on; encode() as BertEncoder's, which it replaces
    (the heads subclass both: module docstring). execution: how the layers run (layer_stack.Execution)."""

    def __init__(self, config, *, dtype="float32", rngs, execution=None):
        activation(config.hidden_act)  # fail early on an unsupported activation
        dtype = compute_dtype(dtype)
        self.embeddings = Embeddings(config, dtype, rngs)
        self.execution = execution or Execution()
        self.layers = nnx.List([bert.EncoderLayer(config, dtype, rngs, self.execution, DisentangledAttention)
                                for _ in range(config.num_hidden_layers)])
        self.span = relative_span(config)  # (buckets, max_relative_positions, span)
        D, std = config.hidden_size, config.initializer_range
        self.rel_embeddings = embed(2 * self.span[2], D, std, rngs) if config.relative_attention else None
        norm_rel = [x.strip() for x in (getattr(config, "norm_rel_ebd", None) or "none").lower().split("|")]
        self.rel_norm = LayerNorm(D, config.layer_norm_eps, rngs) if "layer_norm" in norm_rel else None
        self.conv = ConvLayer(config, dtype, rngs) if getattr(config, "conv_kernel_size", 0) > 0 else None
        self.dtype = dtype

    def relative(self, length, positions_BP=None):
        """The attention's relative=(table, index) for rows of `length`, the index at positions_BP's rows only
        when given; None without relative attention."""
        if self.rel_embeddings is None:
            return None
        table_RD = self.rel_embeddings.embedding[...]
        if self.rel_norm is not None:
            table_RD = self.rel_norm(table_RD)
        index_LL = jnp.asarray(relative_index(length, *self.span))
        return table_RD, (index_LL[None] if positions_BP is None else index_LL[positions_BP])

    def encode(self, input_ids_BL, attention_mask_BL=None, token_type_ids_BL=None, dropout_key=None,
               last_positions_BP=None, segment_ids_BL=None):
        """The last layer's output [B, L, D] (in the compute dtype), or [B, P, D] at last_positions_BP only
        (the last layer then computes only those rows); dropout_key=None is eval mode. segment_ids_BL: packed
        rows (1, 2, ... per sequence, 0 = padding): each sequence attends to itself only."""
        B, L = input_ids_BL.shape
        if token_type_ids_BL is None:
            token_type_ids_BL = jnp.zeros_like(input_ids_BL)
        if segment_ids_BL is None:  # one sequence a row: segment 1, padding 0
            real_BL = jnp.ones((B, L), bool) if attention_mask_BL is None else attention_mask_BL.astype(bool)
            segments_BL = real_BL.astype(jnp.int32)
        else:
            attention_mask_BL, segments_BL = bert.segment_attention_mask(segment_ids_BL), segment_ids_BL
        x0_BLD = self.embeddings(input_ids_BL, token_type_ids_BL, segments_BL > 0, fold_key(dropout_key, 0),
                                 segment_ids_BL)
        relative = self.relative(L)
        call = lambda i, layer, x, _: layer(x, attention_mask_BL, fold_key(dropout_key, i + 1),  # noqa: E731
                                            relative=relative)
        layers, x_BLD = list(self.layers), x0_BLD
        if self.conv is not None:  # the convolution joins the first layer's output
            x_BLD = self.conv(x0_BLD, run_layers(layers[:1], x0_BLD, call, self.execution), segments_BL,
                              fold_key(dropout_key, len(layers) + 1))
            layers = layers[1:]
        first = len(self.layers) - len(layers)  # the index of layers[0]
        uniform = layers if last_positions_BP is None or not layers else layers[:-1]  # the last differs: below
        x_BLD = run_layers(uniform, x_BLD, lambda i, layer, x, extra: call(first + i, layer, x, extra),
                           self.execution)
        if last_positions_BP is None:
            return x_BLD
        if not layers:
            return bert.gather_rows(x_BLD, last_positions_BP)
        return layers[-1](x_BLD, attention_mask_BL, fold_key(dropout_key, len(self.layers)), last_positions_BP,
                          relative=self.relative(L, last_positions_BP))


class DebertaV2ForMaskedLM(bert.BertForMaskedLM, DebertaV2Encoder):
    """The encoder with BERT's masked-LM head (dense -> activation -> LayerNorm -> tied decoder + bias), named
    as transformers' DebertaV2ForMaskedLM (cls.predictions.* or lm_predictions.lm_head.*: tensor_names)."""

    def __init__(self, config, *, dtype="float32", rngs, execution=None):
        if config.legacy and not config.tie_word_embeddings:
            raise UserError("tie_word_embeddings false with legacy true (an untied cls.predictions.decoder) is not "
                            "supported; set tie_word_embeddings to true in config.json")
        super().__init__(config, dtype=dtype, rngs=rngs, execution=execution)


class DebertaV2ForQuestionAnswering(bert.BertForQuestionAnswering, DebertaV2Encoder):
    """The encoder with a question-answering head: start and end logits of every token (qa_outputs)."""


class DebertaV2ForTokenClassification(bert.BertForTokenClassification, DebertaV2Encoder):
    """The encoder with BERT's token-classification head; its dropout is hidden_dropout_prob, as transformers has it."""

    def __init__(self, config, *, dtype="float32", rngs, execution=None):
        super().__init__(config, dtype=dtype, rngs=rngs, execution=execution)
        self.dropout_rate = config.hidden_dropout_prob


class DebertaV2ForSequenceClassification(DebertaV2Encoder):
    """The encoder with transformers' ContextPooler and classifier: the first token -> dropout (pooler_dropout)
    -> pooler (dense) -> pooler_hidden_act -> dropout (cls_dropout, else hidden_dropout_prob) -> classifier."""

    def __init__(self, config, *, dtype="float32", rngs, execution=None):
        super().__init__(config, dtype=dtype, rngs=rngs, execution=execution)
        D, std = config.hidden_size, config.initializer_range
        self.pooler = dense(D, D, self.dtype, std, rngs)
        self.classifier = dense(D, config.num_labels, jnp.float32, std, rngs)
        self.pooler_act = config.pooler_hidden_act
        activation(self.pooler_act)  # fail early on an unsupported activation
        self.pooler_dropout = config.pooler_dropout
        rate = getattr(config, "cls_dropout", None)
        self.dropout_rate = config.hidden_dropout_prob if rate is None else rate

    def __call__(self, input_ids_BL, attention_mask_BL=None, token_type_ids_BL=None, *, dropout_key=None):
        """float32 logits [B, num_labels] (one column for regression)."""
        first_B1 = jnp.zeros((input_ids_BL.shape[0], 1), jnp.int32)
        x_BD = self.encode(input_ids_BL, attention_mask_BL, token_type_ids_BL, fold_key(dropout_key, 0),
                           first_B1)[:, 0]
        x_BD = dropout(x_BD, self.pooler_dropout, fold_key(dropout_key, 1))
        pooled_BD = dropout(activation(self.pooler_act)(self.pooler(x_BD)), self.dropout_rate, fold_key(dropout_key, 2))
        return self.classifier(pooled_BD.astype(jnp.float32))


class ReplacedTokenHead(nnx.Module):
    """DeBERTa-v3's replaced-token-detection head (mask_predictions of Microsoft's DeBERTa code): LayerNorm(the
    sequence's first token + each token) -> dense -> hidden_act -> one logit (float32)."""

    def __init__(self, config, dtype, rngs):
        D, std = config.hidden_size, config.initializer_range
        self.norm = LayerNorm(D, config.layer_norm_eps, rngs)
        self.dense = dense(D, D, dtype, std, rngs)
        self.out = dense(D, 1, jnp.float32, std, rngs)
        self.act = config.hidden_act

    def __call__(self, x_BLD, first_BLD):
        """[B, L] logits; first_BLD: the output at each token's sequence start (broadcast: [B, 1, D] unless packed)."""
        B, L, D = x_BLD.shape
        h_BLD = self.norm(first_BLD + x_BLD).astype(x_BLD.dtype)
        h_MD = activation(self.act)(self.dense(h_BLD.reshape(B * L, D)))
        return self.out(h_MD.astype(jnp.float32)).reshape(B, L)


class DebertaV2ForReplacedTokenDetection(DebertaV2Encoder):
    """The DeBERTa-v3 discriminator (run_electra_flax.py): the encoder with ReplacedTokenHead, one logit per token,
    positive for a token it takes for replaced. transformers has no class for it: its DebertaV2Model and the
    fine-tuning classes load the encoder and ignore mask_predictions.*, as for microsoft/deberta-v3-*."""

    def __init__(self, config, *, dtype="float32", rngs, execution=None):
        super().__init__(config, dtype=dtype, rngs=rngs, execution=execution)
        self.rtd_head = ReplacedTokenHead(config, self.dtype, rngs)

    def __call__(self, input_ids_BL, attention_mask_BL=None, token_type_ids_BL=None, *, dropout_key=None,
                 segment_ids_BL=None):
        """float32 logits [B, L]; segment_ids_BL: packed rows, each sequence computed as if alone."""
        x_BLD = self.encode(input_ids_BL, attention_mask_BL, token_type_ids_BL, dropout_key,
                            segment_ids_BL=segment_ids_BL)
        if segment_ids_BL is None:
            return self.rtd_head(x_BLD, x_BLD[:, :1])
        starts_BL = jnp.arange(input_ids_BL.shape[1], dtype=jnp.int32) - bert.segment_positions(segment_ids_BL)
        return self.rtd_head(x_BLD, bert.gather_rows(x_BLD, starts_BL))


def _head_names(legacy):
    """The MLM head's tensor names: (dense, LayerNorm, output bias), as config.legacy has transformers name them."""
    if legacy:
        return "cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm", "cls.predictions.bias"
    return "lm_predictions.lm_head.dense", "lm_predictions.lm_head.LayerNorm", "lm_predictions.lm_head.bias"


def _attention_names(config, names, hf, ours):
    """One layer's attention tensors added to names: query/key/value/output projections and, without
    share_att_key, the position projections of the scores pos_att_type asks for."""
    for proj, our in (("query_proj", "query"), ("key_proj", "key"), ("value_proj", "value")):
        add_linear(names, f"{hf}attention.self.{proj}", (*ours, "attn", our))
    if config.relative_attention and not getattr(config, "share_att_key", False):
        types = position_types(config)
        if "c2p" in types:
            add_linear(names, f"{hf}attention.self.pos_key_proj", (*ours, "attn", "pos_key"))
        if "p2c" in types:
            add_linear(names, f"{hf}attention.self.pos_query_proj", (*ours, "attn", "pos_query"))
    add_linear(names, f"{hf}attention.output.dense", (*ours, "attn", "out"))
    add_norm(names, f"{hf}attention.output.LayerNorm", (*ours, "attn_norm"))


def encoder_tensor_names(config):
    """Tensor names of the DeBERTa-v2 encoder (under deberta.) -> our parameter paths."""
    p = "deberta."
    names = [(f"{p}embeddings.word_embeddings.weight", ("embeddings", "word", "embedding"), "copy")]
    if config.position_biased_input:
        names.append((f"{p}embeddings.position_embeddings.weight", ("embeddings", "position", "embedding"), "copy"))
    if config.type_vocab_size > 0:
        names.append((f"{p}embeddings.token_type_embeddings.weight", ("embeddings", "token_type", "embedding"),
                      "copy"))
    add_norm(names, f"{p}embeddings.LayerNorm", ("embeddings", "norm"))
    for i in range(config.num_hidden_layers):
        hf, ours = f"{p}encoder.layer.{i}.", ("layers", str(i))
        _attention_names(config, names, hf, ours)
        add_linear(names, f"{hf}intermediate.dense", (*ours, "mlp_in"))
        add_linear(names, f"{hf}output.dense", (*ours, "mlp_out"))
        add_norm(names, f"{hf}output.LayerNorm", (*ours, "mlp_norm"))
    if config.relative_attention:
        names.append((f"{p}encoder.rel_embeddings.weight", ("rel_embeddings", "embedding"), "copy"))
    if "layer_norm" in (getattr(config, "norm_rel_ebd", None) or "").lower():
        add_norm(names, f"{p}encoder.LayerNorm", ("rel_norm",))
    if getattr(config, "conv_kernel_size", 0) > 0:
        names += [(f"{p}encoder.conv.conv.weight", ("conv", "kernel"), "copy"),
                  (f"{p}encoder.conv.conv.bias", ("conv", "bias"), "copy")]
        add_norm(names, f"{p}encoder.conv.LayerNorm", ("conv", "norm"))
    return names


def tensor_names(config):
    """Tensor names of DebertaV2ForMaskedLM (transformers 5; the head's as config.legacy says) -> our paths."""
    names = encoder_tensor_names(config)
    dense_name, norm_name, bias_name = _head_names(config.legacy)
    add_linear(names, dense_name, ("mlm_head", "dense"))
    add_norm(names, norm_name, ("mlm_head", "norm"))
    names.append((bias_name, ("mlm_head", "bias"), "copy"))
    return names


RTD_HEAD = "mask_predictions."  # the replaced-token-detection head's names (Microsoft's DeBERTa code)


def head_tensor_names(config, task):
    """Tensor names of DebertaV2ForSequenceClassification (pooler.dense, classifier),
    DebertaV2ForQuestionAnswering (qa_outputs), DebertaV2ForTokenClassification (classifier) or the
    discriminator (mask_predictions.*) -> our paths."""
    names = encoder_tensor_names(config)
    if task == REPLACED_TOKEN_DETECTION:
        add_norm(names, f"{RTD_HEAD}LayerNorm", ("rtd_head", "norm"))
        add_linear(names, f"{RTD_HEAD}dense", ("rtd_head", "dense"))
        add_linear(names, f"{RTD_HEAD}classifier", ("rtd_head", "out"))
    elif task == "question_answering":
        add_linear(names, "qa_outputs", ("qa_outputs",))
    elif task == "token_classification":
        add_linear(names, "classifier", ("classifier",))
    else:
        add_linear(names, "pooler.dense", ("pooler",))
        add_linear(names, "classifier", ("classifier",))
    return names


def _bare(config, tensors, notes, keep_rtd=False):
    """A checkpoint in today's names: the deberta. prefix of a bare DebertaV2Model added, the position_ids buffer
    dropped, and the tensors transformers ignores dropped with a note: v3's replaced-token-detection head
    (mask_predictions.*, unless keep_rtd) and absolute position embeddings that position_biased_input false
    leaves unused."""
    out = with_prefix(tensors, "deberta.", ("embeddings", "encoder"), buffers=(".position_ids",))
    unused = () if keep_rtd else (RTD_HEAD,)
    if not config.position_biased_input:
        unused += ("deberta.embeddings.position_embeddings.",)
    out, dropped = drop_prefixed(out, unused)
    if dropped:
        notes.append(f"ignored {len(dropped)} tensor(s) transformers' DeBERTa-v2 does not use either "
                     f"(replaced-token-detection head, unused absolute positions): {', '.join(dropped)}")
    return out


def _head_tensors(legacy):
    dense_name, norm_name, bias_name = _head_names(legacy)
    return [f"{dense_name}.weight", f"{dense_name}.bias", f"{norm_name}.weight", f"{norm_name}.bias", bias_name]


def normalize(config, tensors, notes):
    """Accept bare, older and hub checkpoints (see _bare); an MLM head in the other naming than config.legacy
    says (the hub's v3 checkpoints: lm_predictions.lm_head.*, which computes the same) renamed, with a note; the
    tied legacy decoder dropped (its weight checked equal to the word embeddings, its bias the head's bias)."""
    out = _bare(config, tensors, notes)
    ours, other = _head_tensors(config.legacy), _head_tensors(not config.legacy)
    if not any(n in out for n in ours) and any(n in out for n in other):
        out = {dict(zip(other, ours)).get(n, n): x for n, x in out.items()}
        notes.append(f"read the checkpoint's MLM head {other[0].rsplit('.', 2)[0]}.* as "
                     f"{ours[0].rsplit('.', 2)[0]}.* (config.json's legacy is {str(config.legacy).lower()})")
    word = out.get("deberta.embeddings.word_embeddings.weight")
    decoder_w = out.pop("cls.predictions.decoder.weight", None)
    if decoder_w is not None and word is not None and not same_tensor(decoder_w, word):
        raise UserError("tensor cls.predictions.decoder.weight differs from deberta.embeddings.word_embeddings."
                        "weight; only checkpoints with tied input/output embeddings are supported")
    decoder_b = out.pop("cls.predictions.decoder.bias", None)
    if decoder_b is not None and config.legacy:
        out.setdefault("cls.predictions.bias", decoder_b)
    return out


def normalize_for_head(config, tensors, notes, task):
    """A checkpoint for fine-tuning or for the discriminator: the pretraining heads (masked-LM in either naming;
    replaced-token detection unless the task is that) dropped with a note."""
    keep_rtd = task == REPLACED_TOKEN_DETECTION
    out, dropped = drop_prefixed(_bare(config, tensors, notes, keep_rtd), ("cls.predictions.", "lm_predictions."))
    if dropped:
        notes.append(f"dropped the pretraining head of the checkpoint ({len(dropped)} tensor(s): masked-LM), which "
                     f"{task.replace('_', ' ')} does not use")
    return out


# The full-size presets copy the hub's configs (microsoft/deberta-v3-*; their pos_att_type "p2c|c2p" as the list
# transformers makes of it; no legacy key: transformers' legacy MLM head names); deberta-v3-tiny is for tests.
_V3 = dict(model_type="deberta-v2", vocab_size=128100, hidden_act="gelu", hidden_dropout_prob=0.1,
           attention_probs_dropout_prob=0.1, initializer_range=0.02, max_position_embeddings=512,
           relative_attention=True, position_buckets=256, norm_rel_ebd="layer_norm", share_att_key=True,
           pos_att_type=["p2c", "c2p"], layer_norm_eps=1e-7, max_relative_positions=-1, position_biased_input=False,
           type_vocab_size=0)

_SHAPE = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
PRESETS = {name: {**_V3, **dict(zip(_SHAPE, shape)), **changes} for name, shape, changes in (
    ("deberta-v3-xsmall", (384, 12, 6, 1536), {}),
    ("deberta-v3-small", (768, 6, 12, 3072), {}),
    ("deberta-v3-base", (768, 12, 12, 3072), {}),
    ("deberta-v3-large", (1024, 24, 16, 4096), {}),
    ("deberta-v3-tiny", (64, 2, 2, 256), dict(vocab_size=1024, max_position_embeddings=128, position_buckets=32)),
    # run_electra_flax.py's generators: as wide as the discriminator, half as deep (the DeBERTa-v3 paper)
    ("deberta-v3-xsmall-generator", (384, 6, 6, 1536), {}),
    ("deberta-v3-small-generator", (768, 3, 12, 3072), {}),
    ("deberta-v3-base-generator", (768, 6, 12, 3072), {}),
    ("deberta-v3-large-generator", (1024, 12, 16, 4096), {}),
    ("deberta-v3-tiny-generator", (64, 1, 2, 256), dict(vocab_size=1024, max_position_embeddings=128,
                                                         position_buckets=32)),
)}

DEBERTA_V2 = Family(
    model_type="deberta-v2", name="DeBERTa-v2", model=DebertaV2ForMaskedLM, tensor_names=tensor_names,
    normalize=normalize, architecture="DebertaV2ForMaskedLM", presets=PRESETS, script="run_mlm_flax.py",
    max_length=lambda config: config.max_position_embeddings,
    tie_word_embeddings=lambda config: True,  # the MLM decoder is the word embeddings
    no_splash="its disentangled relative positions add a bias to the scores",
    fresh_head="mlm_head",
    heads={"sequence_classification": Head(DebertaV2ForSequenceClassification, "DebertaV2ForSequenceClassification",
                                           ("pooler", "classifier")),
           "question_answering": Head(DebertaV2ForQuestionAnswering, "DebertaV2ForQuestionAnswering", ("qa_outputs",)),
           "token_classification": Head(DebertaV2ForTokenClassification, "DebertaV2ForTokenClassification",
                                        ("classifier",)),
           # no transformers class: DebertaV2Model loads the encoder (microsoft/deberta-v3-* have the same tensors)
           REPLACED_TOKEN_DETECTION: Head(DebertaV2ForReplacedTokenDetection, "DebertaV2Model", ("rtd_head",))},
    head_tensor_names=head_tensor_names, normalize_for_head=normalize_for_head)
