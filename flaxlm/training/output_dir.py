"""The output directory: refuse to mix with other files unless asked, never delete what is not ours (nor
our own old run before the new one is sure to start), and the hub upload (checked before training, so a
missing network fails at once, not at the end)."""
import os
import tempfile

from flaxlm.errors import UserError, make_dirs
from flaxlm.files import check_writable_dir


def _continues(args):
    """Whether the run works on what output_dir holds: resuming its training, or evaluating its checkpoints."""
    return bool(args.resume_from_checkpoint or getattr(args, "eval_checkpoints", None))


def prepare_output_dir(args):
    """Check --output_dir before any work and create it; nothing in it is removed here (see start_fresh)."""
    path, overwrite, resuming = args.output_dir, args.overwrite_output_dir, _continues(args)
    check_writable_dir(path)
    if args.eval_checkpoints and not os.path.isdir(path):
        raise UserError(f"--eval_checkpoints reads the checkpoints of --output_dir, but {path} does not exist; "
                        f"pass the output directory of the training run")
    if os.path.isdir(path) and os.listdir(path) and not (overwrite or resuming):
        raise UserError(f"output directory {path} already exists and is not empty; pass --overwrite_output_dir "
                        f"to write into it (only flaxlm's own files are replaced), --resume_from_checkpoint latest "
                        f"to continue its run, or another --output_dir")
    try:
        make_dirs(path)  # removed again if the run is refused before it writes anything (flaxlm.errors.run_main)
        tempfile.TemporaryFile(dir=path).close()
    except OSError as e:
        raise UserError(f"cannot write to output directory {path} ({e.strerror}); pick a writable "
                        f"--output_dir") from None


def start_fresh(args):
    """With --overwrite_output_dir (and no resume), remove the checkpoints an earlier run of ours left in `path`.
    Called once the inputs are loaded and training is about to start, so that a run that fails on bad input
    (a wrong --tokenizer_name, an unreadable --train_file) leaves the earlier run intact."""
    if args.overwrite_output_dir and not _continues(args):
        from flaxlm.training.checkpoint import clear_checkpoints
        clear_checkpoints(args.output_dir)


def check_hub_access(token=None):
    """Fail before training when --push_to_hub cannot work (no network, no login)."""
    try:
        from huggingface_hub import HfApi
        HfApi(token=token).whoami()
    except Exception as e:  # offline mode, no network, bad token: all end the same way
        raise UserError(f"--push_to_hub needs the Hugging Face hub, which is not reachable or not logged in "
                        f"({type(e).__name__}); check network and `hf auth login`, or drop --push_to_hub") from None


def push_to_hub(output_dir, repo_id, token=None):
    from huggingface_hub import HfApi
    api = HfApi(token=token)
    api.create_repo(repo_id, exist_ok=True)
    api.upload_folder(folder_path=output_dir, repo_id=repo_id,
                      ignore_patterns=["checkpoints/*", "tensorboard/*", "wandb/*", "metrics.jsonl", "trackers.json"])
