#!/usr/bin/env python
"""Masked-LM pretraining of BERT/RoBERTa in JAX/Flax; the successor of Hugging Face's run_mlm_flax.py.

Pipeline: options -> output directory -> tokenizer and model (new from --config_name, or continued
from --model_name_or_path) -> text -> fixed-length token rows -> BERT masking (of whole words with
--whole_word_mask) -> training over all devices with evaluation and checkpoints -> export in Hugging Face
format (config.json, model.safetensors, tokenizer files) to --output_dir.

    python run_mlm_flax.py --output_dir runs/x --config_name MODEL_DIR --tokenizer_name MODEL_DIR \
        --train_file train.txt --validation_file valid.txt --max_seq_length 128 --max_steps 1000
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from flaxlm.config.options import (DataArgs, MaskedLMArgs, ModelArgs, PreparedDataArgs, TextSourceArgs,  # noqa: E402
                                   TrainingArgs)
from flaxlm.config.cli import parse_args  # noqa: E402
from flaxlm.errors import run_main  # noqa: E402


def main(argv=None):
    model_args, source, data_args, mlm_args, prep, args = parse_args(
        ModelArgs, TextSourceArgs, DataArgs, MaskedLMArgs, PreparedDataArgs, TrainingArgs, argv=argv,
        prog="run_mlm_flax.py", description=__doc__)
    from flaxlm.data import prepared, rows
    from flaxlm.data import text_mixture
    from flaxlm.objectives.mlm import mlm_objective
    from flaxlm.data.mlm_masking import MLMMasker
    from flaxlm.data.whole_word_masking import WholeWordMasker
    from flaxlm.training.output_dir import start_fresh
    from flaxlm.planning.compile_for import check_fit, compile_target, token_rows
    from flaxlm.training.opening import load_model_and_mesh, load_run_tokenizer
    from flaxlm.training.pipeline import export, resolve_seq_len, start_run, train_and_evaluate
    from flaxlm.tokenization.word_boundaries import word_boundaries

    weights = text_mixture.mixture_weights(source, prep)  # of mixed files or datasets, checked before any work
    start_run(args, model_args)  # join the other hosts; check --output_dir and the hub before any work
    target = compile_target(args)  # --compile_for: the TPU slice (nothing written, no host joined); else None

    # Tokenizer, model (--compile_for: shapes only), devices (--compile_for: the TPU slice's) and batch sizes.
    tokenizer = load_run_tokenizer(model_args)
    tokenizer, config, graphdef, params, _, mesh, (micro_batch, eval_batch, global_batch) = load_model_and_mesh(
        args, model_args, target, tokenizer, script="run_mlm_flax.py")

    # The masking and the objective: masked tokens predicted at their slots.
    seq_len = resolve_seq_len(data_args.max_seq_length, tokenizer, config)
    if mlm_args.whole_word_mask:  # words as the tokenizer's vocabulary marks them
        starts_word_V, ends_word_V = word_boundaries(tokenizer)
        masker = WholeWordMasker.from_tokenizer(tokenizer, seq_len, data_args.mlm_probability,
                                                starts_word_V=starts_word_V, ends_word_V=ends_word_V)
    else:
        masker = MLMMasker.from_tokenizer(tokenizer, seq_len, data_args.mlm_probability)
    objective = mlm_objective(graphdef, config, masker, seq_len, args.lm_head_chunk_rows, args.z_loss)
    if target:  # compile the steps for the slice, print what each device holds; exit 2 unless they fit
        return check_fit(target, args, model_args, params, objective, mesh, micro_batch, eval_batch,
                         token_rows(seq_len, tokenizer), config.vocab_size)

    # Text -> token rows of seq_len (blocks; --line_by_line: lines, packed into rows) -> the rows of each step.
    if prep.prepared_data:  # rows prepare_data.py made once, checked against this tokenizer and seq_len
        data = prepared.load_rows(prep.prepared_data, tokenizer, "lines" if mlm_args.line_by_line else "blocks",
                                  seq_len, source=source, data_args=data_args, weights=prep.prepared_data_weights,
                                  include_test=args.do_predict)
    else:
        raw = text_mixture.load_text(source, weights, data_args.validation_split_percentage, args.seed,
                                     include_test=args.do_predict)  # with weights: a Mixture of the sources
        # Your own function may go here (a batch of texts in, int32 [n, seq_len] rows out); editing it re-tokenizes.
        make_rows = (rows.lines(tokenizer, seq_len, pack=mlm_args.pack_lines and rows.can_pack(raw))
                     if mlm_args.line_by_line else rows.blocks(tokenizer, seq_len))
        data = rows.from_text(raw, make_rows, seq_len, num_workers=data_args.preprocessing_num_workers,
                              overwrite_cache=data_args.overwrite_cache,
                              max_train_samples=data_args.max_train_samples,
                              max_eval_samples=data_args.max_eval_samples)
    train_rows, eval_rows, test_rows, total_steps = rows.run_rows(data, args, global_batch)
    start_fresh(args)  # inputs all read

    # Train.
    params = train_and_evaluate(args, model_args, params, objective, train_rows, eval_rows, total_steps, mesh,
                                micro_batch, eval_batch, test_rows, config=config)

    # Export in Hugging Face format.
    export(args, model_args, config, params, tokenizer, "transformers.AutoModelForMaskedLM")


if __name__ == "__main__":
    run_main(main)
