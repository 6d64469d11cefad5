"""What run_grpo.py checks and builds around its rounds: the settings TRL would question, the one prompt length of
a run, the scorer of completions' log-probabilities and the placeholder rows --compile_for plans with."""
import jax
import numpy as np

from flaxlm.errors import UserError
from flaxlm.objectives.grpo import completion_logps
from flaxlm.reporting.run_log import say
from flaxlm.training import mesh as meshlib


def check_settings(grpo, lora_args):
    """UserError for settings that cannot run; one line where TRL warns (GSPO's ratio with a token-summing loss)."""
    if not 0 < grpo.top_p <= 1:
        raise UserError(f"--top_p {grpo.top_p} is outside (0, 1]; use 1 to sample from the whole distribution")
    if grpo.temperature == 0:
        say("--temperature 0 samples greedily: every completion of a group is the same, so every advantage is 0; "
            "use a temperature above 0 (TRL's default is 1)")
    if grpo.importance_sampling_level == "sequence" and grpo.loss_type != "grpo":
        say(f"note: --importance_sampling_level sequence with --loss_type {grpo.loss_type} sums per-token "
            f"contributions, weighting each sequence by its length; GSPO's paper uses --loss_type grpo (as TRL warns)")


def prompt_length_of(ids, grpo, config):
    """The left-padded length P of every prompt of the run (the longest, after --max_prompt_length's cut; --compile_for:
    --max_prompt_length itself), checked with --max_completion_length against the model's positions."""
    from flaxlm.models import family_of
    lengths = [len(x) for split_ids in ids.values() for x in split_ids]
    if not ids:
        if not grpo.max_prompt_length:
            raise UserError("--compile_for plans prompts of --max_prompt_length tokens; pass it (e.g. "
                            "--max_prompt_length 512)")
        P = grpo.max_prompt_length
    elif not lengths:
        raise UserError("no prompts to train on; give --train_file (or --dataset_name) rows with a `prompt` column")
    else:
        if min(lengths) == 0:
            raise UserError("a prompt encodes to no tokens; give every prompt some text")
        P = max(lengths)
    limit = family_of(config).max_length
    limit = None if limit is None else limit(config)
    if limit is not None and P + grpo.max_completion_length > limit:
        raise UserError(f"prompts of up to {P} tokens + --max_completion_length {grpo.max_completion_length} exceed "
                        f"the model's {limit} positions; lower --max_completion_length or pass --max_prompt_length "
                        f"{max(1, limit - grpo.max_completion_length)} (prompts cut from the left)")
    return P


def completion_scorer(graphdef, mesh, grpo, chunk_rows):
    """scorer(params, rows) -> numpy float32 [N, C]: each completion token's log-probability under params (eval
    mode, logits / --temperature), on all devices, chunk_rows rows at a time."""
    C = grpo.max_completion_length
    keys = ("input_ids", "attention_mask")
    step = meshlib.on_mesh(jax.jit(lambda p, b: completion_logps(graphdef, p, b, C, grpo.temperature)[0],
                                   out_shardings=meshlib.replicated(mesh)), mesh)
    sharding = meshlib.batch_sharding(mesh)

    def scorer(params, rows):
        out = []
        for start in range(0, len(rows["input_ids"]), chunk_rows):
            chunk = {k: rows[k][start:start + chunk_rows] for k in keys}
            local = meshlib.local_rows(len(chunk["input_ids"]))
            out.append(np.asarray(jax.device_get(step(params, meshlib.to_device_batch(
                {k: v[local] for k, v in chunk.items()}, sharding)))))
        return np.concatenate(out).astype(np.float32)
    return scorer


def placeholder_completions(prompt_length, grpo, vocab_size, n=8):
    """Rows of n completions shaped as a round's (only their shapes matter): for --compile_for."""
    C = grpo.max_completion_length
    rng = np.random.default_rng(0)
    rows = {"input_ids": rng.integers(min(8, vocab_size - 1), vocab_size, (n, prompt_length + C)).astype(np.int32),
            "attention_mask": np.ones((n, prompt_length + C), np.int32),
            "completion_mask": np.ones((n, C), np.float32), "advantages": np.ones(n, np.float32)}
    if grpo.num_iterations > 1:
        rows["old_logps"] = np.zeros((n, C), np.float32)
    if grpo.beta:
        rows["ref_logps"] = np.zeros((n, C), np.float32)
    return rows
