"""The training loop's train rows of metrics.jsonl and its progress bar.

Each row averages the steps since the last one (steps whose update was skipped as not finite left out, and
counted), with the learning rate and the tokens seen so far, and from the step timer: tokens/s, ms per step, MFU
and the share of the step time the host spent on data. The timer starts after the first step (which compiles) and
restarts after each evaluation, so neither counts as train time.
"""
import time

import jax
import numpy as np
from tqdm.auto import tqdm

from flaxlm.reporting.run_log import say

DATA_SHARE_NOTE = 0.05  # say so when the host's data work takes more of the step time than this


class TrainProgress:
    def __init__(self, log, schedule, global_batch, objective, peak_flops, streaming, start, total_steps,
                 on_policy=False):
        """log: the RunLog; schedule: step -> learning rate; peak_flops: of the whole mesh, or None (no MFU);
        streaming: whether the rows are tokenized inside the loop (a hint when data work is slow); on_policy: the
        rows are sampled from the policy (GRPO), so the host's share is generation's, logged as generation_ms and
        generation_share (no note)."""
        self.log, self.schedule, self.peak_flops, self.streaming = log, schedule, peak_flops, streaming
        self.on_policy = on_policy
        self.tokens_per_step = global_batch * objective.tokens_per_example
        self.flops_per_step = global_batch * objective.flops_per_example
        self.pending = []  # device metrics of the steps since the last row
        self.t_mark, self.timed, self.data_s = None, 0, 0.0  # timer start, steps timed since, their data work
        self.bar = tqdm(total=total_steps, initial=start, desc="train", dynamic_ncols=True,
                        disable=jax.process_index() != 0)

    def step_done(self, metrics, data_s):
        """After each step: its device metrics and the seconds the host spent preparing its batch."""
        self.pending.append(metrics)
        self.bar.update(1)
        if self.t_mark is None:  # the first step compiles: time from its end
            jax.block_until_ready(metrics)
            self.t_mark, self.timed = time.perf_counter(), 0
        else:
            self.timed += 1
            self.data_s += data_s

    def restart_clock(self):
        """Time from now (after an evaluation: its time is not train time)."""
        self.t_mark = time.perf_counter()

    def write(self, done):
        """The row of the pending steps, logged at step `done`."""
        host = jax.device_get(self.pending)
        good = [m for m in host if m["finite"]]
        row = {k: float(np.mean([m[k] for m in good or host])) for k in host[0] if k != "finite"}
        if len(good) < len(host):  # skipped steps do not enter the averages
            row["skipped_steps"] = len(host) - len(good)
        row["learning_rate"] = float(self.schedule(done - 1))
        row["tokens"] = done * self.tokens_per_step  # seen since the first step (padding included)
        if self.timed:
            row.update(self._speed(time.perf_counter() - self.t_mark))
        if self.on_policy and "data_ms" in row:  # the step's sampling and scoring of completions
            row["generation_ms"], row["generation_share"] = row.pop("data_ms"), row.pop("data_share")
        self.log.write(done, "train", row)
        self.bar.set_postfix(loss=f"{row['loss']:.4f}", tok_s=f"{row.get('tokens_per_s', 0):.0f}")
        if row.get("data_share", 0) > DATA_SHARE_NOTE:
            say(f"step {done}: {describe_data_share(row, self.streaming)}")
        self.pending, self.timed, self.t_mark, self.data_s = [], 0, time.perf_counter(), 0.0

    def _speed(self, elapsed):
        """tokens/s, step and data ms, data share and MFU of the steps timed over `elapsed` seconds."""
        speed = {"tokens_per_s": self.tokens_per_step * self.timed / elapsed,
                 "step_ms": 1000 * elapsed / self.timed, "data_ms": 1000 * self.data_s / self.timed,
                 "data_share": min(1.0, self.data_s / elapsed)}
        if self.peak_flops:
            speed["mfu"] = self.flops_per_step * self.timed / elapsed / self.peak_flops
        return speed

    def close(self):
        self.bar.close()


def describe_data_share(row, streaming):
    """A note that the host's per-step data work (reading rows, masking, copying to the devices) takes
    row["data_share"] of the step time, with what may lower it."""
    hint = ("--streaming tokenizes inside the loop: tokenize ahead instead (drop --streaming, use "
            "--preprocessing_num_workers N)" if streaming else
            "the host prepares each batch while the device runs the previous step, so on an accelerator this "
            "slows training only near 100%; on CPU the two share the cores")
    return (f"host data work is {row['data_share']:.0%} of step time ({row['data_ms']:.1f} of "
            f"{row['step_ms']:.1f} ms); {hint}")
