"""Helpers the end-to-end run tests share: the flags of a tiny run, the user errors, the metrics a run logs,
its losses on 1 and 8 devices and after a resume."""
import json
import os
import shutil
import socket
import subprocess
import sys

import pytest

from flaxlm.errors import UserError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_args(model_dir, corpus, out, *flags, model_flag="--config_name"):
    """A tiny run's flags: output to `out`, model_dir's model (model_flag --config_name: a fresh one;
    --model_name_or_path: its weights) and tokenizer, the corpus, one row per device in training and two in
    evaluation, two warmup steps, a log line a step; then `flags`, the script's and the test's own."""
    return ["--output_dir", str(out), model_flag, model_dir, "--tokenizer_name", model_dir,
            "--train_file", corpus["train"], "--validation_file", corpus["validation"],
            "--per_device_train_batch_size", "1", "--per_device_eval_batch_size", "2", "--warmup_steps", "2",
            "--logging_steps", "1", *flags]


def tiny_pretrained_roberta(d, lines):
    """Directory d holding a tiny RoBERTa in the form run_mlm_flax.py exports (config.json + model.safetensors of
    RobertaForMaskedLM, random weights, + our BPE tokenizer trained on `lines`), made with our own tokenizer and
    create_config scripts; returns its path."""
    import create_config
    import train_tokenizer
    from flaxlm import models
    corpus = d / "corpus.txt"
    corpus.write_text("".join(line + "\n" for line in lines))
    train_tokenizer.main(["--type", "bpe", "--train_file", str(corpus), "--vocab_size", "300",
                          "--model_max_length", "64", "--output_dir", str(d)])
    create_config.main(["--preset", "roberta-tiny", "--output_dir", str(d)])
    config = models.load_config(str(d))
    models.save_pretrained(str(d), config, models.split_model(models.create_model(config, seed=0))[1])
    return str(d)


def expect_user_error(main, argv, match):
    """main(argv) stops with a UserError matching `match`: the one line the script prints before exiting 2."""
    with pytest.raises(UserError, match=match):
        main(argv)


def run_script(script, argv, env=None):
    """`python script argv` in the checkout, as a user runs it: the finished process (text output captured)."""
    return subprocess.run([sys.executable, script, *argv], cwd=REPO, env=env, capture_output=True, text=True)


def with_vocab_size(model_dir, tmp_path, vocab_size=100):
    """A copy of model_dir whose config.json says vocab_size (fewer tokens than its tokenizer has)."""
    small = tmp_path / "small_vocab"
    shutil.copytree(model_dir, small)
    config = json.loads((small / "config.json").read_text())
    config["vocab_size"] = vocab_size
    (small / "config.json").write_text(json.dumps(config))
    return str(small)


def read_metrics(out, split="train"):
    """The rows of OUTPUT_DIR/metrics.jsonl for one split, in order."""
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if r["split"] == split]


def assert_devices_match(objective, params, rows, tmp_path, steps=3, global_batch=16):
    """The losses of the first `steps` steps of the shared training loop on 8 devices equal those on 1 device
    with the same global batch (1e-5 relative)."""
    import jax
    import numpy as np
    from flaxlm.training import mesh as meshlib
    from flaxlm.config.options import TrainingArgs
    from flaxlm.data.rows import ShuffledRows
    from flaxlm.models import decay_mask
    from flaxlm.training.optim import make_optimizer
    from flaxlm.reporting.run_log import RunLog
    from flaxlm.training.loop import train
    assert jax.device_count() == 8, "conftest sets 8 simulated CPU devices"
    losses = {}
    for n in (1, 8):
        out = tmp_path / f"d{n}"
        args = TrainingArgs(output_dir=str(out), logging_steps=1, save_steps=100, do_eval=False, learning_rate=1e-3)
        tx, schedule = make_optimizer(args, steps, decay_mask(params))
        log = RunLog(str(out))
        train(args=args, params=jax.tree.map(np.array, params), objective=objective, tx=tx, schedule=schedule,
              train_rows=ShuffledRows(rows, global_batch, seed=0), eval_rows=None,
              mesh=meshlib.make_mesh(jax.devices()[:n]), total_steps=steps, micro_batch=global_batch,
              eval_batch=global_batch, log=log)
        log.close()
        losses[n] = [r["loss"] for r in read_metrics(out)]
    assert len(losses[1]) == steps
    np.testing.assert_allclose(losses[8], losses[1], rtol=1e-5)


def run_until_crash(main, argv, monkeypatch, crash_step, rows_class=None):
    """main(argv) stopped by a simulated crash when the loop asks for step crash_step's rows (of rows_class:
    ShuffledRows unless given)."""
    from flaxlm.data.rows import ShuffledRows
    rows_class = rows_class or ShuffledRows
    original = rows_class.batch_rows

    def crash(self, step, local):
        if step == crash_step:
            raise RuntimeError("simulated crash")
        return original(self, step, local)

    with monkeypatch.context() as m:
        m.setattr(rows_class, "batch_rows", crash)
        with pytest.raises(RuntimeError, match="simulated crash"):
            main(argv)


def assert_resume_matches(main, args_for, monkeypatch, tmp_path, steps, crash_step, rows_class=None):
    """main(args_for(out, *extra)) run straight for `steps` steps, then again with a simulated crash when the
    loop asks for step crash_step's rows (of rows_class: ShuffledRows unless given), then resumed from the latest
    checkpoint: every step's loss of the crashed-and-resumed run equals the straight run's. args_for must give
    --save_steps dividing crash_step."""
    main(args_for(tmp_path / "straight"))
    straight = [r["loss"] for r in read_metrics(tmp_path / "straight")]
    run_until_crash(main, args_for(tmp_path / "resumed"), monkeypatch, crash_step, rows_class)
    main(args_for(tmp_path / "resumed", "--resume_from_checkpoint", "latest"))
    resumed = read_metrics(tmp_path / "resumed")
    assert [r["step"] for r in resumed] == list(range(1, steps + 1))
    assert [r["loss"] for r in resumed] == pytest.approx(straight, rel=1e-6)


def mixture_counts(tmp_path, steps):
    """The last "data" row (each source's rows, tokens and epochs) of assert_resume_matches' straight run, after
    checking that one is logged each step and that the resumed run logged the same counts."""
    data = read_metrics(tmp_path / "straight", "data")
    assert [r["step"] for r in data] == list(range(1, steps + 1))
    resumed = read_metrics(tmp_path / "resumed", "data")[-1]
    assert {k: v for k, v in resumed.items() if k != "time"} == {k: v for k, v in data[-1].items() if k != "time"}
    return data[-1]


def free_port():
    """A TCP port free on localhost now (for a jax.distributed coordinator)."""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]
