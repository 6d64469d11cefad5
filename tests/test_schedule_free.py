"""--optim schedule_free_adamw (flaxlm.training.optim): its steps against optax.contrib.schedule_free_adamw, weight
decay only where AdamW's mask has it, the averaged parameters of a --train_only run, and a tiny run that resumes
exactly and evaluates and exports the averaged parameters."""
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from optax import contrib

import run_clm_flax
from run_helpers import assert_resume_matches, read_metrics, run_args
from flaxlm.models import load_pretrained, split_model
from flaxlm.training import loop
from flaxlm.training.freeze import as_phases
from flaxlm.training.optim import eval_params, make_optimizer

ARGS = dict(optim="schedule_free_adamw", adafactor=False, learning_rate=1e-2, warmup_steps=2, warmup_ratio=0.0,
            lr_scheduler_type="constant_with_warmup", lr_scheduler_kwargs=None, weight_decay=0.1, adam_beta1=0.9,
            adam_beta2=0.95, adam_epsilon=1e-8, max_grad_norm=0.0, freeze_steps=None)
STEPS = 4


def tree():
    rng = np.random.default_rng(0)
    return {"dense": {"kernel": jnp.asarray(rng.normal(size=(6, 4)), jnp.float32),
                      "bias": jnp.asarray(rng.normal(size=(4,)), jnp.float32)}}


def grads_by_step(params):
    rng = np.random.default_rng(1)
    return [jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape), jnp.float32), params) for _ in range(STEPS)]


def trained(tx, params, grads):
    """(params, optimizer state) after the steps' gradients."""
    state = tx.init(params)
    for g in grads:
        updates, state = tx.update(g, state, params)
        params = optax.apply_updates(params, updates)
    return params, state


def test_steps_are_optax_schedule_free_adamw_with_decay_on_the_mask():
    """Decay on the kernel only: the kernel's steps and averaged parameters are optax.contrib.schedule_free_adamw's
    (its warmup_steps the constant_with_warmup schedule's), the bias's those of the same without weight decay."""
    params, grads = tree(), grads_by_step(tree())
    mask = {"dense": {"kernel": True, "bias": False}}
    tx, _ = make_optimizer(types.SimpleNamespace(**ARGS), 10, mask)
    ours, state = trained(tx, params, grads)
    averaged = eval_params({"params": ours, "opt_state": state})
    for decay, leaf in ((ARGS["weight_decay"], "kernel"), (0.0, "bias")):
        ref_tx = contrib.schedule_free_adamw(ARGS["learning_rate"], warmup_steps=ARGS["warmup_steps"], b1=0.9,
                                             b2=0.95, eps=1e-8, weight_decay=decay)
        ref, ref_state = trained(ref_tx, params, grads)
        ref_averaged = contrib.schedule_free_eval_params(ref_state, ref)
        np.testing.assert_allclose(ours["dense"][leaf], ref["dense"][leaf], rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(averaged["dense"][leaf], ref_averaged["dense"][leaf], rtol=1e-6, atol=1e-7)
    # the average is not the point the gradients were taken at
    assert not np.allclose(averaged["dense"]["kernel"], ours["dense"]["kernel"], atol=1e-4)


def test_a_train_only_run_averages_what_trains_and_leaves_the_frozen_parameters():
    params, grads = tree(), grads_by_step(tree())
    mask = {"dense": {"kernel": True, "bias": False}}
    trainable = {"dense": {"kernel": True, "bias": False}}
    tx = as_phases(make_optimizer(types.SimpleNamespace(**ARGS), 10, mask, trainable)[0])[0].tx
    ours, state = trained(tx, params, grads)
    averaged = eval_params({"params": ours, "opt_state": state})
    np.testing.assert_array_equal(ours["dense"]["bias"], params["dense"]["bias"])  # frozen: no step
    np.testing.assert_array_equal(averaged["dense"]["bias"], params["dense"]["bias"])
    ref_tx = contrib.schedule_free_adamw(ARGS["learning_rate"], warmup_steps=ARGS["warmup_steps"], b1=0.9, b2=0.95,
                                         eps=1e-8, weight_decay=ARGS["weight_decay"])
    ref, ref_state = trained(ref_tx, params["dense"]["kernel"], [g["dense"]["kernel"] for g in grads])
    np.testing.assert_allclose(averaged["dense"]["kernel"], contrib.schedule_free_eval_params(ref_state, ref),
                               rtol=1e-6, atol=1e-7)


def test_other_optimizers_evaluate_their_params():
    params = tree()
    tx = optax.adamw(1e-3)
    assert eval_params({"params": params, "opt_state": tx.init(params)}) is params


def test_a_run_resumes_exactly_and_evaluates_and_exports_the_average(model_dir_for, corpus, tmp_path, monkeypatch,
                                                                    capsys):
    model_dir = model_dir_for("gpt2-tiny")
    calls = []

    def spy(state):  # what the loop evaluates and exports, beside the params it trains
        calls.append((state["params"], eval_params(state)))
        return calls[-1][1]
    monkeypatch.setattr(loop, "eval_params", spy)

    def args_for(out, *extra):
        return run_args(model_dir, corpus, out, "--block_size", "32", "--max_steps", "4", "--save_steps", "2",
                        "--eval_steps", "4", "--learning_rate", "3e-3", "--optim", "schedule_free_adamw",
                        "--lr_scheduler_type", "constant_with_warmup", *extra)
    assert_resume_matches(run_clm_flax.main, args_for, monkeypatch, tmp_path, steps=4, crash_step=2)
    out = tmp_path / "resumed"
    assert [r["step"] for r in read_metrics(out, "eval")] == [4]
    assert read_metrics(out)[-1]["loss"] < read_metrics(out)[0]["loss"]
    said = capsys.readouterr().out
    assert "--optim schedule_free_adamw: evaluation and the export use its averaged parameters" in said
    trained_at, averaged = calls[-1]  # the resumed run's export
    exported = split_model(load_pretrained(str(out))[1])[1]
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), exported, averaged)
    gaps = [float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(averaged), jax.tree.leaves(trained_at))]
    assert max(gaps) > 1e-5  # the export is the average, not the point the gradients were taken at
