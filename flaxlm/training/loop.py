"""The training loop every training script shares: train() reads top to bottom; its pieces are

    flaxlm.training.train_step   the jitted step (accumulation inside it) and the batch layout (CPU chunks)
    flaxlm.training.progress     the train rows of metrics.jsonl (loss, tokens/s, MFU, data share) and the bar
    flaxlm.training.evaluation   exact metrics over every validation row
    flaxlm.training.saving       checkpoints with their resume meta, the resume checks, the save on SIGTERM
    flaxlm.training.divergence   a non-finite step is never applied and stops the run past --skip_nonfinite_steps

What differs between objectives comes in as an Objective (flaxlm.training.objective). A run survives: SIGTERM/
SIGINT saves and exits 0 (flaxlm.training.preemption), resume skips unreadable checkpoints, and the disk is
checked for room before the first step (flaxlm.training.checkpoint).
"""
import time

import jax

from flaxlm.data.rows import StreamedRows
from flaxlm.errors import UserError
from flaxlm.training.checkpoint import check_room
from flaxlm.training.divergence import NonFiniteSteps
from flaxlm.training.evaluation import Evaluator
from flaxlm.training.flops import mesh_peak_flops
from flaxlm.training.freeze import as_phases
from flaxlm.training.objective import collate_rng
from flaxlm.training.optim import eval_params
from flaxlm.training.preemption import StopOnSignal
from flaxlm.training.progress import TrainProgress
from flaxlm.reporting.run_log import say
from flaxlm.training.saving import Saver
from flaxlm.training.sharding import gather_to_host_readable
from flaxlm.training.train_step import BatchLayout, abstract_state, compile_train_step, initial_state


def train(*, args, params, objective, tx, schedule, train_rows, eval_rows, mesh, total_steps,
          micro_batch, eval_batch, log, dtype="float32", test_rows=None):
    """Run the loop to total_steps, then evaluate test_rows if given; returns the final params (replicated).
    tx: an optax transformation, or the Phases of a --train_only run (flaxlm.training.freeze)."""
    layout = BatchLayout.plan(micro_batch, args.gradient_accumulation_steps, mesh, objective.tokens_per_example,
                              args.cpu_chunk_tokens)
    phases = as_phases(tx)
    state, shardings = initial_state(params, phases[0].tx, mesh, args.sharding)  # --sharding: data or fsdp
    largest = phases.largest_state(state, mesh, args.sharding)
    saver = Saver(args, train_rows, layout.global_batch)
    start, state = saver.resume(state, log, like=phases.like_state(state, mesh, args.sharding))
    phase = phases.index_after(start)
    if phase:  # resumed past --freeze_steps
        shardings = abstract_state(params, phases[phase].tx, mesh, args.sharding)[1]

    def compiled(phase):
        return compile_train_step(objective.loss_sums, phases[phase].tx, layout, shardings,
                                  trainable=phases[phase].trainable, frozen=objective.frozen)
    train_step = compiled(phase)
    seed = saver.seed
    evaluate = Evaluator(objective, mesh, shardings["params"], eval_batch, seed, log)
    evaluating = args.do_eval and eval_rows is not None
    peak, peak_source = mesh_peak_flops(mesh, dtype, args.peak_flops)
    say(f"{total_steps} steps, {layout.describe()}, MFU against "
        f"{'unknown peak' if peak is None else f'{peak:.3g} FLOP/s'} ({peak_source})")
    nonfinite = NonFiniteSteps(args.skip_nonfinite_steps, saver.checkpointer.newest_description)
    if start < total_steps:
        check_room(args.output_dir, largest, args.save_total_limit)
    progress = TrainProgress(log, schedule, layout.global_batch, objective, peak,
                             isinstance(train_rows, StreamedRows), start, total_steps,
                             on_policy=getattr(train_rows, "on_policy", False))
    base_key = jax.random.PRNGKey(seed)
    try:
        with StopOnSignal() as stop:
            if args.eval_at_start and start == 0 and evaluating:
                evaluate(eval_params(state), 0, eval_rows)
            for step in range(start, total_steps):
                t_data = time.perf_counter()  # the host's data work for this step
                rows = step_rows(train_rows, step, layout.local_rows, state, saver, start, total_steps)
                batch = layout.to_device(objective.collate(rows, collate_rng(seed, 1, step)))
                t_data = time.perf_counter() - t_data
                if phases.index_at(step) != phase:  # past --freeze_steps: every parameter trains from here on
                    phase = phases.index_at(step)
                    state, shardings = phases.switch(state, mesh, args.sharding)
                    train_step = compiled(phase)
                    say(f"step {step + 1}: every parameter trains from here on (the frozen ones' optimizer state "
                        f"starts now)")
                key = jax.random.fold_in(base_key, step)
                state, metrics = train_step(state, batch, key, *objective.frozen_args())  # frozen: a teacher
                done = step + 1
                if hasattr(train_rows, "step_metrics"):  # figures of the rows themselves (GRPO: rewards, lengths)
                    metrics = {**metrics, **train_rows.step_metrics(step)}
                    train_rows.log_samples(done, log)
                nonfinite.watch(done, metrics)  # reads the previous step's flag: no stall
                progress.step_done(metrics, t_data)
                if done % args.logging_steps == 0 or done == total_steps:
                    nonfinite.check_all()
                    progress.write(done)
                    if hasattr(train_rows, "log_fields"):  # a mixture: each source's rows, tokens and epochs
                        log.write(done, "data", train_rows.log_fields(done))
                if evaluating and (done % (args.eval_steps or args.logging_steps) == 0 or done == total_steps):
                    evaluate(eval_params(state), done, eval_rows)
                    progress.restart_clock()  # eval time is not train time
                if saver.due(done, total_steps):
                    saver.save(done, state)
                if done < total_steps and stop.requested():
                    saver.stop(stop.name, done, total_steps, state, progress)
            nonfinite.check_all()
    finally:  # a save in flight completes even when the loop dies
        saver.close()
    progress.close()
    if start >= total_steps and evaluating:  # nothing to train: evaluate only
        evaluate(eval_params(state), start, eval_rows)
    if test_rows is not None:
        evaluate(eval_params(state), max(start, total_steps), test_rows, "test")
    # fsdp over hosts: whole arrays for the export; schedule-free AdamW's averaged parameters
    return gather_to_host_readable(eval_params(state))


def step_rows(train_rows, step, local, state, saver, start, total_steps):
    """This process's rows of `step`: fixed rows by their order, or (GRPO, on_policy) rows sampled from the current
    params, where a user error (a reward function failing) first saves the steps trained so far."""
    if not getattr(train_rows, "on_policy", False):
        return train_rows.batch_rows(step, local)
    try:
        return train_rows.batch_rows(step, local, state["params"])
    except UserError:
        saver.keep(step, start, total_steps, state)
        raise
