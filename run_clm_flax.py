#!/usr/bin/env python
"""Causal language-model pretraining and fine-tuning in JAX/Flax; the successor of Hugging Face's run_clm_flax.py.

Pipeline: options -> output directory -> tokenizer and decoder-only model (GPT-2, OPT, Llama, Mistral, Qwen2/3,
Gemma 1/2/3, GPT-Neo, GPT-J, BLOOM; new from --config_name, or a Hugging Face checkpoint from --model_name_or_path to
continue, read shard by shard straight into its sharding) -> text -> documents joined with an end-of-text token and
cut into blocks of --block_size -> training over all devices (each token predicted from those before it) with
evaluation and checkpoints -> export in Hugging Face format to --output_dir.

    python run_clm_flax.py --output_dir runs/gpt2 --config_name MODEL_DIR --tokenizer_name MODEL_DIR \
        --train_file train.txt --validation_file valid.txt --block_size 512
    python run_clm_flax.py --output_dir runs/opt --model_name_or_path opt-350m/ --dataset_name wikitext \
        --dataset_config_name wikitext-103-raw-v1 --block_size 512 --learning_rate 5e-5
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from flaxlm.config.options import (CausalLMArgs, DataArgs, LoraArgs, ModelArgs, PreparedDataArgs,  # noqa: E402
                                   TextSourceArgs, TrainingArgs)
from flaxlm.config.cli import parse_args  # noqa: E402
from flaxlm.errors import UserError, run_main  # noqa: E402


def main(argv=None):
    model_args, source, data_args, clm_args, prep, lora_args, args = parse_args(
        ModelArgs, TextSourceArgs, DataArgs, CausalLMArgs, PreparedDataArgs, LoraArgs, TrainingArgs, argv=argv,
        prog="run_clm_flax.py", description=__doc__)
    from flaxlm.objectives.clm import clm_objective, resolve_block_size
    from flaxlm.data import prepared, rows
    from flaxlm.data import text_mixture
    from flaxlm.models.context_parallel import check_length
    from flaxlm.training.output_dir import start_fresh
    from flaxlm.planning.compile_for import check_fit, compile_target, token_rows
    from flaxlm.training.opening import load_model_and_mesh, load_run_tokenizer
    from flaxlm.training.pipeline import export, start_run, train_and_evaluate

    weights = text_mixture.mixture_weights(source, prep)  # of mixed files or datasets, checked before any work
    start_run(args, model_args)  # join the other hosts; check --output_dir and the hub before any work
    target = compile_target(args)  # --compile_for: the TPU slice (nothing written, no host joined); else None

    # Tokenizer; the devices (--compile_for: the TPU slice's), the model on them (a checkpoint read straight into its
    # sharding; --compile_for: shapes only), with --lora_rank adapters only trained, and the batch sizes.
    tokenizer = load_run_tokenizer(model_args)
    if tokenizer.eos_token_id is None:
        raise UserError("the tokenizer has no end-of-text (eos) token to separate documents; use a tokenizer "
                        "with one (train_tokenizer.py gives </s>)")
    tokenizer, config, graphdef, params, lora, mesh, (micro_batch, eval_batch, global_batch) = load_model_and_mesh(
        args, model_args, target, tokenizer, script="run_clm_flax.py", lora_args=lora_args, read_sharded=True)

    # The objective: every token predicted from the ones before it.
    block_size = resolve_block_size(clm_args.block_size, data_args.max_seq_length, tokenizer, config)
    check_length(block_size, args.context_parallel_size)  # --context_parallel_size: rows split in 2N equal chunks
    objective = clm_objective(graphdef, config, params, block_size, pad_id=tokenizer.eos_token_id,
                              head_chunk_rows=args.lm_head_chunk_rows, separate_documents=clm_args.separate_documents,
                              z_loss=args.z_loss)
    if target:  # compile the steps for the slice, print what each device holds; exit 2 unless they fit
        return check_fit(target, args, model_args, params, objective, mesh, micro_batch, eval_batch,
                         token_rows(block_size, tokenizer), config.vocab_size)

    # Text -> documents, each followed by EOS, packed into blocks of block_size -> the blocks of each step.
    if prep.prepared_data:  # rows prepare_data.py made once, checked against this tokenizer and block_size
        data = prepared.load_rows(prep.prepared_data, tokenizer, "documents", block_size, source=source,
                                  data_args=data_args, weights=prep.prepared_data_weights,
                                  include_test=args.do_predict, keep_linebreaks=clm_args.keep_linebreaks)
    else:
        raw = text_mixture.load_text(source, weights, data_args.validation_split_percentage, args.seed,
                                     keep_linebreaks=clm_args.keep_linebreaks,
                                     include_test=args.do_predict)  # with weights: a Mixture of the sources
        # Your own function may go here (a batch of texts in, int32 [n, block_size] rows out); editing it
        # re-tokenizes.
        make_rows = rows.documents(tokenizer, block_size, eos=tokenizer.eos_token_id)
        data = rows.from_text(raw, make_rows, block_size, num_workers=data_args.preprocessing_num_workers,
                              overwrite_cache=data_args.overwrite_cache,
                              max_train_samples=data_args.max_train_samples,
                              max_eval_samples=data_args.max_eval_samples)
    train_rows, eval_rows, test_rows, total_steps = rows.run_rows(data, args, global_batch)
    start_fresh(args)  # inputs all read

    # Train.
    params = train_and_evaluate(args, model_args, params, objective, train_rows, eval_rows, total_steps, mesh,
                                micro_batch, eval_batch, test_rows, config=config)

    # Export in Hugging Face format.
    export(args, model_args, config, params, tokenizer, "transformers.AutoModelForCausalLM", lora=lora,
           merge_lora=lora_args.merge_lora, merge_dtype=lora_args.merge_dtype)


if __name__ == "__main__":
    run_main(main)
