"""Seq2seq fine-tuning of the T5-style encoder-decoders (t5, mt5, umt5; ByT5 is t5): the objective the training
loop runs (teacher-forced loss; every evaluation also generates and scores), the metrics, the predictions file.

    objective = seq2seq_objective(graphdef, config, widths, opts, tokenizer, references)
    scores = text_metrics(predictions, references)        # bleu, chrf (sacrebleu), rouge1/2/L (rouge-score)
    write_predictions(path, sources, references, predictions)   # one JSON object per example

The loss is the mean cross-entropy over the real target tokens (decoder inputs: the labels shifted right, as
transformers' T5 computes them from labels). Evaluation generates with flaxlm.models.t5_generation (greedy or beam
search) inside the jitted predict step and scores the texts against the split's references.
"""
import json
import os
import re

import jax
import jax.numpy as jnp
import numpy as np

from flaxlm.errors import UserError
from flaxlm.models import apply_model, merge_model
from flaxlm.models.registry import FAMILIES
from flaxlm.models.t5 import T5ForConditionalGeneration
from flaxlm.models.t5_generation import generate
from flaxlm.training.flops import encoder_decoder_train_flops
from flaxlm.training.objective import Objective

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")


def check_seq2seq_model(config, source):
    """UserError unless config.json describes a T5-style encoder-decoder (source: where it is, for the message)."""
    family = FAMILIES.get(config.model_type)
    if family is None or not issubclass(family.model, T5ForConditionalGeneration):
        raise UserError(f"{source} holds a {config.model_type} model but run_seq2seq.py fine-tunes t5, mt5 and umt5 "
                        f"models (e.g. the export of run_t5_mlm_flax.py); pass one of those")


def shift_labels(labels_BT, label_mask_BT, start_id, pad_id):
    """Decoder inputs [B, T]: the start token, then the labels but the last, padding where the labels are."""
    ids_BT = np.where(label_mask_BT == 1, labels_BT, pad_id)
    return np.concatenate([np.full((len(ids_BT), 1), start_id, np.int32), ids_BT[:, :-1]], axis=1)


def seq2seq_objective(graphdef, config, widths, opts, tokenizer, references):
    """Objective for run_seq2seq: rows of flaxlm.data.seq2seq_data.token_rows (widths: their source and target
    lengths); opts: the evaluation's GenerationOptions; references: the validation targets, by row index."""
    def loss_sums(params, batch, dropout_key):
        logits_BTV = apply_model(graphdef, params, batch["input_ids"], batch["attention_mask"],
                                 batch["decoder_input_ids"], dropout_key=dropout_key)
        labels_BT, w_BT = batch["labels"], batch["label_weights"]
        nll_BT = -jnp.take_along_axis(jax.nn.log_softmax(logits_BTV), labels_BT[..., None], axis=-1)[..., 0]
        correct_BT = (jnp.argmax(logits_BTV, axis=-1) == labels_BT).astype(jnp.float32)
        return {"loss_sum": jnp.sum(nll_BT * w_BT), "accuracy_sum": jnp.sum(correct_BT * w_BT),
                "weight_sum": jnp.sum(w_BT)}

    def predict(params, batch):
        model = merge_model(graphdef, params)
        return {"tokens": generate(model, batch["input_ids"], batch["attention_mask"], opts),
                "index": batch["index"]}

    def collate(rows, rng):
        return {**rows, "label_weights": rows["label_mask"].astype(np.float32),
                "decoder_input_ids": shift_labels(rows["labels"], rows["label_mask"], config.decoder_start_token_id,
                                                  tokenizer.pad_token_id)}

    def metrics(outputs):
        predictions = decode(tokenizer, outputs["tokens"])
        return text_metrics(predictions, [references[i] for i in outputs["index"]])

    source_len, target_len = widths
    return Objective(loss_sums=loss_sums, collate=collate, pad_id=tokenizer.pad_token_id,
                     weights_key="label_weights",
                     flops_per_example=encoder_decoder_train_flops(config, 1, source_len, target_len),
                     tokens_per_example=source_len, predict=predict, metrics=metrics)


def decode(tokenizer, tokens_NT):
    """The texts of generated token rows (special tokens and padding dropped)."""
    return [text.strip() for text in tokenizer.batch_decode(np.asarray(tokens_NT).tolist(), skip_special_tokens=True)]


class WordTokenizer:
    """rouge-score's tokenizer for any script: lowercased words (\\w+, Unicode), no stemming. rouge-score's default
    keeps only [a-z0-9], which would drop the letters of most languages but English (æ, ø, å, ...)."""

    def tokenize(self, text):
        return re.findall(r"\w+", text.lower())


def text_metrics(predictions, references):
    """{bleu, chrf, rouge1, rouge2, rougeL}, 0-100: sacrebleu's corpus BLEU and chrF, and the mean over examples of
    rouge-score's F-measures (words as WordTokenizer splits them)."""
    import sacrebleu
    from rouge_score import rouge_scorer
    out = {"bleu": sacrebleu.corpus_bleu(predictions, [references]).score,
           "chrf": sacrebleu.corpus_chrf(predictions, [references]).score}
    scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), tokenizer=WordTokenizer())
    scores = [scorer.score(ref, pred) for pred, ref in zip(predictions, references)]
    for kind in ROUGE_TYPES:
        out[kind] = 100.0 * float(np.mean([s[kind].fmeasure for s in scores])) if scores else 0.0
    return out


def copy_baseline(sources, references):
    """{bleu, chrf} of the sources themselves as the predictions: what a model that copies its input scores (for
    translation between close languages, the baseline to beat)."""
    import sacrebleu
    return {"bleu": sacrebleu.corpus_bleu(sources, [references]).score,
            "chrf": sacrebleu.corpus_chrf(sources, [references]).score}


def write_predictions(path, sources, references, predictions):
    """One JSON object per example, in order: {"source", "reference", "prediction"}."""
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for s, r, p in zip(sources, references, predictions):
            f.write(json.dumps({"source": s, "reference": r, "prediction": p}, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
