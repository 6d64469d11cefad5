"""Evaluation: exact metrics over every row of a split (the last global batch padded with rows that weigh
nothing), and an objective's per-example predictions (fine-tuning: answers, labels).

    eval_step, predict_step = eval_steps_for(objective, mesh, params_sharding)
    result = evaluate(eval_step, params, objective, rows, eval_batch, mesh, seed, predict_step)
    outputs = collect_predictions(params, objective, rows, eval_batch, mesh)   # {name: [num_rows, ...]}

Evaluator is what the training loop and the evaluation job (flaxlm.training.eval_job) call: it also writes the
result to the run log and says it.
"""
import math

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from flaxlm.data.rows import eval_batches, num_rows
from flaxlm.training import mesh as meshlib
from flaxlm.training.objective import collate_rng
from flaxlm.reporting.run_log import say


def eval_steps_for(objective, mesh, params_sharding):
    """(eval_step, predict_step or None): the objective's loss sums (eval mode) and predictions, jitted."""
    sums = objective.eval_sums or (lambda p, b: objective.loss_sums(p, b, None))
    eval_step = meshlib.on_mesh(jax.jit(sums,
                                        in_shardings=(params_sharding, meshlib.batch_sharding(mesh)),
                                        out_shardings=meshlib.replicated(mesh)), mesh)
    return eval_step, None if objective.predict is None else predict_step_for(objective, mesh, params_sharding)


def predict_step_for(objective, mesh, params_sharding=None):
    """objective.predict jitted over the mesh, its outputs whole on every device (read back by the host)."""
    return meshlib.on_mesh(jax.jit(objective.predict, in_shardings=(params_sharding, meshlib.batch_sharding(mesh)),
                                   out_shardings=meshlib.replicated(mesh)), mesh)


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
    totals, previous, outputs = None, None, []
    for batch, real_G in eval_batches_on_device(objective, rows, global_batch, mesh, seed):
        sums = eval_step(params, batch)
        totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
        # The host runs at most one batch ahead of the devices: a split of thousands of rows would otherwise queue
        # every batch's inputs on the devices at once (and on XLA:CPU, 32 programs ahead can stall its collectives).
        jax.block_until_ready(previous)
        previous = totals
        if predict_step is not None:
            outputs.append(_real(predict_step(params, batch), real_G))
    totals = jax.device_get(totals)
    count = max(float(totals["weight_sum"]), 1.0)
    out = {k.removesuffix("_sum"): float(v) / count for k, v in totals.items() if k != "weight_sum"}
    if objective.metrics is not None:
        out.update(objective.metrics(_concat(outputs)))
    elif objective.perplexity:
        out["perplexity"] = float(np.exp(min(out["loss"], 50.0)))
    out[objective.count_name] = int(totals["weight_sum"])
    return out


class Evaluator:
    """evaluate() of the params of a run at one step: written to the run log as a row of `split` and said as
    '{what} {step}: {split} {metrics}' (what: 'step' in the training loop, 'checkpoint' in an evaluation job)."""

    def __init__(self, objective, mesh, params_sharding, eval_batch, seed, log, what="step"):
        self.eval_step, self.predict_step = eval_steps_for(objective, mesh, params_sharding)
        self.objective, self.mesh, self.eval_batch, self.seed = objective, mesh, eval_batch, seed
        self.log, self.what = log, what

    def __call__(self, params, step, rows, split="eval"):
        result = evaluate(self.eval_step, params, self.objective, rows, self.eval_batch, self.mesh, self.seed,
                          self.predict_step)
        self.log.write(step, split, result)
        say(f"{self.what} {step}: {split} {describe_metrics(result, self.objective.count_name)}")


def describe_metrics(result, count_name="target_tokens"):
    """'loss 1.2345, accuracy 0.5000, perplexity 3.44': every metric of an evaluation but what it counted."""
    return ", ".join(f"{k} {v:.2f}" if k == "perplexity" else f"{k} {v:.4f}"
                     for k, v in result.items() if k != count_name)


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
