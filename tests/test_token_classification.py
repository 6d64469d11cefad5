"""Token classification: run_token_classification.py end to end on a tiny pretrained RoBERTa (export, predictions
file, seqeval's numbers), bad input, and the pieces: CoNLL-U in both layouts, JSON lines, sub-token labels,
metrics and the baseline."""
import json
import os
import re

import numpy as np
import pytest

import run_token_classification
from run_helpers import expect_user_error, read_metrics, tiny_pretrained_roberta
from flaxlm.config.options import TokenClassificationArgs, TextSourceArgs
from flaxlm.data.conllu import read_conllu
from flaxlm.data.tagged_sentences import Sentences, load_sentences, tag_names
from flaxlm.errors import UserError, run_main
from flaxlm.tasks.tagging_metrics import MostFrequentTag, resolve_scheme, score
from flaxlm.tasks.token_classification import IGNORE, align_labels, token_rows

FIRST = ["Kari", "Ola", "Per", "Anne", "Nils", "Liv"]
LAST = ["Nordmann", "Hansen", "Berg", "Dahl"]
PLACES = ["Oslo", "Bergen", "Tromsø", "Bodø"]
VERBS = ["besøkte", "likte", "forlot"]


def tagged(n, seed):
    """(words, entity tags) of sentences 'First Last verb Place .' (a person, then a place)."""
    rng = np.random.default_rng(seed)
    return [([rng.choice(FIRST), rng.choice(LAST), rng.choice(VERBS), rng.choice(PLACES), "."],
             ["B-PER", "I-PER", "O", "B-LOC", "O"]) for _ in range(n)]


def write_ndt(path, sentences):
    """NorNE's training layout: no comments, Oslo-Bergen tags in columns 4-5, the entity in MISC (name=...)."""
    with open(path, "w", encoding="utf-8") as f:
        for words, tags in sentences:
            for i, (w, t) in enumerate(zip(words, tags), 1):
                f.write(f"{i}\t{w}\t{w.lower()}\tsubst\tsubst\tprop\t0\tFRAG\t_\tname={t}\n")
            f.write("\n")
    return str(path)


def write_jsonl(path, sentences, keys=("tokens", "tags")):
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(dict(zip(keys, s)), ensure_ascii=False) + "\n" for s in sentences)
    return str(path)


UD = """# sent_id = 1
# text = Dommer Finn avstår.
1\tDommer\tdommer\tNOUN\tsubst\tGender=Masc\t3\tnsubj\t_\tname=O
2-3\tFinnavstår\t_\t_\t_\t_\t_\t_\t_\t_
2\tFinn\tFinn\tPROPN\tsubst\t_\t1\tflat:name\t_\tname=B-PER
3\tavstår\tavstå\tVERB\tverb\t_\t0\troot\t_\tSpaceAfter=No|name=O
3.1\tmen\t_\t_\t_\t_\t_\t_\t_\t_
4\t.\t$.\tPUNCT\t<punkt>\t_\t3\tpunct\t_\tname=O

# sent_id = 2
1\tJa\tja\tINTJ\tinterj\t_\t0\troot\t_\tname=O
"""


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A tiny RoBERTa as run_mlm_flax.py exports it, its tokenizer trained on the toy sentences."""
    return tiny_pretrained_roberta(tmp_path_factory.mktemp("pretrained"),
                                   [" ".join(words) for words, _ in tagged(200, 0)])


def test_conllu_both_layouts_and_tag_columns(tmp_path):
    """UD layout (comments, multiword tokens and empty nodes skipped) and NorNE's NDT layout read alike."""
    ud = tmp_path / "ud.conllu"
    ud.write_text(UD, encoding="utf-8")
    assert read_conllu(ud, "upos") == [(["Dommer", "Finn", "avstår", "."], ["NOUN", "PROPN", "VERB", "PUNCT"]),
                                       (["Ja"], ["INTJ"])]
    assert read_conllu(ud, "xpos")[0][1] == ["subst", "subst", "verb", "<punkt>"]
    assert read_conllu(ud, "misc:name")[0][1] == ["O", "B-PER", "O", "O"]
    ndt = write_ndt(tmp_path / "ndt.conllu", tagged(3, 1))
    assert read_conllu(ndt, "misc:name") == tagged(3, 1)
    assert read_conllu(ndt, "upos")[0][1] == ["subst"] * 5  # the Oslo-Bergen tag in column 4
    with pytest.raises(UserError, match=r"ud.conllu has no tag column misc:entity \(no word has a tag there\)"):
        read_conllu(ud, "misc:entity")
    assert read_conllu(ud, "misc:entity", labeled=False)[1] == (["Ja"], None)
    with pytest.raises(UserError, match="--tag_column lemma is not a CoNLL-U tag column"):
        read_conllu(ud, "lemma")


@pytest.mark.parametrize("case,message", [
    ("malformed", r"error: .*train.conllu, line 7: not a CoNLL-U word line \(expected 10 tab-separated columns "
                  r"starting with a word ID, found 9 column\(s\)"),
    ("no_column", r"error: .*train.conllu has no tag column misc:ner \(no word has a tag there\); pass the "
                  r"--tag_column"),
])
def test_bad_conllu_exits_2_and_overwrites_nothing(pretrained, tmp_path, capsys, case, message):
    lines = open(write_ndt(tmp_path / "ok.conllu", tagged(4, 2)), encoding="utf-8").read().splitlines()
    if case == "malformed":
        lines[6] = "\t".join(lines[6].split("\t")[:9])  # line 7: a column short
    (tmp_path / "train.conllu").write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    out.mkdir()
    (out / "predictions_validation.conll").write_text("an earlier run\n")
    argv = ["--output_dir", str(out), "--overwrite_output_dir", "--model_name_or_path", pretrained,
            "--train_file", str(tmp_path / "train.conllu"), "--tag_column",
            "misc:ner" if case == "no_column" else "misc:name"]
    with pytest.raises(SystemExit) as e:
        run_main(lambda: run_token_classification.main(argv))
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and re.match(message, err[0]), err
    assert (out / "predictions_validation.conll").read_text() == "an earlier run\n" and len(os.listdir(out)) == 1
    expect_user_error(run_token_classification.main, argv, message.removeprefix("error: "))


def test_json_lines_columns_and_validation_split(tmp_path):
    path = write_jsonl(tmp_path / "s.jsonl", tagged(10, 3), keys=("words", "ner"))
    args = TokenClassificationArgs(tokens_column="words", tags_column="ner")
    splits = load_sentences(TextSourceArgs(train_file=[path]), args, 20, seed=0)
    assert [len(s.words) for s in splits.values()] == [8, 2] and "held-out 20%" in splits["validation"].where
    assert sorted(splits["train"].words + splits["validation"].words) == sorted(w for w, _ in tagged(10, 3))
    assert tag_names(splits) == ["B-LOC", "B-PER", "I-PER", "O"]
    with pytest.raises(UserError, match=r"s.jsonl, line 1: no list of words in 'tokens'; pass --tokens_column"):
        load_sentences(TextSourceArgs(train_file=[path]), TokenClassificationArgs(), 20, seed=0)


def test_first_sub_token_labels_and_label_all_tokens(pretrained):
    """A word of several pieces is labeled on its first piece only (-100 after), or on every piece with
    label_all_tokens (B- becoming I- after the first); special tokens never."""
    from flaxlm.tokenization.loading import load_tokenizer
    tok = load_tokenizer(pretrained)
    names = ["B-PER", "I-PER", "O"]
    s = Sentences("hand-made", [["Kari", "Xyzzyplugh", "besøkte"]], [["B-PER", "B-PER", "O"]])
    first = token_rows({"train": s}, tok, 64, names)["train"]
    every = token_rows({"train": s}, tok, 64, names, label_all_tokens=True)["train"]
    n = int(first["attention_mask"][0].sum())
    start, end = (int(np.flatnonzero(first["word_ids"][0] == w)[0]) for w in (1, 2))  # the word's pieces
    pieces = end - start
    assert pieces >= 3 and tok.decode(first["input_ids"][0, start:end]).strip() == "Xyzzyplugh"
    assert first["labels"][0, start:end].tolist() == [0] + [IGNORE] * (pieces - 1)
    assert every["labels"][0, start:end].tolist() == [0] + [1] * (pieces - 1)
    assert first["labels"][0, 0] == every["labels"][0, 0] == IGNORE and first["labels"][0, n - 1] == IGNORE
    assert first["word_ids"][0, start:end].tolist() == [1] + [-1] * (pieces - 1)
    # the rule on its own: word ids of sub-tokens (None: special)
    assert align_labels([None, 0, 1, 1, 1, 2, None], [0, 0, 2], names) == [IGNORE, 0, 0, IGNORE, IGNORE, 2, IGNORE]
    assert align_labels([None, 0, 1, 1, 2, 2, None], [0, 0, 2], names, True) == [IGNORE, 0, 0, 1, 2, 2, IGNORE]


SPLIT_WORDS = [["Dommer", "Finn", "avstår", "."], ["U.S.", "høy-", "rente", "2 000", "Tromsø"], ["Ja"]]


@pytest.mark.parametrize("kind", ["bpe", "bpe-lowercase", "wordpiece", "unigram", "xlmr-unigram", "byte"])
def test_words_are_tokenized_as_transformers_is_split_into_words(kind, corpus, tmp_path):
    """Every tokenizer type: the rows' ids and each word's first sub-token are transformers' is_split_into_words
    encoding (byte-level BPE loaded with add_prefix_space=True, as its recipes do; ByT5's Python tokenizer, which has
    no word_ids(), a word per its UTF-8 bytes), and the tokenizer saved beside the export encodes them alike."""
    import train_tokenizer
    from transformers import AutoTokenizer
    from flaxlm.tokenization.loading import load_tokenizer
    from flaxlm.tokenization.split_words import prefix_every_word
    lowercase, kind = kind.endswith("-lowercase"), kind.removesuffix("-lowercase")
    size = [] if kind == "byte" else ["--vocab_size", "300"]
    train_tokenizer.main(["--type", kind, "--train_file", corpus["train"], *size, "--output_dir", str(tmp_path / "t"),
                          *(["--lowercase"] if lowercase else [])])
    tok = prefix_every_word(load_tokenizer(str(tmp_path / "t")))
    tok.save_pretrained(tmp_path / "export")
    rows = token_rows({"train": Sentences("t", SPLIT_WORDS, [["O"] * len(w) for w in SPLIT_WORDS])}, tok, 64,
                      ["O"])["train"]
    byte_level = kind == "bpe"
    # A lowercasing BPE loads as a plain TokenizersBackend, which takes add_prefix_space from tokenizer.json only
    ref = AutoTokenizer.from_pretrained(tmp_path / ("export" if lowercase else "t"),
                                        **({"add_prefix_space": True} if byte_level else {}))
    enc = ref(SPLIT_WORDS, is_split_into_words=True)
    for i, words in enumerate(SPLIT_WORDS):
        n = int(rows["attention_mask"][i].sum())
        assert rows["input_ids"][i, :n].tolist() == enc["input_ids"][i]
        if ref.is_fast:
            word_ids = enc.word_ids(i)
        else:  # ByT5: a word's sub-tokens are its bytes
            word_ids = [k for k, w in enumerate(words) for _ in w.encode()] + [None]
        firsts = [j for j, w in enumerate(word_ids) if w is not None and (j == 0 or word_ids[j - 1] != w)]
        assert np.flatnonzero(rows["word_ids"][i] >= 0).tolist() == firsts
        assert rows["word_ids"][i, firsts].tolist() == list(range(len(words)))
    again = AutoTokenizer.from_pretrained(tmp_path / "export")(SPLIT_WORDS, is_split_into_words=True)
    assert again["input_ids"] == enc["input_ids"]
    if byte_level:  # every word after a space, the first one too
        assert all(ref.convert_ids_to_tokens(ids)[1].startswith("Ġ") for ids in enc["input_ids"])


def test_seqeval_numbers_on_a_hand_made_case():
    """Gold: PER, LOC, ORG; predicted: PER (right), LOC (wrong place): P 1/2, R 1/3, F1 0.4; 4 of 6 words."""
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["O", "B-ORG"]]
    pred = [["B-PER", "I-PER", "O", "O"], ["O", "B-LOC"]]
    names = ["B-LOC", "B-ORG", "B-PER", "I-PER", "O"]
    assert resolve_scheme(None, names) == "seqeval" and resolve_scheme(None, ["NOUN", "VERB"]) == "accuracy"
    got = score("seqeval", gold, pred)
    assert got == pytest.approx({"accuracy": 4 / 6, "precision": 0.5, "recall": 1 / 3, "f1": 0.4})
    assert score("accuracy", gold, pred) == pytest.approx({"accuracy": 4 / 6})
    with pytest.raises(UserError, match="--metric seqeval scores BIO entity tags"):
        resolve_scheme("seqeval", ["NOUN", "VERB"])
    baseline = MostFrequentTag(Sentences("t", [["a", "b", "a"], ["a"]], [["X", "Y", "Z"], ["X"]]))
    assert baseline.tags(["a", "b", "c"]) == ["X", "Y", "X"]  # unseen: the most frequent tag


def test_end_to_end_export_and_predictions(pretrained, tmp_path, capsys):
    """A few steps on a tiny NER file (CoNLL-U train, JSON-lines validation): the export loads in
    AutoModelForTokenClassification with our logits, the predictions file follows the contract and is what
    transformers' token-classification pipeline tags the pre-split words with, and the last eval row's metrics are
    seqeval's on that file."""
    import jax.numpy as jnp
    import torch
    from seqeval.metrics import f1_score, precision_score, recall_score
    from transformers import AutoModelForTokenClassification, AutoTokenizer, pipeline
    from flaxlm.models import load_for_task
    out = tmp_path / "run"
    dev = tagged(12, 5)
    run_token_classification.main([
        "--output_dir", str(out), "--model_name_or_path", pretrained,
        "--train_file", write_ndt(tmp_path / "train.conllu", tagged(64, 4)), "--tag_column", "misc:name",
        "--validation_file", write_jsonl(tmp_path / "dev.jsonl", dev), "--per_device_train_batch_size", "2",
        "--learning_rate", "3e-3", "--warmup_steps", "2", "--max_steps", "24", "--logging_steps", "12",
        "--eval_steps", "12", "--eval_at_start"])
    printed = capsys.readouterr().out
    assert "most frequent training tag per word (baseline) accuracy 1.0000, precision 1.0000" in printed
    evals = read_metrics(out, "eval")
    assert [r["step"] for r in evals] == [0, 12, 24] and evals[-1]["loss"] < 0.5 * evals[0]["loss"]

    blocks = (out / "predictions_validation.conll").read_text(encoding="utf-8").split("\n\n")
    rows = [[line.split("\t") for line in b.splitlines()] for b in blocks if b.strip()]
    assert [[r[0] for r in s] for s in rows] == [w for w, _ in dev] and [[r[1] for r in s] for s in rows] == [
        t for _, t in dev]
    gold, pred = [[r[1] for r in s] for s in rows], [[r[2] for r in s] for s in rows]
    assert evals[-1]["f1"] == pytest.approx(f1_score(gold, pred), abs=1e-6)
    assert evals[-1]["precision"] == pytest.approx(precision_score(gold, pred), abs=1e-6)
    assert evals[-1]["recall"] == pytest.approx(recall_score(gold, pred), abs=1e-6)
    assert (out / "report_validation.txt").read_text().count("precision") >= 2

    hf, info = AutoModelForTokenClassification.from_pretrained(out, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert type(hf).__name__ == "RobertaForTokenClassification" and hf.config.id2label[1] == "B-PER"
    tok = AutoTokenizer.from_pretrained(out)
    enc = tok([w for w, _ in dev], is_split_into_words=True, padding=True, return_tensors="np")
    with torch.no_grad():
        theirs = hf.eval()(input_ids=torch.tensor(enc["input_ids"]),
                           attention_mask=torch.tensor(enc["attention_mask"])).logits.numpy()
    _, ours = load_for_task(str(out), "token_classification")
    ours = np.asarray(ours(jnp.asarray(enc["input_ids"]), jnp.asarray(enc["attention_mask"])))
    real = enc["attention_mask"].astype(bool)
    np.testing.assert_allclose(ours[real], theirs[real], atol=1e-4, rtol=0)
    # As a transformers user tags pre-split words: the pipeline's tag of each word's first sub-token is ours.
    tagger = pipeline("token-classification", model=str(out))
    tagged_dev = tagger([list(words) for words, _ in dev], is_split_into_words=True, aggregation_strategy="none",
                        ignore_labels=[])
    for (words, _), entities, s in zip(dev, tagged_dev, rows):
        tags = {e["index"]: e["entity"] for e in entities}
        word_ids = tok(words, is_split_into_words=True).word_ids()
        firsts = [j for j, w in enumerate(word_ids) if w is not None and word_ids[j - 1] != w]
        assert [r[2] for r in s] == [tags[j] for j in firsts]
