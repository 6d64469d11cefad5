"""The training loop every pretraining script shares.

One jitted train step over the device mesh (params replicated, batch split), gradient accumulation
inside the step, loss normalized by the global count of target tokens, a fresh dropout key per step,
periodic logging (loss, tokens/s, MFU, the host's data time per step), evaluation over the whole
validation set, Orbax checkpoints and exact resume. What differs between objectives comes in as an Objective.

A run survives: SIGTERM/SIGINT saves and exits 0 (flaxlm.training.preemption), a non-finite step is never
applied and stops the run past --skip_nonfinite_steps (flaxlm.training.divergence), resume skips unreadable
checkpoints, and the disk is checked for room before the first step (flaxlm.training.checkpoint).
"""
import dataclasses
import math
import time
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm.auto import tqdm

from flaxlm.training import mesh as meshlib
from flaxlm.data.rows import StreamedRows, eval_batches, num_rows
from flaxlm.training.checkpoint import Checkpointer, check_room, restore_for_resume
from flaxlm.training.divergence import NonFiniteSteps, apply_if_finite
from flaxlm.errors import UserError
from flaxlm.training.flops import device_peak_flops
from flaxlm.training.preemption import Preempted, StopOnSignal

DATA_SHARE_NOTE = 0.05  # say so when the host's data work takes more of the step time than this


@dataclasses.dataclass
class Objective:
    """loss_sums(params, batch, dropout_key or None) -> dict of sums with 'loss_sum' and 'weight_sum'
    (the count of target tokens) and any other '*_sum' metric; collate(rows_BL, rng) -> numpy batch,
    whose entry `weights_key` [B, ...] weighs each target (evaluation zeroes it on padding rows)."""
    loss_sums: Callable
    collate: Callable
    pad_id: int
    weights_key: str
    flops_per_example: float
    tokens_per_example: int
    # Fine-tuning: predict(params, batch) -> {name: [B, ...]} per-example outputs (eval mode), and
    # metrics(outputs) -> {name: float} over the outputs of every real row of a split, in row order.
    # With metrics set, an evaluation reports the loss sums' metrics plus these (and no perplexity).
    predict: Optional[Callable] = None
    metrics: Optional[Callable] = None


def make_train_step(loss_sums, tx, accum_steps):
    """(state, batch, key) -> (state, metrics). With accumulation, batch leaves are [accum, B, ...]."""
    def grads_and_sums(params, batch, key):
        def f(p):
            sums = loss_sums(p, batch, key)
            return sums["loss_sum"], sums
        (_, sums), grads = jax.value_and_grad(f, has_aux=True)(params)
        return grads, sums

    def step(state, batch, key):
        params = state["params"]
        if accum_steps == 1:
            grads, sums = grads_and_sums(params, batch, key)
        else:
            def body(carry, xs):
                i, micro = xs
                out = grads_and_sums(params, micro, jax.random.fold_in(key, i))
                return jax.tree.map(jnp.add, carry, out), None
            first = jax.tree.map(lambda x: x[0], batch)
            zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                                 jax.eval_shape(grads_and_sums, params, first, key))
            (grads, sums), _ = jax.lax.scan(body, zeros, (jnp.arange(accum_steps), batch))
        count = jnp.maximum(sums["weight_sum"], 1.0)
        grads = jax.tree.map(lambda g: g / count, grads)  # loss = sum over the global batch / global count
        metrics = {k.removesuffix("_sum"): v / count for k, v in sums.items() if k != "weight_sum"}
        metrics["grad_norm"] = optax.tree.norm(grads)
        finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(metrics["grad_norm"])
        new_params, opt_state = apply_if_finite(finite, tx, grads, state["opt_state"], params)  # NaN/Inf: no change
        metrics["finite"] = finite
        return {"step": state["step"] + 1, "params": new_params, "opt_state": opt_state}, metrics
    return step


def initial_state(params, tx, mesh, sharding):
    """(train state {step, params, opt_state} on the mesh, its shardings) for --sharding data or fsdp."""
    from flaxlm.training.sharding import state_shardings

    def new_state(p):  # built inside jit: each device creates only its part of the optimizer state
        return {"step": jnp.zeros((), jnp.int32), "params": p, "opt_state": tx.init(p)}
    shardings = state_shardings(jax.eval_shape(new_state, params), mesh, sharding)
    return jax.jit(new_state, out_shardings=shardings)(jax.device_put(params, shardings["params"])), shardings


def eval_steps_for(objective, mesh, params_sharding):
    """(eval_step, predict_step or None): the objective's loss sums (eval mode) and predictions, jitted."""
    eval_step = jax.jit(lambda p, b: objective.loss_sums(p, b, None),
                        in_shardings=(params_sharding, meshlib.batch_sharding(mesh)),
                        out_shardings=meshlib.replicated(mesh))
    return eval_step, None if objective.predict is None else predict_step_for(objective, mesh, params_sharding)


def cpu_chunks(rows_per_device, tokens_per_row, chunk_tokens, platform=None):
    """How many pieces each device's micro-batch is cut into for the forward/backward pass: on CPU, pieces of
    at least chunk_tokens tokens (their activations and logits stay in cache: ~20% faster steps at 4096
    tokens); elsewhere 1. The gradient is the same sum either way."""
    platform = platform or jax.devices()[0].platform
    if platform != "cpu" or not chunk_tokens:
        return 1
    return max(k for k in range(1, rows_per_device + 1)
               if rows_per_device % k == 0 and rows_per_device // k * tokens_per_row >= min(
                   chunk_tokens, rows_per_device * tokens_per_row))


def eval_batches_on_device(objective, rows, global_batch, mesh, seed, desc="eval"):
    """Every row of `rows` once, in order, as (device batch, real_G): global batches whose padding rows
    (filling up the last one) have zero weight, and which of the global batch's rows are real."""
    local = meshlib.local_rows(global_batch)
    sharding = meshlib.batch_sharding(mesh)
    n = num_rows(rows)
    for i, (chunk, real) in enumerate(tqdm(eval_batches(rows, global_batch, local, objective.pad_id),
                                           total=math.ceil(n / global_batch), desc=desc, leave=False,
                                           disable=jax.process_index() != 0)):
        batch = objective.collate(chunk, collate_rng(seed, 2, i))
        w = batch[objective.weights_key]
        batch[objective.weights_key] = w * real.reshape(-1, *[1] * (w.ndim - 1)).astype(w.dtype)
        yield meshlib.to_device_batch(batch, sharding), np.arange(i * global_batch, (i + 1) * global_batch) < n


def evaluate(eval_step, params, objective, rows, global_batch, mesh, seed, predict_step=None):
    """Exact metrics over every validation row (padding rows count for nothing); with the objective's
    predict/metrics, also the metrics of its per-example outputs."""
    totals, outputs = None, []
    for batch, real_G in eval_batches_on_device(objective, rows, global_batch, mesh, seed):
        sums = eval_step(params, batch)
        totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
        if predict_step is not None:
            outputs.append(_real(predict_step(params, batch), real_G))
    totals = jax.device_get(totals)
    count = max(float(totals["weight_sum"]), 1.0)
    out = {k.removesuffix("_sum"): float(v) / count for k, v in totals.items() if k != "weight_sum"}
    if objective.metrics is not None:
        out.update(objective.metrics(_concat(outputs)))
    else:
        out["perplexity"] = float(np.exp(min(out["loss"], 50.0)))
    out["target_tokens"] = int(totals["weight_sum"])
    return out


def predict_step_for(objective, mesh, params_sharding=None):
    """objective.predict jitted over the mesh, its outputs whole on every device (read back by the host)."""
    return jax.jit(objective.predict, in_shardings=(params_sharding, meshlib.batch_sharding(mesh)),
                   out_shardings=meshlib.replicated(mesh))


def collect_predictions(params, objective, rows, global_batch, mesh, seed=0):
    """objective.predict over every row of `rows`, in order: {name: numpy [num_rows, ...]} (e.g. for a
    predictions file after training)."""
    step = predict_step_for(objective, mesh)
    return _concat([_real(step(params, batch), real_G)
                    for batch, real_G in eval_batches_on_device(objective, rows, global_batch, mesh, seed,
                                                                desc="predict")])


def _real(outputs, real_G):
    return {k: np.asarray(v)[real_G] for k, v in jax.device_get(outputs).items()}


def _concat(outputs):
    return {k: np.concatenate([o[k] for o in outputs]) for k in outputs[0]} if outputs else {}


def train(*, args, params, objective, tx, schedule, train_rows, eval_rows, mesh, total_steps,
          micro_batch, eval_batch, log, dtype="float32", test_rows=None):
    """Run the loop to total_steps, then evaluate test_rows if given; returns the final params (replicated)."""
    global_batch = micro_batch * args.gradient_accumulation_steps
    chunks = cpu_chunks(micro_batch // mesh.size, objective.tokens_per_example, args.cpu_chunk_tokens)
    micro_batch //= chunks  # the step accumulates accum pieces of micro_batch rows (split over the devices)
    accum = args.gradient_accumulation_steps * chunks
    local = _accum_slice(meshlib.local_rows(micro_batch), micro_batch, accum)  # this process's rows
    batch_sharding = meshlib.batch_sharding(mesh, leading_axes=1 if accum > 1 else 0)
    repl = meshlib.replicated(mesh)

    from flaxlm.training.sharding import gather_to_host_readable  # --sharding: data or fsdp
    state, shardings = initial_state(params, tx, mesh, args.sharding)
    train_step = jax.jit(make_train_step(objective.loss_sums, tx, accum),
                         in_shardings=(shardings, batch_sharding, repl), out_shardings=(shardings, repl),
                         donate_argnums=0)
    eval_step, predict_step = eval_steps_for(objective, mesh, shardings["params"])

    checkpointer = Checkpointer(args.output_dir, max_to_keep=args.save_total_limit,
                                background=args.async_checkpointing)
    seed, start = args.seed, 0
    if args.resume_from_checkpoint:
        start, state, meta, resume_dir = restore_for_resume(args.resume_from_checkpoint, checkpointer, state)
        log.drop_after(start)  # rows a killed run logged past its last checkpoint are redone
        if meta.get("global_batch") != global_batch or meta.get("num_train_rows") != _num_rows(train_rows):
            raise UserError(f"checkpoint {start} was written with global batch {meta.get('global_batch')} over "
                            f"{meta.get('num_train_rows')} training rows, this run has {global_batch} over "
                            f"{_num_rows(train_rows)}; resume with the same data and batch flags")
        seed = meta["seed"]
        _say(f"resumed from step {start} of {resume_dir} (epoch {meta['epoch']}, seed {seed})")

    peak, peak_source = device_peak_flops(dtype, args.peak_flops)
    peak_total = None if peak is None else peak * (1 if jax.devices()[0].platform == "cpu" else mesh.size)
    _say(f"{total_steps} steps, global batch {global_batch} ({mesh.size} devices x "
         f"{micro_batch * chunks // mesh.size} x {args.gradient_accumulation_steps} accumulation"
         f"{f', each device computing {chunks} chunks in turn' if chunks > 1 else ''}), MFU against "
         f"{'unknown peak' if peak_total is None else f'{peak_total:.3g} FLOP/s'} ({peak_source})")

    tokens_per_step = global_batch * objective.tokens_per_example
    flops_per_step = global_batch * objective.flops_per_example
    base_key = jax.random.PRNGKey(seed)
    eval_every = args.eval_steps or args.logging_steps
    pending, t_mark, timed, data_s = [], None, 0, 0.0  # data_s: host data work of the timed steps
    unchecked = []  # (step, device metrics) whose finiteness the host has not read yet
    nonfinite = NonFiniteSteps(args.skip_nonfinite_steps, checkpointer.newest_description)
    if start < total_steps:
        check_room(args.output_dir, state, args.save_total_limit)
    bar = tqdm(total=total_steps, initial=start, desc="train", dynamic_ncols=True,
               disable=jax.process_index() != 0)

    def save(step):
        meta = {"step": step, "epoch": train_rows.epoch_of(step), "seed": seed, "global_batch": global_batch,
                "num_train_rows": _num_rows(train_rows), "rows_consumed": step * global_batch}
        checkpointer.save(step, state, meta)

    def run_eval(done, split="eval", rows=eval_rows):
        result = evaluate(eval_step, state["params"], objective, rows, eval_batch, mesh, seed, predict_step)
        log.write(done, split, result)
        _say(f"step {done}: {split} {describe_metrics(result)}")

    def check_finite(keep_last):
        """Read the finiteness of the steps run so far (all but the newest one while it may still run)."""
        while len(unchecked) > keep_last:
            step, metrics = unchecked.pop(0)
            nonfinite.check(step, jax.device_get(metrics))

    def log_train(done):
        nonlocal pending, timed, t_mark, data_s
        host = jax.device_get(pending)
        good = [m for m in host if m["finite"]]
        row = {k: float(np.mean([m[k] for m in good or host])) for k in host[0] if k != "finite"}
        if len(good) < len(host):  # skipped steps do not enter the averages
            row["skipped_steps"] = len(host) - len(good)
        row["learning_rate"] = float(schedule(done - 1))
        if timed:
            elapsed = time.perf_counter() - t_mark
            row["tokens_per_s"] = tokens_per_step * timed / elapsed
            row["step_ms"] = 1000 * elapsed / timed
            row["data_ms"] = 1000 * data_s / timed
            row["data_share"] = min(1.0, data_s / elapsed)
            if peak_total:
                row["mfu"] = flops_per_step * timed / elapsed / peak_total
        log.write(done, "train", row)
        bar.set_postfix(loss=f"{row['loss']:.4f}", tok_s=f"{row.get('tokens_per_s', 0):.0f}")
        if row.get("data_share", 0) > DATA_SHARE_NOTE:
            _say(f"step {done}: {describe_data_share(row, isinstance(train_rows, StreamedRows))}")
        pending, timed, t_mark, data_s = [], 0, time.perf_counter(), 0.0

    try:
        with StopOnSignal() as stop:
            if args.eval_at_start and start == 0 and args.do_eval and eval_rows is not None:
                run_eval(0)
            for step in range(start, total_steps):
                t_data = time.perf_counter()  # the host's data work for this step
                rows = train_rows.batch_rows(step, local)
                batch = objective.collate(rows, collate_rng(seed, 1, step))
                if accum > 1:
                    batch = {k: v.reshape(accum, -1, *v.shape[1:]) for k, v in batch.items()}
                batch = meshlib.to_device_batch(batch, batch_sharding)
                t_data = time.perf_counter() - t_data
                state, metrics = train_step(state, batch, jax.random.fold_in(base_key, step))
                done = step + 1
                pending.append(metrics)
                unchecked.append((done, metrics))
                check_finite(keep_last=1)  # the previous step's flag: reading it does not stall this one
                bar.update(1)
                if t_mark is None:  # the first step compiles: time from its end
                    jax.block_until_ready(metrics)
                    t_mark, timed = time.perf_counter(), 0
                else:
                    timed += 1
                    data_s += t_data
                if done % args.logging_steps == 0 or done == total_steps:
                    check_finite(keep_last=0)
                    log_train(done)
                if args.do_eval and eval_rows is not None and (done % eval_every == 0 or done == total_steps):
                    run_eval(done)
                    t_mark = time.perf_counter()  # do not count eval time as train time
                if done % args.save_steps == 0 or done == total_steps:
                    save(done)
                if done < total_steps and stop.requested():
                    if pending:
                        log_train(done)
                    if done % args.save_steps:
                        save(done)
                    checkpointer.close()  # the checkpoint is on disk before we say so
                    bar.close()
                    _say(f"{stop.name}: stopped after step {done} of {total_steps} and saved it to "
                         f"{checkpointer.path(done)}; to continue, rerun the same command with "
                         f"--resume_from_checkpoint latest")
                    raise Preempted()
            check_finite(keep_last=0)
    finally:  # a save in flight completes even when the loop dies
        checkpointer.close()
    bar.close()
    if start >= total_steps and args.do_eval and eval_rows is not None:  # nothing to train: evaluate only
        run_eval(start)
    if test_rows is not None:
        run_eval(max(start, total_steps), "test", test_rows)
    return gather_to_host_readable(state["params"])  # fsdp over hosts: whole arrays for the export


def describe_data_share(row, streaming):
    """A note that the host's per-step data work (reading rows, masking, copying to the devices) takes
    row["data_share"] of the step time, with what may lower it."""
    hint = ("--streaming tokenizes inside the loop: tokenize ahead instead (drop --streaming, use "
            "--preprocessing_num_workers N)" if streaming else
            "the host prepares each batch while the device runs the previous step, so on an accelerator this "
            "slows training only near 100%; on CPU the two share the cores")
    return (f"host data work is {row['data_share']:.0%} of step time ({row['data_ms']:.1f} of "
            f"{row['step_ms']:.1f} ms); {hint}")


def describe_metrics(result):
    """'loss 1.2345, accuracy 0.5000, perplexity 3.44': every metric of an evaluation but the token count."""
    return ", ".join(f"{k} {v:.2f}" if k == "perplexity" else f"{k} {v:.4f}"
                     for k, v in result.items() if k != "target_tokens")


def collate_rng(seed, split, index):
    """The generator for the masking / span corruption of one batch. Each process collates only its own rows,
    so on a multi-host run the process index is part of the seed: otherwise every process would draw the
    same masks for its rows (correlated across the global batch)."""
    key = [seed, split, index] + ([jax.process_index()] if jax.process_count() > 1 else [])
    return np.random.default_rng(key)


def _accum_slice(local, micro_batch, accum):
    """This process's rows of a global batch of accum micro-batches, so that each micro-batch is split
    over the devices the same way (rows reshaped to [accum, micro, ...] afterwards)."""
    if accum == 1:
        return local
    return np.concatenate([np.arange(micro_batch)[local] + i * micro_batch for i in range(accum)])


def _num_rows(train_rows):
    return getattr(train_rows, "num_rows", None)


def _say(msg):
    if jax.process_index() == 0:
        tqdm.write(msg)
