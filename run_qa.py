#!/usr/bin/env python
"""Fine-tune a BERT/RoBERTa for extractive question answering on SQuAD v1.1 / v2.0 json files.

Pipeline: options -> output directory -> tokenizer and model (the encoder of --model_name_or_path, e.g.
a model pretrained with run_mlm_flax.py, with a new start/end layer) -> SQuAD questions -> windows of
--max_seq_length tokens (long contexts split with --doc_stride) -> training over all devices, with
evaluation (exact match and F1, the official SQuAD definitions) and checkpoints -> predictions.json
(question id -> answer text) for --validation_file -> export in Hugging Face format to --output_dir
(loads in transformers.AutoModelForQuestionAnswering).

    python run_qa.py --output_dir runs/squad --model_name_or_path runs/my-model --train_file train-v1.1.json \
        --validation_file dev-v1.1.json --max_seq_length 384 --doc_stride 128 --learning_rate 3e-5 \
        --num_train_epochs 2 --per_device_train_batch_size 12
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from flaxlm.config.options import DataArgs, ModelArgs, QuestionAnsweringArgs, TextSourceArgs, TrainingArgs  # noqa: E402
from flaxlm.config.cli import parse_args  # noqa: E402
from flaxlm.errors import UserError, run_main  # noqa: E402

PREDICTIONS_FILE = "predictions.json"


def main(argv=None):
    model_args, source, data_args, qa_args, args = parse_args(
        ModelArgs, TextSourceArgs, DataArgs, QuestionAnsweringArgs, TrainingArgs, argv=argv, prog="run_qa.py",
        description=__doc__)
    from flaxlm.training import mesh as meshlib
    from flaxlm.data.rows import ShuffledRows, total_train_steps
    from flaxlm.planning.compile_for import check_fit, compile_target
    from flaxlm.training.opening import load_model_and_mesh, load_run_tokenizer
    from flaxlm.training.output_dir import start_fresh
    from flaxlm.training.pipeline import export, resolve_seq_len, start_run, train_and_evaluate
    from flaxlm.data.squad import read_squad, squad_windows
    from flaxlm.tasks.squad_objective import predicted_answers, squad_objective
    from flaxlm.training.evaluation import collect_predictions

    check_sources(source, args)
    start_run(args, model_args)  # join the other hosts; check --output_dir and the hub before any work
    target = compile_target(args)  # --compile_for: the TPU slice (nothing written, no host joined); else None

    # Tokenizer, model (the pretrained encoder with a start/end layer, new unless the checkpoint has one;
    # --compile_for: shapes only), devices (--compile_for: the TPU slice's) and batch sizes.
    tokenizer = load_run_tokenizer(model_args)
    tokenizer, config, graphdef, params, _, mesh, (micro_batch, eval_batch, global_batch) = load_model_and_mesh(
        args, model_args, target, tokenizer, task="question_answering")
    seq_len = resolve_seq_len(data_args.max_seq_length, tokenizer, config)

    # SQuAD questions -> windows of seq_len tokens, labelled with the answer's first and last token.
    train_rows, total_steps = None, 1
    if source.train_file:
        examples = read_squad(source.train_file, qa_args.version_2_with_negative, "train")
        rows, _ = squad_windows(examples[:data_args.max_train_samples], tokenizer, seq_len, qa_args.doc_stride)
        train_rows = ShuffledRows(rows, global_batch, args.seed)
        total_steps = total_train_steps(args, train_rows)
    eval_windows = None
    if source.validation_file and args.do_eval:
        examples = read_squad(source.validation_file, qa_args.version_2_with_negative, "validation")
        examples = examples[:data_args.max_eval_samples]
        rows, offsets_NL2 = squad_windows(examples, tokenizer, seq_len, qa_args.doc_stride, keep_offsets=True)
        eval_windows = (examples, rows, offsets_NL2)
    objective = squad_objective(graphdef, config, seq_len, tokenizer.pad_token_id, qa_args, eval_windows)
    if target:  # --compile_for: compile the steps for the slice, print what each device holds; exit 2 unless they fit
        sample = train_rows.rows if train_rows else eval_windows[1]
        return check_fit(target, args, model_args, params, objective, mesh, micro_batch, eval_batch, sample,
                         config.vocab_size)
    start_fresh(args)  # inputs all read

    # Train: start/end cross-entropy; evaluation reports exact match and F1 over the validation questions.
    params = train_and_evaluate(args, model_args, params, objective, train_rows, eval_windows and eval_windows[1],
                                total_steps, mesh, micro_batch, eval_batch, config=config)
    if params is None:
        return  # an evaluation job (--eval_checkpoints): nothing to write

    # The answers to the validation questions, then the export in Hugging Face format.
    if eval_windows is not None:
        outputs = collect_predictions(params, objective, eval_windows[1], eval_batch, mesh, args.seed)
        answers = predicted_answers(outputs, eval_windows, qa_args)
        if meshlib.is_main_process():
            path = os.path.join(args.output_dir, PREDICTIONS_FILE)
            with open(path, "w", encoding="utf-8") as f:
                json.dump(answers, f, ensure_ascii=False, indent=1)
            print(f"wrote the answers to {len(answers)} validation questions to {path}", flush=True)
    export(args, model_args, config, params, tokenizer, "transformers.AutoModelForQuestionAnswering")


def check_sources(source, args):
    """SQuAD json files only: a train file to train, a validation file to evaluate."""
    if source.dataset_name or source.streaming:
        raise UserError("run_qa.py reads SQuAD json files; pass --train_file / --validation_file instead of "
                        "--dataset_name / --streaming")
    if source.test_file or args.do_predict:
        raise UserError("run_qa.py scores --validation_file; to answer the questions of another SQuAD file, pass it "
                        "as --validation_file (with --do_train false and the fine-tuned model as --model_name_or_path)")
    if args.do_train and not source.train_file:
        raise UserError("no training questions: pass --train_file SQUAD.json, or --do_train false to only evaluate")
    if not args.do_train and not source.validation_file:
        raise UserError("nothing to do: pass --validation_file SQUAD.json to evaluate (or --train_file to train)")


if __name__ == "__main__":
    run_main(main)
