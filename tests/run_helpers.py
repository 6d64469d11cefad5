"""Helpers the end-to-end run tests share."""
import json
import os

import pytest


def read_metrics(out, split="train"):
    """The rows of OUTPUT_DIR/metrics.jsonl for one split, in order."""
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if r["split"] == split]


def assert_resume_matches(main, args_for, monkeypatch, tmp_path, steps, crash_step):
    """main(args_for(out, *extra)) run straight for `steps` steps, then again with a simulated crash when the
    loop asks for step crash_step's rows, then resumed from the latest checkpoint: every step's loss of the
    crashed-and-resumed run equals the straight run's. args_for must give --save_steps dividing crash_step."""
    from flaxlm.batches import ShuffledRows
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
