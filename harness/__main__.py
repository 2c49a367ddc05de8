"""``python -m harness``: see :mod:`harness.cli`."""

import signal
import sys


class _Terminated(BaseException):
    """SIGTERM while the command line's modules are imported."""


def _terminate(signum, frame):
    raise _Terminated


def _keep_exit_code() -> None:
    """Let ``sys.exit``'s code stand after a Ctrl-C the harness handled. CPython (3.11) marks a
    KeyboardInterrupt that passes through ``exec`` or ``eval`` of a string (a dataclass being
    made, Warp reading a kernel's annotations) as unhandled, and then ends the process by
    SIGINT (status -2) whatever code it exits with; the mark is cleared here, on the way out."""
    import contextlib
    import ctypes

    with contextlib.suppress(Exception):  # another Python without the flag: nothing to clear
        ctypes.c_int.in_dll(ctypes.pythonapi, "_Py_UnhandledKeyboardInterrupt").value = 0


if __name__ == "__main__":
    # Until harness.cli installs its own handlers: a signal while it is imported is one line too.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _terminate)
    try:
        from harness.cli import main
    except KeyboardInterrupt:  # Ctrl-C before any command started: nothing was written
        print("interrupted by SIGINT before anything was written", file=sys.stderr)
        _keep_exit_code()
        sys.exit(130)
    except _Terminated:
        print("interrupted by SIGTERM before anything was written", file=sys.stderr)
        sys.exit(143)
    try:
        main()
    except SystemExit:
        _keep_exit_code()
        raise
