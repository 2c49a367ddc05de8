"""``python -m harness``: see :mod:`harness.cli`."""

import os
import sys

if __name__ == "__main__":
    try:
        from harness.cli import main
    except KeyboardInterrupt:  # Ctrl-C before any command started: nothing was written
        print("interrupted before anything was written", file=sys.stderr)
        sys.exit(130)
    try:
        main()
    except BrokenPipeError:  # the reader went away (`... --help | head`): stop quietly, as `cat` does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        sys.exit(141)  # 128 + SIGPIPE, the shell's code for it
