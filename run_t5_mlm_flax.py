#!/usr/bin/env python
"""T5 span-corruption pretraining in JAX/Flax; the successor of Hugging Face's run_t5_mlm_flax.py.

Pipeline: options -> output directory -> tokenizer (with <extra_id_*> sentinels, or ByT5's bytes) and
T5 / mT5 / UMT5 model (new from --config_name, or continued from --model_name_or_path) -> text -> token
chunks long enough that, once corrupted, they fill --max_seq_length exactly -> span corruption (noise
density --mlm_probability, mean span --mean_noise_span_length: 3, or 20 bytes for a byte tokenizer) ->
training over all devices with evaluation and checkpoints -> export in Hugging Face format to --output_dir.

    python run_t5_mlm_flax.py --output_dir runs/t5 --config_name MODEL_DIR --tokenizer_name MODEL_DIR \
        --train_file train.txt --validation_file valid.txt --max_seq_length 512 --adafactor
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from flaxlm.config.options import (DataArgs, ModelArgs, PreparedDataArgs, SpanCorruptionArgs,  # noqa: E402
                                   TextSourceArgs, TrainingArgs)
from flaxlm.config.cli import parse_args  # noqa: E402
from flaxlm.errors import run_main  # noqa: E402


def main(argv=None):
    model_args, source, data_args, span_args, prep, args = parse_args(
        ModelArgs, TextSourceArgs, DataArgs, SpanCorruptionArgs, PreparedDataArgs, TrainingArgs, argv=argv,
        prog="run_t5_mlm_flax.py", description=__doc__)
    from flaxlm.data import prepared, rows
    from flaxlm.data import text_mixture
    from flaxlm.models import family_of
    from flaxlm.training.output_dir import start_fresh
    from flaxlm.planning.compile_for import check_fit, compile_target, token_rows
    from flaxlm.training.opening import load_model_and_mesh, load_run_tokenizer
    from flaxlm.training.pipeline import export, start_run, train_and_evaluate
    from flaxlm.data.span_corruption import SpanCorruptor
    from flaxlm.objectives.span_lm import check_decoder_start, resolve_input_length, span_objective

    weights = text_mixture.mixture_weights(source, prep)  # of mixed files or datasets, checked before any work
    start_run(args, model_args)  # join the other hosts; check --output_dir and the hub before any work
    target = compile_target(args)  # --compile_for: the TPU slice (nothing written, no host joined); else None

    # Tokenizer, model (--compile_for: shapes only), devices (--compile_for: the TPU slice's) and batch sizes.
    tokenizer = load_run_tokenizer(model_args)
    tokenizer, config, graphdef, params, _, mesh, (micro_batch, eval_batch, global_batch) = load_model_and_mesh(
        args, model_args, target, tokenizer, script="run_t5_mlm_flax.py")
    check_decoder_start(config)

    # The corruption's lengths (raw chunk -> input of max_seq_length + target) and the objective: the decoder predicts
    # each sentinel and the tokens its span replaced.
    inputs_length = resolve_input_length(data_args.max_seq_length, tokenizer)
    corruptor = SpanCorruptor.from_tokenizer(tokenizer, inputs_length, data_args.mlm_probability,
                                             span_args.mean_noise_span_length,
                                             decoder_start_token_id=config.decoder_start_token_id)
    objective = span_objective(graphdef, config, corruptor, args.lm_head_chunk_rows, args.z_loss)
    if target:  # compile the steps for the slice, print what each device holds; exit 2 unless they fit
        return check_fit(target, args, model_args, params, objective, mesh, micro_batch, eval_batch,
                         token_rows(corruptor.raw_length, tokenizer), config.vocab_size)

    # Text -> token chunks of the raw length -> the chunks of each step.
    if prep.prepared_data:  # chunks prepare_data.py made once, checked against this tokenizer and raw length
        data = prepared.load_rows(prep.prepared_data, tokenizer, "blocks", corruptor.raw_length, source=source,
                                  data_args=data_args, weights=prep.prepared_data_weights,
                                  include_test=args.do_predict)
    else:
        raw = text_mixture.load_text(source, weights, data_args.validation_split_percentage, args.seed,
                                     include_test=args.do_predict)  # with weights: a Mixture of the sources
        # Your own function may go here (a batch of texts in, int32 [n, raw_length] rows out); editing it
        # re-tokenizes.
        make_rows = rows.blocks(tokenizer, corruptor.raw_length)
        data = rows.from_text(raw, make_rows, corruptor.raw_length, num_workers=data_args.preprocessing_num_workers,
                              overwrite_cache=data_args.overwrite_cache,
                              max_train_samples=data_args.max_train_samples,
                              max_eval_samples=data_args.max_eval_samples)
    train_rows, eval_rows, test_rows, total_steps = rows.run_rows(data, args, global_batch)
    start_fresh(args)  # inputs all read

    # Train.
    params = train_and_evaluate(args, model_args, params, objective, train_rows, eval_rows, total_steps, mesh,
                                micro_batch, eval_batch, test_rows, config=config)

    # Export in Hugging Face format.
    export(args, model_args, config, params, tokenizer, f"transformers.{family_of(config).architecture}")


if __name__ == "__main__":
    run_main(main)
