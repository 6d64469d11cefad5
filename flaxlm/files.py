"""Small helpers for the files a run writes: a directory checked for writing before any long work, or checked to be
new (a script that writes a model once and never into a user's files)."""
import os
import tempfile

from flaxlm.errors import UserError


def check_writable_dir(path, flag="--output_dir"):
    """UserError unless `path` is a directory we can write in, or one we can create; creates nothing.

    Called before hours of work (training a tokenizer) so that a typo or a read-only disk fails at once."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise UserError(f"{flag} {path} is a file; pass a directory")
    parent = os.path.abspath(path)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise UserError(f"{flag} {path} cannot be created: {parent} is a file; pass another directory")
    try:
        tempfile.TemporaryFile(dir=parent).close()
    except OSError as e:
        raise UserError(f"cannot write to {parent} ({e.strerror}); pick a writable {flag}") from None


def check_new_dir(path, flag="--output_dir"):
    """check_writable_dir, and UserError when `path` exists and is not an empty directory: the scripts that write one
    model (adapt_vocabulary.py, upcycle_moe.py) never write among a user's files. Creates nothing."""
    check_writable_dir(path, flag)
    if os.path.exists(path) and (not os.path.isdir(path) or os.listdir(path)):
        raise UserError(f"{flag} {path} already exists and is not empty; pass a new directory")
