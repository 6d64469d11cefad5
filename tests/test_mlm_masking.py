"""BERT masking: counts, 80/10/10, layout, determinism, tokenizer hookup."""
import math
import time

import numpy as np
import pytest

from flaxlm.errors import UserError
from flaxlm.data.mlm_masking import MLMMasker

BOS, PAD, EOS, UNK, MASK = 0, 1, 2, 3, 4
SPECIALS = [BOS, PAD, EOS, UNK, MASK]
V = 100


def make_masker(seq_len=64, p=0.15):
    return MLMMasker(seq_len=seq_len, vocab_size=V, mask_token_id=MASK, pad_token_id=PAD,
                     special_token_ids=SPECIALS, mlm_probability=p)


def make_batch(B, L, seed=0):
    """Rows <s> tokens </s> <pad>..., of random lengths; row 0 full, row 1 all padding."""
    rng = np.random.default_rng(seed)
    ids_BL = rng.integers(len(SPECIALS), V, (B, L)).astype(np.int32)
    lengths_B = rng.integers(3, L + 1, B)
    lengths_B[0] = L
    ids_BL[np.arange(L)[None, :] >= lengths_B[:, None]] = PAD
    ids_BL[:, 0] = BOS
    ids_BL[np.arange(B), lengths_B - 1] = EOS
    ids_BL[1] = PAD
    return ids_BL


def maskable(ids_BL):
    return ~np.isin(ids_BL, SPECIALS)


def test_num_predictions_formula():
    for L, p in [(128, 0.15), (512, 0.15), (10, 0.5), (3, 0.1), (64, 0.3)]:
        assert make_masker(L, p).num_predictions == max(1, math.ceil(p * L))


def test_shapes_dtypes_and_layout():
    B, L = 16, 64
    m = make_masker(L)
    ids_BL = make_batch(B, L)
    out = m(ids_BL, np.random.default_rng(0))
    P = m.num_predictions
    assert out["input_ids"].shape == (B, L) and out["input_ids"].dtype == np.int32
    assert out["attention_mask"].dtype == np.int32
    np.testing.assert_array_equal(out["attention_mask"], (ids_BL != PAD).astype(np.int32))
    for key, dtype in [("masked_positions", np.int32), ("masked_labels", np.int32), ("masked_weights", np.float32)]:
        assert out[key].shape == (B, P) and out[key].dtype == dtype
    w_BP, pos_BP, lab_BP = out["masked_weights"], out["masked_positions"], out["masked_labels"]
    for b in range(B):
        k = int(w_BP[b].sum())
        assert np.all(w_BP[b, :k] == 1) and np.all(w_BP[b, k:] == 0)  # real slots first
        assert np.all(np.diff(pos_BP[b, :k]) > 0)  # ascending, distinct
        assert np.all(pos_BP[b, k:] == 0) and np.all(lab_BP[b, k:] == 0)  # empty slots


def test_exact_count_and_never_special_or_padding():
    B, L, p = 64, 64, 0.15
    m = make_masker(L, p)
    ids_BL = make_batch(B, L)
    out = m(ids_BL, np.random.default_rng(1))
    n_B = maskable(ids_BL).sum(1)
    expected_B = np.where(n_B > 0, np.maximum(1, [round(p * n) for n in n_B]), 0)
    np.testing.assert_array_equal(out["masked_weights"].sum(1), expected_B)
    real_BP = out["masked_weights"] > 0
    chosen_ids = np.take_along_axis(ids_BL, out["masked_positions"], 1)[real_BP]
    assert not np.isin(chosen_ids, SPECIALS).any()


def test_all_padding_row_has_zero_weights():
    m = make_masker(32)
    ids_BL = np.full((2, 32), PAD, dtype=np.int32)
    ids_BL[1, :3] = [BOS, 10, EOS]  # one maskable token -> exactly one prediction
    out = m(ids_BL, np.random.default_rng(0))
    assert out["masked_weights"][0].sum() == 0
    assert out["masked_weights"][1].sum() == 1 and out["masked_positions"][1, 0] == 1
    np.testing.assert_array_equal(out["input_ids"][0], ids_BL[0])


def test_labels_and_unmasked_positions():
    B, L = 32, 64
    m = make_masker(L)
    ids_BL = make_batch(B, L)
    out = m(ids_BL, np.random.default_rng(2))
    real_BP = out["masked_weights"] > 0
    pos_BP = out["masked_positions"]
    np.testing.assert_array_equal(out["masked_labels"][real_BP],
                                  np.take_along_axis(ids_BL, pos_BP, 1)[real_BP])
    chosen_BL = np.zeros((B, L), bool)
    chosen_BL[np.broadcast_to(np.arange(B)[:, None], pos_BP.shape)[real_BP], pos_BP[real_BP]] = True
    np.testing.assert_array_equal(out["input_ids"][~chosen_BL], ids_BL[~chosen_BL])


def test_80_10_10_proportions_uniform_positions_random_tokens_not_special():
    B, L = 2048, 128
    m = make_masker(L)
    ids_BL = np.random.default_rng(3).integers(len(SPECIALS), V, (B, L)).astype(np.int32)
    ids_BL[:, 0], ids_BL[:, -1] = BOS, EOS  # full rows: L - 2 maskable positions each
    out = m(ids_BL, np.random.default_rng(3))
    real_BP = out["masked_weights"] > 0
    new = np.take_along_axis(out["input_ids"], out["masked_positions"], 1)[real_BP]
    orig = out["masked_labels"][real_BP]
    n = new.size
    assert n == B * round(0.15 * (L - 2))
    frac_mask = np.mean(new == MASK)
    frac_same = np.mean(new == orig)  # includes random draws that hit the original token
    frac_random = np.mean((new != MASK) & (new != orig))
    hit = 1 / (V - len(SPECIALS))
    tol = 4 * math.sqrt(0.1 * 0.9 / n)
    assert abs(frac_mask - 0.8) < 4 * math.sqrt(0.8 * 0.2 / n)
    assert abs(frac_same - (0.1 + 0.1 * hit)) < tol
    assert abs(frac_random - 0.1 * (1 - hit)) < tol
    random_tokens = new[(new != MASK) & (new != orig)]
    assert not np.isin(random_tokens, SPECIALS).any()
    assert random_tokens.min() >= 0 and random_tokens.max() < V
    # positions 1..L-2 are chosen equally often
    counts_L = np.bincount(out["masked_positions"][real_BP], minlength=L)
    assert counts_L[0] == 0 and counts_L[L - 1] == 0
    expected = n / (L - 2)
    assert np.all(np.abs(counts_L[1:L - 1] - expected) < 6 * math.sqrt(expected))


def test_deterministic_under_seed():
    m = make_masker(64)
    ids_BL = make_batch(8, 64)
    a = m(ids_BL, np.random.default_rng(7))
    b = m(ids_BL, np.random.default_rng(7))
    c = m(ids_BL, np.random.default_rng(8))
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])
    assert not np.array_equal(a["masked_positions"], c["masked_positions"])
    np.testing.assert_array_equal(ids_BL, make_batch(8, 64))  # input not modified


def test_validation():
    with pytest.raises(UserError, match="mlm_probability"):
        make_masker(64, p=0.0)
    with pytest.raises(UserError, match="mlm_probability"):
        make_masker(64, p=1.0)
    with pytest.raises(UserError, match="mask token"):
        MLMMasker(seq_len=8, vocab_size=V, mask_token_id=None, pad_token_id=PAD, special_token_ids=SPECIALS)
    with pytest.raises(ValueError, match="shape"):
        make_masker(64)(np.zeros((2, 32), np.int32), np.random.default_rng(0))


def _tokenizer(with_mask):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<s>", "<pad>", "</s>", "<unk>"] + (["<mask>"] if with_mask else [])
    vocab = {tok: i for i, tok in enumerate(specials + ["hello", "world", "foo", "bar"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    kw = dict(bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>")
    if with_mask:
        kw["mask_token"] = "<mask>"
    return PreTrainedTokenizerFast(tokenizer_object=tok, **kw)


def test_from_tokenizer():
    m = MLMMasker.from_tokenizer(_tokenizer(with_mask=True), seq_len=16, mlm_probability=0.25)
    assert m.mask_token_id == 4 and m.pad_token_id == 1 and m.vocab_size == 9
    np.testing.assert_array_equal(np.sort(m._random_tokens), [5, 6, 7, 8])
    with pytest.raises(UserError, match="has no mask token.*train_tokenizer.py"):
        MLMMasker.from_tokenizer(_tokenizer(with_mask=False), seq_len=16)


def test_timing_printed():
    rng = np.random.default_rng(0)
    for B, L in [(32, 128), (256, 512)]:
        m = MLMMasker(seq_len=L, vocab_size=50265, mask_token_id=50264, pad_token_id=1,
                      special_token_ids=[0, 1, 2, 3, 50264])
        ids_BL = rng.integers(0, 50265, (B, L)).astype(np.int32)
        m(ids_BL, rng)
        times = []
        for _ in range(20):
            t0 = time.perf_counter()
            m(ids_BL, rng)
            times.append(time.perf_counter() - t0)
        print(f"MLMMasker B={B} L={L}: median {np.median(times) * 1e6:.0f} us")
