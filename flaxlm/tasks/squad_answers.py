"""From start/end logits of every window back to one answer text per question.

In each window, the n_best_size highest start and end logits among the context tokens are paired; a
pair is a candidate when the end does not come before the start and it spans at most max_answer_length
tokens, scoring start + end logit. The best candidate over the question's windows is the answer: the
exact slice of the original context between its tokens' character offsets. SQuAD v2.0: the null score
is the start + end logit at the CLS position (the lowest over the windows); the answer is "" (no
answer) when it beats the best candidate's score by more than null_score_diff_threshold.
"""
import numpy as np


def best_answers(start_logits_NL, end_logits_NL, offsets_NL2, example_index_N, cls_index_N, examples, *,
                 n_best_size, max_answer_length, version_2=False, null_score_diff_threshold=0.0):
    """{question id: answer text} for every example (questions whose windows hold no candidate get "")."""
    best = {}  # example index -> (score, text)
    null = {}  # example index -> lowest null score over its windows
    for n in range(len(example_index_N)):
        e, c = int(example_index_N[n]), int(cls_index_N[n])
        null[e] = min(null.get(e, np.inf), float(start_logits_NL[n, c] + end_logits_NL[n, c]))
        found = best_span(start_logits_NL[n], end_logits_NL[n], offsets_NL2[n, :, 0] >= 0, n_best_size,
                          max_answer_length)
        if found is not None and (e not in best or found[0] > best[e][0]):
            score, i, j = found
            best[e] = (score, examples[e].context[offsets_NL2[n, i, 0]:offsets_NL2[n, j, 1]])
    answers = {}
    for e, example in enumerate(examples):
        score, text = best.get(e, (-np.inf, ""))
        if version_2 and e in null and null[e] - score > null_score_diff_threshold:
            text = ""
        answers[example.id] = text
    return answers


def best_span(start_L, end_L, context_L, n_best_size, max_answer_length):
    """(score, start token, end token) of the window's best valid span, or None when it has none."""
    starts = _top(np.where(context_L, start_L, -np.inf), n_best_size)
    ends = _top(np.where(context_L, end_L, -np.inf), n_best_size)
    if not len(starts) or not len(ends):
        return None
    score_SE = start_L[starts][:, None] + end_L[ends][None, :]
    length_SE = ends[None, :] - starts[:, None] + 1
    score_SE = np.where((length_SE >= 1) & (length_SE <= max_answer_length), score_SE, -np.inf)
    s, t = np.unravel_index(np.argmax(score_SE), score_SE.shape)
    if not np.isfinite(score_SE[s, t]):
        return None
    return float(score_SE[s, t]), int(starts[s]), int(ends[t])


def _top(x_L, k):
    """Indices of the k largest finite values of x, largest first."""
    order = np.argsort(-x_L, kind="stable")[:k]
    return order[np.isfinite(x_L[order])]
