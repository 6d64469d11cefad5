"""Orbax checkpoints of the whole train state (params, optimizer state, step) plus a JSON of the data
position and seed, every --save_steps under OUTPUT_DIR/checkpoints/STEP, keeping the last N.

A save returns once the checkpoint is complete on disk (so a hard kill loses at most --save_steps
steps); --async_checkpointing writes in the background instead. Orbax writes each step into a
temporary directory and renames it when complete, so a process killed
mid-save leaves no STEP directory that looks complete. A complete-looking one that cannot be read
(damaged disk, truncated copy) is moved aside to STEP.unreadable and the previous one is used. A save
that fails (disk full, permissions) is an error naming the path; the earlier checkpoints stay.
"""
import contextlib
import os
import pathlib
import shutil
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp

from flaxlm.errors import UserError
from flaxlm.training.mesh import sync_processes

CHECKPOINT_DIR = "checkpoints"


def checkpoint_root(output_dir):
    return os.path.join(os.path.abspath(output_dir), CHECKPOINT_DIR)


class Checkpointer:
    def __init__(self, output_dir, max_to_keep=None, background=False):
        self.root = checkpoint_root(output_dir)
        self.background = background  # False: save() returns once the checkpoint is complete on disk
        self.manager = ocp.CheckpointManager(
            self.root, options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True))
        self._writing = None  # the step of the save in flight
        self._closed = False

    def save(self, step, state, meta):
        """Save `step`; in the background, the previous save is finished first, so at most one is in flight."""
        with self._errors_named():  # the previous save's failure surfaces here
            self.manager.wait_until_finished()
        self._writing = step
        with self._errors_named():
            self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                            meta=ocp.args.JsonSave(meta)), force=True)
        if not self.background:
            self.wait()

    def wait(self):
        """Block until the save in flight is on disk (raises UserError if it failed)."""
        with self._errors_named():
            self.manager.wait_until_finished()
        self._writing = None

    @contextlib.contextmanager
    def _errors_named(self):
        """An exception of Orbax's writing becomes a UserError naming the checkpoint path and the fix."""
        try:
            yield
        except Exception as e:
            if isinstance(e, UserError):
                raise
            step, self._writing = self._writing, None
            path = self.path(step) if step is not None else self.root
            reason = getattr(e, "strerror", None) or (str(e).splitlines() or [""])[0][:200]
            raise UserError(f"could not write checkpoint {path} ({type(e).__name__}: {reason}); the earlier "
                            f"checkpoints in {self.root} are kept. Free disk space or fix permissions, then rerun "
                            f"with --resume_from_checkpoint latest") from e

    def path(self, step):
        return os.path.join(self.root, str(step))

    def newest_description(self):
        """'checkpoint OUTPUT/checkpoints/N' for the newest complete one on disk, or 'no checkpoint yet'."""
        steps = saved_steps(self.root)
        return f"checkpoint {self.path(max(steps))}" if steps else "no checkpoint was written yet"

    def restore_newest(self, like_state):
        """(step, state, meta) from the newest checkpoint that reads back; unreadable ones are moved aside to
        STEP.unreadable with a warning naming them. UserError when none is left."""
        for step in sorted(saved_steps(self.root), reverse=True):
            try:
                state, meta = self.restore(step, like_state)
                return step, state, meta
            except UserError:  # readable, but another model's: the run's flags, not the checkpoint, are wrong
                raise
            except Exception as e:  # any failure to read means: not a usable checkpoint
                self._set_aside(step, e)
        raise UserError(f"--resume_from_checkpoint latest: no readable checkpoint in {self.root}; "
                        f"train without it first (checkpoints are written every --save_steps)")

    def _set_aside(self, step, error):
        path = self.path(step)
        reason = f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}"
        print(f"warning: checkpoint {path} cannot be read ({reason}); skipped it (moved to {path}.unreadable), "
              f"trying the one before", file=sys.stderr, flush=True)
        if jax.process_index() == 0:
            target = f"{path}.unreadable"
            if os.path.exists(target):
                shutil.rmtree(target)
            os.rename(path, target)
        sync_processes("flaxlm_checkpoint_set_aside")
        self.manager.reload()

    def restore(self, step, like_state):
        """The state at `step`, placed like `like_state` (same shardings; or a function of the step giving it),
        and its meta dict."""
        if callable(like_state):
            like_state = like_state(step)
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like_state)
        self.check_shapes(step, abstract)
        got = self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract),
                                                                 meta=ocp.args.JsonRestore()))
        return got.state, got.meta

    def check_shapes(self, step, abstract):
        """UserError when the checkpoint's parameters have other shapes than this run's: a run started with other
        model flags (--pad_vocab_multiple, another config.json); the checkpoint is left where it is."""
        stored = ocp.StandardCheckpointHandler().metadata(pathlib.Path(self.path(step), "state"))
        stored = {jax.tree_util.keystr(p): tuple(x.shape) for p, x in
                  jax.tree_util.tree_leaves_with_path(stored.get("params", {})) if hasattr(x, "shape")}
        for path, x in jax.tree_util.tree_leaves_with_path(abstract.get("params", {})):
            name = jax.tree_util.keystr(path)
            if name in stored and stored[name] != tuple(x.shape):
                raise UserError(f"checkpoint {self.path(step)} holds params{name} of shape {stored[name]}, this run's "
                                f"model has {tuple(x.shape)}; resume with the model flags the run was started with "
                                f"(--pad_vocab_multiple, --config_name)")

    def latest_step(self):
        return self.manager.latest_step()

    def close(self):
        if self._closed:
            return
        self._closed = True
        try:
            self.wait()
        finally:
            self.manager.close()


def state_nbytes(state):
    """Bytes of a train state on disk (its arrays' global sizes; Orbax adds little beyond them)."""
    return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(state)
               if hasattr(x, "shape"))


def check_room(output_dir, state, save_total_limit):
    """UserError before training when output_dir cannot hold a few checkpoints of `state` (the newest kept
    ones plus the one being written, at most 3 in all)."""
    copies = 3 if save_total_limit is None else max(2, min(3, save_total_limit + 1))
    need = copies * state_nbytes(state)
    free = shutil.disk_usage(output_dir).free
    if free < need:
        raise UserError(f"{output_dir} has {free / 2**30:.2f} GiB free, but {copies} checkpoints of this run need "
                        f"{need / 2**30:.2f} GiB ({need // copies / 2**30:.2f} GiB each); free space or pick another "
                        f"--output_dir")


def restore_for_resume(resume_from_checkpoint, checkpointer, like_state):
    """(step, state, meta, the output_dir it belongs to) for --resume_from_checkpoint: 'latest' is the newest
    readable checkpoint of this run's output_dir; a step directory must read back, or it is a UserError."""
    step, output_dir = resolve_resume(resume_from_checkpoint, os.path.dirname(checkpointer.root))
    if step is None:
        step, state, meta = checkpointer.restore_newest(like_state)
        return step, state, meta, output_dir
    source = checkpointer if checkpoint_root(output_dir) == checkpointer.root else Checkpointer(output_dir)
    try:
        state, meta = source.restore(step, like_state)
    except UserError:
        raise
    except Exception as e:
        raise UserError(f"--resume_from_checkpoint {resume_from_checkpoint}: {source.path(step)} cannot be read "
                        f"({type(e).__name__}); pass an earlier step directory or 'latest'") from None
    finally:
        if source is not checkpointer:
            source.close()
    return step, state, meta, output_dir


def resolve_resume(resume_from_checkpoint, output_dir):
    """--resume_from_checkpoint (a step directory, or 'latest') -> (step, output_dir it belongs to); the step is
    None for 'latest' (the newest readable one, found by Checkpointer.restore_newest)."""
    if resume_from_checkpoint in ("latest", "last", "true", "True"):
        root = checkpoint_root(output_dir)
        if not saved_steps(root):
            raise UserError(f"--resume_from_checkpoint latest: no checkpoint in {root}; "
                            f"train without it first (checkpoints are written every --save_steps)")
        return None, output_dir
    path = os.path.abspath(resume_from_checkpoint.rstrip("/"))
    name, parent = os.path.basename(path), os.path.dirname(path)
    if not (os.path.isdir(path) and name.isdigit() and os.path.basename(parent) == CHECKPOINT_DIR):
        raise UserError(f"--resume_from_checkpoint {resume_from_checkpoint} is not a checkpoint directory "
                        f"(expected OUTPUT_DIR/{CHECKPOINT_DIR}/STEP, or 'latest')")
    return int(name), os.path.dirname(parent)


def saved_steps(root):
    """The steps of the complete checkpoints under root (a save in progress or cut short has no metadata yet)."""
    if not os.path.isdir(root):
        return []
    return [int(n) for n in os.listdir(root)
            if n.isdigit() and os.path.exists(os.path.join(root, n, "_CHECKPOINT_METADATA"))]


def clear_checkpoints(output_dir):
    """Remove the step directories an earlier run of ours wrote (only those), for a fresh start. In a
    multi-host run process 0 deletes and the others wait for it (no two deleting, none reading early)."""
    root = checkpoint_root(output_dir)
    if jax.process_index() == 0:
        for step in saved_steps(root):
            shutil.rmtree(os.path.join(root, str(step)))
    sync_processes("flaxlm clear_checkpoints")
