"""Sentence prediction: run_classification.py end to end on a tiny pretrained RoBERTa, bad input, and the data,
label, objective and metric pieces it is made of."""
import json
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from huggingface_hub import ModelCard

import run_classification
import train_tokenizer
from run_helpers import read_metrics, tiny_pretrained_roberta
from flaxlm.config.options import SentencePredictionArgs, TextSourceArgs
from flaxlm.errors import UserError, run_main
from flaxlm.data.sentence_data import Examples, label_ids, label_names, load_examples, token_rows
from flaxlm.tasks.sentence_prediction import compute_metrics, majority_scores, resolve_task, sentence_objective

POSITIVE = ["good", "great", "fine", "lovely", "superb", "nice"]
NEGATIVE = ["bad", "awful", "poor", "terrible", "dull", "boring"]


def sentences(n, seed):
    """(sentence, label) pairs: the label is the sentiment of the one adjective."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        word = rng.choice(POSITIVE + NEGATIVE)
        out.append((f"the film was {word} .", "pos" if word in POSITIVE else "neg"))
    return out


def write_tsv(path, rows, header=("sentence", "label")):
    with open(path, "w", encoding="utf-8") as f:
        f.write("\t".join(header) + "\n")
        f.writelines("\t".join(r) + "\n" for r in rows)
    return str(path)


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A tiny RoBERTa as run_mlm_flax.py exports it, its tokenizer trained on the toy sentences."""
    return tiny_pretrained_roberta(tmp_path_factory.mktemp("pretrained"),
                                   [s for s, _ in sentences(200, 0)] + ["a movie , the plot , the actors ."])


def test_end_to_end_fine_tune_export_and_predictions(pretrained, tmp_path, capsys):
    out = tmp_path / "run"
    train_rows = sentences(96, 1)
    train = write_tsv(tmp_path / "train.tsv", train_rows)
    dev_rows = sentences(21, 2)
    dev = write_tsv(tmp_path / "dev.tsv", dev_rows)
    test = write_tsv(tmp_path / "test.tsv", [(s,) for s, _ in sentences(5, 3)], header=("sentence",))  # unlabeled
    run_classification.main([
        "--output_dir", str(out), "--model_name_or_path", pretrained, "--train_file", train, "--validation_file", dev,
        "--test_file", test, "--do_predict", "--metric", "accuracy,f1,macro_f1,matthews",
        "--per_device_train_batch_size", "2",
        "--learning_rate", "3e-3", "--warmup_steps", "5", "--max_steps", "40", "--logging_steps", "20",
        "--eval_steps", "20", "--eval_at_start", "--save_steps", "40"])

    # the baseline to beat: the training set's majority class, scored on the dev set by every metric
    majority = max(("neg", "pos"), key=[label for _, label in train_rows].count)
    hits = sum(label == majority for _, label in dev_rows)
    baseline = re.search(r"always predicting the training set's majority class '(\w+)' scores accuracy ([\d.]+), "
                         r"f1 ([\d.]+), macro_f1 ([\d.]+), matthews ([-\d.]+)", capsys.readouterr().out)
    assert baseline.group(1) == majority and float(baseline.group(2)) == pytest.approx(hits / 21, abs=1e-4)
    assert float(baseline.group(4)) == pytest.approx(hits / 21 / (1 + hits / 21), abs=1e-4)  # one class's F1, halved
    assert float(baseline.group(5)) == 0.0

    evals = read_metrics(out, "eval")
    assert [r["step"] for r in evals] == [0, 20, 40]
    assert set(evals[-1]) >= {"loss", "accuracy", "f1", "macro_f1", "matthews"} and "perplexity" not in evals[-1]
    assert evals[-1]["accuracy"] == 1.0 and evals[-1]["matthews"] == 1.0  # learned the toy task
    assert evals[-1]["macro_f1"] == 1.0
    card = ModelCard.load(out / "README.md")  # fine-tuned from the pretrained model, with its final figures
    assert card.data.base_model is None and f"the local model `{pretrained}`" in card.text  # a folder: no hub id
    assert card.data.pipeline_tag == "text-classification"
    assert "| eval | macro_f1 | 1.0 |" in card.text
    assert evals[-1]["loss"] < 0.5 * evals[0]["loss"]
    assert not read_metrics(out, "test")  # an unlabeled test split is only predicted

    # the export loads as a RoBERTa classifier whose predictions are the predictions file's
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    hf, info = AutoModelForSequenceClassification.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert type(hf).__name__ == "RobertaForSequenceClassification" and hf.config.id2label == {0: "neg", 1: "pos"}
    tok = AutoTokenizer.from_pretrained(out)
    enc = tok([s for s, _ in dev_rows], padding=True, return_tensors="np")
    with torch.no_grad():
        theirs = hf.eval()(input_ids=torch.tensor(enc["input_ids"]),
                           attention_mask=torch.tensor(enc["attention_mask"])).logits.numpy()
    from flaxlm.models import load_for_task
    _, ours = load_for_task(str(out), "sequence_classification")
    np.testing.assert_allclose(np.asarray(ours(jnp.asarray(enc["input_ids"]), jnp.asarray(enc["attention_mask"]))),
                               theirs, atol=1e-4, rtol=0)
    with open(out / "predictions_validation.tsv") as f:
        lines = f.read().splitlines()
    assert lines[0] == "index\tprediction\tlabel" and len(lines) == 1 + len(dev_rows)
    assert [line.split("\t")[1] for line in lines[1:]] == [hf.config.id2label[int(i)] for i in theirs.argmax(-1)]
    assert [line.split("\t")[1] for line in lines[1:]] == [label for _, label in dev_rows]
    assert [line.split("\t")[2] for line in lines[1:]] == [label for _, label in dev_rows]  # the gold labels
    with open(out / "predictions_test.tsv") as f:
        lines = f.read().splitlines()
    assert lines[0] == "index\tprediction" and len(lines) == 1 + 5  # unlabeled: no gold column


@pytest.mark.parametrize("case,message", [
    ("unseen_label", r"label 'meh' of example 1 of --validation_file .*dev.tsv is not one of the training labels "
                     r"\(neg, pos\)"),
    ("missing_column", r"--train_file .*train.tsv has no column 'review' \(columns: sentence, label\); pass "
                       r"--sentence1_column"),
    ("pair_one_column", r"has no column 'sentence1' \(columns: sentence, label\); rte is a sentence-pair task: each "
                        r"example needs columns sentence1 and sentence2"),
    ("second_column_missing", r"has no column 'hypothesis' \(columns: sentence, label\).*pass --sentence2_column"),
])
def test_bad_input_one_line_exit_2(pretrained, tmp_path, capsys, case, message):
    train = write_tsv(tmp_path / "train.tsv", sentences(16, 1))
    dev = write_tsv(tmp_path / "dev.tsv", [("so so", "pos"), ("it was fine", "meh")])
    extra = {"unseen_label": [], "missing_column": ["--sentence1_column", "review"],
             "pair_one_column": ["--task_name", "rte"], "second_column_missing": ["--sentence2_column", "hypothesis"]}
    argv = ["--output_dir", str(tmp_path / "out"), "--model_name_or_path", pretrained, "--train_file", train,
            "--validation_file", dev, *extra[case]]
    with pytest.raises(SystemExit) as e:
        run_main(lambda: run_classification.main(argv))
    lines = [line.strip() for line in capsys.readouterr().err.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]  # the rest: datasets' progress bars
    assert e.value.code == 2 and len(errors) == 1 and lines[-1] == errors[0], lines
    assert re.search(message, errors[0]), errors[0]
    assert not os.path.exists(tmp_path / "out" / "model.safetensors")


def test_a_model_directory_without_weights_is_refused(pretrained, tmp_path):
    """Fine-tuning starts from trained weights: a --model_name_or_path that holds only config.json (and the
    tokenizer) is an error that names --config_name, the way to train from scratch."""
    import shutil
    bare = tmp_path / "bare"
    shutil.copytree(pretrained, bare)
    (bare / "model.safetensors").unlink()
    train = write_tsv(tmp_path / "train.tsv", sentences(16, 1))
    with pytest.raises(UserError, match=r"no model weights \(model.safetensors\) in .*bare; pass a pretrained model "
                                        r"directory, or --config_name .*bare to train from scratch"):
        run_classification.main(["--output_dir", str(tmp_path / "out"), "--model_name_or_path", str(bare),
                                 "--train_file", train])
    assert not os.path.exists(tmp_path / "out" / "model.safetensors")


def test_glue_task_defaults_and_metric_choice():
    def task(**kw):
        return resolve_task(SentencePredictionArgs(**kw))
    assert task(task_name="cola").metrics == ("matthews",)
    assert task(task_name="mrpc").metrics == ("f1", "accuracy") and task(task_name="mrpc").sentence2_column == "sentence2"
    stsb = task(task_name="stsb")
    assert stsb.is_regression and stsb.metrics == ("pearson", "spearman")
    assert task(task_name="qnli").sentence1_column == "question"
    assert task().metrics == ("accuracy",) and task(is_regression=True).metrics == ("pearson",)
    assert task(task_name="sst2", metric="f1, matthews").metrics == ("f1", "matthews")
    with pytest.raises(UserError, match="--metric pearson does not apply to classification"):
        task(metric="pearson")
    with pytest.raises(UserError, match="--task_name imdb is not a GLUE task"):
        task(task_name="imdb")
    # the recipes parse for run_classification.py and name their task
    from flaxlm.config.options import DataArgs, ModelArgs, TrainingArgs
    from flaxlm.config.cli import parse_args
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for recipe, metrics in (("sst2", ("accuracy",)), ("norec_sentence", ("accuracy", "macro_f1"))):
        *_, sp, train_args = parse_args(ModelArgs, TextSourceArgs, DataArgs, SentencePredictionArgs, TrainingArgs,
                                        argv=["--config_file", f"{repo}/configs/{recipe}.yaml", "--output_dir", "x"],
                                        prog="run_classification.py")
        assert resolve_task(sp).metrics == metrics and train_args.train_batch_size == 32


def test_metrics_match_their_definitions():
    cls = resolve_task(SentencePredictionArgs(metric="accuracy,f1,matthews"))
    logits = np.array([[1, 0], [0, 1], [0, 1], [1, 0], [0, 1]], np.float32)  # predicts 0 1 1 0 1
    got = compute_metrics(cls, {"logits": logits, "labels": np.array([0, 1, 0, 0, 1])})
    # tp 2, fp 1, fn 0, tn 2: f1 = 2*2 / (2*2 + 1) = 0.8; mcc = (2*2 - 1*0) / sqrt(3*2*2*3) = 4/6
    assert got == pytest.approx({"accuracy": 0.8, "f1": 0.8, "matthews": 4 / 6})
    # macro F1 is the mean over the classes, a class never predicted counting 0: predicting all 0 on 0 0 0 1
    # gives class 0 F1 = 2*3 / (2*3 + 1) and class 1 F1 = 0
    macro = resolve_task(SentencePredictionArgs(metric="macro_f1"))
    got = compute_metrics(macro, {"logits": np.tile([[1.0, 0.0]], (4, 1)), "labels": np.array([0, 0, 0, 1])})
    assert got == pytest.approx({"macro_f1": 3 / 7})
    # the majority baseline: the training set's most frequent class, scored with accuracy and the task's metrics
    majority, scores = majority_scores(resolve_task(SentencePredictionArgs(metric="macro_f1,matthews")),
                                       np.array([1, 0, 0]), np.array([0, 0, 0, 1]), 2)
    assert majority == 0 and scores == pytest.approx({"accuracy": 0.75, "macro_f1": 3 / 7, "matthews": 0.0})
    reg = resolve_task(SentencePredictionArgs(task_name="stsb"))
    got = compute_metrics(reg, {"logits": np.array([[1.0], [2.0], [4.0]]), "labels": np.array([1.0, 2.0, 3.0])})
    assert got["spearman"] == pytest.approx(1.0) and got["pearson"] == pytest.approx(0.9819805, abs=1e-6)


def test_labels_sorted_stable_and_checked():
    ex = Examples("--train_file t", ["a"] * 4, None, [10, 2, 2.0, True])
    assert label_names(ex) == ["1", "2", "10"]  # numerically sorted ids
    names = label_names(Examples("t", ["a"] * 3, None, ["Positive", "Negative", "Positive"]))
    assert names == ["Negative", "Positive"]
    assert label_names(Examples("t", ["a"] * 2, None, ["neg", "pos"]), {0: "pos", 1: "neg"}) == ["pos", "neg"]
    np.testing.assert_array_equal(label_ids(Examples("t", ["a"] * 2, None, ["Positive", "Negative"]), names), [1, 0])
    with pytest.raises(UserError, match="only one class"):
        label_names(Examples("t", ["a"], None, ["x"]))


def test_json_records_and_pair_rows(tmp_path):
    """A JSON list of records (the NoReC sentence files' form) and a BERT pair task: rows are what the
    tokenizer makes of each pair, with token types, in example order; test labels of -1 mean unlabeled."""
    from transformers import BertConfig
    records = [{"id": i, "premise": f"the film was {w} .", "hypothesis": f"it is {w}", "label": lab}
               for i, (w, lab) in enumerate([("good", "yes"), ("bad", "no"), ("fine", "yes")])]
    (tmp_path / "train.json").write_text(json.dumps(records))
    (tmp_path / "test.jsonl").write_text("".join(json.dumps({**r, "label": -1}) + "\n" for r in records[:2]))
    source = TextSourceArgs(train_file=[str(tmp_path / "train.json")], test_file=[str(tmp_path / "test.jsonl")])
    task = resolve_task(SentencePredictionArgs(task_name="mnli"))
    examples = load_examples(source, task, 34, seed=0, include_test=True)
    assert len(examples["train"].text1) + len(examples["validation"].text1) == 3 and examples["test"].labels is None
    d = tmp_path / "tok"
    (tmp_path / "c.txt").write_text("".join(f"{r['premise']} {r['hypothesis']}\n" for r in records) * 20)
    train_tokenizer.main(["--type", "wordpiece", "--train_file", str(tmp_path / "c.txt"), "--vocab_size", "120",
                          "--output_dir", str(d)])
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(d)
    names = label_names(examples["train"])
    rows = token_rows(examples, tok, 64, BertConfig(type_vocab_size=2), names)
    want = tok(examples["test"].text1, examples["test"].text2)
    r = rows["test"]
    assert r["input_ids"].shape[1] % 8 == 0 and r["input_ids"].shape[1] < 64
    for i in range(2):
        n = len(want["input_ids"][i])
        assert r["input_ids"][i, :n].tolist() == want["input_ids"][i] and r["attention_mask"][i].sum() == n
        assert r["token_type_ids"][i, :n].tolist() == want["token_type_ids"][i] and r["token_type_ids"][i].max() == 1
        assert (r["input_ids"][i, n:] == tok.pad_token_id).all()


def test_objective_losses_match_hugging_face_definitions():
    """Mean cross-entropy over examples (classification), mean squared error (regression, one output)."""
    import torch
    from flaxlm import models
    from flaxlm.models import task_config
    from parity import batch
    from test_parity import CASE
    roberta = CASE["roberta-gelu"]  # initializer_range 0.2: logits far from 0
    for regression in (False, True):
        config = task_config(roberta.config(), "sequence_classification", num_labels=1 if regression else 3)
        graphdef, params = models.split_model(models.create_model(config, task="sequence_classification"))
        ids, mask, types = batch(roberta, config=config).args
        task = resolve_task(SentencePredictionArgs(is_regression=regression))
        objective = sentence_objective(graphdef, config, task, ids.shape[1], config.pad_token_id)
        labels = np.array([0.5, -1.0], np.float32) if regression else np.array([2, 0], np.int32)
        rows = {"input_ids": ids.astype(np.int32), "attention_mask": mask.astype(np.int32),
                "token_type_ids": np.zeros_like(ids, np.int32), "labels": labels}
        b = objective.collate(rows, None)
        sums, out = jax.jit(lambda p, b: (objective.loss_sums(p, b, None), objective.predict(p, b)))(params, b)
        logits = torch.tensor(np.asarray(out["logits"]))
        ref = (torch.nn.functional.mse_loss(logits[:, 0], torch.tensor(labels)) if regression
               else torch.nn.functional.cross_entropy(logits, torch.tensor(labels, dtype=torch.long)))
        assert float(sums["weight_sum"]) == 2
        assert float(sums["loss_sum"]) / 2 == pytest.approx(float(ref), rel=1e-5)
        if not regression:
            assert float(sums["accuracy_sum"]) == float((logits.argmax(-1).numpy() == labels).sum())
