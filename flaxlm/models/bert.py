"""BERT and RoBERTa, two families (model_type bert, roberta) in one file: the post-LayerNorm encoder (BertEncoder),
the masked-LM model on it (+ tied MLM head) and the fine-tuning heads on it.

One module serves both, configured by a transformers BertConfig / RobertaConfig. RoBERTa differs only in
its position ids (counted from pad_token_id + 1, skipping padding) and in its head always using exact GELU.
XLM-RoBERTa and CamemBERT (xlm_roberta.py) are RoBERTa under other model types (ROBERTA_LIKE).
Parameters are float32; computation runs in `dtype`; LayerNorm statistics and logits are float32.

The fine-tuning heads compute what Hugging Face's models compute; each returns float32, dropout_key=None is eval:
    BertForSequenceClassification: logits [B, num_labels] from the first token ([CLS] / <s>):
        BERT     pooler (dense, tanh) -> dropout -> classifier                  (BertForSequenceClassification)
        RoBERTa  dropout -> pooler (dense, tanh) -> dropout -> classifier       (RobertaClassificationHead)
      Our `pooler` is RoBERTa's classifier.dense and `classifier` its classifier.out_proj (head_tensor_names).
      The encoder's last layer computes only the first token (the only row the head reads).
    BertForQuestionAnswering: start and end logits [B, L] from one dense layer over every token (qa_outputs).
    BertForTokenClassification: logits [B, L, num_labels] of every token: dropout -> classifier.

Below the models: their Hugging Face tensor names and how older or bare checkpoints are read, the presets, and
the two Family entries.
"""
import re

import jax.numpy as jnp
import numpy as np
from flax import nnx

from flaxlm.errors import UserError
from flaxlm.models.family import Family, Head, add_linear, add_norm, drop_prefixed, with_prefix
from flaxlm.models.layer_stack import Execution, run_layers
from flaxlm.models.layers import (LayerNorm, LMHead, activation, attention, compute_dtype, dense, dropout, embed,
                                  fold_key, untrained_at)


# The model types with RoBERTa's architecture and Hugging Face names (roberta. prefix, lm_head, positions counted
# after padding, dropout before the classifier's pooler): RoBERTa's and those of xlm_roberta.py.
ROBERTA_LIKE = ("roberta", "xlm-roberta", "camembert")


def roberta_like(config):
    return config.model_type in ROBERTA_LIKE


def roberta_position_ids(ids_BL, pad_id):
    """Hugging Face's create_position_ids_from_input_ids: pad_id + 1, pad_id + 2, ... for tokens, pad_id for pads."""
    not_pad_BL = (ids_BL != pad_id).astype(jnp.int32)
    return jnp.cumsum(not_pad_BL, axis=1) * not_pad_BL + pad_id


def segment_positions(segment_ids_BL):
    """Each token's index in its segment (packed rows, flaxlm.data.packing): 0, 1, ... restarting where the id changes."""
    i_BL = jnp.broadcast_to(jnp.arange(segment_ids_BL.shape[1], dtype=jnp.int32), segment_ids_BL.shape)
    starts_BL = jnp.concatenate([jnp.ones_like(segment_ids_BL[:, :1], bool),
                                 segment_ids_BL[:, 1:] != segment_ids_BL[:, :-1]], axis=1)
    return i_BL - jnp.maximum.accumulate(jnp.where(starts_BL, i_BL, 0), axis=1)


def segment_attention_mask(segment_ids_BL):
    """[B, L, L] bool: a token attends only to tokens of its own segment (padding, segment 0, only to padding,
    so that no row of the softmax is empty); each sequence of a packed row is then computed as if alone."""
    return segment_ids_BL[:, :, None] == segment_ids_BL[:, None, :]


def gather_rows(x_BLD, positions_BP):
    """x at the given positions of each row: [B, P, D]."""
    return jnp.take_along_axis(x_BLD, positions_BP[..., None].astype(jnp.int32), axis=1)


class Embeddings(nnx.Module):
    def __init__(self, config, dtype, rngs, width=None):
        """width: of the embeddings and their LayerNorm (default hidden_size; ELECTRA's embedding_size)."""
        D, std = width or config.hidden_size, config.initializer_range
        self.word = embed(config.vocab_size, D, std, rngs)
        self.position = embed(config.max_position_embeddings, D, std, rngs)
        self.token_type = embed(config.type_vocab_size, D, std, rngs)
        self.norm = LayerNorm(D, config.layer_norm_eps, rngs)
        self.roberta_positions = roberta_like(config)
        self.pad_id = config.pad_token_id if config.pad_token_id is not None else 0
        self.dropout_rate = config.hidden_dropout_prob
        self.dtype = dtype
        # Hugging Face zeroes the padding rows at initialization, and never trains them (untrained_at).
        self.word.embedding[...] = self.word.embedding[...].at[self.pad_id].set(0.0)
        if self.roberta_positions:
            self.position.embedding[...] = self.position.embedding[...].at[self.pad_id].set(0.0)

    def __call__(self, ids_BL, token_type_ids_BL, key, segment_ids_BL=None):
        if segment_ids_BL is not None:  # packed rows: positions restart at every sequence
            pos_BL = segment_positions(segment_ids_BL)
            if self.roberta_positions:
                pos_BL = jnp.where(segment_ids_BL > 0, pos_BL + self.pad_id + 1, self.pad_id)
        elif self.roberta_positions:
            pos_BL = roberta_position_ids(ids_BL, self.pad_id)
        else:
            pos_BL = jnp.arange(ids_BL.shape[1], dtype=jnp.int32)[None, :]
        word_BLD = untrained_at(self.word(ids_BL), ids_BL, self.pad_id)  # transformers' padding_idx
        position_BLD = self.position(pos_BL)
        if self.roberta_positions:
            position_BLD = untrained_at(position_BLD, pos_BL, self.pad_id)
        x_BLD = word_BLD + self.token_type(token_type_ids_BL) + position_BLD
        x_BLD = self.norm(x_BLD).astype(self.dtype)
        return dropout(x_BLD, self.dropout_rate, key)


class SelfAttention(nnx.Module):
    def __init__(self, config, dtype, rngs, execution):
        D, std = config.hidden_size, config.initializer_range
        self.query = dense(D, D, dtype, std, rngs)
        self.key = dense(D, D, dtype, std, rngs)
        self.value = dense(D, D, dtype, std, rngs)
        self.out = dense(D, D, dtype, std, rngs)
        self.num_heads = config.num_attention_heads
        self.dropout_rate = config.attention_probs_dropout_prob
        self.implementation = execution.attention_implementation

    def __call__(self, x_BLD, mask_BL, key, xq_BTD=None):
        """Self-attention of x, [B * T, D]; with xq_BTD (a subset of x's rows) only those rows ask the queries.
        The projections multiply 2-D [rows, D] arrays: on CPU ~5% faster per train step than 3-D ones."""
        xq_BTD = x_BLD if xq_BTD is None else xq_BTD
        (B, L, D), T, N = x_BLD.shape, xq_BTD.shape[1], self.num_heads
        x_MD = x_BLD.reshape(B * L, D)
        q_MD, k_MD, v_MD = self.query(xq_BTD.reshape(B * T, D)), self.key(x_MD), self.value(x_MD)
        q_BTNH, k_BLNH, v_BLNH = (q_MD.reshape(B, T, N, D // N), k_MD.reshape(B, L, N, D // N),
                                  v_MD.reshape(B, L, N, D // N))
        o_BTNH = attention(q_BTNH, k_BLNH, v_BLNH, mask_BL, dropout_rate=self.dropout_rate, dropout_key=key,
                           implementation=self.implementation)
        return self.out(o_BTNH.reshape(B * T, D))


class EncoderLayer(nnx.Module):
    """A post-LayerNorm layer: attention (SelfAttention, or another family's `attention` module taking the same
    arguments and its own attention_args) -> residual + LayerNorm -> MLP -> residual + LayerNorm."""

    def __init__(self, config, dtype, rngs, execution, attention=SelfAttention):
        D, F, std = config.hidden_size, config.intermediate_size, config.initializer_range
        self.attn = attention(config, dtype, rngs, execution)
        self.attn_norm = LayerNorm(D, config.layer_norm_eps, rngs)
        self.mlp_in = dense(D, F, dtype, std, rngs)
        self.mlp_out = dense(F, D, dtype, std, rngs)
        self.mlp_norm = LayerNorm(D, config.layer_norm_eps, rngs)
        self.act = config.hidden_act
        self.dropout_rate = config.hidden_dropout_prob

    def __call__(self, x_BLD, mask_BL, key, positions_BP=None, **attention_args):
        """The layer's output at every position, or only at positions_BP ([B, P, D]): every position is
        still attended to, but queries, residuals and the MLP run on those P rows alone."""
        xq_BTD = x_BLD if positions_BP is None else gather_rows(x_BLD, positions_BP)
        if positions_BP is not None and mask_BL is not None and mask_BL.ndim == 3:  # per-query mask: those rows
            mask_BL = gather_rows(mask_BL, positions_BP)
        B, T, D = xq_BTD.shape
        a_MD = self.attn(x_BLD, mask_BL, fold_key(key, 0), xq_BTD, **attention_args)  # M = B * T rows
        y_MD = self.attn_norm(xq_BTD.reshape(B * T, D) + dropout(a_MD, self.dropout_rate, fold_key(key, 1)))
        h_MD = self.mlp_out(activation(self.act)(self.mlp_in(y_MD)))
        return self.mlp_norm(y_MD + dropout(h_MD, self.dropout_rate, fold_key(key, 2))).reshape(B, T, D)


class MlmHead(nnx.Module):
    """dense -> activation -> LayerNorm -> tied decoder (word embeddings transposed) + output bias."""

    def __init__(self, config, dtype, rngs):
        D = config.hidden_size
        self.dense = dense(D, D, dtype, config.initializer_range, rngs)
        self.norm = LayerNorm(D, config.layer_norm_eps, rngs)
        self.bias = nnx.Param(jnp.zeros((config.vocab_size,), jnp.float32))
        self.act = "gelu" if roberta_like(config) else config.hidden_act
        self.dtype = dtype

    def transform(self, x_BPD):
        """The rows [B, P, D] that the tied decoder multiplies: dense -> activation -> LayerNorm."""
        B, P, D = x_BPD.shape
        return self.norm(activation(self.act)(self.dense(x_BPD.reshape(B * P, D)))).reshape(B, P, D)  # M = B * P

    def __call__(self, x_BPD, word_embeddings_VD):
        (B, P, D), V = x_BPD.shape, word_embeddings_VD.shape[0]
        h_MD = self.transform(x_BPD).reshape(B * P, D)
        logits_MV = jnp.einsum("md,vd->mv", h_MD.astype(self.dtype), word_embeddings_VD.astype(self.dtype),
                               preferred_element_type=jnp.float32)
        return (logits_MV + self.bias[...]).reshape(B, P, V)


class BertEncoder(nnx.Module):
    """The BERT / RoBERTa encoder (embeddings + post-LayerNorm layers) that every head builds on; its parameters
    sit at the top level (embeddings, layers) so each model's paths are those of BertForMaskedLM. execution: how
    the layers run (flaxlm.models.layer_stack.Execution; default a plain loop). A subclass may set
    embeddings_class (ELECTRA's embeddings, which end in a projection)."""
    embeddings_class = Embeddings

    def __init__(self, config, *, dtype="float32", rngs, execution=None):
        if config.hidden_size % config.num_attention_heads:
            raise UserError(f"hidden_size {config.hidden_size} is not a multiple of num_attention_heads "
                            f"{config.num_attention_heads}; fix config.json")
        activation(config.hidden_act)  # fail early on an unsupported activation
        dtype = compute_dtype(dtype)
        self.embeddings = self.embeddings_class(config, dtype, rngs)
        self.execution = execution or Execution()
        self.layers = nnx.List([EncoderLayer(config, dtype, rngs, self.execution)
                                for _ in range(config.num_hidden_layers)])
        self.dtype = dtype

    def encode(self, input_ids_BL, attention_mask_BL=None, token_type_ids_BL=None, dropout_key=None,
               last_positions_BP=None, segment_ids_BL=None):
        """The last layer's output [B, L, D] (in the compute dtype), or [B, P, D] at last_positions_BP only
        (the last layer then computes only those rows); dropout_key=None is eval mode. segment_ids_BL: packed
        rows (1, 2, ... per sequence, 0 = padding): each sequence attends to itself only, positions restart."""
        if token_type_ids_BL is None:
            token_type_ids_BL = jnp.zeros_like(input_ids_BL)
        if segment_ids_BL is not None:  # the mask is [B, L, L] from here
            attention_mask_BL = segment_attention_mask(segment_ids_BL)
        x_BLD = self.embeddings(input_ids_BL, token_type_ids_BL, fold_key(dropout_key, 0), segment_ids_BL)
        layers = list(self.layers)
        uniform = layers if last_positions_BP is None or not layers else layers[:-1]  # the last differs: below
        x_BLD = run_layers(uniform, x_BLD, lambda i, layer, x, _: layer(x, attention_mask_BL,
                                                                        fold_key(dropout_key, i + 1)),
                           self.execution)
        if last_positions_BP is not None:
            x_BLD = (layers[-1](x_BLD, attention_mask_BL, fold_key(dropout_key, len(layers)), last_positions_BP)
                     if layers else gather_rows(x_BLD, last_positions_BP))
        return x_BLD


class BertForMaskedLM(BertEncoder):
    """BERT or RoBERTa encoder with its masked-LM head, named as in Hugging Face's *ForMaskedLM."""

    def __init__(self, config, *, dtype="float32", rngs, execution=None):
        super().__init__(config, dtype=dtype, rngs=rngs, execution=execution)
        self.mlm_head = MlmHead(config, self.dtype, rngs)

    def __call__(self, input_ids_BL, attention_mask_BL=None, token_type_ids_BL=None, *,
                 masked_positions_BP=None, dropout_key=None, hidden=False, segment_ids_BL=None):
        """Logits (float32) [B, L, V], or [B, P, V] at masked_positions_BP; dropout_key=None is eval mode.
        With hidden=True the rows [B, L or P, D] that the tied decoder multiplies instead (see head()).
        segment_ids_BL: packed rows, each sequence computed as if alone (see encode)."""
        # Only the masked positions feed the head, so the last layer computes only their rows.
        x_BLD = self.encode(input_ids_BL, attention_mask_BL, token_type_ids_BL, dropout_key, masked_positions_BP,
                            segment_ids_BL=segment_ids_BL)
        if hidden:
            return self.mlm_head.transform(x_BLD)
        return self.mlm_head(x_BLD, self.embeddings.word.embedding[...])

    def head(self):
        """The MLM head's decoder: the word embeddings (tied) and the output bias."""
        return LMHead(self.embeddings.word.embedding[...], True, self.dtype, self.mlm_head.bias[...])


def classifier_dropout(config):
    """Hugging Face's rate for the head: config.classifier_dropout, else hidden_dropout_prob."""
    rate = getattr(config, "classifier_dropout", None)
    return config.hidden_dropout_prob if rate is None else rate


class BertForSequenceClassification(BertEncoder):
    """The encoder with BERT's or RoBERTa's sequence-classification head (see the module docstring)."""

    def __init__(self, config, *, dtype="float32", rngs, execution=None):
        super().__init__(config, dtype=dtype, rngs=rngs, execution=execution)
        D, std = config.hidden_size, config.initializer_range
        self.pooler = dense(D, D, self.dtype, std, rngs)
        self.classifier = dense(D, config.num_labels, jnp.float32, std, rngs)
        self.dropout_rate = classifier_dropout(config)
        self.dropout_first = roberta_like(config)

    def __call__(self, input_ids_BL, attention_mask_BL=None, token_type_ids_BL=None, *, dropout_key=None):
        """float32 logits [B, num_labels] (one column for regression)."""
        first_B1 = jnp.zeros((input_ids_BL.shape[0], 1), jnp.int32)
        x_BD = self.encode(input_ids_BL, attention_mask_BL, token_type_ids_BL, fold_key(dropout_key, 0),
                           first_B1)[:, 0]
        if self.dropout_first:
            x_BD = dropout(x_BD, self.dropout_rate, fold_key(dropout_key, 1))
        pooled_BD = jnp.tanh(self.pooler(x_BD))
        pooled_BD = dropout(pooled_BD, self.dropout_rate, fold_key(dropout_key, 2))
        return self.classifier(pooled_BD.astype(jnp.float32))


class BertForQuestionAnswering(BertEncoder):
    """The encoder with a question-answering head: start and end logits of every token."""

    def __init__(self, config, *, dtype="float32", rngs, execution=None):
        super().__init__(config, dtype=dtype, rngs=rngs, execution=execution)
        self.qa_outputs = dense(config.hidden_size, 2, jnp.float32, config.initializer_range, rngs)

    def __call__(self, input_ids_BL, attention_mask_BL=None, token_type_ids_BL=None, *, dropout_key=None):
        """float32 (start_logits_BL, end_logits_BL)."""
        x_BLD = self.encode(input_ids_BL, attention_mask_BL, token_type_ids_BL, dropout_key)
        B, L, D = x_BLD.shape
        logits_BL2 = self.qa_outputs(x_BLD.reshape(B * L, D).astype(jnp.float32)).reshape(B, L, 2)
        return logits_BL2[..., 0], logits_BL2[..., 1]


class BertForTokenClassification(BertEncoder):
    """The encoder with a token-classification head: every token's hidden state -> dropout (classifier_dropout,
    else hidden_dropout_prob; a subclass may set another rate) -> classifier."""

    def __init__(self, config, *, dtype="float32", rngs, execution=None):
        super().__init__(config, dtype=dtype, rngs=rngs, execution=execution)
        self.classifier = dense(config.hidden_size, config.num_labels, jnp.float32, config.initializer_range, rngs)
        self.dropout_rate = classifier_dropout(config)

    def __call__(self, input_ids_BL, attention_mask_BL=None, token_type_ids_BL=None, *, dropout_key=None):
        """float32 logits [B, L, num_labels]."""
        x_BLD = self.encode(input_ids_BL, attention_mask_BL, token_type_ids_BL, fold_key(dropout_key, 0))
        x_BLD = dropout(x_BLD, self.dropout_rate, fold_key(dropout_key, 1))
        return self.classifier(x_BLD.astype(jnp.float32))


def _prefix(config):
    return "roberta." if roberta_like(config) else "bert."


def encoder_tensor_names(config, prefix=None):
    """Tensor names of the BERT / RoBERTa encoder (under bert. / roberta., or `prefix`) -> our parameter paths."""
    p = prefix or _prefix(config)
    names = [
        (f"{p}embeddings.word_embeddings.weight", ("embeddings", "word", "embedding"), "copy"),
        (f"{p}embeddings.position_embeddings.weight", ("embeddings", "position", "embedding"), "copy"),
        (f"{p}embeddings.token_type_embeddings.weight", ("embeddings", "token_type", "embedding"), "copy"),
    ]
    add_norm(names, f"{p}embeddings.LayerNorm", ("embeddings", "norm"))
    for i in range(config.num_hidden_layers):
        hf, ours = f"{p}encoder.layer.{i}.", ("layers", str(i))
        for proj in ("query", "key", "value"):
            add_linear(names, f"{hf}attention.self.{proj}", (*ours, "attn", proj))
        add_linear(names, f"{hf}attention.output.dense", (*ours, "attn", "out"))
        add_norm(names, f"{hf}attention.output.LayerNorm", (*ours, "attn_norm"))
        add_linear(names, f"{hf}intermediate.dense", (*ours, "mlp_in"))
        add_linear(names, f"{hf}output.dense", (*ours, "mlp_out"))
        add_norm(names, f"{hf}output.LayerNorm", (*ours, "mlp_norm"))
    return names


def tensor_names(config):
    """Tensor names of BertForMaskedLM / RobertaForMaskedLM (transformers 5) -> our parameter paths."""
    names = encoder_tensor_names(config)
    if roberta_like(config):
        add_linear(names, "lm_head.dense", ("mlm_head", "dense"))
        add_norm(names, "lm_head.layer_norm", ("mlm_head", "norm"))
        names.append(("lm_head.bias", ("mlm_head", "bias"), "copy"))
    else:
        add_linear(names, "cls.predictions.transform.dense", ("mlm_head", "dense"))
        add_norm(names, "cls.predictions.transform.LayerNorm", ("mlm_head", "norm"))
        names.append(("cls.predictions.bias", ("mlm_head", "bias"), "copy"))
    return names


def head_tensor_names(config, task):
    """Tensor names of Bert/RobertaForSequenceClassification, *ForQuestionAnswering or *ForTokenClassification
    -> our paths: RoBERTa's classifier.dense / classifier.out_proj are our pooler / classifier."""
    names = encoder_tensor_names(config)
    if task == "question_answering":
        add_linear(names, "qa_outputs", ("qa_outputs",))
    elif task == "token_classification":
        add_linear(names, "classifier", ("classifier",))
    elif roberta_like(config):
        add_linear(names, "classifier.dense", ("pooler",))
        add_linear(names, "classifier.out_proj", ("classifier",))
    else:
        add_linear(names, "bert.pooler.dense", ("pooler",))
        add_linear(names, "classifier", ("classifier",))
    return names


def _renamed(config, tensors):
    """Older and bare checkpoints in today's names: the model prefix added, gamma/beta renamed, buffers dropped."""
    out = {}
    for name, x in with_prefix(tensors, _prefix(config), ("embeddings", "encoder", "pooler"),
                               buffers=(".position_ids", ".token_type_ids")).items():  # buffers older versions saved
        name = re.sub(r"(LayerNorm|layer_norm)\.gamma$", r"\1.weight", name)
        out[re.sub(r"(LayerNorm|layer_norm)\.beta$", r"\1.bias", name)] = x
    return out


def normalize(config, tensors, notes):
    """Accept older and bare checkpoints: add the model prefix, rename gamma/beta, drop buffers, the pooler,
    the NSP head and tied copies of the decoder (checked equal to what we tie them to)."""
    p = _prefix(config)
    head = "lm_head." if roberta_like(config) else "cls.predictions."
    out, dropped = drop_prefixed(_renamed(config, tensors), (f"{p}pooler.", "cls.seq_relationship."))
    if dropped:
        notes.append(f"ignored {len(dropped)} tensor(s) masked-LM training does not use (pooler / next-sentence "
                     f"head): {', '.join(dropped)}")
    word = out.get(f"{p}embeddings.word_embeddings.weight")
    decoder_w = out.pop(f"{head}decoder.weight", None)
    if decoder_w is not None and word is not None and (
            decoder_w.shape != word.shape or not np.allclose(decoder_w, word)):
        raise UserError(f"tensor {head}decoder.weight differs from {p}embeddings.word_embeddings.weight; only "
                        f"checkpoints with tied input/output embeddings are supported")
    decoder_b = out.pop(f"{head}decoder.bias", None)
    if decoder_b is not None:
        out.setdefault(f"{head}bias", decoder_b)
    return out


def normalize_for_head(config, tensors, notes, task):
    """A checkpoint for fine-tuning: the pretraining heads (masked-LM, next-sentence) and a pooler the task's
    head does not use are dropped, each with a note; BERT's pooler is kept for sequence classification."""
    out, dropped = drop_prefixed(_renamed(config, tensors),
                                 ("lm_head.", "cls.predictions.", "cls.seq_relationship."))
    if dropped:
        notes.append(f"dropped the pretraining head(s) of the checkpoint ({len(dropped)} tensor(s): masked-LM / "
                     f"next-sentence), which {task.replace('_', ' ')} does not use")
    if task != "sequence_classification" or roberta_like(config):
        out, dropped = drop_prefixed(out, (f"{_prefix(config)}pooler.",))
        if dropped:
            notes.append(f"dropped the checkpoint's pooler ({', '.join(dropped)}), which "
                         f"{task.replace('_', ' ')} with {config.model_type} does not use")
    return out


# The full-size presets copy the hub's configs (roberta-base, bert-base-uncased, ...); the small ones are for tests
# and the CPU demo (RoBERTa positions start at pad_token_id + 1: 2 extra). One table for both families.
_ROBERTA = dict(model_type="roberta", vocab_size=50265, max_position_embeddings=514, type_vocab_size=1,
                layer_norm_eps=1e-5, pad_token_id=1, bos_token_id=0, eos_token_id=2, hidden_act="gelu",
                hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, initializer_range=0.02)
_BERT = dict(model_type="bert", vocab_size=30522, max_position_embeddings=512, type_vocab_size=2,
             layer_norm_eps=1e-12, pad_token_id=0, hidden_act="gelu",
             hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, initializer_range=0.02)


def _shape(hidden, layers, heads, intermediate):
    return dict(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                intermediate_size=intermediate)


PRESETS = {
    "roberta-base": {**_ROBERTA, **_shape(768, 12, 12, 3072)},
    "roberta-large": {**_ROBERTA, **_shape(1024, 24, 16, 4096)},
    "bert-base-uncased": {**_BERT, **_shape(768, 12, 12, 3072)},
    "bert-large-uncased": {**_BERT, **_shape(1024, 24, 16, 4096)},
    "roberta-small": {**_ROBERTA, **_shape(128, 4, 4, 512), "vocab_size": 8192, "max_position_embeddings": 258},
    "roberta-tiny": {**_ROBERTA, **_shape(64, 2, 2, 256), "vocab_size": 1024, "max_position_embeddings": 130},
    "bert-tiny": {**_BERT, **_shape(64, 2, 2, 256), "vocab_size": 1024, "max_position_embeddings": 128},
}


def encoder_family(model_type, name, prefix, max_length, presets=PRESETS):
    """The Family of a BERT-architecture model type: its *ForMaskedLM (`prefix` + ForMaskedLM) and fine-tuning heads."""
    heads = {"sequence_classification": Head(BertForSequenceClassification, f"{prefix}ForSequenceClassification",
                                             ("pooler", "classifier")),
             "question_answering": Head(BertForQuestionAnswering, f"{prefix}ForQuestionAnswering", ("qa_outputs",)),
             "token_classification": Head(BertForTokenClassification, f"{prefix}ForTokenClassification",
                                          ("classifier",))}
    return Family(model_type=model_type, name=name, model=BertForMaskedLM, tensor_names=tensor_names,
                  normalize=normalize, architecture=f"{prefix}ForMaskedLM", presets=presets,
                  script="run_mlm_flax.py", max_length=max_length,
                  tie_word_embeddings=lambda config: True,  # the MLM decoder is the word embeddings
                  fresh_head="mlm_head", heads=heads, head_tensor_names=head_tensor_names,
                  normalize_for_head=normalize_for_head)


def roberta_max_length(config):
    """RoBERTa's positions start after pad_token_id: that many fewer tokens fit."""
    return config.max_position_embeddings - config.pad_token_id - 1


BERT = encoder_family("bert", "BERT", "Bert", lambda config: config.max_position_embeddings)
ROBERTA = encoder_family("roberta", "RoBERTa", "Roberta", roberta_max_length)
