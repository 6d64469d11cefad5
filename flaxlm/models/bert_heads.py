"""Fine-tuning heads on the BERT / RoBERTa encoder, computing what Hugging Face's models compute.

    BertForSequenceClassification: logits [B, num_labels] from the first token ([CLS] / <s>):
        BERT     pooler (dense, tanh) -> dropout -> classifier                  (BertForSequenceClassification)
        RoBERTa  dropout -> pooler (dense, tanh) -> dropout -> classifier       (RobertaClassificationHead)
      Our `pooler` is RoBERTa's classifier.dense and `classifier` its classifier.out_proj (hf_io maps the names).
    BertForQuestionAnswering: start and end logits [B, L] from one dense layer over every token (qa_outputs).

Both take (input_ids_BL, attention_mask_BL=None, token_type_ids_BL=None, *, dropout_key=None) and return float32;
dropout_key=None is eval mode. Parameters are float32; the encoder computes in `dtype`, the last layer of the
classifier only at the first token (the only row the head reads), the output layers in float32.
"""
import jax.numpy as jnp

from flaxlm.models.bert import BertEncoder
from flaxlm.models.layers import dense, dropout, fold_key


def classifier_dropout(config):
    """Hugging Face's rate for the head: config.classifier_dropout, else hidden_dropout_prob."""
    rate = getattr(config, "classifier_dropout", None)
    return config.hidden_dropout_prob if rate is None else rate


class BertForSequenceClassification(BertEncoder):
    def __init__(self, config, *, dtype="float32", rngs, execution=None):
        super().__init__(config, dtype=dtype, rngs=rngs, execution=execution)
        D, std = config.hidden_size, config.initializer_range
        self.pooler = dense(D, D, self.dtype, std, rngs)
        self.classifier = dense(D, config.num_labels, jnp.float32, std, rngs)
        self.dropout_rate = classifier_dropout(config)
        self.dropout_first = config.model_type == "roberta"

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
    def __init__(self, config, *, dtype="float32", rngs, execution=None):
        super().__init__(config, dtype=dtype, rngs=rngs, execution=execution)
        self.qa_outputs = dense(config.hidden_size, 2, jnp.float32, config.initializer_range, rngs)

    def __call__(self, input_ids_BL, attention_mask_BL=None, token_type_ids_BL=None, *, dropout_key=None):
        """float32 (start_logits_BL, end_logits_BL)."""
        x_BLD = self.encode(input_ids_BL, attention_mask_BL, token_type_ids_BL, dropout_key)
        B, L, D = x_BLD.shape
        logits_BL2 = self.qa_outputs(x_BLD.reshape(B * L, D).astype(jnp.float32)).reshape(B, L, 2)
        return logits_BL2[..., 0], logits_BL2[..., 1]
