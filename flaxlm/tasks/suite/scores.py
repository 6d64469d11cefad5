"""Each kind's metric recomputed from its script's predictions file, as per-example statistics for the bootstrap.

The files follow the scripts' output contract:
  predictions_validation.tsv    index<TAB>prediction<TAB>label, a header line (run_classification.py)
  predictions_validation.conll  word<TAB>gold<TAB>predicted, a blank line after each sentence (run_token_classification.py)
  predictions_validation.jsonl  {"source", "reference", "prediction"} per example (run_seq2seq.py)
  predictions.json              {question id: answer} (run_qa.py), scored against the SQuAD validation file
  predictions_validation.jsonl  {"gold", "prediction", ...} (run_fewshot.py, choice), {"source", "reference",
                                "prediction", ...} (run_fewshot.py, generate), {"log_likelihood", "tokens", "bytes"}
                                per document (evaluate_lm.py)

The metrics are the scripts' own: accuracy and macro F1 as scikit-learn computes them, seqeval's entity-level
precision/recall/F1 (default mode), sacrebleu's corpus chrF and BLEU, SQuAD's exact match and F1; each in percent.
"""
import json

import numpy as np

from flaxlm.errors import UserError
from flaxlm.tasks.squad_metric import question_scores
from flaxlm.tasks.suite.bootstrap import Scored


# ---------------------------------------------------------------------------------------------
# reading the predictions files


def read_label_predictions(path):
    """(gold labels, predicted labels) of a classification predictions file, in example order."""
    lines = _lines(path)
    header = lines[0].split("\t") if lines else []
    if "label" not in header or "prediction" not in header:
        raise UserError(f"{path} has no 'prediction' and 'label' columns (header {header}); the suite scores a "
                        f"labeled validation split")
    pred_col, gold_col = header.index("prediction"), header.index("label")
    rows = [line.split("\t") for line in lines[1:]]
    if any(len(r) != len(header) for r in rows):
        raise UserError(f"{path} has a line without {len(header)} tab-separated columns")
    return [r[gold_col] for r in rows], [r[pred_col] for r in rows]


def read_tagged_predictions(path):
    """[[(word, gold, predicted)] per sentence] of a CoNLL predictions file."""
    sentences, current = [], []
    for n, line in enumerate(_lines(path), 1):
        if not line.strip():
            if current:
                sentences.append(current)
            current = []
            continue
        parts = line.rsplit("\t", 2)
        if len(parts) != 3:
            raise UserError(f"{path} line {n} is not word<TAB>gold<TAB>predicted")
        current.append(tuple(parts))
    if current:
        sentences.append(current)
    return sentences


def read_generated_predictions(path):
    """[{"source", "reference", "prediction"}] of a seq2seq predictions file."""
    out = []
    for n, line in enumerate(_lines(path), 1):
        if line.strip():
            try:
                row = json.loads(line)
                out.append({key: str(row[key]) for key in ("source", "reference", "prediction")})
            except (ValueError, KeyError, TypeError):
                raise UserError(f"{path} line {n} is not a JSON object with source, reference and prediction") \
                    from None
    return out


def read_json_lines(path, keys, what):
    """[{key: value}] of a JSON-lines predictions file whose every line has `keys` (what: for the error)."""
    out = []
    for n, line in enumerate(_lines(path), 1):
        if line.strip():
            try:
                row = json.loads(line)
                out.append({key: row[key] for key in keys})
            except (ValueError, KeyError, TypeError):
                raise UserError(f"{path} line {n} is not a JSON object with {', '.join(keys)} ({what})") from None
    return out


def _lines(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read the predictions file {path} ({e})") from None


# ---------------------------------------------------------------------------------------------
# the metrics as per-example statistics


def class_scored(golds, preds, classes, metric):
    """Accuracy, macro F1 (the mean of every class's F1, classes with no example scoring 0, as scikit-learn
    with zero_division=0) or the Matthews correlation (scikit-learn's, multiclass; 0 where it is undefined) of
    predicted labels: each example a one-hot cell of the confusion matrix."""
    index = {c: i for i, c in enumerate(dict.fromkeys([*classes, *golds, *preds]))}
    c = len(index)
    cell_N = np.array([index[g] * c + index[p] for g, p in zip(golds, preds)], np.int64)
    stats_NK = np.zeros((len(cell_N), c * c), np.float64)
    stats_NK[np.arange(len(cell_N)), cell_N] = 1.0

    def score(stats_K):
        confusion_CC = stats_K.reshape(c, c)  # [gold, predicted]
        if metric == "accuracy":
            return 100.0 * np.trace(confusion_CC) / max(confusion_CC.sum(), 1.0)
        if metric == "mcc":
            n, gold_C, pred_C = confusion_CC.sum(), confusion_CC.sum(axis=1), confusion_CC.sum(axis=0)
            denominator = np.sqrt((n * n - pred_C @ pred_C) * (n * n - gold_C @ gold_C))
            return 100.0 * (np.trace(confusion_CC) * n - pred_C @ gold_C) / denominator if denominator else 0.0
        tp_C = np.diag(confusion_CC)
        wrong_C = confusion_CC.sum(axis=0) + confusion_CC.sum(axis=1) - 2 * tp_C  # false positives + negatives
        f1_C = np.divide(2 * tp_C, 2 * tp_C + wrong_C, out=np.zeros(c), where=(2 * tp_C + wrong_C) > 0)
        return 100.0 * f1_C[:len(classes) or c].mean()

    return Scored(stats_NK, score)


def tag_accuracy_scored(gold_tags, predicted_tags):
    """Token accuracy over sentences ([[tag]] each): per sentence (correct tokens, tokens)."""
    stats_NK = np.array([[sum(g == p for g, p in zip(gs, ps)), len(gs)] for gs, ps in zip(gold_tags, predicted_tags)],
                        np.float64).reshape(-1, 2)
    return Scored(stats_NK, lambda s: 100.0 * s[0] / max(s[1], 1.0))


def entity_scored(gold_tags, predicted_tags, metric):
    """seqeval's micro-averaged entity precision, recall or F1 (default mode, IOB/IOB2): per sentence (entities
    found right, entities predicted, gold entities)."""
    from seqeval.metrics.sequence_labeling import get_entities
    rows = []
    for gs, ps in zip(gold_tags, predicted_tags):
        gold, pred = set(get_entities(list(gs))), set(get_entities(list(ps)))
        rows.append([len(gold & pred), len(pred), len(gold)])
    stats_NK = np.array(rows, np.float64).reshape(-1, 3)

    def score(stats_K):
        tp, n_pred, n_gold = stats_K
        precision = tp / n_pred if n_pred else 0.0
        recall = tp / n_gold if n_gold else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        return 100.0 * {"precision": precision, "recall": recall, "f1": f1}[metric]

    return Scored(stats_NK, score)


def generation_scored(hypotheses, references, metric):
    """sacrebleu's corpus chrF or BLEU (default settings): per example, sacrebleu's own sentence statistics (the
    n-gram matches and totals its corpus score sums)."""
    from sacrebleu.metrics import BLEU, CHRF
    scorer = CHRF() if metric == "chrf" else BLEU()
    stats_NK = np.array(scorer._extract_corpus_statistics(list(hypotheses), [list(references)]), np.int64)
    return Scored(stats_NK, lambda s: float(scorer._compute_score_from_stats([int(x) for x in s]).score))


def bits_per_byte_scored(documents):
    """Bits per byte of the documents ({"log_likelihood", "bytes"} each, as evaluate_lm.py writes them): per
    document (-log-likelihood in nats, bytes). Lower is better."""
    stats_NK = np.array([[-float(d["log_likelihood"]), float(d["bytes"])] for d in documents], np.float64)
    return Scored(stats_NK.reshape(-1, 2), lambda s: float(s[0] / max(s[1], 1.0) / np.log(2)))


def squad_scored(predictions, references, metric):
    """SQuAD exact match or F1: per question its score (0 to 1) and a count."""
    stats_NK = np.array([[exact, f1, 1.0] for exact, f1 in question_scores(predictions, references)],
                        np.float64).reshape(-1, 3)
    column = {"exact": 0, "f1": 1}[metric]
    return Scored(stats_NK, lambda s: 100.0 * s[column] / max(s[2], 1.0))
