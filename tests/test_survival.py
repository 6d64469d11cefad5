"""Training that survives: SIGTERM/SIGINT save and exit 0, SIGKILL at any moment resumes from the last
complete checkpoint with the same loss curve, unreadable checkpoints are skipped, a non-finite step is
never applied, and the disk is checked before training and on every save.

The signal tests run run_clm_flax.py as a real subprocess on a tiny GPT-2 whose data loading is slowed
down (so that a signal lands mid-run); straight reference runs are in-process on the same 8 CPU devices.
"""
import os
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

import run_clm_flax
from run_helpers import read_metrics
from flaxlm.errors import UserError
from xla_devices import xla_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 12

# The script with every batch's rows delayed by SLOW_ROWS_S seconds, so that a test can signal it mid-run.
SLOW_SCRIPT = """
import os, sys, time
sys.path.insert(0, {root!r})
from flaxlm.data import rows
original = rows.ShuffledRows.batch_rows
def slow(self, step, local):
    time.sleep(float(os.environ["SLOW_ROWS_S"]))
    return original(self, step, local)
rows.ShuffledRows.batch_rows = slow
import run_clm_flax
from flaxlm.errors import run_main
run_main(lambda: run_clm_flax.main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def model_dir(tiny_gpt2_dir):
    return tiny_gpt2_dir


def run_args(model_dir, corpus, out, *extra):
    return ["--output_dir", str(out), "--config_name", model_dir, "--tokenizer_name", model_dir,
            "--train_file", corpus["train"], "--block_size", "32", "--train_batch_size", "8",
            "--learning_rate", "3e-3", "--warmup_steps", "2", "--logging_steps", "1", "--do_eval", "false",
            "--max_steps", str(STEPS), *extra]


@pytest.fixture(scope="module")
def straight(model_dir, corpus, tmp_path_factory):
    """Per-step losses of an uninterrupted run."""
    out = tmp_path_factory.mktemp("straight") / "run"
    run_clm_flax.main(run_args(model_dir, corpus, out, "--save_steps", "100"))
    return [r["loss"] for r in read_metrics(out)]


def start_slow(argv, tmp_path, delay=0.25):
    script = tmp_path / "slow_run.py"
    script.write_text(SLOW_SCRIPT.format(root=ROOT))
    env = dict(os.environ, SLOW_ROWS_S=str(delay), PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, str(script), *argv], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_step(out, step, proc, timeout=240):
    """Block until metrics.jsonl shows train step `step` (the run is past it)."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        if os.path.exists(out / "metrics.jsonl"):
            try:
                if any(r["step"] >= step for r in read_metrics(out)):
                    return
            except ValueError:  # a line being written
                pass
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise AssertionError(f"step {step} not reached in {timeout}s")


def checkpoint_steps(out):
    root = out / "checkpoints"
    return sorted(int(n) for n in os.listdir(root) if n.isdigit()) if root.is_dir() else []


def resumed_losses(model_dir, corpus, out, *extra):
    run_clm_flax.main(run_args(model_dir, corpus, out, "--resume_from_checkpoint", "latest", *extra))
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1)), "each step logged once"
    return [r["loss"] for r in rows]


def test_sigterm_saves_the_current_step_exits_0_and_resumes_exactly(model_dir, corpus, tmp_path, straight):
    out = tmp_path / "run"
    proc = start_slow(run_args(model_dir, corpus, out, "--save_steps", "100"), tmp_path)
    wait_for_step(out, 3, proc)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr[-3000:]
    assert "Traceback" not in stderr and "--resume_from_checkpoint latest" in stdout + stderr
    logged = [r["step"] for r in read_metrics(out)]
    saved = checkpoint_steps(out)
    assert saved == [logged[-1]] and 3 <= saved[0] < STEPS  # steps lost to the preemption: 0
    assert not os.path.exists(out / "model.safetensors")  # a stopped run does not export a half-trained model
    np.testing.assert_allclose(resumed_losses(model_dir, corpus, out, "--save_steps", "100"), straight, rtol=1e-6)


def test_sigterm_on_one_host_stops_every_host_at_the_same_step(model_dir, corpus, tmp_path):
    """2 processes x 4 devices (jax.distributed on localhost); only process 1 gets SIGTERM: both save the
    same step together and exit 0."""
    from run_helpers import free_port
    script = tmp_path / "slow_run.py"
    script.write_text(SLOW_SCRIPT.format(root=ROOT))
    env = dict(os.environ, SLOW_ROWS_S="0.25", XLA_FLAGS=xla_flags(4),
               JAX_PLATFORMS="cpu")
    out, address = tmp_path / "run", f"localhost:{free_port()}"
    procs = [subprocess.Popen([sys.executable, str(script), *run_args(model_dir, corpus, out, "--save_steps", "100"),
                               "--coordinator_address", address, "--num_processes", "2", "--process_id", str(i)],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(2)]
    try:
        wait_for_step(out, 2, procs[0])
        procs[1].send_signal(signal.SIGTERM)
        outputs = [p.communicate(timeout=180)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0], [o[-2000:] for o in outputs]
    logged = [r["step"] for r in read_metrics(out)]
    assert checkpoint_steps(out) == [logged[-1]] and logged[-1] < STEPS
    assert "signal on another host" in outputs[0] and "--resume_from_checkpoint latest" in outputs[0]


def test_second_signal_exits_at_once(model_dir, corpus, tmp_path):
    out = tmp_path / "run"
    proc = start_slow(run_args(model_dir, corpus, out, "--save_steps", "100"), tmp_path, delay=3.0)
    wait_for_step(out, 1, proc)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.3)
    t0 = time.time()
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGINT and time.time() - t0 < 2.5, stderr[-2000:]
    assert "again: exiting now" in stderr and "Traceback" not in stderr


def test_sigkill_at_any_moment_resumes_from_last_complete_checkpoint(model_dir, corpus, tmp_path, straight):
    """Killed twice (once as the step-6 save starts, once between saves), resumed each time: the whole loss
    curve equals the uninterrupted run's, and each kill loses at most --save_steps steps."""
    out = tmp_path / "run"
    args = run_args(model_dir, corpus, out, "--save_steps", "3", "--save_total_limit", "2")
    lost = []
    for kill_after, resume in ((6, False), (10, True)):
        proc = start_slow(args + (["--resume_from_checkpoint", "latest"] if resume else []), tmp_path)
        wait_for_step(out, kill_after, proc)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
        reached = max(r["step"] for r in read_metrics(out))
        complete = max(checkpoint_steps(out), default=0)
        lost.append(reached - complete)
        assert complete > 0 and 0 <= reached - complete <= 3, (reached, checkpoint_steps(out))
    losses = resumed_losses(model_dir, corpus, out, "--save_steps", "3", "--save_total_limit", "2")
    np.testing.assert_allclose(losses, straight, rtol=1e-6)
    print(f"steps lost per SIGKILL: {lost}; max loss difference after resume: "
          f"{np.max(np.abs(np.array(losses) - np.array(straight))):.2e}")


def test_unreadable_checkpoint_is_set_aside_and_the_previous_one_used(model_dir, corpus, tmp_path, straight, capfd):
    out = tmp_path / "run"
    run_clm_flax.main(run_args(model_dir, corpus, out, "--save_steps", "4"))
    assert checkpoint_steps(out) == [4, 8, 12]
    for dirpath, _, files in os.walk(out / "checkpoints" / "12" / "state"):
        for name in files:  # every array file damaged (a disk error, a truncated copy)
            with open(os.path.join(dirpath, name), "r+b") as f:
                f.truncate(max(0, os.path.getsize(f.name) // 3))
    os.makedirs(out / "checkpoints" / "12.orbax-checkpoint-tmp")  # a save that a kill interrupted
    losses = resumed_losses(model_dir, corpus, out, "--save_steps", "4")
    said = capfd.readouterr()
    assert f"{out / 'checkpoints' / '12'} cannot be read" in said.err and "resumed from step 8" in said.out
    assert (out / "checkpoints" / "12.unreadable").is_dir()  # set aside, not deleted
    assert checkpoint_steps(out) == [4, 8, 12]  # step 12 written again
    np.testing.assert_allclose(losses, straight, rtol=1e-6)


def test_explicit_unreadable_checkpoint_is_one_clear_error(model_dir, corpus, tmp_path):
    out = tmp_path / "run"
    run_clm_flax.main(run_args(model_dir, corpus, out, "--save_steps", "2", "--max_steps", "2"))
    for dirpath, _, files in os.walk(out / "checkpoints" / "2" / "state"):
        for name in files:
            open(os.path.join(dirpath, name), "wb").close()
    with pytest.raises(UserError, match=r"checkpoints/2 cannot be read"):
        run_clm_flax.main(run_args(model_dir, corpus, out, "--resume_from_checkpoint",
                                   str(out / "checkpoints" / "2")))


# Divergence: a batch entry `poison` (NaN at chosen steps) makes the loss and gradients NaN.

def poisoned(objective, bad_steps):
    import dataclasses
    calls = {"n": 0}

    def collate(rows, rng):
        calls["n"] += 1
        batch = objective.collate(rows, rng)
        value = np.nan if calls["n"] in bad_steps else 1.0
        batch["poison"] = np.full((rows.shape[0],), value, np.float32)
        return batch

    def loss_sums(params, batch, key):
        poison = batch["poison"]
        sums = objective.loss_sums(params, {k: v for k, v in batch.items() if k != "poison"}, key)
        return dict(sums, loss_sum=sums["loss_sum"] * poison.mean())
    return dataclasses.replace(objective, collate=collate, loss_sums=loss_sums)


def train_tiny(model_dir, corpus, out, bad_steps, **flags):
    from flaxlm.training import mesh as meshlib
    from flaxlm.config.options import TrainingArgs
    from flaxlm.data.rows import ShuffledRows
    from flaxlm.objectives.clm import clm_objective
    from flaxlm.models import decay_mask, split_model
    from flaxlm.models.hf_io import load_config
    from flaxlm.models import create_model
    from flaxlm.training.optim import make_optimizer
    from flaxlm.reporting.run_log import RunLog
    from flaxlm.training.loop import train
    config = load_config(model_dir)
    graphdef, params = split_model(create_model(config, seed=0))
    objective = poisoned(clm_objective(graphdef, config, params, 16, pad_id=0), bad_steps)
    rows = np.random.default_rng(0).integers(3, config.vocab_size, size=(64, 16)).astype(np.int32)
    args = TrainingArgs(output_dir=str(out), logging_steps=1, do_eval=False, learning_rate=1e-3, **flags)
    tx, schedule = make_optimizer(args, 6, decay_mask(params))
    log = RunLog(str(out))
    try:
        return train(args=args, params=params, objective=objective, tx=tx, schedule=schedule,
                     train_rows=ShuffledRows(rows, 8, seed=0), eval_rows=None, mesh=meshlib.make_mesh(),
                     total_steps=6, micro_batch=8, eval_batch=8, log=log)
    finally:
        log.close()


def test_nonfinite_step_stops_the_run_and_keeps_the_last_good_checkpoint(model_dir, corpus, tmp_path):
    out = tmp_path / "run"
    with pytest.raises(UserError, match=r"step 3: loss nan.*not finite.*checkpoints/2 is intact.*--skip_nonfinite"):
        train_tiny(model_dir, corpus, out, bad_steps={3}, save_steps=2)
    assert checkpoint_steps(out) == [2]


def test_skip_nonfinite_steps_skips_and_the_state_is_untouched(model_dir, corpus, tmp_path):
    params = train_tiny(model_dir, corpus, tmp_path / "ok", bad_steps={3}, save_steps=100, skip_nonfinite_steps=1)
    rows = read_metrics(tmp_path / "ok")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6] and rows[2]["skipped_steps"] == 1
    assert all(np.isfinite(jax.tree.leaves(jax.tree.map(lambda x: np.asarray(x).sum(), params))))
    with pytest.raises(UserError, match=r"step 4: .*--skip_nonfinite_steps 1 allowed 1"):
        train_tiny(model_dir, corpus, tmp_path / "two", bad_steps={3, 4}, save_steps=100, skip_nonfinite_steps=1)


def test_nonfinite_update_leaves_params_and_optimizer_state_bit_identical():
    import jax.numpy as jnp
    import optax
    from flaxlm.training.train_step import make_train_step

    def loss_sums(params, batch, key):
        loss = jnp.sum((params["w"] * batch["x"]) ** 2)
        return {"loss_sum": loss, "weight_sum": jnp.float32(1.0)}
    tx = optax.adamw(0.1)
    params = {"w": jnp.arange(4.0)}
    state = {"step": jnp.int32(5), "params": params, "opt_state": tx.init(params)}
    step = jax.jit(make_train_step(loss_sums, tx, 1))
    good, m_good = step(state, {"x": jnp.ones(4)}, jax.random.PRNGKey(0))
    assert bool(m_good["finite"]) and not np.array_equal(good["params"]["w"], params["w"])
    bad, m_bad = step(good, {"x": jnp.array([1.0, np.inf, 1.0, 1.0])}, jax.random.PRNGKey(0))
    assert not bool(m_bad["finite"]) and int(bad["step"]) == 7
    jax.tree.map(np.testing.assert_array_equal, (bad["params"], bad["opt_state"]), (good["params"], good["opt_state"]))


# Disk: room checked before training; a failed save names the path and keeps the earlier checkpoints.

def test_too_little_disk_room_is_one_clear_error_before_training(model_dir, corpus, tmp_path, monkeypatch):
    import collections
    Usage = collections.namedtuple("Usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10 ** 9, 10 ** 9 - 1000, 1000))
    out = tmp_path / "run"
    with pytest.raises(UserError, match=r"has 0.00 GiB free, but 3 checkpoints of this run need"):
        run_clm_flax.main(run_args(model_dir, corpus, out, "--save_steps", "2"))
    assert checkpoint_steps(out) == [] and not os.path.exists(out / "model.safetensors")


def test_failed_save_names_the_path_and_keeps_the_previous_checkpoint(model_dir, corpus, tmp_path, monkeypatch):
    import orbax.checkpoint as ocp
    original = ocp.CheckpointManager.save

    def save(self, step, *a, **k):
        if step == 4:
            raise OSError(28, "No space left on device")
        return original(self, step, *a, **k)
    monkeypatch.setattr(ocp.CheckpointManager, "save", save)
    out = tmp_path / "run"
    with pytest.raises(UserError, match=r"could not write checkpoint .*checkpoints/4 \(OSError: No space left on "
                                        r"device\); the earlier checkpoints .* are kept"):
        run_clm_flax.main(run_args(model_dir, corpus, out, "--save_steps", "2", "--save_total_limit", "1"))
    assert checkpoint_steps(out) == [2]
    monkeypatch.setattr(ocp.CheckpointManager, "save", original)
    rows = resumed_losses(model_dir, corpus, out, "--save_steps", "100")  # the kept checkpoint reads back
    assert len(rows) == STEPS
