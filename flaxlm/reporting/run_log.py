"""Where a run reports: OUTPUT_DIR/metrics.jsonl, the trackers of --report_to (TensorBoard events by default;
flaxlm.reporting.trackers) and, on close, the loss curves drawn from the jsonl (OUTPUT_DIR/loss.png for a training
run; flaxlm.reporting.loss_plot), and lines on the console above the progress bars (say).

Only process 0 writes. Each jsonl line is {"step": N, "split": "train"|"eval"|"test"|"data", ...metrics}; each
tracker gets the same row at the same step.
"""
import json
import os
import sys
import time


def say(msg):
    """Print a line from process 0, above the progress bars."""
    import jax  # here, not at the top: read_rows serves scripts that need no jax
    from tqdm.auto import tqdm
    if jax.process_index() == 0:
        tqdm.write(msg)


class RunLog:
    def __init__(self, output_dir, fresh=True, filename="metrics.jsonl", tensorboard="tensorboard", loss_plot=None,
                 trackers=None):
        """loss_plot: file name (beside the jsonl) of the loss curves drawn on close; None draws none. trackers:
        started ones (flaxlm.reporting.trackers.open_trackers); None: TensorBoard events in OUTPUT_DIR/`tensorboard`."""
        import jax  # here, not at the top: read_rows serves scripts that need no jax
        from flaxlm.reporting.trackers import Reporting, TensorBoard
        self.enabled = jax.process_index() == 0
        self.path = os.path.join(output_dir, filename)
        self.loss_plot = os.path.join(output_dir, loss_plot) if loss_plot else None
        self.reporting = Reporting([])
        if self.enabled:
            os.makedirs(output_dir, exist_ok=True)
            self._file = open(self.path, "w" if fresh else "a", encoding="utf-8")
            self.reporting = Reporting([TensorBoard(output_dir, tensorboard)] if trackers is None else trackers)

    def write(self, step, split, metrics):
        if not self.enabled:
            return
        row = {"step": int(step), "split": split, "time": round(time.time(), 3)}
        row.update({k: _plain(v) for k, v in metrics.items()})
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        self.reporting.log(int(step), split, {k: v for k, v in row.items() if k not in ("step", "split", "time")})

    def table(self, step, name, columns):
        """Rows of samples (columns: {column: [value per row]}) to OUTPUT_DIR/NAME.jsonl, one line per row with its
        step, and to the trackers that show tables (W&B)."""
        if not self.enabled:
            return
        path = os.path.join(os.path.dirname(self.path), f"{name}.jsonl")
        n = len(next(iter(columns.values())))
        with open(path, "a", encoding="utf-8") as f:
            for i in range(n):
                f.write(json.dumps({"step": int(step), **{k: _plain(v[i]) for k, v in columns.items()}},
                                   ensure_ascii=False) + "\n")
        self.reporting.table(int(step), name, columns)

    def drop_after(self, step):
        """Forget the metrics.jsonl rows past `step` (a resumed run redoes those steps and logs them again); the
        trackers, which have them, get only the steps past the last one they were sent."""
        if not self.enabled:
            return
        self._file.close()
        with open(self.path, encoding="utf-8") as f:
            lines = f.readlines()
        for r in filter(None, map(_row, lines)):
            split = r.get("split")
            self.reporting.sent[split] = max(self.reporting.sent.get(split, -1), int(r.get("step", -1)))
        kept = [line for line in lines if _step_of(line) <= step]
        if len(kept) < len(lines):
            tmp = self.path + ".tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                f.writelines(kept)
            os.replace(tmp, self.path)
        self._file = open(self.path, "a", encoding="utf-8")

    def logged_steps(self, split):
        """The steps that have a row of `split` in the jsonl file."""
        if not os.path.exists(self.path):
            return set()
        return {int(r["step"]) for r in read_rows(self.path) if r.get("split") == split}

    def close(self):
        if self.enabled:
            self._file.close()
            if self.loss_plot and self._draw_loss_plot():
                self.reporting.image(self.loss_plot)
            self.reporting.close()

    def _draw_loss_plot(self):
        """The loss curves as a picture; a failure (no matplotlib, a full disk) costs a warning, never the run."""
        from flaxlm.reporting.loss_plot import draw_loss_curves
        try:
            draw_loss_curves(read_rows(self.path), self.loss_plot, title=os.path.dirname(self.path))
            return os.path.exists(self.loss_plot)
        except Exception as e:  # noqa: BLE001 -- the run and its export matter more than the picture
            reason = (str(e).splitlines() or [""])[0]
            print(f"warning: the loss curves were not drawn to {self.loss_plot} ({type(e).__name__}: {reason}); "
                  f"{self.path} holds the numbers", file=sys.stderr, flush=True)


def read_rows(path):
    """The rows of a metrics.jsonl file, in order (a last line cut short by a kill is skipped)."""
    with open(path, encoding="utf-8") as f:
        return [r for r in map(_row, f) if r is not None]


def _row(line):
    try:
        return json.loads(line)
    except ValueError:
        return None  # a line cut short by a kill


def _step_of(line):
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return float("inf")  # a line cut short by a kill: dropped


def _plain(v):
    if isinstance(v, float):
        return round(v, 6)
    return v
