#!/usr/bin/env python
"""Fine-tune a T5-style encoder-decoder (t5, mt5, umt5, ByT5) on source -> target texts: translation,
summarization, normalization.

Pipeline: options -> output directory -> tokenizer -> source/target pairs (a validation split held out of the
training file when there is no validation file) -> model (--model_name_or_path, e.g. what run_t5_mlm_flax.py
exported) -> token rows -> teacher-forced training over all devices; every evaluation reports the loss and
generates (greedy, or beam search with --num_beams) to report BLEU, chrF (sacrebleu) and ROUGE (rouge-score) ->
predictions file (predictions_validation.jsonl: source, reference, prediction) -> export in Hugging Face format
(AutoModelForSeq2SeqLM) to --output_dir.

    python run_seq2seq.py --output_dir runs/nn-nb --model_name_or_path runs/t5-no \\
        --train_file nn_nb.jsonl --source_column nn --target_column nb --validation_split_percentage 10 \\
        --learning_rate 5e-4 --num_train_epochs 3 --num_beams 4
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from flaxlm.config.options import DataArgs, ModelArgs, Seq2SeqArgs, TextSourceArgs, TrainingArgs  # noqa: E402
from flaxlm.config.cli import parse_args  # noqa: E402
from flaxlm.errors import UserError, run_main  # noqa: E402


def main(argv=None):
    model_args, source, data_args, task_args, args = parse_args(
        ModelArgs, TextSourceArgs, DataArgs, Seq2SeqArgs, TrainingArgs, argv=argv, prog="run_seq2seq.py",
        description=__doc__)
    from flaxlm.training import mesh as meshlib
    from flaxlm.data.rows import ShuffledRows, total_train_steps
    from flaxlm.models import load_config
    from flaxlm.models.t5_generation import GenerationOptions
    from flaxlm.planning.compile_for import check_fit, compile_target
    from flaxlm.training.opening import load_model_and_mesh, load_run_tokenizer
    from flaxlm.training.output_dir import start_fresh
    from flaxlm.training.pipeline import export, start_run, train_and_evaluate
    from flaxlm.data.seq2seq_data import load_pairs, token_rows
    from flaxlm.tasks.seq2seq import (check_seq2seq_model, copy_baseline, decode, seq2seq_objective,
                                      write_predictions)
    from flaxlm.objectives.span_lm import check_decoder_start
    from flaxlm.training.evaluation import collect_predictions

    if args.do_predict:
        raise UserError("run_seq2seq.py evaluates and predicts the validation split only; drop --do_predict and "
                        "pass the examples to predict as --validation_file")
    start_run(args, model_args)  # join the other hosts; check --output_dir and the hub before any work
    target = compile_target(args)  # --compile_for: the TPU slice (nothing written, no host joined); else None

    # Source/target pairs, each split's in file order.
    pairs = load_pairs(source, task_args.source_column or source.text_column or "source", task_args.target_column,
                       data_args.validation_split_percentage, args.seed,
                       max_train_samples=data_args.max_train_samples, max_eval_samples=data_args.max_eval_samples,
                       need_validation=args.do_eval)  # --do_eval false: none needed

    # Tokenizer, model (the pretrained encoder-decoder, all of it fine-tuned; --compile_for: shapes only), devices
    # (--compile_for: the TPU slice's) and batch sizes.
    model_path = model_args.model_name_or_path or model_args.config_name
    tokenizer = load_run_tokenizer(model_args, model_path)
    if model_path:
        check_seq2seq_model(load_config(model_path), model_path)
    tokenizer, config, graphdef, params, _, mesh, (micro_batch, eval_batch, global_batch) = load_model_and_mesh(
        args, model_args, target, tokenizer, script="run_t5_mlm_flax.py")
    check_decoder_start(config)
    opts = GenerationOptions(max_length=task_args.generation_max_length or task_args.max_target_length,
                             decoder_start_token_id=config.decoder_start_token_id,
                             eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                             num_beams=task_args.num_beams, length_penalty=task_args.length_penalty)

    # Token rows; the copy-the-source baseline on the validation split.
    rows = token_rows(pairs, tokenizer, task_args.source_prefix, task_args.max_source_length,
                      task_args.max_target_length)
    widths = rows["train"]["input_ids"].shape[1], rows["train"]["labels"].shape[1]
    for split, r in rows.items():
        print(f"{split}: {len(r['index'])} examples, sources of {widths[0]} tokens, targets of {widths[1]} "
              f"({pairs[split].where})", flush=True)
    val = pairs.get("validation")
    if val is not None:
        baseline = copy_baseline(val.sources, val.targets)
        print(f"copying the source scores BLEU {baseline['bleu']:.2f}, chrF {baseline['chrf']:.2f} on validation",
              flush=True)

    # The rows of each step and the objective.
    train_rows = ShuffledRows(rows["train"], global_batch, args.seed)
    total_steps = total_train_steps(args, train_rows)
    objective = seq2seq_objective(graphdef, config, widths, opts, tokenizer, val and val.targets)
    if target:  # --compile_for: compile the steps for the slice, print what each device holds; exit 2 unless they fit
        return check_fit(target, args, model_args, params, objective, mesh, micro_batch, eval_batch, rows["train"],
                         config.vocab_size)
    start_fresh(args)  # inputs all read

    # Train; every evaluation: the loss, then generation and its BLEU / chrF / ROUGE.
    params = train_and_evaluate(args, model_args, params, objective, train_rows, rows.get("validation"), total_steps,
                                mesh, micro_batch, eval_batch, config=config)
    if params is None:  # --eval_checkpoints: an evaluation job
        return

    # The predictions file (source, reference, prediction) and the export in Hugging Face format.
    if args.do_eval:
        outputs = collect_predictions(params, objective, rows["validation"], eval_batch, mesh)
        if meshlib.is_main_process():
            path = os.path.join(args.output_dir, "predictions_validation.jsonl")
            write_predictions(path, val.sources, val.targets, decode(tokenizer, outputs["tokens"]))
            print(f"wrote the validation predictions to {path}", flush=True)
    export(args, model_args, config, params, tokenizer, "transformers.AutoModelForSeq2SeqLM")


if __name__ == "__main__":
    run_main(main)
