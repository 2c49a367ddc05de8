"""``python -m harness``: see :mod:`harness.cli`."""

import sys

if __name__ == "__main__":
    try:
        from harness.cli import main
    except KeyboardInterrupt:  # Ctrl-C before any command started: nothing was written
        print("interrupted before anything was written", file=sys.stderr)
        sys.exit(130)
    main()
