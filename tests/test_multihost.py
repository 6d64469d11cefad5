"""Many hosts: run_clm_flax.py as 2 real processes of 4 CPU devices each (jax.distributed over a localhost
coordinator, from the --coordinator_address/--num_processes/--process_id flags) gives the per-step train
and eval losses of 1 process of 8 devices for the same global batch and seed. Covers each process reading
only its rows (train, gradient accumulation, eval), the global batch assembled across processes, logs
from process 0 only and checkpoints written by both processes together."""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import run_clm_flax
from run_helpers import free_port, read_metrics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 4


@pytest.fixture(scope="module")
def model_dir(tiny_gpt2_dir):
    return tiny_gpt2_dir


def run_args(model_dir, corpus, out):
    """Global train batch 8 x 2 accumulation steps, global eval batch 16 (the 24 validation rows end in
    a padded batch), a checkpoint every 2 steps."""
    return ["--output_dir", str(out), "--overwrite_output_dir", "--config_name", model_dir,
            "--tokenizer_name", model_dir, "--train_file", corpus["train"], "--validation_file", corpus["validation"],
            "--max_eval_samples", "24", "--block_size", "32", "--per_device_train_batch_size", "1",
            "--gradient_accumulation_steps", "2", "--per_device_eval_batch_size", "2", "--learning_rate", "3e-3",
            "--warmup_steps", "1", "--max_steps", str(STEPS), "--logging_steps", "1", "--eval_steps", "2",
            "--save_steps", "2", "--seed", "3", "--peak_flops", "1e12"]


def run_two_processes(args, timeout=300):
    """run_clm_flax.py args as processes 0 and 1 of a 2-process run, 4 CPU devices each."""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": ROOT}
    address = f"localhost:{free_port()}"
    procs = [subprocess.Popen([sys.executable, os.path.join(ROOT, "run_clm_flax.py"), *args,
                               "--coordinator_address", address, "--num_processes", "2", "--process_id", str(i)],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(2)]
    try:
        outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for i, (p, text) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0, f"process {i} failed:\n{text[-4000:]}"
    return outputs


def test_2_processes_of_4_devices_give_the_losses_of_1_process_of_8(model_dir, corpus, tmp_path):
    import jax
    assert jax.device_count() == 8 and jax.process_count() == 1
    run_clm_flax.main(run_args(model_dir, corpus, tmp_path / "one"))
    first, second = run_two_processes(run_args(model_dir, corpus, tmp_path / "two"))
    assert "global batch 16 (8 devices x 1 x 2 accumulation)" in first  # one run over both processes' devices
    assert "global batch" not in second and "exported" not in second  # process 1 reports nothing

    one, two = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "two")
    assert [r["step"] for r in two] == list(range(1, STEPS + 1))  # one writer: process 0
    one_eval, two_eval = read_metrics(tmp_path / "one", "eval"), read_metrics(tmp_path / "two", "eval")
    assert [r["step"] for r in two_eval] == [2, 4] and two_eval[0]["target_tokens"] == 24 * 31
    a = np.array([r["loss"] for r in one + one_eval])
    b = np.array([r["loss"] for r in two + two_eval])
    print(f"2x4 vs 1x8: largest loss difference {np.abs(a - b).max():.2e} over {len(a)} losses")
    np.testing.assert_allclose(b, a, rtol=1e-5)
    assert [r["grad_norm"] for r in two] == pytest.approx([r["grad_norm"] for r in one], rel=1e-4)

    ckpt = tmp_path / "two" / "checkpoints"
    assert sorted(os.listdir(ckpt)) == ["2", "4"]  # written by both processes, finished by process 0
    assert (tmp_path / "two" / "model.safetensors").exists()  # exported by process 0
    shutil.rmtree(tmp_path / "one")
    shutil.rmtree(tmp_path / "two")


def test_incomplete_process_flags_are_a_user_error():
    from types import SimpleNamespace

    from flaxlm.errors import UserError
    from flaxlm.training.mesh import maybe_initialize_distributed
    with pytest.raises(UserError, match="needs all of --coordinator_address"):
        maybe_initialize_distributed(SimpleNamespace(coordinator_address="localhost:1234", num_processes=2,
                                                     process_id=None))
    with pytest.raises(UserError, match="--process_id 2 is not in 0..1"):
        maybe_initialize_distributed(SimpleNamespace(coordinator_address="localhost:1234", num_processes=2,
                                                     process_id=2))
    maybe_initialize_distributed(SimpleNamespace(coordinator_address=None, num_processes=None, process_id=None))
