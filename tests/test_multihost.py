"""Many hosts: run_clm_flax.py as 2 real processes of 4 CPU devices each (jax.distributed over a localhost
coordinator, from the --coordinator_address/--num_processes/--process_id flags) gives the per-step train
and eval losses of 1 process of 8 devices for the same global batch and seed. Covers each process reading
only its rows (train, gradient accumulation, eval), the global batch assembled across processes, logs
from process 0 only and checkpoints written by both processes together. prepare_data.py on 2 processes: each
prepares its share of the jobs into one directory, equal to 1 process's, and training on it gives 1 process's
losses."""
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import run_clm_flax
from flaxlm.errors import UserError
from run_helpers import expect_user_error, free_port, read_metrics
from xla_devices import xla_flags

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


def run_two_processes(args, timeout=300, script="run_clm_flax.py"):
    """`script` args as processes 0 and 1 of a 2-process run, 4 CPU devices each; their outputs."""
    env = {**os.environ, "XLA_FLAGS": xla_flags(4), "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": ROOT}
    address = f"localhost:{free_port()}"
    procs = [subprocess.Popen([sys.executable, os.path.join(ROOT, script), *args,
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


def prepare_args(model_dir, corpus, out, *flags):
    """run_clm_flax.py's rows (documents of 32 tokens) of the corpus."""
    return ["--objective", "clm", "--tokenizer_name", model_dir, "--train_file", corpus["train"],
            "--validation_file", corpus["validation"], "--block_size", "32", "--output_dir", str(out), *flags]


@pytest.fixture(scope="module")
def pod_prepared(model_dir, corpus, tmp_path_factory):
    """prepare_data.py run by 2 processes of 1 worker each into one directory: (directory, their outputs)."""
    out = tmp_path_factory.mktemp("pod") / "prepared"
    return out, run_two_processes(prepare_args(model_dir, corpus, out), script="prepare_data.py")


def test_2_processes_prepare_disjoint_shares_equal_to_1_process_of_2_workers(pod_prepared, model_dir, corpus,
                                                                              tmp_path):
    """Each process tokenizes its half of the jobs (2 per split), process 0 writes the manifest: the manifest and
    shards of 1 process with 2 workers. The same job count continues the preparation on any split (an interrupted
    process's job is made again, the finished ones kept); another job count is refused, nothing deleted."""
    import prepare_data
    from flaxlm.data import preparing
    pod, (first, second) = pod_prepared
    assert "process 0 of 2 prepares train jobs 0-0 of 2, validation jobs 0-0 of 2" in first
    assert "process 1 of 2 prepares train jobs 1-1 of 2, validation jobs 1-1 of 2" in second
    shares = [re.search(r"it reads ([\d,]+) of the ([\d,]+) bytes of text", out).groups() for out in (first, second)]
    (mine0, every), (mine1, every1) = [[int(x.replace(",", "")) for x in pair] for pair in shares]
    total = sum(os.path.getsize(corpus[split]) for split in ("train", "validation"))
    assert every == every1 == total and mine0 + mine1 == total and max(mine0, mine1) < 0.6 * total  # each its half
    assert "prepared rows of 32 tokens" in first and "prepared rows" not in second  # one manifest writer
    prepare_data.main(prepare_args(model_dir, corpus, tmp_path / "one", "--preprocessing_num_workers", "2"))
    manifest = json.loads((tmp_path / "one" / "manifest.json").read_text())
    assert json.loads((pod / "manifest.json").read_text()) == manifest
    shards = [s for split in manifest["splits"].values() for s in split]
    for s in shards:
        name = f"{s['name']}.input_ids"
        assert (pod / name).read_bytes() == (tmp_path / "one" / name).read_bytes()
    made = [int(re.search(r"into ([\d,]+) row tokens", text).group(1).replace(",", "")) for text in (first, second)]
    assert made == [sum(s["tokens"] for s in shards if f"-{job:03d}-" in s["name"]) for job in (0, 1)]

    continued = tmp_path / "continued"
    shutil.copytree(pod, continued)
    (continued / "train-001-00000.json").unlink()  # process 1 stopped before finishing its train job
    about = json.loads((continued / "prepare.json").read_text())
    with pytest.raises(UserError, match=r"lacks finished shards of train job\(s\) \[1\]: on a multi-host run"):
        preparing.write_manifest(str(continued), about["jobs"], about)
    files = {f.name: f.stat().st_mtime_ns for f in continued.iterdir()}
    expect_user_error(prepare_data.main, prepare_args(model_dir, corpus, continued), r"other settings \(jobs: \{'train': 2, 'validation': 2\} -> \{'train': 1, 'validation': 1\} per split")
    assert {f.name: f.stat().st_mtime_ns for f in continued.iterdir()} == files  # 1 job: refused, nothing touched
    prepare_data.main(prepare_args(model_dir, corpus, continued, "--preprocessing_num_workers", "2"))
    assert (continued / "train-000-00000.input_ids").stat().st_mtime_ns == files["train-000-00000.input_ids"]
    assert (continued / "train-001-00000.input_ids").stat().st_mtime_ns != files["train-001-00000.input_ids"]
    assert json.loads((continued / "manifest.json").read_text()) == manifest


def test_2_processes_train_on_prepared_rows_like_1(pod_prepared, model_dir, corpus, tmp_path):
    """run_clm_flax.py --prepared_data on 2 processes: the train and eval losses of 1 process."""
    def train_args(out):
        args = run_args(model_dir, corpus, out) + ["--max_steps", "2", "--save_steps", "100"]
        i = args.index("--train_file")
        return args[:i] + ["--prepared_data", str(pod_prepared[0])] + args[i + 4:]

    run_clm_flax.main(train_args(tmp_path / "one"))
    run_two_processes(train_args(tmp_path / "two"))
    one, two = (read_metrics(tmp_path / out) + read_metrics(tmp_path / out, "eval") for out in ("one", "two"))
    assert [r["step"] for r in two] == [1, 2, 2]
    np.testing.assert_allclose([r["loss"] for r in two], [r["loss"] for r in one], rtol=1e-5)
