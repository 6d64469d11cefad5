"""Print a run's evaluation losses from its metrics.jsonl, first to last, and how far the loss fell.

    python -m flaxlm.reporting.eval_summary runs/demo/run/metrics.jsonl
"""
import sys

from flaxlm.reporting.run_log import read_rows


def eval_losses(path):
    """[(step, eval loss)] in the order evaluated."""
    return [(r["step"], r["loss"]) for r in read_rows(path) if r.get("split") == "eval"]


if __name__ == "__main__":
    losses = eval_losses(sys.argv[1])
    if losses:
        (s0, l0), (s1, l1) = losses[0], losses[-1]
        steps = ", ".join(f"{s}: {loss:.3f}" for s, loss in losses)
        print(f"eval loss by step: {steps}\neval loss fell {100 * (l0 - l1) / l0:.0f}% from step {s0} to step {s1}")
