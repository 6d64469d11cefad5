"""Errors a user can cause end in one clear line and exit code 2, never a traceback; neither that line nor the
traceback of any other error shows a secret (flaxlm.secrets)."""
import sys
import traceback

from flaxlm.secrets import scrub


class UserError(Exception):
    """A problem the user can fix (bad flag, bad path, bad data). The message names problem and fix."""


def run_main(main):
    """Run a script's main(); a UserError becomes one line on stderr and exit code 2, any other error its traceback
    (secrets masked: an error of a library may quote the token it was given) and exit code 1."""
    try:
        main()
    except UserError as e:
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
