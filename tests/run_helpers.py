"""Helpers the end-to-end run tests share."""
import json
import os
import socket

import pytest


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
    from flaxlm.training.run_log import RunLog
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


def assert_resume_matches(main, args_for, monkeypatch, tmp_path, steps, crash_step):
    """main(args_for(out, *extra)) run straight for `steps` steps, then again with a simulated crash when the
    loop asks for step crash_step's rows, then resumed from the latest checkpoint: every step's loss of the
    crashed-and-resumed run equals the straight run's. args_for must give --save_steps dividing crash_step."""
    from flaxlm.data.rows import ShuffledRows
    main(args_for(tmp_path / "straight"))
    straight = [r["loss"] for r in read_metrics(tmp_path / "straight")]
    original = ShuffledRows.batch_rows

    def crash(self, step, local):
        if step == crash_step:
            raise RuntimeError("simulated crash")
        return original(self, step, local)

    with monkeypatch.context() as m:
        m.setattr(ShuffledRows, "batch_rows", crash)
        with pytest.raises(RuntimeError, match="simulated crash"):
            main(args_for(tmp_path / "resumed"))
    main(args_for(tmp_path / "resumed", "--resume_from_checkpoint", "latest"))
    resumed = read_metrics(tmp_path / "resumed")
    assert [r["step"] for r in resumed] == list(range(1, steps + 1))
    assert [r["loss"] for r in resumed] == pytest.approx(straight, rel=1e-6)


def free_port():
    """A TCP port free on localhost now (for a jax.distributed coordinator)."""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]
