#!/usr/bin/env python
"""Distillation: a small decoder (the student) learns a bigger one's (the teacher's) next-token distributions, on
text or on conversations, offline or on-policy (GKD), as TRL and MaxText define them.

Pipeline: options -> output directory -> tokenizer, the teacher checked (a decoder of the same vocabulary) -> data:
text in blocks of --max_length (every token taught; a .txt file, --prepared_data) or conversations (the chat
template, the answers taught, as run_sft.py) -> the student (--model_name_or_path to continue, --config_name for a
new one; full or LoRA) on all devices ->
  offline: the teacher's top --top_k log-probabilities at --temperature for every training token, computed once into
           --teacher_logits (reused by any run of the same rows, teacher and temperature; the teacher then let go),
           and the loss alpha * T^2 * KL(teacher || student) on those k + (1 - alpha) * cross-entropy;
  gkd:     the teacher live beside the student (placed the same way), each step's rows with probability --lmbda the
           student's own completions of the prompts (sampled with the KV cache, up to --max_new_tokens), else
           (--seq_kd) the teacher's, else the data's; the loss the generalized JSD (--beta 0: forward KL, 1:
           reverse), as TRL's GKDTrainer ->
evaluation: the student's own next-token loss on the held-out rows -> export in Hugging Face format, the card naming
the teacher.

    python run_distill.py --mode offline --output_dir runs/small --config_name small/ --tokenizer_name big/ \\
        --teacher_model_name_or_path big/ --train_file train.txt --validation_file valid.txt --max_length 512 \\
        --top_k 32 --alpha 0.5
    python run_distill.py --mode gkd --output_dir runs/small-gkd --model_name_or_path runs/small \\
        --teacher_model_name_or_path big-sft/ --train_file chats.jsonl --lmbda 0.5 --beta 0.5 --max_new_tokens 128
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from flaxlm.config.options import (DataArgs, DistillArgs, LoraArgs, ModelArgs, PreparedDataArgs,  # noqa: E402
                                   TextSourceArgs, TrainingArgs)
from flaxlm.config.cli import parse_args  # noqa: E402
from flaxlm.errors import run_main  # noqa: E402


def main(argv=None):
    model_args, source, data_args, distill, prep, lora_args, args = parse_args(
        ModelArgs, TextSourceArgs, DataArgs, DistillArgs, PreparedDataArgs, LoraArgs, TrainingArgs, argv=argv,
        prog="run_distill.py", description=__doc__)
    from flaxlm.data.chat_template import end_of_turn, resolve_template
    from flaxlm.data.conversations import load_conversations
    from flaxlm.data.rows import ShuffledRows, total_train_steps
    from flaxlm.distillation import run
    from flaxlm.distillation.rows import OnPolicyRows
    from flaxlm.objectives.clm import resolve_block_size
    from flaxlm.objectives.distill import gkd_objective, offline_objective
    from flaxlm.planning.compile_for import check_fit, compile_target
    from flaxlm.reporting.run_log import say
    from flaxlm.rl.sampling import Sampler
    from flaxlm.training.opening import load_model_and_mesh, load_run_tokenizer
    from flaxlm.training.output_dir import start_fresh
    from flaxlm.training.pipeline import export, start_run, train_and_evaluate, trl_router_loss

    run.check_settings(distill)
    start_run(args, model_args)  # join the other hosts; check --output_dir and the hub before any work
    target = compile_target(args)  # --compile_for: the TPU slice (nothing written, no host joined); else None
    gkd, temperature = distill.mode == "gkd", run.temperature_of(distill)

    # Tokenizer, the teacher's config (a decoder of this vocabulary) and the conversations (text comes later).
    tokenizer = load_run_tokenizer(model_args)
    teacher_config = run.check_teacher(distill.teacher_model_name_or_path, tokenizer, model_args)
    text = run.data_format(distill, source, prep) == "text"
    examples = None if target or text else load_conversations(
        source, data_args.validation_split_percentage, args.seed, max_train_samples=data_args.max_train_samples,
        max_eval_samples=data_args.max_eval_samples, need_validation=args.do_eval)
    conversational = examples is not None and any(e.messages is not None for es in examples.values() for e in es)
    template = resolve_template(tokenizer, distill.chat_template) if conversational or distill.chat_template else None

    # The student on the devices (with --lora_rank, adapters only trained) and the batch sizes.
    tokenizer, config, graphdef, params, lora, mesh, (micro_batch, eval_batch, global_batch) = load_model_and_mesh(
        args, model_args, target, tokenizer, script="run_clm_flax.py", lora_args=lora_args, read_sharded=True)
    config = trl_router_loss(model_args, config)  # an MoE's load-balancing loss on unless its coefficient is 0
    if template:
        tokenizer.chat_template = template  # the export answers as it was trained
        stop = end_of_turn(tokenizer, template)  # where an answer ends: what sampling stops at (a token of the vocab)
        if stop and stop != tokenizer.eos_token and stop in tokenizer.get_vocab():
            say(f"the end of an assistant turn, {stop}, is the exported model's eos token (was {tokenizer.eos_token})")
            tokenizer.eos_token = stop
            config.eos_token_id = tokenizer.eos_token_id
    max_length = resolve_block_size(distill.max_length, None, tokenizer, config)  # --max_seq_length: its alias
    prompt_length = distill.max_prompt_length or max_length // 2  # gkd: the longest prompt sampled from
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    run.check_lengths(distill, max_length, prompt_length, teacher_config)  # every option against the models, before
    if not gkd:                                                             # any teacher work
        run.check_top_k(distill.top_k, min(config.vocab_size, teacher_config.vocab_size))

    # The rows (text in blocks, or conversations), checked before any teacher work.
    if target:
        rows = None
    elif text:
        rows = run.text_rows(source, data_args, prep, tokenizer, max_length, args, prompt_length if gkd else 0)
    else:
        rows = run.conversation_rows(examples, tokenizer, template, max_length, pad_id, gkd, distill.packing)

    # The objective; gkd: the teacher beside the student, and the samplers of each step's completions.
    if gkd:
        teacher = run.load_teacher(model_args, distill, args, mesh, target, tokenizer)
        teacher_config, teacher_graphdef, teacher_params = teacher
        objective = gkd_objective(graphdef, config, params, teacher_graphdef, teacher_config, teacher_params,
                                  max_length, pad_id, beta=distill.beta)
        sampler = Sampler(graphdef, mesh, max_new_tokens=distill.max_new_tokens, eos_id=tokenizer.eos_token_id,
                          pad_id=pad_id, temperature=temperature)
    else:
        objective = offline_objective(graphdef, config, params, max_length, pad_id, alpha=distill.alpha,
                                      temperature=temperature, tail=distill.tail)
    if target:  # compile the steps (gkd: and the student's sampling) for the slice; exit 2 unless they fit
        from flaxlm.data.chat_rows import placeholder_rows
        rows = placeholder_rows(max_length, len(tokenizer)) if gkd else run.placeholder_taught_rows(
            max_length, len(tokenizer), distill.top_k)
        return check_fit(target, args, model_args, params, objective, mesh, micro_batch, eval_batch, rows,
                         config.vocab_size, **(dict(sampler=sampler, prompt_length=prompt_length) if gkd else {}))

    # The teacher's top k of each training row, once (offline) -> the rows of each step.
    start_fresh(args)  # inputs all read
    if gkd:
        teacher_sampler = Sampler(teacher_graphdef, mesh, max_new_tokens=distill.max_new_tokens,
                                  eos_id=tokenizer.eos_token_id, pad_id=pad_id,
                                  temperature=temperature) if distill.seq_kd else None
        train_rows = OnPolicyRows(rows["train"], global_batch, args.seed, lmbda=distill.lmbda, seq_kd=distill.seq_kd,
                                  student_sampler=sampler, teacher_sampler=teacher_sampler, teacher_params=teacher_params,
                                  max_prompt_length=prompt_length, eos_id=tokenizer.eos_token_id, pad_id=pad_id)
    else:
        store_dir = distill.teacher_logits or os.path.join(args.output_dir, "teacher_logits")
        teacher_config, teacher_graphdef, teacher_params = run.load_teacher(model_args, distill, args, mesh, None,
                                                                            tokenizer)
        vocab_size = min(config.vocab_size, teacher_config.vocab_size)  # the tokens both have
        taught = run.offline_rows(store_dir, rows["train"], distill, vocab_size, teacher_graphdef, teacher_params,
                                  eval_batch, mesh, pad_id)
        del teacher_params  # the teacher is never held while the student trains
        train_rows = ShuffledRows(taught, global_batch, args.seed)
    total_steps = total_train_steps(args, train_rows)

    # Train, evaluating the student's next-token loss on the held-out rows; export with a card naming the teacher.
    params = train_and_evaluate(args, model_args, params, objective, train_rows, rows.get("validation"), total_steps,
                                mesh, micro_batch, eval_batch, config=config)
    how = (f"distilled on-policy from {distill.teacher_model_name_or_path} (GKD: beta {distill.beta:g}, lmbda "
           f"{distill.lmbda:g}{', seq_kd' if distill.seq_kd else ''}; run_distill.py)" if gkd else
           f"distilled from {distill.teacher_model_name_or_path}'s top-{distill.top_k} log-probabilities (alpha "
           f"{distill.alpha:g}, temperature {temperature:g}, tail {distill.tail}; run_distill.py)")
    export(args, model_args, config, params, tokenizer, "transformers.AutoModelForCausalLM", how=how, lora=lora,
           merge_lora=lora_args.merge_lora, merge_dtype=lora_args.merge_dtype)


if __name__ == "__main__":
    run_main(main)
