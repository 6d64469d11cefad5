"""The official SQuAD exact-match and F1 (v1.1 and v2.0 evaluation scripts' definitions).

An answer is normalized (lowercase, punctuation removed, the articles a/an/the removed, whitespace
collapsed) before comparing; a prediction scores the best it gets against any of the gold answers.
SQuAD v2.0: a question without an answer has the one gold answer "", which only the empty prediction
matches (exact and F1 both 1).
"""
import collections
import re
import string

_PUNCTUATION = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(s):
    s = "".join(ch for ch in s.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", s).split())


def exact_match(prediction, gold):
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1(prediction, gold):
    """Token-overlap F1 of the normalized answers; an empty answer scores 1 against an empty one, else 0."""
    pred_tokens, gold_tokens = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not pred_tokens or not gold_tokens:
        return float(pred_tokens == gold_tokens)
    same = sum((collections.Counter(pred_tokens) & collections.Counter(gold_tokens)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def gold_answers(answers):
    """The texts scored against: those that normalize to something, or [""] for a question without one."""
    return [a for a in answers if normalize_answer(a)] or [""]


def question_scores(predictions, references):
    """[(exact, f1)] of each question of `references` in order, each 0 to 1 (the best over its gold answers; a
    question without a prediction scores 0): the per-question scores squad_scores averages."""
    out = []
    for qid, answers in references.items():
        golds, pred = gold_answers(answers), predictions.get(qid)
        if pred is None:
            out.append((0.0, 0.0))
        else:
            out.append((max(exact_match(pred, g) for g in golds), max(f1(pred, g) for g in golds)))
    return out


def squad_scores(predictions, references):
    """{'exact', 'f1'} in percent over the questions of `references` ({id: [gold texts]}, [] = no answer),
    predictions {id: text} (a missing id scores 0); with unanswerable questions among them, also
    'HasAns_exact/f1' and 'NoAns_exact/f1' over each kind, as the v2.0 script reports."""
    exact, f1s = zip(*question_scores(predictions, references)) if references else ((), ())
    has_answer = [gold_answers(answers) != [""] for answers in references.values()]
    out = {"exact": _percent(exact), "f1": _percent(f1s)}
    if not all(has_answer):
        for name, keep in (("HasAns", True), ("NoAns", False)):
            idx = [i for i, h in enumerate(has_answer) if h == keep]
            if idx:
                out[f"{name}_exact"] = _percent([exact[i] for i in idx])
                out[f"{name}_f1"] = _percent([f1s[i] for i in idx])
    return out


def _percent(values):
    return 100.0 * sum(values) / len(values) if values else 0.0
