"""T5's Unigram tokenizer: ids, sentinels, normalization, offline reload, the scripts and the HF recipe import."""
import inspect
import os
import runpy
import sys
import unicodedata

import pytest
from pydoc_data.topics import topics
from tokenizers import Tokenizer
from transformers import AutoTokenizer

import train_tokenizer
from flaxlm.errors import UserError, run_main
from flaxlm.tokenization.trainers import T5_SENTINELS, save_tokenizer, train_unigram

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def paragraphs(n=1500):
    """English text CPython ships (the demo corpus), one paragraph per item."""
    out = [" ".join(p.split()) for name in sorted(topics) for p in topics[name].split("\n\n")]
    return [p for p in out if p][:n]


def normalized(text):
    """What decoding gives back for text whose characters are all in the vocabulary: NFKC, single spaces."""
    return " ".join(unicodedata.normalize("NFKC", text).split())


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(trained tokenizer, its reload from a directory saved like train_tokenizer.py saves it)."""
    texts = paragraphs()
    tok = train_unigram(iter([texts[i:i + 100] for i in range(0, len(texts), 100)]), vocab_size=400,
                        model_max_length=256, total=len(texts))
    path = tmp_path_factory.mktemp("t5tok")
    save_tokenizer(tok, str(path))
    return tok, AutoTokenizer.from_pretrained(str(path), local_files_only=True), path


def test_ids_and_sentinels_survive_reload(saved):
    tok, back, path = saved
    assert sorted(os.listdir(path)) == ["tokenizer.json", "tokenizer_config.json"]
    assert len(back) == len(tok) == 400 + 100 and back.model_max_length == 256  # vocab_size + the sentinels
    assert [back.pad_token, back.eos_token, back.unk_token] == ["<pad>", "</s>", "<unk>"]
    assert [back.pad_token_id, back.eos_token_id, back.unk_token_id] == [0, 1, 2]
    assert back.bos_token is None and back.mask_token is None  # T5 has neither
    assert list(back.extra_special_tokens) == list(T5_SENTINELS) == [f"<extra_id_{k}>" for k in range(100)]
    for k in range(100):  # span k gets len - 1 - k, as in Hugging Face's T5 tokenizers
        assert back.convert_tokens_to_ids(f"<extra_id_{k}>") == len(back) - 1 - k
    assert back.convert_ids_to_tokens(len(back) - 100) == "<extra_id_99>"
    assert set(back.all_special_ids) == {0, 1, 2, *range(400, 500)}
    assert back.get_vocab() == tok.get_vocab()


def test_encoding_eos_digits_punctuation_and_round_trip(saved):
    tok, back, _ = saved
    ids = back("Hello world 123!").input_ids
    assert ids[-1] == 1 and ids.count(1) == 1 and ids == tok("Hello world 123!").input_ids  # </s> appended once
    tokens = back.convert_ids_to_tokens(ids)
    assert tokens[-5:-1] == ["1", "2", "3", "!"]  # each digit alone, punctuation alone
    assert back.decode(ids, skip_special_tokens=True) == "Hello world 123!"
    assert back("a", "b").input_ids == back("a").input_ids + back("b").input_ids  # a </s> b </s>
    assert back("☃").input_ids == [back.convert_tokens_to_ids("▁"), 2, 1]  # unseen character -> <unk>
    for text in paragraphs()[::60] + ["  Tabs\tand\nnewlines,   and  ﬁve   spaces.  "]:
        ids = back(text).input_ids
        assert ids == tok(text).input_ids and 2 not in ids
        assert back.decode(ids, skip_special_tokens=True) == normalized(text)
    assert back("x   y").input_ids == back("x y").input_ids  # runs of spaces collapse
    assert back("Ｈｅｌｌｏ").input_ids == back("Hello").input_ids  # NFKC
    assert back("Hello").input_ids != back("hello").input_ids  # no lowercasing unless asked


def test_sentinels_are_never_split(saved):
    _, back, _ = saved
    text = "The <extra_id_0> walks in<extra_id_1>park<extra_id_99>"
    ids = back(text).input_ids
    sentinel_ids = [i for i in ids if i >= 400]
    assert sentinel_ids == [len(back) - 1, len(back) - 2, len(back) - 100]
    assert ids.count(2) == 0 and "<" not in back.convert_ids_to_tokens([i for i in ids if i < 400])
    assert back.decode(ids, skip_special_tokens=True).split() == ["The", "walks", "in", "park"]


def test_lowercase_option_survives_reload(tmp_path):
    tok = train_unigram(paragraphs(300), vocab_size=300, lowercase=True)
    save_tokenizer(tok, str(tmp_path))
    back = AutoTokenizer.from_pretrained(str(tmp_path), local_files_only=True)
    assert back("HELLO World <extra_id_3>").input_ids == back("hello world <extra_id_3>").input_ids
    assert back.decode(back("The Python Language").input_ids, skip_special_tokens=True) == "the python language"
    assert back.convert_tokens_to_ids("<extra_id_3>") == len(back) - 4


def test_train_tokenizer_script_unigram(tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(paragraphs(400)), encoding="utf-8")
    out = tmp_path / "model"
    train_tokenizer.main(["--train_file", str(corpus), "--type", "unigram", "--output_dir", str(out),
                          "--cache_dir", str(tmp_path / "cache"), "--model_max_length", "128"])
    back = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    assert inspect.signature(train_unigram).parameters["vocab_size"].default == 32000  # the --vocab_size default
    assert 300 < len(back) <= 32000 + 100  # a small text cannot fill 32000 pieces
    assert capsys.readouterr().out.strip().splitlines()[-1] == \
        f"saved a unigram tokenizer with {len(back)} tokens to {out}"
    assert back.model_max_length == 128 and back.convert_tokens_to_ids("<extra_id_0>") == len(back) - 1
    assert back("Hello 42").input_ids[-3:] == [back.convert_tokens_to_ids("4"), back.convert_tokens_to_ids("2"), 1]

    sys.path.insert(0, ROOT)  # create_config.py reads vocab_size and the pad/eos ids from this tokenizer
    import create_config
    create_config.main(["--output_dir", str(out), "--preset", "roberta-tiny"])
    import transformers
    config = transformers.AutoConfig.from_pretrained(str(out))
    assert config.vocab_size == len(back) and config.pad_token_id == 0 and config.eos_token_id == 1


def test_too_small_vocab_is_one_line_exit_2(tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(paragraphs(200)), encoding="utf-8")
    argv = ["--train_file", str(corpus), "--type", "unigram", "--vocab_size", "20", "--output_dir",
            str(tmp_path / "out"), "--cache_dir", str(tmp_path / "cache")]
    with pytest.raises(SystemExit) as stop:
        run_main(lambda: train_tokenizer.main(argv))
    err = capsys.readouterr().err  # datasets' progress bars, then the error in one line, no traceback
    last = err.strip().splitlines()[-1]
    assert stop.value.code == 2 and "Traceback" not in err and err.count("error:") == 1
    assert last.startswith("error: --vocab_size 20 is too small") and last.endswith("raise --vocab_size")
    assert not os.path.exists(tmp_path / "out" / "tokenizer.json")
    with pytest.raises(UserError, match="--vocab_size 3 is too small"):
        train_unigram(["abc"], vocab_size=3)


def test_hf_recipe_class_from_files_and_iterator(tmp_path):
    from t5_tokenizer_model import SentencePieceUnigramTokenizer
    from flaxlm.tokenization.unigram import VocabTooSmall

    texts = paragraphs(500)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(texts), encoding="utf-8")
    from_file = SentencePieceUnigramTokenizer(unk_token="<unk>", eos_token="</s>", pad_token="<pad>")
    from_file.train(str(corpus), vocab_size=250, show_progress=False)
    from_iter = SentencePieceUnigramTokenizer()
    from_iter.train_from_iterator(iter(texts), vocab_size=250, show_progress=False, length=len(texts))
    assert from_file.get_vocab_size() == from_iter.get_vocab_size() == 250  # no sentinels at this level
    assert [from_iter.token_to_id(t) for t in ("<pad>", "</s>", "<unk>")] == [0, 1, 2]
    enc = from_iter.encode("Version 3.12 ☃")
    assert enc.ids[-1] == 1 and 2 in enc.ids and enc.tokens[-7:-3] == ["3", ".", "1", "2"]
    assert set(from_file.get_vocab()) == set(from_iter.get_vocab())  # the same pieces (ids may tie-break apart)
    assert from_file.encode("Version 3.12").tokens == enc.tokens[:-3] + ["</s>"]

    from_iter.save(str(tmp_path / "tokenizer.json"))  # what the recipe did next; it reloads as it was
    assert Tokenizer.from_file(str(tmp_path / "tokenizer.json")).encode("Version 3.12 ☃").ids == enc.ids

    lower = SentencePieceUnigramTokenizer(lowercase=True)
    lower.train_from_iterator(texts, vocab_size=250, show_progress=False)
    assert lower.encode("VERSION").ids == lower.encode("version").ids
    with pytest.raises(VocabTooSmall, match="vocab_size 10 is too small"):
        SentencePieceUnigramTokenizer().train_from_iterator(texts, vocab_size=10, show_progress=False)


def test_t5_tokenizer_model_script_is_train_tokenizer_unigram(tmp_path, monkeypatch):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(paragraphs(300)), encoding="utf-8")
    out = tmp_path / "out"
    monkeypatch.setattr(sys, "argv", ["t5_tokenizer_model.py", "--train_file", str(corpus), "--vocab_size", "200",
                                      "--output_dir", str(out), "--cache_dir", str(tmp_path / "cache")])
    runpy.run_path(os.path.join(ROOT, "t5_tokenizer_model.py"), run_name="__main__")
    back = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    assert len(back) == 300 and back.convert_tokens_to_ids("<extra_id_99>") == 200 and back.eos_token_id == 1
