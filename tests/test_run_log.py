"""The run log's loss curves: loss.png drawn from metrics.jsonl when the log closes, and a failure to draw is a
warning that loses nothing."""
import pytest

from flaxlm.reporting.run_log import RunLog, read_rows

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def write_run(out, steps, eval_every=None):
    """A RunLog that draws loss.png, given a falling train loss (and an eval loss every `eval_every` steps)."""
    log = RunLog(str(out), loss_plot="loss.png")
    for step in range(1, steps + 1):
        log.write(step, "train", {"loss": 5.0 / step, "learning_rate": 1e-3})
        if eval_every and step % eval_every == 0:
            log.write(step, "eval", {"loss": 6.0 / step, "accuracy": 0.1})
    log.close()
    return read_rows(out / "metrics.jsonl")


@pytest.mark.parametrize("eval_every", [2, None], ids=["train and eval", "train only"])
def test_loss_png_beside_metrics(tmp_path, eval_every):
    pytest.importorskip("matplotlib")
    rows = write_run(tmp_path, steps=6, eval_every=eval_every)
    assert {r["split"] for r in rows} == ({"train", "eval"} if eval_every else {"train"})
    png = (tmp_path / "loss.png").read_bytes()
    assert png.startswith(PNG_SIGNATURE) and len(png) > 1000


def test_a_failure_to_draw_is_one_warning(tmp_path, monkeypatch, capsys):
    from flaxlm.reporting import loss_plot

    def broken(*args, **kwargs):
        raise OSError("No space left on device\nsecond line")

    monkeypatch.setattr(loss_plot, "draw_loss_curves", broken)
    rows = write_run(tmp_path, steps=3, eval_every=3)
    assert len(rows) == 4  # the metrics are all there
    assert not (tmp_path / "loss.png").exists()
    err = capsys.readouterr().err.strip()
    assert err.startswith("warning: the loss curves were not drawn") and "No space left" in err
    assert len(err.splitlines()) == 1
