"""--extend_vocabulary N: the old tokenizer kept whole, with N words of the new tokenizer added to it.

The added tokens are the new vocabulary's word-start tokens (a leading-space marker, or a WordPiece word) that
the old tokenizer splits into two or more pieces, the most frequent in --focus_train_file first (without it, the
lowest new ids first: BPE's earliest merges, the most frequent pairs of its training text). They are added as
transformers AddedTokens, matched as whole words before the old tokenizer's model runs (its BPE merges cannot
be extended after training without retraining); a byte-level tokenizer's token holds its leading space, as 'Ġ'
does. Each new row is the mean of the word's old pieces (FVT)."""
import copy
from collections import Counter

from flaxlm.adaptation.pieces import BYTE_LEVEL, Pieces, convention, token_key


def ranked_words(new_tok, text_file):
    """The new tokenizer's non-special ids, most useful first."""
    ids = [i for i in range(len(new_tok)) if i not in set(new_tok.all_special_ids)]
    if not text_file:
        return ids
    with open(text_file, encoding="utf-8") as f:
        counts = Counter(i for line in f
                         for i in new_tok(line.strip(), add_special_tokens=False, verbose=False)["input_ids"])
    return sorted(ids, key=lambda i: (-counts[i], i))


def extend_tokenizer(old_tok, new_tok, n, old_rows, text_file=None):
    """(the old tokenizer with n words added, rules {id: (old ids, weights)}, kinds {id: kind}); the old_rows
    rows of the old embeddings are kept (copied)."""
    from tokenizers import AddedToken
    new_kind, old_kind, pieces = convention(new_tok), convention(old_tok), Pieces(old_tok)
    known = set(old_tok.get_vocab())
    added, rules = [], {}
    for new_id in ranked_words(new_tok, text_file):
        text, start = token_key(new_tok.convert_ids_to_tokens(new_id), new_kind)
        old_ids = pieces((text, True)) if start and text.strip() and text.isprintable() else []
        content = (" " + text) if old_kind == BYTE_LEVEL else text
        if len(old_ids) < 2 or content in known:
            continue
        known.add(content)
        rules[len(old_tok) + len(added)] = (old_ids, [1.0 / len(old_ids)] * len(old_ids))
        added.append(AddedToken(content, single_word=old_kind != BYTE_LEVEL, lstrip=old_kind != BYTE_LEVEL,
                                normalized=False))
        if len(added) == n:
            break
    merged = copy.deepcopy(old_tok)
    merged.add_tokens(added)
    kinds = {i: "mean" for i in rules}
    for i in range(old_rows):
        if i not in rules:
            rules[i], kinds[i] = ([i], [1.0]), "copied"
    return merged, rules, kinds
