"""JAX's persistent compilation cache: a rerun, or a run resumed after preemption, loads its compiled train and
eval steps from disk instead of compiling them again (--compilation_cache_dir)."""
import os

import jax

from flaxlm.errors import UserError

MIN_COMPILE_SECONDS = 0.5  # quicker compilations are not worth a file


def cache_dir(setting):
    """The directory for --compilation_cache_dir: 'auto' -> $XDG_CACHE_HOME/flaxlm/jax (~/.cache/...), 'none' -> None."""
    if setting in (None, "", "none"):
        return None
    if setting == "auto":
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return os.path.join(base, "flaxlm", "jax")
    return os.path.abspath(os.path.expanduser(setting))


def enable_compilation_cache(setting):
    """Point JAX's cache at the directory (made if missing); returns it, or None when off. An explicit directory
    that cannot be made is a UserError; the 'auto' one only turns the cache off."""
    path = cache_dir(setting)
    if path is None:
        return None
    try:
        os.makedirs(path, exist_ok=True)
        if not os.access(path, os.W_OK):
            raise PermissionError(13, "not writable")
    except OSError as e:
        if setting == "auto":
            return None
        raise UserError(f"--compilation_cache_dir {path} cannot be used ({e.strerror or e}); pass a writable "
                        f"directory, or none to compile every run afresh") from None
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
    return path
