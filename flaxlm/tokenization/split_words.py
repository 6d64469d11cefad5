"""Pre-split words (a treebank's tokens) tokenized as transformers' token-classification recipes tokenize them
(run_ner.py, run_flax_ner.py): tokenizer(words, is_split_into_words=True), each sub-token's word from the encoding's
word_ids().

    tokenizer = prefix_every_word(tokenizer)                # byte-level BPE: a space before every word
    encoded = encode_words(tokenizer, [["Kari", "bor", "i", "Oslo", "."]], max_length=128)  # [(ids, word ids)]

Byte-level BPE (RoBERTa, GPT-2, ModernBERT) marks a word's start with the space before it, so those recipes load it
with add_prefix_space=True: every word, the first one included, after a space. prefix_every_word sets that on a
loaded tokenizer, in its pre-tokenizer and in the flag save_pretrained writes, so that its export tokenizes pre-split
words, and running text, as training did. WordPiece and SentencePiece tokenizers start every word alike already. A
Python tokenizer (ByT5's bytes) has no word_ids(): transformers encodes each word alone and joins the pieces, so each
word's sub-tokens are counted that way.
"""
import json


def _prefix_space_off(node):
    """The ByteLevel steps of a pre-tokenizer's or post-processor's JSON (a Sequence's too) that add no space."""
    if not isinstance(node, dict):
        return []
    inner = [step for key in ("pretokenizers", "processors") for child in node.get(key) or []
             for step in _prefix_space_off(child)]
    own = [node] if node.get("type") in ("ByteLevel", "RobertaProcessing") and not node.get("add_prefix_space") else []
    return own + inner


def prefix_every_word(tokenizer):
    """The tokenizer (changed in place) with byte-level BPE's add_prefix_space on; any other tokenizer as it is."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return tokenizer
    state = json.loads(backend.to_str())
    if not any(s["type"] == "ByteLevel" for s in _prefix_space_off(state.get("pre_tokenizer"))):
        return tokenizer
    for step in _prefix_space_off(state.get("pre_tokenizer")) + _prefix_space_off(state.get("post_processor")):
        step["add_prefix_space"] = True
    from tokenizers import Tokenizer
    changed = Tokenizer.from_str(json.dumps(state))
    backend.pre_tokenizer, backend.post_processor = changed.pre_tokenizer, changed.post_processor
    tokenizer.add_prefix_space = True
    tokenizer.init_kwargs["add_prefix_space"] = True  # tokenizer_config.json: a class that rebuilds its steps
    return tokenizer


def encode_words(tokenizer, sentences, max_length):
    """[(input_ids, word_ids)] of each sentence (a list of words): transformers' is_split_into_words encoding,
    truncated to max_length sub-tokens; a word id per sub-token, None for special tokens."""
    enc = tokenizer(list(sentences), is_split_into_words=True, truncation=True, max_length=max_length,
                    return_attention_mask=False, verbose=False)
    if tokenizer.is_fast:
        return [(ids, enc.word_ids(i)) for i, ids in enumerate(enc["input_ids"])]
    words = [w for sentence in sentences for w in sentence]
    alone = tokenizer([[w] for w in words], is_split_into_words=True, add_special_tokens=False, verbose=False)
    counts, out = iter(len(ids) for ids in alone["input_ids"]), []
    for sentence, ids in zip(sentences, enc["input_ids"]):
        owners = [i for i, _ in enumerate(sentence) for _ in range(next(counts))]
        special = tokenizer.get_special_tokens_mask(ids, already_has_special_tokens=True)
        word_ids, k = [], 0
        for is_special in special:
            word_ids.append(None if is_special or k >= len(owners) else owners[k])
            k += not is_special
        out.append((ids, word_ids))
    return out
