"""The rows of a GRPO run: each round, a batch of prompts, --num_generations completions of each sampled from the
current policy, their rewards and group advantages, and the log-probabilities the loss needs beside them.

    rollouts = Rollouts(prompts, prompt_ids, tokenizer, rewards, settings, sampler, scorer, global_batch, seed)
    rows = rollouts.batch_rows(step, local, params)     # the training loop's rows of `step` (flaxlm.training.loop)
    rollouts.step_metrics(step)                         # TRL's reward/* and completions/* figures of its round

A round serves --num_iterations optimizer steps (the same completions each time, the sampling policy's
log-probabilities kept as `old_logps`); its prompts are the next global_batch / num_generations of a seeded
shuffle of the training prompts (epochs over them), each repeated num_generations times in a row (one group),
and its completions are drawn with a key folded from the seed and the round, so that a resumed run samples the
same completions as the run it continues. A checkpoint saved inside a round (--num_iterations > 1) writes the
round's rows beside it (OUTPUT_DIR/rollouts/round_R.npz): resuming there trains on them, not on a new draw.
"""
import json
import os
import time

import jax
import numpy as np

from flaxlm.data.prompts import decode_completions
from flaxlm.data.rows import ShuffledRows
from flaxlm.errors import UserError
from flaxlm.rl.advantages import group_advantages
from flaxlm.reporting.run_log import say
from flaxlm.rl.rewards import score
from flaxlm.rl.sampling import completion_masks
from flaxlm.training import mesh as meshlib


def prompt_batch(prompt_ids, length, pad_id):
    """(ids_NP, mask_NP) int32: the prompts left-padded to `length` (flaxlm.models.generation.left_pad)."""
    from flaxlm.models.generation import left_pad
    return left_pad(prompt_ids, length, pad_id)


class Rollouts:
    on_policy = True  # the training loop hands batch_rows the current params

    def __init__(self, prompts, prompt_ids, tokenizer, rewards, settings, sampler, scorer, global_batch, seed, *,
                 prompt_length, pad_id, eos_id, reference=None, output_dir=None, log_every=None):
        """prompts: flaxlm.data.prompts.Prompt of each training example; prompt_ids: their token ids (cut to
        prompt_length); rewards: flaxlm.rl.rewards.RewardFunc list; settings: the GRPOArgs (num_generations,
        num_iterations, scale_rewards, beta, mask_truncated_completions); sampler: flaxlm.rl.sampling.Sampler;
        scorer(params, rows) -> numpy logps [N, C] (eval mode); reference: the reference's params for beta > 0
        (None: none, or scored live from the adapters off); log_every: steps between completion samples (None: no
        samples)."""
        G = settings.num_generations
        if global_batch % G:
            raise UserError(f"the global batch of {global_batch} completions (--per_device_train_batch_size x devices "
                            f"x --gradient_accumulation_steps) is no multiple of --num_generations {G}; make it one")
        self.prompts, self.prompt_ids, self.tokenizer, self.rewards = prompts, prompt_ids, tokenizer, rewards
        self.settings, self.sampler, self.scorer, self.reference = settings, sampler, scorer, reference
        self.G, self.iterations, self.seed = G, settings.num_iterations, seed
        self.prompt_length, self.pad_id, self.eos_id = prompt_length, pad_id, eos_id
        self.order = ShuffledRows({"index": np.arange(len(prompts))}, global_batch // G, seed)
        self.num_rows = len(prompts)
        self.steps_per_epoch = self.order.steps_per_epoch * self.iterations
        self.output_dir, self.log_every = output_dir, log_every
        self.round, self.rows, self.metrics, self.samples = None, None, {}, None
        self.rounds_sampled = self.rounds_scored = 0  # rounds this run sampled, and those some function scored

    def epoch_of(self, step):
        return step // self.steps_per_epoch

    def batch_rows(self, step, local, params):
        """This process's rows (`local` of the global batch) of 0-based `step`: its round's completions, sampled
        with `params` at the round's first step."""
        r = step // self.iterations
        if r != self.round:
            self.round, self.rows = r, self._read_round(r) or self._sample_round(r, params)
        return {k: v[local] for k, v in self.rows.items()}

    def step_metrics(self, step):
        """TRL's figures of the round of `step`: reward, reward_std, rewards/NAME/mean|std, frac_reward_zero_std,
        completions/*."""
        return self.metrics

    def _sample_round(self, r, params):
        """The rows of round r: prompts -> completions -> rewards -> advantages (+ old and reference logps)."""
        start = time.perf_counter()
        index = np.repeat(self.order.batch_rows(r, slice(None))["index"], self.G)
        ids_NP, mask_NP = prompt_batch([self.prompt_ids[i] for i in index], self.prompt_length, self.pad_id)
        key = jax.random.fold_in(jax.random.key(self.seed), r)
        completions_NC = self.sampler(params, ids_NP, mask_NP, key)
        mask_NC, truncated_N = completion_masks(completions_NC, self.eos_id)
        sampled_s = time.perf_counter() - start
        lengths_N = mask_NC.sum(axis=1)
        if self.settings.mask_truncated_completions:
            mask_NC = mask_NC * ~truncated_N[:, None]
        ids_N = [c[:int(n)].tolist() for c, n in zip(completions_NC, lengths_N)]  # up to and with EOS
        prompts = [self.prompts[i].prompt for i in index]
        completions = decode_completions(self.tokenizer, prompts, ids_N)
        rewards_NF = score(self.rewards, prompts, completions, ids_N, [self.prompts[i].columns for i in index])
        self.rounds_sampled += 1
        if np.isnan(rewards_NF).all():  # every function said None to every completion: TRL warns, as here
            say(f"warning: no reward function scored any of round {r + 1}'s {len(prompts)} completions (each "
                f"returned None): its steps learn nothing; a function should return a number where it applies")
        else:
            self.rounds_scored += 1
        advantages_N, reward_metrics = group_advantages(rewards_NF, np.array([f.weight for f in self.rewards]),
                                                        self.G, self.settings.scale_rewards,
                                                        names=[f.name for f in self.rewards])
        rows = {"input_ids": np.concatenate([ids_NP, completions_NC], axis=1).astype(np.int32),
                "attention_mask": np.concatenate([mask_NP, mask_NC], axis=1).astype(np.int32),
                "completion_mask": mask_NC.astype(np.float32), "advantages": advantages_N.astype(np.float32)}
        if self.iterations > 1:  # the sampling policy's, kept for the ratio of the round's later steps
            rows["old_logps"] = self.scorer(params, rows)
        if self.reference is not None:
            rows["ref_logps"] = self.scorer(self.reference, rows)
        self.metrics = {**reward_metrics, **length_metrics(lengths_N, truncated_N),
                        "sampling_s": sampled_s, "rollout_s": time.perf_counter() - start}
        self.samples = {"prompt": prompts, "completion": completions,
                        **{f"rewards/{f.name}": rewards_NF[:, j].tolist() for j, f in enumerate(self.rewards)},
                        "advantage": advantages_N.tolist()}
        return rows

    def log_samples(self, done, log):
        """Every log_every steps (at a round's first step): the round's prompts, completions, rewards and
        advantages to OUTPUT_DIR/completions.jsonl and the trackers' tables (a W&B table)."""
        if not self.log_every or done % self.log_every or self.samples is None:
            return
        log.table(done, "completions", self.samples)
        self.samples = None  # each round's once

    # A checkpoint inside a round: its rows saved, and read back on resume (flaxlm.training.saving).
    def position_after(self, step):
        """The resume meta of a checkpoint after `step`: None at a round's end, else the round whose rows were
        written to OUTPUT_DIR/rollouts."""
        if step % self.iterations == 0:
            return None
        if meshlib.is_main_process():
            path = self._round_path(self.round)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            np.savez(path + ".tmp.npz", **self.rows, metrics=json.dumps(self.metrics))
            os.replace(path + ".tmp.npz", path)
        return {"rollout_round": self.round}

    def resume_at(self, step, position):
        self.resume_round = position.get("rollout_round")

    def describe_position(self, position):
        return f", inside round {position['rollout_round'] + 1} (its completions read back)"

    def _round_path(self, r):
        return os.path.join(self.output_dir or ".", "rollouts", f"round_{r}.npz")

    def _read_round(self, r):
        if getattr(self, "resume_round", None) != r:
            return None
        path = self._round_path(r)
        if not os.path.exists(path):
            raise UserError(f"the checkpoint was saved inside round {r + 1}, whose completions should be in {path}; "
                            f"put the file back, or resume from a checkpoint at a round's end")
        with np.load(path) as saved:
            self.metrics = json.loads(str(saved["metrics"]))
            return {k: saved[k] for k in saved.files if k != "metrics"}


def length_metrics(lengths_N, truncated_N):
    """TRL's completions/* figures: mean, min, max length; the same over the completions that ended (EOS); and the
    share cut at --max_completion_length (clipped_ratio)."""
    ended = lengths_N[~truncated_N]
    out = {"completions/mean_length": float(lengths_N.mean()), "completions/min_length": float(lengths_N.min()),
           "completions/max_length": float(lengths_N.max()),
           "completions/clipped_ratio": float(truncated_N.mean())}
    out.update({"completions/mean_terminated_length": float(ended.mean()) if len(ended) else 0.0,
                "completions/min_terminated_length": float(ended.min()) if len(ended) else 0.0,
                "completions/max_terminated_length": float(ended.max()) if len(ended) else 0.0})
    return out
