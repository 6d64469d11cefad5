"""T5 span corruption: the length rule against the collator, round trips, counts, layout, randomness,
determinism and the tokenizer hookup."""
import itertools
import math
from collections import Counter

import numpy as np
import pytest

from flaxlm.errors import UserError
from flaxlm.data.span_corruption import SpanCorruptor, corrupted_lengths, span_counts, t5_lengths

PAD, EOS = 0, 1
FIRST_SENTINEL = 32099

DENSITIES = [0.01, 0.05, 0.15, 0.3, 0.5, 0.7, 0.9, 0.99]
SPANS = [1, 1.5, 2, 3, 5, 10]
INPUT_LENGTHS = [8, 16, 64, 128, 512, 513]


def make(inputs_length=64, d=0.15, mu=3.0, **kw):
    return SpanCorruptor(inputs_length=inputs_length, noise_density=d, mean_noise_span_length=mu, eos_token_id=EOS,
                         pad_token_id=PAD, first_sentinel_id=FIRST_SENTINEL, **kw)


def text_rows(c, B, seed=0):
    """Random text ids below the lowest sentinel, with 0 (= pad), 1 (= EOS) and ids just below the
    sentinels over-represented."""
    rng = np.random.default_rng(seed)
    top = FIRST_SENTINEL - c.num_spans + 1  # lowest sentinel
    ids_BR = rng.integers(0, top, (B, c.raw_length))
    pick_BR = rng.random((B, c.raw_length))
    ids_BR[pick_BR < 0.2] = 0
    ids_BR[(pick_BR >= 0.2) & (pick_BR < 0.3)] = 1
    ids_BR[pick_BR > 0.9] = top - 1 - rng.integers(0, 3, (B, c.raw_length))[pick_BR > 0.9]
    return ids_BR.astype(np.int32)


def rebuild(c, out, b):
    """The raw chunk of row b from its input and target: each sentinel in the input is replaced by the
    tokens after the same sentinel in the target."""
    n_in = int(out["attention_mask"][b].sum())
    inp, lab = out["input_ids"][b, :n_in], out["labels"][b]
    assert inp[-1] == EOS and lab[-1] == EOS
    is_sent = lambda t: FIRST_SENTINEL - c.num_spans < t <= FIRST_SENTINEL  # noqa: E731
    starts = [i for i, t in enumerate(lab[:-1]) if is_sent(t)] + [len(lab) - 1]
    spans = {int(lab[s]): list(lab[s + 1:e]) for s, e in zip(starts, starts[1:])}
    raw = []
    for t in inp[:-1]:
        raw.extend(spans.pop(int(t)) if is_sent(t) else [int(t)])
    assert not spans
    return np.array(raw)


def test_lengths_grid_agree_with_collator():
    inexact = 0
    for d, mu, L in itertools.product(DENSITIES, SPANS, INPUT_LENGTHS):
        raw, T = t5_lengths(L, d, mu)
        n_in, n_tg = corrupted_lengths(raw, d, mu)
        assert n_in <= L and n_tg == T
        assert corrupted_lengths(raw + 1, d, mu)[0] > L  # the longest chunk that fits
        if n_in < L:  # no exact fit: the rule jumps from L - 1 to L + 1
            inexact += 1
            assert n_in == L - 1 and corrupted_lengths(raw + 1, d, mu)[0] == L + 1
        c = make(L, d, mu)
        assert (c.raw_length, c.targets_length) == (raw, T)
        out = c(text_rows(c, 2, seed=L), np.random.default_rng(0))
        assert out["input_ids"].shape == (2, L) and out["labels"].shape == (2, T)
        np.testing.assert_array_equal(out["attention_mask"].sum(1), [n_in, n_in])
        np.testing.assert_array_equal(out["input_ids"][:, n_in - 1], [EOS, EOS])
        np.testing.assert_array_equal(out["input_ids"][:, n_in:], PAD)
    assert inexact > 0  # the grid contains the no-exact-fit case


def test_input_length_never_falls_and_rises_by_at_most_two():
    for d, mu in itertools.product(DENSITIES, SPANS):
        n_R = np.array([corrupted_lengths(R, d, mu)[0] for R in range(2, 3000)])
        steps = np.diff(n_R)
        assert steps.min() >= 0 and steps.max() <= 2
        assert n_R[0] == 3  # the shortest input: one kept token, one sentinel, EOS


def test_known_lengths():
    assert t5_lengths(512, 0.15, 3.0) == (568, 114)  # Hugging Face's figures for T5's defaults
    assert t5_lengths(8, 0.5, 1.0) == (7, 8)  # 7 input tokens; a chunk of 8 would give 9
    assert t5_lengths(3, 0.5, 1.0) == (3, 4)  # 2 noise tokens in 1 span, 1 kept


def test_impossible_and_bad_arguments():
    for L in (0, 1, 2):  # the shortest possible input has 3 tokens (see the test above)
        with pytest.raises(UserError, match="--max_seq_length"):
            t5_lengths(L, 0.15, 3.0)
    for d in (0.0, 1.0, -0.1, 1.5, float("nan")):
        with pytest.raises(UserError, match="--mlm_probability"):
            t5_lengths(512, d, 3.0)
    for mu in (0.0, 0.99, -1.0, float("nan"), float("inf")):
        with pytest.raises(UserError, match="--mean_noise_span_length"):
            t5_lengths(512, 0.15, mu)
    with pytest.raises(UserError, match="--mlm_probability"):
        t5_lengths(512, 1 - 1e-9, 1.0)  # a raw chunk beyond 2**24 tokens


@pytest.mark.parametrize("d,mu,L", [(0.15, 3, 64), (0.5, 1, 33), (0.9, 1.5, 40), (0.05, 10, 128), (0.99, 1, 8),
                                    (0.3, 2, 16)])
def test_round_trip(d, mu, L):
    c = make(L, d, mu)
    ids_BR = text_rows(c, 64, seed=1)
    assert (ids_BR == 0).any() and (ids_BR == FIRST_SENTINEL - c.num_spans).any()
    out = c(ids_BR, np.random.default_rng(2))
    for b in range(len(ids_BR)):
        np.testing.assert_array_equal(rebuild(c, out, b), ids_BR[b])


def test_counts_sentinels_and_layout():
    c = make(128, 0.3, 2.5)
    N, S = span_counts(c.raw_length, 0.3, 2.5)
    assert (c.num_noise, c.num_spans) == (N, S)
    assert N == round(c.raw_length * 0.3) and S == round(N / 2.5)
    B = 32
    ids_BR = np.tile(np.arange(2, c.raw_length + 2, dtype=np.int32), (B, 1))  # unique ids: positions + 2
    out = c(ids_BR, np.random.default_rng(3))
    sentinels = list(range(FIRST_SENTINEL, FIRST_SENTINEL - S, -1))
    n_in = c.raw_length - N + S + 1
    for b in range(B):
        inp, lab = out["input_ids"][b, :n_in], out["labels"][b]
        in_sent, lab_sent = inp[inp > c.raw_length + 1], lab[lab > c.raw_length + 1]
        assert list(in_sent) == sentinels and list(lab_sent) == sentinels  # 0, 1, 2, ... in order
        assert inp[-1] == EOS and lab[-1] == EOS and lab[0] == FIRST_SENTINEL
        kept = inp[inp <= c.raw_length + 1][:-1] - 2
        noise = lab[lab <= c.raw_length + 1][:-1] - 2
        assert len(noise) == N and len(kept) == c.raw_length - N
        assert sorted(np.concatenate([kept, noise])) == list(range(c.raw_length))
        assert np.all(np.diff(kept) > 0) and np.all(np.diff(noise) > 0)
        # a sentinel stands for one maximal run of consecutive noise positions, and vice versa
        noise_R = np.isin(np.arange(c.raw_length), noise)
        runs = np.flatnonzero(noise_R[1:] & ~noise_R[:-1]) + 1
        assert len(runs) == S and not noise_R[0] and noise_R[-1]
        np.testing.assert_array_equal(inp[np.isin(inp, sentinels)], sentinels)
        for k, start in enumerate(runs):  # the token after sentinel k in the target opens run k
            assert lab[list(lab).index(sentinels[k]) + 1] == start + 2
            assert inp[list(inp).index(sentinels[k]) - 1] == start + 1  # the kept token before it
    np.testing.assert_array_equal(out["decoder_input_ids"][:, 0], PAD)
    np.testing.assert_array_equal(out["decoder_input_ids"][:, 1:], out["labels"][:, :-1])
    for key, dtype in [("input_ids", np.int32), ("attention_mask", np.int32), ("labels", np.int32),
                       ("decoder_input_ids", np.int32), ("decoder_attention_mask", np.int32),
                       ("label_weights", np.float32)]:
        assert out[key].dtype == dtype
    assert out["label_weights"].shape == out["labels"].shape and np.all(out["label_weights"] == 1)
    assert np.all(out["decoder_attention_mask"] == 1)


def test_mean_span_one_and_high_density():
    # Hugging Face's version fails here (more spans than kept tokens); we clip the span count.
    c = make(64, 0.9, 1.0)
    assert c.num_spans == c.raw_length - c.num_noise  # one span after each kept token
    out = c(text_rows(c, 8), np.random.default_rng(0))
    assert out["input_ids"].shape == (8, 64)


def test_deterministic_under_seed_and_input_untouched():
    c = make(64)
    ids_BR = text_rows(c, 8)
    before = ids_BR.copy()
    a, b, x = (c(ids_BR, np.random.default_rng(s)) for s in (7, 7, 8))
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])
    assert not np.array_equal(a["input_ids"], x["input_ids"])
    np.testing.assert_array_equal(ids_BR, before)


def test_custom_decoder_start_and_padding_rows():
    c = make(32, decoder_start_token_id=5)
    rows_BR = np.full((3, c.raw_length), PAD, dtype=np.int64)  # the eval loop's padding rows
    out = c(rows_BR, np.random.default_rng(0))
    np.testing.assert_array_equal(out["decoder_input_ids"][:, 0], 5)
    assert out["input_ids"].shape == (3, 32)
    with pytest.raises(ValueError, match="shape"):
        c(np.zeros((2, c.raw_length + 1), np.int32), np.random.default_rng(0))


def test_all_masks_equally_likely():
    # R = 10, d = 0.5, mean 2: 5 noise tokens in 2 spans, 5 kept in 2 spans: 4 x 4 equally likely masks.
    c = make(8, 0.5, 2.0, raw_length=10)
    assert (c.num_noise, c.num_spans) == (5, 2)
    B = 16000
    noise_BR, _, _ = c.noise_mask(B, np.random.default_rng(4))
    counts = Counter(map(bytes, np.packbits(noise_BR, axis=1)))
    assert len(counts) == 16
    assert all(abs(n - B / 16) < 6 * math.sqrt(B / 16) for n in counts.values())


def test_span_lengths_and_split_points_cover_everything():
    c = make(512, 0.15, 3.0)
    N, S, M = c.num_noise, c.num_spans, c.raw_length - c.num_noise
    B = 4000
    noise_BR, kept_BS, noise_BS = c.noise_mask(B, np.random.default_rng(5))
    assert np.all(noise_BR.sum(1) == N)
    lengths = np.diff(noise_BS, axis=1)
    assert lengths.min() >= 1 and abs(lengths.mean() - 3.0) < 0.1  # N / S = 85 / 28
    # a uniform composition: P(span length j) = C(N - j - 1, S - 2) / C(N - 1, S - 1)
    for j in (1, 2, 3, 5, 8):
        p = math.comb(N - j - 1, S - 2) / math.comb(N - 1, S - 1)
        n = lengths.size
        assert abs(np.mean(lengths == j) - p) < 6 * math.sqrt(p * (1 - p) / n) + 1e-3
    for k in (0, S // 2, S - 1):  # every span has the same distribution
        assert abs(lengths[:, k].mean() - N / S) < 0.3
    # every gap is a cut somewhere, for noise and kept partitions alike
    assert set(noise_BS[:, 1:-1].ravel()) == set(range(1, N))
    assert set(kept_BS[:, 1:-1].ravel()) == set(range(1, M))
    # every position but the first (always kept) and the last (always noise) is sometimes either
    frac_R = noise_BR.mean(0)
    assert frac_R[0] == 0 and frac_R[-1] == 1
    assert np.all((frac_R[1:-1] > 0) & (frac_R[1:-1] < 1))


def _tokenizer(num_sentinels, with_eos=True):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "</s>", "<unk>", "hello", "world", "foo", "bar"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    kw = dict(pad_token="<pad>", unk_token="<unk>")
    if with_eos:
        kw["eos_token"] = "</s>"
    sentinels = [f"<extra_id_{k}>" for k in reversed(range(num_sentinels))]  # <extra_id_0> last
    return PreTrainedTokenizerFast(tokenizer_object=tok, additional_special_tokens=sentinels, **kw)


def test_from_tokenizer():
    tok = _tokenizer(8)
    c = SpanCorruptor.from_tokenizer(tok, 32, 0.15, 3.0)
    assert c.first_sentinel_id == len(tok) - 1 and c.num_spans <= 8
    assert (c.eos_token_id, c.pad_token_id, c.decoder_start_token_id) == (1, 0, 0)
    ids_BR = np.random.default_rng(0).integers(0, 7, (4, c.raw_length))
    out = c(ids_BR, np.random.default_rng(0))
    assert tok.convert_ids_to_tokens(int(out["labels"][0, 0])) == "<extra_id_0>"
    assert SpanCorruptor.from_tokenizer(tok, 32, 0.15, 3.0, decoder_start_token_id=3).decoder_start_token_id == 3


def test_from_tokenizer_errors():
    with pytest.raises(UserError, match="no sentinel tokens.*--type unigram"):
        SpanCorruptor.from_tokenizer(_tokenizer(0), 32, 0.15, 3.0)
    with pytest.raises(UserError, match="has 8 sentinel tokens.*makes 28 spans.*--type unigram"):
        SpanCorruptor.from_tokenizer(_tokenizer(8), 512, 0.15, 3.0)
    with pytest.raises(UserError, match="no eos token"):
        SpanCorruptor.from_tokenizer(_tokenizer(8, with_eos=False), 32, 0.15, 3.0)
    with pytest.raises(UserError, match="--mlm_probability"):
        SpanCorruptor.from_tokenizer(_tokenizer(8), 32, 1.0, 3.0)
    with pytest.raises(UserError, match="--mean_noise_span_length"):
        SpanCorruptor.from_tokenizer(_tokenizer(8), 32, 0.15, 0.5)
    with pytest.raises(UserError, match="--max_seq_length"):
        SpanCorruptor.from_tokenizer(_tokenizer(8), 2, 0.15, 3.0)


def test_byte_tokenizer_gets_byt5s_sentinels_and_mean_span():
    """ByT5: sentinel k is byte 0xFF - k (id 258 - k, its <extra_id_*> tokens unused), spans of 20 bytes on
    average unless a mean is given; other tokenizers keep T5's 3."""
    from transformers import ByT5Tokenizer
    tok = ByT5Tokenizer()
    c = SpanCorruptor.from_tokenizer(tok, 1024, 0.15)
    assert c.mean_noise_span_length == 20.0 and c.first_sentinel_id == 258 == tok.convert_tokens_to_ids("\xff")
    assert c.num_spans == 9 and (c.eos_token_id, c.pad_token_id) == (1, 0)
    assert SpanCorruptor.from_tokenizer(tok, 1024, 0.15, 3.0).mean_noise_span_length == 3.0  # a flag set wins
    assert SpanCorruptor.from_tokenizer(_tokenizer(8), 32, 0.15).mean_noise_span_length == 3.0
    text = "Ein byte-tokenisert tekst, med æ, ø og å. " * 60
    rows = np.asarray(tok(text, add_special_tokens=False)["input_ids"][:2 * c.raw_length]).reshape(2, -1)
    out = c(rows, np.random.default_rng(0))
    sentinels = out["labels"][out["labels"] > 0xFF + 3 - c.num_spans]  # text bytes here are < 0xF7
    assert sentinels.tolist() == [258 - k for k in range(9)] * 2
    with pytest.raises(UserError, match="has 100 sentinels \\(ByT5's\\).*makes 205 spans per chunk; use a shorter"):
        SpanCorruptor.from_tokenizer(tok, 4096, 0.05, 1.0)


def test_byte_sentinels_for_fill_spans():
    """A prompt's <extra_id_k> becomes ByT5's sentinel 258 - k, and a generated target's sentinels (in order)
    become <extra_id_k> again, so that it decodes with them; other tokenizers' ids pass unchanged."""
    from transformers import ByT5Tokenizer
    from flaxlm.data.span_corruption import byte_sentinels_in, byte_sentinels_out
    tok = ByT5Tokenizer()
    prompt = tok("Oslo er <extra_id_0> i <extra_id_1>.").input_ids
    ids = byte_sentinels_in(prompt, tok)
    assert [i for i in ids if i > 255] == [258, 257] and len(ids) == len(prompt)
    target = [0, 258, *tok("hovudstaden", add_special_tokens=False).input_ids, 257, 258, 1]  # a later 258: text
    assert tok.decode(byte_sentinels_out(target, tok), skip_special_tokens=False) == \
        "<pad><extra_id_0>hovudstaden<extra_id_1></s>"
    assert byte_sentinels_in([5, 260], _tokenizer(8)) == [5, 260]
