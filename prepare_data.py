#!/usr/bin/env python
"""Tokenize and group text once into token rows that any later training run reads with --prepared_data DIR.

Pipeline: options -> tokenizer -> text (the training scripts' --train_file / --validation_file / --dataset_name
options, split as they split it; .txt, JSON Lines and parquet files read in ranges, one per job) -> the rows of
--objective's script (mlm: blocks, or lines with --line_by_line; clm: documents; t5: blocks of the span corruption's
raw length), exactly the rows that script makes from the same text and options -> shards of uint16 rows (uint32 for
vocabularies over 65,536) in --output_dir, with a manifest.json. --preprocessing_num_workers N runs N processes.
Interrupted? Run the same command again: finished shards are kept.

On a pod, run the same command on every host (joined by JAX's distributed runtime: the environment of a TPU pod or
SLURM, or the training scripts' --coordinator_address, --num_processes and --process_id) into one --output_dir that
every host mounts (NFS, a bucket): the text is cut into workers x processes jobs per split, each process reads
(.txt, JSON Lines and parquet files: only its ranges) and tokenizes its contiguous block of them with its N workers,
and process 0 writes the manifest once all have finished. The rows are those of one process with workers x processes
workers. (--streaming: each of the k jobs reads the whole stream and tokenizes every k-th batch of texts.)

    python prepare_data.py --objective mlm --tokenizer_name MODEL_DIR --train_file corpus.txt \
        --max_seq_length 128 --output_dir prepared/ --preprocessing_num_workers 4
    python run_mlm_flax.py --prepared_data prepared/ --config_name MODEL_DIR --tokenizer_name MODEL_DIR ...
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from flaxlm.config.options import (CausalLMArgs, DataArgs, MaskedLMArgs, MultiHostArgs, PrepareArgs,  # noqa: E402
                                   SpanCorruptionArgs, TextSourceArgs)
from flaxlm.config.cli import parse_args  # noqa: E402
from flaxlm.errors import UserError, run_main  # noqa: E402


def main(argv=None):
    source, data_args, mlm_args, clm_args, span_args, prep, pod = parse_args(
        TextSourceArgs, DataArgs, MaskedLMArgs, CausalLMArgs, SpanCorruptionArgs, PrepareArgs, MultiHostArgs,
        argv=argv, prog="prepare_data.py", description=__doc__)
    from flaxlm.data import prepared, preparing
    from flaxlm.data.text import load_raw_text
    from flaxlm.data.text_ranges import file_splits
    from flaxlm.tokenization.loading import load_tokenizer
    from flaxlm.training.mesh import join_processes, sync_processes

    process, processes = join_processes(pod)
    preparing.check_output_dir(prep.output_dir)  # before any reading
    tokenizer = load_tokenizer(prep.tokenizer_name)
    keep_linebreaks = prep.objective == "clm" and clm_args.keep_linebreaks
    text_options = dict(validation_split_percentage=data_args.validation_split_percentage, seed=prep.seed,
                        keep_linebreaks=keep_linebreaks, include_test=bool(source.test_file))
    raw = file_splits(source, **text_options) or load_raw_text(source, **text_options)  # .txt/.jsonl/.parquet: ranges
    function, make_rows, length = row_function(prep.objective, tokenizer, raw, data_args, mlm_args, clm_args,
                                               span_args)
    plan = preparing.plan_jobs(raw, (data_args.preprocessing_num_workers or 1) * processes)
    columns = ["input_ids", "segment_ids"] if function == "lines" and make_rows.keywords["pack"] else ["input_ids"]
    about = {"tokenizer": prepared.tokenizer_identity(tokenizer, prep.tokenizer_name),
             "rows": {"function": function, "length": length, "columns": columns, "keep_linebreaks": keep_linebreaks},
             "sources": preparing.describe_sources(source),
             "text": {"validation_split_percentage": data_args.validation_split_percentage, "seed": prep.seed,
                      "text_column": source.text_column, "streaming": source.streaming,
                      "read": preparing.read_in_ranges(raw)},
             "jobs": plan}
    start(prep.output_dir, about, process, processes)
    jobs = preparing.share(plan, process, processes)
    if processes > 1:
        print(f"process {process} of {processes} prepares {preparing.describe_share(plan, jobs, raw)}", flush=True)
    preparing.count_lines_held_out(prep.output_dir, raw, plan, jobs)
    if processes > 1:
        sync_processes("flaxlm prepare_data: lines counted")
    raw = preparing.with_lines_counted(prep.output_dir, raw, plan)
    preparing.prepare(prep.output_dir, raw, plan, make_rows, length, about, jobs=jobs,
                      num_workers=data_args.preprocessing_num_workers, shard_bytes=int(prep.shard_size_mb * (1 << 20)))
    if processes > 1:
        sync_processes("flaxlm prepare_data: every job finished")
    if process == 0:
        manifest = preparing.write_manifest(prep.output_dir, plan, about)
        print(preparing.summary(prep.output_dir, manifest), flush=True)


def start(out_dir, about, process, processes):
    """Start the preparation in out_dir or check that the one under way there has these settings: on a pod, every
    process checks before process 0 writes, and none makes a shard before that (a rerun finds the plan)."""
    from flaxlm.data import preparing
    from flaxlm.training.mesh import sync_processes
    if processes == 1:
        preparing.start_or_continue(out_dir, about)
        return
    preparing.start_or_continue(out_dir, about, write=False)
    sync_processes("flaxlm prepare_data: settings checked")
    if process == 0:
        preparing.start_or_continue(out_dir, about)
    sync_processes("flaxlm prepare_data: started")


def row_function(objective, tokenizer, raw, data_args, mlm_args, clm_args, span_args):
    """(name, row function, row length) of the objective's training script, as that script chooses them."""
    from flaxlm.data import rows
    if objective == "clm":
        from flaxlm.objectives.clm import MAX_BLOCK_SIZE
        if tokenizer.eos_token_id is None:
            raise UserError("the tokenizer has no end-of-text (eos) token to separate documents; use one with it")
        if clm_args.block_size and data_args.max_seq_length and clm_args.block_size != data_args.max_seq_length:
            raise UserError(f"--block_size {clm_args.block_size} and --max_seq_length {data_args.max_seq_length} "
                            f"disagree; pass one")
        length = clm_args.block_size or data_args.max_seq_length or min(tokenizer.model_max_length, MAX_BLOCK_SIZE)
        return "documents", rows.documents(tokenizer, length, eos=tokenizer.eos_token_id), length
    if objective == "t5":
        from flaxlm.data.span_corruption import SpanCorruptor
        from flaxlm.objectives.span_lm import resolve_input_length
        length = SpanCorruptor.from_tokenizer(tokenizer, resolve_input_length(data_args.max_seq_length, tokenizer),
                                              data_args.mlm_probability, span_args.mean_noise_span_length).raw_length
        return "blocks", rows.blocks(tokenizer, length), length
    length = data_args.max_seq_length or min(tokenizer.model_max_length, 512)
    if mlm_args.line_by_line:
        return "lines", rows.lines(tokenizer, length, pack=mlm_args.pack_lines and rows.can_pack(raw)), length
    return "blocks", rows.blocks(tokenizer, length), length


if __name__ == "__main__":
    run_main(main)
