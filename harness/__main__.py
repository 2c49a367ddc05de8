"""``python -m harness``: see :mod:`harness.cli`."""

import signal
import sys


class _Terminated(BaseException):
    """SIGTERM while the command line's modules are imported."""


def _terminate(signum, frame):
    raise _Terminated


if __name__ == "__main__":
    # Until harness.cli installs its own handlers: a signal while it is imported is one line too.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _terminate)
    try:
        from harness.cli import main
    except KeyboardInterrupt:  # Ctrl-C before any command started: nothing was written
        print("interrupted by SIGINT before anything was written", file=sys.stderr)
        sys.exit(130)
    except _Terminated:
        print("interrupted by SIGTERM before anything was written", file=sys.stderr)
        sys.exit(143)
    main()
