"""Whole-word masking (--whole_word_mask) with the three kinds of tokenizer train_tokenizer.py makes: words masked
whole (words as the tokenizer's own word_ids and offsets give them), the masked-token rate p whatever the
words' lengths, 80/10/10, special tokens and padding untouched, packed documents apart, determinism, the error
for a tokenizer without word markers, and a tiny run of run_mlm_flax.py."""
import numpy as np
import pytest

import run_mlm_flax
from run_helpers import read_metrics
from test_run_mlm import model_dir, run_args  # noqa: F401  (model_dir: a session fixture)
from flaxlm.data.whole_word_masking import WholeWordMasker
from flaxlm.errors import UserError
from flaxlm.tokenization.word_boundaries import word_boundaries

KINDS = ["bpe", "wordpiece", "unigram"]
L = 64
P_MASK = 0.15


@pytest.fixture(scope="module")
def tokenizers(model_dir_for):
    """Each kind of tokenizer trained on the corpus by train_tokenizer.py (a <mask> added to the T5-style Unigram
    one, which has none)."""
    from transformers import AutoTokenizer
    out = {}
    for kind in KINDS:
        tok = AutoTokenizer.from_pretrained(model_dir_for(None, kind, 400))
        if tok.mask_token_id is None:
            tok.add_special_tokens({"mask_token": "<mask>"})
        out[kind] = tok
    return out


def masker_for(tok, seq_len=L, p=P_MASK):
    starts_word_V, ends_word_V = word_boundaries(tok)
    return WholeWordMasker.from_tokenizer(tok, seq_len, p, starts_word_V=starts_word_V, ends_word_V=ends_word_V)


@pytest.fixture(scope="module")
def encoded(tokenizers, corpus):
    """{kind: (ids [N, L], word ids [N, L] (-1: special token or padding), the encodings)}: the corpus's lines, one
    a row, truncated and padded to L."""
    with open(corpus["train"], encoding="utf-8") as f:
        lines = [line for line in f.read().splitlines() if line.strip()]
    out = {}
    for kind, tok in tokenizers.items():
        enc = tok(lines, truncation=True, max_length=L, padding="max_length", return_offsets_mapping=True)
        words = np.array([[-1 if w is None else w for w in enc.word_ids(i)] for i in range(len(lines))])
        out[kind] = (np.asarray(enc["input_ids"], dtype=np.int32), words, enc, lines)
    return out


def masked_positions(out, ids_BL):
    """[B, L] bool: the positions the batch masks: those in a real slot (predicted; a tenth of them keep their
    token) and those changed without a slot (masked past the slots)."""
    real_BP = out["masked_weights"] > 0
    in_slot_BL = np.zeros(ids_BL.shape, dtype=bool)
    in_slot_BL[np.nonzero(real_BP)[0], out["masked_positions"][real_BP]] = True
    return in_slot_BL | (out["input_ids"] != ids_BL)


@pytest.mark.parametrize("kind", KINDS)
def test_every_word_of_the_tokenizer_is_masked_whole_or_not_at_all(tokenizers, encoded, kind):
    tok, (ids_NL, words_NL, _, _) = tokenizers[kind], encoded[kind]
    ids_BL, words_BL = np.tile(ids_NL, (4, 1)), np.tile(words_NL, (4, 1))  # each row masked 4 times
    masked_BL = masked_positions(masker_for(tok)(ids_BL, np.random.default_rng(0)), ids_BL)
    same_word_BL = (words_BL[:, 1:] == words_BL[:, :-1]) & (words_BL[:, 1:] >= 0)
    assert not np.any(same_word_BL & (masked_BL[:, 1:] != masked_BL[:, :-1]))
    assert np.sum(same_word_BL & masked_BL[:, 1:]) > 200  # many words of several tokens were masked
    assert np.sum(~same_word_BL & (masked_BL[:, 1:] != masked_BL[:, :-1])) > 200  # neighbouring words apart
    assert not masked_BL[np.isin(ids_BL, tok.all_special_ids)].any()  # nor special tokens, nor padding


# What the masker takes for words: the text of each, read back through the tokenizer's offsets (in the text as
# given, before lowercasing), whitespace-only words left out. WordPiece splits off punctuation (as BERT's
# pre-tokenizer does); byte-level BPE and SentencePiece pieces without a word marker continue the word.
TEXT = "The statement, for if_stmt  is\nused (as loops)."
WORDS = {"bpe": ["The", "statement,", "for", "if_stmt", "is", "used", "(as", "loops)."],
         "unigram": ["The", "statement,", "for", "if_stmt", "is", "used", "(as", "loops)."],
         "wordpiece": ["The", "statement", ",", "for", "if", "_", "stmt", "is", "used", "(", "as", "loops", ")",
                       "."]}


@pytest.mark.parametrize("kind", KINDS)
def test_words_are_those_the_tokenizer_marks(tokenizers, kind):
    tok = tokenizers[kind]
    enc = tok([TEXT], return_offsets_mapping=True, padding="max_length", max_length=L)
    starts_L = masker_for(tok).word_starts(np.asarray(enc["input_ids"], dtype=np.int32))[0]
    content_L = np.isin(enc["input_ids"][0], tok.all_special_ids, invert=True)
    word_L = np.cumsum(starts_L)
    spans = {}
    for i in np.flatnonzero(content_L):
        begin, end = enc["offset_mapping"][0][i]
        lo, hi = spans.get(word_L[i], (begin, end))
        spans[word_L[i]] = (min(lo, begin), max(hi, end))
    words = [TEXT[lo:hi].strip() for lo, hi in spans.values()]
    assert [w for w in words if w] == WORDS[kind]


@pytest.mark.parametrize("name", ["XLMRobertaTokenizer", "DebertaV2Tokenizer", "ElectraTokenizer"])
def test_the_tokenizers_of_xlm_r_deberta_v3_and_electra_mark_their_words(name):
    """Built by transformers from a vocabulary (SentencePiece's `▁` for XLM-R and DeBERTa-v3, WordPiece's `##`
    for ELECTRA), they split "hello world, hellod" into the same pieces; WordPiece makes "," a word of its own."""
    import transformers
    if name == "ElectraTokenizer":
        words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "wor", "##ld", ",", "##d"]
        tok, expected = transformers.ElectraTokenizer(vocab={w: i for i, w in enumerate(words)}), [1, 1, 0, 1, 1, 0]
    else:
        words = ["<s>", "<pad>", "</s>", "<unk>", "▁hello", "▁wor", "ld", ",", "d", *"helowr", "▁"]
        tok = getattr(transformers, name)(vocab=[(w, -1.0 - i) for i, w in enumerate(words)])
        expected = [1, 1, 0, 0, 1, 0]
    ids = tok("hello world, hellod")["input_ids"][1:-1]
    assert [t.lstrip("▁#") for t in tok.convert_ids_to_tokens(ids)] == ["hello", "wor", "ld", ",", "hello", "d"]
    starts_word_V, ends_word_V = word_boundaries(tok)
    assert starts_word_V[ids].astype(int).tolist() == expected and not ends_word_V.any()


@pytest.mark.parametrize("kind", KINDS)
def test_masked_token_rate_is_p_over_a_large_batch(tokenizers, encoded, kind):
    tok, (ids_NL, _, _, _) = tokenizers[kind], encoded[kind]
    ids_BL = np.tile(ids_NL, (192, 1))  # 57,600 rows: the rate's standard deviation is 0.25% of p
    out = masker_for(tok)(ids_BL, np.random.default_rng(1))
    maskable = np.isin(ids_BL, tok.all_special_ids, invert=True).sum()
    masked, predicted = masked_positions(out, ids_BL).sum(), out["masked_weights"].sum()
    assert masked / maskable == pytest.approx(P_MASK, rel=0.01)
    assert predicted <= masked and predicted / maskable > 0.97 * P_MASK  # all but the few past the slots


def test_words_are_masked_with_probability_p_whatever_their_length():
    """A row of one-token words and one 12-token word: every position is masked p of the time."""
    V, CONT = 100, 60  # ids >= 50 continue a word
    starts_V = np.arange(V) < 50
    m = WholeWordMasker(seq_len=40, vocab_size=V, mask_token_id=4, pad_token_id=1, special_token_ids=[0, 1, 2, 3],
                        mlm_probability=P_MASK, starts_word_V=starts_V, ends_word_V=np.zeros(V, bool))
    row = [0, *range(10, 20), 20, *[CONT] * 11, *range(21, 36), 2, 1]
    ids_BL = np.tile(np.array(row, dtype=np.int32), (40_000, 1))
    freq_L = masked_positions(m(ids_BL, np.random.default_rng(2)), ids_BL).mean(axis=0)
    assert freq_L[[0, 38, 39]].max() == 0
    np.testing.assert_allclose(freq_L[1:38], P_MASK, atol=4 * np.sqrt(P_MASK * (1 - P_MASK) / 40_000))
    assert np.all(freq_L[11:23] == freq_L[11])  # the long word is masked whole


def test_the_masked_run_holds_exactly_the_words_beginning_in_the_window():
    """The vectorized run (binary search, wrap-around) against a plain loop over each row's circle, on rows of
    random words, padding, a single word and nothing maskable."""
    V, B, L = 100, 64, 24
    m = WholeWordMasker(seq_len=L, vocab_size=V, mask_token_id=4, pad_token_id=1, special_token_ids=[0, 1, 2, 3],
                        mlm_probability=0.3, starts_word_V=np.arange(V) < 50, ends_word_V=np.zeros(V, bool))
    data = np.random.default_rng(5)
    for seed in range(20):
        ids_BL = data.integers(5, V, (B, L)).astype(np.int32)
        ids_BL[data.random((B, L)) < 0.1] = 1
        ids_BL[0], ids_BL[1] = data.integers(50, V, L), 1  # one word; nothing maskable
        maskable_BL = np.take(m._maskable_V, ids_BL)
        starts_BL = m.word_starts(ids_BL)
        rng = np.random.default_rng(seed)
        layout_BL = m._shuffle(maskable_BL, rng, group_BL=np.cumsum(starts_BL, axis=1, dtype=np.int32))
        opens_BL = np.take_along_axis(starts_BL, layout_BL, axis=1)
        n_B = maskable_BL.sum(axis=1)
        state = rng.bit_generator.state
        begin_B1, count_B1 = m._window(opens_BL, n_B, rng)
        rng.bit_generator.state = state
        t_B = rng.random(B) * n_B
        for b in range(B):
            n = int(n_B[b])
            first = np.maximum.accumulate(np.where(opens_BL[b, :n], np.arange(n), 0)) if n else []
            c, k = int(np.ceil(t_B[b])) % max(n, 1), int(np.ceil(t_B[b] + 0.3 * n) - np.ceil(t_B[b]))
            chosen = sorted(j for j in range(n) if (first[j] - c) % n < k)
            run = [(begin_B1[b, 0] + i) % max(n, 1) for i in range(count_B1[b, 0])]
            assert sorted(run) == chosen and len(set(run)) == len(run)


def test_80_10_10_and_random_tokens_not_special(tokenizers, encoded):
    tok, (ids_NL, _, _, _) = tokenizers["bpe"], encoded["bpe"]
    ids_BL = np.tile(ids_NL, (16, 1))
    out = masker_for(tok)(ids_BL, np.random.default_rng(3))
    real_BP = out["masked_weights"] > 0
    new = np.take_along_axis(out["input_ids"], out["masked_positions"], 1)[real_BP]
    orig = out["masked_labels"][real_BP]
    np.testing.assert_array_equal(orig, np.take_along_axis(ids_BL, out["masked_positions"], 1)[real_BP])
    n, hit = new.size, 1 / (len(tok) - len(tok.all_special_ids))
    assert abs(np.mean(new == tok.mask_token_id) - 0.8) < 4 * np.sqrt(0.8 * 0.2 / n)
    assert abs(np.mean(new == orig) - (0.1 + 0.1 * hit)) < 4 * np.sqrt(0.1 * 0.9 / n)
    random_tokens = new[(new != tok.mask_token_id) & (new != orig)]
    assert abs(random_tokens.size / n - 0.1 * (1 - hit)) < 4 * np.sqrt(0.1 * 0.9 / n)
    assert not np.isin(random_tokens, tok.all_special_ids).any()


def test_packed_documents_never_share_a_word():
    """Two documents in one row with no special token between them: the second begins with a continuation
    piece, yet its first token starts a word of its own; the segment ids come along in the batch."""
    V, CONT = 100, 60
    m = WholeWordMasker(seq_len=12, vocab_size=V, mask_token_id=4, pad_token_id=1, special_token_ids=[0, 1, 2, 3],
                        mlm_probability=0.3, starts_word_V=np.arange(V) < 50, ends_word_V=np.zeros(V, bool))
    ids_BL = np.array([[10, CONT, CONT, CONT, CONT, CONT, CONT, 11, CONT, 1, 1, 1]], dtype=np.int32)
    seg_BL = np.array([[1, 1, 1, 1, 2, 2, 2, 2, 2, 0, 0, 0]], dtype=np.int32)
    np.testing.assert_array_equal(m.word_starts(ids_BL, seg_BL)[0], [1, 0, 0, 0, 1, 0, 0, 1, 0, 0, 0, 0])
    np.testing.assert_array_equal(m.word_starts(ids_BL)[0], [1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0])
    rows = {"input_ids": np.tile(ids_BL, (2000, 1)), "segment_ids": np.tile(seg_BL, (2000, 1))}
    out = m(rows, np.random.default_rng(4))
    masked_BL = masked_positions(out, rows["input_ids"])
    assert np.array_equal(out["segment_ids"], rows["segment_ids"]) and not masked_BL[:, 9:].any()
    first, second = masked_BL[:, 0], masked_BL[:, 4]
    assert (first & ~second).any() and (second & ~first).any()  # the documents' words are masked apart


def test_deterministic_under_the_seed(tokenizers, encoded):
    tok, (ids_NL, _, _, _) = tokenizers["unigram"], encoded["unigram"]
    m = masker_for(tok)
    a, b, c = (m(ids_NL, np.random.default_rng(seed)) for seed in (7, 7, 8))
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])
    assert not np.array_equal(a["masked_positions"], c["masked_positions"])


def test_a_tokenizer_without_word_markers_is_one_clear_error():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import ByT5Tokenizer, PreTrainedTokenizerFast
    chars = {c: i for i, c in enumerate(["<pad>", "<mask>", *"abcdefghij"])}
    backend = Tokenizer(models.BPE(chars, merges=[]))  # a character-level vocabulary: no merges, no markers
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    char_level = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", mask_token="<mask>")
    for tok in (char_level, ByT5Tokenizer()):
        with pytest.raises(UserError, match="cannot tell where words start.*train_tokenizer.py.*--whole_word_mask"):
            word_boundaries(tok)


def test_run_mlm_whole_word_mask_trains(model_dir, corpus, tmp_path, monkeypatch):  # noqa: F811
    """A tiny run with --whole_word_mask on packed lines: the whole-word masker makes its batches, the loss falls."""
    calls = []
    choose = WholeWordMasker._choose
    monkeypatch.setattr(WholeWordMasker, "_choose", lambda self, *a: calls.append(1) or choose(self, *a))
    out = tmp_path / "run"
    run_mlm_flax.main(run_args(model_dir, corpus, out, "--whole_word_mask", "--line_by_line", "--max_steps", "8",
                               "--do_eval", "false", "--per_device_train_batch_size", "2"))
    losses = [r["loss"] for r in read_metrics(out)]
    assert len(losses) == 8 and all(np.isfinite(losses)) and np.mean(losses[-3:]) < np.mean(losses[:3])
    assert len(calls) >= 8 and (out / "model.safetensors").is_file()
