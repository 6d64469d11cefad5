"""Orbax checkpoints of the whole train state (params, optimizer state, step) plus a JSON of the data
position and seed, every --save_steps under OUTPUT_DIR/checkpoints/STEP, keeping the last N."""
import os
import shutil

import jax
import orbax.checkpoint as ocp

from flaxlm.errors import UserError

CHECKPOINT_DIR = "checkpoints"


def checkpoint_root(output_dir):
    return os.path.join(os.path.abspath(output_dir), CHECKPOINT_DIR)


class Checkpointer:
    def __init__(self, output_dir, max_to_keep=None):
        self.root = checkpoint_root(output_dir)
        self.manager = ocp.CheckpointManager(
            self.root, options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True))

    def save(self, step, state, meta):
        """Start an async save; the previous one is finished first, so at most one is in flight."""
        self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                        meta=ocp.args.JsonSave(meta)), force=True)

    def restore(self, step, like_state):
        """The state at `step`, placed like `like_state` (same shardings), and its meta dict."""
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like_state)
        got = self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract),
                                                                 meta=ocp.args.JsonRestore()))
        return got.state, got.meta

    def latest_step(self):
        return self.manager.latest_step()

    def close(self):
        self.manager.wait_until_finished()
        self.manager.close()


def resolve_resume(resume_from_checkpoint, output_dir):
    """--resume_from_checkpoint (a step directory, or 'latest') -> (step, output_dir it belongs to)."""
    if resume_from_checkpoint in ("latest", "last", "true", "True"):
        root = checkpoint_root(output_dir)
        steps = _steps_in(root)
        if not steps:
            raise UserError(f"--resume_from_checkpoint latest: no checkpoint in {root}; "
                            f"train without it first (checkpoints are written every --save_steps)")
        return max(steps), output_dir
    path = os.path.abspath(resume_from_checkpoint.rstrip("/"))
    name, parent = os.path.basename(path), os.path.dirname(path)
    if not (os.path.isdir(path) and name.isdigit() and os.path.basename(parent) == CHECKPOINT_DIR):
        raise UserError(f"--resume_from_checkpoint {resume_from_checkpoint} is not a checkpoint directory "
                        f"(expected OUTPUT_DIR/{CHECKPOINT_DIR}/STEP, or 'latest')")
    return int(name), os.path.dirname(parent)


def _steps_in(root):
    if not os.path.isdir(root):
        return []
    return [int(n) for n in os.listdir(root)
            if n.isdigit() and os.path.exists(os.path.join(root, n, "_CHECKPOINT_METADATA"))]


def clear_checkpoints(output_dir):
    """Remove the step directories an earlier run of ours wrote (only those), for a fresh start."""
    root = checkpoint_root(output_dir)
    for step in _steps_in(root):
        shutil.rmtree(os.path.join(root, str(step)))
