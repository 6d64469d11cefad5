#!/usr/bin/env python
"""Supervised fine-tuning of a decoder on conversations, as TRL's SFTTrainer does it, in JAX/Flax.

Pipeline: options -> output directory -> tokenizer, its chat template (ChatML's markers added as tokens if the
vocabulary lacks them) and the decoder (GPT-2, OPT, Llama, Mistral, Qwen2/3, Gemma 1/2/3, GPT-Neo, GPT-J, BLOOM) ->
examples in TRL's formats (messages; prompt + completion; text) -> tokens and which are trained on (the assistant
turns, found by rendering the template turn by turn; --train_on_prompt: every token) -> whole examples packed into
rows of --max_length (none attends to another) -> training over all devices with evaluation (the loss on the
held-out answers) and checkpoints -> export in Hugging Face format, the tokenizer with its chat template.

    python run_sft.py --output_dir runs/sft --model_name_or_path runs/my-gpt2 --chat_template chatml \
        --train_file conversations.jsonl --validation_split_percentage 5 --max_length 1024 --learning_rate 2e-5
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from flaxlm.config.options import DataArgs, LoraArgs, ModelArgs, SFTArgs, TextSourceArgs, TrainingArgs  # noqa: E402
from flaxlm.config.cli import parse_args  # noqa: E402
from flaxlm.errors import run_main  # noqa: E402


def main(argv=None):
    model_args, source, data_args, sft_args, lora_args, args = parse_args(
        ModelArgs, TextSourceArgs, DataArgs, SFTArgs, LoraArgs, TrainingArgs, argv=argv, prog="run_sft.py",
        description=__doc__)
    from flaxlm.adaptation.added_tokens import add_special_tokens
    from flaxlm.data.chat_rows import encode, placeholder_rows, report_line, sft_rows
    from flaxlm.data.conversations import load_conversations
    from flaxlm.data.rows import ShuffledRows, total_train_steps
    from flaxlm.objectives.clm import resolve_block_size
    from flaxlm.objectives.sft import sft_objective
    from flaxlm.planning.compile_for import check_fit, compile_target
    from flaxlm.training.opening import load_model_and_mesh, load_run_tokenizer
    from flaxlm.training.output_dir import start_fresh
    from flaxlm.training.pipeline import export, start_run, train_and_evaluate, trl_router_loss
    from flaxlm.reporting.run_log import say
    from flaxlm.data.chat_template import end_of_turn, missing_markers, resolve_template

    start_run(args, model_args)  # join the other hosts; check --output_dir and the hub before any work
    target = compile_target(args)  # --compile_for: the TPU slice (nothing written, no host joined); else None

    # Examples, tokenizer and chat template (and the markers it writes that the vocabulary lacks).
    examples = None if target else load_conversations(
        source, data_args.validation_split_percentage, args.seed, max_train_samples=data_args.max_train_samples,
        max_eval_samples=data_args.max_eval_samples, need_validation=args.do_eval)  # --do_eval false: none needed
    tokenizer = load_run_tokenizer(model_args)
    conversational = examples is not None and any(e.messages is not None for es in examples.values() for e in es)
    template = resolve_template(tokenizer, sft_args.chat_template) if conversational or sft_args.chat_template else None
    markers = missing_markers(tokenizer, template) if template and not target else []

    # The devices (--compile_for: the TPU slice's), the decoder on them with the markers added to its vocabulary and,
    # with --lora_rank, adapters only trained, and the rows of the markers (PEFT's trainable tokens); batch sizes.
    tokenizer, config, graphdef, params, lora, mesh, (micro_batch, eval_batch, global_batch) = load_model_and_mesh(
        args, model_args, target, tokenizer, script="run_clm_flax.py", lora_args=lora_args, chat_markers=markers,
        add_tokens=add_special_tokens, read_sharded=True)
    config = trl_router_loss(model_args, config)  # an MoE's load-balancing loss on unless its coefficient is 0
    if template:
        tokenizer.chat_template = template  # the export answers as it was trained
    stop = end_of_turn(tokenizer, template) if template else None
    if stop and stop != tokenizer.eos_token:  # generation (transformers' too) stops where a turn ends
        say(f"the end of an assistant turn, {stop}, is the exported model's eos token (was {tokenizer.eos_token})")
        tokenizer.eos_token = stop
        config.eos_token_id = tokenizer.eos_token_id
    max_length = resolve_block_size(sft_args.max_length, None, tokenizer, config)  # --max_seq_length: its alias

    # The objective: the trained tokens predicted from the ones before them.
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    objective = sft_objective(graphdef, config, params, max_length, pad_id, head_chunk_rows=args.lm_head_chunk_rows,
                              z_loss=args.z_loss)
    if target:  # compile the steps for the slice, print what each device holds; exit 2 unless they fit
        return check_fit(target, args, model_args, params, objective, mesh, micro_batch, eval_batch,
                         placeholder_rows(max_length, len(tokenizer)), config.vocab_size)

    # Examples -> tokens and what is trained on -> rows of max_length.
    rows = {}
    for split, split_examples in examples.items():
        seqs = [encode(tokenizer, template, e, sft_args.train_on_prompt) for e in split_examples]
        rows[split], report = sft_rows(seqs, max_length, pad_id, sft_args.packing, sft_args.long_examples)
        print(report_line(split, report, len(rows[split]["input_ids"]), max_length), flush=True)
    train_rows = ShuffledRows(rows["train"], global_batch, args.seed)
    total_steps = total_train_steps(args, train_rows)
    start_fresh(args)  # inputs all read

    # Train, evaluating the loss on the held-out answers.
    params = train_and_evaluate(args, model_args, params, objective, train_rows, rows.get("validation"), total_steps,
                                mesh, micro_batch, eval_batch, config=config)
    export(args, model_args, config, params, tokenizer, "transformers.AutoModelForCausalLM",
           how="supervised fine-tuned on conversations (run_sft.py)", lora=lora, merge_lora=lora_args.merge_lora,
           merge_dtype=lora_args.merge_dtype)


if __name__ == "__main__":
    run_main(main)
