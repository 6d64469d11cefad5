"""The rows a distillation trains on, shaped as run_sft.py's (input_ids, segment_ids, positions, trained [N, L]):

    TextRows(blocks, prompt_length=0)       token blocks (run_clm_flax.py's, prepare_data.py's) seen as such rows,
                                            every token taught past the first prompt_length (gkd: the prompt)
    OnPolicyRows(rows, ...)                 gkd's rows of each step: with probability lmbda the student's own
                                            completions of the rows' prompts, else (--seq_kd) the teacher's, else the
                                            rows as they are (TRL's GKDTrainer.training_step)
"""
import jax
import numpy as np

from flaxlm.data.rows import ShuffledRows, num_rows, take_rows
from flaxlm.errors import UserError
from flaxlm.models.generation import left_pad
from flaxlm.rl.sampling import completion_masks


class TextRows:
    """rows_at(idx): blocks of token ids (any of take_rows' kinds) as one-document rows, positions 0..L-1, every
    token taught from prompt_length on."""

    def __init__(self, blocks, prompt_length=0):
        self.blocks, self.prompt_length = blocks, prompt_length

    def __len__(self):
        return num_rows(self.blocks)

    def rows_at(self, idx):
        got = take_rows(self.blocks, np.asarray(idx))
        ids = np.asarray(got["input_ids"] if isinstance(got, dict) else got, np.int32)
        n, length = ids.shape
        positions = np.broadcast_to(np.arange(length, dtype=np.int32), (n, length)).copy()
        return {"input_ids": ids, "segment_ids": np.ones_like(ids), "positions": positions,
                "trained": (positions >= self.prompt_length).astype(np.int32)}

    def materialized(self):
        return self.rows_at(np.arange(len(self)))


def prompts_of(rows, max_prompt_length):
    """The prompt of each row: its tokens before the first taught one, cut from the left to max_prompt_length."""
    first = np.argmax(rows["trained"] > 0, axis=1)
    return [ids[:start][-max_prompt_length:].tolist() for ids, start in zip(rows["input_ids"], first)]


def completion_rows(prompts, completions_NC, eos_id, length, pad_id):
    """Rows of each prompt followed by its completion (up to and with its EOS), right-padded to `length`, the
    completion taught; and their lengths and which were cut at the sampling limit."""
    mask_NC, truncated_N = completion_masks(completions_NC, eos_id)
    lengths_N = mask_NC.sum(axis=1).astype(np.int64)
    n = len(prompts)
    ids = np.full((n, length), pad_id, np.int32)
    trained, segments, positions = (np.zeros((n, length), np.int32) for _ in range(3))
    for i, (prompt, completion) in enumerate(zip(prompts, completions_NC)):
        p, c = len(prompt), int(lengths_N[i])
        ids[i, :p], ids[i, p:p + c] = prompt, completion[:c]
        trained[i, p:p + c] = 1
        segments[i, :p + c] = 1
        positions[i, :p + c] = np.arange(p + c)
    return {"input_ids": ids, "segment_ids": segments, "positions": positions, "trained": trained}, lengths_N, \
        truncated_N


def check_room_to_sample(max_prompt_length, max_new_tokens, max_length, lmbda, seq_kd):
    """UserError unless a prompt plus the tokens sampled after it fit a row. lmbda 0 without seq_kd samples nothing
    (the data's completions only): no limit to check, as TRL's."""
    if (lmbda > 0 or seq_kd) and max_prompt_length + max_new_tokens > max_length:
        raise UserError(f"--max_prompt_length {max_prompt_length} + --max_new_tokens {max_new_tokens} exceeds "
                        f"--max_length {max_length}: a sampled row would not fit; lower one or raise --max_length")


class OnPolicyRows:
    on_policy = True  # the training loop hands batch_rows the current params

    def __init__(self, rows, global_batch, seed, *, lmbda, seq_kd, student_sampler, teacher_sampler, teacher_params,
                 max_prompt_length, eos_id, pad_id):
        """rows: one example a row (unpacked), its completion the taught tokens; the samplers
        (flaxlm.rl.sampling.Sampler) of the student and (seq_kd) the teacher, drawing up to max_new_tokens; a row's
        prompt plus max_new_tokens must fit its length."""
        self.order = ShuffledRows(rows, global_batch, seed)
        self.num_rows, self.steps_per_epoch = self.order.num_rows, self.order.steps_per_epoch
        self.length = take_rows(rows, np.arange(1))["input_ids"].shape[1]
        check_room_to_sample(max_prompt_length, student_sampler.C, self.length, lmbda, seq_kd)
        self.seed, self.lmbda, self.seq_kd = seed, lmbda, seq_kd
        self.student_sampler, self.teacher_sampler, self.teacher_params = student_sampler, teacher_sampler, \
            teacher_params
        self.max_prompt_length, self.eos_id, self.pad_id = max_prompt_length, eos_id, pad_id
        self.metrics = {}

    def epoch_of(self, step):
        return self.order.epoch_of(step)

    def source_of(self, step):
        """'student', 'teacher' or 'data': whose completions `step` trains on (a seeded draw per step, so that a
        resumed run draws as the run it continues)."""
        if np.random.default_rng([self.seed, 7, step]).random() < self.lmbda:
            return "student"
        return "teacher" if self.seq_kd else "data"

    def batch_rows(self, step, local, params):
        rows = self.order.batch_rows(step, slice(None))  # every process samples the whole batch's prompts
        source = self.source_of(step)
        self.metrics = {"on_policy": float(source == "student")}  # the same keys every step: the log averages them
        if source != "data":
            sampler, sampling_params = ((self.student_sampler, params) if source == "student"
                                        else (self.teacher_sampler, self.teacher_params))
            prompts = prompts_of(rows, self.max_prompt_length)
            ids_NP, mask_NP = left_pad(prompts, self.max_prompt_length, self.pad_id)
            key = jax.random.fold_in(jax.random.key(self.seed), step)
            completions_NC = sampler(sampling_params, ids_NP, mask_NP, key)
            rows, _, _ = completion_rows(prompts, completions_NC, self.eos_id, self.length, self.pad_id)
        return {k: v[local] for k, v in rows.items()}

    def step_metrics(self, step):
        return self.metrics

    def log_samples(self, done, log):
        pass
