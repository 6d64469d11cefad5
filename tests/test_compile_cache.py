"""--compilation_cache_dir: the first run writes its compiled train step there, a rerun loads it."""
import os
import subprocess
import sys

import create_config
import train_tokenizer
from flaxlm.training.compile_cache import cache_dir

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_rerun_loads_every_compiled_step_from_the_cache(corpus, tmp_path):
    model = str(tmp_path / "model")
    train_tokenizer.main(["--type", "bpe", "--train_file", corpus["train"], "--vocab_size", "300",
                          "--output_dir", model])
    create_config.main(["--preset", "roberta-tiny", "--output_dir", model])
    cache = tmp_path / "cache"

    def run(out):
        argv = ["--output_dir", str(tmp_path / out), "--config_name", model, "--tokenizer_name", model,
                "--train_file", corpus["train"], "--validation_file", corpus["validation"], "--max_seq_length", "32",
                "--per_device_train_batch_size", "2", "--max_steps", "2", "--logging_steps", "1",
                "--compilation_cache_dir", str(cache)]
        env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
        proc = subprocess.run([sys.executable, "run_mlm_flax.py", *argv], cwd=REPO, env=env,
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return sorted(p.name for p in cache.iterdir())

    first = run("a")
    steps = [name for name in first if name.startswith("jit_step-")]
    assert steps, f"the first run cached no train step: {first}"
    second = run("b")
    # the rerun found its train step there: no new one was written (quick compilations near the 0.5 s
    # threshold may or may not be written, so only the step's entries are compared)
    assert [name for name in second if name.startswith("jit_step-")] == steps
    assert set(first) <= set(second)


def test_cache_dir_settings(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_dir("auto") == os.path.join(str(tmp_path), "flaxlm", "jax")
    assert cache_dir("none") is None
    assert cache_dir("~/x") == os.path.join(os.path.expanduser("~"), "x")
