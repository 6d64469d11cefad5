"""Where words start, read off a tokenizer's vocabulary once: what whole-word masking
(flaxlm.data.whole_word_masking) needs to keep the pieces of a word together.

Two bool arrays over token ids:
  starts_word_V[t]  t opens a word:       WordPiece: t has no `##` (the continuing-subword prefix);
                                           byte-level BPE: t begins with whitespace (`Ġ` a space, `Ċ` a line break);
                                           SentencePiece (Metaspace, Unigram or BPE): t begins with `▁`
  ends_word_V[t]    the token after t opens a word: byte-level BPE: t ends in whitespace other than a space
                    (`Ċ` and the like: byte-level pre-tokenization starts a new word after a line break, while a
                    lone `Ġ` is the space before the word it precedes)
Added tokens (special or not) open a word. The vocabulary's own markers decide, never the raw text: a word is
what the tokenizer's pre-tokenizer made one (WordPiece also splits off punctuation; byte-level BPE and
SentencePiece keep `hello,` one word). A tokenizer without such markers (a character-level vocabulary, a
Python-only tokenizer) is refused with a UserError.
"""
import json

import numpy as np

from flaxlm.errors import UserError

_WHITESPACE_BYTES = b" \t\n\r\x0b\x0c"


def word_boundaries(tokenizer):
    """(starts_word_V, ends_word_V), bool [len(tokenizer)] each, for a Hugging Face fast tokenizer; UserError
    when its vocabulary does not mark word starts."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise _unmarked(tokenizer, f"a {type(tokenizer).__name__} without a tokenizers pipeline")
    spec = json.loads(backend.to_str())
    model = spec["model"]
    steps = {step["type"]: step for part in ("pre_tokenizer", "decoder") for step in _steps(spec.get(part))}
    tokens = [t or "" for t in tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))]
    ends_V = np.zeros(len(tokens), dtype=bool)
    prefix = model.get("continuing_subword_prefix")
    if model["type"] in ("WordPiece", "BPE") and prefix:
        starts_V = np.array([not t.startswith(prefix) for t in tokens], dtype=bool)
    elif model["type"] == "BPE" and "ByteLevel" in steps:
        to_char = _byte_to_char()
        space, whitespace = to_char[ord(" ")], {to_char[b] for b in _WHITESPACE_BYTES}
        starts_V = np.array([t[:1] in whitespace for t in tokens], dtype=bool)
        ends_V = np.array([t[-1:] in whitespace - {space} for t in tokens], dtype=bool)
    elif "Metaspace" in steps:
        starts_V = np.array([t.startswith(steps["Metaspace"]["replacement"]) for t in tokens], dtype=bool)
    elif model["type"] == "BPE" and model.get("end_of_word_suffix"):
        starts_V = np.zeros(len(tokens), dtype=bool)
        ends_V = np.array([t.endswith(model["end_of_word_suffix"]) for t in tokens], dtype=bool)
    else:
        raise _unmarked(tokenizer, f"a {model['type']} model whose tokens carry no word markers")
    added = [i for i in tokenizer.added_tokens_decoder if i < len(tokens)]
    starts_V[added], ends_V[added] = True, False
    return starts_V, ends_V


def _steps(component):
    """A pre-tokenizer's or decoder's steps, Sequences flattened."""
    if not component:
        return []
    if component["type"] == "Sequence":
        return [s for c in component.get("pretokenizers", component.get("decoders", [])) for s in _steps(c)]
    return [component]


def _byte_to_char():
    """Byte-level BPE's alphabet: the character standing for each byte (GPT-2's bytes_to_unicode): printable
    bytes stand for themselves, the others for chr(256 + k) in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + k) for k, b in enumerate(others)}}


def _unmarked(tokenizer, what):
    where = getattr(tokenizer, "name_or_path", "") or "(in memory)"
    return UserError(f"--whole_word_mask cannot tell where words start with the tokenizer at {where} ({what}); "
                     f"it needs WordPiece ('##'), byte-level BPE ('Ġ') or SentencePiece ('▁') pieces: train one "
                     f"with train_tokenizer.py --type wordpiece, bpe or unigram, or drop --whole_word_mask")
