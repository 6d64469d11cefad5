#!/usr/bin/env python
"""Judge a causal LM few-shot, as NorEval and EuroEval judge Norwegian decoders: k solved examples from the training
split, then each question; no training.

    python run_fewshot.py --model_name_or_path runs/my-gpt2 --output_dir runs/my-gpt2-norec \\
        --train_file norec_sentence_binary_train.json --validation_file norec_sentence_binary_dev.json \\
        --prompt 'Tekst: {text}\\nSentiment:' --choices '{"Positive": " positiv", "Negative": " negativ"}' \\
        --num_fewshot 4
    python run_fewshot.py ... --task_type generate --train_file nn_nb_dev.jsonl --validation_split_percentage 10 \\
        --prompt 'Nynorsk: {nn}\\nBokmål:' --target ' {nb}' --stop '\\n' --num_fewshot 3
    python run_fewshot.py --model_name_or_path runs/sft --output_dir runs/sft-norquad --task_type generate --chat \\
        --train_file qa_train.jsonl --validation_file qa_test.jsonl --prompt '{question}' --target '{answer}' \\
        --metric squad --answers_column answers

Pipeline: options -> the model (a causal LM) and its tokenizer -> the examples (json/jsonl/csv/parquet files or a
hub dataset; the questions: --validation_file, else a seeded held-out share of train) -> the prompt of each question
(--num_fewshot solved examples drawn by --seed, joined by --separator) -> choice: each choice's log-likelihood after
the prompt, the best one the answer (lm-eval's acc); generate: greedy generation until a --stop string -> the
predictions file (OUTPUT_DIR/predictions_validation.jsonl) and the scores (results.json, printed): accuracy, macro F1
and MCC (scikit-learn), or chrF and BLEU (sacrebleu), or with --metric squad exact match and F1 (run_qa.py's). With
--chat (a run_sft.py export) each question is a user turn of the model's chat template, the solved examples earlier
turns, and the answer ends with its turn. In --prompt, --separator, --target and --stop, \\n and \\t stand for a
line break and a tab.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from flaxlm.config.cli import parse_args  # noqa: E402
from flaxlm.config.options import FewShotArgs, TextSourceArgs  # noqa: E402
from flaxlm.errors import UserError, run_main  # noqa: E402

PREDICTIONS = "predictions_validation.jsonl"


def unescape(text):
    return None if text is None else text.replace("\\n", "\n").replace("\\t", "\t")


def read_questions(args, source):
    """(training rows, question rows) as lists of dicts: the fine-tuning scripts' reader and held-out split."""
    from flaxlm.data.sentence_data import read_splits
    splits, _ = read_splits(source, args.validation_split_percentage, args.seed, False, args.max_train_samples,
                            args.max_eval_samples, "few-shot evaluation")
    return splits["train"].to_list(), splits["validation"].to_list()


def check_task(args, columns):
    """The task's pieces, checked against the data's columns before the model loads: (template, choices, target)."""
    from flaxlm.tasks.fewshot import PromptTemplate, check_choices, template_columns
    template = PromptTemplate(unescape(args.prompt), unescape(args.separator))
    template.check(columns, "--prompt")
    if args.task_type == "choice":
        if args.label_column not in columns:
            raise UserError(f"--label_column {args.label_column} is not a column of the data (columns: "
                            f"{', '.join(columns)}); pass the column of the gold labels")
        try:
            choices = json.loads(args.choices) if args.choices else None
        except ValueError as e:
            raise UserError(f"--choices is not JSON ({e}); give each label's text, e.g. "
                            f"'{{\"Positive\": \" positiv\", \"Negative\": \" negativ\"}}'") from None
        return template, check_choices(choices, "--choices"), None
    if not args.target:
        raise UserError("--task_type generate needs --target, the answer as a template over the columns (e.g. ' {nb}')")
    target = PromptTemplate(unescape(args.target))
    target.check(columns, "--target")
    source = args.source_column or template_columns(template.prompt_text)[0]
    for flag, column in (("--source_column", source), ("--answers_column", args.answers_column)):
        if column is not None and column not in columns:
            raise UserError(f"{flag} {column} is not a column of the data (columns: {', '.join(columns)})")
    return template, None, (target, source)


def main(argv=None):
    args, source = parse_args(FewShotArgs, TextSourceArgs, argv=argv, prog="run_fewshot.py", description=__doc__)
    from flaxlm.files import check_writable_dir
    from flaxlm.models.hf_io import resolve_dir
    from flaxlm.tasks.lm_scoring import CausalLM

    # The model's kind and tokenizer, the output folder, the examples and the task: all checked before the weights load.
    path = resolve_dir(args.model_name_or_path)
    lm = CausalLM(path, args.tokenizer_name or path, args.model_name_or_path, args.max_length, adapter=args.adapter)
    if args.chat and args.task_type != "generate":
        raise UserError("--chat is for --task_type generate (a choice is scored as text after the prompt)")
    if args.chat and not lm.tokenizer.chat_template:
        raise UserError(f"--chat needs a chat template, which the tokenizer of {args.model_name_or_path} has not; "
                        f"pass a model run_sft.py exported, or drop --chat")
    check_writable_dir(args.output_dir)
    out_file = os.path.join(args.output_dir, PREDICTIONS)
    if os.path.exists(out_file) and not args.overwrite_output_dir:
        raise UserError(f"{out_file} exists; pass --overwrite_output_dir to replace it, or another --output_dir")
    train, questions = read_questions(args, source)
    template, choices, target = check_task(args, list(questions[0]))

    from flaxlm.tasks.fewshot import draw_shots
    from flaxlm.tasks.fewshot_runs import answer_choices, answer_generations
    lm.load(args.dtype, args.per_device_eval_batch_size, desc="choices")
    shots = draw_shots(train, args.num_fewshot, args.seed)
    if choices is not None:
        rows, results = answer_choices(lm, template, shots, questions, args.label_column, choices)
    else:
        rows, results = answer_generations(lm, template, shots, questions, *target, [unescape(s) for s in args.stop],
                                           args.max_new_tokens, metric=args.metric, chat=args.chat,
                                           answers_column=args.answers_column)
    os.makedirs(args.output_dir, exist_ok=True)
    with open(out_file, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    results = {"task_type": args.task_type, "num_fewshot": len(shots), "questions": len(rows), **results}
    with open(os.path.join(args.output_dir, "results.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
    print(json.dumps(results), flush=True)
    return results


if __name__ == "__main__":
    run_main(main)
