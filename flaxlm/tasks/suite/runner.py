"""Each task of a suite run as a subprocess of its script, one after another; what the run left is scored.

A task that crashes (exit code not 0, no predictions file, a predictions file that cannot be scored) gives a row
with the last line of its output as the error: the suite goes on with the next task. Each run's output is in
OUTPUT_DIR/<task>.log, its files in OUTPUT_DIR/<task>/.
"""
import os
import subprocess
import sys
import time

from flaxlm.errors import UserError
from flaxlm.files import check_writable_dir
from flaxlm.tasks.suite.bootstrap import bootstrap_interval
from flaxlm.tasks.suite.suite_file import KINDS
from flaxlm.tasks.suite.task_scores import BASELINE_DIR, score_task

SEQ2SEQ_SCRIPT = "run_t5_mlm_flax.py"  # the families pretrained by it are the seq2seq (T5-style) ones


def model_kind(model_path):
    """'encoder' (a family with fine-tuning heads), 'seq2seq' (T5-style) or 'decoder', from config.json's
    model_type."""
    from flaxlm.models.hf_io import load_config
    from flaxlm.models.registry import family_of
    family = family_of(load_config(model_path))
    if family.script == SEQ2SEQ_SCRIPT:
        return "seq2seq"
    return "encoder" if family.heads else "decoder"


def prepare_output_dir(output_dir, tasks, overwrite):
    """Check that no earlier run's folder is in the way (unless overwrite: its predictions file is removed, so that
    a crash now cannot be scored by the old file)."""
    check_writable_dir(output_dir)
    for task in tasks:
        task_dir = os.path.join(output_dir, task.name)
        if os.path.isdir(task_dir) and os.listdir(task_dir):
            if not overwrite:
                raise UserError(f"{task_dir} holds an earlier run; pass --overwrite_output_dir to run the suite again "
                                f"there, or another --output_dir")
            stale = os.path.join(task_dir, KINDS[task.kind].predictions)
            if os.path.exists(stale):
                os.remove(stale)
    os.makedirs(output_dir, exist_ok=True)


def evaluate_task(task, model_path, output_dir, scripts_dir, args):
    """The task's result row: fine-tuned by its script, then scored with a bootstrap interval and its baseline."""
    kind = KINDS[task.kind]
    row = {"task": task.name, "kind": task.kind, "metric": task.metric, "baseline_name": kind.baseline}
    task_dir, log = os.path.join(output_dir, task.name), os.path.join(output_dir, f"{task.name}.log")
    script = os.path.join(scripts_dir, kind.script)
    argv = [sys.executable, script, *task.argv(args.max_steps), "--model_name_or_path", os.path.abspath(model_path),
            "--output_dir", task_dir, "--overwrite_output_dir", "true"]
    print(f"{task.name}: {kind.script} (log: {log})", flush=True)
    start = time.monotonic()
    if not os.path.isfile(script):
        return {**row, "error": f"{kind.script} not found in {scripts_dir}"}
    runs = [argv]
    if task.kind == "bits_per_byte" and getattr(args, "baseline_model", None):  # the same text, the other model
        runs.append([*argv[:-6], "--model_name_or_path", os.path.abspath(args.baseline_model), "--output_dir",
                     os.path.join(task_dir, BASELINE_DIR), "--overwrite_output_dir", "true"])
    with open(log, "w", encoding="utf-8") as f:
        for run in runs:
            f.write(" ".join(run) + "\n")
            f.flush()
            code = subprocess.run(run, cwd=scripts_dir, stdout=f, stderr=subprocess.STDOUT).returncode
            if code:
                break
    row["seconds"] = round(time.monotonic() - start, 1)
    if code != 0:
        return {**row, "error": f"exit code {code}: {last_line(log)}"}
    try:
        scored, baseline = score_task(task, task_dir)
    except UserError as e:
        return {**row, "error": str(e)}
    except Exception as e:  # a predictions file the contract did not foresee: this task's row, not the suite's end
        return {**row, "error": f"cannot score {task_dir}: {type(e).__name__}: {e}"}
    low, high = bootstrap_interval(scored, args.bootstrap_resamples, args.bootstrap_seed)
    return {**row, "score": scored.value, "low": low, "high": high, "examples": len(scored.stats_NK),
            "baseline": baseline}


def last_line(path):
    """The last non-blank line of a log (a script's error line, or a traceback's last)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = [line.strip() for line in f if line.strip()]
    return lines[-1] if lines else "(no output)"
