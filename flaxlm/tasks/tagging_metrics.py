"""What a tagger scores, per word: accuracy for tags (part of speech); for BIO/BIO2 entity tags also entity-level
precision, recall and F1 as `seqeval` computes them (its default, conlleval-compatible mode: the numbers NER
papers cite), a per-label report, and the most-frequent-tag-per-word baseline a tagger must beat.

    scheme = resolve_scheme(args.metric, names)       # "seqeval" for BIO tags, else "accuracy"
    score(scheme, gold, predicted)                    # {"accuracy": .., "precision": .., "recall": .., "f1": ..}
    print(report(scheme, gold, predicted))            # seqeval's classification_report, or per-tag counts
    baseline = MostFrequentTag(train_sentences); baseline.tags(words)
"""
import re
from collections import Counter, defaultdict

from flaxlm.errors import UserError

SCHEMES = ("seqeval", "accuracy")
_BIO = re.compile(r"(O|[BI]-.+)$")


def is_bio(names):
    """Whether the tags are BIO/BIO2 entity tags: O, B-X and I-X only, with some B-."""
    return all(_BIO.match(n) for n in names) and any(n.startswith("B-") for n in names)


def resolve_scheme(metric, names):
    """--metric seqeval or accuracy, or None: seqeval when the tags are BIO (is_bio), else accuracy."""
    if metric is None:
        return "seqeval" if is_bio(names) else "accuracy"
    if metric not in SCHEMES:
        raise UserError(f"--metric {metric} is not a token-classification metric; use {' or '.join(SCHEMES)}")
    if metric == "seqeval" and not is_bio(names):
        raise UserError(f"--metric seqeval scores BIO entity tags (O, B-X, I-X), but the tags are "
                        f"{', '.join(names[:8])}{', ...' if len(names) > 8 else ''}; use --metric accuracy")
    return metric


def _labeled(gold, predicted):
    pairs = [(g, p) for g, p in zip(gold, predicted) if g is not None]
    return [g for g, _ in pairs], [p for _, p in pairs]


def score(scheme, gold, predicted):
    """{metric: value} over the sentences' words (gold, predicted: lists of tag lists; gold None: unlabeled,
    skipped): accuracy, and seqeval's entity-level precision / recall / F1 for scheme seqeval."""
    gold, predicted = _labeled(gold, predicted)
    words = sum(len(g) for g in gold)
    correct = sum(a == b for g, p in zip(gold, predicted) for a, b in zip(g, p))
    out = {"accuracy": correct / max(words, 1)}
    if scheme == "seqeval":
        from seqeval.metrics import f1_score, precision_score, recall_score
        out.update(precision=float(precision_score(gold, predicted, zero_division=0)),
                   recall=float(recall_score(gold, predicted, zero_division=0)),
                   f1=float(f1_score(gold, predicted, zero_division=0)))
    return out


def report(scheme, gold, predicted):
    """The per-label report: seqeval's classification_report (per entity type) for scheme seqeval; else each tag's
    gold count, predicted count, correct words and accuracy (correct / gold), most frequent first."""
    gold, predicted = _labeled(gold, predicted)
    if scheme == "seqeval":
        from seqeval.metrics import classification_report
        return classification_report(gold, predicted, digits=4, zero_division=0)
    counts = defaultdict(lambda: [0, 0, 0])
    for g, p in zip(gold, predicted):
        for a, b in zip(g, p):
            counts[a][0] += 1
            counts[b][1] += 1
            counts[a][2] += a == b
    lines = [f"{'tag':>12} {'gold':>8} {'predicted':>9} {'correct':>8} {'accuracy':>8}"]
    for tag, (n, m, ok) in sorted(counts.items(), key=lambda kv: (-kv[1][0], kv[0])):
        lines.append(f"{tag:>12} {n:>8} {m:>9} {ok:>8} {ok / n if n else 0.0:>8.4f}")
    return "\n".join(lines) + "\n"


class MostFrequentTag:
    """The baseline: each word's most frequent tag in the training sentences (ties: the tag seen first), and the
    most frequent tag overall for a word not seen there."""

    def __init__(self, sentences):
        by_word, overall = defaultdict(Counter), Counter()
        for words, tags in zip(sentences.words, sentences.tags):
            for w, t in zip(words, tags):
                by_word[w][t] += 1
                overall[t] += 1
        self.default = overall.most_common(1)[0][0]
        self.best = {w: c.most_common(1)[0][0] for w, c in by_word.items()}

    def tags(self, words):
        return [self.best.get(w, self.default) for w in words]
