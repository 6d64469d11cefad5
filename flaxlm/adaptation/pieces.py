"""What a token of a vocabulary means as text, and its pieces in another tokenizer.

Vocabularies mark word starts differently: byte-level BPE (GPT-2, RoBERTa) writes a leading space as 'Ġ' and
every byte as one printable character; SentencePiece (T5, XLM-R, Llama) writes it as '▁' and has <0xNN> byte
tokens; WordPiece (BERT) marks the other way round, a continuation with '##'. A token's meaning is its key
(text, word_start): the same key in two vocabularies is the same token, whatever their conventions.
"""
import re

BYTE_LEVEL, METASPACE, WORDPIECE, PLAIN = "byte-level", "metaspace", "wordpiece", "plain"
_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def _bytes_to_unicode():
    """GPT-2's byte -> printable character table of byte-level BPE."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


BYTE_ENCODER = _bytes_to_unicode()
BYTE_DECODER = {c: b for b, c in BYTE_ENCODER.items()}


def convention(tokenizer):
    """How the tokenizer's vocabulary marks words: WORDPIECE, BYTE_LEVEL ('Ġ'), METASPACE ('▁') or PLAIN."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and type(backend.model).__name__ == "WordPiece":
        return WORDPIECE
    vocab = tokenizer.get_vocab()
    g = sum(t.startswith("Ġ") for t in vocab)
    m = sum(t.startswith("▁") for t in vocab)
    if g and g >= m:
        return BYTE_LEVEL
    return METASPACE if m else PLAIN


def token_key(token, kind):
    """(text, word_start) of a vocabulary token. Text that is not whole UTF-8 (a byte token, half a character)
    keeps its bytes as surrogates ('surrogateescape'), so that the key gives those bytes back."""
    if kind == BYTE_LEVEL:
        start = token.startswith("Ġ")
        body = token[1:] if start else token
        if all(c in BYTE_DECODER for c in body):
            return bytes(BYTE_DECODER[c] for c in body).decode("utf-8", "surrogateescape"), start
        return body, start
    if kind == METASPACE:
        byte = _BYTE_TOKEN.match(token)
        if byte:
            return bytes([int(byte.group(1), 16)]).decode("utf-8", "surrogateescape"), False
        start = token.startswith("▁")
        return (token[1:] if start else token).replace("▁", " "), start
    if kind == WORDPIECE:
        return (token[2:], False) if token.startswith("##") and len(token) > 2 else (token, True)
    return token, False


def text_of(key):
    """The text a key stands for in running text: a word start has its leading space."""
    text, start = key
    return (" " + text) if start else text


class Pieces:
    """A tokenizer's pieces of a key: the ids its model splits the key's text into, written in its own
    convention (no pre-tokenizer run, so a word start stays one word); its unknown token left out."""

    def __init__(self, tokenizer):
        self.tokenizer, self.kind = tokenizer, convention(tokenizer)
        self.backend = getattr(tokenizer, "backend_tokenizer", None)
        self.vocab = tokenizer.get_vocab()
        self.unk = tokenizer.unk_token_id

    def __call__(self, key):
        text, start = key
        if not text:
            return []
        raw = text.encode("utf-8", "surrogateescape")
        if self.kind != BYTE_LEVEL and raw.decode("utf-8", "ignore") != text:  # bytes that are not whole characters
            byte_ids = [self.vocab.get(f"<0x{b:02X}>") for b in raw]  # SentencePiece's byte fallback, if it has it
            return byte_ids if None not in byte_ids else []
        if self.backend is None or self.kind == PLAIN:
            ids = self.tokenizer.convert_tokens_to_ids(self.tokenizer.tokenize(text_of(key)))
        elif self.kind == WORDPIECE:
            ids = self._wordpiece(text, start)
        elif self.kind == BYTE_LEVEL:
            ids = self._model(("Ġ" if start else "") + "".join(BYTE_ENCODER[b] for b in raw))
        else:
            ids = self._model(("▁" if start else "") + text.replace(" ", "▁"))
        return [i for i in ids if i is not None and i != self.unk]

    def _model(self, written):
        return [t.id for t in self.backend.model.tokenize(written)]

    def _wordpiece(self, text, start):
        if self.backend.normalizer is not None:  # BERT's lowercasing, accent stripping
            text = self.backend.normalizer.normalize_str(text)
        tokens = [t.value for t in self.backend.model.tokenize(text)]
        if tokens and not start and "##" + tokens[0] in self.vocab:
            tokens[0] = "##" + tokens[0]
        return [self.vocab.get(t) for t in tokens]
