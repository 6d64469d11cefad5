"""--sharding fsdp on the 8 simulated devices: the sharding rule, the losses of data-parallel training with
about 1/8 of the parameter memory per device, and a crashed run resumed into the sharded state."""
import shutil

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import run_clm_flax
from run_helpers import read_metrics
from flaxlm.training import mesh as meshlib
from flaxlm.errors import UserError
from flaxlm.training.sharding import fsdp_spec, per_device_bytes, state_shardings


def test_fsdp_splits_the_largest_divisible_dimension_of_large_arrays():
    assert fsdp_spec((1024, 64), 8) == P("data")
    assert fsdp_spec((64, 192), 8) == P(None, "data")
    assert fsdp_spec((100, 96), 8) == P(None, "data")  # 100 does not divide: the next largest that does
    assert fsdp_spec((101, 99), 8) == P()  # none divides
    assert fsdp_spec((256,), 8) == P()  # small: a bias or norm
    assert fsdp_spec((), 8) == P()
    mesh = meshlib.make_mesh()
    state = {"w": jax.ShapeDtypeStruct((512, 64), np.float32), "step": jax.ShapeDtypeStruct((), np.int32)}
    assert state_shardings(state, mesh, "data")["w"].spec == P()
    assert state_shardings(state, mesh, "fsdp")["w"].spec == P("data")
    with pytest.raises(UserError, match="--sharding zero"):
        state_shardings(state, mesh, "zero")


def train_tiny(mode, out, steps=3, global_batch=16):
    """A tiny GPT-2 (width 64, vocab 1024: its matrices divide by 8) trained `steps` steps by the shared loop;
    (losses, final params)."""
    from flaxlm.config.options import TrainingArgs
    from flaxlm.data.rows import ShuffledRows
    from flaxlm.objectives.clm import clm_objective
    from flaxlm.models import create_model, decay_mask, split_model
    from flaxlm.training.optim import make_optimizer
    from flaxlm.models.presets import build_config
    from flaxlm.reporting.run_log import RunLog
    from flaxlm.training.loop import train
    config = build_config("gpt2-tiny")
    graphdef, params = split_model(create_model(config, seed=0))
    objective = clm_objective(graphdef, config, params, 32, pad_id=2)
    rows = np.random.default_rng(0).integers(3, 1000, size=(64, 32)).astype(np.int32)
    args = TrainingArgs(output_dir=str(out), logging_steps=1, save_steps=100, do_eval=False, learning_rate=1e-3,
                        sharding=mode)
    tx, schedule = make_optimizer(args, steps, decay_mask(params))
    log = RunLog(str(out))
    try:
        final = train(args=args, params=params, objective=objective, tx=tx, schedule=schedule,
                      train_rows=ShuffledRows(rows, global_batch, seed=0), eval_rows=None, mesh=meshlib.make_mesh(),
                      total_steps=steps, micro_batch=global_batch, eval_batch=global_batch, log=log)
    finally:
        log.close()
    return [r["loss"] for r in read_metrics(out)], final


def test_fsdp_gives_the_losses_of_data_parallel_with_an_eighth_of_the_parameters(tmp_path):
    assert jax.device_count() == 8
    data_losses, data_params = train_tiny("data", tmp_path / "data")
    fsdp_losses, fsdp_params = train_tiny("fsdp", tmp_path / "fsdp")
    print(f"fsdp vs data: largest loss difference {np.abs(np.subtract(fsdp_losses, data_losses)).max():.2e}")
    np.testing.assert_allclose(fsdp_losses, data_losses, rtol=1e-5)
    held, total = per_device_bytes(fsdp_params)
    assert per_device_bytes(data_params) == (total, total)  # data parallel: every device holds everything
    print(f"fsdp: one device holds {held} of {total} parameter bytes ({total / held:.2f}x less)")
    assert 7 < total / held <= 8  # the biases and norms stay whole
    # (not elementwise: where a gradient is ~0, Adam turns its rounding differences into whole steps)
    norm = lambda tree: float(np.sqrt(sum(np.square(np.asarray(x)).sum() for x in jax.tree.leaves(tree))))  # noqa: E731
    assert norm(fsdp_params) == pytest.approx(norm(data_params), rel=1e-5)


@pytest.fixture(scope="module")
def model_dir(tiny_gpt2_dir):
    return tiny_gpt2_dir


def test_fsdp_run_resumes_into_the_sharded_state(model_dir, corpus, tmp_path, monkeypatch):
    """run_clm_flax.py --sharding fsdp resumed from the step-2 checkpoint of a 4-step run restores the state
    split over the devices, gives that run's losses of steps 3 and 4 and exports the same model."""
    from flaxlm.training.checkpoint import Checkpointer
    restored, original = [], Checkpointer.restore

    def restore(self, step, like_state):
        state, meta = original(self, step, like_state)
        restored.append(jax.tree.leaves(jax.tree.map(lambda x: x.sharding.spec, state["params"])))
        return state, meta

    monkeypatch.setattr(Checkpointer, "restore", restore)
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    common = ["--config_name", model_dir, "--tokenizer_name", model_dir, "--train_file", corpus["train"],
              "--block_size", "32", "--per_device_train_batch_size", "1", "--learning_rate", "3e-3",
              "--logging_steps", "1", "--max_steps", "4", "--save_steps", "2", "--do_eval", "false",
              "--sharding", "fsdp", "--peak_flops", "1e12"]
    run_clm_flax.main(["--output_dir", str(straight), *common])
    run_clm_flax.main(["--output_dir", str(resumed), *common,
                       "--resume_from_checkpoint", str(straight / "checkpoints" / "2")])
    (specs,) = restored
    assert P("data") in specs and P(None, "data") in specs  # restored split over the devices
    after = read_metrics(resumed)
    assert [r["step"] for r in after] == [3, 4]
    assert [r["loss"] for r in after] == pytest.approx([r["loss"] for r in read_metrics(straight)[2:]], rel=1e-6)
    assert (resumed / "model.safetensors").read_bytes() == (straight / "model.safetensors").read_bytes()
    shutil.rmtree(straight)
    shutil.rmtree(resumed)
