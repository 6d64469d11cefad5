"""Errors a user can cause end in one clear line and exit code 2, never a traceback."""
import sys


class UserError(Exception):
    """A problem the user can fix (bad flag, bad path, bad data). The message names problem and fix."""


def run_main(main):
    """Run a script's main(); a UserError becomes one line on stderr and exit code 2."""
    try:
        main()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr, flush=True)
        sys.exit(130)
