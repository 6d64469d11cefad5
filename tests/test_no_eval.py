"""--do_eval false trains without validation data, as transformers' and TRL's trainers train without an eval set: each
fine-tuning and post-training script, given only a training file (--validation_split_percentage 0), trains, logs no
evaluation and exports; with --do_eval on (the default) the same command still stops with the one-line error that
names the missing validation data. (run_fewshot.py trains nothing: it is not here.)"""
import importlib
import json
import os

import pytest

from run_helpers import read_metrics
from flaxlm.errors import UserError

WORDS = ["good", "great", "bad", "awful", "fine", "dull"]


def write_lines(path, records):
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    return str(path)


def classification(d, model_dir_for):
    rows = [{"sentence": f"the film was {w} .", "label": "pos" if i % 2 else "neg"} for i, w in enumerate(WORDS * 3)]
    model = model_dir_for("roberta-tiny")
    return "run_classification", ["--config_name", model, "--tokenizer_name", model,
                                  "--train_file", write_lines(d / "train.jsonl", rows), "--max_seq_length", "32"]


def token_classification(d, model_dir_for):
    rows = [{"tokens": ["the", "film", "was", w], "tags": ["DET", "NOUN", "VERB", "ADJ"]} for w in WORDS * 3]
    model = model_dir_for("roberta-tiny")
    return "run_token_classification", ["--config_name", model, "--tokenizer_name", model,
                                        "--train_file", write_lines(d / "train.jsonl", rows), "--max_seq_length", "32"]


def question_answering(d, model_dir_for):
    context = "The film was made in Oslo by a small crew over three summers."
    answer = {"text": "Oslo", "answer_start": context.index("Oslo")}
    qas = [{"id": f"q{i}", "question": "Where was the film made?", "answers": [answer]} for i in range(8)]
    path = d / "train.json"
    path.write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": [
        {"context": context, "qas": qas}]}]}), encoding="utf-8")
    model = model_dir_for("roberta-tiny")
    return "run_qa", ["--config_name", model, "--tokenizer_name", model, "--train_file", str(path),
                      "--max_seq_length", "64", "--doc_stride", "16"]


def seq2seq(d, model_dir_for):
    rows = [{"source": f"the film was {w}", "target": f"{w} was film the"} for w in WORDS * 3]
    model = model_dir_for("t5-v1_1-tiny", "unigram")
    return "run_seq2seq", ["--config_name", model, "--tokenizer_name", model,
                           "--train_file", write_lines(d / "train.jsonl", rows), "--max_source_length", "16",
                           "--max_target_length", "16"]


def sft(d, model_dir_for):
    rows = [{"prompt": f"Was the film {w}?", "completion": f" Yes, {w}."} for w in WORDS * 3]
    model = model_dir_for("gpt2-tiny", vocab_size=304)
    return "run_sft", ["--config_name", model, "--tokenizer_name", model,
                       "--train_file", write_lines(d / "train.jsonl", rows), "--max_length", "32"]


def dpo(d, model_dir_for):
    rows = [{"prompt": f"Was the film {w}?", "chosen": f" Yes, {w}.", "rejected": " No."} for w in WORDS * 3]
    model = model_dir_for("gpt2-tiny", vocab_size=304)
    return "run_dpo", ["--config_name", model, "--tokenizer_name", model,
                       "--train_file", write_lines(d / "train.jsonl", rows), "--max_length", "32"]


def grpo(d, model_dir_for):
    rows = [{"prompt": f"Was the film {w}?", "answer": w} for w in WORDS * 3]
    model = model_dir_for("gpt2-tiny", vocab_size=304)
    return "run_grpo", ["--config_name", model, "--tokenizer_name", model,
                        "--train_file", write_lines(d / "train.jsonl", rows), "--num_generations", "4",
                        "--max_completion_length", "4", "--soft_punish_cache", "2"]


SCRIPTS = [classification, token_classification, question_answering, seq2seq, sft, dpo, grpo]
# run_qa.py has never needed validation data (it evaluates --validation_file when there is one)
NEEDS_VALIDATION = {"run_classification": "no validation examples", "run_token_classification":
                    "no validation sentences", "run_seq2seq": "no validation examples", "run_sft":
                    "no validation examples", "run_dpo": "no validation examples", "run_grpo": "no validation examples"}


@pytest.mark.parametrize("script_args", SCRIPTS, ids=lambda f: f.__name__)
def test_do_eval_false_trains_and_exports_without_validation_data(script_args, model_dir_for, tmp_path, capsys):
    name, argv = script_args(tmp_path, model_dir_for)
    main = importlib.import_module(name).main
    argv += ["--validation_split_percentage", "0", "--per_device_train_batch_size", "1", "--max_steps", "2",
             "--logging_steps", "1", "--report_to", "none"]
    if name in NEEDS_VALIDATION:  # evaluating (the default) without validation data: the one-line error
        with pytest.raises(UserError, match=NEEDS_VALIDATION[name]):
            main(argv + ["--output_dir", str(tmp_path / "evaluating")])
    out = tmp_path / "run"
    main(argv + ["--output_dir", str(out), "--do_eval", "false"])
    assert [r["step"] for r in read_metrics(out)] == [1, 2]  # trained
    assert read_metrics(out, "eval") == []  # and never evaluated
    assert os.path.exists(out / "config.json") and os.path.exists(out / "model.safetensors")
    assert f"exported the model and tokenizer to {out}" in capsys.readouterr().out
    assert not any(f.startswith("predictions") for f in os.listdir(out))
