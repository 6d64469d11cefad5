"""Tokenizer training: RoBERTa-style BPE and BERT-style WordPiece that reload offline, and the script."""
import os
import subprocess
import sys

import numpy as np
import pytest
from transformers import AutoTokenizer

from flaxlm.errors import UserError
from flaxlm.tokenization.trainers import train_bpe, train_gpt2_bpe, train_wordpiece

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE = "Blåbærsyltetøy på Ålesund-brød, 3 stk.  Ærlig talt: «økonomi» og café!\tSlutt."


def norwegian(n=400, seed=0):
    rng = np.random.default_rng(seed)
    words = ("hei på deg vi går til fjellet og ser på været i dag når sola skinner over "
             "Ålesund Tromsø Øyvind").split()
    return [" ".join(rng.choice(words, rng.integers(3, 20))) + "." for _ in range(n)]


def shared_lines(shared_data):
    path = shared_data / "no" / "ud_bokmaal_texts_dev.txt"
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_bpe_is_roberta_and_reloads(tmp_path):
    lines = norwegian()
    tok = train_bpe(iter([lines[i:i + 100] for i in range(0, len(lines), 100)]), vocab_size=300,
                    model_max_length=128, total=len(lines))
    tok.save_pretrained(str(tmp_path))
    assert {"tokenizer.json", "tokenizer_config.json"} <= set(os.listdir(tmp_path))
    back = AutoTokenizer.from_pretrained(str(tmp_path))
    assert type(back).__name__ == "RobertaTokenizer" and len(back) == 300 and back.model_max_length == 128
    specials = [back.bos_token, back.pad_token, back.eos_token, back.unk_token, back.mask_token]
    assert specials == ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    assert [back.bos_token_id, back.pad_token_id, back.eos_token_id, back.unk_token_id, back.mask_token_id] == \
        [0, 1, 2, 3, 4]
    assert back.cls_token == "<s>" and back.sep_token == "</s>"
    assert back.added_tokens_decoder[4].lstrip  # "<mask>" takes the space before it, as RoBERTa's does
    for text in [SAMPLE] + lines[:50:5]:  # byte-level: lossless
        ids = back(text)["input_ids"]
        assert ids[0] == 0 and ids[-1] == 2 and ids == tok(text)["input_ids"]
        assert back.decode(ids, skip_special_tokens=True) == text
    a, b = back("hei")["input_ids"], back("du")["input_ids"]
    assert back("hei", "du")["input_ids"] == a + [2] + b[1:]  # <s> A </s></s> B </s>
    assert back("hei <mask>")["input_ids"] == a[:-1] + [4, 2]  # the space went into <mask> (lstrip)
    assert back.tokenize("hei du")[1].startswith("Ġ")  # no prefix space added, GPT-2/RoBERTa style


def test_gpt2_bpe_is_gpt2s_and_adds_nothing(tmp_path):
    """A decoder's tokenizer: GPT2Tokenizer, <|endoftext|> as bos, eos and unk, nothing added around a text (a
    RoBERTa tokenizer on a GPT-2 would frame every text in <s> ... </s>), lossless, and so after reloading."""
    lines = norwegian()
    tok = train_gpt2_bpe(iter(lines), vocab_size=300, total=len(lines))
    tok.save_pretrained(str(tmp_path))
    back = AutoTokenizer.from_pretrained(str(tmp_path))
    assert type(back).__name__ == "GPT2Tokenizer" and len(back) == 300 and back.model_max_length == 1024
    assert back.bos_token == back.eos_token == back.unk_token == "<|endoftext|>" and back.eos_token_id == 0
    assert back.pad_token is None and "<s>" not in back.get_vocab()
    for text in [SAMPLE, "Hei på deg"] + lines[:50:5]:
        ids = back(text)["input_ids"]
        assert ids == back(text, add_special_tokens=False)["input_ids"] == tok(text)["input_ids"]
        assert 0 not in ids and back.decode(ids) == text
    assert back.tokenize("hei du")[1].startswith("Ġ")  # no prefix space added, as GPT-2


def test_bpe_on_real_text_is_lossless(tmp_path, shared_data):
    lines = shared_lines(shared_data)
    tok = train_bpe(iter(lines), vocab_size=2000, total=len(lines))
    tok.save_pretrained(str(tmp_path))
    back = AutoTokenizer.from_pretrained(str(tmp_path))
    assert len(back) == 2000 and back.decode(back("Hvem vet?")["input_ids"]) == "<s>Hvem vet?</s>"
    for text in lines[::25]:
        ids = back(text, add_special_tokens=False)["input_ids"]
        assert ids == tok(text, add_special_tokens=False)["input_ids"] and back.decode(ids) == text


def test_lowercase_bpe_stays_lowercase_after_reload(tmp_path):
    tok = train_bpe(norwegian(), vocab_size=300, lowercase=True)
    tok.save_pretrained(str(tmp_path))
    back = AutoTokenizer.from_pretrained(str(tmp_path))
    assert back("Hei PÅ Deg")["input_ids"] == tok("hei på deg")["input_ids"] == back("hei på deg")["input_ids"]
    assert back.mask_token_id == 4 and back.pad_token_id == 1


def test_wordpiece_is_bert_and_reloads(tmp_path):
    tok = train_wordpiece(norwegian(), vocab_size=200, model_max_length=256)
    tok.save_pretrained(str(tmp_path))
    back = AutoTokenizer.from_pretrained(str(tmp_path))
    assert type(back).__name__ == "BertTokenizer" and back.model_max_length == 256
    assert [back.pad_token, back.unk_token, back.cls_token, back.sep_token, back.mask_token] == \
        ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert [back.pad_token_id, back.unk_token_id, back.cls_token_id, back.sep_token_id, back.mask_token_id] == \
        [0, 1, 2, 3, 4]
    a, b = back("hei på")["input_ids"], back("deg")["input_ids"]
    enc = back("hei på", "deg")
    assert a[0] == 2 and a[-1] == 3 and enc["input_ids"] == a + b[1:]  # [CLS] A [SEP] B [SEP]
    assert enc["token_type_ids"] == [0] * len(a) + [1] * (len(b) - 1)
    assert back("Hei PÅ")["input_ids"] == tok("hei pa")["input_ids"]  # lowercased, accents stripped as in BERT
    assert any(t.startswith("##") for t in back.get_vocab())
    assert back.decode(back("hei på deg")["input_ids"], skip_special_tokens=True) == "hei pa deg"


def test_tiny_bpe_vocab_is_a_user_error():
    with pytest.raises(UserError, match="at least 261"):
        train_bpe(["a"], vocab_size=100)


def run_script(*args):
    return subprocess.run([sys.executable, "train_tokenizer.py", *args], cwd=ROOT, capture_output=True, text=True)


def test_script_end_to_end(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("\n".join(norwegian(300)), encoding="utf-8")
    b.write_text("\n".join(norwegian(300, seed=1)), encoding="utf-8")
    out = tmp_path / "model"
    out.mkdir()
    (out / "config.json").write_text("{}")  # not ours: must survive everything below
    common = ["--train_file", str(a), "--train_file", str(b), "--output_dir", str(out),
              "--cache_dir", str(tmp_path / "cache")]

    done = run_script(*common, "--vocab_size", "300", "--model_max_length", "64")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == f"saved a bpe tokenizer with 300 tokens to {out}"
    tok = AutoTokenizer.from_pretrained(str(out))
    assert type(tok).__name__ == "RobertaTokenizer" and tok.model_max_length == 64

    refused = run_script(*common, "--type", "wordpiece")
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [refused.stderr.strip()]  # one line, no traceback
    assert "already holds a tokenizer" in refused.stderr and "--overwrite_output_dir" in refused.stderr

    (out / "vocab.json").write_text("{}")  # a stale tokenizer file is replaced, config.json is kept
    replaced = run_script(*common, "--type", "wordpiece", "--vocab_size", "150", "--overwrite_output_dir",
                          "--max_train_samples", "200")
    assert replaced.returncode == 0, replaced.stderr
    assert sorted(os.listdir(out)) == ["config.json", "tokenizer.json", "tokenizer_config.json"]
    assert (out / "config.json").read_text() == "{}"
    assert type(AutoTokenizer.from_pretrained(str(out))).__name__ == "BertTokenizer"

    unigram = run_script(*common, "--type", "unigram", "--vocab_size", "100", "--overwrite_output_dir")
    assert unigram.returncode == 0, unigram.stderr
    assert sorted(os.listdir(out)) == ["config.json", "tokenizer.json", "tokenizer_config.json"]
    tok = AutoTokenizer.from_pretrained(str(out))
    assert tok.eos_token_id == 1 and tok.convert_tokens_to_ids("<extra_id_0>") == len(tok) - 1  # T5's sentinels


def test_script_main_with_dataset_name_and_streaming(tmp_path):
    """In-process: --dataset_name (a local folder, no network) and --streaming."""
    sys.path.insert(0, ROOT)
    import train_tokenizer

    folder = tmp_path / "ds"
    folder.mkdir()
    (folder / "train.txt").write_text("\n".join(norwegian(200)), encoding="utf-8")
    for extra in ([], ["--streaming", "--max_train_samples", "100"]):
        out = tmp_path / f"out{len(extra)}"
        train_tokenizer.main(["--dataset_name", str(folder), "--output_dir", str(out), "--type", "wordpiece",
                              "--vocab_size", "120", "--cache_dir", str(tmp_path / "cache"), *extra])
        tok = AutoTokenizer.from_pretrained(str(out))
        assert type(tok).__name__ == "BertTokenizer" and tok.mask_token_id == 4


def test_byte_tokenizer_is_byt5s(tmp_path):
    """--type byte reads no text and writes what AutoTokenizer loads as ByT5Tokenizer, ids as in google/byt5-*:
    pad 0, eos 1, unk 2, byte b at b + 3, <extra_id_0> .. <extra_id_124> at 259 .. 383."""
    import train_tokenizer
    from transformers import ByT5Tokenizer
    out = tmp_path / "byt5"
    train_tokenizer.main(["--type", "byte", "--model_max_length", "64", "--output_dir", str(out)])
    tok = AutoTokenizer.from_pretrained(str(out))
    assert type(tok) is ByT5Tokenizer and len(tok) == 384 and tok.model_max_length == 64
    assert tok.get_vocab() == ByT5Tokenizer().get_vocab()
    assert (tok.pad_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2)
    assert tok("hé")["input_ids"] == [ord("h") + 3, 0xC3 + 3, 0xA9 + 3, 1]
    assert [tok.convert_tokens_to_ids(f"<extra_id_{k}>") for k in (0, 1, 124)] == [259, 260, 383]
    assert tok.decode(tok("Blåbærsyltetøy")["input_ids"], skip_special_tokens=True) == "Blåbærsyltetøy"
    with pytest.raises(UserError, match="fixed vocabulary of 384"):
        train_tokenizer.main(["--type", "byte", "--vocab_size", "500", "--output_dir", str(tmp_path / "x")])
