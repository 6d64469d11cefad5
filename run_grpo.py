#!/usr/bin/env python
"""Reinforcement learning of a decoder with rewards a program computes: GRPO and its successors (DAPO, Dr. GRPO, GSPO),
as TRL's GRPOTrainer computes them, generation and training in one JAX run.

Pipeline: options -> output directory -> reward functions (built-in or FILE.py:FUNCTION) -> tokenizer (its chat
template, for message prompts) and the decoder (a run_sft.py export, say; full or LoRA) -> prompts in TRL's formats
(`prompt` a string or a message list; every other column goes to the reward functions) -> for each round: a batch of
prompts, --num_generations completions of each sampled from the current policy on all devices (the KV cache, the
training params as placed), their rewards and group advantages (flaxlm.rl) -> --num_iterations optimizer steps of
the clipped surrogate (--loss_type, --importance_sampling_level, --beta) over all devices, logging TRL's reward,
completions/*, kl, entropy and clip_ratio/* -> evaluation: one greedy completion per held-out prompt, its rewards ->
export in Hugging Face format.

    python run_grpo.py --output_dir runs/grpo --model_name_or_path runs/sft --train_file questions.jsonl \
        --reward_funcs token_f1 my_rewards.py:formatted --num_generations 8 --max_completion_length 256 \
        --per_device_train_batch_size 16 --learning_rate 1e-6 --loss_type dapo --epsilon_high 0.28
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from flaxlm.config.options import DataArgs, GRPOArgs, LoraArgs, ModelArgs, TextSourceArgs, TrainingArgs  # noqa: E402
from flaxlm.config.cli import parse_args  # noqa: E402
from flaxlm.errors import UserError, run_main  # noqa: E402


def main(argv=None):
    model_args, source, data_args, grpo, lora_args, args = parse_args(
        ModelArgs, TextSourceArgs, DataArgs, GRPOArgs, LoraArgs, TrainingArgs, argv=argv, prog="run_grpo.py",
        description=__doc__)
    import jax

    from flaxlm.data.chat_template import resolve_template
    from flaxlm.data.prompts import encode_prompt, load_prompts
    from flaxlm.data.rows import total_train_steps
    from flaxlm.objectives.grpo import grpo_objective
    from flaxlm.planning.compile_for import check_fit, compile_target
    from flaxlm.rl.evaluation import with_reward_evaluation
    from flaxlm.rl.rewards import BuiltInOptions, check_answer_column, load_reward_funcs
    from flaxlm.rl.rollout import Rollouts
    from flaxlm.rl.run import check_settings, completion_scorer, placeholder_completions, prompt_length_of
    from flaxlm.rl.sampling import Sampler
    from flaxlm.training.output_dir import start_fresh
    from flaxlm.training.opening import load_model_and_mesh, load_run_tokenizer
    from flaxlm.training.pipeline import export, start_run, train_and_evaluate, trl_router_loss

    start_run(args, model_args)  # join the other hosts; check --output_dir and the hub before any work
    target = compile_target(args)  # --compile_for: the TPU slice (nothing written, no host joined); else None
    check_settings(grpo, lora_args)
    rewards = load_reward_funcs(grpo.reward_funcs, grpo.reward_weights, BuiltInOptions(
        answer_column=grpo.answer_column, format_pattern=grpo.reward_format_pattern,
        max_completion_length=grpo.max_completion_length, soft_punish_cache=grpo.soft_punish_cache))

    # Prompts, tokenizer (a chat template for message prompts) and the decoder, with LoRA adapters if asked.
    prompts = None if target else load_prompts(source, data_args.validation_split_percentage, args.seed,
                                               max_train_samples=data_args.max_train_samples,
                                               max_eval_samples=data_args.max_eval_samples,
                                               need_validation=args.do_eval)  # --do_eval false: none needed
    if prompts is not None:
        check_answer_column(rewards, prompts, grpo.answer_column)
    tokenizer = load_run_tokenizer(model_args)
    conversational = prompts is not None and any(not isinstance(p.prompt, str) for ps in prompts.values() for p in ps)
    template = resolve_template(tokenizer, grpo.chat_template) if conversational or grpo.chat_template else None
    tokenizer, config, graphdef, params, lora, mesh, (micro_batch, eval_batch, global_batch) = load_model_and_mesh(
        args, model_args, target, tokenizer, script="run_clm_flax.py", lora_args=lora_args, read_sharded=True)
    config = trl_router_loss(model_args, config)  # an MoE's load-balancing loss on unless its coefficient is 0
    # (the batch sizes count completions, as TRL's do)
    if template:
        tokenizer.chat_template = template  # the export answers as it was trained

    # Prompts -> tokens (cut from the left to --max_prompt_length), one prompt length for every round.
    ids = {} if target else {split: [encode_prompt(tokenizer, template, p.prompt)[-(grpo.max_prompt_length or 0):]
                                     for p in ps] for split, ps in prompts.items()}
    prompt_length = prompt_length_of(ids, grpo, config)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    objective = grpo_objective(graphdef, config, params, prompt_length=prompt_length,
                               completion_length=grpo.max_completion_length, pad_id=pad_id,
                               loss_type=grpo.loss_type, beta=grpo.beta, epsilon=grpo.epsilon,
                               epsilon_high=grpo.epsilon_high, importance_sampling_level=grpo.importance_sampling_level,
                               temperature=grpo.temperature, live_reference=bool(lora) and grpo.beta > 0,
                               bias_correction_kl=grpo.use_bias_correction_kl)
    sampler = Sampler(graphdef, mesh, max_new_tokens=grpo.max_completion_length, eos_id=tokenizer.eos_token_id,
                      pad_id=pad_id, temperature=grpo.temperature, top_k=grpo.top_k, top_p=grpo.top_p)
    if target:  # compile the train step and the sampling for the slice, print what each device holds; exit 2 unless
        return check_fit(target, args, model_args, params, objective, mesh, micro_batch, eval_batch,  # they fit
                         placeholder_completions(prompt_length, grpo, len(tokenizer)), config.vocab_size,
                         sampler=sampler, prompt_length=prompt_length)

    # The rounds: prompts -> completions from the current policy -> rewards -> advantages (-> logps kept).
    scorer = completion_scorer(graphdef, mesh, grpo, micro_batch)
    reference = jax.tree.map(lambda x: x.copy(), params) if grpo.beta and not lora else None  # never donated
    log_every = grpo.log_completions_steps or (args.logging_steps if grpo.log_completions else None)
    start_fresh(args)  # inputs all read
    rollouts = Rollouts(prompts["train"], ids["train"], tokenizer, rewards, grpo, sampler, scorer, global_batch,
                        args.seed, prompt_length=prompt_length, pad_id=pad_id, eos_id=tokenizer.eos_token_id,
                        reference=reference, output_dir=args.output_dir, log_every=log_every)
    total_steps = total_train_steps(args, rollouts)  # --max_steps, else epochs over the prompts (x --num_iterations)

    # Train, evaluating one greedy completion of each held-out prompt by its rewards.
    objective, eval_rows = with_reward_evaluation(objective, graphdef, prompts.get("validation"), ids.get("validation"),
                                                  prompt_length, tokenizer, rewards, grpo, pad_id)
    params = train_and_evaluate(args, model_args, params, objective, rollouts, eval_rows, total_steps, mesh,
                                micro_batch, eval_batch, config=config)
    if rollouts.rounds_sampled and not rollouts.rounds_scored:  # an untrained model is not exported as trained
        raise UserError(f"no reward function scored a single completion in the {rollouts.rounds_sampled} rounds of "
                        f"this run (each returned None): the model got no reward signal, so it was not exported "
                        f"(the checkpoints in {args.output_dir} are kept); make the functions return numbers where "
                        f"they apply")
    export(args, model_args, config, params, tokenizer, "transformers.AutoModelForCausalLM",
           how=(f"trained with {grpo.loss_type} GRPO on the rewards {', '.join(f.name for f in rewards)} "
                f"({grpo.num_generations} completions a prompt, importance sampling per "
                f"{grpo.importance_sampling_level}, beta {grpo.beta:g}; run_grpo.py)"),
           lora=lora, merge_lora=lora_args.merge_lora, merge_dtype=lora_args.merge_dtype)


if __name__ == "__main__":
    run_main(main)
