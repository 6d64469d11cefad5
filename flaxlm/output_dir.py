"""The output directory: refuse to mix with other files unless asked, never delete what is not ours,
and the hub upload (checked before training, so a missing network fails at once, not at the end)."""
import os
import tempfile

from flaxlm.checkpoint import clear_checkpoints
from flaxlm.errors import UserError


def prepare_output_dir(path, overwrite, resuming):
    if os.path.exists(path) and not os.path.isdir(path):
        raise UserError(f"--output_dir {path} is a file; pass a directory")
    if os.path.isdir(path) and os.listdir(path) and not (overwrite or resuming):
        raise UserError(f"output directory {path} already exists and is not empty; pass --overwrite_output_dir "
                        f"to write into it (only flaxlm's own files are replaced), --resume_from_checkpoint latest "
                        f"to continue its run, or another --output_dir")
    try:
        os.makedirs(path, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError as e:
        raise UserError(f"cannot write to output directory {path} ({e.strerror}); pick a writable --output_dir") from None
    if overwrite and not resuming:
        clear_checkpoints(path)


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
                      ignore_patterns=["checkpoints/*", "tensorboard/*", "metrics.jsonl"])
