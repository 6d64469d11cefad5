"""Errors a user can cause end in one clear line and exit code 2, never a traceback; neither that line nor the
traceback of any other error shows a secret (flaxlm.secrets)."""
import os
import sys
import traceback

from flaxlm.secrets import scrub


class UserError(Exception):
    """A problem the user can fix (bad flag, bad path, bad data). The message names problem and fix."""


_CREATED = []  # (directory, its topmost ancestor that did not exist) made for a run by make_dirs


def make_dirs(path):
    """os.makedirs(path, exist_ok=True), remembered: a run refused with a UserError (run_main) removes the
    directories it made this way again, where they are still empty (a user's files are never touched)."""
    path = os.path.abspath(path)
    top = None
    probe = path
    while not os.path.exists(probe):
        top, probe = probe, os.path.dirname(probe)
    os.makedirs(path, exist_ok=True)
    if top is not None:
        _CREATED.append((path, top))


def remove_empty_made_dirs():
    """Remove the directories make_dirs made that are still empty, bottom up to the first one it made."""
    while _CREATED:
        path, top = _CREATED.pop()
        while path.startswith(top):
            try:
                os.rmdir(path)  # only an empty directory
            except OSError:
                break
            path = os.path.dirname(path)


def end_progress_bars():
    """Close the tqdm bars still open (an error raised inside the training loop's), so that what is printed next
    starts a line of its own instead of trailing the bar's."""
    tqdm = getattr(sys.modules.get("tqdm.std"), "tqdm", None)
    for bar in list(getattr(tqdm, "_instances", None) or ()):
        bar.close()


def run_main(main):
    """Run a script's main(); a UserError becomes one line on stderr and exit code 2 (the empty directories the run
    made, removed), any other error its traceback (secrets masked: an error of a library may quote the token it
    was given) and exit code 1."""
    _CREATED.clear()
    try:
        main()
    except UserError as e:
        remove_empty_made_dirs()
        end_progress_bars()
        print(f"error: {scrub(str(e))}", file=sys.stderr, flush=True)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr, flush=True)
        sys.exit(130)
    except Exception:  # noqa: BLE001 -- printed as Python would, with the secrets masked
        print(scrub(traceback.format_exc()), end="", file=sys.stderr, flush=True)
        sys.exit(1)


def decode_utf8_line(raw: bytes, where: str, line_no: int) -> str:
    """One line of a text file as str; bytes that are not UTF-8 are a UserError naming the file and line."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{where} line {line_no} is not UTF-8 text (byte {raw[e.start]:#04x} at byte {e.start + 1} "
                        f"of the line); convert the file to UTF-8 (e.g. iconv -f latin1 -t utf-8), or drop the bad "
                        f"bytes with iconv -c -f utf-8 -t utf-8") from None
