"""Token classification (part-of-speech tags, named entities): words -> sub-token rows with their labels, the
objective the training loop runs, and the predictions file.

    rows = token_rows(splits, tokenizer, 128, names, label_all_tokens=False)   # {split: dict of numpy arrays}
    objective = token_objective(graphdef, config, scheme, names, width, pad_id)
    write_predictions(path, sentences, predicted_tags)   # word<TAB>gold<TAB>predicted, a blank line per sentence

A sentence's words are tokenized as transformers' token-classification recipes tokenize pre-split words
(flaxlm.tokenization.split_words: is_split_into_words; byte-level BPE with a space before every word, set on the
tokenizer run_token_classification.py exports). Each word's label sits on its first sub-token; the other sub-tokens
get -100 (no loss), or the word's label with label_all_tokens (Hugging Face's run_ner.py option; a
B- tag becomes I- on the later sub-tokens). Predictions and metrics are per word, read at its first sub-token.
Words past --max_seq_length are not scored (a warning says how many). The loss is the mean cross-entropy over the
labeled sub-tokens of the batch, as transformers' *ForTokenClassification computes it.
"""
import os

import jax
import jax.numpy as jnp
import numpy as np

from flaxlm.errors import UserError
from flaxlm.models import apply_model
from flaxlm.tasks.tagging_metrics import score
from flaxlm.tokenization.split_words import encode_words
from flaxlm.training.flops import encoder_mlm_train_flops
from flaxlm.training.objective import Objective

IGNORE = -100  # the label of a sub-token that has no loss (transformers' ignore_index)
ROUND_WIDTH = 8  # rows are as wide as the longest sentence, rounded up to this (at most max_seq_length)


def align_labels(word_ids, word_labels, names, label_all_tokens=False):
    """The label id of each sub-token: the word's label on its first sub-token; IGNORE on special tokens and (unless
    label_all_tokens) on a word's later sub-tokens, which with label_all_tokens get the word's label, a B-X then
    I-X when names has I-X."""
    index = {n: i for i, n in enumerate(names)}
    out, previous = [], None
    for w in word_ids:
        if w is None:
            out.append(IGNORE)
        elif w != previous:
            out.append(word_labels[w])
        elif label_all_tokens:
            name = names[word_labels[w]]
            inside = "I-" + name[2:] if name.startswith("B-") else name
            out.append(index.get(inside, word_labels[w]))
        else:
            out.append(IGNORE)
        previous = w
    return out


def token_rows(splits, tokenizer, max_seq_length, names, label_all_tokens=False):
    """{split: {"input_ids", "attention_mask", "token_type_ids", "labels" (IGNORE where no loss), "word_ids" (the
    word index at each word's first sub-token, -1 elsewhere): int32 [N, W]}}, W the longest sentence over all
    splits rounded up to ROUND_WIDTH (at most max_seq_length). An unlabeled split's labels are all IGNORE. The
    tokenizer as the export will have it (prefix_every_word)."""
    if tokenizer.pad_token_id is None:
        raise UserError("the tokenizer has no pad token, which token classification needs; use one with a pad token")
    index = {n: i for i, n in enumerate(names)}
    encoded = {split: encode_words(tokenizer, s.words, max_seq_length) for split, s in splits.items()}
    longest = max(len(ids) for enc in encoded.values() for ids, _ in enc)
    width = min(max_seq_length, -(-longest // ROUND_WIDTH) * ROUND_WIDTH)
    out = {}
    for split, enc in encoded.items():
        n, tags = len(enc), splits[split].tags
        r = {"input_ids": np.full((n, width), tokenizer.pad_token_id, np.int32),
             "attention_mask": np.zeros((n, width), np.int32), "token_type_ids": np.zeros((n, width), np.int32),
             "labels": np.full((n, width), IGNORE, np.int32), "word_ids": np.full((n, width), -1, np.int32)}
        for i, (ids, word_ids) in enumerate(enc):
            r["input_ids"][i, :len(ids)] = ids
            r["attention_mask"][i, :len(ids)] = 1
            firsts = [j for j, w in enumerate(word_ids) if w is not None and (j == 0 or word_ids[j - 1] != w)]
            r["word_ids"][i, firsts] = [word_ids[j] for j in firsts]
            if tags is not None:
                r["labels"][i, :len(ids)] = align_labels(word_ids, [index[t] for t in tags[i]], names,
                                                         label_all_tokens)
        out[split] = r
    return out


def unscored_words(sentences, rows):
    """How many words of the split have no sub-token in their row (cut by --max_seq_length): not scored."""
    return sum(len(words) for words in sentences.words) - int((rows["word_ids"] >= 0).sum())


def word_tags(outputs, names):
    """(gold, predicted): per row, the tag names of its scored words in order (gold None for unlabeled rows)."""
    gold, pred = [], []
    for labels, predicted, word_ids in zip(outputs["labels"], outputs["predictions"], outputs["word_ids"]):
        firsts = np.flatnonzero(word_ids >= 0)
        pred.append([names[k] for k in predicted[firsts]])
        gold.append([names[k] for k in labels[firsts]] if (labels[firsts] >= 0).all() and len(firsts) else None)
    return gold, pred


def token_objective(graphdef, config, scheme, names, width, pad_id):
    """Objective for run_token_classification: batches of whole sentences (rows of token_rows), one weight per
    labeled sub-token; evaluation adds the word-level metrics of `scheme` (tagging_metrics.score)."""
    def loss_sums(params, batch, dropout_key):
        logits_BLC = apply_model(graphdef, params, batch["input_ids"], batch["attention_mask"],
                                 batch["token_type_ids"], dropout_key=dropout_key)
        labels_BL, w_BL = batch["labels"], batch["weights"]
        logp_BLC = jax.nn.log_softmax(logits_BLC)
        nll_BL = -jnp.take_along_axis(logp_BLC, jnp.maximum(labels_BL, 0)[..., None], axis=-1)[..., 0]
        return {"loss_sum": jnp.sum(nll_BL * w_BL), "weight_sum": jnp.sum(w_BL)}

    def predict(params, batch):
        logits_BLC = apply_model(graphdef, params, batch["input_ids"], batch["attention_mask"],
                                 batch["token_type_ids"])
        return {"predictions": jnp.argmax(logits_BLC, axis=-1).astype(jnp.int32), "labels": batch["labels"],
                "word_ids": batch["word_ids"]}

    def collate(rows, rng):
        return {**rows, "weights": (rows["labels"] != IGNORE).astype(np.float32)}

    def metrics(outputs):
        gold, pred = word_tags(outputs, names)
        return score(scheme, gold, pred)

    # the MLM count with every position predicted, less the vocabulary projection, plus the classifier
    d, v, c = config.hidden_size, config.vocab_size, config.num_labels
    e = getattr(config, "embedding_size", None) or d
    flops = (encoder_mlm_train_flops(config, 1, width, width) - 3 * width * (2 * d * e + 2 * e * v)
             + 3 * width * 2 * d * c)
    return Objective(loss_sums=loss_sums, collate=collate, pad_id=pad_id, weights_key="weights",
                     flops_per_example=flops, tokens_per_example=width, predict=predict, metrics=metrics)


def write_predictions(path, sentences, predicted):
    """word<TAB>gold<TAB>predicted per word (gold `_` for an unlabeled split), a blank line after each sentence."""
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for i, (words, pred) in enumerate(zip(sentences.words, predicted)):
            gold = sentences.tags[i] if sentences.tags is not None else ["_"] * len(words)
            f.writelines(f"{w}\t{g}\t{p}\n" for w, g, p in zip(words, gold, pred))
            f.write("\n")
    os.replace(tmp, path)
