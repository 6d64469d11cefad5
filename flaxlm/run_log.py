"""Where a run reports: TensorBoard events (tensorboardX, no TensorFlow) and OUTPUT_DIR/metrics.jsonl.

Only process 0 writes. Each jsonl line is {"step": N, "split": "train"|"eval", ...metrics}.
"""
import json
import os
import time

import jax


class RunLog:
    def __init__(self, output_dir, fresh=True):
        self.enabled = jax.process_index() == 0
        self.path = os.path.join(output_dir, "metrics.jsonl")
        self._tb = None
        if self.enabled:
            os.makedirs(output_dir, exist_ok=True)
            self._file = open(self.path, "w" if fresh else "a", encoding="utf-8")
            from tensorboardX import SummaryWriter
            self._tb = SummaryWriter(os.path.join(output_dir, "tensorboard"))

    def write(self, step, split, metrics):
        if not self.enabled:
            return
        row = {"step": int(step), "split": split, "time": round(time.time(), 3)}
        row.update({k: _plain(v) for k, v in metrics.items()})
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        for k, v in metrics.items():
            if isinstance(v, (int, float)):
                self._tb.add_scalar(f"{split}/{k}", v, int(step))
        self._tb.flush()

    def close(self):
        if self.enabled:
            self._file.close()
            self._tb.close()


def _plain(v):
    if isinstance(v, float):
        return round(v, 6)
    return v
