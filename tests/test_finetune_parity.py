"""Each fine-tuning script learns as transformers' PyTorch loop does: started from the same weights (a checkpoint that
already holds the task's head, made by transformers), with dropout off, on the same batches with the same AdamW,
schedule, weight decay and clipping, every step's training loss of our script equals the loss of the PyTorch loop
bench/finetune_vs_torch.py runs (bench/torch_finetune.py), and so does the dev metric. What is left between the two
in that bench (its table in docs/fine-tuning.md) is then what the seeds draw: the dropout masks (both sides start from
one draw of the new head there; with --heads own each draws its own, drawn alike: the last test here)."""
import json
import os
import sys

import numpy as np
import pytest

import run_classification
import run_qa
import run_seq2seq
import run_token_classification
from run_helpers import REPO, read_metrics

sys.path.insert(0, REPO)
from bench.torch_finetune import finetune  # noqa: E402

WORDS = ["Kari", "Ola", "Oslo", "Bergen", "besøkte", "likte", "en", "stor", "by", "."]
STEPS = 6
# A step's loss, ours against the PyTorch loop's, both float32: measured here, ours lands within 5e-6 (relative) of
# the PyTorch loop run in float64 over the STEPS steps of every case, PyTorch's float32 loop within 2e-7 of it; 10x
# ours. What this catches was 6e-4 to 4e-2 (a loss over padding, an untied LM head, a trained padding row).
LOSS_RTOL = 5e-5


def _without_dropout(config):
    for key in ("hidden_dropout_prob", "attention_probs_dropout_prob", "dropout_rate", "classifier_dropout"):
        if hasattr(config, key):
            setattr(config, key, 0.0)
    return config


def checkpoint(model_dir, tmp_path, auto_class=None, **labels):
    """model_dir's tokenizer and config as a checkpoint, dropout off: with the task's head made by transformers'
    auto_class, or (a T5, whose head is its LM head) made here: transformers 5 builds a new T5 v1.1 with its LM head
    tied to the embeddings and saves it without lm_head.weight, which loads back untied here."""
    import shutil

    import torch
    import transformers
    out = tmp_path / "checkpoint"
    if auto_class:
        torch.manual_seed(0)
        config = _without_dropout(transformers.AutoConfig.from_pretrained(model_dir, **labels))
        getattr(transformers, auto_class).from_config(config).save_pretrained(out)
    else:
        from flaxlm.models import create_model, load_config, save_pretrained, split_model
        config = _without_dropout(load_config(model_dir))
        save_pretrained(str(out), config, split_model(create_model(config, seed=0))[1])
    for name in os.listdir(model_dir):
        if name != "config.json":
            shutil.copy(os.path.join(model_dir, name), out / name)
    return str(out)


def sentences(n, seed):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        words = [str(w) for w in rng.choice(WORDS, size=int(rng.integers(3, 8)))]
        out.append((words, ["B-PER" if w in ("Kari", "Ola") else "B-LOC" if w in ("Oslo", "Bergen") else "O"
                            for w in words]))
    return out


def write_lines(path, records):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return str(path)


def token_case(model_dir_for, tmp_path):
    names = ["B-LOC", "B-PER", "O"]
    ckpt = checkpoint(model_dir_for("roberta-tiny"), tmp_path, "AutoModelForTokenClassification",
                         id2label=dict(enumerate(names)), label2id={n: i for i, n in enumerate(names)})
    flags = ["--train_file", write_lines(tmp_path / "train.jsonl", [{"tokens": w, "tags": t} for w, t in sentences(32, 0)]),
             "--validation_file", write_lines(tmp_path / "dev.jsonl", [{"tokens": w, "tags": t}
                                                                        for w, t in sentences(8, 1)])]
    return run_token_classification, "run_token_classification.py", ckpt, flags, "f1"


def classification_case(model_dir_for, tmp_path):
    names = ["negative", "positive"]
    ckpt = checkpoint(model_dir_for("roberta-tiny"), tmp_path, "AutoModelForSequenceClassification",
                         id2label=dict(enumerate(names)), label2id={n: i for i, n in enumerate(names)})

    def examples(n, seed):
        return [{"text": " ".join(w), "label": names["likte" in w]} for w, _ in sentences(n, seed)]
    flags = ["--train_file", write_lines(tmp_path / "train.jsonl", examples(32, 2)),
             "--validation_file", write_lines(tmp_path / "dev.jsonl", examples(8, 3)), "--sentence1_column", "text"]
    return run_classification, "run_classification.py", ckpt, flags, "accuracy"


def qa_case(model_dir_for, tmp_path):
    ckpt = checkpoint(model_dir_for("roberta-tiny", "bpe", 400, model_max_length=128), tmp_path,
                         "AutoModelForQuestionAnswering")
    paragraphs = []
    for i, (words, _) in enumerate(sentences(24, 4)):
        context = "Filler text here. " * (i % 3) + " ".join(words) + " is what happened."
        answer = words[0]
        paragraphs.append({"context": context, "qas": [{"id": f"q{i}", "question": f"Who was first in {i}?",
                                                        "answers": [{"text": answer,
                                                                     "answer_start": context.index(answer)}]}]})
    path = tmp_path / "squad.json"
    path.write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": paragraphs}]}))
    return run_qa, "run_qa.py", ckpt, ["--train_file", str(path), "--validation_file", str(path),
                                       "--max_seq_length", "64", "--doc_stride", "32"], "f1"


def seq2seq_case(model_dir_for, tmp_path):
    ckpt = checkpoint(model_dir_for("t5-v1_1-tiny", "unigram"), tmp_path)
    pairs = [{"source": " ".join(w), "target": " ".join(w[::-1])} for w, _ in sentences(40, 5)]
    flags = ["--train_file", write_lines(tmp_path / "pairs.jsonl", pairs), "--source_column", "source",
             "--target_column", "target", "--validation_split_percentage", "20", "--max_source_length", "16",
             "--max_target_length", "16"]
    return run_seq2seq, "run_seq2seq.py", ckpt, flags, "chrf"


CASES = {"token_classification": token_case, "classification": classification_case, "qa": qa_case,
         "seq2seq": seq2seq_case}


@pytest.mark.parametrize("case", CASES)
def test_every_step_loses_what_transformers_loop_loses(case, model_dir_for, tmp_path):
    script, name, ckpt, flags, metric = CASES[case](model_dir_for, tmp_path)
    flags = [*flags, "--model_name_or_path", ckpt, "--train_batch_size", "8", "--max_steps", str(STEPS),
             "--learning_rate", "3e-3", "--warmup_steps", "2", "--weight_decay", "0.01", "--max_grad_norm", "0.5",
             "--seed", "3", "--do_train", "--do_eval", "--logging_steps", "1", "--eval_steps", "1000",
             "--report_to", "none"]
    script.main([*flags, "--output_dir", str(tmp_path / "run")])
    ours = [r["loss"] for r in read_metrics(tmp_path / "run", "train")]
    theirs = []
    figures = finetune(name, flags, ckpt, theirs)
    np.testing.assert_allclose(ours, theirs, rtol=LOSS_RTOL)
    assert read_metrics(tmp_path / "run", "eval")[-1][metric] == pytest.approx(figures[metric], abs=1e-6)


HEADS = {"sequence_classification": "AutoModelForSequenceClassification",
         "token_classification": "AutoModelForTokenClassification",
         "question_answering": "AutoModelForQuestionAnswering"}


@pytest.mark.parametrize("task", HEADS)
def test_a_new_head_is_drawn_as_transformers_draws_it(task, tmp_path):
    """The head a fine-tuning script puts on a pretrained encoder is drawn as transformers draws it when it loads the
    same checkpoint: the same tensors, biases exactly zero, weights of mean ~0 and standard deviation
    initializer_range. (bench/finetune_vs_torch.py lets both sides share one draw: on its tiny models one draw against
    another moves the dev figure by points.) Width 256: 512 to 65,536 numbers a weight, the std within 10%
    (a normal truncated at 2 std, or lecun_normal, is 12% or 3x off)."""
    import torch
    import transformers
    from flaxlm.models import load_for_task, split_model, to_hf_state_dict
    labels = {} if task == "question_answering" else {"num_labels": 8}
    config = transformers.RobertaConfig(vocab_size=64, hidden_size=256, num_hidden_layers=1, num_attention_heads=4,
                                        intermediate_size=64, max_position_embeddings=40, initializer_range=0.02,
                                        pad_token_id=1, **labels)
    torch.manual_seed(0)
    encoder = transformers.RobertaForMaskedLM(config)
    encoder.save_pretrained(tmp_path)
    base = {k.removeprefix("roberta.") for k in encoder.state_dict()}
    ref = {k: v.numpy() for k, v in getattr(transformers, HEADS[task]).from_pretrained(tmp_path, **labels)
           .state_dict().items() if k.removeprefix("roberta.") not in base}
    ours_config, model = load_for_task(str(tmp_path), task, seed=0, **labels)
    ours = {k: v for k, v in to_hf_state_dict(ours_config, split_model(model)[1]).items()
            if k.removeprefix("roberta.") not in base}
    assert sorted(ours) == sorted(ref) and ref, (sorted(ours), sorted(ref))
    for name, x in ours.items():
        x = np.asarray(x)
        assert x.shape == ref[name].shape, name
        if name.endswith("bias"):
            np.testing.assert_array_equal(x, 0.0)
            np.testing.assert_array_equal(ref[name], 0.0)
        else:
            for w in (x, ref[name]):
                assert abs(w.mean()) < 0.1 * 0.02, name
                assert w.std() == pytest.approx(0.02, rel=0.1), name
