"""evaluate_suite.py: the bootstrap interval, the scores recomputed from the predictions files (against the
libraries the scripts use), the baselines, the suite file's errors, and a suite run with a crashing task."""
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import evaluate_suite
from run_helpers import expect_user_error
from flaxlm.tasks.suite import baselines, scores
from flaxlm.tasks.suite.bootstrap import Scored, bootstrap_interval
from flaxlm.tasks.suite.suite_file import SuiteTask
from flaxlm.tasks.suite.task_scores import score_task


def accuracy_scored(correct_N):
    return Scored(np.stack([correct_N, np.ones_like(correct_N)], axis=1).astype(np.float64),
                  lambda s: 100.0 * s[0] / s[1])


def test_bootstrap_interval_is_a_percentile_bootstrap():
    correct_N = (np.random.default_rng(0).random(200) < 0.7).astype(np.float64)
    scored = accuracy_scored(correct_N)
    low, high = bootstrap_interval(scored, resamples=500, seed=3)
    # by hand: 500 resamples of the 200 examples with replacement, the 2.5th and 97.5th percentile of their means
    index_RN = np.random.default_rng(3).integers(0, 200, size=(500, 200))
    expected = np.percentile(100.0 * correct_N[index_RN].mean(axis=1), [2.5, 97.5])
    np.testing.assert_allclose([low, high], expected, rtol=1e-12)
    assert scored.value == pytest.approx(100 * correct_N.mean()) and low < scored.value < high
    wider = accuracy_scored(np.tile(correct_N, 16))  # the same accuracy on 16 times the examples: a quarter as wide
    w_low, w_high = bootstrap_interval(wider, resamples=500, seed=3)
    assert w_low < wider.value < w_high and (w_high - w_low) < 0.4 * (high - low)
    assert bootstrap_interval(scored, resamples=500, seed=3) == (low, high)  # seeded


def test_scores_are_the_libraries_own():
    from sacrebleu import corpus_bleu, corpus_chrf
    from seqeval.metrics import f1_score as entity_f1, precision_score, recall_score
    from sklearn.metrics import accuracy_score, f1_score
    from flaxlm.tasks.squad_metric import squad_scores
    golds, preds = ["a", "b", "b", "c", "a", "b"], ["a", "b", "a", "a", "a", "b"]
    classes = ["a", "b", "c", "d"]  # d: a training class without a validation example (F1 0 in the mean)
    assert scores.class_scored(golds, preds, classes, "accuracy").value == pytest.approx(
        100 * accuracy_score(golds, preds))
    assert scores.class_scored(golds, preds, classes, "macro_f1").value == pytest.approx(
        100 * f1_score(golds, preds, labels=classes, average="macro", zero_division=0))
    gold_tags = [["B-PER", "I-PER", "O", "B-LOC"], ["O", "B-ORG"], ["B-PER", "O"]]
    pred_tags = [["B-PER", "I-PER", "O", "B-ORG"], ["O", "B-ORG"], ["I-PER", "B-LOC"]]
    for metric, reference in (("f1", entity_f1), ("precision", precision_score), ("recall", recall_score)):
        assert scores.entity_scored(gold_tags, pred_tags, metric).value == pytest.approx(
            100 * reference(gold_tags, pred_tags))
    hyps, refs = ["det er en fin dag", "jeg liker is", "hei"], ["det er ein fin dag", "eg likar is", "hallo"]
    assert scores.generation_scored(hyps, refs, "chrf").value == pytest.approx(corpus_chrf(hyps, [refs]).score)
    assert scores.generation_scored(hyps, refs, "bleu").value == pytest.approx(corpus_bleu(hyps, [refs]).score)
    answers, references = {"q1": "the Oslo", "q2": "Bergen city"}, {"q1": ["Oslo"], "q2": ["Bergen"], "q3": ["x"]}
    for metric in ("exact", "f1"):
        assert scores.squad_scored(answers, references, metric).value == pytest.approx(
            squad_scores(answers, references)[metric])


CONLLU = """# sent_id = 1
1\tHan\than\tPRON\t_\t_\t2\tnsubj\t_\tname=O
2\tbor\tbo\tVERB\t_\t_\t0\troot\t_\tname=O
3\ti\ti\tADP\t_\t_\t4\tcase\t_\tname=O
4\tOslo\tOslo\tPROPN\t_\t_\t2\tobl\t_\tname=B-GPE_LOC

1\tOslo\tOslo\tPROPN\t_\t_\t2\tnsubj\t_\tname=B-GPE_LOC
2\tbor\tbo\tNOUN\t_\t_\t0\troot\t_\tSpaceAfter=No|name=O

1\tbor\tbo\tNOUN\t_\t_\t0\troot\t_\tname=O
2\ti\ti\tADP\t_\t_\t1\tcase\t_\tname=O

1\tOslo\tOslo\tNOUN\t_\t_\t0\troot\t_\tname=O
"""


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_most_frequent_tag_per_word_from_the_training_split(tmp_path):
    """The baseline learns from exactly run_token_classification.py's training split: its held-out sentences (by
    its seed), its tag column, its max_train_samples."""
    train = write(tmp_path / "train.conllu", CONLLU)
    words = ["Han", "bor", "Oslo", "i", "Bergen"]

    def tags(**flags):
        return baselines.most_frequent_tag(SuiteTask("t", "tagging", "accuracy", {"train_file": [train], **flags}))

    # seed 1 holds sentence 2 (Oslo PROPN, bor NOUN) out: bor is VERB once and NOUN once -> the tag seen first;
    # unseen -> ADP (ADP 2, NOUN 2: the one seen first)
    held_out = {"validation_split_percentage": 25, "tag_column": "upos"}
    assert tags(**held_out, seed=1).tags(words) == ["PRON", "VERB", "PROPN", "ADP", "ADP"]
    assert tags(**held_out, seed=0).tags(words)[1] == "NOUN"  # seed 0 holds sentence 4 out: bor NOUN twice
    first = tags(validation_file=[train], tag_column="misc:name", max_train_samples=1)  # sentence 1 only
    assert first.tags(words) == ["O", "O", "B-GPE_LOC", "O", "O"]
    assert baselines.majority_labels(["b", "a", "b", "a", "c"], 3) == ["a", "a", "a"]


def test_score_task_reads_the_output_contract(tmp_path):
    """Hand-written predictions files in the scripts' formats, scored with their baselines."""
    from sacrebleu import corpus_chrf
    train = write(tmp_path / "train.conllu", CONLLU)
    run = tmp_path / "run"
    run.mkdir()
    write(run / "predictions_validation.conll", "Han\tPRON\tPRON\nbor\tVERB\tNOUN\n\nOslo\tPROPN\tPROPN\n\n")
    task = SuiteTask("pos", "tagging", "accuracy", {"train_file": [train], "validation_file": [train]})
    scored, baseline = score_task(task, str(run))
    assert scored.value == pytest.approx(200 / 3) and len(scored.stats_NK) == 2  # two sentences resampled
    assert baseline == pytest.approx(200 / 3)  # the whole file trains it: Han PRON, Oslo PROPN right; bor NOUN

    pairs = [("eg er her", "jeg er her", "jeg er her"), ("dei kom", "de kom", "dei kom"), ("ho", "hun", "ho")]
    refs = [r for _, r, _ in pairs]
    write(run / "predictions_validation.jsonl", "".join(
        json.dumps({"source": s, "reference": r, "prediction": p}) + "\n" for s, r, p in pairs))
    task = SuiteTask("nn_nb", "seq2seq", "chrf", {"train_file": [train], "source_prefix": "nn-nb: "})
    scored, baseline = score_task(task, str(run))
    assert scored.value == pytest.approx(corpus_chrf([p for _, _, p in pairs], [refs]).score)
    assert baseline == pytest.approx(corpus_chrf([s for s, _, _ in pairs], [refs]).score)  # copy the source

    squad = {"data": [{"paragraphs": [{"context": "Oslo er hovedstaden i Norge.", "qas": [
        {"id": "a", "question": "Hva er hovedstaden?", "answers": [{"text": "Oslo", "answer_start": 0}]},
        {"id": "b", "question": "I hvilket land?", "answers": [{"text": "Norge", "answer_start": 22}]}]}]}]}
    write(tmp_path / "dev.json", json.dumps(squad))
    write(run / "predictions.json", json.dumps({"a": "Oslo", "b": "i Norge"}))
    task = SuiteTask("qa", "qa", "exact", {"train_file": [str(tmp_path / "dev.json")],
                                           "validation_file": [str(tmp_path / "dev.json")]})
    scored, baseline = score_task(task, str(run))
    assert scored.value == 50.0 and baseline is None
    first = SuiteTask("qa", "qa", "exact", {**task.flags, "max_eval_samples": 1})  # run_qa.py scored only "a"
    assert score_task(first, str(run))[0].value == 100.0


# ---------------------------------------------------------------------------------------------
# the suite file's errors, and a run


SENTENCES = [("en fin film", "pos"), ("en god bok", "pos"), ("en flott dag", "pos"), ("en dårlig film", "neg"),
             ("en kjedelig bok", "neg"), ("en fin dag", "pos")]


@pytest.fixture(scope="module")
def roberta(model_dir_for, tmp_path_factory):
    """A tiny RoBERTa with weights (as run_mlm_flax.py exports one), a tiny T5's config.json, and a toy sentiment
    task's files."""
    from flaxlm import models
    d = tmp_path_factory.mktemp("suite")
    model, t5 = d / "roberta", d / "t5"
    shutil.copytree(model_dir_for("roberta-tiny"), model)
    config = models.load_config(str(model))
    models.save_pretrained(str(model), config, models.split_model(models.create_model(config, seed=0))[1])
    shutil.copytree(model_dir_for("t5-tiny"), t5)
    data = d / "data"
    data.mkdir()
    write(data / "train.tsv", "sentence\tlabel\n" + "".join(f"{s}\t{label}\n" for s, label in SENTENCES * 4))
    write(data / "dev.tsv", "sentence\tlabel\n" + "".join(f"{s}\t{label}\n" for s, label in SENTENCES))
    return {"encoder": str(model), "t5": str(t5), "data": str(data)}


def suite_file(tmp_path, tasks):
    return write(tmp_path / "suite.yaml", json.dumps({"defaults": {"per_device_train_batch_size": 1},
                                                      "tasks": tasks}))  # json is yaml


GOOD = {"name": "sentiment", "kind": "classification", "train_file": "train.tsv", "validation_file": "dev.tsv"}


@pytest.mark.parametrize("task,message", [
    ({**GOOD, "kind": "parsing"}, r"task sentiment of suite file .* has kind 'parsing'; use one of classification, "
                                  r"tagging, ner, qa, seq2seq"),
    ({**GOOD, "train_file": "nowhere.tsv"}, r"task sentiment of suite file .*, train_file: no file .*nowhere.tsv"),
    ({**GOOD, "metric": "bleu"}, r"metric 'bleu' does not score a classification task; use one of accuracy, macro_f1"),
    ({**GOOD, "output_dir": "x"}, r"sets output_dir, which evaluate_suite.py sets itself"),
    ({**GOOD, "learning_rat": 1e-3}, r"task sentiment: unrecognized arguments: --learning_rat"),
    ({"name": "squad", "kind": "qa", "train_file": "train.tsv"}, r"task squad of .* has no validation_file"),
    ({"name": "ner", "kind": "ner", "train_file": "train.tsv", "tag_colum": "misc:name"},
     r"task ner: unrecognized arguments: --tag_colum"),
])
def test_bad_suite_is_one_line_before_any_run(roberta, tmp_path, task, message):
    out = tmp_path / "out"
    argv = ["--model_name_or_path", roberta["encoder"], "--suite", suite_file(tmp_path, [task]), "--output_dir",
            str(out), "--data_dir", roberta["data"]]
    expect_user_error(evaluate_suite.main, argv, message)
    assert not out.exists()


def test_suite_reports_a_crash_and_scores_the_rest(roberta, tmp_path, capsys):
    from sklearn.metrics import accuracy_score
    tasks = [{**GOOD, "name": "broken", "label_column": "stars"},  # the script exits 2: no such column
             {**GOOD, "learning_rate": 1e-3},
             {"name": "nn_nb", "kind": "seq2seq", "train_file": "train.tsv"}]  # not for an encoder: skipped
    out = tmp_path / "out"
    from flaxlm.reporting.model_card import MARK, SUITE_END, SUITE_START
    card = Path(roberta["encoder"]) / "README.md"  # a card flaxlm wrote: the suite's table goes into it
    card.write_text(f"---\nlicense: mit\n---\n{MARK}\n# tiny\n{SUITE_START}\n{SUITE_END}\n## How to use\n")
    evaluate_suite.main(["--model_name_or_path", roberta["encoder"], "--suite", suite_file(tmp_path, tasks),
                         "--output_dir", str(out), "--data_dir", roberta["data"], "--max_steps", "2",
                         "--bootstrap_resamples", "200"])
    printed = capsys.readouterr().out
    assert "skipping nn_nb: seq2seq tasks are for seq2seq models, and" in printed
    results = json.loads((out / "results.json").read_text())
    broken, good = results["results"]
    assert broken["task"] == "broken" and "has no label column 'stars'" in broken["error"]
    assert "exit code 2" in broken["error"] and "score" not in broken
    lines = [line.split("\t") for line in (out / "sentiment" / "predictions_validation.tsv").read_text().splitlines()]
    golds, preds = [r[2] for r in lines[1:]], [r[1] for r in lines[1:]]
    assert golds == [label for _, label in SENTENCES]
    assert good["score"] == pytest.approx(100 * accuracy_score(golds, preds)) and good["examples"] == 6
    assert good["low"] <= good["score"] <= good["high"] and good["seconds"] > 0
    assert good["baseline"] == pytest.approx(100 * 4 / 6)  # 'pos', the training majority, on the dev labels
    assert results["skipped"] == ["nn_nb"]
    markdown = (out / "results.md").read_text()
    assert "| broken | accuracy | failed: exit code 2:" in markdown and "| sentiment | accuracy |" in markdown
    assert "failed: exit code 2" in printed and "66.67 (majority class)" in printed
    (suite_row,) = [json.loads(line) for line in open(out / "metrics.jsonl")]  # the trackers' row
    assert suite_row["split"] == "suite" and suite_row["sentiment_score"] == pytest.approx(good["score"], abs=1e-6)
    text = card.read_text()
    assert "| sentiment | accuracy |" in text and text.index(SUITE_START) < text.index("| sentiment |") < text.index(
        "## How to use")
    # run again into the same folder: refused without --overwrite_output_dir, before anything runs
    again = ["--suite", suite_file(tmp_path, tasks), "--output_dir", str(out), "--data_dir", roberta["data"]]
    expect_user_error(evaluate_suite.main, ["--model_name_or_path", roberta["encoder"], *again],
                      r"sentiment holds an earlier run; pass --overwrite_output_dir")
    # a T5 takes the seq2seq task only (whose script is not there: a row, not the end)
    expect_user_error(evaluate_suite.main, ["--model_name_or_path", roberta["t5"], *again, "--tasks", "sentiment"],
                      r"no task of .* fits a seq2seq model")


def test_norwegian_suite_reads_with_the_shared_data(shared_data):
    """configs/suites/norwegian.yaml: its files are in ../shared/data, its classification and tagging flags are
    run_classification.py's and run_token_classification.py's."""
    from flaxlm.tasks.suite.suite_file import read_suite, script_options
    tasks = read_suite(os.path.join(os.path.dirname(evaluate_suite.__file__), "configs", "suites", "norwegian.yaml"),
                       str(shared_data))
    assert [(t.name, t.kind, t.metric) for t in tasks] == [
        ("norec_sentence", "classification", "macro_f1"), ("ud_upos", "tagging", "accuracy"), ("norne", "ner", "f1"),
        ("nn_nb", "seq2seq", "chrf"), ("norec_sentence_fewshot", "choice", "macro_f1"),
        ("nn_nb_fewshot", "generate", "chrf"), ("ud_bokmaal_bits_per_byte", "bits_per_byte", "bits_per_byte")]
    assert all(os.path.isfile(p) for t in tasks for key in ("train_file", "validation_file") for p in t.flags.get(key, []))
    assert not [t.name for t in tasks if "dataset_name" in t.flags or "hub" in t.flags]  # the files, not the hub
    fewshot, _ = script_options(tasks[4])  # run_fewshot.py's flags; the defaults it has no option for left out
    assert fewshot.task_type == "choice" and fewshot.prompt == "Tekst: {text}\nSentiment:" and fewshot.seed == 42
    _, source, _, task_args, _ = script_options(tasks[0])
    assert source.validation_file[0].endswith("norec_sentence_binary_dev.json") and task_args.label_column == "label"
    assert script_options(tasks[2])[3].tag_column == "misc:name"  # run_token_classification.py's flags


def test_help(capsys):
    with pytest.raises(SystemExit) as e:
        evaluate_suite.main(["--help"])
    assert e.value.code == 0 and "--bootstrap_resamples" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# without a data folder: each task's hub dataset


NORWEGIAN = os.path.join(os.path.dirname(evaluate_suite.__file__), "configs", "suites", "norwegian.yaml")


def test_the_data_folder_is_the_flag_the_environment_or_the_shared_data_else_none(tmp_path, monkeypatch):
    from flaxlm.tasks.suite.suite_file import suite_data_dir
    scripts, shared = tmp_path / "repo", tmp_path / "shared" / "data"
    scripts.mkdir()
    monkeypatch.delenv("FLAXLM_DATA_DIR", raising=False)
    assert suite_data_dir(None, str(scripts)) is None  # no ../shared/data: the hub datasets
    assert suite_data_dir("mine", str(scripts)) == "mine"
    monkeypatch.setenv("FLAXLM_DATA_DIR", "env")
    assert suite_data_dir(None, str(scripts)) == "env" and suite_data_dir("mine", str(scripts)) == "mine"
    monkeypatch.delenv("FLAXLM_DATA_DIR")
    shared.mkdir(parents=True)
    assert os.path.samefile(suite_data_dir(None, str(scripts)), shared)


def test_norwegian_suite_without_data_hands_each_script_its_hub_dataset():
    """configs/suites/norwegian.yaml with no data folder: no file paths, each task's dataset and the flags that
    differ for it, parsed by its script's own options (nothing loaded: no network here)."""
    import json as json_
    from flaxlm.tasks.suite.suite_file import FILE_KEYS, read_suite, script_options
    tasks = {t.name: t for t in read_suite(NORWEGIAN, None)}
    assert {name: (t.flags["dataset_name"], t.flags.get("dataset_config_name")) for name, t in tasks.items()} == {
        "norec_sentence": ("ltg/norec_sentence", "binary"),
        "ud_upos": ("commul/universal_dependencies", "no_bokmaal"),
        "norne": ("EuroEval/norne-nb-mini", None),
        "nn_nb": ("NbAiLab/ndla_parallel_paragraphs", None),
        "norec_sentence_fewshot": ("ltg/norec_sentence", "binary"),
        "nn_nb_fewshot": ("NbAiLab/ndla_parallel_paragraphs", None),
        "ud_bokmaal_bits_per_byte": ("commul/universal_dependencies", "no_bokmaal")}
    assert not [key for t in tasks.values() for key in (*FILE_KEYS, "hub") if key in t.flags]
    _, source, _, sentiment, _ = script_options(tasks["norec_sentence"])
    assert (source.dataset_name, source.dataset_config_name) == (["ltg/norec_sentence"], ["binary"])
    assert (sentiment.sentence1_column, sentiment.label_column) == ("review", "sentiment")
    for name, tags in (("ud_upos", "upos"), ("norne", "labels")):
        _, source, _, tagging, _ = script_options(tasks[name])
        assert (tagging.tokens_column, tagging.tags_column) == ("tokens", tags) and source.train_file is None
    fewshot, source = script_options(tasks["norec_sentence_fewshot"])
    assert fewshot.prompt == "Tekst: {review}\nSentiment:" and fewshot.label_column == "sentiment"
    assert json_.loads(fewshot.choices) == {"0": " negativ", "1": " positiv"} and fewshot.num_fewshot == 4
    fewshot, source = script_options(tasks["nn_nb_fewshot"])  # the dataset's columns are the file's: nn, nb
    assert (fewshot.prompt, fewshot.target, source.dataset_name) == ("Nynorsk: {nn}\nBokmål:", " {nb}",
                                                                     ["NbAiLab/ndla_parallel_paragraphs"])
    (bits,) = script_options(tasks["ud_bokmaal_bits_per_byte"])
    assert (bits.dataset_split, bits.text_column, bits.validation_file) == ("validation", "text", None)
    seq2seq = tasks["nn_nb"].argv()  # run_seq2seq.py's options are not declared here: its command line
    assert seq2seq[seq2seq.index("--dataset_name") + 1] == "NbAiLab/ndla_parallel_paragraphs"
    assert seq2seq[seq2seq.index("--max_train_samples") + 1] == "2000" and "--train_file" not in seq2seq


def test_a_task_without_hub_dataset_needs_the_data_folder(tmp_path):
    from flaxlm.errors import UserError
    from flaxlm.tasks.suite.suite_file import read_suite
    with pytest.raises(UserError, match=r"task sentiment of .* has no 'hub' mapping with a dataset_name, and there is "
                                        r"no local data folder .*; pass --data_dir"):
        read_suite(suite_file(tmp_path, [GOOD]), None)


UPOS = ["NOUN", "PUNCT", "ADP", "VERB", "PRON", "PROPN"]
TAGGED = [(["Han", "bor", "i", "Oslo", "."], [4, 3, 2, 5, 1]), (["Oslo", "er", "en", "by"], [5, 3, 4, 0]),
          (["Hun", "bor", "i", "Bergen"], [4, 3, 2, 5]), (["Byen", "er", "fin", "."], [0, 3, 0, 1])]


def hub_folder(root, config, splits, features):
    """A folder laid out as a hub dataset repository (CONFIG/SPLIT-00000-of-00001.parquet and a README whose configs
    name them, as ltg/norec_sentence's), which datasets.load_dataset(root, config) reads as it reads the hub's."""
    import datasets
    (root / config).mkdir(parents=True)
    card = ["---", "configs:", f"- config_name: {config}", "  data_files:"]
    for split, rows in splits.items():
        datasets.Dataset.from_list(rows, features=features).to_parquet(str(root / config / f"{split}-00000-of-00001"
                                                                                           f".parquet"))
        card += [f"  - split: {split}", f"    path: {config}/{split}-*"]
    (root / "README.md").write_text("\n".join([*card, "---", ""]))
    return str(root)


def test_suite_without_data_runs_the_hub_datasets(roberta, tmp_path, monkeypatch, capsys):
    """No data folder: the tasks read their `hub` datasets through the scripts' --dataset_name (here local stand-ins:
    a folder laid out as a hub repository, with tags as ClassLabel ids and its validation split named val as
    EuroEval's are; a folder save_to_disk wrote, labels as ClassLabel ids), the class names in the predictions as
    transformers' scripts name them, the baselines from the same splits."""
    import datasets
    from flaxlm.tasks.suite import suite_file as suite_module
    tagged = hub_folder(tmp_path / "ud", "no_bokmaal", {
        "train": [{"tokens": w, "upos": t} for w, t in TAGGED[:3] * 3], "val": [{"tokens": w, "upos": t}
                                                                                for w, t in TAGGED[2:]]},
        datasets.Features({"tokens": datasets.Sequence(datasets.Value("string")),
                           "upos": datasets.Sequence(datasets.ClassLabel(names=UPOS))}))
    sentiment = datasets.Features({"review": datasets.Value("string"),
                                   "sentiment": datasets.ClassLabel(names=["negative", "positive"])})
    rows = [{"review": s, "sentiment": int(label == "pos")} for s, label in SENTENCES]
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows * 4, features=sentiment),
                          "validation": datasets.Dataset.from_list(rows, features=sentiment)}).save_to_disk(
        str(tmp_path / "norec" / "binary"))
    tasks = [{**GOOD, "hub": {"dataset_name": str(tmp_path / "norec"), "dataset_config_name": "binary",
                              "sentence1_column": "review", "label_column": "sentiment"}},
             {"name": "pos", "kind": "tagging", "train_file": "nowhere.conllu", "tag_column": "upos",
              "hub": {"dataset_name": tagged, "dataset_config_name": "no_bokmaal", "tags_column": "upos"}}]
    real = suite_module.suite_data_dir
    monkeypatch.setattr(suite_module, "suite_data_dir", lambda d, _: real(d, str(tmp_path / "no-shared-data")))
    monkeypatch.delenv("FLAXLM_DATA_DIR", raising=False)
    out = tmp_path / "out"
    evaluate_suite.main(["--model_name_or_path", roberta["encoder"], "--suite", suite_file(tmp_path, tasks),
                         "--output_dir", str(out), "--max_steps", "2", "--bootstrap_resamples", "50"])
    assert "each task loads its dataset from the Hugging Face hub" in capsys.readouterr().out
    results = {r["task"]: r for r in json.loads((out / "results.json").read_text())["results"]}
    assert not [r["error"] for r in results.values() if "error" in r]
    lines = [line.split("\t") for line in (out / "sentiment" / "predictions_validation.tsv").read_text().splitlines()]
    assert [r[2] for r in lines[1:]] == ["positive" if label == "pos" else "negative" for _, label in SENTENCES]
    assert results["sentiment"]["baseline"] == pytest.approx(100 * 4 / 6)  # 'positive', the training majority
    conll = scores.read_tagged_predictions(str(out / "pos" / "predictions_validation.conll"))
    assert [[(w, g) for w, g, _ in s] for s in conll] == [[(w, UPOS[t]) for w, t in zip(*s)] for s in TAGGED[2:]]
    assert results["pos"]["examples"] == 2 and results["pos"]["baseline"] is not None
