#!/usr/bin/env python
"""Fine-tune BERT/RoBERTa to classify (or score) sentences and sentence pairs: GLUE-style sentence prediction.

Pipeline: options -> output directory -> tokenizer -> examples and their labels -> model (the encoder of
--model_name_or_path, e.g. what run_mlm_flax.py exported, with a new classification head) -> token rows ->
training over all devices with evaluation (loss, accuracy and the task's metrics) and checkpoints -> predictions
files -> export in Hugging Face format (AutoModelForSequenceClassification) to --output_dir.

    python run_classification.py --output_dir runs/sst2 --model_name_or_path runs/my-model \
        --train_file train.tsv --validation_file dev.tsv --task_name sst2 --learning_rate 2e-5 --num_train_epochs 3
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from flaxlm.config.options import DataArgs, ModelArgs, SentencePredictionArgs, TextSourceArgs, TrainingArgs  # noqa: E402
from flaxlm.config.cli import parse_args  # noqa: E402
from flaxlm.errors import run_main  # noqa: E402


def main(argv=None):
    model_args, source, data_args, task_args, args = parse_args(
        ModelArgs, TextSourceArgs, DataArgs, SentencePredictionArgs, TrainingArgs, argv=argv,
        prog="run_classification.py", description=__doc__)
    from flaxlm.training import mesh as meshlib
    from flaxlm.data.rows import ShuffledRows, total_train_steps
    from flaxlm.models.hf_io import load_config
    from flaxlm.planning.compile_for import check_fit, compile_target
    from flaxlm.training.opening import load_model_and_mesh, load_run_tokenizer
    from flaxlm.training.output_dir import start_fresh
    from flaxlm.training.pipeline import export, resolve_seq_len, start_run, train_and_evaluate
    from flaxlm.data.sentence_data import label_names, load_examples, token_rows
    from flaxlm.tasks.sentence_prediction import (classifier_labels, majority_scores, resolve_task,
                                                  sentence_objective, write_predictions)
    from flaxlm.training.evaluation import collect_predictions

    start_run(args, model_args)  # join the other hosts; check --output_dir and the hub before any work
    target = compile_target(args)  # --compile_for: the TPU slice (nothing written, no host joined); else None
    task = resolve_task(task_args, source.text_column)

    # Examples and their labels (class names sorted; a checkpoint's own order kept when it names the same).
    examples = load_examples(source, task, data_args.validation_split_percentage, args.seed,
                             include_test=args.do_predict, max_train_samples=data_args.max_train_samples,
                             max_eval_samples=data_args.max_eval_samples,
                             need_validation=args.do_eval)  # --do_eval false: none needed
    model_path = model_args.model_name_or_path or model_args.config_name
    names = None
    if not task.is_regression:
        existing = load_config(model_path).id2label if model_path else None
        names = label_names(examples["train"], existing)

    # Tokenizer, model (the pretrained encoder with a classification head; --compile_for: shapes only), devices
    # (--compile_for: the TPU slice's) and batch sizes.
    tokenizer = load_run_tokenizer(model_args, model_path)
    tokenizer, config, graphdef, params, _, mesh, (micro_batch, eval_batch, global_batch) = load_model_and_mesh(
        args, model_args, target, tokenizer, task="sequence_classification", **classifier_labels(task, names))

    # Token rows, each split's in example order.
    seq_len = resolve_seq_len(data_args.max_seq_length, tokenizer, config)
    rows = token_rows(examples, tokenizer, seq_len, config, names)
    width = rows["train"]["input_ids"].shape[1]
    for split, r in rows.items():
        line = f"{split}: {len(r['labels'])} examples of {width} tokens ({examples[split].where})"
        if names is not None and split != "train" and examples[split].labels is not None:
            majority, scores = majority_scores(task, rows["train"]["labels"], r["labels"], len(names))
            line += (f"; always predicting the training set's majority class '{names[majority]}' scores "
                     + ", ".join(f"{m} {v:.4f}" for m, v in scores.items()))
        print(line, flush=True)

    # The rows of each step and the objective.
    train_rows = ShuffledRows(rows["train"], global_batch, args.seed)
    total_steps = total_train_steps(args, train_rows)
    labeled_test = rows["test"] if "test" in rows and examples["test"].labels is not None else None
    objective = sentence_objective(graphdef, config, task, width, tokenizer.pad_token_id)
    if target:  # --compile_for: compile the steps for the slice, print what each device holds; exit 2 unless they fit
        return check_fit(target, args, model_args, params, objective, mesh, micro_batch, eval_batch, rows["train"],
                         config.vocab_size)
    start_fresh(args)  # inputs all read

    # Train, evaluating the loss, accuracy and the task's metrics over the whole validation set.
    params = train_and_evaluate(args, model_args, params, objective, train_rows, rows.get("validation"), total_steps,
                                mesh, micro_batch, eval_batch, labeled_test, config=config)
    if params is None:  # --eval_checkpoints: an evaluation job
        return

    # Predictions files (index, predicted label, gold label when known) and the export in Hugging Face format.
    for split, do in (("validation", args.do_eval), ("test", args.do_predict)):
        if do:
            outputs = collect_predictions(params, objective, rows[split], eval_batch, mesh)
            if meshlib.is_main_process():
                path = os.path.join(args.output_dir, f"predictions_{split}.tsv")
                gold = rows[split]["labels"] if examples[split].labels is not None else None
                write_predictions(path, task, outputs["logits"], names, gold)
                print(f"wrote the {split} predictions to {path}", flush=True)
    export(args, model_args, config, params, tokenizer, "transformers.AutoModelForSequenceClassification")


if __name__ == "__main__":
    run_main(main)
