#!/usr/bin/env python
"""Judge a pretrained model: fine-tune and evaluate it on each task of a suite, then one table of the results.

Pipeline: options -> the suite file (tasks, their files under --data_dir, or without a data folder their datasets
on the Hugging Face hub, their scripts' flags; checked before any training) -> the tasks that fit the model
(encoders: classification, tagging, NER, QA; T5-style models: seq2seq; decoders: few-shot choice and generation,
bits per byte; the others skipped with a line) -> each task run by its
script (run_classification.py, run_token_classification.py, run_qa.py, run_seq2seq.py, run_fewshot.py,
evaluate_lm.py) into OUTPUT_DIR/<task>, one after another, a crash reported and the rest run -> each score
recomputed from the task's predictions file, with a 95% bootstrap interval over the validation examples and the
trivial baseline (majority class, most frequent tag per word, copy the source, --baseline_model's bits per byte)
-> the table, printed and written as OUTPUT_DIR/results.json and results.md.

    python evaluate_suite.py --model_name_or_path runs/my-roberta --suite configs/suites/norwegian.yaml \
        --output_dir runs/my-roberta-suite
    python evaluate_suite.py ... --max_steps 50 --tasks norec_sentence ud_upos   # a quick look
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from flaxlm.config.options import SuiteArgs  # noqa: E402
from flaxlm.config.cli import parse_args  # noqa: E402
from flaxlm.errors import UserError, run_main  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv=None):
    (args,) = parse_args(SuiteArgs, argv=argv, prog="evaluate_suite.py", description=__doc__)
    from flaxlm.reporting.trackers import resolve_report_to
    args.report_to = resolve_report_to(args.report_to)  # a tracker not installed: one line, before any work
    from flaxlm.tasks.suite.runner import evaluate_task, model_kind, prepare_output_dir
    from flaxlm.tasks.suite.suite_file import KINDS, read_suite, script_options, suite_data_dir
    from flaxlm.tasks.suite.table import markdown_table, text_table, write_results

    # The suite's tasks (their local files, or with no data folder their hub datasets), those that fit the model,
    # their flags: all checked before the first run.
    data_dir = suite_data_dir(args.data_dir, HERE)
    if data_dir is None:
        print("no --data_dir, $FLAXLM_DATA_DIR or ../shared/data: each task loads its dataset from the Hugging Face "
              "hub (network the first time, then the datasets cache)", flush=True)
    tasks = read_suite(args.suite, data_dir)
    if args.tasks:
        unknown = sorted(set(args.tasks) - {t.name for t in tasks})
        if unknown:
            raise UserError(f"--tasks {unknown[0]} is not a task of {args.suite} ({', '.join(t.name for t in tasks)})")
        tasks = [t for t in tasks if t.name in args.tasks]
    kind = model_kind(args.model_name_or_path)
    skipped = [t.name for t in tasks if KINDS[t.kind].model != kind]
    for task in tasks:
        if task.name in skipped:
            print(f"skipping {task.name}: {task.kind} tasks are for {KINDS[task.kind].model} models, and "
                  f"{args.model_name_or_path} is a model of kind {kind}", flush=True)
    tasks = [t for t in tasks if t.name not in skipped]
    if not tasks:
        fits = {"encoder": "classification, tagging, ner or qa tasks", "seq2seq": "seq2seq tasks",
                "decoder": "choice, generate or bits_per_byte tasks"}[kind]
        raise UserError(f"no task of {args.suite} fits a {kind} model; pass a suite with {fits}")
    for task in tasks:
        script_options(task)  # the flags of the scripts whose options are known here: parsed as they will be
    prepare_output_dir(args.output_dir, tasks, args.overwrite_output_dir)

    # Each task fine-tuned and scored in turn, then the table.
    rows = [evaluate_task(task, args.model_name_or_path, args.output_dir, HERE, args) for task in tasks]
    about = {"model": args.model_name_or_path, "suite": args.suite, "bootstrap_resamples": args.bootstrap_resamples,
             "bootstrap_seed": args.bootstrap_seed, "skipped": skipped}
    print(text_table(rows), flush=True)
    for path in write_results(args.output_dir, rows, about):
        print(f"wrote {path}", flush=True)
    report(args, rows, markdown_table(rows, about))


def report(args, rows, table):
    """The results as one row of OUTPUT_DIR/metrics.jsonl (split "suite", step 0: TASK_score, TASK_low, TASK_high,
    TASK_baseline, TASK_seconds) sent to --report_to's trackers, and the table into the model's card (a card
    flaxlm wrote beside the model)."""
    from flaxlm.config.cli import parsed_options
    from flaxlm.reporting.model_card import add_suite_table
    from flaxlm.reporting.run_log import RunLog
    from flaxlm.reporting.trackers import open_trackers
    figures = {f"{row['task']}_{key}": row[key] for row in rows for key in ("score", "low", "high", "baseline",
                                                                              "seconds") if row.get(key) is not None}
    log = RunLog(args.output_dir, trackers=open_trackers(args.report_to, args.output_dir, args.run_name,
                                                         parsed_options()))
    log.write(0, "suite", figures)
    log.close()
    if add_suite_table(args.model_name_or_path, table):
        print(f"added the table to the model card {os.path.join(args.model_name_or_path, 'README.md')}", flush=True)


if __name__ == "__main__":
    run_main(main)
