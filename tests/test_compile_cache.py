"""--compilation_cache_dir: the first run writes its compiled train step there, a rerun loads it."""
import os

from flaxlm.training.compile_cache import cache_dir
from run_helpers import run_script
from xla_devices import xla_flags


def test_rerun_loads_every_compiled_step_from_the_cache(corpus, tmp_path, model_dir_for):
    model = model_dir_for("roberta-tiny")
    cache = tmp_path / "cache"

    def run(out):
        argv = ["--output_dir", str(tmp_path / out), "--config_name", model, "--tokenizer_name", model,
                "--train_file", corpus["train"], "--validation_file", corpus["validation"], "--max_seq_length", "32",
                "--per_device_train_batch_size", "2", "--max_steps", "2", "--logging_steps", "1",
                "--compilation_cache_dir", str(cache)]
        env = {**os.environ, "XLA_FLAGS": xla_flags(1)}
        proc = run_script("run_mlm_flax.py", argv, env=env)
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
