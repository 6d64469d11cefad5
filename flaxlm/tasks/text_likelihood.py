"""A causal LM's score on held-out text: each document's tokens in sliding windows, and the figures that compare
across tokenizers (lm-evaluation-harness's definitions: bits per byte, byte and word perplexity).

    windows = document_windows(ids, prefix_id, max_length, stride)   # [(tokens, first), ...] for lm_scoring
    figures = text_figures(total_ll, tokens, texts)
    buckets = loss_by_position(windows, token_ll, width, max_length)  # [{from, to, tokens, loss}]

A document of n tokens is scored as [prefix] + ids (prefix: the tokenizer's BOS, else its EOS, as lm-eval's
loglikelihood_rolling does), so each of its n tokens is predicted once. A document that fits the model's context
(max_length + 1 tokens with the prefix) is one window. A longer one goes in windows of max_length + 1 tokens, each
moved `stride` tokens past the last (the last one less), each predicting only its new tokens: every token after the
first window is predicted with at least max_length - stride tokens before it (Hugging Face's perplexity guide; a
stride of max_length gives lm-eval's disjoint windows).

The loss by position splits the same predictions by the model's position that predicts them (a window's token k
is predicted at position k - 1, after k tokens of it): buckets [0, width), [width, 2 width), ... up to max_length. The
tokens a window reads only as context are in no bucket, as in no total, so the buckets' tokens add up to the
document tokens and their losses, weighted by tokens, to the loss. A context extension shows in the far buckets.
"""
import math
import re

import numpy as np


def document_windows(ids, prefix_id, max_length, stride):
    """[(tokens, first)]: windows of [prefix_id] + ids, each scoring its tokens from index `first` on."""
    if not 1 <= stride <= max_length:
        raise ValueError(f"stride {stride} is not in 1..{max_length}")
    seq = [prefix_id] + list(ids)
    if len(seq) <= max_length + 1:
        return [(seq, 1)] if len(seq) > 1 else []
    out = [(seq[:max_length + 1], 1)]
    done = max_length + 1  # tokens of seq predicted so far (including the prefix, never predicted)
    while done < len(seq):
        end = min(done + stride, len(seq))
        begin = end - (max_length + 1)
        out.append((seq[begin:end], done - begin))
        done = end
    return out


def count_words(text):
    """Words as lm-eval's wikitext task counts them for word perplexity."""
    return len(re.split(r"\s+", text))


def text_figures(total_ll, tokens, texts):
    """{loss, perplexity, bits_per_byte, byte_perplexity, bits_per_character, word_perplexity, tokens, bytes,
    characters, words, documents} from the summed log-likelihood (nats) of `tokens` predicted tokens over texts."""
    n_bytes = sum(len(t.encode("utf-8")) for t in texts)
    chars = sum(len(t) for t in texts)
    words = sum(count_words(t) for t in texts)
    nll = -float(total_ll)
    return {"loss": nll / tokens, "perplexity": math.exp(nll / tokens),
            "bits_per_byte": nll / n_bytes / math.log(2), "byte_perplexity": math.exp(nll / n_bytes),
            "bits_per_character": nll / chars / math.log(2), "word_perplexity": math.exp(nll / words),
            "tokens": int(tokens), "bytes": n_bytes, "characters": chars, "words": words, "documents": len(texts)}


def loss_by_position(windows, token_ll, width, max_length):
    """[{"from", "to", "tokens", "loss"}]: per bucket [from, to) of the model's positions (width wide, the last one
    ending at max_length), the tokens predicted there and their mean negative log-likelihood in nats (None where no
    token is). windows: [(tokens, first)]; token_ll: per window, the log-likelihoods of tokens[first:] (the scorer's
    per_token output), that of tokens[k] predicted at position k - 1."""
    positions_N = np.concatenate([np.arange(first - 1, len(tokens) - 1) for tokens, first in windows] or [[]])
    ll_N = np.concatenate([np.asarray(ll, np.float64) for ll in token_ll] or [[]])
    if len(positions_N) != len(ll_N):
        raise ValueError(f"{len(ll_N)} log-likelihoods for {len(positions_N)} scored tokens")
    edges = list(range(0, max_length, width)) + [max_length]
    which_N = positions_N.astype(np.int64) // width
    counts = np.bincount(which_N, minlength=len(edges) - 1)
    sums = np.bincount(which_N, weights=ll_N, minlength=len(edges) - 1)
    return [{"from": lo, "to": hi, "tokens": int(n), "loss": -float(s) / int(n) if n else None}
            for lo, hi, n, s in zip(edges[:-1], edges[1:], counts, sums)]
