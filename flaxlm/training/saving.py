"""The training loop's checkpoints: each one with the meta a resume needs (data position, seed, batch), the
resume with its checks, and the save on SIGTERM / SIGINT (flaxlm.training.preemption) before the run exits.
How the state is written and read back is flaxlm.training.checkpoint's."""
from flaxlm.errors import UserError
from flaxlm.training.checkpoint import Checkpointer, restore_for_resume
from flaxlm.training.preemption import Preempted
from flaxlm.reporting.run_log import say


class Saver:
    def __init__(self, args, train_rows, global_batch):
        """args: the TrainingArgs (--output_dir, --save_steps, --save_total_limit, --async_checkpointing,
        --resume_from_checkpoint, --seed); train_rows: the rows of each step (their epoch goes in the meta)."""
        self.checkpointer = Checkpointer(args.output_dir, max_to_keep=args.save_total_limit,
                                         background=args.async_checkpointing)
        self.every, self.resume_from = args.save_steps, args.resume_from_checkpoint
        self.train_rows, self.global_batch = train_rows, global_batch
        self.seed = args.seed  # a resumed run continues with its checkpoint's seed
        self.output_dir = args.output_dir

    def resume(self, state, log, like=None):
        """(first step, state): 0 and `state` for a fresh run; with --resume_from_checkpoint, the checkpoint's
        step and state, after checking it was written with this run's batch and rows; the log rows past it
        are dropped (the steps after it are run again). like: what the checkpoint is read into (default `state`;
        a function of the step where the state's structure depends on it: flaxlm.training.freeze)."""
        if not self.resume_from:
            return 0, state
        start, state, meta, resume_dir = restore_for_resume(self.resume_from, self.checkpointer,
                                                            state if like is None else like)
        log.drop_after(start)  # rows a killed run logged past its last checkpoint are redone
        rows = self._num_train_rows()
        if meta.get("global_batch") != self.global_batch or meta.get("num_train_rows") != rows:
            raise UserError(f"checkpoint {start} was written with global batch {meta.get('global_batch')} over "
                            f"{meta.get('num_train_rows')} training rows, this run has {self.global_batch} over "
                            f"{rows}; resume with the same data and batch flags")
        self.seed = meta["seed"]
        at = meta.get("stream_position")
        if at and hasattr(self.train_rows, "resume_at"):  # --streaming: the texts before it are not read again
            self.train_rows.resume_at(start, at)
        if at and hasattr(self.train_rows, "describe_position"):  # GRPO: inside a round of completions
            stream = self.train_rows.describe_position(at)
        else:
            stream = f", the stream at text {at['texts']} of pass {at['pass'] + 1}" if at else ""
        say(f"resumed from step {start} of {resume_dir} (epoch {meta['epoch']}, seed {self.seed}{stream})")
        return start, state

    def due(self, step, total_steps):
        """Whether the loop saves after `step`: every --save_steps, and the last step."""
        return step % self.every == 0 or step == total_steps

    def save(self, step, state):
        meta = {"step": step, "epoch": self.train_rows.epoch_of(step), "seed": self.seed,
                "global_batch": self.global_batch, "num_train_rows": self._num_train_rows(),
                "rows_consumed": step * self.global_batch}
        if hasattr(self.train_rows, "position_after"):  # --streaming: where the stream stands (GRPO: the round)
            meta["stream_position"] = self.train_rows.position_after(step)
        self.checkpointer.save(step, state, meta)

    def keep(self, step, start, total_steps, state):
        """Before a user error ends the run after `step` (a reward function's, inside the loop): the step saved unless
        it already is (or nothing was trained since `start`), and said how to continue once it is fixed."""
        if step > start and not self.due(step, total_steps):
            self.save(step, state)
        if step > start:
            say(f"saved step {step} to {self.checkpointer.path(step)}; once the error below is fixed, rerun the same "
                f"command with --resume_from_checkpoint latest")
        elif start:
            say(f"nothing trained since step {start}; once the error below is fixed, rerun the same command (with its "
                f"--resume_from_checkpoint)")
        else:  # no checkpoint to resume from: the directory holds only this run's files
            say(f"nothing trained yet; once the error below is fixed, rerun the same command with "
                f"--overwrite_output_dir ({self.output_dir} holds only this run's files, no checkpoint)")

    def stop(self, signal_name, step, total_steps, state, progress):
        """On a signal after `step`: log the pending steps, save the step (unless just saved), and exit
        (Preempted, code 0) once the checkpoint is on disk."""
        if progress.pending:
            progress.write(step)
        if not self.due(step, total_steps):
            self.save(step, state)
        self.checkpointer.close()  # the checkpoint is on disk before we say so
        progress.close()
        say(f"{signal_name}: stopped after step {step} of {total_steps} and saved it to "
            f"{self.checkpointer.path(step)}; to continue, rerun the same command with "
            f"--resume_from_checkpoint latest")
        raise Preempted()

    def close(self):
        """Wait for a save in flight (also when the loop dies)."""
        self.checkpointer.close()

    def _num_train_rows(self):
        return getattr(self.train_rows, "num_rows", None)
