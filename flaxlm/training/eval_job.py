"""An evaluation job (--eval_checkpoints): the checkpoints a training run saved in --output_dir, evaluated
instead of training, as a separate job on another machine would.

'latest' evaluates the newest checkpoint once. 'all' evaluates each checkpoint as it appears, in step
order, until the final step (continuous evaluation beside a running training job). Results go to
OUTPUT_DIR/eval_metrics.jsonl (TensorBoard: tensorboard/eval_checkpoints); a step already there is not
evaluated again, so a restarted job evaluates every checkpoint exactly once.
"""
import os
import time

from flaxlm.errors import UserError
from flaxlm.training.checkpoint import Checkpointer, saved_steps
from flaxlm.training.evaluation import Evaluator
from flaxlm.training.freeze import as_phases
from flaxlm.training.optim import eval_params
from flaxlm.reporting.run_log import RunLog, say
from flaxlm.training.train_step import initial_state

EVAL_LOG = "eval_metrics.jsonl"
POLL_SECONDS = 2.0


def evaluate_checkpoints(args, params, objective, tx, eval_rows, mesh, eval_batch, total_steps):
    """Evaluate the checkpoints of --output_dir as --eval_checkpoints says (the module docstring); params and tx
    give the train state's shapes and shardings, total_steps the final step to wait for."""
    if eval_rows is None:
        raise UserError("--eval_checkpoints needs validation data; pass --validation_file (or a dataset with a "
                        "validation split, or keep --validation_split_percentage above 0)")
    phases = as_phases(tx)  # --train_only: a checkpoint's optimizer state has its phase's form
    like_state, shardings = initial_state(params, phases[0].tx, mesh, args.sharding)
    like_state = phases.like_state(like_state, mesh, args.sharding)
    checkpointer = Checkpointer(args.output_dir)
    log = RunLog(args.output_dir, fresh=False, filename=EVAL_LOG, tensorboard=os.path.join("tensorboard",
                                                                                            "eval_checkpoints"))
    evaluate = Evaluator(objective, mesh, shardings["params"], eval_batch, args.seed, log, what="checkpoint")

    def run(step):
        checkpointer.manager.reload()  # see the checkpoints the training job wrote since we started
        try:
            state, _ = checkpointer.restore(step, like_state)
        except Exception as e:  # deleted by --save_total_limit meanwhile, or unreadable: not ours to move
            say(f"checkpoint {checkpointer.path(step)} could not be read ({type(e).__name__}); skipped it")
            return
        evaluate(eval_params(state), step, eval_rows)  # schedule-free AdamW: its averaged parameters

    try:
        if args.eval_checkpoints == "latest":
            steps = saved_steps(checkpointer.root)
            if not steps:
                raise UserError(f"--eval_checkpoints latest: no checkpoint in {checkpointer.root}; train first "
                                f"(checkpoints are written every --save_steps)")
            run(max(steps))
            return
        done = log.logged_steps("eval")
        last_new = time.monotonic()
        say(f"evaluating each checkpoint of {checkpointer.root} as it appears, until step {total_steps} "
             f"(results in {log.path})")
        while total_steps not in done:
            new = sorted(s for s in saved_steps(checkpointer.root) if s not in done)
            for step in new:
                run(step)
                done.add(step)
            if new:
                last_new = time.monotonic()
            elif time.monotonic() - last_new > args.eval_timeout:
                say(f"no new checkpoint in {args.eval_timeout:g} s; stopped before the final step {total_steps}")
                return
            else:
                time.sleep(POLL_SECONDS)
        say(f"evaluated the final checkpoint (step {total_steps})")
    finally:
        log.close()
        checkpointer.close()

