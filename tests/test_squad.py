"""Question answering: the SQuAD metric, windows and labels, answers from logits, bad answers, run_qa.py end to end."""
import json
import os

import numpy as np
import pytest

import run_qa
from flaxlm.errors import UserError
from flaxlm.data.squad import Example, read_squad, squad_windows
from flaxlm.tasks.squad_answers import best_answers
from flaxlm.tasks.squad_metric import exact_match, f1, normalize_answer, squad_scores

# ---------------------------------------------------------------------------------------------
# the official SQuAD definitions


def test_metric_matches_the_official_definitions():
    assert normalize_answer("The  Quick, brown-fox!") == "quick brownfox"  # punctuation removed, not split on
    assert normalize_answer("an apple a day\tkeeps THE doctor away.") == "apple day keeps doctor away"
    assert normalize_answer("theater anthem") == "theater anthem"  # articles only as whole words
    assert exact_match("the Eiffel Tower", "Eiffel tower.") == 1.0
    assert exact_match("Eiffel", "Eiffel Tower") == 0.0
    # token-overlap F1 on the normalized tokens: precision 2/3, recall 2/3
    assert f1("the quick brown fox", "quick brown dog") == pytest.approx(2 / 3)
    # counts are clipped: 'brown' once in common, 'fox' once: precision 2/3, recall 2/3
    assert f1("brown brown fox", "brown fox fox") == pytest.approx(2 / 3)
    assert f1("red green blue yellow", "green") == pytest.approx(2 * 0.25 * 1 / 1.25)  # P 1/4, R 1
    assert f1("Oslo", "Bergen") == 0.0
    assert f1("", "") == 1.0 and f1("", "Oslo") == 0.0 and f1("the", "") == 1.0  # "the" normalizes to ""

    # the best over several gold answers
    golds = {"q": ["Denver Broncos", "Broncos", "the Denver Broncos team"]}
    assert squad_scores({"q": "denver broncos"}, golds) == {"exact": 100.0, "f1": 100.0}
    scores = squad_scores({"q": "Denver"}, {"q": ["Denver Broncos", "Carolina"]})
    assert scores["exact"] == 0.0 and scores["f1"] == pytest.approx(100 * 2 / 3)  # P 1, R 1/2
    # averages over questions; a question without a prediction scores 0
    assert squad_scores({"a": "Oslo"}, {"a": ["Oslo"], "b": ["Bergen"]}) == {"exact": 50.0, "f1": 50.0}

    # v2.0: no answer is the gold "", which only the empty prediction matches; per-kind scores
    preds = {"a": "", "b": "something", "c": "", "d": "Oslo city"}
    refs = {"a": [], "b": [], "c": ["Oslo"], "d": ["Oslo"]}
    scores = squad_scores(preds, refs)
    assert scores["exact"] == 25.0 and scores["f1"] == pytest.approx(100 * (1 + 0 + 0 + 2 / 3) / 4)
    assert scores["NoAns_exact"] == 50.0 and scores["NoAns_f1"] == 50.0
    assert scores["HasAns_exact"] == 0.0 and scores["HasAns_f1"] == pytest.approx(100 * (2 / 3) / 2)


# ---------------------------------------------------------------------------------------------
# windows, labels and answers back from logits


@pytest.fixture(scope="session")
def qa_tokenizers(model_dir_for):
    """Our byte-level BPE (RoBERTa, with a tiny RoBERTa config beside it) and WordPiece (BERT, lowercasing)."""
    from transformers import AutoTokenizer
    dirs = {kind: model_dir_for(preset, kind, 400, model_max_length=128)
            for kind, preset in (("bpe", "roberta-tiny"), ("wordpiece", "bert-tiny"))}
    return {kind: (d, AutoTokenizer.from_pretrained(d)) for kind, d in dirs.items()}


LONG_CONTEXT = ("Filler sentence number {} says little. " * 4 + "It is said that (Guido van Rossum) created Python. "
                + "Another filler line number {} follows. " * 4).replace("{}", "7")
ANSWER = "Guido van Rossum"


def long_example(qid="long"):
    return Example(qid, "Who created Python?", LONG_CONTEXT, [ANSWER], LONG_CONTEXT.index(ANSWER), ANSWER)


@pytest.mark.parametrize("kind", ["bpe", "wordpiece"])
def test_long_context_windows_point_at_the_answer_or_at_cls(qa_tokenizers, kind):
    _, tok = qa_tokenizers[kind]
    no_answer = Example("none", "Who created Python?", LONG_CONTEXT, [], -1, "")
    examples = [long_example(), no_answer]
    rows, offsets_NL2 = squad_windows(examples, tok, max_seq_length=48, doc_stride=12, keep_offsets=True)
    N, L = rows["input_ids"].shape
    assert L == 48 and N == len(rows["start_positions"]) == len(offsets_NL2)
    ex_N, cls_N = rows["example_index"], rows["cls_index"]
    assert (ex_N == 0).sum() >= 3 and (ex_N == 0).sum() == (ex_N == 1).sum()  # split alike, in example order
    assert (rows["input_ids"][np.arange(N), cls_N] == tok.cls_token_id).all()
    a0 = LONG_CONTEXT.index(ANSWER)
    a1 = a0 + len(ANSWER)
    labelled = 0
    for n in np.flatnonzero(ex_N == 0):
        s, e, off = rows["start_positions"][n], rows["end_positions"][n], offsets_NL2[n]
        ctx = off[:, 0] >= 0
        covers = off[ctx, 0].min() <= a0 and off[ctx, 1].max() >= a1
        if covers:
            assert ctx[s] and ctx[e] and LONG_CONTEXT[off[s, 0]:off[e, 1]] == ANSWER
            labelled += 1
        else:
            assert s == e == cls_N[n]
    assert 0 < labelled < (ex_N == 0).sum()  # some windows hold the answer, some do not
    # the context's windows overlap by doc_stride tokens: each window starts inside the one before
    firsts = [offsets_NL2[n][offsets_NL2[n, :, 0] >= 0, 0].min() for n in np.flatnonzero(ex_N == 0)]
    lasts = [offsets_NL2[n][offsets_NL2[n, :, 0] >= 0, 1].max() for n in np.flatnonzero(ex_N == 0)]
    assert all(f < prev_last for f, prev_last in zip(firsts[1:], lasts[:-1]))
    assert firsts[0] == 0 and lasts[-1] >= len(LONG_CONTEXT.rstrip())  # together they cover the whole context
    # v2.0 question without an answer: every window at CLS
    assert (rows["start_positions"][ex_N == 1] == cls_N[ex_N == 1]).all()
    assert (rows["end_positions"][ex_N == 1] == cls_N[ex_N == 1]).all()

    with pytest.raises(UserError, match="doc_stride 40"):
        squad_windows(examples, tok, max_seq_length=48, doc_stride=40)


def answer(rows, offsets_NL2, examples, start_NL, end_NL, **kw):
    kw = {"n_best_size": 20, "max_answer_length": 30, **kw}
    return best_answers(start_NL, end_NL, offsets_NL2, rows["example_index"], rows["cls_index"], examples, **kw)


def test_answers_from_logits(qa_tokenizers):
    _, tok = qa_tokenizers["wordpiece"]  # lowercases: the answer must still be the original text
    examples = [long_example()]
    rows, offsets_NL2 = squad_windows(examples, tok, max_seq_length=48, doc_stride=12, keep_offsets=True)
    N, L = rows["input_ids"].shape
    noise = np.random.default_rng(0).normal(0, 0.1, size=(2, N, L)).astype(np.float32)
    start_NL, end_NL = noise[0].copy(), noise[1].copy()
    has = rows["start_positions"] != rows["cls_index"]
    start_NL[has, rows["start_positions"][has]] = 10
    end_NL[has, rows["end_positions"][has]] = 10
    assert answer(rows, offsets_NL2, examples, start_NL, end_NL) == {"long": ANSWER}

    # one window from here on: a short context, logits set by hand
    context = "It is said that Guido van Rossum created Python in 1991."
    examples = [Example("short", "Who created Python?", context, [ANSWER], context.index(ANSWER), ANSWER)]
    rows, offsets_NL2 = squad_windows(examples, tok, max_seq_length=48, doc_stride=12, keep_offsets=True)
    assert len(rows["input_ids"]) == 1
    s, e, c = rows["start_positions"][0], rows["end_positions"][0], rows["cls_index"][0]
    ctx = np.flatnonzero(offsets_NL2[0, :, 0] >= 0)
    assert e - s + 1 >= 3 and ctx[-1] > e + 1

    def logits(at):
        start_1L, end_1L = np.zeros((1, L), np.float32), np.zeros((1, L), np.float32)
        for (which, i), v in at.items():
            (start_1L if which == "s" else end_1L)[0, i] = v
        return start_1L, end_1L

    def text(i, j):
        return context[offsets_NL2[0, i, 0]:offsets_NL2[0, j, 1]]

    def run(at, **kw):
        return answer(rows, offsets_NL2, examples, *logits(at), **kw)["short"]

    # max_answer_length: the gold span (e - s + 1 tokens) is too long, the best shorter one wins
    at = {("s", s): 10, ("e", e): 10, ("e", e - 1): 5, ("s", s + 1): 4}
    assert run(at) == ANSWER
    assert run(at, max_answer_length=e - s) == text(s, e - 1)
    # n_best_size: the top start lies after the top end; only with 2 candidates is the gold pair found
    at = {("s", e + 1): 10, ("s", s): 9, ("e", e): 10}
    assert run(at, n_best_size=1) == ""
    assert run(at, n_best_size=2) == ANSWER
    # question and special tokens are never an answer, however high their logits
    q = np.flatnonzero(rows["token_type_ids"][0] == 0)[1]
    assert run({("s", q): 50, ("e", q): 50, ("s", s): 1, ("e", e): 1}) == ANSWER
    # v2.0: null score (CLS) 10 against the span's 9.5: no answer unless the threshold exceeds the 0.5 gap
    at = {("s", c): 5, ("e", c): 5, ("s", s): 4.5, ("e", e): 5}
    assert run(at, version_2=True, null_score_diff_threshold=0.0) == ""
    assert run(at, version_2=True, null_score_diff_threshold=0.4) == ""
    assert run(at, version_2=True, null_score_diff_threshold=0.6) == ANSWER
    assert run(at, version_2=False) == ANSWER


# ---------------------------------------------------------------------------------------------
# SQuAD files: bad answers counted and skipped


def squad_file(path, paragraphs, version="1.1"):
    path.write_text(json.dumps({"version": version, "data": [{"title": "t", "paragraphs": paragraphs}]}))
    return str(path)


def qa(qid, question, context, answer, start=None, **extra):
    starts = [context.index(answer) if start is None else start]
    return {"id": qid, "question": question, "answers": [{"text": answer, "answer_start": s} for s in starts], **extra}


def test_answers_whose_offsets_do_not_match_are_counted_and_skipped(tmp_path, capsys):
    ctx = "Oslo is the capital of Norway. Bergen is the second city."
    both = qa("both", "Which city is second?", ctx, "Bergen")
    both["answers"].append({"text": "Bergen", "answer_start": 3})  # a second, bad answer: dropped, question kept
    path = squad_file(tmp_path / "mixed.json", [{"context": ctx, "qas": [
        qa("good", "What is the capital of Norway?", ctx, "Oslo"),
        qa("bad", "What is the capital?", ctx, "Oslo", start=5),
        both]}])
    examples = read_squad([path], version_2=False)
    assert [e.id for e in examples] == ["good", "both"]
    assert examples[1].answers == ["Bergen"] and examples[1].answer_start == ctx.index("Bergen")
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "skipped 2 of 4 answers" in out[0] and "the 1 question(s) left without" in out[0]

    all_bad = squad_file(tmp_path / "bad.json", [{"context": ctx, "qas": [qa("bad", "Capital?", ctx, "Oslo", 9)]}])
    with pytest.raises(UserError, match="none of the 1 answers"):
        read_squad([all_bad], version_2=False)
    no_answer = squad_file(tmp_path / "v2.json", [{"context": ctx, "qas": [
        {"id": "x", "question": "Who?", "answers": [], "is_impossible": True}]}], version="v2.0")
    with pytest.raises(UserError, match="version_2_with_negative"):
        read_squad([no_answer], version_2=False)
    assert read_squad([no_answer], version_2=True)[0].answers == []
    not_squad = tmp_path / "not_squad.json"
    not_squad.write_text(json.dumps([{"text": "hello"}]))
    with pytest.raises(UserError, match="not a SQuAD json file"):
        read_squad([str(not_squad)], version_2=False)


# ---------------------------------------------------------------------------------------------
# run_qa.py end to end


FACTS = [("Ada Lovelace", "wrote the first program", "Who wrote the first program?"),
         ("Oslo", "is the capital of Norway", "What is the capital of Norway?"),
         ("Guido van Rossum", "created Python", "Who created Python?"),
         ("Marie Curie", "discovered polonium", "Who discovered polonium?"),
         ("the Nile", "is the longest river", "What is the longest river?"),
         ("Linus Torvalds", "wrote the Linux kernel", "Who wrote the Linux kernel?")]


def facts_file(path):
    """Six questions; contexts long enough for two or three windows of 64 tokens, the answer in one of them.
    A seventh question's answer_start is off by one: it is skipped."""
    paragraphs = []
    for i, (ans, rest, question) in enumerate(FACTS):
        filler = "This sentence is filler text about nothing in particular. " * (1 + i % 3)
        context = filler + f"It is said that {ans} {rest}. " + filler
        paragraphs.append({"context": context, "qas": [qa(f"q{i}", question, context, ans)]})
    first = paragraphs[0]["context"]
    paragraphs[0]["qas"].append(qa("off", "Who?", first, "Ada", first.index("Ada") + 1))
    return squad_file(path, paragraphs)


def test_run_qa_learns_to_answer_and_exports_for_transformers(qa_tokenizers, tmp_path, capsys):
    model_dir, tok = qa_tokenizers["bpe"]
    data = facts_file(tmp_path / "facts.json")
    out = tmp_path / "run"
    args = ["--output_dir", str(out), "--config_name", model_dir, "--tokenizer_name", model_dir, "--train_file", data,
            "--validation_file", data, "--max_seq_length", "64", "--doc_stride", "16",
            "--per_device_train_batch_size", "1", "--learning_rate", "3e-3", "--warmup_steps", "5",
            "--max_steps", "160", "--logging_steps", "40", "--eval_steps", "160", "--save_steps", "160"]
    run_qa.main(args)
    stdout = capsys.readouterr().out
    assert "warning: train: skipped 1 of 7 answers" in stdout and "warning: validation: skipped 1 of 7" in stdout

    evals = [json.loads(line) for line in open(out / "metrics.jsonl") if json.loads(line)["split"] == "eval"]
    assert evals[-1]["step"] == 160 and evals[-1]["exact"] >= 99.0 and evals[-1]["f1"] >= 99.0
    predictions = json.loads((out / "predictions.json").read_text())
    assert sorted(predictions) == [f"q{i}" for i in range(6)]
    assert {normalize_answer(v) for v in predictions.values()} == {normalize_answer(a) for a, _, _ in FACTS}
    assert predictions["q2"] == "Guido van Rossum"

    # the export loads in transformers and computes the same start/end logits as our model (real positions;
    # padding is masked out: never predicted)
    import jax
    import torch
    from transformers import AutoModelForQuestionAnswering
    from flaxlm.config.options import QuestionAnsweringArgs
    from flaxlm.models import load_for_task, split_model
    from flaxlm.tasks.squad_objective import squad_objective
    config, ours = load_for_task(str(out), "question_answering")
    graphdef, params = split_model(ours)
    rows, _ = squad_windows(read_squad([data], version_2=False), tok, max_seq_length=64, doc_stride=16)
    objective = squad_objective(graphdef, config, 64, tok.pad_token_id, QuestionAnsweringArgs())
    batch = objective.collate(rows)
    predicted = jax.jit(objective.predict)(params, batch)
    start_NL, end_NL = (np.asarray(predicted[k], np.float64) for k in ("start_logits", "end_logits"))
    real_NL = rows["attention_mask"] > 0
    assert not real_NL.all() and (start_NL[~real_NL] < -1e8).all() and (end_NL[~real_NL] < -1e8).all()
    hf = AutoModelForQuestionAnswering.from_pretrained(out).eval()
    with torch.no_grad():
        theirs = hf(input_ids=torch.tensor(rows["input_ids"]), attention_mask=torch.tensor(rows["attention_mask"]))
    np.testing.assert_allclose(start_NL[real_NL], theirs.start_logits.numpy()[real_NL], atol=1e-4)
    np.testing.assert_allclose(end_NL[real_NL], theirs.end_logits.numpy()[real_NL], atol=1e-4)

    # the loss: transformers' (the mean of the start and end cross-entropy over each window's positions)
    with torch.no_grad():
        expected = hf(input_ids=torch.tensor(rows["input_ids"]), attention_mask=torch.tensor(rows["attention_mask"]),
                      start_positions=torch.tensor(rows["start_positions"]).long(),
                      end_positions=torch.tensor(rows["end_positions"]).long()).loss
    sums = jax.jit(objective.loss_sums)(params, batch, None)
    assert float(sums["weight_sum"]) == len(rows["input_ids"])
    assert float(sums["loss_sum"]) / len(rows["input_ids"]) == pytest.approx(float(expected), rel=1e-4)

    # a file whose answers all miss their context: one clear error before any training
    ctx = "Oslo is the capital of Norway."
    bad = squad_file(tmp_path / "bad.json", [{"context": ctx, "qas": [qa("b", "Capital?", ctx, "Oslo", 3)]}])
    args[args.index(data)] = bad
    with pytest.raises(UserError, match="none of the 1 answers"):
        run_qa.main(args + ["--output_dir", str(tmp_path / "bad_run")])
    assert not os.path.exists(tmp_path / "bad_run" / "metrics.jsonl")


@pytest.mark.parametrize("preset,kind,hf_class", [("electra-tiny-discriminator", "wordpiece",
                                                    "ElectraForQuestionAnswering"),
                                                   ("modernbert-tiny", "bpe", "ModernBertForQuestionAnswering"),
                                                   ("deberta-v3-tiny", "bpe", "DebertaV2ForQuestionAnswering")])
def test_run_qa_trains_and_exports_each_encoder_family(preset, kind, hf_class, model_dir_for, tmp_path):
    """run_qa.py on a new ELECTRA, ModernBERT and DeBERTa-v3: a few steps and an evaluation, then the export
    loads cleanly as transformers' question-answering class with our start and end logits."""
    import torch
    import transformers
    from flaxlm.models import load_for_task
    model_dir = model_dir_for(preset, kind, 400, model_max_length=128)
    data = facts_file(tmp_path / "facts.json")
    out = tmp_path / "run"
    run_qa.main(["--output_dir", str(out), "--config_name", model_dir, "--tokenizer_name", model_dir, "--train_file",
                 data, "--validation_file", data, "--max_seq_length", "64", "--doc_stride", "16",
                 "--per_device_train_batch_size", "2", "--max_steps", "3", "--eval_steps", "3", "--logging_steps", "1"])
    evals = [json.loads(line) for line in open(out / "metrics.jsonl") if json.loads(line)["split"] == "eval"]
    assert evals[-1]["step"] == 3 and 0 <= evals[-1]["f1"] <= 100
    hf, info = transformers.AutoModelForQuestionAnswering.from_pretrained(out, output_loading_info=True)
    assert type(hf).__name__ == hf_class and not any(info.values()), info
    ids = np.random.default_rng(0).integers(5, 400, (2, 12))
    mask = np.ones_like(ids)
    mask[1, 8:] = 0
    _, ours = load_for_task(str(out), "question_answering")
    start, end = (np.asarray(x) for x in ours(ids, mask))
    with torch.no_grad():
        theirs = hf.eval()(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))
    np.testing.assert_allclose(start[mask > 0], theirs.start_logits.numpy()[mask > 0], atol=1e-4)
    np.testing.assert_allclose(end[mask > 0], theirs.end_logits.numpy()[mask > 0], atol=1e-4)
