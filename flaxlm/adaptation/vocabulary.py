"""The rules that give each token of a new vocabulary its embedding row, as combinations of old rows.

A rule is (old ids, weights): the new row is the weighted sum of those old rows (one id with weight 1 copies it);
no rule means a fresh random row. The same rules rebuild every vocabulary-shaped tensor (input embeddings, an
untied LM head, the MLM output bias). Each rule is counted under its kind: special (a special token mapped by its
role), copied (the same token in both vocabularies), mean (FVT: the mean of the token's old pieces), focus, random.
FOCUS gives a token that its training text never shows (no auxiliary vector) the mean of its pieces; a token
without old pieces (all unknown to the old tokenizer) starts random.
"""
import re
from collections import Counter

import numpy as np

from flaxlm.adaptation.focus import focus_weights, train_aux_embeddings
from flaxlm.adaptation.pieces import Pieces, convention, token_key
from flaxlm.errors import UserError

METHODS = ("random", "overlap", "mean", "focus")
# roles in the order tried; a role the old tokenizer lacks falls back to its twin (RoBERTa's <s> is cls and bos)
ROLES = {"cls_token": "bos_token", "bos_token": "cls_token", "sep_token": "eos_token", "eos_token": "sep_token",
         "pad_token": None, "mask_token": None, "unk_token": None}
_FOCUS_BATCH = 256  # new tokens whose FOCUS weights are computed together
_SENTINEL = re.compile(r"^<extra_id_(\d+)>$")


def special_rules(new_tok, old_tok):
    """{new id: old id} for the new tokenizer's special tokens: by role (cls/bos, sep/eos, pad, mask, unk), T5's
    sentinels <extra_id_i> by number, any other special token by its string."""
    out = {}
    for role, twin in ROLES.items():
        new_id = getattr(new_tok, role + "_id", None)
        old_id = getattr(old_tok, role + "_id", None)
        if old_id is None and twin is not None:
            old_id = getattr(old_tok, twin + "_id", None)
        if new_id is not None and old_id is not None and new_id not in out:
            out[new_id] = old_id
    old_vocab = old_tok.get_vocab()
    old_sentinels = {int(m.group(1)): i for t, i in old_vocab.items() if (m := _SENTINEL.match(t))}
    for token in new_tok.all_special_tokens + [t for t in new_tok.get_vocab() if _SENTINEL.match(t)]:
        new_id = new_tok.convert_tokens_to_ids(token)
        m = _SENTINEL.match(token)
        old_id = old_sentinels.get(int(m.group(1))) if m else old_vocab.get(token)
        if new_id not in out and old_id is not None:
            out[new_id] = old_id
    return out


def check_roles(new_tok, roles):
    """UserError when the new tokenizer lacks a special token the model's objective needs."""
    missing = [r for r in roles if getattr(new_tok, r, None) is None]
    if missing:
        raise UserError(f"the new tokenizer has no {missing[0].replace('_', ' ')}, which the model needs; train it "
                        f"with train_tokenizer.py --type matching the model (e.g. bpe or wordpiece for MLM models)")


def _keys(tokenizer, skip):
    kind = convention(tokenizer)
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    return {i: token_key(t, kind) for i, t in enumerate(tokens) if i not in skip and t is not None}


def build_rules(method, new_tok, old_tok, focus_file=None, seed=0):
    """(rules {new id: (old ids, weights)}, kinds {new id: kind}) for `method` (METHODS)."""
    if method == "random":
        return {}, {}
    rules, kinds = {}, {}
    for new_id, old_id in special_rules(new_tok, old_tok).items():
        rules[new_id], kinds[new_id] = ([old_id], [1.0]), "special"
    old_special = set(old_tok.all_special_ids)
    old_by_key = {k: i for i, k in _keys(old_tok, old_special).items()}
    new_keys = _keys(new_tok, set(new_tok.all_special_ids) | set(rules))
    for new_id, key in new_keys.items():
        if key in old_by_key:
            rules[new_id], kinds[new_id] = ([old_by_key[key]], [1.0]), "copied"
    if method == "overlap":
        return rules, kinds
    rest = {i: k for i, k in new_keys.items() if i not in rules}
    if method == "focus":
        shared = {i: rules[i][0][0] for i, kind in kinds.items() if kind == "copied"}
        _add_focus(rules, kinds, rest, shared, train_aux_embeddings(focus_file, new_tok, seed=seed))
        rest = {i: k for i, k in rest.items() if i not in rules}  # tokens the text never shows: their mean
    pieces = Pieces(old_tok)
    for new_id, key in rest.items():
        ids = pieces(key)
        if ids:
            rules[new_id], kinds[new_id] = (ids, [1.0 / len(ids)] * len(ids)), "mean"
    return rules, kinds


def _add_focus(rules, kinds, rest, shared, aux):
    """FOCUS's rule for each token of `rest` that has an auxiliary vector: sparsemax over the shared tokens
    (shared: {new id: old id}) that have one."""
    shared = {i: o for i, o in shared.items() if i in aux}
    if not shared:
        raise UserError("no token shared by both vocabularies occurs in --focus_train_file; FOCUS needs some")
    new_S = list(shared)
    old_S = np.array([shared[i] for i in new_S])
    aux_SD = np.stack([aux[i] for i in new_S])
    todo = [i for i in rest if i in aux]
    for start in range(0, len(todo), _FOCUS_BATCH):
        batch = todo[start:start + _FOCUS_BATCH]
        w_BS = focus_weights(np.stack([aux[i] for i in batch]), aux_SD)
        for new_id, w_S in zip(batch, w_BS):
            keep = np.nonzero(w_S)[0]
            rules[new_id], kinds[new_id] = (old_S[keep].tolist(), w_S[keep].tolist()), "focus"


def coverage(kinds, vocab_size):
    """'copied 120, mean 80, special 5, random 95': how many rows each rule made."""
    counts = Counter(kinds.values())
    counts["random"] = vocab_size - len(kinds)
    order = ("special", "copied", "mean", "focus", "random")
    return ", ".join(f"{k} {counts[k]}" for k in order if counts[k] or k == "random")
