#!/usr/bin/env python
"""Preference tuning of a decoder with DPO (and its IPO / hinge variants), as TRL's DPOTrainer computes it, in JAX.

Pipeline: options -> output directory -> tokenizer (and its chat template, for message pairs) and the decoder (a
run_sft.py export, say) -> pairs in TRL's formats (prompt + chosen + rejected; or two conversations sharing their
prompt) -> tokens, each answer after its prompt -> the reference's log-probabilities of every answer, computed once
on all devices (the starting model, or --reference_model) and kept in OUTPUT_DIR/reference_logps.npz, so that no
second model is held and a resumed run does not recompute them (with LoRA and --precompute_ref_log_probs false:
scored in every step, the base with the adapters off) -> training over all devices, logging TRL's
rewards/* and logps/* -> export in Hugging Face format.

    python run_dpo.py --output_dir runs/dpo --model_name_or_path runs/sft --train_file pairs.jsonl \
        --validation_split_percentage 5 --beta 0.1 --loss_type sigmoid --learning_rate 5e-7 --max_length 1024
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from flaxlm.config.options import DataArgs, DPOArgs, LoraArgs, ModelArgs, TextSourceArgs, TrainingArgs  # noqa: E402
from flaxlm.config.cli import parse_args  # noqa: E402
from flaxlm.errors import UserError, run_main  # noqa: E402

REFERENCE_FILE = "reference_logps.npz"


def main(argv=None):
    model_args, source, data_args, dpo_args, lora_args, args = parse_args(
        ModelArgs, TextSourceArgs, DataArgs, DPOArgs, LoraArgs, TrainingArgs, argv=argv, prog="run_dpo.py",
        description=__doc__)
    live_reference = not dpo_args.precompute_ref_log_probs  # LoRA: the base with the adapters off, in every step
    if live_reference and (not lora_args.lora_rank or dpo_args.reference_model):
        raise UserError("--precompute_ref_log_probs false scores the reference in every step as the base with the "
                        "adapters off, which needs LoRA (--lora_rank) and no --reference_model; leave it on to "
                        "compute the reference's log-probabilities once")
    from flaxlm.data.chat_template import resolve_template
    from flaxlm.data.preferences import encode_pair, load_pairs, pair_rows, placeholder_pairs
    from flaxlm.data.rows import ShuffledRows, total_train_steps
    from flaxlm.objectives.clm import resolve_block_size
    from flaxlm.objectives.dpo import dpo_objective
    from flaxlm.planning.compile_for import check_fit, compile_target
    from flaxlm.training.opening import load_model_and_mesh, load_run_tokenizer
    from flaxlm.training.output_dir import start_fresh
    from flaxlm.training.pipeline import export, start_run, train_and_evaluate, trl_router_loss

    start_run(args, model_args)  # join the other hosts; check --output_dir and the hub before any work
    target = compile_target(args)  # --compile_for: the TPU slice (nothing written, no host joined); else None

    # Pairs, tokenizer (a chat template for message pairs) and --reference_model's config.
    pairs = None if target else load_pairs(source, data_args.validation_split_percentage, args.seed,
                                           max_train_samples=data_args.max_train_samples,
                                           max_eval_samples=data_args.max_eval_samples,
                                           need_validation=args.do_eval)  # --do_eval false: none needed
    tokenizer = load_run_tokenizer(model_args)
    conversational = pairs is not None and any(not isinstance(p.prompt, str) for ps in pairs.values() for p in ps)
    template = resolve_template(tokenizer, dpo_args.chat_template) if conversational else None
    if dpo_args.reference_model:  # before any work: a decoder of the same vocabulary
        from flaxlm.models import check_causal_lm, load_config
        from flaxlm.tokenization.loading import check_fits
        reference_config = load_config(dpo_args.reference_model)
        check_causal_lm(reference_config, dpo_args.reference_model)
        check_fits(tokenizer, reference_config)

    # The devices (--compile_for: the TPU slice's), the decoder on them (with --lora_rank adapters at zero: the base)
    # and the batch sizes (in pairs).
    tokenizer, config, graphdef, params, lora, mesh, (micro_batch, eval_batch, global_batch) = load_model_and_mesh(
        args, model_args, target, tokenizer, script="run_clm_flax.py", lora_args=lora_args, read_sharded=True)
    config = trl_router_loss(model_args, config)  # an MoE's load-balancing loss on unless its coefficient is 0
    max_length = resolve_block_size(dpo_args.max_length, None, tokenizer, config)  # --max_seq_length: its alias

    # The objective.
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    objective = dpo_objective(graphdef, config, params, max_length, pad_id, dpo_args.loss_type, dpo_args.beta,
                              dpo_args.label_smoothing, live_reference)
    if target:  # compile the steps for the slice, print what each device holds; exit 2 unless they fit
        return check_fit(target, args, model_args, params, objective, mesh, micro_batch, eval_batch,
                         placeholder_pairs(max_length, len(tokenizer)), config.vocab_size)

    # Pairs -> the two sequences of each and their answer tokens -> the reference's log-probabilities, once.
    rows = {}
    for split, split_pairs in pairs.items():
        rows[split] = pair_rows([encode_pair(tokenizer, template, p) for p in split_pairs], max_length, pad_id,
                                dpo_args.max_prompt_length, where=f"{split} pair")
        answers = int(rows[split]["chosen_answer"].sum() + rows[split]["rejected_answer"].sum())
        print(f"{split}: {len(split_pairs)} pairs, rows of {max_length} tokens, {answers} answer tokens", flush=True)
    start_fresh(args)  # inputs all read
    if not live_reference:
        for split, ref in reference(args, model_args, dpo_args, graphdef, params, rows, eval_batch, mesh,
                                    pad_id).items():
            rows[split].update(ref)
    train_rows = ShuffledRows(rows["train"], global_batch, args.seed)
    total_steps = total_train_steps(args, train_rows)

    # Train, evaluating the loss and TRL's rewards on the held-out pairs.
    params = train_and_evaluate(args, model_args, params, objective, train_rows, rows.get("validation"), total_steps,
                                mesh, micro_batch, eval_batch, config=config)
    export(args, model_args, config, params, tokenizer, "transformers.AutoModelForCausalLM",
           how=f"preference-tuned with {dpo_args.loss_type} DPO (beta {dpo_args.beta}; run_dpo.py)", lora=lora,
           merge_lora=lora_args.merge_lora, merge_dtype=lora_args.merge_dtype)


def reference(args, model_args, dpo_args, graphdef, params, rows, eval_batch, mesh, pad_id):
    """{split: {"ref_chosen", "ref_rejected"}}: read back from OUTPUT_DIR/reference_logps.npz when it was computed
    for these rows and reference (a resumed run), else computed (the starting params, or --reference_model's,
    loaded for this and let go) and written there."""
    import hashlib

    import numpy as np

    from flaxlm.objectives.dpo import reference_logps
    from flaxlm.reporting.run_log import say
    path = os.path.join(args.output_dir, REFERENCE_FILE)
    digest = hashlib.sha256(repr(dpo_args.reference_model or model_args.model_name_or_path).encode())
    for split in sorted(rows):
        for key in sorted(rows[split]):
            digest.update(rows[split][key].tobytes())
    fingerprint = digest.hexdigest()
    if os.path.exists(path):
        with np.load(path) as saved:
            if str(saved["fingerprint"]) == fingerprint:
                say(f"the reference's log-probabilities: {path} (computed by an earlier run of these pairs)")
                return {s: {k: saved[f"{s}/{k}"] for k in ("ref_chosen", "ref_rejected")} for s in rows}
    if dpo_args.reference_model:  # read straight into the run's sharding, let go once scored
        from flaxlm.models import load_pretrained, split_model
        from flaxlm.training.sharding import state_shardings
        graphdef, params = split_model(load_pretrained(
            dpo_args.reference_model, dtype=model_args.dtype, param_dtype=model_args.param_dtype or "float32",
            shardings=lambda abstract: state_shardings(abstract, mesh, args.sharding))[1])
    out = {split: reference_logps(graphdef, params, r, eval_batch, mesh, pad_id) for split, r in rows.items()}
    from flaxlm.training import mesh as meshlib
    if meshlib.is_main_process():
        tmp = path + ".tmp.npz"
        np.savez(tmp, fingerprint=fingerprint, **{f"{s}/{k}": v for s, ref in out.items() for k, v in ref.items()})
        os.replace(tmp, path)
    say(f"the reference's log-probabilities of {sum(len(r['ref_chosen']) for r in out.values())} pairs, computed "
        f"once, in {path}")
    return out


if __name__ == "__main__":
    run_main(main)
