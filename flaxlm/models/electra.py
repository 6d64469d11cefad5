"""ELECTRA (model_type electra): BERT's post-LayerNorm encoder whose embeddings are embedding_size wide, projected
to hidden_size when the two differ, and the models on it, named as transformers names them:

    ElectraForMaskedLM               the generator: dense to embedding_size -> GELU -> LayerNorm -> the word
                                     embeddings (tied) + bias; the family's pretraining model (run_mlm_flax.py)
    ElectraForPreTraining            the discriminator: dense -> hidden_act -> one logit per token (replaced or
                                     not); create_model(config, task=DISCRIMINATOR), load_for_task(path, DISCRIMINATOR)
    ElectraForSequenceClassification the first token: dropout -> dense -> GELU -> dropout -> num_labels logits
    ElectraForQuestionAnswering      start and end logits of every token (BERT's head)
    ElectraForTokenClassification    every token: dropout -> num_labels logits (BERT's head)

The discriminator is a Head of the family (task DISCRIMINATOR, "replaced_token_detection") like the fine-tuning
heads: it is one more model on the same encoder with its own Hugging Face names, so building, loading (its head
fresh when the checkpoint lacks it), saving and the strict checks are the fine-tuning heads' machinery.
The encoder's modules and its per-layer names are BERT's (flaxlm.models.bert); parameters float32, computation in
`dtype`, LayerNorm statistics and logits float32, dropout_key=None is eval.
"""
import jax.numpy as jnp
from flax import nnx

from flaxlm.errors import UserError
from flaxlm.models.bert import (BertEncoder, BertForQuestionAnswering, BertForTokenClassification, Embeddings,
                                classifier_dropout, encoder_tensor_names)
from flaxlm.models.family import (REPLACED_TOKEN_DETECTION, Family, Head, add_linear, add_norm, drop_prefixed,
                                  same_tensor, with_prefix)
from flaxlm.models.layers import LayerNorm, LMHead, activation, dense, dropout, fold_key

DISCRIMINATOR = REPLACED_TOKEN_DETECTION  # the task of ElectraForPreTraining, the discriminator


class ElectraEmbeddings(Embeddings):
    """BERT's embeddings (word + position + token type, LayerNorm, dropout) embedding_size wide, then, when that
    is not hidden_size, the dense `project` to hidden_size (transformers' electra.embeddings_project)."""

    def __init__(self, config, dtype, rngs):
        super().__init__(config, dtype, rngs, width=config.embedding_size)
        E, D = config.embedding_size, config.hidden_size
        self.project = dense(E, D, dtype, config.initializer_range, rngs) if E != D else None

    def __call__(self, ids_BL, token_type_ids_BL, key, segment_ids_BL=None):
        x_BLE = super().__call__(ids_BL, token_type_ids_BL, key, segment_ids_BL)
        return x_BLE if self.project is None else self.project(x_BLE)


class ElectraEncoder(BertEncoder):
    """The ELECTRA encoder every ELECTRA model builds on: BertEncoder with ElectraEmbeddings."""
    embeddings_class = ElectraEmbeddings

    def __init__(self, config, *, dtype="float32", rngs, execution=None):
        if config.embedding_size <= 0:
            raise UserError(f"embedding_size {config.embedding_size} must be positive; fix config.json")
        super().__init__(config, dtype=dtype, rngs=rngs, execution=execution)


class GeneratorHead(nnx.Module):
    """The generator's rows for its tied decoder: dense (hidden_size -> embedding_size) -> GELU -> LayerNorm
    (generator_predictions); `bias` is the decoder's output bias (generator_lm_head.bias)."""

    def __init__(self, config, dtype, rngs):
        E = config.embedding_size
        self.dense = dense(config.hidden_size, E, dtype, config.initializer_range, rngs)
        self.norm = LayerNorm(E, config.layer_norm_eps, rngs)
        self.bias = nnx.Param(jnp.zeros((config.vocab_size,), jnp.float32))

    def __call__(self, x_BPD):
        """[B, P, embedding_size] from the encoder's rows [B, P, hidden_size] (one 2-D matmul)."""
        B, P, D = x_BPD.shape
        return self.norm(activation("gelu")(self.dense(x_BPD.reshape(B * P, D)))).reshape(B, P, -1)


class DenseHead(nnx.Module):
    """dropout -> dense (hidden_size -> hidden_size) -> activation -> dropout -> `out` (float32, n_out logits):
    the discriminator's head (discriminator_predictions: hidden_act, no dropout, one logit) and the
    classification head (classifier: GELU, classifier_dropout, num_labels logits)."""

    def __init__(self, config, n_out, act, dropout_rate, dtype, rngs):
        D, std = config.hidden_size, config.initializer_range
        self.dense = dense(D, D, dtype, std, rngs)
        self.out = dense(D, n_out, jnp.float32, std, rngs)
        self.act = act
        self.dropout_rate = dropout_rate

    def __call__(self, x_MD, key=None):
        x_MD = dropout(x_MD, self.dropout_rate, fold_key(key, 0))
        h_MD = dropout(activation(self.act)(self.dense(x_MD)), self.dropout_rate, fold_key(key, 1))
        return self.out(h_MD.astype(jnp.float32))


class ElectraForMaskedLM(ElectraEncoder):
    """The generator: the encoder with its masked-LM head, tied to the word embeddings."""

    def __init__(self, config, *, dtype="float32", rngs, execution=None):
        super().__init__(config, dtype=dtype, rngs=rngs, execution=execution)
        self.generator_head = GeneratorHead(config, self.dtype, rngs)

    def __call__(self, input_ids_BL, attention_mask_BL=None, token_type_ids_BL=None, *,
                 masked_positions_BP=None, dropout_key=None, hidden=False, segment_ids_BL=None):
        """Logits (float32) [B, L, V], or [B, P, V] at masked_positions_BP (the last layer then computes only
        those rows); with hidden=True the rows [B, L or P, embedding_size] that head() multiplies instead.
        segment_ids_BL: packed rows, each sequence computed as if alone (BertEncoder.encode)."""
        x_BLD = self.encode(input_ids_BL, attention_mask_BL, token_type_ids_BL, dropout_key, masked_positions_BP,
                            segment_ids_BL=segment_ids_BL)
        h_BLE = self.generator_head(x_BLD)
        return h_BLE if hidden else self.head().logits(h_BLE)

    def head(self):
        """The decoder: the word embeddings (tied) and the output bias."""
        return LMHead(self.embeddings.word.embedding[...], True, self.dtype, self.generator_head.bias[...])


class ElectraForPreTraining(ElectraEncoder):
    """The discriminator: one logit per token, positive for a token it takes for replaced."""

    def __init__(self, config, *, dtype="float32", rngs, execution=None):
        super().__init__(config, dtype=dtype, rngs=rngs, execution=execution)
        self.discriminator_head = DenseHead(config, 1, config.hidden_act, 0.0, self.dtype, rngs)

    def __call__(self, input_ids_BL, attention_mask_BL=None, token_type_ids_BL=None, *, dropout_key=None,
                 segment_ids_BL=None):
        """float32 logits [B, L]; segment_ids_BL: packed rows (BertEncoder.encode)."""
        x_BLD = self.encode(input_ids_BL, attention_mask_BL, token_type_ids_BL, dropout_key,
                            segment_ids_BL=segment_ids_BL)
        B, L, D = x_BLD.shape
        return self.discriminator_head(x_BLD.reshape(B * L, D)).reshape(B, L)


class ElectraForSequenceClassification(ElectraEncoder):
    """The encoder with ELECTRA's classification head on the first token (GELU where BERT's pooler has tanh)."""

    def __init__(self, config, *, dtype="float32", rngs, execution=None):
        super().__init__(config, dtype=dtype, rngs=rngs, execution=execution)
        self.classifier = DenseHead(config, config.num_labels, "gelu", classifier_dropout(config), self.dtype,
                                    rngs)

    def __call__(self, input_ids_BL, attention_mask_BL=None, token_type_ids_BL=None, *, dropout_key=None):
        """float32 logits [B, num_labels] (one column for regression); the last layer computes the first token only."""
        first_B1 = jnp.zeros((input_ids_BL.shape[0], 1), jnp.int32)
        x_BD = self.encode(input_ids_BL, attention_mask_BL, token_type_ids_BL, fold_key(dropout_key, 0),
                           first_B1)[:, 0]
        return self.classifier(x_BD, fold_key(dropout_key, 1))


class ElectraForQuestionAnswering(BertForQuestionAnswering):
    """The encoder with BERT's question-answering head (qa_outputs): start and end logits of every token."""
    embeddings_class = ElectraEmbeddings


class ElectraForTokenClassification(BertForTokenClassification):
    """The encoder with BERT's token-classification head (dropout -> classifier at every token)."""
    embeddings_class = ElectraEmbeddings


def electra_encoder_tensor_names(config):
    """Tensor names of the encoder (under electra.) -> our parameter paths: BERT's, and the projection."""
    names = encoder_tensor_names(config, "electra.")
    if config.embedding_size != config.hidden_size:
        add_linear(names, "electra.embeddings_project", ("embeddings", "project"))
    return names


def tensor_names(config):
    """Tensor names of ElectraForMaskedLM (transformers 5; the tied generator_lm_head.weight is not saved)."""
    names = electra_encoder_tensor_names(config)
    add_linear(names, "generator_predictions.dense", ("generator_head", "dense"))
    add_norm(names, "generator_predictions.LayerNorm", ("generator_head", "norm"))
    names.append(("generator_lm_head.bias", ("generator_head", "bias"), "copy"))
    return names


def head_tensor_names(config, task):
    """Tensor names of ElectraForPreTraining, ElectraForSequenceClassification, ElectraForQuestionAnswering,
    ElectraForTokenClassification."""
    names = electra_encoder_tensor_names(config)
    if task == DISCRIMINATOR:
        add_linear(names, "discriminator_predictions.dense", ("discriminator_head", "dense"))
        add_linear(names, "discriminator_predictions.dense_prediction", ("discriminator_head", "out"))
    elif task == "question_answering":
        add_linear(names, "qa_outputs", ("qa_outputs",))
    elif task == "token_classification":
        add_linear(names, "classifier", ("classifier",))
    else:
        add_linear(names, "classifier.dense", ("classifier", "dense"))
        add_linear(names, "classifier.out_proj", ("classifier", "out"))
    return names


WORD_EMBEDDINGS = "electra.embeddings.word_embeddings.weight"
GENERATOR_HEAD = ("generator_predictions.", "generator_lm_head.")
DISCRIMINATOR_HEAD = ("discriminator_predictions.",)


def _renamed(tensors):
    """A bare ElectraModel's tensors under electra.; the position / token type buffers older versions saved dropped."""
    return with_prefix(tensors, "electra.", ("embeddings", "embeddings_project", "encoder"),
                       buffers=(".position_ids", ".token_type_ids"))


def normalize(config, tensors, notes):
    """A checkpoint for the generator: a bare encoder's names prefixed; a discriminator's head dropped (the
    generator head then starts fresh); a saved generator_lm_head.weight must be the word embeddings (tied)."""
    out, dropped = drop_prefixed(_renamed(tensors), DISCRIMINATOR_HEAD)
    if dropped:
        notes.append(f"ignored the discriminator head of the checkpoint ({', '.join(dropped)}), which masked-LM "
                     f"training does not use")
    decoder = out.pop("generator_lm_head.weight", None)
    if decoder is not None and WORD_EMBEDDINGS in out and not same_tensor(decoder, out[WORD_EMBEDDINGS]):
        raise UserError(f"tensor generator_lm_head.weight differs from {WORD_EMBEDDINGS}; only checkpoints with "
                        f"tied input/output embeddings are supported")
    return out


def normalize_for_head(config, tensors, notes, task):
    """A checkpoint for the discriminator or a fine-tuning head: the pretraining heads the task does not use
    (the generator's; the discriminator's unless the task is DISCRIMINATOR) dropped, with a note."""
    unused = GENERATOR_HEAD if task == DISCRIMINATOR else GENERATOR_HEAD + DISCRIMINATOR_HEAD
    out, dropped = drop_prefixed(_renamed(tensors), unused)
    if dropped:
        notes.append(f"dropped the pretraining head(s) of the checkpoint ({len(dropped)} tensor(s): generator / "
                     f"discriminator), which {task.replace('_', ' ')} does not use")
    return out


# The full-size presets copy the hub's config.json of google/electra-{small,base}-{generator,discriminator} (the
# small generator is as large as its discriminator, as released); the tiny ones are for tests: a discriminator of
# width 64 and a generator of half its width sharing its embedding width, as run_electra_flax.py pairs them.
_ELECTRA = dict(model_type="electra", vocab_size=30522, max_position_embeddings=512, type_vocab_size=2,
                layer_norm_eps=1e-12, pad_token_id=0, hidden_act="gelu", hidden_dropout_prob=0.1,
                attention_probs_dropout_prob=0.1, initializer_range=0.02)
_TINY = dict(_ELECTRA, vocab_size=1024, max_position_embeddings=128)


def _shape(embedding, hidden, layers, heads, intermediate):
    return dict(embedding_size=embedding, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                intermediate_size=intermediate)


PRESETS = {
    "electra-small-generator": {**_ELECTRA, **_shape(128, 256, 12, 4, 1024)},
    "electra-small-discriminator": {**_ELECTRA, **_shape(128, 256, 12, 4, 1024)},
    "electra-base-generator": {**_ELECTRA, **_shape(768, 256, 12, 4, 1024)},
    "electra-base-discriminator": {**_ELECTRA, **_shape(768, 768, 12, 12, 3072)},
    "electra-tiny-generator": {**_TINY, **_shape(64, 32, 2, 2, 128)},
    "electra-tiny-discriminator": {**_TINY, **_shape(64, 64, 2, 2, 256)},
}

ELECTRA = Family(
    model_type="electra", name="ELECTRA", model=ElectraForMaskedLM, tensor_names=tensor_names, normalize=normalize,
    architecture="ElectraForMaskedLM", presets=PRESETS, script="run_mlm_flax.py",
    max_length=lambda config: config.max_position_embeddings,
    tie_word_embeddings=lambda config: True,  # the generator's decoder is the word embeddings
    fresh_head="generator_head",
    heads={"sequence_classification": Head(ElectraForSequenceClassification, "ElectraForSequenceClassification",
                                           ("classifier",)),
           "question_answering": Head(ElectraForQuestionAnswering, "ElectraForQuestionAnswering", ("qa_outputs",)),
           "token_classification": Head(ElectraForTokenClassification, "ElectraForTokenClassification",
                                        ("classifier",)),
           DISCRIMINATOR: Head(ElectraForPreTraining, "ElectraForPreTraining", ("discriminator_head",))},
    head_tensor_names=head_tensor_names, normalize_for_head=normalize_for_head)
