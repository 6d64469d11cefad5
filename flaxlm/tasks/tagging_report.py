"""After training, one split judged: the model's word-level scores and per-label report beside the
most-frequent-tag-per-word baseline's, printed and written to OUTPUT_DIR/report_{split}.txt, and every word's
prediction in OUTPUT_DIR/predictions_{split}.conll (word<TAB>gold<TAB>predicted, a blank line after each sentence).

Both are scored on the same words: those the rows hold (a word past --max_seq_length gets the baseline's tag in
the predictions file and is not scored).
"""
import os

import numpy as np

from flaxlm.tasks.tagging_metrics import report, score
from flaxlm.tasks.token_classification import word_tags, write_predictions
from flaxlm.training import mesh as meshlib
from flaxlm.training.evaluation import collect_predictions, describe_metrics


def sentence_predictions(outputs, sentences, names, baseline):
    """Every word's predicted tag, per sentence: the model's where the row holds the word, else the baseline's."""
    out = []
    for words, predicted, word_ids in zip(sentences.words, outputs["predictions"], outputs["word_ids"]):
        tags = baseline.tags(words)
        for j in np.flatnonzero(word_ids >= 0):
            tags[word_ids[j]] = names[predicted[j]]
        out.append(tags)
    return out


def scored_words(outputs, sentences):
    """Per sentence, its words that the model scored (those with a sub-token in the row), in order."""
    return [[words[k] for k in word_ids[word_ids >= 0]] for words, word_ids in zip(sentences.words,
                                                                                   outputs["word_ids"])]


def judge_split(split, params, objective, rows, sentences, names, scheme, baseline, eval_batch, mesh, output_dir):
    """Predict the split; print and write its report (labeled splits) and its predictions file."""
    outputs = collect_predictions(params, objective, rows, eval_batch, mesh)
    if not meshlib.is_main_process():
        return
    if sentences.tags is not None:
        gold, predicted = word_tags(outputs, names)
        base = [baseline.tags(words) for words in scored_words(outputs, sentences)]
        text = (f"{split}: model {describe_metrics(score(scheme, gold, predicted))}\n"
                f"{split}: most frequent training tag per word (baseline) "
                f"{describe_metrics(score(scheme, gold, base))}\n\n"
                f"model, per label:\n{report(scheme, gold, predicted)}\n"
                f"baseline, per label:\n{report(scheme, gold, base)}")
        print(text, flush=True)
        path = os.path.join(output_dir, f"report_{split}.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"wrote the {split} report to {path}", flush=True)
    path = os.path.join(output_dir, f"predictions_{split}.conll")
    write_predictions(path, sentences, sentence_predictions(outputs, sentences, names, baseline))
    print(f"wrote the {split} predictions to {path}", flush=True)
