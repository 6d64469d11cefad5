"""--line_by_line packing: the packer, the encoder on packed rows (each sequence as if alone), masking, the data
path and run_mlm_flax.py end to end."""
import dataclasses

import jax
import numpy as np
import pytest
import transformers

import run_mlm_flax
from run_helpers import read_metrics
from test_run_mlm import model_dir, run_args  # noqa: F401  (model_dir: a session fixture)
from flaxlm.config.options import DataArgs, MaskedLMArgs, ModelArgs, TextSourceArgs, TrainingArgs
from flaxlm.config.cli import parse_args
from flaxlm.data import rows as token_rows
from flaxlm.data.rows import as_numpy_rows
from flaxlm.data.text import load_raw_text
from flaxlm.objectives.mlm import mlm_objective
from flaxlm.data.mlm_masking import MLMMasker
from flaxlm.models import create_model, merge_model, split_model
from flaxlm.data.packing import fill_rows, greedy_pack, one_per_row
from flaxlm.tokenization.trainers import train_bpe

L = 24
BOS, EOS, MASK = 2, 3, 4  # with each config's pad id, the special tokens of the tests' sequences


def sequences(n, pad_id, seed=0, vocab=99):
    """n token lists <s> x ... </s> of 3..L tokens (some of them full length), none holding a special id."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, 12, n)
    lengths[[3, 7]] = L  # full rows: a sequence that fills a row alone
    return [[BOS, *rng.integers(5, vocab, k - 2).tolist(), EOS] for k in lengths]


def unpacked_rows(seqs, pad_id):
    """Each sequence alone at the start of its own row, padded: the reference layout, written out directly."""
    return np.array([s + [pad_id] * (L - len(s)) for s in seqs], np.int32)


def reference_greedy(lengths, max_len):
    """Greedy in order, the plainest way: a list of rows, each a list of sequence indices."""
    rows, used = [], max_len + 1
    for s, n in enumerate(lengths):
        if used + n > max_len:
            rows.append([])
            used = 0
        rows[-1].append(s)
        used += n
    return rows


# ---------------------------------------------------------------------------------------------
# the packer


def test_greedy_pack_keeps_every_sequence_once_in_order():
    seqs = sequences(40, pad_id=1)
    lengths = [len(s) for s in seqs]
    row_S, start_S = greedy_pack(lengths, L)
    ids_NL, seg_NL = fill_rows(seqs, row_S, start_S, L, pad_id=1)
    expected = reference_greedy(lengths, L)
    assert len(ids_NL) == len(expected) < len(seqs)  # short lines share rows
    got = []
    for n, members in enumerate(expected):
        row, segments = [], []
        for k, s in enumerate(members, 1):
            row += seqs[s]
            segments += [k] * len(seqs[s])
            got.append(ids_NL[n][seg_NL[n] == k].tolist())
        assert len(row) <= L
        np.testing.assert_array_equal(ids_NL[n], row + [1] * (L - len(row)))  # laid end to end, then padding
        np.testing.assert_array_equal(seg_NL[n], segments + [0] * (L - len(row)))
        if n + 1 < len(expected):  # greedy: the next row's first sequence did not fit here
            assert len(row) + lengths[expected[n + 1][0]] > L
    assert got == seqs  # every sequence exactly once, in order


def test_one_per_row_is_the_unpacked_layout_and_long_sequences_are_refused():
    seqs = sequences(10, pad_id=0)
    ids_NL, seg_NL = fill_rows(seqs, *one_per_row(len(seqs)), L, pad_id=0)
    np.testing.assert_array_equal(ids_NL, unpacked_rows(seqs, 0))
    np.testing.assert_array_equal(seg_NL, (ids_NL != 0).astype(np.int32))
    with pytest.raises(ValueError, match="does not fit"):
        greedy_pack([3, L + 1], L)
    empty_ids, empty_seg = fill_rows([], *greedy_pack([], L), L, pad_id=0)
    assert empty_ids.shape == empty_seg.shape == (0, L)


# ---------------------------------------------------------------------------------------------
# the encoder: a sequence in a packed row computes what it computes alone


def tiny_config(model_type):
    cls = transformers.RobertaConfig if model_type == "roberta" else transformers.BertConfig
    return cls(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
               max_position_embeddings=L + (2 if model_type == "roberta" else 0), initializer_range=0.2)


def packed_and_unpacked(config, n=12, seed=0):
    seqs = sequences(n, config.pad_token_id, seed)
    row_S, start_S = greedy_pack([len(s) for s in seqs], L)
    ids_NL, seg_NL = fill_rows(seqs, row_S, start_S, L, config.pad_token_id)
    return seqs, row_S, start_S, ids_NL, seg_NL, unpacked_rows(seqs, config.pad_token_id)


@pytest.mark.parametrize("model_type", ["bert", "roberta"])
def test_packed_rows_give_each_sequence_its_unpacked_logits_and_hidden_states(model_type):
    config = tiny_config(model_type)
    graphdef, params = split_model(create_model(config, seed=0))
    seqs, row_S, start_S, ids_NL, seg_NL, ids_SL = packed_and_unpacked(config)
    assert len(ids_NL) < len(seqs)

    @jax.jit
    def outputs(ids_BL, segment_ids_BL=None):
        model = merge_model(graphdef, params)
        mask_BL = ids_BL != config.pad_token_id if segment_ids_BL is None else segment_ids_BL > 0
        return {"hidden": model.encode(ids_BL, mask_BL, segment_ids_BL=segment_ids_BL),
                "logits": model(ids_BL, mask_BL, segment_ids_BL=segment_ids_BL)}
    alone, packed = outputs(ids_SL), outputs(ids_NL, seg_NL)
    for s, seq in enumerate(seqs):
        cols = slice(start_S[s], start_S[s] + len(seq))
        for name in ("hidden", "logits"):
            np.testing.assert_allclose(np.asarray(packed[name][row_S[s], cols]),
                                       np.asarray(alone[name][s, :len(seq)]), atol=1e-5, rtol=0, err_msg=name)


def unpacked_batch(packed, seqs, row_S, start_S, pad_id, P):
    """The masked batch of the unpacked rows that masks exactly the tokens `packed` (a masked packed batch)
    masks, the same way: each sequence's masked slots moved to its own row."""
    S = len(seqs)
    out = {"input_ids": unpacked_rows(seqs, pad_id), "masked_positions": np.zeros((S, P), np.int32),
           "masked_labels": np.zeros((S, P), np.int32), "masked_weights": np.zeros((S, P), np.float32)}
    out["attention_mask"] = (out["input_ids"] != pad_id).astype(np.int32)
    for s, seq in enumerate(seqs):
        n, start = row_S[s], start_S[s]
        out["input_ids"][s, :len(seq)] = packed["input_ids"][n, start:start + len(seq)]
        real = packed["masked_weights"][n] > 0
        pos = packed["masked_positions"][n][real]
        mine = (pos >= start) & (pos < start + len(seq))
        k = int(mine.sum())
        out["masked_positions"][s, :k] = pos[mine] - start
        out["masked_labels"][s, :k] = packed["masked_labels"][n][real][mine]
        out["masked_weights"][s, :k] = 1.0
    return out


@pytest.mark.parametrize("model_type", ["bert", "roberta"])
def test_mlm_loss_sums_of_packed_rows_equal_those_of_unpacked_rows(model_type):
    config = tiny_config(model_type)
    graphdef, params = split_model(create_model(config, seed=1))
    seqs, row_S, start_S, ids_NL, seg_NL, _ = packed_and_unpacked(config, n=16, seed=1)
    masker = MLMMasker(seq_len=L, vocab_size=99, mask_token_id=MASK, pad_token_id=config.pad_token_id,
                       special_token_ids=[BOS, EOS], mlm_probability=0.3)
    objective = mlm_objective(graphdef, config, masker, L)
    packed = objective.collate({"input_ids": ids_NL, "segment_ids": seg_NL}, np.random.default_rng(0))
    alone = unpacked_batch(packed, seqs, row_S, start_S, config.pad_token_id, masker.num_predictions)
    assert packed["masked_weights"].sum() == alone["masked_weights"].sum() > 10
    sums = jax.jit(lambda b: objective.loss_sums(params, b, None))
    got, want = jax.device_get(sums(packed)), jax.device_get(sums(alone))
    assert set(got) == set(want)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, err_msg=k)


# ---------------------------------------------------------------------------------------------
# masking


def test_masking_packed_rows_never_touches_special_tokens_or_padding():
    pad = 1
    seqs = sequences(200, pad, seed=3)
    ids_NL, seg_NL = fill_rows(seqs, *greedy_pack([len(s) for s in seqs], L), L, pad)
    masker = MLMMasker(seq_len=L, vocab_size=99, mask_token_id=MASK, pad_token_id=pad,
                       special_token_ids=[BOS, EOS], mlm_probability=0.15)
    maskable_NL = ~np.isin(ids_NL, [BOS, EOS, pad, MASK])
    n_N = maskable_NL.sum(1)
    chosen = np.zeros(ids_NL.shape, int)
    for seed in range(50):
        out = masker({"input_ids": ids_NL, "segment_ids": seg_NL}, np.random.default_rng(seed))
        real_NP = out["masked_weights"] > 0
        np.testing.assert_array_equal(real_NP.sum(1), np.maximum(1, np.rint(0.15 * n_N)))  # the same rate as ever
        rows_NP = np.broadcast_to(np.arange(len(ids_NL))[:, None], real_NP.shape)
        np.add.at(chosen, (rows_NP[real_NP], out["masked_positions"][real_NP]), 1)
        np.testing.assert_array_equal(out["segment_ids"], seg_NL)
        np.testing.assert_array_equal(out["attention_mask"], (seg_NL > 0).astype(np.int32))
        untouched = ~np.zeros_like(maskable_NL)
        untouched[rows_NP[real_NP], out["masked_positions"][real_NP]] = False
        np.testing.assert_array_equal(out["input_ids"][untouched], ids_NL[untouched])
    assert chosen[~maskable_NL].sum() == 0  # never <s>, </s> or padding of any segment
    assert (chosen[maskable_NL] > 0).mean() > 0.9  # while every other token is drawn now and then


# ---------------------------------------------------------------------------------------------
# the data path


WORDS = "sol regn vind snø hav fjell skog elv by land bok hus vei natt dag lys mørke stein tre gress".split()


@pytest.fixture(scope="module")
def tokenizer():
    rng = np.random.default_rng(0)
    return train_bpe([" ".join(rng.choice(WORDS, rng.integers(3, 30))) for _ in range(300)], vocab_size=400,
                     model_max_length=64)


def test_line_rows_pack_and_cache_packed_and_unpacked_apart(tmp_path, tokenizer):
    rng = np.random.default_rng(1)
    lines = [" ".join(rng.choice(WORDS, rng.integers(1, 12))) for _ in range(300)]
    path = tmp_path / "a.txt"
    path.write_text("".join(line + "\n" + ("\n" if i % 7 == 0 else "") for i, line in enumerate(lines)),
                    encoding="utf-8")  # blank lines between some: skipped
    src = TextSourceArgs(train_file=[str(path)], cache_dir=str(tmp_path / "cache"))
    raw = load_raw_text(src, validation_split_percentage=0)
    unpacked = token_rows.from_text(raw, token_rows.lines(tokenizer, 32, pack=False), 32)["train"]
    packed_ds = token_rows.from_text(raw, token_rows.lines(tokenizer, 32, pack=True), 32)["train"]
    assert packed_ds._fingerprint != unpacked._fingerprint  # the packing mode is part of the cache key
    ids_SL, packed = as_numpy_rows(unpacked), as_numpy_rows(packed_ds)
    assert ids_SL.shape == (300, 32) and set(packed) == {"input_ids", "segment_ids"}
    ids_NL, seg_NL = packed["input_ids"], packed["segment_ids"]
    assert len(ids_NL) < len(ids_SL) / 2
    got = [ids_NL[n][seg_NL[n] == k].tolist() for n in range(len(ids_NL)) for k in range(1, seg_NL[n].max() + 1)]
    assert got == [row[row != tokenizer.pad_token_id].tolist() for row in ids_SL]  # each line as today, in order
    assert np.all(ids_NL[seg_NL == 0] == tokenizer.pad_token_id)
    blocks = token_rows.blocks(tokenizer, 32)  # packing applies to lines only
    grouped = as_numpy_rows(token_rows.from_text(raw, blocks, 32)["train"])
    np.testing.assert_array_equal(grouped, as_numpy_rows(token_rows.from_text(raw, blocks, 32)["train"]))
    stream = load_raw_text(dataclasses.replace(src, streaming=True), 0)
    streamed_lines = token_rows.lines(tokenizer, 32, pack=token_rows.can_pack(stream))  # a stream: one line per row
    streamed = token_rows.from_text(stream, streamed_lines, 32)["train"]
    np.testing.assert_array_equal(np.stack(list(streamed)), ids_SL)


def test_pack_lines_flag():
    def data_args(*argv):
        return parse_args(ModelArgs, TextSourceArgs, DataArgs, MaskedLMArgs, TrainingArgs,
                          argv=["--output_dir", "x", *argv])[3]
    assert data_args().pack_lines is True
    assert data_args("--pack_lines", "false").pack_lines is False
    assert data_args("--pack_lines").pack_lines is True


@pytest.mark.parametrize("pack", [True, False])
def test_run_mlm_line_by_line_end_to_end(model_dir, corpus, tmp_path, pack):  # noqa: F811
    out = tmp_path / "run"
    extra = [] if pack else ["--pack_lines", "false"]
    run_mlm_flax.main(run_args(model_dir, corpus, out, "--line_by_line", "--max_steps", "3", "--eval_steps", "3",
                               *extra))
    assert [r["step"] for r in read_metrics(out)] == [1, 2, 3]
    assert all(np.isfinite(r["loss"]) for r in read_metrics(out))
    [result] = read_metrics(out, "eval")
    # Evaluation covered every validation line once: its target count is that of all the validation rows.
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(model_dir)
    src = TextSourceArgs(train_file=[corpus["train"]], validation_file=[corpus["validation"]])
    rows = as_numpy_rows(token_rows.from_text(load_raw_text(src), token_rows.lines(tok, 32, pack=pack),
                                              32)["validation"])
    ids = rows["input_ids"] if pack else rows
    n = (~np.isin(ids, tok.all_special_ids)).sum(1)
    assert result["target_tokens"] == int(np.where(n > 0, np.maximum(1, np.rint(0.15 * n)), 0).sum())
    lines = [t for t in open(corpus["validation"], encoding="utf-8").read().splitlines() if t.strip()]
    assert (int((rows["segment_ids"].max(1)).sum()) if pack else len(rows)) == len(lines)

