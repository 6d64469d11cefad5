"""A GRPO run's evaluation: one greedy completion of each held-out prompt, sampled on all devices inside the
evaluation step (flaxlm.training.evaluation's predict), and what the reward functions make of them: reward,
rewards/NAME/mean and completions/mean_length, completions/clipped_ratio in the run's eval rows."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from flaxlm.models import generation
from flaxlm.rl.rewards import score
from flaxlm.data.prompts import decode_completions
from flaxlm.rl.rollout import prompt_batch
from flaxlm.rl.sampling import completion_masks

GREEDY = generation.sampling_options(0.0, 0, 1.0)


def with_reward_evaluation(objective, graphdef, prompts, prompt_ids, prompt_length, tokenizer, rewards, grpo, pad_id):
    """(the objective evaluating by rewards, the held-out rows {input_ids, attention_mask} of the prompts), or
    (objective, None) without held-out prompts."""
    if not prompts:
        return objective, None
    C, eos = grpo.max_completion_length, tokenizer.eos_token_id
    eos_pad = np.array([-1 if eos is None else eos, pad_id], np.int32)

    def predict(params, batch):
        ids_BP, mask_BP = batch["input_ids"], batch["attention_mask"]
        key = jax.random.key(0)  # (greedy: never drawn from)
        first_B, cache = generation._prefill(graphdef, params, ids_BP, mask_BP, key, GREEDY,
                                             cache_length=ids_BP.shape[1] + C, do_sample=False)
        out_BC, _ = generation._decode(graphdef, params, cache, first_B, jnp.sum(mask_BP, axis=1).astype(jnp.int32),
                                       key, GREEDY, eos_pad, max_new_tokens=C, do_sample=False)
        return {"completion_ids": out_BC}

    def metrics(outputs):
        completions_NC = outputs["completion_ids"]
        mask_NC, truncated_N = completion_masks(completions_NC, eos)
        lengths_N = mask_NC.sum(axis=1).astype(int)
        ids_N = [c[:n].tolist() for c, n in zip(completions_NC, lengths_N)]  # up to and with EOS
        texts = [p.prompt for p in prompts]
        rewards_NF = score(rewards, texts, decode_completions(tokenizer, texts, ids_N), ids_N,
                           [p.columns for p in prompts])
        weights_F = np.array([f.weight for f in rewards], np.float32)
        total_N = np.where(np.isnan(rewards_NF).all(axis=1), np.nan, np.nansum(rewards_NF * weights_F, axis=1))
        out = {"reward": float(np.nanmean(total_N))}
        out.update({f"rewards/{f.name}/mean": float(np.nanmean(rewards_NF[:, j])) for j, f in enumerate(rewards)})
        out.update({"completions/mean_length": float(lengths_N.mean()),
                    "completions/clipped_ratio": float(truncated_N.mean())})
        return out

    ids_NP, mask_NP = prompt_batch(prompt_ids, prompt_length, pad_id)
    evaluating = dataclasses.replace(objective, predict=predict, metrics=metrics, eval_sums=lambda params, batch: {"weight_sum": jnp.sum(batch["weights"])})
    return evaluating, {"input_ids": ids_NP, "attention_mask": mask_NP}
